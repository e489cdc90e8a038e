"""Container and script steps; a script's stdout feeds a container step's argument."""
import couler.argo as couler


def greet():
    print("hello")


def produce():
    return couler.run_script(image="python:3.12-alpine", source=greet, step_name="produce")


def shout(word):
    said = couler.create_parameter_artifact(path="/tmp/said.txt", name="said")
    return couler.run_container(image="alpine:3.20",
                                command=["sh", "-c", 'echo "$0 world" > /tmp/said.txt'],
                                args=[word], output=said, step_name="shout")


couler.config_workflow(name="conf-basic-steps")
shout(produce())
