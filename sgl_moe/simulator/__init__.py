"""Discrete-event simulator of 8 to 256 workers behind the router, driving the router's own placement code.

The router side is the router: its ``Scheduler`` (policies, true-FLOPs cost, spill rule, Θ admission,
FIFO queue), ``BlockIndex`` (committed and pending tables) and ``PendingLedger``, on a virtual clock,
with KV events applied through the pool's ``KvEventSink.on_batch``; sglang-router's ``cache_aware`` and
``power_of_two`` are modelled (``sglang_router_model``). Workers are models of SGLang's prefill loop
(``engine``: continuous batching, chunked prefill, a radix cache of pages with LRU eviction) timed by a
``Calibration`` (``cpu_tiny`` for the shipped model on this CPU, ``h100_30b`` for Qwen3-30B-A3B on an H100).

Modules: ``timing_model`` (a worker's timing model, ``Calibration``: presets, JSON), ``fit_timing`` (time a
running worker and fit that model), ``timeline`` (virtual clock), ``units`` (workload stream -> prefill units
with block hashes), ``prefix_units`` (shared-prefix streams, Zipf or uniform), ``kv_cache`` and ``engine``
(a worker), ``router_frontend``, ``memo``, ``certificate``, ``certify``, ``watch_lists``, ``logged_index`` and
``room`` (the router in the loop, and the exact re-scoring memo), ``sglang_router_model``, ``simulation``
(one run), ``experiments`` and ``report`` (what ``python -m sgl_moe.simulator`` prints), ``scenarios`` and
``matrix`` (issue 18's scenario matrix).
"""

from sgl_moe.simulator.simulation import POLICIES, SimConfig, SimResult, Simulation
from sgl_moe.simulator.timing_model import PRESETS, Calibration, cpu_tiny, h100_30b, load
from sgl_moe.simulator.units import SimUnit, UnitStream

__all__ = ["POLICIES", "PRESETS", "Calibration", "SimConfig", "SimResult", "SimUnit", "Simulation", "UnitStream",
           "cpu_tiny", "h100_30b", "load"]
