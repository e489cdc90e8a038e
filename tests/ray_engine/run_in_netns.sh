#!/usr/bin/env bash
# Run the Ray executor's checks (tests/ray_engine/check_*.py) with the Ray venv, inside a
# private network namespace: Ray binds to every interface, and there the only one is `lo`,
# so nothing it opens is reachable from outside. `--pid --mount-proc` confines Ray's
# processes too: when the namespace's first process exits, the kernel kills what is left.
# Everything Ray or pytest writes goes to a temporary directory under /tmp, removed at exit.
#   usage: tests/ray_engine/run_in_netns.sh [pytest args...]   (exit status = pytest's)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.venv-ray
if [ ! -x "$venv/bin/python" ]; then
  echo "run_in_netns: $venv is missing: create it with scripts/setup-engine-venv.sh ray" >&2
  exit 3
fi
tmp=$(mktemp -d /tmp/couler-ray.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/home" "$tmp/ray"
export HOME="$tmp/home" RAY_TMPDIR="$tmp/ray" TMPDIR="$tmp" PYTHONDONTWRITEBYTECODE=1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
unshare --net --pid --fork --mount-proc bash -c '
  ip link set lo up
  "$0" -m pytest -q -p no:cacheprovider --basetemp="$TMPDIR/pytest" tests/ray_engine/check_*.py "$@"
  exit $?' "$venv/bin/python" "$@"
