"""The simulated request stream: contract-B workload requests as prefill units with their block hashes.

A unit is one atomic prefill the router places (``sgl_moe.workloads.unit_segments``: a classify or
choice task is one unit, a multi task one unit per candidate). Its block hashes are the router's own
``block_hashes`` of the unit's token ids, computed once per context prefix and chained on from there
(``block_hash_chain``), so a document shared by many requests is hashed once.

Token ids: ``real`` uses ``segment_token_ids`` (the shipped tokenizer's ids); ``derived`` (default,
several times faster) gives each generated segment 32-bit ids read from SHAKE-128 of its key, literal
template pieces keep their real ids. Equal keys give equal ids and different keys different pages,
which is all the caches and the router see.
"""

from __future__ import annotations

import array
import sys
from collections import OrderedDict
from collections.abc import Iterator
from hashlib import sha256, shake_128
from typing import Literal

from sgl_moe.workloads import Segment, WorkloadConfig, generate, segment_token_ids, unit_segments

TokenIds = Literal["derived", "real"]

MEMO_ENTRIES = 32768
"""Context prefixes whose hash chain is kept (least recently used dropped first)."""

Chain = tuple[list[int], bytes, bytes | None]
"""Block hashes of some tokens, the bytes of the tokens after the last full page, and the last page's digest."""

_LITTLE = sys.byteorder == "little"

try:
    from sgl_moe.router.request.native_page_hash import block_hash_chain_bytes as native_chain
except ImportError:  # no C compiler at install
    native_chain = None


def chain_bytes(chain: Chain, data: bytes, page: int) -> Chain:
    """``chain`` continued over the token ids in ``data`` (uint32 little-endian, as SGLang hashes them):
    the router's ``block_hash_chain`` on bytes, with no array conversions (the stream hashes millions of
    pages; ``tests/simulator/test_parts`` checks the hashes are the router's). The pages are hashed by the
    router's C extension where it was built (``native_page_hash.block_hash_chain_bytes``), else in Python."""
    if native_chain is None:
        return chain_bytes_py(chain, data, page)
    hashes, tail, digest = chain
    if tail:
        data = tail + data
    full = len(data) // (page * 4) * (page * 4)
    new, last = native_chain(data, page, digest)
    return (hashes + new if new else hashes), data[full:], last


def chain_bytes_py(chain: Chain, data: bytes, page: int) -> Chain:
    """``chain_bytes`` in Python (its reference in the tests; what runs without the C extension)."""
    hashes, tail, digest = chain
    if tail:
        data = tail + data
    step = page * 4
    full = len(data) // step * step
    parent = digest or b""
    new = []
    to_int = int.from_bytes
    for offset in range(0, full, step):
        parent = sha256(parent + data[offset:offset + step]).digest()
        new.append(to_int(parent[:8], "big", signed=True))
    return (hashes + new if new else hashes), data[full:], (parent or digest)


class SimUnit:
    """One prefill unit and what happens to it in the simulation."""

    __slots__ = ("rid", "task", "segments", "tokens", "hashes", "arrival", "placement", "engine", "cached",
                 "done", "inserted", "locked", "reserved", "started", "finished", "context")

    def __init__(self, rid: str, task: str, segments: list[Segment], tokens: int, hashes: list[int],
                 context: int) -> None:
        self.rid = rid
        self.task = task
        """Id of the workload request (siblings of a multi task share it)."""
        self.segments = segments
        self.context = context
        """How many leading segments are the request's context (shared by its siblings)."""
        self.tokens = tokens
        self.hashes = hashes
        """Block hashes of every full page of the unit's token ids."""
        self.arrival = 0.0
        self.placement = None
        """The router's ``Placement`` (router policies) or ``None``."""
        self.engine = None
        self.cached = -1
        """Prompt tokens served from the worker's cache when it started the unit (-1: not started)."""
        self.done = 0
        """Prompt tokens in the KV cache so far (cached + computed)."""
        self.inserted = 0
        """Leading blocks the worker has inserted into its radix cache (and locked)."""
        self.locked = 0
        self.reserved = 0
        """KV pages reserved for the tokens the worker still computes."""
        self.started = 0.0
        self.finished = 0.0


