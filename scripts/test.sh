#!/usr/bin/env bash
# Set up the environments and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Engines whose SDKs conflict with the main environment get their own (requirements-NAME.txt).
for req in requirements-*.txt; do
  [ "$req" = requirements-dev.txt ] && continue
  [ "$req" = requirements-ml.txt ] && continue  # the catalog's ML libraries: below
  [ -e "$req" ] || continue
  name=${req#requirements-}; name=${name%.txt}
  ./scripts/setup-engine-venv.sh "$name"
done
# The catalog's tabular templates run in .venv-ml (tests/integration/test_generate_library_run.py).
./scripts/setup-ml-venv.sh
# tests/integration/test_deploy.py validates docker-compose.yml offline with Debian's
# docker-compose (no Docker engine needed); install it once when missing.
if ! command -v docker-compose >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test: installing docker-compose (apt) for the offline compose check" >&2
    (apt-get install -y -q --no-install-recommends docker-compose >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 &&
        apt-get install -y -q --no-install-recommends docker-compose >/dev/null; })
  else
    echo "test: docker-compose is missing; install it (apt-get install docker-compose)" >&2
  fi
fi
exec .venv/bin/python -m pytest "$@"
