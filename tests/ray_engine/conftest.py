"""Ray session for the Ray executor's checks (run by run_in_netns.sh, never by the main venv).

Ray is imported inside the fixture, so collecting this directory without Ray is harmless.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def ray_session() -> Iterator[Any]:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=os.environ.get("RAY_TMPDIR"),
             logging_level="WARNING", log_to_driver=False)
    yield ray
    ray.shutdown()
