#!/usr/bin/env bash
# The main job on the embedded default: a worker on the shipped model and a prefill-only demo.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/bootstrap.sh
exec .venv/bin/python -m sgl_moe "$@"
