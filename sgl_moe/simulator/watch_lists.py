"""What breaks a certificate: per-worker watch lists that the memo's reservation and release hooks fire.

A certificate (``certificate.Certificate``) is registered here by ``certify`` under each event that could
change its job's answer; ``reserved``, ``released``, ``touched`` and ``expire`` break (``dirty``) the ones
an event reaches and drop them from that list. A list entry whose certificate is no longer clean is dead
weight, dropped when the list is next walked (``collect`` drops those of the heaps once they pile up).

Two events do not break a certificate outright. A job held for blocks promised on its best worker
(``Certificate.needs_room``) is held again, unchanged, once that worker has room again. While the worker is
saturated the job is only put back among those the next pass visits (``Certificate.revisit``); the memo
scores it there if the worker is still saturated when the pass reaches it, and skips it otherwise. A
waiting job's rule-5 threshold crossed by a release (``Certificate.spill_due``) is checked again when a
pass reaches the job (``memo``).
"""

from __future__ import annotations

import heapq
import itertools

from sgl_moe.router.membership.worker import Worker
from sgl_moe.simulator.certificate import Certificate

COLLECT_AT = 65536
"""Heap size at which certificates that no longer hold are dropped from it."""
ROOM_SLACK = 1e-9
"""Relative slack on Θ tests (rounding): breaking one certificate too many only costs a scoring."""


class WatchLists:
    """Certificates by the event that breaks them (slot -> list, or a heap by threshold or time)."""

    def __init__(self) -> None:
        self.on_index: dict[int, list[Certificate]] = {}
        """Slot -> certificates broken by any change to that target's tables."""
        self.on_load: dict[int, list[Certificate]] = {}
        """Slot -> certificates broken by any change to that worker's in-flight FLOPs."""
        self.on_release: dict[int, list[Certificate]] = {}
        """Slot -> certificates broken when that worker's in-flight FLOPs drop."""
        self.on_room: dict[int, list[Certificate]] = {}
        """Slot -> certificates broken when that worker (saturated) gets below Θ."""
        self.on_hold_end: dict[int, list[tuple[Certificate, float]]] = {}
        """Slot -> (certificate of a job held there, FLOPs of computing its promised blocks again): broken
        when that worker gets light enough for the duplicate to stay below Θ (the hold ends)."""
        self.on_heavier: dict[int, list[tuple[Certificate, tuple[Worker, ...]]]] = {}
        """Slot -> (certificate, the other workers matching as deep): broken when that worker, the
        certificate's best, gets as heavy as one of the others, or reaches Θ (a held job's certificate is
        then only revisited: ``needs_room``)."""
        self.on_lighter: dict[int, list[tuple[Certificate, Worker]]] = {}
        """Slot -> (certificate, its best worker): broken when that worker gets as light as the best."""
        self.rule5: list[tuple[float, int, Certificate]] = []
        """Rule-5 certificates by descending threshold (negated, for the heap): broken when any worker gets
        lighter than the threshold."""
        self.expiry: list[tuple[float, int, Certificate]] = []
        """Certificates by the time a time limit they went through can flip."""
        self._seq = itertools.count()

    # -- registering ----------------------------------------------------------------------------
    def add(self, lists: dict[int, list], slot: int, entry: object) -> None:
        lists.setdefault(slot, []).append(entry)

    def add_mask(self, lists: dict[int, list[Certificate]], mask: int, c: Certificate) -> None:
        """Register ``c`` under every slot of ``mask``."""
        while mask:
            low = mask & -mask
            lists.setdefault(low.bit_length() - 1, []).append(c)
            mask ^= low

    def add_rule5(self, c: Certificate, threshold: float) -> None:
        heapq.heappush(self.rule5, (-threshold, next(self._seq), c))

    def add_expiry(self, c: Certificate, expires: float) -> None:
        heapq.heappush(self.expiry, (expires, next(self._seq), c))

    # -- events ---------------------------------------------------------------------------------
    def touched(self, slot: int) -> None:
        """A table of ``slot`` gained or lost blocks."""
        on_index = self.on_index
        if on_index:
            certs = on_index.pop(slot, None)
            if certs:
                for c in certs:
                    c.dirty()

    def expire(self, now: float) -> None:
        expiry = self.expiry
        while expiry and expiry[0][0] <= now:
            heapq.heappop(expiry)[2].dirty()

    def reserved(self, w: Worker) -> None:
        """A reservation on ``w`` (its in-flight FLOPs grew)."""
        full = not w.admissible
        load = w.inflight_flops
        on_load, on_heavier = self.on_load, self.on_heavier
        for slot in w.slots.values():
            if on_load:
                certs = on_load.pop(slot, None)
                if certs:
                    for c in certs:
                        c.dirty()
            watching = on_heavier.get(slot)
            if watching:  # jobs for which this worker may no longer be the lightest deepest match, or has no room
                keep = []
                for cert, others in watching:
                    if not cert.clean:
                        continue
                    if others and any(o.inflight_flops <= load for o in others):
                        cert.dirty()  # another worker matching as deep may now be the best
                    elif full:
                        if cert.needs_room is w:
                            cert.revisit_held()  # scored only if a pass reaches it while ``w`` is still saturated
                            keep.append((cert, others))
                        else:
                            cert.dirty()
                    else:
                        keep.append((cert, others))
                self.on_heavier[slot] = keep

    def released(self, w: Worker, after: float) -> None:
        """A request of ``w`` ends: its in-flight FLOPs drop to ``after``."""
        limit = w.theta * (1 + ROOM_SLACK) + 1.0
        on_load, on_release, on_room = self.on_load, self.on_release, self.on_room
        for slot in w.slots.values():
            if on_load:
                certs = on_load.pop(slot, None)
                if certs:
                    for c in certs:
                        c.dirty()
            if on_release:
                certs = on_release.pop(slot, None)
                if certs:
                    for c in certs:
                        c.dirty()
            room = on_room.get(slot)
            if room:
                if after < limit:
                    del on_room[slot]
                    for c in room:
                        c.dirty()
                else:
                    on_room[slot] = [c for c in room if c.clean]
            held = self.on_hold_end.get(slot)
            if held:  # jobs held there: the router's test, ``inflight + duplicate <= Θ`` ends the hold
                keep = []
                for c, dup in held:
                    if c.clean:
                        if after + dup <= limit:
                            c.dirty()
                        else:
                            keep.append((c, dup))
                self.on_hold_end[slot] = keep
            watching = self.on_lighter.get(slot)
            if watching:  # held jobs whose best may now be this worker instead
                keep = []
                for entry in watching:
                    c = entry[0]
                    if c.clean:
                        if after <= entry[1].inflight_flops:
                            c.dirty()
                        else:
                            keep.append(entry)
                self.on_lighter[slot] = keep
        rule5 = self.rule5
        # Rule 5: jobs for which this worker, now lighter, may be worth spilling to (``Certificate.spill_due``;
        # the memo checks again when a pass reaches the job, and re-arms the certificate if no spill is due).
        while rule5 and -rule5[0][0] > after * (1 - ROOM_SLACK) - 1.0:
            c = heapq.heappop(rule5)[2]
            if c.clean and not c.spill_due:
                c.spill_due = True
                c.revisit()

    def collect(self) -> None:
        """Drop certificates that no longer hold from the heaps once they pile up."""
        if len(self.rule5) > COLLECT_AT:
            self.rule5 = [e for e in self.rule5 if e[2].clean]
            heapq.heapify(self.rule5)
        if len(self.expiry) > COLLECT_AT:
            self.expiry = [e for e in self.expiry if e[2].clean]
            heapq.heapify(self.expiry)
