"""Handles formatted into strings: a map item with ``%``, a step output in an f-string, a
workflow parameter with ``str.format`` (semantics rule S10, docs/semantics.md).

Each becomes a placeholder the engine fills in; no Python repr reaches a step. (An env
value can be formatted too, on every engine but KFP, whose env values are literals only.)
"""
import couler.argo as couler


def square(x):
    return couler.run_container(
        image="python:3.12-alpine",
        command=["python3", "-c",
                 "import sys; open('/tmp/out.txt', 'w').write(sys.argv[1])",
                 "n=%s twice=%s%s" % (x, x, x)],  # noqa: UP031 - the SDK's style
        output=couler.create_parameter_artifact(path="/tmp/out.txt", name="out"),
        step_name="square",
    )


def learning_rate():
    print("0.5")


couler.config_workflow(name="conf-interpolation")
epochs = couler.workflow_parameter("epochs", 3)
couler.map(lambda v: square(v), [2, 3])  # noqa: PLW0108 - as the SDK's examples write it
lr = couler.run_script(image="python:3.12-alpine", source=learning_rate, step_name="lr")
couler.run_container(
    image="alpine:3.20",
    command=["sh", "-c", f"echo \"lr={lr} $0\" > /tmp/out.txt"],
    args=["--epochs={}".format(epochs)],  # noqa: UP032 - the SDK's style
    output=couler.create_parameter_artifact(path="/tmp/out.txt", name="out"),
    step_name="train",
)
