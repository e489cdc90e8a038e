#!/usr/bin/env bash
# Create (or refresh) the isolated virtual environment of one engine: .venv-NAME from
# requirements-NAME.txt, with couler itself installed without its dependencies (engines
# such as kfp pin protobuf < 7, which the main environment's generated code cannot use).
# Idempotent: does nothing when the requirements have not changed.
#   usage: scripts/setup-engine-venv.sh NAME
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: setup-engine-venv.sh NAME}
req=requirements-$name.txt
venv=.venv-$name
[ -f "$req" ] || { echo "setup-engine-venv: no $req" >&2; exit 2; }
PYTHON_BIN=${PYTHON_BIN:-python3}
stamp=$venv/.requirements.sha256
want=$(cat "$req" libs/*/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: installing $name into $venv (first run takes a minute or two)" >&2
[ -x "$venv/bin/python" ] || "$PYTHON_BIN" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -U pip >/dev/null
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e libs/core -e libs/runtime
echo "$want" > "$stamp"
