"""``GET /metrics``: Prometheus text. Per-worker state is read from the live objects at scrape time.

What every request updates (its count, its time, the decision, hashing and tokenizing times) is kept as plain
numbers (``Tally``) and turned into Prometheus families at scrape time: ``prometheus_client``'s ``Histogram.observe``
takes a lock and walks its buckets in Python, about 10 calls per observation and 4 observations per request.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, GCCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

PREFIX = "sgl_moe_router_"


class Tally:
    """A histogram as plain numbers: what ``prometheus_client.Histogram`` exposes for the same observations.

    Updated without a lock: only the event loop's thread observes (a front process has its own). Compiled, an
    extension type with these three attributes alone (``metrics.pxd``)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(float(b) for b in bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        """Observations per bucket, not cumulative; the last one is above every bound (``+Inf``)."""
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # a bucket holds values <= its bound ("le")
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative counts by ``le`` label, ``+Inf`` last, as Prometheus writes them."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((floatToGoString(bound), float(total)))
        return out


def histogram(name: str, doc: str, tallies: dict[tuple[str, ...], Tally], labels: Sequence[str] = ()
              ) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + name, doc, labels=list(labels))
    for values, tally in tallies.items():
        family.add_metric(list(values), tally.buckets(), tally.sum)
    return family


class RouterMetrics:
    def __init__(self, router) -> None:
        self.router = router
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.retries = Counter(PREFIX + "retries", "Prefill-only requests retried on another worker after a "
                               "worker failure", registry=r)
        self.worker_failures = Counter(PREFIX + "worker_failures", "Requests a worker failed (transport error "
                                       "or 5xx)", ["worker"], registry=r)
        self.decision_seconds = Tally(DECISION_BUCKETS)
        self.hash_seconds = Tally(HASH_BUCKETS)
        self.tokenize_seconds = Tally(TOKENIZE_BUCKETS)
        self.queue_wait_seconds = Tally(QUEUE_WAIT_BUCKETS)
        self.requests: dict[tuple[str, int], list[int]] = {}
        """(endpoint, status) -> [requests answered]."""
        self.request_seconds: dict[str, Tally] = {}
        """endpoint -> end-to-end times at the router."""
        r.register(_StateCollector(router))
        r.register(_RequestCollector(self))
        # The interpreter's collector passes (``python_gc_*``): a reference cycle left per request shows here as
        # objects collected growing with the requests answered (``tune_gc`` makes each pass rare and long).
        GCCollector(registry=r)

    def answered(self, endpoint: str, status: int, seconds: float) -> None:
        """A request to ``endpoint`` was answered with ``status`` after ``seconds``."""
        count = self.requests.get((endpoint, status))
        if count is None:
            count = self.requests[(endpoint, status)] = [0]
        count[0] += 1
        tally = self.request_seconds.get(endpoint)
        if tally is None:
            tally = self.request_seconds[endpoint] = Tally(REQUEST_BUCKETS)
        tally.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2)
HASH_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 2e-2)
TOKENIZE_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 2e-2, 1e-1)
QUEUE_WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)


