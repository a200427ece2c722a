"""Router replicas in the simulation (``SimConfig.replicas``).

``ReplicaFrontends``: each replica places its own requests (``replica_placement="shared"``, or alone with
``replicas_share=False``). N copies of the project's router (``RouterFrontend``, each its own scheduler, tables and
queue) in front of the same engines, requests spread round-robin, each reading every engine's KV events. Sharing
state (``replica_delay_s`` set) is the router's own: every replica's promises, retirements and own in-flight FLOPs
go to the others as the ``replicas.messages`` the router publishes, one batch per replica per instant of the virtual
clock, delivered ``replica_delay_s`` later into each other replica's ``PeerTables``, exactly as the router's
``PeerLink`` folds them in. Without it the replicas run alone, as routers without ``--peers`` do.

It also measures what no replica sees alone: each worker's true load when a request is placed there (every
replica's own in-flight FLOPs summed), the figure the Θ overcommit is judged on.

``OwnerPlacement``: router replicas with one placement owner (``SimConfig.replica_placement="owner"``, the router's
``--replica-placement owner``, its default with ``--peers``): one replica, the owner, places every replica's requests
with its own scheduler (one queue, one Θ admission, one set of tables); the others only forward (the router's
``router/replicas/shared_placement.py``).

Here the owner is one ``RouterFrontend`` and the other replicas are only the message delays between them and it;
requests are spread round-robin over the replicas (replica 0 is the owner), as for ``ReplicaFrontends``. A request
that arrives at replica k != 0 pays, each ``replica_delay_s`` (one message through the broker):

* ``Place``: it reaches the owner's scheduler one delay after the client sent it (its ``Job.arrived`` is then,
  as the owner's ``FrontSession`` stamps it; a refusal of the owner's full queue reaches the client one delay later);
* ``Placed``: its engine receives it one delay after the owner's decision (the owner's reservation counts on the
  worker from the decision on, as in the router);
* ``Release``: the owner releases it one delay after its engine finished it (the client has its answer at once,
  straight from the worker through its replica).

A request of the owner's own pays none. Not modelled: the forward from a replica to its worker and the answer back
(neither is modelled for one router either), the owner's ``Place`` handled one event-loop turn later (a task), the
tables the replicas still share for failover (they place nothing while the owner lives), and the owner's failure.

The true load at placement (``max_true_before``) is the owner's own in-flight FLOPs on the worker: every request is
reserved there from its decision until its release, which covers its time at the engine (it reaches the engine
after the decision and is released after it finished), so the engines never hold more than the owner counts.
"""

from __future__ import annotations

from collections.abc import Callable

from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.job import Placement
from sgl_moe.router.placement.pending import Promise
from sgl_moe.router.replicas.messages import Load, Promised, Retired, Update
from sgl_moe.router.replicas.peer_tables import PeerTables
from sgl_moe.simulator.engine import Engine
from sgl_moe.simulator.router_frontend import RouterFrontend
from sgl_moe.simulator.timeline import Timeline
from sgl_moe.simulator.units import SimUnit


class _Outbox:
    """One replica's messages to the others: collected over one instant, sent as one batch."""

    def __init__(self, owner: ReplicaFrontends, k: int) -> None:
        self.owner, self.k = owner, k
        self.updates: list[Update] = []
        self.load_due = False
        self.due = False
        self.seq = 0

    # PendingLedger's observer
    def promised(self, p: Promise) -> None:
        w = self.owner.replicas[self.k].pool.worker_of_slot(p.slot)
        if w is not None:
            self._put(Promised(p.serial, w.id, 0, list(p.keys)))

    def retired(self, p: Promise) -> None:
        self._put(Retired(p.serial))

    # Scheduler.on_load
    def load_changed(self, _worker: Worker) -> None:
        self.load_due = True
        self._arm()

    def _put(self, update: Update) -> None:
        self.updates.append(update)
        self._arm()

    def _arm(self) -> None:
        if not self.due:
            self.due = True
            self.owner.timeline.at(self.owner.timeline.now, self.flush)

    def flush(self, _: object = None) -> None:
        self.due = False
        updates, self.updates = self.updates, []
        if self.load_due:
            self.load_due = False
            workers = self.owner.replicas[self.k].pool.workers.values()
            updates.append(Load({w.id: (w.inflight_flops - w.peer_flops if w.inflight_requests else 0.0)
                                 for w in workers}, len(self.owner.replicas[self.k].scheduler.queue)))
        if updates:
            self.seq += 1
            self.owner.broadcast(self.k, self.seq, updates)


