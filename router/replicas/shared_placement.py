"""One placement owner for every router replica (``--replica-placement owner``, the default with ``--peers``).

Sharing tables (``peer_tables``) tells each replica what the others promised and hold in flight, but each still
decides alone within a message delay of the others: every replica picks the same least-loaded worker at once
(herding), and the queue is split N ways (measured in the simulator: 2 replicas lost a third of one router's
reuse). So one replica places for all, as the placement owner of ``--front-processes`` does for its fronts: the
others parse, tokenize and hash their requests, send the owner a ``Place`` (the fronts' own message, through the
broker: ``messages.Requests``), forward the request to the worker it answers with, and send ``Release`` when it
ends. Placement then sees one set of tables, one Θ admission and one FIFO queue, whichever replica took the
request.

The owner is the replica up longest (``Snapshot.since``, then name), among those this replica has a snapshot of:
every replica computes the same one, and a replica that joins late never takes it over. While this replica knows
no owner but itself (alone, the broker away), or when the owner goes away (its heartbeat stops, it says ``Bye``,
or the broker is lost), requests waiting for it fail over to this replica's own scheduler, which places on the
tables it shares with the others (``peer_tables``) until the next owner answers. A replica that says ``Hello``
again (restarted, or back after a broker outage) has its placements at the owner released, and the requests
waiting for it, if it was the owner, fail over.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

from sgl_moe.router.front.placement_client import OwnerGone, PlacementClient
from sgl_moe.router.placement.job import Job, Placement
from sgl_moe.router.placement.messages import Delegate, Placed, Refused
from sgl_moe.router.placement.owner import FrontSession, PlacementOwner
from sgl_moe.router.replicas.messages import VERSION, Answers, Requests

log = logging.getLogger("sgl_moe.router.replicas")

MAX_REMOTE_KEYS = 50_000
"""A request with more block hashes than this (800k tokens at 16 per page; ~450 KB) is placed here: one broker
message carries at most 1 MB by default."""


class Refusal(Exception):
    """The owner refused a request (queue full, queue timeout, no workers, a poison request)."""

    def __init__(self, refused: Refused) -> None:
        super().__init__(refused.message)
        self.refused = refused


class _Outbox:
    """Messages to one other replica, sent together once per turn of the event loop as ``Requests`` or
    ``Answers``."""

    def __init__(self, send: Callable[[str, Any], None], to: str, sender: str, kind: type) -> None:
        self.send, self.to, self.sender, self.kind = send, to, sender, kind
        self.items: list[Any] = []

    def put(self, message: Any) -> None:
        if not self.items:
            asyncio.get_running_loop().call_soon(self.flush)
        self.items.append(message)

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            self.send(self.to, self.kind(VERSION, self.sender, items))


class SharedPlacement:
    def __init__(self, *, name: str, since: float, owner: PlacementOwner, send: Callable[[str, Any], None],
                 peers_since: Callable[[], dict[str, float]], connected: Callable[[], bool],
                 answer_timeout_s: float) -> None:
        self.name = name
        self.since = since
        self.owner = owner
        """This router's placement hooks, for the requests other replicas send it when it owns placement."""
        self.send = send
        """(replica name, message): publish on that replica's own subject."""
        self.peers_since = peers_since
        """Live peers -> when each started (inf: no snapshot yet)."""
        self.connected = connected
        """Whether the broker is reachable now (while it is not, requests are placed here)."""
        self.answer_timeout_s = answer_timeout_s
        """A request the owner has not answered this long fails over (a message lost: the broker delivers at most
        once); longer than the owner's own queue timeout, so only a lost message reaches it."""
        self.sessions: dict[str, FrontSession] = {}
        """Other replicas' requests this router placed (it owns placement), by replica."""
        self.clients: dict[str, PlacementClient] = {}
        """The owners this replica sent requests to, by name (more than one only across a change of owner)."""
        self.remote_placed = 0
        """Requests of this replica another replica placed."""
        self.failovers = 0
        """Requests placed here because the owner went away while they waited."""

    def owner_name(self) -> str:
        """The replica that places for all: the one up longest (then by name) among this one and the peers heard
        with a snapshot."""
        best = (self.since, self.name)
        for name, since in self.peers_since().items():
            if math.isfinite(since) and (since, name) < best:
                best = (since, name)
        return best[1]

    def describe(self) -> dict[str, Any]:
        return {"owner": self.owner_name(), "placing_for": sorted(self.sessions),
                "remote_placed": self.remote_placed, "failovers": self.failovers}

    # -- this replica's requests ---------------------------------------------------------------------
    async def acquire(self, job: Job, fingerprint: bytes, worker_at: Callable[[str], Any],
                      local: Callable[[Job], Any]) -> Placement:
        """Placed by the owner (``local(job)``, the own scheduler's acquire, when this replica owns placement or
        the owner is gone). Raises ``Refusal`` for the owner's refusal. The ``Place`` is sent before the first
        await, so requests reach the owner in the order they were placed here."""
        owner = self.owner_name()
        if (owner == self.name or not self.connected() or job.exclude
                or sum(map(len, job.keys)) > MAX_REMOTE_KEYS):
            return await local(job)  # the broker away, a retry's excluded worker, or a prompt too long for it
        client = self._client(owner)
        try:
            req, answer = await client.place(job.rid, job.prompt_lens, job.keys, job.shared_prefix_len,
                                             job.max_new_tokens, fingerprint, timeout_s=self.answer_timeout_s)
        except OwnerGone:
            self.failovers += 1
            return await local(job)
        if isinstance(answer, Refused):
            raise Refusal(answer)
        if isinstance(answer, Delegate):  # the owner holds it for a suspect: placed here (alone only if this
            # replica's own suspects list says so; the owner's list is not shared)
            return await local(job)
        assert isinstance(answer, Placed)
        worker = worker_at(answer.worker_url)
        if worker is None:  # a worker this replica does not have (it joined the owner first)
            client.release(req, False)
            return await local(job)
        self.remote_placed += 1
        return Placement(job, worker, -1, 0, 0.0, answer.predicted_cached_tokens, 0, answer.reason, answer.queued_s,
                         answer.decision_s, settle=lambda ok, c=client, r=req: c.release(r, ok))

    def _client(self, owner: str) -> PlacementClient:
        client = self.clients.get(owner)
        if client is None or client.lost:
            client = PlacementClient(0, lambda _model: None, lambda o=owner: self._lost(o))
            client.attach(_Outbox(self.send, owner, self.name, Requests))
            self.clients[owner] = client
            log.info("replica %s places through the owner %s", self.name, owner)
        return client

    def _lost(self, owner: str) -> None:
        log.warning("placement owner %s gone; requests waiting for it are placed here", owner)

    # -- messages from the broker ---------------------------------------------------------------------
    def on_requests(self, replica: str, items: list[Any]) -> None:
        """Another replica's requests: this router places them (even while it does not think itself the owner:
        the sender does, and a request is never left unanswered)."""
        session = self.sessions.get(replica)
        if session is None:
            session = self.sessions[replica] = self.owner.session(
                _Outbox(self.send, replica, self.name, Answers), f"replica {replica}")
            log.info("placing for replica %s", replica)
        for item in items:
            session.handle(item)

    def on_answers(self, replica: str, items: list[Any]) -> None:
        client = self.clients.get(replica)
        if client is not None:
            for item in items:
                client.deliver(item)

    def peer_gone(self, replica: str, why: str) -> None:
        """A peer expired or stopped: release what it held here; requests waiting for it (the owner) fail over."""
        session = self.sessions.pop(replica, None)
        if session is not None:
            session.close(why)
        client = self.clients.pop(replica, None)
        if client is not None:
            client.lose()

    def peer_restarted(self, replica: str) -> None:
        """A peer said ``Hello`` on joining (started, restarted under the same name, or reconnected after a broker
        outage): what it held here is stale, and what this replica waits for from it will not come (a restarted
        owner knows nothing of it): those requests fail over."""
        session = self.sessions.pop(replica, None)
        if session is not None:
            session.close("said Hello again (restarted or reconnected)")
        client = self.clients.pop(replica, None)
        if client is not None:
            client.lose()

    def broker_lost(self) -> None:
        """This replica lost the broker (or is back: what was sent meanwhile was dropped): nothing it waits for
        will be answered."""
        for client in self.clients.values():
            client.lose()
        self.clients.clear()
