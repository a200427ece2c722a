"""Θ for a worker without weight streaming (issue 18 part 3): the batch size where measured throughput stops
growing, from a short start-up profile over HTTP (``ThroughputCalibrator``), reported in the info's saturation
part and installed by the router. The server here is a stand-in whose batch time is a known function of the
batch size, so the test checks the profile's logic, not a real worker's figures."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sgl_moe import saturation
from sgl_moe.flops import FlopsModel
from sgl_moe.router.membership.worker import Worker
from sgl_moe.saturation import CalibrationError
from sgl_moe.wire import SaturationInfo, WorkerInfo
from sgl_moe.worker.info import with_saturation
from sgl_moe.worker.readiness import Readiness
from sgl_moe.worker.theta_calibration import ThroughputCalibrator, WorkerShape

FLOPS = FlopsModel(linear_flops_per_token=1000.0, attn_flops_per_pair=10.0, lm_head_flops_per_token=100.0,
                   num_layers=2, num_moe_layers=2)


def test_saturation_is_the_fewest_in_flight_reaching_the_knee_of_the_best_throughput():
    # FLOPs/s doubles up to 4 requests in flight, then grows 2% per doubling: 4 reaches 85% of the best.
    points = [(1, 1.0), (2, 1.0), (4, 1.0), (8, 2.0 / 1.02), (16, 4.0 / 1.02**2)]
    theta = saturation.from_throughput(points, prompt_flops=10.0, prompt_tokens=256, margin=1.0, seconds=3.0)
    assert theta.details["saturation_batch"] == 4 and theta.flops == pytest.approx(40.0)
    assert theta.state == "calibrated" and "85% of the best" in theta.source
    # Slow growth that adds up (6% per doubling, 26% from 1 to 16 in flight): a rule stopping at the first
    # small gain would take 1; 8 is the first to reach 85% of the best.
    slow = [(c, c / 1.06 ** i) for i, c in enumerate([1, 2, 4, 8, 16])]
    assert saturation.from_throughput(slow, 10.0, 256, 1.0, 1.0).details["saturation_batch"] == 4
    slower = [(c, c / 1.045 ** i) for i, c in enumerate([1, 2, 4, 8, 16])]  # 19% from 1 to 16: 2 reaches 85%
    assert saturation.from_throughput(slower, 10.0, 256, 1.0, 1.0).details["saturation_batch"] == 2
    # Flat within a CPU profile's noise (the bench model's profiles, GFLOP/s at 1, 2, 4, 8 in flight, whose 95%
    # knees were 4, 8, 2 and 1): one request in flight already runs at the best rate; Θ is its work.
    for rates in ([53.8, 54.8, 62.9, 62.2], [62.0, 63.8, 63.1, 67.5], [70.3, 75.6, 77.7, 78.5],
                  [66.8, 63.0, 69.8, 69.1]):
        profile = [(c, c * 10.0 / r) for c, r in zip([1, 2, 4, 8], rates)]
        assert saturation.from_throughput(profile, 10.0, 256, 1.0, 1.0).details["saturation_batch"] == 1
    # The shipped model's profiles still rise (1.64-2.32x from 1 to 8): their knee stays at the top.
    for gains in ([1.0, 1.11, 1.43, 1.78], [1.0, 1.1, 1.2, 1.64], [1.0, 1.45, 1.61, 1.99]):
        profile = [(c, c / g) for c, g in zip([1, 2, 4, 8], gains)]
        assert saturation.from_throughput(profile, 10.0, 256, 1.0, 1.0).details["saturation_batch"] == 8
    # Still doubling at the largest level profiled (the KV pool held no more): no knee was seen, so Θ is
    # twice that level's work (times the margin), and the source says so.
    grows = saturation.from_throughput([(1, 1.0), (2, 1.0), (4, 1.0)], 10.0, 256, 1.5, 1.0)
    assert grows.flops == pytest.approx(1.5 * 2 * 40.0) and "no knee" in grows.source
    assert grows.details["saturation_batch"] == 4
    # A last level that gains a little more than the knee allows (20%, over the 18% an 85% knee absorbs, under the
    # 25% of "still growing") is not "still growing": Θ is that level's work, not twice it (issue 29: Θ flipped 4x
    # on noise).
    noisy_top = saturation.from_throughput([(1, 1.0), (2, 1.0), (4, 2.0 / 1.2)], 10.0, 256, 1.0, 1.0)
    assert noisy_top.details["saturation_batch"] == 4 and noisy_top.flops == pytest.approx(40.0)
    assert "no knee" not in noisy_top.source
    # A last level that gains less than the knee allows (4%) is a knee: that level's work.
    flat = saturation.from_throughput([(1, 1.0), (2, 1.0), (4, 2.0 / 1.04)], 10.0, 256, 1.0, 1.0)
    assert flat.details["saturation_batch"] == 2 and flat.flops == pytest.approx(20.0)
    with pytest.raises(CalibrationError):
        saturation.from_throughput([], 10.0, 256, 1.0, 1.0)
    # Measured on a loaded host (a real profile of this project's CPU runs): throughput halves with more in
    # flight, which no server does: refused, the worker keeps its fallback and says why.
    noisy = [(c, c * 1e9 / r) for c, r in zip([1, 2, 4, 8, 16], [6.09e9, 3.11e9, 1.43e9, 4.75e9, 2.61e9])]
    with pytest.raises(CalibrationError, match="not monotone"):
        saturation.from_throughput(noisy, 1e9, 256, 1.0, 1.0)
    with pytest.raises(CalibrationError):
        saturation.from_throughput([(1, 0.0)], 10.0, 256, 1.0, 1.0)


HOLD_FIXED_S = 0.05
"""What every stand-in request holds its slot for whatever its length (its fixed cost)."""
HOLD_PER_FLOP_S = 0.10 / FLOPS.request_flops(0, 256)
"""And per FLOP: a 256-token request holds a slot 0.15 s, long against the HTTP overhead per request (a few
ms), so the throughput at 4 in flight is within 95% of the best, as the stand-in's 4 slots intend. Its fixed
cost is worth HOLD_FIXED_S / HOLD_PER_FLOP_S = half a 256-token request's FLOPs."""


