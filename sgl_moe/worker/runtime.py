"""Hand the patches their configuration: check the ``--moe-*`` flags against SGLang's, then export a
``RuntimeConfig`` through the environment SGLang's scheduler processes inherit."""

from __future__ import annotations

import logging
import tempfile

from sgl_moe.patches.runtime_env import RuntimeConfig
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.argv import ArgvView
from sgl_moe.worker.preflight import LaunchError, check_predictor_bundle

logger = logging.getLogger("sgl_moe.launch_server")


def export_dual_batch(argv: ArgvView, moe: MoeArgs, cpu_engine: bool) -> str:
    """``--moe-dual-batch``: refuse what cannot work, then hand the patch its configuration. Returns the
    directory where the patch leaves its counts for ``/sgl_moe/info``."""
    backend = argv.value("--attention-backend")
    if not (backend == "torch_native" or (backend is None and cpu_engine)):
        raise LaunchError(f"--moe-dual-batch {moe.dual_batch} runs attention per micro-batch, which this version "
                          f"does with backends that keep no per-batch plan: torch_native (the CPU path); "
                          f"{backend or 'the GPU default backend'} would need one child backend per micro-batch")
    if not cpu_engine and not argv.has("--disable-cuda-graph"):
        raise LaunchError(f"--moe-dual-batch {moe.dual_batch} runs decode forwards through its own micro-batch "
                          "pipeline (host threads, a split chosen per batch shape), which CUDA graphs would freeze "
                          "at capture time; add --disable-cuda-graph")
    for flag, alone in (("--tp-size", "1"), ("--pp-size", "1"), ("--dp-size", "1")):
        value = argv.value(flag)
        if value is not None and value != alone:
            raise LaunchError(f"--moe-dual-batch {moe.dual_batch} runs on one rank; it cannot be combined with "
                              f"{flag} {value}")
    if argv.has("--enable-two-batch-overlap"):
        raise LaunchError("--moe-dual-batch is the project's own two-micro-batch overlap (no all-to-all backend "
                          "needed); do not combine it with SGLang's --enable-two-batch-overlap")
    stats_dir = tempfile.mkdtemp(prefix="sgl_moe-dual-batch-")
    RuntimeConfig(moe, profile_dir=stats_dir).export()
    logger.info("dual micro-batch attention-MoE overlap: %s (decode forwards of >= 2 sequences)", moe.dual_batch)
    return stats_dir


def export_runtime(argv: ArgvView, moe: MoeArgs, cpu_engine: bool) -> str | None:
    """Check the patch flags against the SGLang flags and hand the patches their configuration (through the
    environment SGLang's processes inherit). Returns the runtime directory (None when no patch is on)."""
    if moe.dual_batch != "off" and not moe.streaming:
        return export_dual_batch(argv, moe, cpu_engine)
    if not moe.streaming:
        if moe.kv_events_keys is not None:  # the CURVE KV-event publisher reads its keys in the scheduler
            RuntimeConfig(moe).export()
        return None
    what = "--moe-expert-offload" if moe.expert_offload else f"--moe-weight-streaming {moe.weight_streaming}"
    if not cpu_engine and not argv.has("--disable-cuda-graph"):
        raise LaunchError(f"{what} swaps expert buffers per layer (and reads the routed expert ids on the host), "
                          "which CUDA graphs would freeze at capture time; add --disable-cuda-graph")
    value = argv.value("--ep-size", "--expert-parallel-size")
    if value is not None and value != "1":
        flag = "--ep-size" if argv.has("--ep-size") else "--expert-parallel-size"
        raise LaunchError(f"{what} keeps every expert of a layer reachable from each rank; it cannot be "
                          f"combined with {flag} {value}")
    if argv.has("--enable-two-batch-overlap"):
        raise LaunchError(f"{what} cannot be combined with --enable-two-batch-overlap")
    if moe.expert_offload and moe.execution != "on_demand":
        check_predictor_bundle(argv.value("--model-path", "--model"))
    profile_dir = tempfile.mkdtemp(prefix="sgl_moe-calibration-")
    RuntimeConfig(moe, profile_dir=profile_dir).export()
    logger.info("expert weight streaming: %s, window %d; Θ calibration files in %s", moe.stream_mode,
                moe.stream_window, profile_dir)
    if moe.expert_offload:
        logger.info("expert offload for decode: predictor %s, execution %s, %d resident experts per layer",
                    moe.predictor, moe.execution, moe.resident_experts)
    return profile_dir
