"""The routable workers ordered by in-flight FLOPs, so placement need not score every worker.

A request that matches a prefix on a few workers is scored against those few plus the least-loaded
admissible worker of the rest; every unmatched worker would get the same cost, so only its load can
make it win. ``LoadOrder`` finds such workers without scanning the pool: it keeps ``(in-flight
FLOPs, id, worker)`` sorted and is told by the scheduler whenever a reservation moves a worker.

Invariants: a worker's ``inflight_flops`` changes only through the scheduler's reserve/release, which
call ``moved``; ``slots`` of a worker never change while it is in the pool, and ``theta`` and the cost model
only through the pool's installs (``WorkerPool.installs`` counts them), after which the scheduler builds a new
view (``built_after``).
A view is built for one list of routable workers (``key``) and rebuilt when that list changes. The
scheduler uses it only when it is ``uniform`` (one Θ and one FLOPs model), where every ordering the
policies use is monotone in in-flight FLOPs alone.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from operator import itemgetter

from sgl_moe.router.membership.worker import Worker

_inflight = itemgetter(0)
_load_and_id = itemgetter(0, 1)

DIRECT_GROUP = 16
"""A group of at most this many workers is searched directly rather than along the load order."""
GROUPS_KEPT = 4096
"""Groups (slot masks) whose workers a view remembers (forgotten all at once when full)."""


class LoadOrder:
    """Routable workers sorted by in-flight FLOPs, with their slots (one view of one routable list)."""

    def __init__(self, workers: list[Worker], installs: int) -> None:
        self.key: tuple[Worker, ...] = tuple(workers)
        """The routable list this view was built for; an equal tuple means the view is still valid."""
        first = workers[0] if workers else None
        self.uniform = first is not None and all(w.theta == first.theta and w.cost_model == first.cost_model
                                                 for w in workers)
        """One Θ and one cost model (FLOPs model, request overhead) for every worker: the precondition of every
        query below."""
        self.built_after = installs
        """The pool's ``installs`` when built: a later install may have changed a Θ or a cost model."""
        self.single_slot = all(len(w.slots) == 1 for w in workers)
        """No worker has several attention-DP ranks."""
        self.theta: float = first.theta if first else 0.0
        self.mask = 0
        """Bitmask of every slot of every worker in the view (the argument of ``BlockIndex.match``)."""
        self.owner: dict[int, Worker] = {}
        """Slot -> worker."""
        self.bits: dict[str, int] = {}
        """Worker id -> bitmask of its slots."""
        for w in workers:
            bits = 0
            for slot in w.slots.values():
                bits |= 1 << slot
                self.owner[slot] = w
            self.bits[w.id] = bits
            self.mask |= bits
        self.members = {w.id: w for w in workers}
        self.stale = False
        """A worker's in-flight FLOPs moved without going through ``moved``: rebuild the view."""
        self._entries: list[tuple[float, str, Worker]] = sorted((w.inflight_flops, w.id, w) for w in workers)
        self._groups: dict[int, tuple[Worker, ...]] = {}
        """Slot mask -> its workers (``best_in``'s groups, remembered: the view's slots never change)."""

    def moved(self, w: Worker, before: float) -> None:
        """``w.inflight_flops`` changed from ``before``: re-sort its entry."""
        if self.members.get(w.id) is not w:
            return
        entries = self._entries
        wid = w.id
        i = bisect_left(entries, (before, wid))
        if i == len(entries) or entries[i][2] is not w:
            self.stale = True
            return
        del entries[i]
        entry = (w.inflight_flops, wid, w)
        # The entry moves only one way: search only that side of where it was.
        if entry < (before, wid):
            insort(entries, entry, 0, i)
        else:
            insort(entries, entry, i)

    def any_admissible(self) -> bool:
        """Some worker of the view is below Θ (one Θ for all: then the least-loaded one is)."""
        return bool(self._entries) and self._entries[0][2].admissible

    def least(self, value: Callable[[float], float], *, highest_id: bool, skip: int = 0, within: int = -1,
              admissible: bool = True) -> Worker | None:
        """The worker with the smallest ``value(inflight_flops)``; ties go to the lowest id (or the highest).

        Only workers with a slot in ``within`` and none in ``skip`` count, and with ``admissible`` only
        those below Θ. ``value`` must never decrease as in-flight FLOPs grow, so tied workers form a
        prefix of the order; a run of equal in-flight FLOPs is ordered by id and searched from one end.
        """
        entries, bits = self._entries, self.bits
        n = len(entries)
        theta = self.theta
        i = 0
        best: Worker | None = None
        best_value = 0.0
        while i < n:
            x, wid, w = entries[i]
            if admissible and x >= theta:
                break  # one Θ: nobody from here on is admissible
            v = value(x)
            if best is not None and v != best_value:
                break  # values only grow along the order: no later run ties
            j = i + 1
            if j < n and entries[j][0] == x:
                j = bisect_right(entries, x, lo=j, key=_inflight)
            else:  # a run of one (the common case)
                b = bits[wid]
                if b & within and not b & skip and (not admissible or w.admissible):
                    if best is None or (wid > best.id if highest_id else wid < best.id):
                        best, best_value = w, v
                i = j
                continue
            for k in (range(j - 1, i - 1, -1) if highest_id else range(i, j)):
                w = entries[k][2]
                b = bits[w.id]
                if b & within and not b & skip and (not admissible or w.admissible):
                    if best is None or (w.id > best.id if highest_id else w.id < best.id):
                        best, best_value = w, v
                    break
            i = j
        return best

    def least_in_turn(self, after: str | None, skip: int = 0) -> Worker | None:
        """The admissible worker of least in-flight FLOPs among those with no slot in ``skip``; among equally
        loaded ones, the first whose id follows ``after`` (wrapping), so that successive picks among ties take
        turns."""
        entries, bits = self._entries, self.bits
        n = len(entries)
        i = 0
        theta = self.theta
        while i < n:  # the first run of equal loads holding a worker that counts
            x, wid, w = entries[i]
            if x >= theta:
                return None  # one Θ: nobody from here on is admissible
            end = i + 1
            if end == n or entries[end][0] != x:  # a run of one (the common case)
                if not bits[wid] & skip and w.admissible:
                    return w
                i = end
                continue
            end = bisect_right(entries, x, lo=end, key=_inflight)
            run = [e[2] for e in entries[i:end] if not bits[e[2].id] & skip and e[2].admissible]
            if run:
                if after is not None:
                    for w in run:  # ordered by id
                        if w.id > after:
                            return w
                return run[0]
            i = end
        return None

    def best_in(self, mask: int, *, admissible: bool) -> Worker | None:
        """Among the workers with a slot in ``mask`` (and below Θ with ``admissible``): the lowest load,
        ties to the highest id; the order of the longest-match rank within one group of equal matches."""
        if mask.bit_count() > DIRECT_GROUP:
            theta = self.theta
            return self.least(lambda x: x / theta, highest_id=True, within=mask, admissible=admissible)
        if not mask & (mask - 1):  # one slot (or none): no comparison to make
            if not mask:
                return None
            w = self.owner[mask.bit_length() - 1]
            return w if not admissible or w.admissible else None
        group = self._groups.get(mask)
        if group is None:
            group = self._group(mask)
        if admissible:
            group = [w for w in group if w.admissible]
            if not group:
                return None
        # ``max`` by (-load, id): the lowest load, equal loads to the highest id (negating a float is exact, so
        # ``-a > -b`` is ``a < b``; ids differ, so there are no ties).
        loads = [w.inflight_flops / w.theta for w in group]
        lowest = min(loads)
        i = loads.index(lowest)
        best = group[i]
        if loads.count(lowest) > 1:
            for j in range(i + 1, len(group)):
                if loads[j] == lowest and group[j].id > best.id:
                    best = group[j]
        return best

    def _group(self, mask: int) -> tuple[Worker, ...]:
        """The workers with a slot in ``mask``, in slot order (remembered per mask: a group recurs)."""
        groups = self._groups
        if len(groups) >= GROUPS_KEPT:
            groups.clear()
        owner = self.owner
        found = []
        m = mask
        while m:
            low = m & -m
            found.append(owner[low.bit_length() - 1])
            m ^= low
        group = groups[mask] = tuple(found)
        return group
