"""Shared-prefix streams as simulated units: G prefix groups, each request = its group's prefix + a unique suffix.

The shape of SGLang's ``bench_serving`` generated-shared-prefix dataset, with the groups' popularity Zipf
(rank r drawn with weight 1 / r^s, which prefix is popular is itself seeded) or uniform; the simulator's
counterpart of ``policy_bench``'s prefix stream. Token ids are derived from segment keys as in ``units``
(``UnitStream.ids``): equal keys give equal pages, different keys different pages. A prefix is hashed once
and every request of its group chains its suffix onto it.
"""

from __future__ import annotations

import array
import random
from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import shake_128
from typing import Literal

from sgl_moe.router.request.block_hash import block_hash_chain
from sgl_moe.simulator.units import SimUnit
from sgl_moe.workloads import Segment

Popularity = Literal["zipf", "uniform"]


@dataclass(frozen=True)
class PrefixStreamConfig:
    requests: int
    groups: int
    """Distinct shared prefixes."""
    prefix_tokens: int
    suffix_tokens: int
    popularity: Popularity = "zipf"
    zipf_s: float = 1.1
    """Zipf exponent (``policy_bench``'s)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.requests, self.groups, self.prefix_tokens, self.suffix_tokens) <= 0:
            raise ValueError("requests, groups, prefix_tokens and suffix_tokens must be positive")
        if self.popularity not in ("zipf", "uniform"):
            raise ValueError(f"popularity must be zipf or uniform, got {self.popularity!r}")

    @property
    def prefix_set_tokens(self) -> int:
        """Tokens of all distinct prefixes together (what a cache must hold to reuse every one)."""
        return self.groups * self.prefix_tokens


def _ids(key: str, tokens: int) -> array.array:
    ids = array.array("I")
    ids.frombytes(shake_128(key.encode()).digest(4 * tokens))
    return ids


class PrefixUnits:
    """The stream, hashed once; every iteration yields fresh ``SimUnit``s (as ``FrozenUnits`` does)."""

    def __init__(self, cfg: PrefixStreamConfig, page: int = 16) -> None:
        self.cfg = cfg
        rng = random.Random(cfg.seed)
        names = [f"pfx{cfg.seed}-{g}" for g in range(cfg.groups)]
        rng.shuffle(names)
        weights = [1.0] * cfg.groups if cfg.popularity == "uniform" else [
            1.0 / (r + 1) ** cfg.zipf_s for r in range(cfg.groups)]
        picks = rng.choices(range(cfg.groups), weights=weights, k=cfg.requests)
        chains: dict[int, tuple[list[int], array.array, bytes | None]] = {}
        seen: set[int] = set()
        self._rows: list[tuple[str, str, list[Segment], int, list[int]]] = []
        self.oracle_cached = 0
        """Tokens an unbounded cache on one worker, shown every earlier unit first, would have served."""
        tokens = cfg.prefix_tokens + cfg.suffix_tokens
        for i, g in enumerate(picks):
            chain = chains.get(g)
            if chain is None:
                ids = _ids(names[g], cfg.prefix_tokens)
                hashes, digest = block_hash_chain(ids, page)
                chain = chains[g] = (hashes, ids[len(hashes) * page:], digest)
            prefix_hashes, tail, digest = chain
            suffix_key = f"sfx{cfg.seed}-{i}"
            rest = array.array("I", tail)
            rest.extend(_ids(suffix_key, cfg.suffix_tokens))
            hashes = prefix_hashes + block_hash_chain(rest, page, digest)[0]
            hit = 0
            for h in hashes:
                if h not in seen:
                    break
                hit += 1
            seen.update(hashes)
            self.oracle_cached += min(hit * page, (tokens - 1) // page * page)
            segments = [Segment(names[g], cfg.prefix_tokens), Segment(suffix_key, cfg.suffix_tokens)]
            self._rows.append((f"{names[g]}/{i}", names[g], segments, tokens, hashes))
        self.units = self.tasks = cfg.requests
        self.prompt_tokens = tokens * cfg.requests

    def __iter__(self) -> Iterator[SimUnit]:
        for rid, task, segments, tokens, hashes in self._rows:
            yield SimUnit(rid, task, segments, tokens, hashes, 1)

    def __len__(self) -> int:
        return len(self._rows)