class _RequestCollector:
    """The per-request tallies of a ``RouterMetrics`` as Prometheus families."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        m = self.metrics
        requests = CounterMetricFamily(PREFIX + "requests", "Requests answered, by endpoint and HTTP status",
                                       labels=["endpoint", "status"])
        for (endpoint, status), (n,) in sorted(m.requests.items()):
            requests.add_metric([endpoint, str(status)], n)
        yield requests
        yield histogram("decision_seconds", "Routing decision time: match, cost, choice and reservation (excludes "
                        "tokenization and hashing)", {(): m.decision_seconds})
        yield histogram("hash_seconds", "Block hashing time per request", {(): m.hash_seconds})
        yield histogram("tokenize_seconds", "Tokenization time per request", {(): m.tokenize_seconds})
        yield histogram("queue_wait_seconds", "Time a request waited for admission", {(): m.queue_wait_seconds})
        yield histogram("request_seconds", "End-to-end request time at the router",
                        {(e,): t for e, t in sorted(m.request_seconds.items())}, ["endpoint"])


class _StateCollector:
    def __init__(self, router) -> None:
        self.router = router

    def describe(self):
        return []

    def collect(self):
        router = self.router
        pool, sched, index = router.pool, router.scheduler, router.index
        w_labels = ["worker", "url"]

        def gauge(name, doc, labels=()):
            return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))

        def counter(name, doc, labels=()):
            return CounterMetricFamily(PREFIX + name, doc, labels=list(labels))

        peers = router.peers
        if peers is not None:
            connected = gauge("peers_connected", "1 while the broker router replicas share state through is "
                              "reachable (--peers)")
            connected.add_metric([], 1.0 if peers.state == "connected" else 0.0)
            live = gauge("peer_replicas", "Other router replicas heard from within --peer-timeout-s")
            live.add_metric([], float(len(peers.tables.peers)))
            gaps = counter("peer_message_gaps", "Messages from other replicas lost (a snapshot was asked for)")
            gaps.add_metric([], float(peers.tables.stats.gaps))
            expired = counter("peer_expirations", "Replicas dropped after --peer-timeout-s without a message")
            expired.add_metric([], float(peers.tables.stats.expired))
            yield from (connected, live, gaps, expired)
        healthy = gauge("worker_healthy", "1 if the worker is in rotation", w_labels)
        committed = gauge("committed_blocks", "Blocks in the worker's committed table (from KV events)", w_labels)
        pending = gauge("pending_blocks", "Blocks in the worker's pending table (promised by routed requests)",
                        w_labels)
        inflight = gauge("inflight_flops", "In-flight FLOPs reserved on the worker (other replicas' included)",
                         w_labels)
        peer_inflight = gauge("peer_inflight_flops", "Other router replicas' in-flight FLOPs on the worker (--peers)",
                              w_labels)
        theta = gauge("theta_flops", "Saturation threshold Θ of the worker", w_labels)
        inflight_req = gauge("inflight_requests", "Requests in flight on the worker", w_labels)
        routed = counter("routed_requests", "Requests dispatched to the worker", w_labels)
        predicted = counter("predicted_cached_tokens", "Cached tokens the router predicted, over responses that "
                            "report cached tokens", w_labels)
        reported = counter("reported_cached_tokens", "Cached tokens the worker reported on the same responses",
                           w_labels)
        ev = counter("kv_events_blocks", "Blocks in KV events applied", [*w_labels, "type"])
        gaps = counter("kv_event_gaps", "Sequence gaps detected in the worker's KV events", w_labels)
        replays = counter("kv_event_replays", "Gaps recovered through the replay endpoint", w_labels)
        replay_fail = counter("kv_event_replay_failures", "Gaps that could not be replayed (table reset)", w_labels)
        resets = counter("committed_table_resets", "Committed-table resets (connect, unrecoverable gap, "
                         "publisher restart)", w_labels)
        lag = gauge("kv_event_lag_seconds", "Age of the last KV event batch when it was received", w_labels)
        restarts = counter("worker_restarts", "Worker restarts detected (new instance id)", w_labels)
        handshakes = counter("kv_event_handshake_failures", "KV-event connections the worker and the router could "
                             "not agree on (CURVE keys, mechanism)", w_labels)
        for w in pool.workers.values():
            lab = [w.id, w.url]
            healthy.add_metric(lab, 1.0 if w.state == "healthy" else 0.0)
            c = p = 0
            for slot in w.slots.values():
                sc, sp = index.sizes(slot)
                c, p = c + sc, p + sp
            committed.add_metric(lab, c)
            pending.add_metric(lab, p)
            inflight.add_metric(lab, w.inflight_flops)
            peer_inflight.add_metric(lab, w.peer_flops)
            theta.add_metric(lab, w.theta)
            inflight_req.add_metric(lab, w.inflight_requests)
            routed.add_metric(lab, w.counters.requests)
            predicted.add_metric(lab, w.counters.predicted_cached_tokens)
            reported.add_metric(lab, w.counters.reported_cached_tokens)
            ev.add_metric([*lab, "stored"], w.counters.events_stored)
            ev.add_metric([*lab, "removed"], w.counters.events_removed)
            ev.add_metric([*lab, "all_cleared"], w.counters.events_cleared)
            gaps.add_metric(lab, sum(x.stats.gaps for x in w.listeners))
            replays.add_metric(lab, sum(x.stats.replays for x in w.listeners))
            replay_fail.add_metric(lab, sum(x.stats.replay_failures for x in w.listeners))
            resets.add_metric(lab, w.counters.table_resets)
            lag.add_metric(lab, max((x.stats.last_lag_s for x in w.listeners), default=0.0))
            restarts.add_metric(lab, w.counters.restarts)
            handshakes.add_metric(lab, sum(x.stats.handshake_failures for x in w.listeners))
        yield from (healthy, committed, pending, inflight, peer_inflight, theta, inflight_req, routed, predicted,
                    reported, ev,
                    gaps, replays, replay_fail, resets, lag, restarts, handshakes)
        depth = gauge("queue_depth", "Requests waiting for admission")
        depth.add_metric([], len(sched.queue))
        yield depth
        for name, doc, value in (
            ("spills", "Requests sent to a worker other than the best-matching (saturated) one", sched.stats.spills),
            ("prefix_waits", "Requests that waited for prefix blocks another request was computing on their worker",
             sched.stats.prefix_waits),
            ("queued_requests", "Requests that had to wait in the admission queue", sched.stats.queued),
            ("queue_pumps", "Scans of the admission queue (after releases, stored blocks, a new Θ)", sched.stats.pumps),
            ("queue_rescored", "Queued requests scored again by a queue scan", sched.stats.rescored),
            ("rejected_queue_full", "Requests answered 429 because the queue was full",
             sched.stats.rejected_queue_full),
            ("queue_timeouts", "Requests answered 503 after waiting too long for admission",
             sched.stats.queue_timeouts),
            ("pending_retired_stored", "Pending promises retired after completion and BlockStored",
             router.ledger.stats.retired_stored),
            ("pending_retired_failed", "Pending promises retired because the request failed",
             router.ledger.stats.retired_failed),
            ("tokenizer_mismatches", "Workers whose own token ids differed from the router's on the probe set "
             "when they joined (the router then routes without prefix affinity)", pool.tokenizer_mismatches),
            ("pending_retired_ttl", "Pending promises retired by the TTL safety net", router.ledger.stats.retired_ttl),
            ("suspect_refusals", "Requests refused as poison (the same request killed a worker it ran alone on)",
             router.suspects.refused),
            ("quarantine_runs", "Suspects (requests running on a worker when it died) run alone on another worker",
             router.lane.runs if router.lane is not None else 0),
            ("suspects_cleared", "Suspects whose run alone ended with the worker alive (answered)",
             router.suspects.cleared),
            ("poison_convicted", "Suspects whose run alone killed that worker too (refused for --suspect-ttl-s)",
             router.suspects.convicted),
            ("client_aborts", "Requests whose client went away before the answer (aborted on their worker)",
             router.forwarder.aborts),
            ("abort_failures", "Aborts of such requests that the worker did not accept within --abort-timeout-s "
             "(the request is counted as lost and its load released)", router.forwarder.abort_failures),
            ("busy_health_probes", "Health probes that failed while the worker was making progress (not counted "
             "against it)", pool.health.busy_probes),
            ("front_placements", "Requests placed for front processes (--front-processes > 1; the other counters "
             "of this page count only what the owner itself answered)",
             router.owner.placed if router.owner is not None else 0),
        ):
            m = counter(name, doc)
            m.add_metric([], value)
            yield m
        tok = pool.tokenizer
        memos = {"generate": tok.memo, "plain": tok.plain_memo} if tok is not None and tok.memo is not None else {}
        if memos:  # by kind: ``generate`` (special tokens added), ``plain`` (chat prompts, decisions, classify)
            families = [
                (counter("prefix_memo_texts", "Texts encoded through the prefix memo", ["kind"]), "texts"),
                (counter("prefix_memo_ids", "Token ids taken from the prefix memo instead of encoded", ["kind"]),
                 "memo_ids"),
                (counter("prefix_memo_encoded_chars", "Characters the prefix memo still had the tokenizer encode",
                         ["kind"]), "encoded_chars"),
                (counter("prefix_memo_checks", "Memoised encodes compared with a whole encode", ["kind"]), "checks"),
                (counter("prefix_memo_mismatches", "Memoised encodes that differed from a whole encode (the memo "
                         "then turns itself off)", ["kind"]), "mismatches"),
            ]
            on = gauge("prefix_memo_enabled", "1 while the prefix memo serves the router's tokenizer", ["kind"])
            held = gauge("prefix_memo_tokens", "Token ids the prefix memo holds", ["kind"])
            for kind, memo in memos.items():
                for family, attr in families:
                    family.add_metric([kind], getattr(memo.stats, attr))
                on.add_metric([kind], 1.0 if memo.enabled else 0.0)
                held.add_metric([kind], memo.tokens)
            yield from (*(f for f, _ in families), on, held)
        pieces = tok.pieces if tok is not None else None
        if pieces is not None:
            m = counter("piece_cache_pieces", "Pieces (a space run and the word after it) of memo segments by where "
                        "their ids came from: kept (encoded before) or encoded", ["source"])
            m.add_metric(["kept"], pieces.hits)
            m.add_metric(["encoded"], pieces.misses)
            yield m
            m = counter("piece_cache_whole_texts", "Memo segments encoded whole because they cannot be cut at "
                        "spaces (an added token as text, a pair BPE may merge)")
            m.add_metric([], pieces.whole)
            yield m
        bare = router.bare_counts
        if bare is not None:
            m = counter("http_bare_answered", "Requests the router answered on its bare HTTP protocols "
                        "(--http-server bare)")
            m.add_metric([], bare.answered)
            yield m
            m = counter("http_handed_off", "Connections handed from the bare HTTP protocols to aiohttp's server, by "
                        "why: route, body, key, bad_head, pipelined, stream", ["reason"])
            for why, n in sorted(bare.handed_off.items()):
                m.add_metric([why], n)
            yield m
