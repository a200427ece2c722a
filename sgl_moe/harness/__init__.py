"""Child processes started the same way everywhere, and the demo (``python -m sgl_moe``).

- ``worker_process``: ``WorkerProcess`` (``python -m sgl_moe.launch_server`` as a child: start, wait, stop),
  ``free_port``, ``stop_process_group``.
- ``router_process``: ``RouterProcess`` (``python -m sgl_moe.router`` as a child).
- ``router_client``: a small synchronous client for the router's HTTP API.
- ``demo``: the main job on the embedded default (the router in front of workers on the shipped model).

Used by the demo, the test fixtures, ``sgl_moe.policy_bench`` and the benchmarks; light (httpx only).
"""

from sgl_moe.harness.router_process import RouterProcess, RouterStartError
from sgl_moe.harness.worker_process import WorkerProcess, WorkerStartError, free_port, stop_process_group

__all__ = ["RouterProcess", "RouterStartError", "WorkerProcess", "WorkerStartError", "free_port",
           "stop_process_group"]
