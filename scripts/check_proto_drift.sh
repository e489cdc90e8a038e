#!/usr/bin/env bash
# Fail when the committed generated code in libs/core/src/couler/v1 differs
# from what scripts/gen_proto.sh produces from proto/.
#
# Usage, from anywhere: scripts/check_proto_drift.sh   ($PYTHON as for gen_proto.sh)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

scripts/gen_proto.sh "$tmp"

if ! diff -r -x __pycache__ "$tmp/couler/v1" libs/core/src/couler/v1; then
  echo >&2
  echo "check_proto_drift: libs/core/src/couler/v1 is out of date with proto/couler/v1." >&2
  echo "Run scripts/gen_proto.sh and commit the regenerated files." >&2
  exit 1
fi
echo "check_proto_drift: generated code matches proto/couler/v1"
