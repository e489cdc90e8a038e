"""Workflow parameters with defaults, read by a container step."""
import couler.argo as couler

with couler.workflow("conf-workflow-params"):
    greeting = couler.workflow_parameter("greeting", default="hi")
    count = couler.workflow_parameter("count", default=3)
    shown = couler.create_parameter_artifact(path="/tmp/shown.txt", name="shown")
    couler.run_container(image="alpine:3.20",
                         command=["sh", "-c", 'echo "$0 x$1" > /tmp/shown.txt'],
                         args=[greeting, count], output=shown, step_name="show")
    couler.run()
