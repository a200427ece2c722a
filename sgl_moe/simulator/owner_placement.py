"""Router replicas with one placement owner (``SimConfig.replica_placement="owner"``, the router's
``--replica-placement owner``, its default with ``--peers``): one replica, the owner, places every replica's requests
with its own scheduler (one queue, one Θ admission, one set of tables); the others only forward (the router's
``router/replicas/shared_placement.py``).

Here the owner is one ``RouterFrontend`` and the other replicas are only the message delays between them and it;
requests are spread round-robin over the replicas (replica 0 is the owner), as in ``replica_frontends``. A request
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

from sgl_moe.simulator.engine import Engine
from sgl_moe.simulator.router_frontend import RouterFrontend
from sgl_moe.simulator.timeline import Timeline
from sgl_moe.simulator.units import SimUnit


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
