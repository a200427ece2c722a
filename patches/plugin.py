"""SGLang plugin entry point (group ``sglang.srt.plugins``): registers sgl_moe's patches in every process.

Does nothing unless the launcher exported a runtime configuration that turns a patch on, so an SGLang
started any other way in this environment runs its own code untouched. ``--moe-kv-events-keys`` registers the
CURVE KV-event publisher (``kv_events_curve``) under its own name, beside SGLang's own publishers.
"""

from __future__ import annotations

import logging

from sgl_moe.patches import runtime_env

log = logging.getLogger("sgl_moe.patches")

_registered = False


def register() -> None:
    global _registered
    from sgl_moe.patches import debug_fault

    debug_fault.register()  # test-only; nothing unless its environment variable is set
    cfg = runtime_env.current()
    if cfg is None or _registered:
        return
    if cfg.moe.kv_events_keys is not None:
        from sgl_moe.patches import kv_events_curve

        kv_events_curve.register(cfg.moe.kv_events_keys)
    if cfg.weight_streaming == "off" and cfg.moe.dual_batch == "off":
        _registered = True
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if cfg.moe.dual_batch != "off":
        from sgl_moe.patches import dual_batch

        HookRegistry.register(dual_batch.LOAD_MODEL, dual_batch.after_load_model, HookType.AFTER)
        HookRegistry.register(dual_batch.MODEL_FORWARD, dual_batch.around_model_forward, HookType.AROUND)
        log.info("sgl_moe patch registered: dual micro-batch attention-MoE overlap (%s)", cfg.moe.dual_batch)
    if cfg.weight_streaming != "off":
        if cfg.moe.expert_offload:  # decode offload; its prefill path is the streaming patch, called from inside
            from sgl_moe.patches import expert_offload as patch
        else:
            from sgl_moe.patches import expert_streaming as patch  # type: ignore[no-redef]

        HookRegistry.register(patch.LOAD_MODEL, patch.after_load_model, HookType.AFTER)
        HookRegistry.register(patch.RUN_MOE_CORE, patch.around_run_moe_core, HookType.AROUND)
        log.info("sgl_moe patch registered: expert weight streaming (%s, window %d)%s", cfg.weight_streaming,
                 cfg.moe.stream_window, f"; expert offload ({cfg.moe.execution}, predictor {cfg.moe.predictor})"
                 if cfg.moe.expert_offload else "")
    _registered = True
