#!/usr/bin/env bash
# The demo on the embedded stack: set up the environment, compile the examples (Argo, Tekton)
# into out/, start NATS + the five services (`couler up`, state in out/stack), submit an
# example program and a request in plain English, submit the request again to show every
# step reused from the cache, print the dashboard URL, and stop everything (`couler down`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
couler=.venv/bin/couler
mkdir -p out
for f in examples/*.py; do
  name=$(basename "$f" .py)
  $couler compile "$f" -o "out/$name.yaml"
done
echo "compiled $(ls examples/*.py | wc -l) examples to Argo YAML in out/ (e.g. out/coin_flip.yaml)"
$couler compile examples/dag_diamond.py --engine tekton -o out/dag_diamond.tekton.yaml
echo "compiled examples/dag_diamond.py for Tekton: out/dag_diamond.tekton.yaml"
echo

export COULER_HOME="$PWD/out/stack"
./scripts/setup-ml-venv.sh       # the generated steps' libraries (scikit-learn, XGBoost, LightGBM)
export COULER_LOCAL_PYTHON="ghcr.io/couler-io/ml-tabular:*=$PWD/.venv-ml/bin/python"
$couler down >/dev/null 2>&1 || true           # a stack left over from an earlier demo
trap '$couler down || true' EXIT
$couler up
echo
echo "== submit examples/map_batches.py (a map over an upstream output) and wait"
$couler submit examples/map_batches.py --wait
echo
request="train an XGBoost and a LightGBM model on sample://breast_cancer, evaluate both, keep the better one"
echo "== submit a request in plain English: \"$request\""
$couler submit --text "$request" --wait
echo
echo "== the same request again: every step is reused from the cache"
$couler submit --text "$request" --wait
echo
$couler status
echo
echo "dashboard: $(.venv/bin/python -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["dashboard"] + "?token=" + d["token"])' "$COULER_HOME/stack.json")"
echo "(the stack stops when this script ends; run the steps above by hand to keep it up)"
