#!/usr/bin/env bash
# Create .venv (Python 3.11) inside the repository and install sgl_moe with its pinned dependencies.
# `bash tools/bootstrap.sh --pick-python` only says which interpreter a new .venv would be made with.
# Idempotent: a second run only checks two stamps (seconds). First run: ~6 min, ~11 GB (SGLang
# brings torch and CUDA libraries even on a CPU-only machine).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A Python 3.11 that can make a venv with pip in it (Debian's needs python3.11-venv for ensurepip).
is_311() { "$1" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; }

# PYTHON=... decides. Otherwise the fastest Python 3.11 found: the router is Python, and the same code runs ~25-30%
# faster on a build with profile-guided and link-time optimisation (Debian's /usr/bin/python3.11, python.org's,
# conda's) than on a plain source build (pyenv's default). tools/python_speed.py times each one; another
# interpreter than the first found is taken only when it is at least 10% faster.
pick_python() {
    if [ -n "${PYTHON:-}" ]; then
        if command -v "$PYTHON" >/dev/null 2>&1 && is_311 "$PYTHON"; then echo "$PYTHON"; return 0; fi
        echo "PYTHON=$PYTHON is not a Python 3.11 interpreter with venv and ensurepip" >&2
        return 1
    fi
    local best="" best_t="" seen=" " py exe t
    for py in python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11 python3; do
        command -v "$py" >/dev/null 2>&1 && is_311 "$py" || continue
        exe=$("$py" -c 'import os, sys; print(os.path.realpath(sys.executable))')
        case "$seen" in *" $exe "*) continue ;; esac
        seen="$seen$exe "
        t=$("$py" tools/python_speed.py) || continue
        echo "[bootstrap] $exe ($("$py" --version 2>&1)): ${t} s on tools/python_speed.py" >&2
        if [ -z "$best" ] || awk -v t="$t" -v b="$best_t" 'BEGIN { exit !(t < 0.9 * b) }'; then
            best=$py best_t=$t
        fi
    done
    if [ -z "$best" ]; then
        echo "sgl_moe needs Python 3.11 (SGLang 0.5.23 supports >= 3.11; the pins are for 3.11); set PYTHON=..." >&2
        return 1
    fi
    echo "$best"
}

# An existing .venv keeps its interpreter. Say so when a new one would be made on a faster one (the same 10% rule).
# $1: the interpreter a new .venv would be made with (pick_python's answer).
check_venv_python() {
    local venv_exe venv_t best=$1 best_exe best_t
    venv_exe=$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys._base_executable))' 2>/dev/null) \
        || return 0
    best_exe=$("$best" -c 'import os, sys; print(os.path.realpath(sys.executable))')
    [ "$best_exe" != "$venv_exe" ] || return 0
    venv_t=$("$venv_exe" tools/python_speed.py) && best_t=$("$best" tools/python_speed.py) || return 0
    if awk -v t="$best_t" -v b="$venv_t" 'BEGIN { exit !(t < 0.9 * b) }'; then
        echo "[bootstrap] note: .venv runs on $venv_exe (${venv_t} s on tools/python_speed.py); $best_exe" \
            "(${best_t} s) is faster, and the router with it: delete .venv and run this again to rebuild on it" >&2
    fi
}

if [ "${1:-}" = "--pick-python" ]; then  # which interpreter a new .venv would be made with, and why
    best=$(pick_python)
    echo "$best"
    if [ -x .venv/bin/python ]; then check_venv_python "$best"; fi
    exit
fi

if [ ! -x .venv/bin/python ]; then
    py=$(pick_python)
    echo "[bootstrap] creating .venv with $($py --version) ($py)"
    "$py" -m venv .venv
    touch .venv/.sgl_moe-python-checked
elif [ ! -e .venv/.sgl_moe-python-checked ]; then  # once per .venv: a few seconds
    if best=$(pick_python 2>/dev/null); then check_venv_python "$best"; fi
    touch .venv/.sgl_moe-python-checked
fi

# A strict editable install links each module file and builds the C extensions (pyproject's ext-modules) and the
# compiled router modules (setup.py); relink when modules are added or removed, rebuild when a C source, a .pxd or
# setup.py changes. A router module edited since its build runs from its source (sgl_moe.router.compiled_modules) until then.
mods_stamp=.venv/.sgl_moe-modules
mods_hash=$( { find sgl_moe router patches loadtest -type f \( -name '*.py' -o -path '*/models/*' \) -not -path '*/__pycache__/*' \
    | sort; find sgl_moe router \( -name '*.c' -o -name '*.pxd' \) | sort | xargs cat; cat setup.py; } | sha256sum | cut -d' ' -f1)

deps_stamp=.venv/.sgl_moe-deps
deps_hash=$(cat pyproject.toml tools/constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$deps_stamp" 2>/dev/null)" != "$deps_hash" ]; then
    echo "[bootstrap] installing sgl_moe and pinned dependencies (first time: ~8 min, ~11 GB)"
    progress=on; [ -n "${CI:-}" ] && progress=off
    .venv/bin/python -m pip install --quiet --upgrade pip==25.3
    .venv/bin/python -m pip install --progress-bar "$progress" -c tools/constraints.txt \
        -e ".[test]" --config-settings editable_mode=strict
    echo "$deps_hash" > "$deps_stamp"
    echo "$mods_hash" > "$mods_stamp"  # that install linked and built them too
fi

if [ "$(cat "$mods_stamp" 2>/dev/null)" != "$mods_hash" ]; then
    echo "[bootstrap] relinking the editable install (module list, C sources, .pxd files or setup.py changed; ~3 min)"
    .venv/bin/python -m pip install --quiet --no-deps -e . --config-settings editable_mode=strict 2>/dev/null
    echo "$mods_hash" > "$mods_stamp"
fi
