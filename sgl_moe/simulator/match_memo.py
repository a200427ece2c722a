"""Remembered block matches (``BlockIndex.match_groups``) of queued jobs, kept until a mutation can move them.

A queued job is matched again at every scoring, and its prompt may be hundreds of blocks long. The answer
lists, per matched depth ``d``, the targets whose leading run of held blocks is exactly ``d`` long
(targets holding not even the first block are in no group). A target's run changes only when it

* gains the block right after its run: ``hashes[d]`` for a group of depth ``d``, ``hashes[0]`` for the
  targets in no group (the *frontier* blocks, a few per answer); or
* loses a block of its run: only a target of some group has one.

So an answer is remembered under its frontier blocks (dropped when any table gains one of them) and with the
slots of its groups (dropped when one of those lost any block since: checked when it is asked again, and only
if some slot lost blocks meanwhile). Both are over-approximations: an answer is never kept past a change, and
sometimes dropped without one (a recomputation costs the scan).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

Groups = list[tuple[int, int]]

MATCH_MEMO = 16384
"""Hash lists whose match is remembered (the memo is emptied when full)."""
MATCH_KEYS = 1 << 20
"""Remembered (frontier block, hash list) dependencies at which the memo is emptied (stale ones pile up)."""


class MatchMemo:
    """``match_groups`` answers by hash list (its ``id``, checked against the list itself) and slot mask."""

    __slots__ = ("_answers", "_frontier", "_keys", "_losses", "_lost_at")

    def __init__(self) -> None:
        self._answers: dict[int, tuple[Sequence[int], int, Groups, int, int]] = {}
        """id(hash list) -> (the list, the slot mask asked, the answer, the slots of its groups, ``_losses`` when
        it was last known to hold)."""
        self._frontier: dict[int, set[int]] = {}
        """Block hash -> ids of the answers that change if a target gains it."""
        self._keys = 0
        self._losses = 0
        """Losses reported so far (a clock)."""
        self._lost_at: dict[int, int] = {}
        """Slot -> ``_losses`` at its last loss."""

    def get(self, hashes: Sequence[int], slots_mask: int) -> Groups | None:
        key = id(hashes)
        hit = self._answers.get(key)
        if hit is None or hit[0] is not hashes or hit[1] != slots_mask:
            return None
        if hit[4] != self._losses and hit[3]:  # some target lost blocks since: one of the groups'?
            lost_at = self._lost_at
            since = hit[4]
            m = hit[3]
            while m:
                low = m & -m
                if lost_at.get(low.bit_length() - 1, -1) > since:
                    del self._answers[key]
                    return None
                m ^= low
            self._answers[key] = hit[:4] + (self._losses,)
        return hit[2]

    def put(self, hashes: Sequence[int], slots_mask: int, groups: Groups) -> None:
        """Remember ``groups``, the answer for ``hashes`` (not empty) and ``slots_mask``."""
        if len(self._answers) >= MATCH_MEMO or self._keys >= MATCH_KEYS:
            self.clear()
        key = id(hashes)
        n = len(hashes)
        frontier = self._frontier
        _register(frontier, hashes[0], key)
        matched = 0
        for depth, mask in groups:
            matched |= mask
            if depth < n:
                _register(frontier, hashes[depth], key)
        self._keys += len(groups) + 1
        self._answers[key] = (hashes, slots_mask, groups, matched, self._losses)

    def gained(self, hashes: Collection[int]) -> None:
        """Some target gained ``hashes``."""
        frontier = self._frontier
        if frontier:
            answers = self._answers
            for h in frontier.keys() & hashes:
                for key in frontier.pop(h):
                    answers.pop(key, None)

    def lost(self, slot: int) -> None:
        """``slot`` lost some blocks."""
        self._losses += 1
        self._lost_at[slot] = self._losses

    def clear(self) -> None:
        self._answers.clear()
        self._frontier.clear()
        self._keys = 0


def _register(lists: dict[int, set[int]], at: int, key: int) -> None:
    keys = lists.get(at)
    if keys is None:
        lists[at] = {key}
    else:
        keys.add(key)
