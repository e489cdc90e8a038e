#!/usr/bin/env bash
# Set up the environments and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Engines whose SDKs conflict with the main environment get their own (requirements-NAME.txt).
for req in requirements-*.txt; do
  [ "$req" = requirements-dev.txt ] && continue
  [ -e "$req" ] || continue
  name=${req#requirements-}; name=${name%.txt}
  ./scripts/setup-engine-venv.sh "$name"
done
exec .venv/bin/python -m pytest "$@"
