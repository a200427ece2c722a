"""Shared-prefix streams for the matrix: G prefix groups, each request = its group's prefix + a unique suffix.

Popularity of the groups is Zipf (rank r drawn with weight 1 / r^s) or uniform. Text comes from the
workloads' deterministic segments (``sgl_moe.workloads.segments``), so the same seed gives byte-identical
prompts. This is the shape of SGLang's ``bench_serving`` generated-shared-prefix dataset with a skewed
group popularity, the workload on which issue 18 saw sglang-router ``cache_aware`` win.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from sgl_moe.policy_bench.stream import StreamUnit
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.workloads.segments import new_segment, segment_text

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
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests <= 0 or self.groups <= 0 or self.prefix_tokens <= 0 or self.suffix_tokens <= 0:
            raise ValueError("requests, groups, prefix_tokens and suffix_tokens must be positive")
        if self.popularity not in ("zipf", "uniform"):
            raise ValueError(f"popularity must be zipf or uniform, got {self.popularity!r}")

    @property
    def prefix_set_tokens(self) -> int:
        """Tokens of all distinct prefixes together (what a cache must hold to reuse every one)."""
        return self.groups * self.prefix_tokens


def group_weights(cfg: PrefixStreamConfig) -> list[float]:
    if cfg.popularity == "uniform":
        return [1.0] * cfg.groups
    return [1.0 / (r + 1) ** cfg.zipf_s for r in range(cfg.groups)]


def build_prefix_stream(cfg: PrefixStreamConfig, tok: RouterTokenizer) -> list[StreamUnit]:
    """``cfg.requests`` units in arrival order; the group of each drawn independently (seeded)."""
    rng = random.Random(cfg.seed)
    # Which prefix is popular is itself seeded, so popularity does not follow the group number.
    names = [f"pfx{cfg.seed}-{g}" for g in range(cfg.groups)]
    rng.shuffle(names)
    picks = rng.choices(range(cfg.groups), weights=group_weights(cfg), k=cfg.requests)
    prefixes = [segment_text(new_segment(name, cfg.prefix_tokens)) for name in names]
    units = []
    for i, g in enumerate(picks):
        text = prefixes[g] + segment_text(new_segment(f"sfx{cfg.seed}-{i}", cfg.suffix_tokens))
        units.append(StreamUnit(f"{names[g]}/{i}", f"{cfg.popularity}-prefix", text, len(tok.encode(text))))
    return units
