"""CPU expert offload for decode (seed 003 §5.1): experts in (pinned) host memory, the next layer's
predicted experts prefetched into a double buffer while the current layer computes. Torch only.

- ``OffloadEngine``: two device buffers of expert slots, resident experts, the copy lane
  (``acquire`` / ``prefetch`` / ``release``).
- ``OffloadConfig``: execution (on_demand, exact, speculative), capacity, timing.
- ``choose_resident`` / ``roofline_resident_count``: which experts stay on the device, and how many.
- ``DecodeStack`` and ``python -m sgl_moe.offload.bench``: the decode benchmark (no SGLang).
"""

from sgl_moe.offload.config import EXECUTIONS, OffloadConfig, OffloadConfigError
from sgl_moe.offload.engine import OffloadCapacityError, OffloadEngine, OffloadStats
from sgl_moe.offload.resident import choose_resident, expected_active_experts, roofline_resident_count

__all__ = ["EXECUTIONS", "OffloadCapacityError", "OffloadConfig", "OffloadConfigError", "OffloadEngine",
           "OffloadStats", "choose_resident", "expected_active_experts", "roofline_resident_count"]
