"""The pool's KV-event sink: one listener per attention-DP rank of each worker, and their batches applied
to that rank's committed table in the ``BlockIndex``.

Stored blocks also settle the pending ledger and call ``on_change`` (queued requests may wait for exactly
those blocks); a reset from a listener (gap it cannot replay, publisher restart) empties the table.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from sgl_moe.kv_event_keys import ClientKeys
from sgl_moe.router.membership.event_listener import EventListener, EventSource
from sgl_moe.router.membership.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger

log = logging.getLogger("sgl_moe.router.workers")


class KvEventSink:
    """Starts and stops the workers' event listeners and applies what they deliver (``EventSink``)."""

    def __init__(self, workers: dict[str, Worker], index: BlockIndex, ledger: PendingLedger,
                 on_change: Callable[[], None], drop_seqs: frozenset[int] = frozenset(),
                 curve: ClientKeys | None = None) -> None:
        self.workers = workers
        """The pool's own dict (shared, never copied): events of a removed worker are ignored."""
        self.index = index
        self.ledger = ledger
        self.on_change = on_change
        self.drop_seqs = drop_seqs
        self.curve = curve
        """The router's CURVE keys (``--kv-events-keys``) for every listener; None: plain ZMQ."""

    def attach(self, worker: Worker) -> None:
        """Start a listener for each KV-event endpoint the worker publishes (none: ``reports_stored`` False)."""
        worker.reports_stored = bool(worker.info.kv_events)
        for e in worker.info.kv_events:
            source = EventSource(worker_id=worker.id, dp_rank=e.dp_rank,
                                 endpoint=event_endpoint(e.endpoint, worker.url),
                                 replay_endpoint=event_endpoint(e.replay_endpoint, worker.url)
                                 if e.replay_endpoint else None, topic=e.topic or "")
            listener = EventListener(source, self, drop_seqs=self.drop_seqs, curve=self.curve)
            worker.listeners.append(listener)
            worker.tasks.append(asyncio.create_task(listener.run(), name=f"events-{worker.id}-{source.dp_rank}"))
        if not worker.info.kv_events:
            log.warning("worker %s (%s) publishes no KV events: its committed table stays empty and "
                        "routing to it relies on the pending table alone (no holds for its promised blocks)",
                        worker.id, worker.url)

    @staticmethod
    def detach(worker: Worker) -> None:
        for listener in worker.listeners:
            listener.stop()
        for task in worker.tasks:
            task.cancel()

    def on_batch(self, source: EventSource, batch: EventBatch) -> None:
        """Apply one batch (hook: the simulator delivers its engines' events here, as the listeners do)."""
        worker = self.workers.get(source.worker_id)
        if worker is None:
            return
        slot = worker.slots.get(source.dp_rank if batch.dp_rank is None else batch.dp_rank)
        if slot is None:
            return
        worker.last_progress = time.monotonic()
        stored = False
        gained: list[Sequence[int]] = []  # (each store's answer kept whole: the ledger reads them only when it waits)
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.lora_name is not None or event.lora_id is not None:
                    continue  # adapter namespace: not routed with affinity (see block_hash)
                gained.append(self.index.store(slot, event.block_hashes))
                worker.counters.events_stored += len(event.block_hashes)
                stored = True
            elif isinstance(event, BlockRemoved):
                self.index.remove(slot, event.block_hashes)
                worker.counters.events_removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                dropped = self.index.clear_committed(slot)
                worker.counters.events_cleared += 1
                log.info("worker %s rank %d cleared its cache: dropped %d committed blocks",
                         worker.id, source.dp_rank, dropped)
        if stored:
            self.ledger.on_stored(slot, gained[0] if len(gained) == 1 else itertools.chain.from_iterable(gained))
            self.on_change()  # queued requests may wait for exactly these blocks

    def on_reset(self, source: EventSource, reason: str) -> None:
        worker = self.workers.get(source.worker_id)
        if worker is None:
            return
        slot = worker.slots.get(source.dp_rank)
        if slot is None:
            return
        dropped = self.index.clear_committed(slot)
        worker.counters.table_resets += 1
        log.info("worker %s rank %d committed table reset (%s): dropped %d blocks",
                 worker.id, source.dp_rank, reason, dropped)


def event_endpoint(endpoint: str, worker_url: str) -> str:
    """A wildcard bind address (``tcp://*:P``, ``tcp://0.0.0.0:P``) is reached on the worker's own host."""
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:"):
        if endpoint.startswith(wildcard):
            return f"tcp://{host}:{endpoint[len(wildcard):]}"
    return endpoint
