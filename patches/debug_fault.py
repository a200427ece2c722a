"""Test-only fault: a worker whose model forward sees a chosen token id raises, as a poison request would.

``SGL_MOE_DEBUG_CRASH_TOKEN=ID`` in the worker's environment makes every forward pass whose batch holds token
``ID`` raise inside SGLang's scheduler, which (like the ``IndexError`` of an out-of-vocabulary id in
SGLang 0.5.23) takes the whole worker down. The router's tests use it to show that one such request takes
down at most one worker. Unset (always, outside tests), nothing is registered.
"""

from __future__ import annotations

import logging
import os

from sgl_moe.patches.dual_batch import MODEL_FORWARD

log = logging.getLogger("sgl_moe.patches")

ENV_VAR = "SGL_MOE_DEBUG_CRASH_TOKEN"
_registered = False


class DebugFault(RuntimeError):
    """The planted fault fired."""


def crash_token() -> int | None:
    value = os.environ.get(ENV_VAR, "").strip()
    return int(value) if value else None


def register() -> bool:
    """Register the fault when the environment asks for it; True if registered."""
    global _registered
    token = crash_token()
    if token is None or _registered:
        return False
    _registered = True
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def around_forward(original, model, input_ids, *args, **kwargs):
        if input_ids is not None and bool((input_ids == token).any()):
            raise DebugFault(f"{ENV_VAR}: token {token} reached the model forward pass")
        return original(model, input_ids, *args, **kwargs)

    HookRegistry.register(MODEL_FORWARD, around_forward, HookType.AROUND)
    log.warning("sgl_moe test-only fault registered: a forward pass with token %d crashes this worker", token)
    return True
