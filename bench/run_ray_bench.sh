#!/usr/bin/env bash
# Run bench/bench_ray.py with the Ray venv inside a private network namespace (as
# tests/ray_engine/run_in_netns.sh does for the checks): Ray binds to every interface, and
# there the only one is `lo`. `--pid --mount-proc` confines Ray's processes; Ray's files go
# to a temporary directory removed at exit.
#   usage: bench/run_ray_bench.sh [--steps 1000] [--cpus 4] [--repeat 2] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-ray
if [ ! -x "$venv/bin/python" ]; then
  echo "run_ray_bench: $venv is missing: create it with scripts/setup-engine-venv.sh ray" >&2
  exit 3
fi
tmp=$(mktemp -d /tmp/couler-ray-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/home" "$tmp/ray"
export HOME="$tmp/home" RAY_TMPDIR="$tmp/ray" TMPDIR="$tmp" PYTHONDONTWRITEBYTECODE=1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
unshare --net --pid --fork --mount-proc bash -c '
  ip link set lo up
  "$0" bench/bench_ray.py "$@"
  exit $?' "$venv/bin/python" "$@"