class UnitStream:
    """Iterates the units of ``generate(cfg)`` in order, hashing each unit's pages."""

    def __init__(self, cfg: WorkloadConfig, page: int = 16, token_ids: TokenIds = "derived",
                 oracle: bool = True) -> None:
        self.cfg = cfg
        self.page = page
        self.token_ids = token_ids
        self._memo: OrderedDict[tuple[str, ...], Chain] = OrderedDict()
        self._root: Chain = ([], b"", None)
        self._seen: set[int] | None = set() if oracle else None
        self._literals: dict[str, array.array] = {}
        self._literal_bytes: dict[str, bytes] = {}
        self.units = 0
        self.tasks = 0
        self.prompt_tokens = 0
        self.oracle_cached = 0
        """Tokens an unbounded cache on one worker, shown every earlier unit first, would have served."""

    def __iter__(self) -> Iterator[SimUnit]:
        for req in generate(self.cfg):
            self.tasks += 1
            ctx = len(req.context)
            base = self._context_chain(req.context)
            for i, segments in enumerate(unit_segments(req)):
                hashes = self._extend(base, segments[ctx:])[0]
                tokens = sum(s.tokens for s in segments)
                self.units += 1
                self.prompt_tokens += tokens
                if self._seen is not None:
                    self.oracle_cached += self._oracle(hashes, tokens)
                yield SimUnit(f"{req.id}/{i}", req.id, segments, tokens, hashes, ctx)

    def ids(self, seg: Segment) -> array.array:
        """Token ids of one segment (see the module docstring)."""
        if self.token_ids == "real" or seg.key.startswith("\n"):
            ids = self._literals.get(seg.key)
            if ids is None:
                ids = array.array("I", segment_token_ids(seg))
                if seg.key.startswith("\n"):
                    self._literals[seg.key] = ids
            return ids
        ids = array.array("I")
        ids.frombytes(shake_128(seg.key.encode()).digest(4 * seg.tokens))
        return ids

    def _bytes(self, seg: Segment) -> bytes:
        """``ids(seg)`` as uint32 little-endian bytes (derived ids are SHAKE-128 bytes read that way)."""
        if self.token_ids == "real" or seg.key.startswith("\n"):
            data = self._literal_bytes.get(seg.key)
            if data is None:
                ids = self.ids(seg)
                if not _LITTLE:
                    ids = array.array("I", ids)
                    ids.byteswap()
                data = ids.tobytes()
                if seg.key.startswith("\n"):
                    self._literal_bytes[seg.key] = data
            return data
        data = shake_128(seg.key.encode()).digest(4 * seg.tokens)
        if not _LITTLE:  # ``ids`` reads these bytes as native uint32; hashing wants them little-endian
            ids = array.array("I")
            ids.frombytes(data)
            ids.byteswap()
            data = ids.tobytes()
        return data

    def _context_chain(self, context: list[Segment]) -> Chain:
        """Hash chain of the context, from the longest prefix already hashed; every prefix is kept."""
        memo = self._memo
        keys = tuple(s.key for s in context)
        k = len(keys)
        chain = None
        while k:
            chain = memo.get(keys[:k])
            if chain is not None:
                memo.move_to_end(keys[:k])
                break
            k -= 1
        if chain is None:
            chain = self._root
        for j in range(k, len(keys)):
            chain = self._extend(chain, context[j:j + 1])
            memo[keys[:j + 1]] = chain
            if len(memo) > MEMO_ENTRIES:
                memo.popitem(last=False)
        return chain

    def _extend(self, chain: Chain, segments: list[Segment]) -> Chain:
        """The chain of ``chain``'s tokens followed by ``segments``' tokens."""
        if not segments:
            return chain
        data = self._bytes(segments[0]) if len(segments) == 1 else b"".join(map(self._bytes, segments))
        return chain_bytes(chain, data, self.page)

    def _oracle(self, hashes: list[int], tokens: int) -> int:
        seen = self._seen
        hit = 0
        for h in hashes:
            if h not in seen:
                break
            hit += 1
        seen.update(hashes)
        return min(hit * self.page, (tokens - 1) // self.page * self.page)


class FrozenUnits:
    """A stream hashed once and replayed for every run (each run gets fresh ``SimUnit`` objects).

    Costs the memory of every unit's hashes (~0.3 KB a unit at the default scale) and saves the
    generation and hashing of the stream for every further policy and worker count.
    """

    def __init__(self, stream: UnitStream) -> None:
        self._rows = [(u.rid, u.task, u.segments, u.tokens, u.hashes, u.context) for u in stream]
        self.units = stream.units
        self.tasks = stream.tasks
        self.prompt_tokens = stream.prompt_tokens
        self.oracle_cached = stream.oracle_cached
        self.seconds = 0.0
        """Wall seconds it took to generate and hash (set by ``experiments.freeze``)."""

    def __iter__(self) -> Iterator[SimUnit]:
        for rid, task, segments, tokens, hashes, context in self._rows:
            yield SimUnit(rid, task, segments, tokens, hashes, context)

    def __len__(self) -> int:
        return len(self._rows)
