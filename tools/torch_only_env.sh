#!/usr/bin/env bash
# A torch-only environment like the GPU machine's image (torch, numpy, pytest, and the safetensors and
# transformers the prediction part reads checkpoints with, as the image has them; no SGLang, orjson, msgspec,
# pyzmq, no project install), then the GPU suite's smoke run and the engine tests in it.
#
#   bash tools/torch_only_env.sh            # build .venv-torch (seconds), smoke suite, engine tests
#   bash tools/torch_only_env.sh --env-only # build and check .venv-torch only
#
# How: .venv-torch is a plain venv of .venv's own interpreter whose site-packages holds symbolic links to
# exactly those distributions and what they need (their Requires-Dist closure, read from .venv's
# metadata), and nothing else. Same torch build as .venv, no download, and everything else (sglang, orjson,
# msgspec, zmq, the router's aiohttp, the editable sgl_moe install) is absent by construction; the script checks that
# they are not importable and fails if one is. The GPU image differs in versions (Python 3.12, torch 2.11):
# keep engine code to APIs both have.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
env_only=0
[ "${1:-}" = "--env-only" ] && env_only=1

secs() {  # secs T0_NS [T1_NS]: seconds between two `date +%s%N` readings (no bc on every image)
    local d=$(( ${2:-$(date +%s%N)} - $1 ))
    printf '%d.%03d' $(( d / 1000000000 )) $(( d / 1000000 % 1000 ))
}

[ -x .venv/bin/python ] || bash tools/bootstrap.sh
t0=$(date +%s%N)
base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
rm -rf .venv-torch
"$base" -m venv --without-pip .venv-torch
site=$(.venv-torch/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# Link each distribution of the closure: every top-level entry its RECORD names (packages, modules, .libs,
# its dist-info), so importlib.metadata and pytest's plugin discovery see exactly these distributions.
.venv/bin/python - "$site" <<'PY'
import os
import sys
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement

site = sys.argv[1]
todo, seen = ["torch", "numpy", "pytest", "safetensors", "transformers"], {}
env = default_environment()
while todo:
    name = todo.pop()
    key = name.lower().replace("_", "-")
    if key in seen:
        continue
    dist = metadata.distribution(name)
    seen[key] = dist
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
            todo.append(req.name)
linked = set()
for dist in seen.values():
    top = {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__") and not f.parts[0].endswith(".pth")}
    for entry in top:
        src = os.path.join(str(dist.locate_file("")), entry)
        if os.path.exists(src) and entry not in linked:
            os.symlink(src, os.path.join(site, entry))
            linked.add(entry)
print(f"[torch-only] {len(seen)} distributions linked: {', '.join(sorted(d.metadata['Name'] for d in seen.values()))}")
PY
# What the GPU image lacks must not be importable here (and the project must not be installed: checked from
# outside the checkout, whose root would otherwise be on sys.path).
(cd / && "$root/.venv-torch/bin/python" - <<'PY'
import importlib.util
import sys

import numpy
import pytest
import torch

absent = ["sglang", "sgl_kernel", "orjson", "msgspec", "zmq", "sgl_moe", "aiohttp", "prometheus_client"]
present = [m for m in absent if importlib.util.find_spec(m) is not None]
if present:
    sys.exit(f"[torch-only] not torch-only: {present} importable")
print(f"[torch-only] python {sys.version.split()[0]}, torch {torch.__version__}, numpy {numpy.__version__}, "
      f"pytest {pytest.__version__}; not importable: {', '.join(absent)}")
PY
)
printf '[torch-only] environment built in %.1f s\n' "$(secs $t0 $(date +%s%N))"
[ "$env_only" = 1 ] && exit 0

export PYTHON="$root/.venv-torch/bin/python"
t1=$(date +%s%N)
bash tools/gpu_suite.sh --smoke
printf '[torch-only] smoke suite: %.1f s\n' "$(secs $t1 $(date +%s%N))"
t2=$(date +%s%N)
# The engine tests without the project installed: sgl_moe from the checkout. -p no:cacheprovider keeps the
# run read-only; the worker-marked tests start SGLang and do not belong here.
PYTHONPATH="$root" "$PYTHON" -m pytest -q -p no:cacheprovider -m "not worker" \
    tests/streaming tests/offload tests/overlap tests/prediction
printf '[torch-only] engine tests: %.1f s; total %.1f s\n' "$(secs $t2 $(date +%s%N))" "$(secs $t0 $(date +%s%N))"