class _Server(ThreadingHTTPServer):
    request_queue_size = 64  # the profile opens 32 connections at once (uvicorn's backlog is 2048)


class _StandIn(BaseHTTPRequestHandler):
    """A worker with 4 slots and a 4,096-token KV pool (16 profile prompts): a request holds a slot for
    ``HOLD_FIXED_S``, more wait. Throughput grows up to 4 requests in flight, then is flat."""

    seen: list[str] = []
    inflight = 0
    lock = threading.Lock()
    slots = threading.Semaphore(4)

    def log_message(self, *args) -> None:
        pass

    hold_scale = 1.0
    """Times every hold (the knee test doubles it: the client's round trip between two requests, a few ms on a
    quiet host and ~20 ms on a loaded one, idles a slot at 4 in flight and adds to the fixed cost measured)."""

    pool_tokens: int | None = 4096
    """What ``/get_server_info`` reports as the KV pool (None: the route says nothing, as a stub would)."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        if self.path == "/get_server_info" and _StandIn.pool_tokens:
            self.wfile.write(json.dumps({"max_total_num_tokens": _StandIn.pool_tokens}).encode())
        else:
            self.wfile.write(b"ok")

    keys: tuple[str, str] | None = None
    """(api key, admin key) the stand-in demands, as SGLang's middleware does: /generate the api key,
    /flush_cache the admin key."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if _StandIn.keys is not None:
            want = _StandIn.keys[1] if self.path == "/flush_cache" else _StandIn.keys[0]
            if self.headers.get("Authorization") != f"Bearer {want}":
                self.seen.append(f"401 {self.path}")
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        if self.path == "/generate":
            n = len(body["input_ids"])
            assert n in (32, 256) and isinstance(body["input_ids"][0], int)
            with _StandIn.lock:
                _StandIn.inflight += 1
                self.seen.append(f"generate {_StandIn.inflight}" + ("" if n == 256 else " short"))
            with _StandIn.slots:
                time.sleep(_StandIn.hold_scale * (HOLD_FIXED_S + HOLD_PER_FLOP_S * FLOPS.request_flops(0, n)))
            with _StandIn.lock:
                _StandIn.inflight -= 1
        else:
            self.seen.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")


