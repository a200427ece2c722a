#!/usr/bin/env bash
# Create .venv (Python 3.11) inside the repository and install sgl_moe with its pinned dependencies.
# Idempotent: a second run only checks two stamps (seconds). First run: ~6 min, ~11 GB (SGLang
# brings torch and CUDA libraries even on a CPU-only machine).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

pick_python() {
    for py in "${PYTHON:-}" python3.11 python3; do
        [ -n "$py" ] || continue
        if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            echo "$py"; return 0
        fi
    done
    echo "sgl_moe needs Python 3.11 (SGLang 0.5.23 supports >= 3.11; the pins are for 3.11); set PYTHON=..." >&2
    return 1
}

if [ ! -x .venv/bin/python ]; then
    py=$(pick_python)
    echo "[bootstrap] creating .venv with $($py --version)"
    "$py" -m venv .venv
fi

deps_stamp=.venv/.sgl_moe-deps
deps_hash=$(cat pyproject.toml tools/constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$deps_stamp" 2>/dev/null)" != "$deps_hash" ]; then
    echo "[bootstrap] installing sgl_moe and pinned dependencies (first time: ~6 min, ~11 GB)"
    progress=on; [ -n "${CI:-}" ] && progress=off
    .venv/bin/python -m pip install --quiet --upgrade pip==25.3
    .venv/bin/python -m pip install --progress-bar "$progress" -c tools/constraints.txt \
        -e ".[test]" --config-settings editable_mode=strict
    echo "$deps_hash" > "$deps_stamp"
    rm -f .venv/.sgl_moe-modules
fi

# A strict editable install links each module file and builds the C extensions (pyproject's ext-modules); relink
# when modules are added or removed, rebuild when a C source changes.
mods_stamp=.venv/.sgl_moe-modules
mods_hash=$( { find sgl_moe router patches loadtest -type f \( -name '*.py' -o -path '*/models/*' \) -not -path '*/__pycache__/*' \
    | sort; find sgl_moe router -name '*.c' | sort | xargs cat; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$mods_stamp" 2>/dev/null)" != "$mods_hash" ]; then
    echo "[bootstrap] relinking the editable install (module list or C sources changed)"
    .venv/bin/python -m pip install --quiet --no-deps -e . --config-settings editable_mode=strict 2>/dev/null
    echo "$mods_hash" > "$mods_stamp"
fi
