#!/usr/bin/env bash
# Set up the environment, compile every example to Argo YAML (into out/), then really run
# two examples on the local engine with live progress.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
mkdir -p out
for f in examples/*.py; do
  name=$(basename "$f" .py)
  .venv/bin/couler compile "$f" -o "out/$name.yaml"
done
echo "compiled $(ls examples/*.py | wc -l) examples to Argo YAML in out/ (e.g. out/coin_flip.yaml)"
.venv/bin/couler compile examples/dag_diamond.py --engine tekton -o out/dag_diamond.tekton.yaml
echo "compiled examples/dag_diamond.py for Tekton: out/dag_diamond.tekton.yaml"
echo
echo "== running examples/coin_flip.py on the local engine"
.venv/bin/couler run examples/coin_flip.py --work-dir out/runs
echo
echo "== running examples/map_batches.py on the local engine (run record: --json)"
.venv/bin/couler run examples/map_batches.py --work-dir out/runs --json > out/map_batches.run.json
echo "run record: out/map_batches.run.json"
