#!/usr/bin/env bash
# The whole test suite (sets up .venv first): the linter, then pytest. Extra arguments go to pytest,
# e.g. `-m "not worker"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/bootstrap.sh
echo "[test] ruff check (pyproject.toml [tool.ruff])"
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
