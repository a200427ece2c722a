"""AsyncEP expert weight streaming (seed 000 §6, App. B.1; seed 004 §3.1), torch only.

The same engine runs inside SGLang (``sgl_moe.patches``) and in the standalone benchmark
(``python -m sgl_moe.streaming.bench``) on a GPU machine without SGLang.

- ``ExpertStore``: every MoE layer's fused expert weights (the host backing copy, or per-rank shards).
- ``WeightStreamer``: the device ring of layer slots and the lanes that refill it (``acquire`` / ``release``).
- ``StreamConfig``: mode (off, host, gather, hybrid, on_demand), window, timing.
"""

from sgl_moe.streaming.config import MODES, StreamConfig, StreamConfigError
from sgl_moe.streaming.expert_store import ExpertStore, LayerWeights
from sgl_moe.streaming.streamer import WeightStreamer

__all__ = ["MODES", "ExpertStore", "LayerWeights", "StreamConfig", "StreamConfigError", "WeightStreamer"]
