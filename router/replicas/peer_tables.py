"""What the other router replicas hold, folded into this router's own tables (``--peers``).

A peer's promise becomes a promise in this router's pending table, on the slot of the worker (by URL) and DP rank
it names, so a request here matches blocks a request through another replica is computing; it is retired when
the peer retires it, when the peer's snapshot no longer lists it, or when the peer expires. A peer's in-flight
FLOPs are added to each worker's load (``set_peer_load``), so admission (Θ) counts every replica's work. A peer
that sent nothing for ``timeout_s`` (its heartbeat stopped: killed, partitioned) expires: its promises and load
are dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.replicas.messages import Load, Promised, Retired, Update

log = logging.getLogger("sgl_moe.router.replicas")


@dataclass
class PeerState:
    """One other replica, as last heard."""

    seq: int = -1
    """The sequence number of its last message applied (-1: no snapshot yet)."""
    last_seen: float = 0.0
    promises: dict[int, tuple[int | None, list[int]]] = field(default_factory=dict)
    """Its serial -> (the local slot the promise was applied to, None if that worker is unknown here; its keys)."""
    flops: dict[str, float] = field(default_factory=dict)
    queued: int = 0
    unresolved: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Serial -> (worker URL, DP rank) of its promises naming a worker this router lacks (``resolve``)."""
    since: float = float("inf")
    """When it started, from its snapshot (inf: none yet); ``shared_placement`` elects the owner by it."""


@dataclass
class PeerStats:
    batches: int = 0
    snapshots: int = 0
    gaps: int = 0
    expired: int = 0
    promises_applied: int = 0
    promises_unknown_worker: int = 0


class PeerTables:
    def __init__(self, *, index: BlockIndex, slot_of: Callable[[str, int], int | None],
                 set_peer_load: Callable[[str, float], None], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 on_drop: Callable[[str, str], None] | None = None) -> None:
        self.index = index
        self.slot_of = slot_of
        """(worker URL, DP rank) -> this router's slot for it, None when it has no such worker."""
        self.set_peer_load = set_peer_load
        """(worker URL, FLOPs all peers have in flight there): installs the peers' share of the worker's load."""
        self.timeout_s = timeout_s
        self.clock = clock
        self.on_drop = on_drop
        """(replica, why): told after a peer was dropped (``shared_placement`` releases what it held there)."""
        self.peers: dict[str, PeerState] = {}
        self.stats = PeerStats()

    # -- messages ------------------------------------------------------------------------------
    def apply_batch(self, replica: str, seq: int, updates: Iterable[Update]) -> bool:
        """Apply a peer's batch; False when this router lacks part of its state (a peer not yet synced, or a gap
        in its sequence): the caller asks for snapshots. The updates are applied either way (a retire of a
        promise never heard of is a no-op)."""
        peer = self._peer(replica)
        in_order = peer.seq >= 0 and seq == peer.seq + 1
        if peer.seq >= 0 and not in_order:
            self.stats.gaps += 1
            log.warning("replica %s: messages lost (sequence %d after %d); asking for its snapshot", replica, seq,
                        peer.seq)
        peer.seq = max(peer.seq, seq) if peer.seq >= 0 else -1
        self.stats.batches += 1
        for u in updates:
            if isinstance(u, Promised):
                self._promise(peer, u)
            elif isinstance(u, Retired):
                self._retire(peer, u.serial)
            elif isinstance(u, Load):
                self._load(peer, u)
        return in_order

    def apply_snapshot(self, replica: str, seq: int, promised: list[Promised], load: Load,
                       since: float = float("inf")) -> None:
        """Replace everything known of the peer with its snapshot."""
        peer = self._peer(replica)
        peer.since = since
        listed = {p.serial for p in promised}
        for serial in [s for s in peer.promises if s not in listed]:
            self._retire(peer, serial)
        for p in promised:
            if p.serial not in peer.promises:
                self._promise(peer, p)
        self._load(peer, load)
        peer.seq = seq
        self.stats.snapshots += 1

    def drop(self, replica: str, why: str) -> None:
        """Forget a peer: its promises retired, its load removed."""
        peer = self.peers.pop(replica, None)
        if peer is None:
            return
        promises = len(peer.promises)
        for serial in list(peer.promises):
            self._retire(peer, serial)
        for url in peer.flops:
            self._install(url)
        log.warning("replica %s dropped (%s): its %d promises and its load removed", replica, why, promises)
        if self.on_drop is not None:
            self.on_drop(replica, why)

    def expire(self) -> list[str]:
        """Drop the peers silent for ``timeout_s``; their ids."""
        now = self.clock()
        gone = [r for r, p in self.peers.items() if now - p.last_seen > self.timeout_s]
        for r in gone:
            self.stats.expired += 1
            self.drop(r, f"nothing heard for {self.timeout_s:g} s (--peer-timeout-s)")
        return gone

    def resolve(self) -> int:
        """Apply the promises that named a worker this router did not have when they arrived and has now (it
        joined since); returns how many."""
        if not self.stats.promises_unknown_worker:
            return 0
        done = 0
        for peer in self.peers.values():
            for serial, (slot, keys) in list(peer.promises.items()):
                if slot is None and serial in peer.unresolved:
                    url, rank = peer.unresolved[serial]
                    slot = self.slot_of(url, rank)
                    if slot is not None:
                        self.index.promise(slot, keys)
                        peer.promises[serial] = (slot, keys)
                        del peer.unresolved[serial]
                        done += 1
        self.stats.promises_unknown_worker -= done
        return done

    # -- views ---------------------------------------------------------------------------------
    def since(self) -> dict[str, float]:
        """Each peer's start time (inf: no snapshot yet)."""
        return {r: p.since for r, p in self.peers.items()}

    def flops_on(self, url: str) -> float:
        return sum(p.flops.get(url, 0.0) for p in self.peers.values())

    def describe(self) -> dict[str, dict]:
        now = self.clock()
        return {r: {"synced": p.seq >= 0, "last_seen_s": round(now - p.last_seen, 3), "promises": len(p.promises),
                    "inflight_flops": sum(p.flops.values()), "queued": p.queued} for r, p in self.peers.items()}

    # -- internals -----------------------------------------------------------------------------
    def _peer(self, replica: str) -> PeerState:
        peer = self.peers.get(replica)
        if peer is None:
            peer = self.peers[replica] = PeerState()
            log.info("replica %s heard", replica)
        peer.last_seen = self.clock()
        return peer

    def _promise(self, peer: PeerState, p: Promised) -> None:
        if p.serial in peer.promises:
            return
        slot = self.slot_of(p.worker, p.dp_rank)
        if slot is None:
            self.stats.promises_unknown_worker += 1
            peer.unresolved[p.serial] = (p.worker, p.dp_rank)
        else:
            self.index.promise(slot, p.keys)
            self.stats.promises_applied += 1
        peer.promises[p.serial] = (slot, p.keys)

    def _retire(self, peer: PeerState, serial: int) -> None:
        if peer.unresolved.pop(serial, None) is not None:
            self.stats.promises_unknown_worker -= 1
        entry = peer.promises.pop(serial, None)
        if entry is not None and entry[0] is not None:
            self.index.retire(entry[0], entry[1])  # None: the worker left this router meanwhile

    def _load(self, peer: PeerState, load: Load) -> None:
        changed = set(peer.flops) | set(load.flops)
        peer.flops = dict(load.flops)
        peer.queued = load.queued
        for url in changed:
            self._install(url)

    def _install(self, url: str) -> None:
        self.set_peer_load(url, self.flops_on(url))
