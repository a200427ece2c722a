"""The router's per-request tallies expose what ``prometheus_client``'s own metrics expose for the same updates."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from sgl_moe.router.front.metrics import (
    DECISION_BUCKETS,
    PREFIX,
    REQUEST_BUCKETS,
    RouterMetrics,
    Tally,
    _RequestCollector,
    histogram,
)


def _samples(text: bytes) -> set[str]:
    """The exposition's sample lines, without ``_created`` series (``prometheus_client`` adds a creation time)."""
    return {line for line in text.decode().splitlines()
            if line and not line.startswith("#") and "_created" not in line}


class _Families:
    def __init__(self, families: list) -> None:
        self.families = families

    def describe(self) -> list:
        return []

    def collect(self) -> list:
        return self.families


def test_a_tally_exposes_what_a_prometheus_histogram_does():
    rng = random.Random(7)
    values = [rng.choice(DECISION_BUCKETS) for _ in range(200)]  # on a bound: "le" holds it
    values += [rng.uniform(0, 0.02) for _ in range(2000)] + [0.0, 1.0, 5e-6]
    reference = CollectorRegistry()
    hist = Histogram(PREFIX + "decision_seconds", "d", registry=reference, buckets=DECISION_BUCKETS)
    tally = Tally(DECISION_BUCKETS)
    for v in values:
        hist.observe(v)
        tally.observe(v)
    ours = CollectorRegistry()
    ours.register(_Families([histogram("decision_seconds", "d", {(): tally})]))
    want, got = _samples(generate_latest(reference)), _samples(generate_latest(ours))
    assert got == want
    assert f'{PREFIX}decision_seconds_count {float(len(values))}' in got


def test_answered_requests_and_times_by_endpoint_and_status():
    metrics = RouterMetrics.__new__(RouterMetrics)  # the tallies only: no router to read state from
    metrics.requests, metrics.request_seconds = {}, {}
    for name in ("decision_seconds", "hash_seconds", "tokenize_seconds", "queue_wait_seconds"):
        setattr(metrics, name, Tally(DECISION_BUCKETS))
    reference = CollectorRegistry()
    count = Counter(PREFIX + "requests", "r", ["endpoint", "status"], registry=reference)
    times = Histogram(PREFIX + "request_seconds", "t", ["endpoint"], registry=reference, buckets=REQUEST_BUCKETS)
    rng = random.Random(3)
    for _ in range(500):
        endpoint, status = rng.choice(["/generate", "/v1/score"]), rng.choice([200, 400, 503])
        seconds = rng.expovariate(2)
        metrics.answered(endpoint, status, seconds)
        count.labels(endpoint, str(status)).inc()
        times.labels(endpoint).observe(seconds)
    ours = CollectorRegistry()
    ours.register(_RequestCollector(metrics))
    got = _samples(generate_latest(ours))
    want = _samples(generate_latest(reference))
    assert want <= got
    assert sum(n for (n,) in metrics.requests.values()) == 500


def test_the_routers_metrics_show_the_garbage_collectors_passes():
    metrics = RouterMetrics(router=None)  # the router's state is read only when its own collector is
    names = ["python_gc_collections_total", "python_gc_objects_collected_total"]
    text = generate_latest(metrics.registry.restricted_registry(names)).decode()
    for name in names:
        for generation in "012":
            assert f'{name}{{generation="{generation}"}}' in text
