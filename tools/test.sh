#!/usr/bin/env bash
# The whole test suite (sets up .venv first): the linter, then pytest. Extra arguments go to pytest,
# e.g. `-m "not worker"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/bootstrap.sh
# valgrind runs the instruction-count benchmarks' tests (parse_path and router_capacity --instructions); without it
# (not root, no apt, no mirror) those tests skip and say why.
if ! command -v valgrind >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[test] installing valgrind (apt-get) for the instruction-count tests"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind; }; } >/dev/null 2>&1 \
        || echo "[test] valgrind could not be installed: the instruction-count tests skip"
fi
echo "[test] ruff check (pyproject.toml [tool.ruff])"
.venv/bin/ruff check .
# --durations: the slowest tests listed at the end, so a CI log says where its minutes went.
exec .venv/bin/python -m pytest --durations=30 "$@"
