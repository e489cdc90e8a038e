#!/usr/bin/env bash
# Create (or refresh) .venv-ml, where the catalog's tabular templates run on the local
# engine (scikit-learn, XGBoost, LightGBM, CatBoost, pandas, statsmodels: requirements-ml.txt).
# Idempotent: does nothing when the requirements have not changed (a stamp, as
# scripts/setup.sh keeps). Map the image to it for the local engine with
#   COULER_LOCAL_PYTHON='ghcr.io/couler-io/ml-tabular:*=.venv-ml/bin/python'
# (docs/engines.md). The templates import only these libraries, not couler.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN=${PYTHON_BIN:-python3}
venv=.venv-ml
stamp=$venv/.requirements.sha256
want=$(sha256sum requirements-ml.txt | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: installing the ML libraries into $venv (first run takes a minute or two)" >&2
[ -x "$venv/bin/python" ] || "$PYTHON_BIN" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -U pip >/dev/null
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements-ml.txt
echo "$want" > "$stamp"
