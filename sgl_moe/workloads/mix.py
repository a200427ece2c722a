"""The request stream: workloads mixed in Table 2's proportions, groups spread over time.

Each request slot draws its workload with probability proportional to Table 2's request counts (24K,
24K, 12K, 12K, 1.2K, 0.6K), renormalised over ``cfg.workloads``. Each workload is its own stream with its
own RNG (seeded from the seed and the workload's name), so the quality requests of the aggregated mix
are exactly the requests of a quality-only run with the same seed, ids included.

Grouped workloads (a QuALITY document's questions, a BoolQ passage's questions) keep a window of
``OPEN_GROUPS`` groups open and draw each next request from a random open group other than the one
drawn last, opening a new group when one runs out. An offline pipeline that walks a dataset and
interleaves it with others behaves this way: a group's requests are spread over time, never adjacent
within their workload while another group is open, and rarely adjacent in the mix.

Requests are numbered per workload in emission order (``quality-000042`` is the 43rd quality request).
Nothing here renders text, so a million requests take seconds.
"""

from __future__ import annotations

import random
from bisect import bisect
from collections.abc import Iterator
from itertools import accumulate

from sgl_moe.workloads.config import TABLE2, WorkloadConfig
from sgl_moe.workloads.request import WorkloadRequest
from sgl_moe.workloads.segments import stable_hash
from sgl_moe.workloads.shapes import SHAPES, Shape, ShapeContext

OPEN_GROUPS: dict[str, int] = {"boolq": 8, "quality": 4}
"""Groups interleaved at a time per grouped workload (the shuffle window, in groups)."""


def _workload_stream(shape: Shape, ctx: ShapeContext, rng: random.Random, window: int) -> Iterator[WorkloadRequest]:
    """One workload's requests in emission order (endless)."""
    g = 0
    if window <= 1:
        while True:
            yield from shape(ctx, rng, g)
            g += 1
    open_groups: list[list[WorkloadRequest]] = []
    last: list[WorkloadRequest] | None = None
    while True:
        while len(open_groups) < window:
            open_groups.append(shape(ctx, rng, g)[::-1])  # reversed: pop() yields them in order
            g += 1
        i = rng.randrange(window)
        if open_groups[i] is last:  # another open group, uniformly
            i = (i + 1 + rng.randrange(window - 1)) % window
        group = open_groups[i]
        yield group.pop()
        last = group
        if not group:
            open_groups[i] = open_groups[-1]
            open_groups.pop()


def generate(cfg: WorkloadConfig) -> Iterator[WorkloadRequest]:
    """``cfg.requests`` requests, deterministic per ``cfg.seed``; text is rendered later, on demand."""
    ctx = ShapeContext(cfg)
    names = list(cfg.workloads)
    streams = [_workload_stream(SHAPES[w], ctx, random.Random(stable_hash(f"{cfg.seed}/{w}")),
                                OPEN_GROUPS.get(w, 1)) for w in names]
    counts = [0] * len(names)
    cumulative = list(accumulate(TABLE2[w].requests for w in names))
    total = cumulative[-1]
    draw = random.Random(stable_hash(f"{cfg.seed}/mix")).random
    for _ in range(cfg.requests):
        k = bisect(cumulative, draw() * total) if len(names) > 1 else 0
        req = next(streams[k])
        req.id = f"{names[k]}-{counts[k]:06d}"
        counts[k] += 1
        yield req
