#!/usr/bin/env bash
# Run the Ray venv's Python with the given arguments inside a private network namespace.
# Ray binds to every interface; there the only one is `lo`, so nothing it opens is
# reachable from outside. `--pid --mount-proc` confines Ray's processes too: when the
# namespace's first process exits, the kernel kills what is left. HOME, Ray's files and
# TMPDIR go to a temporary directory under /tmp, removed at exit.
#   usage: scripts/ray-netns.sh PYTHON_ARGS...   (exit status = the program's)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-ray
if [ ! -x "$venv/bin/python" ]; then
  echo "ray-netns: $venv is missing: create it with scripts/setup-engine-venv.sh ray" >&2
  exit 3
fi
tmp=$(mktemp -d /tmp/couler-ray.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/home" "$tmp/ray"
export HOME="$tmp/home" RAY_TMPDIR="$tmp/ray" TMPDIR="$tmp" PYTHONDONTWRITEBYTECODE=1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
unshare --net --pid --fork --mount-proc bash -c '
  ip link set lo up
  "$0" "$@"
  exit $?' "$venv/bin/python" "$@"
