#!/usr/bin/env bash
# The GPU suite: everything a lent GPU should bring back, in two calls of under 8 minutes each on one H100.
#
#   bash tools/gpu_suite.sh 1 RESULTS_DIR      # probe, streaming selfcheck (one GPU), GPU tests
#   bash tools/gpu_suite.sh 2 RESULTS_DIR      # streaming, offload and overlap benchmarks, Qwen3-30B-A3B-shaped
#   bash tools/gpu_suite.sh --smoke [PHASE] [RESULTS_DIR]   # the same steps at tiny sizes on a CPU (CI);
#                                                           # PHASE defaults to all, RESULTS_DIR to a temp dir
#   --pack FILE.tar.gz   also pack RESULTS_DIR into one file at the end (a machine that returns few files)
#
# Needs only torch and the standard library (the GPU image has no SGLang, orjson, msgspec, pyzmq and no
# project install): runs `$PYTHON -m ...` from the repository root with the root on PYTHONPATH; PYTHON
# defaults to the first of python3, .venv-torch/bin/python, .venv/bin/python that imports torch. Each step
# writes NAME.json, NAME.md and NAME.log into RESULTS_DIR and runs under a time limit; summary-PHASE.json/.md
# give every step's exit code and seconds. A failing step does not stop the others; the suite exits 1 if any
# failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

smoke=0
pack=
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) smoke=1 ;;
        --pack) pack=${2:?--pack needs a file name}; shift ;;
        -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) args+=("$1") ;;
    esac
    shift
done
phase=${args[0]:-}
out=${args[1]:-}
if [ "$smoke" = 1 ]; then
    phase=${phase:-all}
    [ -n "$out" ] || out=$(mktemp -d /tmp/gpu-suite-smoke.XXXXXX)
fi
case "$phase" in
    1|2|all) ;;
    *) echo "usage: tools/gpu_suite.sh [--smoke] PHASE RESULTS_DIR   (PHASE: 1, 2 or all)" >&2; exit 2 ;;
esac
if [ -z "$out" ]; then
    echo "usage: tools/gpu_suite.sh [--smoke] PHASE RESULTS_DIR   (a results folder is needed)" >&2; exit 2
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then  # the GPU image's python3 holds torch; here, the project's environments do
    for c in python3 .venv-torch/bin/python .venv/bin/python; do
        if "$c" -c 'import torch' 2>/dev/null; then PY=$c; break; fi
    done
    PY=${PY:-python3}
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$smoke" = 1 ]; then
    dev=cpu
else
    dev=cuda
    if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        echo "gpu_suite: $PY has no torch or sees no CUDA device (set PYTHON=...; --smoke on a CPU)" >&2; exit 2
    fi
fi
echo "gpu_suite: phase $phase, device $dev, results in $out, python $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)')"

secs() {  # secs T0_NS [T1_NS]: seconds between two `date +%s%N` readings (no bc on every image)
    local d=$(( ${2:-$(date +%s%N)} - $1 ))
    printf '%d.%03d' $(( d / 1000000000 )) $(( d / 1000000 % 1000 ))
}

# step NAME LIMIT_S CMD...: CMD's stdout -> NAME.md (the tables the tools print), stderr -> NAME.log; the
# command itself writes NAME.json (--json). Recorded in $steps.
step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*" | tee -a "$out/$name.log" >&2
    local t0 t1 rc
    t0=$(date +%s%N)
    timeout --kill-after=10 "$limit" "$@" >"$out/$name.md" 2>>"$out/$name.log"
    rc=$?
    t1=$(date +%s%N)
    local files
    files=$(cd "$out" && ls -1 "$name".* 2>/dev/null | paste -sd, -)
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(secs $t0 $t1)" "$limit" "$files" >>"$steps"
    printf '== %s: exit %s, %.1f s\n' "$name" "$rc" "$(secs $t0 $t1)" >&2
    if [ "$rc" != 0 ]; then
        failed=1
        echo "-- last lines of $name.log:" >&2
        tail -n 30 "$out/$name.log" >&2
    fi
}

summarize() {
    "$PY" tools/gpu_suite_report.py summary "$steps" "$out/summary-$1.json" "$out/summary-$1.md"
}

