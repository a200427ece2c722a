"""Seed 000 Table 2 (the six prefill-only workloads) and the generator's configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

WORKLOADS = ("moral", "mmlu", "boolq", "imdb", "quality", "arxiv")
"""Seed 000 Table 2, in that order."""

PAGE = 16
"""KV page size of the shipped model's workers: the unit of prefix caching."""


@dataclass(frozen=True)
class TableRow:
    """One row of seed 000 Table 2."""

    dataset: str
    context: tuple[int, int]
    """Request context range in tokens (the prompt)."""
    requests: int
    """Requests of this dataset in the aggregated workload: the mix's sampling weight."""
    total_tokens: int
    share: Literal["High", "Medium", "Low"]
    """Prefix share."""


TABLE2: dict[str, TableRow] = {
    "moral": TableRow("MoralStories", (100, 200), 24_000, 3_300_000, "High"),
    "mmlu": TableRow("MMLU", (50, 500), 24_000, 5_800_000, "Low"),
    "boolq": TableRow("BoolQ", (200, 600), 12_000, 2_700_000, "Low"),
    "imdb": TableRow("IMDB", (300, 2_000), 12_000, 5_500_000, "Low"),
    "quality": TableRow("QuALITY", (4_000, 12_000), 1_200, 10_500_000, "High"),
    "arxiv": TableRow("ArXiv Classification", (6_000, 128_000), 600, 10_100_000, "Medium"),
}

MIN_MAX_CONTEXT = 128
"""The smallest ``max_context`` that still fits every shape's floors (shared parts of 2 pages, ...)."""


@dataclass(frozen=True)
class WorkloadConfig:
    """What ``generate`` produces; every field but ``workloads`` is a flag of ``python -m sgl_moe.workloads``."""

    workloads: tuple[str, ...] = WORKLOADS
    """Workloads to draw from, in proportion to Table 2's request counts: one name gives that workload
    alone, all six the aggregated mix. A comma-separated string is accepted."""
    requests: int = 1000
    """Number of requests to generate."""
    length_scale: float = 8.0
    """Divide Table 2's context lengths by this (CPU runs); floors keep each shape's structure."""
    max_context: int = 3900
    """Clip prompts to this many tokens (the shipped model's context is 4096; the rest is left for the
    choice listing or candidate suffix)."""
    seed: int = 0
    """Seed of every random choice and of the text: same seed, same requests and texts."""

    def __post_init__(self) -> None:
        if isinstance(self.workloads, str):
            object.__setattr__(self, "workloads", tuple(w.strip() for w in self.workloads.split(",") if w.strip()))
        else:
            object.__setattr__(self, "workloads", tuple(self.workloads))
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown or not self.workloads or len(set(self.workloads)) != len(self.workloads):
            raise ValueError(f"workloads must be distinct names among {', '.join(WORKLOADS)}; "
                             f"got {', '.join(self.workloads) or 'none'}")
        if self.requests < 0:
            raise ValueError(f"requests must be >= 0, got {self.requests}")
        if not self.length_scale > 0:
            raise ValueError(f"length_scale must be positive, got {self.length_scale}")
        if self.max_context < MIN_MAX_CONTEXT:
            raise ValueError(f"max_context must be >= {MIN_MAX_CONTEXT}, got {self.max_context}")
