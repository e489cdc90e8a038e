#!/usr/bin/env bash
# Create (or refresh) the project's virtual environments: .venv with everything in
# requirements-dev.txt, and .venv-kfp (scripts/setup-engine-venv.sh kfp), where
# `couler compile --engine kfp` compiles: kfp pins protobuf < 7, which the main
# environment's generated code cannot use. Idempotent: does nothing when the requirements
# have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN=${PYTHON_BIN:-python3}
stamp=.venv/.requirements.sha256
want=$(cat requirements-dev.txt libs/*/pyproject.toml | sha256sum | cut -d' ' -f1)
if ! [ -x .venv/bin/python ] || ! [ -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing dependencies into .venv (first run takes about a minute)" >&2
  [ -x .venv/bin/python ] || "$PYTHON_BIN" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -U pip >/dev/null
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  echo "$want" > "$stamp"
fi
./scripts/setup-engine-venv.sh kfp