pytest_step() {  # pytest_step NAME LIMIT ARGS...: junit XML turned into NAME.json and NAME.md
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" "$PY" -m pytest -q -p no:cacheprovider --junitxml "$out/$name.xml" "$@"
    mv "$out/$name.md" "$out/$name.pytest.txt"
    "$PY" tools/gpu_suite_report.py junit "$out/$name.xml" "$out/$name.json" "$out/$name.md"
}

failed=0
run_phase1() {
    steps="$out/.steps-1.tsv"; : >"$steps"
    if [ "$smoke" = 1 ]; then
        step probe 120 "$PY" tools/gpu_probe.py --device cpu --smoke --json "$out/probe.json"
        step selfcheck 120 "$PY" -m sgl_moe.streaming.selfcheck --device cpu --ranks 1 --json "$out/selfcheck.json"
        # No GPU: the GPU tests' device-independent cases run on the CPU (a dry run of their code).
        SGL_MOE_GPU_TEST_DEVICE=cpu pytest_step gpu_tests 300 -m gpu tests/streaming tests/offload tests/overlap
    else
        step probe 90 "$PY" tools/gpu_probe.py --json "$out/probe.json"
        # One GPU, one rank: the default modes are the ones a single rank can run (host, on_demand).
        step selfcheck 90 "$PY" -m sgl_moe.streaming.selfcheck --device cuda --json "$out/selfcheck.json"
        pytest_step gpu_tests 270 -m gpu tests/streaming tests/offload tests/overlap
    fi
    summarize 1
}

run_phase2() {
    steps="$out/.steps-2.tsv"; : >"$steps"
    if [ "$smoke" = 1 ]; then
        step streaming_bench 120 "$PY" -m sgl_moe.streaming.bench --device cpu --tiny --layers 3 --sizes 64,128 \
            --seq 32 --warmup 1 --reps 2 --json "$out/streaming_bench.json"
        step offload_bench 120 "$PY" -m sgl_moe.offload.bench --device cpu --tiny --layers 3 --batches 1,2 \
            --context 32 --warmup 1 --steps 2 --json "$out/offload_bench.json"
        step overlap_streams 120 "$PY" -m sgl_moe.overlap.bench --device cpu --tiny --layers 2 --placement streams \
            --prefill 2x16 --reps 2 --json "$out/overlap_streams.json"
        step overlap_cpu_experts 120 "$PY" -m sgl_moe.overlap.bench --device cpu --tiny --layers 2 \
            --placement cpu-experts --batches 2,4 --context 32 --reps 2 --json "$out/overlap_cpu_experts.json"
    else
        # Qwen3-30B-A3B layer shapes (hidden 2048, 128 experts of width 768, top-8), bf16. Limits add up to
        # 510 s; expected well under (setup is mostly generating ~10 GB of random expert weights). Measured:
        # 198 s on an H100 (2026-11-26), 280 s on an H200 (2026-11-28; offload_bench 84 s, hence its 130).
        step streaming_bench 200 "$PY" -m sgl_moe.streaming.bench --device cuda --layers 8 \
            --sizes 4096,16384,65536,131072 --warmup 1 --reps 3 --json "$out/streaming_bench.json"
        step offload_bench 130 "$PY" -m sgl_moe.offload.bench --device cuda --layers 8 --batches 1,4,16 \
            --context 4096 --warmup 2 --steps 6 --json "$out/offload_bench.json"
        step overlap_streams 80 "$PY" -m sgl_moe.overlap.bench --device cuda --layers 4 --placement streams \
            --reps 5 --json "$out/overlap_streams.json"
        step overlap_cpu_experts 100 "$PY" -m sgl_moe.overlap.bench --device cuda --layers 4 \
            --placement cpu-experts --batches 16,32,64 --context 8192 --reps 3 --json "$out/overlap_cpu_experts.json"
    fi
    summarize 2
}

case "$phase" in
    1) run_phase1 ;;
    2) run_phase2 ;;
    all) run_phase1; run_phase2 ;;
esac
if [ -n "$pack" ]; then
    mkdir -p "$(dirname "$pack")" && tar czf "$pack" -C "$(dirname "$out")" "$(basename "$out")" \
        && echo "gpu_suite: packed into $pack"
fi
echo "gpu_suite: results in $out ($( [ "$failed" = 0 ] && echo ok || echo 'a step FAILED'))"
exit "$failed"
