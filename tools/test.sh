#!/usr/bin/env bash
# The whole test suite (sets up .venv first). Extra arguments go to pytest, e.g. `-m "not worker"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
