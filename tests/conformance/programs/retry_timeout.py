"""Retry (a step that fails on its first attempt) and timeouts."""
import couler.argo as couler
from couler import ir

FLAKY = (
    "import pathlib, sys\n"
    "marker = pathlib.Path('attempted')\n"
    "if not marker.exists():\n"
    "    marker.write_text('1')\n"
    "    sys.exit(3)\n"
    "print('recovered')\n"
)

couler.config_workflow(name="conf-retry-timeout", timeout=600)
couler.run_script(
    image="python:3.12-alpine",
    source=FLAKY,
    step_name="flaky",
    timeout=60,
    retry=ir.RetryPolicy(limit=2),
)
couler.run_container(image="alpine:3.20", command=["echo", "after"], step_name="after",
                     timeout=30, retry=1)