def test_profile_finds_the_knee_reports_it_and_the_router_installs_it():
    server = _Server(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _StandIn.seen = []
    _StandIn.hold_scale = 2.0
    try:
        shape = WorkerShape(FLOPS, step_tokens=4096, context_length=4096, vocab_size=4096)
        cal = ThroughputCalibrator(f"http://127.0.0.1:{server.server_address[1]}", lambda: shape, 1.0, 120.0,
                                   host=_Host([]))
        assert cal.current().state == "calibrating"  # the fallback until the profile ends
        cal.start()
        cal._thread.join(120)
        assert not cal._thread.is_alive(), "the profile did not end"
        theta = cal.current()
    finally:
        _StandIn.hold_scale = 1.0
        server.shutdown()
    assert theta.state == "calibrated", theta.source
    assert theta.details["saturation_batch"] == 4 and theta.details["batch_sizes"] == [1, 2, 4, 8, 16]
    assert max(int(x.split()[1]) for x in _StandIn.seen if x.startswith("generate")) > 8  # clients overlapped
    # The fixed cost is found from short requests timed at the knee (4 in flight), within the HTTP overhead.
    assert any(x.endswith("short") for x in _StandIn.seen)
    overhead = theta.details["request_overhead_flops"]
    assert overhead == pytest.approx(HOLD_FIXED_S / HOLD_PER_FLOP_S, rel=0.2)
    # Θ counts each request as its FLOPs plus that overhead, as the router will.
    assert theta.flops == pytest.approx(4 * (FLOPS.request_flops(0, 256) + overhead))
    assert _StandIn.seen[-1] == "/flush_cache"  # the profile's random prompts leave the cache
    # The info carries the figures; a router installs the measured Θ.
    info = WorkerInfo(model_name="m", page_size=16, flops=FLOPS,
                      saturation=SaturationInfo(1.0, "fallback", "calibrating", step_tokens=4096))
    info = with_saturation(info, theta)
    assert info.saturation.saturation_batch == 4 and len(info.saturation.throughput_flops_per_s) == 5
    assert info.saturation.step_tokens == 4096 and not info.calibrating
    w = Worker.from_info("w", "http://w", info, pinned_theta=None)
    assert w.theta == pytest.approx(theta.flops) and "measured throughput profile" in w.theta_source
    assert w.request_overhead_flops == pytest.approx(overhead) and info.saturation.overhead_prompt_tokens == 32


class _Host:
    """A ``HostLoad`` whose foreign load is planted: ``loads[n]`` cores during the n-th attempt, then none (the
    tests check the profile's logic, not this machine's other load)."""

    cores = 2

    def __init__(self, loads: list[float]) -> None:
        self.loads = list(loads)
        self.attempts = 0

    def wait_quiet(self, limit_cores: float, timeout_s: float) -> float:
        return 0.0

    def sample(self) -> int:
        return 0

    def foreign_cores(self, start, end) -> float:
        self.attempts += 1
        return self.loads[self.attempts - 1] if self.attempts <= len(self.loads) else 0.0


class _Recorder(Readiness):
    """Readiness that notes when it opens among the stand-in's requests."""

    def open(self, why: str) -> None:
        _StandIn.seen.append("ready")
        super().open(why)


def _profile_with(monkeypatch, outcomes: list[bool], keys=None, host=None, readiness=None) -> tuple:
    """Run the profile against the stand-in; the n-th whole profile is usable iff ``outcomes[n]``."""
    from sgl_moe.worker import theta_calibration

    calls = []
    real = saturation.from_throughput

    def judged(points, *args, **kwargs):
        if "overhead_flops" in kwargs:  # the attempt's second call, with the overhead measured at the knee
            return real(points, *args, **kwargs)
        calls.append([c for c, _ in points])
        if not outcomes[len(calls) - 1]:
            raise CalibrationError("the profile is not monotone (planted)")
        return real(points, *args, **kwargs)

    monkeypatch.setattr(theta_calibration.saturation, "from_throughput", judged)
    monkeypatch.setattr(theta_calibration, "PROFILE_RETRY_PAUSE_S", 0.0)
    monkeypatch.setattr(theta_calibration, "PROFILE_REPEATS", 1)
    server = _Server(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _StandIn.seen = []
    try:
        shape = WorkerShape(FLOPS, step_tokens=4096, context_length=4096, vocab_size=4096)
        cal = ThroughputCalibrator(f"http://127.0.0.1:{server.server_address[1]}", lambda: shape, 1.0, 60.0,
                                   **({"keys": keys} if keys else {}), readiness=readiness,
                                   host=host if host is not None else _Host([]))
        cal.start()
        cal._thread.join(120)
        assert not cal._thread.is_alive(), "the profile did not end"
        return cal.current(), calls
    finally:
        server.shutdown()


def test_a_spoiled_profile_is_run_again(monkeypatch):
    theta, calls = _profile_with(monkeypatch, [False, True])
    assert len(calls) == 2 and calls[0] == calls[1] == [1, 2, 4, 8, 16]
    assert theta.state == "calibrated" and theta.details["profile_attempts"] == 2
    assert theta.details["saturation_batch"] == 4


def test_a_profile_never_monotone_keeps_the_fallback_and_says_so(monkeypatch):
    from sgl_moe.worker import theta_calibration

    theta, calls = _profile_with(monkeypatch, [False] * theta_calibration.PROFILE_ATTEMPTS)
    assert len(calls) == theta_calibration.PROFILE_ATTEMPTS
    assert theta.state == "failed" and f"{theta_calibration.PROFILE_ATTEMPTS} profile(s) tried" in theta.source
    assert theta.flops == pytest.approx(FLOPS.request_flops(0, 4096))  # the fallback: one full step


def test_levels_stop_where_the_prompts_would_not_fit_in_the_kv_pool(monkeypatch):
    monkeypatch.setattr(_StandIn, "pool_tokens", 2048)  # eight 256-token prompts
    theta, calls = _profile_with(monkeypatch, [True])
    assert calls == [[1, 2, 4, 8]] and theta.details["kv_pool_tokens"] == 2048
    assert theta.state == "calibrated" and theta.details["saturation_batch"] == 4


def test_a_worker_with_keys_profiles_with_its_own_keys(monkeypatch):
    monkeypatch.setattr(_StandIn, "keys", ("client-key", "admin-key"))
    theta, calls = _profile_with(monkeypatch, [True], keys=lambda: ("client-key", "admin-key"))
    assert theta.state == "calibrated" and not [x for x in _StandIn.seen if x.startswith("401")]
    assert _StandIn.seen[-1] == "/flush_cache"


def test_a_profile_the_worker_refuses_fails_at_once_and_says_why(monkeypatch):
    monkeypatch.setattr(_StandIn, "keys", ("client-key", "admin-key"))
    t0 = time.monotonic()
    theta, calls = _profile_with(monkeypatch, [True], keys=lambda: ("wrong", "wrong"))
    assert theta.state == "failed" and "401" in theta.source and time.monotonic() - t0 < 30


def test_the_worker_is_ready_only_after_the_profile_and_its_flush():
    """``/health`` stays 503 (the readiness closed) through the profile; it opens after the flush of the profile's
    prompts, so no user prefix cached after the first 200 is flushed by the profile."""
    readiness = _Recorder()
    server = _Server(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _StandIn.seen = []
    try:
        shape = WorkerShape(FLOPS, step_tokens=4096, context_length=4096, vocab_size=4096)
        cal = ThroughputCalibrator(f"http://127.0.0.1:{server.server_address[1]}", lambda: shape, 1.0, 120.0,
                                   readiness=readiness, host=_Host([0.0]))
        cal.start()
        time.sleep(0.5)
        assert not readiness.ready and "profile" in readiness.status
        cal._thread.join(120)
    finally:
        server.shutdown()
    assert readiness.ready and cal.current().state == "calibrated"
    assert _StandIn.seen[-2:] == ["/flush_cache", "ready"]


def test_a_disturbed_profile_is_run_again(monkeypatch):
    host = _Host([1.5, 0.1])  # the first attempt shared the host with 1.5 busy cores elsewhere
    theta, calls = _profile_with(monkeypatch, [True, True], host=host)
    assert len(calls) == 2 and host.attempts == 2
    assert theta.state == "calibrated" and theta.details["profile_attempts"] == 2


def test_a_profile_disturbed_every_time_keeps_the_fallback_and_says_so(monkeypatch):
    """The fallback, with state ``disturbed`` and the reason, never the noisy figure; the worker opens anyway."""
    from sgl_moe.worker import theta_calibration

    attempts = theta_calibration.PROFILE_ATTEMPTS
    readiness = Readiness()
    theta, calls = _profile_with(monkeypatch, [True] * attempts, host=_Host([1.5] * attempts), readiness=readiness)
    assert theta.state == "disturbed" and "1.50 of the host's 2 cores" in theta.source
    assert theta.flops == pytest.approx(FLOPS.request_flops(0, 4096)) and readiness.ready


def test_requests_from_elsewhere_during_the_profile_disturb_it(monkeypatch):
    """A client that sends work while the worker is not ready (the gate counts it) spoils that attempt."""
    readiness = Readiness()
    planted = iter([3, 0])

    class _Counting(_Host):
        def sample(self) -> int:  # called at each attempt's start: plant foreign requests into the first
            readiness.foreign_requests += next(planted, 0)
            return 0

    theta, calls = _profile_with(monkeypatch, [True, True], host=_Counting([0.0, 0.0]), readiness=readiness)
    assert len(calls) == 2 and theta.details["profile_attempts"] == 2
