"""A when condition with an else branch over a deterministic script output."""
import couler.argo as couler


def score():
    print(7)


def evaluate():
    return couler.run_script(image="python:3.12-alpine", source=score, step_name="evaluate")


def deploy():
    return couler.run_container(image="alpine:3.20", command=["echo", "deploy"],
                                step_name="deploy")


def retrain():
    return couler.run_container(image="alpine:3.20", command=["echo", "retrain"],
                                step_name="retrain")


couler.config_workflow(name="conf-when-else")
result = evaluate()
couler.when(couler.equal(result, "7"), deploy, retrain)
