#!/usr/bin/env bash
# Run bench/bench_ray.py with the Ray venv inside a private network namespace
# (scripts/ray-netns.sh).
#   usage: bench/run_ray_bench.sh [--steps 1000] [--cpus 4] [--repeat 2] [--json FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
exec scripts/ray-netns.sh bench/bench_ray.py "$@"
