"""A bounded loop: repeat a step while its output says "again" (it says "done" at once)."""
import couler.argo as couler


def check():
    print("done")


def poll():
    return couler.run_script(image="python:3.12-alpine", source=check, step_name="poll")


couler.config_workflow(name="conf-while-loop")
couler.exec_while(couler.equal("again"), poll, max_iterations=3)
