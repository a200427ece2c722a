"""Calibrations pooled across workers of one kind: one Θ and one request overhead per kind, the median of theirs.

Each worker measures its own Θ and request overhead at start-up (``theta_calibration``). On a worker whose
throughput is flat in the work in flight (a compute-bound worker, like a saturated GPU) the knee of that profile
is set by noise: three identical CPU workers of the bench model measured Θ = 2.63e10, 4.25e10 and 8.21e10
FLOPs and request overheads from 0.45e9 to 3.75e9 (benchmarks/results/router/matrix-bench-model-24153cb.json).
Placement compares in-flight FLOPs relative to Θ, so the worker with the smallest Θ looked three times as loaded
as its peers and sat idle (lbm sent 246 / 54 / 0 requests). Workers of one kind are the same machine running the
same model with the same flags: their measurements are samples of one quantity, and the median of the samples
is the estimate. With one Θ and one cost model, placement also takes the load-ordered fast path.

A kind is ``(model, FLOPs constants, device, attention-DP ranks, step size, --moe-* flags)``. Only measured
values are pooled (state ``calibrated``); every member of the kind adopts the median, a worker whose own profile
failed or was disturbed included. Workers of different kinds keep their own values. The router's
``--saturation-flops`` and ``--request-overhead-flops`` pins win over pooling, and ``--no-pool-calibrations``
turns it off.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Iterable

from sgl_moe.router.membership.worker import Worker
from sgl_moe.wire import WorkerInfo

log = logging.getLogger("sgl_moe.router.workers")

MEASURED = "calibrated"
"""The saturation state of a worker whose Θ and request overhead came from its own start-up profile."""


def kind_of(info: WorkerInfo) -> str:
    """The kind a worker belongs to: what makes two workers' calibrations samples of the same quantity."""
    return json.dumps([info.model_path or info.model_name, repr(info.flops), info.device, info.dp_size,
                       info.saturation.step_tokens, info.moe_args], sort_keys=True, default=str)


class CalibrationPool:
    """The pooled values of each kind, as last given to its members (so only a change is logged)."""

    def __init__(self) -> None:
        self._given: dict[str, tuple] = {}
        """Kind -> (members, Θ, request overhead) last pooled."""

    def pool(self, workers: Iterable[Worker], *, theta_pinned: bool, overhead_pinned: bool) -> bool:
        """Give every worker of a kind with measured members the median of their Θ and request overhead.

        Call after each worker's own ``install`` (which resets both to its own values). Logs each kind whose
        pooled values or members changed since the last call; returns whether any worker's values changed."""
        kinds: dict[str, list[Worker]] = {}
        for w in workers:
            kinds.setdefault(kind_of(w.info), []).append(w)
        changes = []
        adopted = False
        for kind, members in kinds.items():
            measured = [w for w in members if w.info.saturation.state == MEASURED]
            if len(members) < 2 or not measured:
                self._given.pop(kind, None)
                continue
            thetas = sorted(w.info.saturation.flops for w in measured)
            overheads = sorted(w.info.saturation.request_overhead_flops or 0.0 for w in measured)
            theta, overhead = statistics.median(thetas), statistics.median(overheads)
            listed = ", ".join(f"{t:.3g}" for t in thetas)
            source = f"median of {len(measured)} calibrated worker(s) of its kind ({listed})"
            for w in members:
                adopted |= w.adopt_pooled(None if theta_pinned else theta, source,
                                          None if overhead_pinned else overhead)
            given = (tuple(w.id for w in members), theta, overhead)
            if self._given.get(kind) != given:
                self._given[kind] = given
                changes.append(f"workers {', '.join(given[0])}: one kind; Θ {theta:.4g} FLOPs (median of "
                               f"{listed}), request overhead {overhead:.4g} FLOPs "
                               f"(median of {', '.join(f'{o:.3g}' for o in overheads)})")
        for kind in set(self._given) - set(kinds):
            del self._given[kind]
        for line in changes:
            log.info("pooled calibrations: %s", line)
        return adopted
