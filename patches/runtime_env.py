"""The one place the patches' configuration crosses process boundaries: an environment variable.

The launcher exports a ``RuntimeConfig`` before SGLang starts; SGLang's scheduler processes (where the model
runs) inherit it and the patches read it once per process with ``current()``. Absent variable = no patch
(SGLang's own path, untouched).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass

from sgl_moe.wire import RUNTIME_ENV_VAR
from sgl_moe.worker.args import MoeArgs

ENV_VAR = RUNTIME_ENV_VAR


@dataclass(frozen=True)
class RuntimeConfig:
    moe: MoeArgs
    """The worker's ``--moe-*`` flags, as the launcher validated them."""
    profile_dir: str | None = None
    """The worker's runtime directory: where the calibration handshake happens (the HTTP process writes
    ``wire.PROFILE_REQUEST_FILE``, the scheduler ``wire.PROFILE_FILE``) and the patches leave their counts."""

    @property
    def weight_streaming(self) -> str:
        """The whole-layer streaming mode the scheduler runs (``host`` when offload implies it)."""
        return self.moe.stream_mode

    def to_env(self) -> str:
        return json.dumps({"moe": asdict(self.moe), "profile_dir": self.profile_dir})

    @classmethod
    def from_env(cls) -> RuntimeConfig | None:
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return None
        data = json.loads(raw)
        return cls(MoeArgs(**data["moe"]), data.get("profile_dir"))

    def export(self) -> None:
        os.environ[ENV_VAR] = self.to_env()
        current.cache_clear()


@functools.cache
def current() -> RuntimeConfig | None:
    """This process's configuration, read from the environment once."""
    return RuntimeConfig.from_env()
