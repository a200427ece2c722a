"""The one place the patches' configuration crosses process boundaries: an environment variable.

The launcher writes it before SGLang starts; SGLang's scheduler processes (where the model runs) inherit it
and the plugin reads it. Absent variable = no patch (SGLang's own path, untouched).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

ENV_VAR = "SGLMOE_RUNTIME"
"""Not ``SGL_*``: SGLang warns that every ``SGL_*`` variable is a deprecated spelling of ``SGLANG_*``."""


@dataclass(frozen=True)
class RuntimeConfig:
    weight_streaming: str = "off"
    stream_window: int = 2
    expert_offload: bool = False
    predictor: str = "hybrid"
    execution: str = "exact"
    resident_experts: int = 0
    dual_batch: str = "off"
    dual_batch_always: bool = False
    profile_dir: str | None = None
    """Where the calibration handshake happens: the HTTP process writes ``request.json`` (minimum tokens of the
    profile forward); the scheduler writes ``profile.json`` (per-layer timings of that forward)."""

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> "RuntimeConfig | None":
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return None
        return cls(**json.loads(raw))

    def export(self) -> None:
        os.environ[ENV_VAR] = self.to_env()
