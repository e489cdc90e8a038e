#!/usr/bin/env bash
# Set up the environment, then compile every example workflow to Argo YAML and show one.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
mkdir -p out
for f in examples/*.py; do
  name=$(basename "$f" .py)
  .venv/bin/couler compile "$f" -o "out/$name.yaml"
  .venv/bin/couler validate "$f"
done
echo
echo "== out/coin_flip.yaml (all examples compiled into out/) =="
cat out/coin_flip.yaml
