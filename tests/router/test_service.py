"""The service's published hooks: other routes (``/v1/classify``) reuse placement and forwarding through them."""

import inspect

from sgl_moe.router.front.forwarding import Forwarder
from sgl_moe.router.front.service import Router

HOOKS = {Router: ("run",), Forwarder: ("forward",)}
"""``classify_route`` places through ``router.run`` and forwards through ``router.forwarder.forward``."""


def test_published_hooks_are_public_documented_coroutines():
    for cls, names in HOOKS.items():
        for name in names:
            method = getattr(cls, name)
            assert inspect.iscoroutinefunction(method) and inspect.getdoc(method), (cls.__name__, name)


def test_stored_blocks_pump_the_queue_once_per_event_loop_turn():
    """A replay delivers thousands of KV-event batches in a few loop turns; each would re-score the queue."""
    import asyncio
    from types import SimpleNamespace

    from sgl_moe.router.config import RouterConfig

    async def run() -> list[int]:
        router = Router(RouterConfig())
        pumps: list[int] = []
        router.scheduler = SimpleNamespace(pump=lambda: pumps.append(1))
        for _ in range(1000):  # a chunk of replayed batches, each with stored blocks
            router._on_capacity()
        assert pumps == []  # nothing re-scored inside the chunk
        await asyncio.sleep(0)
        assert pumps == [1]
        router._on_capacity()  # a later turn pumps again
        await asyncio.sleep(0)
        return pumps

    assert asyncio.run(run()) == [1, 1]
