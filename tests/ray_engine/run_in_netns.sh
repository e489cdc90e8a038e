#!/usr/bin/env bash
# Run the Ray executor's checks (tests/ray_engine/check_*.py) with the Ray venv inside a
# private network namespace (scripts/ray-netns.sh); pytest's temporary files land in that
# script's temporary directory (its TMPDIR), removed at exit.
#   usage: tests/ray_engine/run_in_netns.sh [pytest args...]   (exit status = pytest's)
set -euo pipefail
cd "$(dirname "$0")/../.."
exec scripts/ray-netns.sh -m pytest -q -p no:cacheprovider tests/ray_engine/check_*.py "$@"