class ReplicaFrontends:
    def __init__(self, replicas: int, delay_s: float | None, make: Callable[[], RouterFrontend],
                 timeline: Timeline) -> None:
        if replicas < 2:
            raise ValueError("replicas: at least 2 (one router is RouterFrontend itself)")
        self.timeline = timeline
        self.delay_s = delay_s
        self.replicas = [make() for _ in range(replicas)]
        self.theta = self.replicas[0].theta
        self._owner: dict[str, int] = {}
        self._next = 0
        self.messages = 0
        self.max_true_before = 0.0
        """Largest true in-flight FLOPs (all replicas' own summed) a worker had when it was given a request."""
        for r in self.replicas:
            r.on_placed = self._note_true_load
        self.tables: list[PeerTables] = []
        if delay_s is not None:
            for k, r in enumerate(self.replicas):
                out = _Outbox(self, k)
                r.ledger.observer = out
                r.scheduler.on_load = out.load_changed
                self.tables.append(PeerTables(
                    index=r.index, slot_of=lambda wid, rank, r=r: _slot(r, wid, rank),
                    set_peer_load=lambda wid, f, r=r: _set_peer_load(r, wid, f), timeout_s=float("inf"),
                    clock=lambda: timeline.now))
            for j, t in enumerate(self.tables):  # every replica starts synced with every other (empty snapshots)
                for k in range(replicas):
                    if k != j:
                        t.apply_snapshot(f"r{k}", 0, [], Load({}, 0))

    # -- the engines' sink, as RouterFrontend's ------------------------------------------------
    def submit(self, unit: SimUnit) -> bool:
        k = self._next
        self._next = (k + 1) % len(self.replicas)
        self._owner[unit.rid] = k
        if self.replicas[k].submit(unit):
            return True
        del self._owner[unit.rid]
        return False

    def finished(self, units: list[SimUnit]) -> None:
        groups: dict[int, list[SimUnit]] = {}
        for u in units:
            groups.setdefault(self._owner.pop(u.rid), []).append(u)
        for k, group in groups.items():
            self.replicas[k].finished(group)

    def kv_events(self, engine: Engine, removed: list[int], stored: list[int]) -> None:
        for r in self.replicas:
            r.kv_events(engine, removed, stored)

    def expire_promises(self) -> None:
        for r in self.replicas:
            r.expire_promises()

    # -- peers ---------------------------------------------------------------------------------
    def broadcast(self, k: int, seq: int, updates: list[Update]) -> None:
        for j in range(len(self.replicas)):
            if j != k:
                self.messages += 1
                self.timeline.at(self.timeline.now + self.delay_s, self._deliver, (j, k, seq, updates))

    def _deliver(self, arg: tuple[int, int, int, list[Update]]) -> None:
        j, k, seq, updates = arg
        self.tables[j].apply_batch(f"r{k}", seq, updates)
        self.replicas[j].pump_if_due()

    def _note_true_load(self, placement: Placement) -> None:
        wid = placement.worker.id
        true = -placement.cost
        for r in self.replicas:
            w = r.pool.workers[wid]
            if w.inflight_requests:
                true += w.inflight_flops - w.peer_flops
        if true > self.max_true_before:
            self.max_true_before = true


def _slot(r: RouterFrontend, worker_id: str, rank: int) -> int | None:
    w = r.pool.workers.get(worker_id)
    return w.slots.get(rank) if w is not None else None


def _set_peer_load(r: RouterFrontend, worker_id: str, flops: float) -> None:
    w = r.pool.workers.get(worker_id)
    if w is not None and w.peer_flops != flops:
        r.scheduler.set_peer_load(w, flops)


class OwnerPlacement:
    """``replicas`` router replicas placing through one owner; the engines' and the client's frontend."""

    def __init__(self, replicas: int, delay_s: float, owner: RouterFrontend, timeline: Timeline) -> None:
        if replicas < 2:
            raise ValueError("replicas: at least 2 (one router is RouterFrontend itself)")
        self.count = replicas
        self.delay_s = delay_s
        self.owner = owner
        self.timeline = timeline
        self.theta = owner.theta
        self.on_refused: Callable[[SimUnit], None] | None = None
        """Told of a request the owner's full queue refused after its ``Place`` travelled (the client's 429, one
        delay later); a refusal of the owner's own requests is ``submit``'s False, as with one router."""
        self.messages = 0
        """``Place``, ``Placed``, ``Refused`` and ``Release`` messages between the replicas and the owner."""
        self.remote = 0
        """Requests of the other replicas the owner placed."""
        self.refused_late = 0
        self._replica: dict[str, int] = {}
        self._next = 0
        owner.dispatch = self._dispatch

    @property
    def max_true_before(self) -> float:
        return self.owner.max_inflight_before

    # -- the client's and the engines' sink, as RouterFrontend's -----------------------------------
    def submit(self, unit: SimUnit) -> bool:
        k = self._next
        self._next = (k + 1) % self.count
        self._replica[unit.rid] = k
        if k == 0 or not self.delay_s:
            if self.owner.submit(unit):
                return True
            del self._replica[unit.rid]
            return False
        self.messages += 1
        self.timeline.at(self.timeline.now + self.delay_s, self._place, unit)
        return True

    def _place(self, unit: SimUnit) -> None:
        self.remote += 1
        if self.owner.submit(unit, arrived=self.timeline.now):
            return
        del self._replica[unit.rid]
        self.remote -= 1
        self.refused_late += 1
        self.messages += 1
        if self.on_refused is None:
            raise RuntimeError("the owner refused a request and nobody is told")
        self.timeline.at(self.timeline.now + self.delay_s, self.on_refused, unit)

    def _dispatch(self, engine: Engine, unit: SimUnit) -> None:
        if self._replica[unit.rid] == 0 or not self.delay_s:
            engine.submit(unit)
            return
        self.messages += 1
        self.timeline.at(self.timeline.now + self.delay_s, engine.submit, unit)

    def finished(self, units: list[SimUnit]) -> None:
        here: list[SimUnit] = []
        away: dict[int, list[SimUnit]] = {}
        for u in units:
            k = self._replica.pop(u.rid)
            if k == 0 or not self.delay_s:
                here.append(u)
            else:
                away.setdefault(k, []).append(u)
        if here:
            self.owner.finished(here)
        for group in away.values():  # a replica's Releases of one step travel together (its outbox, one loop turn)
            self.messages += len(group)
            self.timeline.at(self.timeline.now + self.delay_s, self.owner.finished, group)

    def kv_events(self, engine: Engine, removed: list[int], stored: list[int]) -> None:
        self.owner.kv_events(engine, removed, stored)

    def expire_promises(self) -> None:
        self.owner.expire_promises()
