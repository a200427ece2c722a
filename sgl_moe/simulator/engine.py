"""One simulated worker: SGLang's prefill loop reduced to what decides time and cache reuse.

Model (stated here once; the README and the report refer to it):

* **Queue**: requests the router dispatched wait in FIFO order (SGLang's ``fcfs`` policy).
* **Steps**: a forward pass takes requests from the head of the queue while its token budget
  (``step_tokens``, the chunked-prefill size) lasts; a request that does not fit is chunked and
  finishes in later steps, one chunked request at a time, as SGLang does. Prefill-only requests
  finish at the end of the step that computes their last token.
* **Cache reuse**: when a request enters a step, its cached tokens are the longest prefix of full
  pages in this worker's cache at that moment, at most ``(tokens - 1)`` floored to a page (the last
  token is always computed); those pages are locked until it finishes. Two requests with the same
  prefix in one step both compute it (the radix cache only knows finished pages).
* **Memory**: a request reserves pages for the tokens it computes; computed full pages enter the
  cache at the end of each step (so a chunked document is reusable before it finishes), the rest
  is freed when it finishes. Room is made by evicting unlocked pages, least recently used first.
  A request that cannot get room waits (unless the worker is idle: then it over-commits; a worker whose
  finished requests are still to be processed is not idle).
* **Time**: ``Calibration``'s linear model per step; with weight transfers to hide, a step lasts at
  least the transfer of one forward pass. On a shared CPU a step is slowed by the number of busy
  workers beyond ``shared_compute`` at the moment it starts.
* **Results**: a finished request's pages enter the tree, its memory is freed and its answer leaves
  when the step's results are processed: at the end of the step, or, with SGLang's overlap scheduler
  (``Calibration.overlap``) and requests waiting, only after the next step has been admitted (``async``:
  then at once; ``sync``: after that step has computed too).
* **Events**: evictions are published when the step starts, stored pages when they enter the tree; the
  frontend delivers them to the router after the calibration's event delay.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from sgl_moe.simulator.kv_cache import new_kv_cache
from sgl_moe.simulator.timeline import Timeline
from sgl_moe.simulator.timing_model import Calibration
from sgl_moe.simulator.units import SimUnit


class EngineSink(Protocol):
    """Where an engine reports: the frontend (router model) and, through it, the client."""

    def finished(self, units: list[SimUnit]) -> None:
        """The requests one step completed, together (as one SGLang batch's answers reach the router)."""

    def kv_events(self, engine: Engine, removed: list[int], stored: list[int]) -> None: ...


class SharedCompute:
    """Busy engines on one machine (only counted when the calibration says they share it)."""

    def __init__(self, capacity: float | None) -> None:
        self.capacity = capacity
        self.busy = 0


class EngineStats:
    __slots__ = ("steps", "busy_s", "computed_tokens", "transfer_bound_steps", "units", "overcommits")

    def __init__(self) -> None:
        self.steps = 0
        self.busy_s = 0.0
        self.computed_tokens = 0
        self.transfer_bound_steps = 0
        self.units = 0
        self.overcommits = 0


class Engine:
    """One worker's queue, batches, KV cache and clock; see the module docstring for the model."""

    def __init__(self, wid: str, cal: Calibration, transfer_s: float, timeline: Timeline, sink: EngineSink,
                 shared: SharedCompute) -> None:
        self.id = wid
        self.cal = cal
        self.transfer_s = transfer_s
        self.timeline = timeline
        self.sink = sink
        self.shared = shared
        self.page = cal.page_size
        self.cache = new_kv_cache(max(1, cal.cache_tokens // cal.page_size))
        self.waiting: deque[SimUnit] = deque()
        self.chunked: SimUnit | None = None
        self.busy = False
        self.stats = EngineStats()
        self._batch: list[tuple[SimUnit, int]] = []
        self._shared_busy = shared.capacity is not None
        self._deferred: list[SimUnit] = []
        """``sync`` overlap: the previous step's finished requests, processed after the running step."""
        self._settling = False
        """Finished requests await processing (overlap): a request that does not fit waits for their memory,
        as SGLang's scheduler forms no batch then and processes the results first, instead of running alone
        before their prefixes enter the tree."""

    def submit(self, unit: SimUnit) -> None:
        unit.engine = self
        self.waiting.append(unit)
        if not self.busy:
            self._start_step()

    def _start_step(self) -> None:
        cal, cache, page = self.cal, self.cache, self.page
        now = self.timeline.now
        budget = cal.step_tokens
        batch = self._batch
        token_s, pair_s, ctx_s = cal.token_s, cal.pair_s, cal.context_token_s
        compute = cal.step_s
        u = self.chunked
        if u is not None:
            s = min(u.tokens - u.done, budget)
            p = u.done
            compute += token_s * s + pair_s * (s * p + s * (s + 1) / 2) + ctx_s * (p + s)
            batch.append((u, s))
            budget -= s
            if u.done + s >= u.tokens:
                self.chunked = None
        waiting = self.waiting
        while budget > 0 and waiting and self.chunked is None:
            u = waiting[0]
            hashes = u.hashes
            n = u.tokens
            # The cached prefix (``match``, at most the full pages before the last token), locked before making
            # room: eviction must not take the prefix it reuses.
            blocks = cache.match_lock(hashes, (n - 1) // page)
            cached = blocks * page
            need = n - cached
            pages = -(-need // page)
            if not cache.reserve(pages):
                if batch or self._settling:
                    cache.unlock(hashes[:blocks])
                    break  # memory is held by running requests (or finished ones not yet processed): wait
                cache.reserved += pages  # alone and still too big: run it anyway
                self.stats.overcommits += 1
            waiting.popleft()
            u.cached = u.done = cached
            u.inserted = blocks
            u.reserved = pages
            u.started = now
            s = need if need < budget else budget
            compute += cal.request_s + token_s * s + pair_s * (s * cached + s * (s + 1) / 2) + ctx_s * (cached + s)
            batch.append((u, s))
            budget -= s
            if s < need:
                self.chunked = u
        if not batch:
            return
        if cache.removed:
            self.sink.kv_events(self, *cache.take_events())
        shared = self.shared
        if self._shared_busy:
            shared.busy += 1
            if shared.busy > shared.capacity:
                compute *= shared.busy / shared.capacity
        duration = compute
        if self.transfer_s > compute:
            duration = self.transfer_s
            self.stats.transfer_bound_steps += 1
        self.busy = True
        self.stats.steps += 1
        self.stats.busy_s += duration
        self.timeline.at(now + duration, self._end_step)

    def _end_step(self, _: object = None) -> None:
        cache, page = self.cache, self.page
        batch, self._batch = self._batch, []
        if self._deferred:  # ``sync``: the previous step's results come after this step's compute
            deferred, self._deferred = self._deferred, []
            self._settle(deferred)
        finished = []
        computed = 0
        for u, s in batch:
            done = u.done = u.done + s
            computed += s
            if done >= u.tokens:
                finished.append(u)
                continue
            hashes = u.hashes
            full = min(done // page, len(hashes))
            if full > u.inserted:  # a chunked request: its computed full pages enter the tree
                cache.insert(hashes[u.inserted:full])
                moved = full - u.inserted
                cache.reserved -= moved  # reserved pages became tree pages (or were freed as duplicates)
                u.reserved -= moved
                u.inserted = full
        self.stats.computed_tokens += computed
        if self._shared_busy:
            self.shared.busy -= 1
        launched = False
        overlap = self.cal.overlap
        if finished and overlap != "off" and (self.waiting or self.chunked is not None):
            # SGLang's overlap loop: the next batch is admitted while these still hold their memory and pages.
            self.busy = False
            self._settling = True
            self._start_step()
            self._settling = False
            launched = self.busy
            if overlap == "sync" and launched:
                self._deferred = finished
                return
        self.busy = True  # new work the answers bring waits for the step started below (or running)
        if finished:
            self._settle(finished)
        elif cache.stored or cache.removed:
            self.sink.kv_events(self, *cache.take_events())
        self.busy = launched
        if not launched and (self.waiting or self.chunked is not None):
            self._start_step()

    def _settle(self, finished: list[SimUnit]) -> None:
        """Process finished requests: their new pages enter the tree, all their pages are unlocked (their
        reserved pages became tree pages, were freed as duplicates, or are given back), their answers leave."""
        cache, page = self.cache, self.page
        now = self.timeline.now
        for u in finished:
            cache.reserved -= u.reserved
            u.reserved = 0
            full = min(u.tokens // page, len(u.hashes))
            cache.finish(u.hashes, u.inserted, full)
            u.inserted = full
            u.finished = now
        self.stats.units += len(finished)
        if cache.stored or cache.removed:
            self.sink.kv_events(self, *cache.take_events())
        self.sink.finished(finished)
