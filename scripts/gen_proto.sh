#!/usr/bin/env bash
# Regenerate the Python protobuf code (and gRPC stubs for *_service.proto)
# from proto/ into libs/core/src/couler/v1.
#
# Usage, from anywhere (paths are relative to the repository root):
#   scripts/gen_proto.sh [OUT_DIR]
#
# OUT_DIR defaults to libs/core/src; scripts/check_proto_drift.sh passes a
# temporary directory. $PYTHON selects the interpreter (it needs grpcio-tools).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

out="${1:-libs/core/src}"
python="${PYTHON:-python}"

messages=()
services=()
shopt -s nullglob
for f in proto/couler/v1/*.proto; do
  if [[ "$f" == *_service.proto ]]; then services+=("$f"); else messages+=("$f"); fi
done
shopt -u nullglob
if [[ ${#messages[@]} -eq 0 && ${#services[@]} -eq 0 ]]; then
  echo "gen_proto: no .proto files under proto/couler/v1" >&2
  exit 1
fi

mkdir -p "$out/couler/v1"
protoc=("$python" -m grpc_tools.protoc -I proto --python_out="$out" --pyi_out="$out")
if [[ ${#messages[@]} -gt 0 ]]; then
  "${protoc[@]}" "${messages[@]}"
fi
if [[ ${#services[@]} -gt 0 ]]; then
  # Only files that declare services get *_pb2_grpc.py stubs.
  "${protoc[@]}" --grpc_python_out="$out" "${services[@]}"
fi
echo '"""Generated protobuf code for couler.v1 (scripts/gen_proto.sh); do not edit."""' \
  >"$out/couler/v1/__init__.py"
