"""The workers that may have room, kept as reservations and releases happen, for round robin's turn.

``PlacementPolicy.next_round_robin(job, workers)`` takes the next worker in turn among
``[w for w in workers if w.admissible]``: with 256 workers, building that list is a third of a round-robin
placement. ``RoomList`` keeps a superset of the admissible workers in pool order (a worker joins it when
one of its requests ends, and leaves it when a reservation finds it saturated), and hands the policy that
superset instead of the whole pool: the policy filters it the same way, so the list it builds, and the
worker it picks with its own turn counter, are the same.
"""

from __future__ import annotations

from bisect import insort

from sgl_moe.router.job import Job
from sgl_moe.router.policy import PlacementPolicy
from sgl_moe.router.worker import Worker


class RoomList:
    """Pool-ordered superset of the admissible workers of one routable list (``workers``)."""

    def __init__(self, policy: PlacementPolicy, workers: list[Worker]) -> None:
        self.workers = workers
        """The routable list (``SimPool.routable()``; never changes in a simulation)."""
        self._policy = policy
        self._position = {w.id: i for i, w in enumerate(workers)}
        self._maybe: list[int] = list(range(len(workers)))
        """Positions in ``workers`` of every worker that may be below Θ, ascending."""
        self._members = set(self._maybe)

    def released(self, worker: Worker) -> None:
        """A request of ``worker`` ends: it may have room."""
        i = self._position.get(worker.id)
        if i is not None and i not in self._members:
            self._members.add(i)
            insort(self._maybe, i)

    def reserved(self, worker: Worker) -> None:
        """A reservation on ``worker``: it leaves the list once saturated."""
        i = self._position.get(worker.id)
        if i is not None and i in self._members and not worker.admissible:
            self._members.discard(i)
            self._maybe.remove(i)

    def next_round_robin(self, job: Job, workers: list[Worker]) -> Worker | None:
        """``PlacementPolicy.next_round_robin`` over the superset when asked about the whole routable list."""
        if workers is self.workers:
            workers = [self.workers[i] for i in self._maybe]
        return PlacementPolicy.next_round_robin(self._policy, job, workers)
