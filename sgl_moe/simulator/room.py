"""The workers that have room, kept as reservations and releases happen, for round robin's turn.

``PlacementPolicy.next_round_robin(job, workers)`` takes the next worker in turn among
``[w for w in workers if w.admissible]``: with 64 to 256 workers, building that list from the whole pool
is a good part of a round-robin placement. ``RoomList`` keeps the admissible workers in pool order (plus,
within rounding, one whose release left it at Θ: a superset), updated when a reservation finds a worker
saturated and when a release brings one below Θ, and hands the policy that list instead of the whole pool:
the policy filters it the same way, so the list it builds, and the worker it picks with its own turn
counter, are the same.
"""

from __future__ import annotations

from bisect import bisect_left

from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.policy import PlacementPolicy

ROOM_SLACK = 1e-9
"""Relative slack on the release's Θ test: a worker kept one release too long is filtered by the policy."""


class RoomList:
    """Pool-ordered list of the workers of one routable list (``workers``) that may be below Θ."""

    def __init__(self, policy: PlacementPolicy, workers: list[Worker]) -> None:
        self.workers = workers
        """The routable list (``SimPool.routable()``; never changes in a simulation)."""
        self._policy = policy
        self._position = {w.id: i for i, w in enumerate(workers)}
        self._positions: list[int] = list(range(len(workers)))
        """Positions in ``workers`` of every worker that may be below Θ, ascending."""
        self._room: list[Worker] = list(workers)
        """Those workers, in the same order (what the policy is handed)."""

    def released(self, worker: Worker, after: float) -> None:
        """A request of ``worker`` ends, its in-flight FLOPs dropping to ``after``: it may have room."""
        i = self._position.get(worker.id)
        if i is None or after >= worker.theta * (1 + ROOM_SLACK) + 1.0:
            return
        positions = self._positions
        k = bisect_left(positions, i)
        if k == len(positions) or positions[k] != i:
            positions.insert(k, i)
            self._room.insert(k, worker)

    def reserved(self, worker: Worker) -> None:
        """A reservation on ``worker``: it leaves the list once saturated."""
        if worker.admissible:
            return
        i = self._position.get(worker.id)
        if i is None:
            return
        positions = self._positions
        k = bisect_left(positions, i)
        if k < len(positions) and positions[k] == i:
            del positions[k], self._room[k]

    def next_round_robin(self, job: Job, workers: list[Worker]) -> Worker | None:
        """``PlacementPolicy.next_round_robin`` over the list when asked about the whole routable list."""
        if workers is self.workers:
            workers = self._room
        return PlacementPolicy.next_round_robin(self._policy, job, workers)
