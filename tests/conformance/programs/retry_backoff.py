"""Retry with exponential back-off (a step that fails on its first attempt)."""
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

couler.config_workflow(name="conf-retry-backoff")
couler.run_script(
    image="python:3.12-alpine",
    source=FLAKY,
    step_name="flaky",
    retry=ir.RetryPolicy(limit=2, backoff=ir.Backoff(base_seconds=0.1, factor=2, cap_seconds=1)),
)
