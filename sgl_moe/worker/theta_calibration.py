"""Θ calibration on a running worker (seed 000 App. B.4), from SGLang's HTTP process.

Once the server answers ``/health``, the calibrator asks the scheduler (``profile_handshake``) to time the
next forward of at least S tokens, sends one ``/generate`` of random token ids filling the worker's
largest step (S = min(step, context - 8) tokens per prompt, step // S prompts in one batch), waits for the
per-layer profile and turns it into Θ with Eq. 3. Until then ``/sgl_moe/info`` reports the fallback
α · F_ref with state ``calibrating``; the router re-reads the info until the state changes.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from sgl_moe import saturation
from sgl_moe.flops import FlopsModel
from sgl_moe.patches import profile_handshake
from sgl_moe.saturation import CalibrationError, SaturationThreshold
from sgl_moe.worker.host_load import HostLoad
from sgl_moe.worker.readiness import Readiness

log = logging.getLogger("sgl_moe.calibration")


@dataclass(frozen=True)
class WorkerShape:
    """What the calibration needs from SGLang's resolved arguments (available once the server is up)."""

    flops: FlopsModel
    step_tokens: int
    context_length: int
    vocab_size: int


Keys = Callable[[], tuple[str | None, str | None]]
"""The worker's own ``(--api-key, --admin-api-key)``, read when the calibration runs."""


def _no_keys() -> tuple[None, None]:
    return None, None


class Calibrator:
    """The streaming calibration; the worker's ``/health`` stays 503 (``readiness``) until it ends."""

    def __init__(self, base_url: str, profile_dir: str, shape: Callable[[], WorkerShape], margin: float,
                 timeout_s: float, keys: Keys = _no_keys, readiness: Readiness | None = None) -> None:
        self.base_url = base_url
        self._keys = keys
        self.readiness = readiness if readiness is not None else Readiness()
        self.profile_dir = profile_dir
        self._shape = shape
        self.margin = margin
        self.timeout_s = timeout_s
        self.result: SaturationThreshold | None = None
        self._thread = threading.Thread(target=self._run_then_open, name="sgl_moe-calibration", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run_then_open(self) -> None:
        try:
            self._run()
        finally:
            result = self.result
            self.readiness.open(f"Θ {result.state}: {result.flops:.4g} FLOPs" if result else "Θ not set")

    def current(self) -> SaturationThreshold:
        """The calibrated Θ, or the fallback (state ``calibrating``) while the profile is pending."""
        if self.result is not None:
            return self.result
        shape = self._shape()
        return saturation.without_transfer(shape.flops.request_flops(0, shape.step_tokens), shape.step_tokens,
                                           self.margin, state="calibrating", why="fallback until calibrated")

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        try:
            self._wait_healthy(deadline)
            self.readiness.say("Θ calibration: one profiled forward")
            shape = self._shape()
            per_prompt = max(16, min(shape.step_tokens, shape.context_length - 8))
            prompts = max(1, shape.step_tokens // per_prompt)
            profile_handshake.request(self.profile_dir, per_prompt)
            rng = random.Random(0)
            ids = [[rng.randrange(16, shape.vocab_size) for _ in range(per_prompt)] for _ in range(prompts)]
            log.info("calibrating Θ: one profile forward of %d prompt(s) x %d tokens", prompts, per_prompt)
            self._post("/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}, deadline)
            profile = self._wait_profile(deadline)
            tokens = int(profile["tokens"])
            # The profiled forward ran tokens / per_prompt whole prompts of the batch.
            f_ref = shape.flops.request_flops(0, per_prompt) * tokens / per_prompt
            self.result = saturation.calibrated(profile["layers"], f_ref, tokens, self.margin)
            log.info("Θ = %.4g FLOPs: %s", self.result.flops, self.result.source)
        except Exception as exc:  # noqa: BLE001 - a failed calibration keeps the fallback and says why
            fallback = self.current()
            self.result = SaturationThreshold(fallback.flops, f"calibration failed ({exc}); kept the fallback: "
                                                              f"{fallback.source}", "failed", fallback.details)
            log.warning("Θ calibration failed: %s; keeping the fallback %.4g FLOPs", exc, fallback.flops)

    def _wait_healthy(self, deadline: float) -> None:
        """Until SGLang's own ``/health`` answers 200 (its warm-up done); the gate lets this probe through."""
        self.readiness.say("SGLang warming up")
        while time.monotonic() < deadline:
            try:
                req = urllib.request.Request(self.base_url + "/health", headers=self.headers())
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError("the server did not become healthy in time")

    def headers(self, *, admin: bool = False) -> dict[str, str]:
        """What SGLang's middleware asks of this worker's own requests: its --api-key on normal routes (none
        without one); on admin routes (``/flush_cache``) its --admin-api-key, else its --api-key."""
        api_key, admin_key = self._keys()
        key = (admin_key or api_key) if admin else api_key
        return {"Content-Type": "application/json", **self.readiness.own_headers(),
                **({"Authorization": f"Bearer {key}"} if key else {})}

    def _post(self, path: str, body: dict, deadline: float, *, admin: bool = False) -> None:
        req = urllib.request.Request(self.base_url + path, data=json.dumps(body).encode(),
                                     headers=self.headers(admin=admin))
        with urllib.request.urlopen(req, timeout=max(1.0, deadline - time.monotonic())) as resp:
            resp.read()

    def _wait_profile(self, deadline: float) -> dict:
        while time.monotonic() < deadline:
            profile = profile_handshake.read_profile(self.profile_dir)
            if profile is not None:
                return profile
            time.sleep(0.2)
        raise TimeoutError("no forward of the requested size was profiled")


PROFILE_PROMPT_TOKENS = 256
"""Tokens per prompt of the throughput profile (a typical prefill-only prompt; capped by the step)."""
OVERHEAD_PROMPT_TOKENS = 32
"""Tokens per prompt of the short requests timed at the saturation level to find a request's fixed cost
(about what a prefix-cache hit computes: its own suffix)."""
PROFILE_MAX_CONCURRENCY = 32
PROFILE_ROUNDS = 3
"""Requests each concurrent client sends one after another at each level."""
PROFILE_REPEATS = 2
"""Times each level is measured; the fastest counts (another process on the host only ever slows a level)."""
PROFILE_ATTEMPTS = 3
"""Whole profiles tried before a non-monotone result (the host's other load) is given up on."""
PROFILE_RETRY_PAUSE_S = 5.0
QUIET_HOST_FRACTION = 0.25
"""A profile counts as disturbed when processes outside the worker used more than this fraction of the host's
cores on average while it ran (``HostLoad``); before each attempt the profile waits for a window that quiet."""
QUIET_WAIT_S = 120.0
"""The longest a profile waits for a quiet host before it runs anyway (and is then likely disturbed)."""


class ProfileDisturbed(CalibrationError):
    """The profile measured more than this worker: other requests or other processes' CPU during it."""


PROFILE_LOCK = Path(tempfile.gettempdir()) / "sgl_moe_theta_profile.lock"
"""Workers sharing a host profile one at a time (each would otherwise measure the others' profiles)."""


@contextmanager
def _host_profile_lock():
    import fcntl

    with open(PROFILE_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class ThroughputCalibrator(Calibrator):
    """Θ for a worker without weight streaming: the in-flight work where throughput stops growing.

    The same handshake as the streaming calibration: ``/sgl_moe/info`` reports the fallback with state
    ``calibrating`` until the profile ends, and the router re-reads the info until the state changes. Once the
    server answers ``/health``, c clients (c = 1, 2, 4, ... while c prompts fit in the KV pool) each send
    ``PROFILE_ROUNDS`` one-prompt ``/generate`` requests of random token ids (never a cache hit) back to back, so c
    requests are in flight as the router would keep them: SGLang batches them and overlaps its own per-request work
    (HTTP, tokenizer manager, scheduling) with the forwards; one untimed round of every level comes first (a CPU
    backend builds its kernels on the first batch of each shape). Θ is the FLOPs of the fewest requests in flight
    that reach ``saturation.KNEE_FRACTION`` of the best FLOPs/s measured up to ``PROFILE_MAX_CONCURRENCY``. At that
    level, short prompts (``OVERHEAD_PROMPT_TOKENS``) are timed too: the two sizes give a request's fixed cost in
    FLOPs-equivalent (``saturation.request_overhead``), which the router adds to every prompt's FLOPs (a
    prefix-cache hit is not free where HTTP, scheduling and a forward's fixed work dominate), and which Θ counts the
    same way. Then it flushes the prefix cache of the random prompts. Workers on one host profile one at a time
    (``PROFILE_LOCK``), so none measures another's profile; each level is timed ``PROFILE_REPEATS`` times and the
    fastest kept, and a profile that is still not monotone (a sibling worker loading its model meanwhile) is run
    again, up to ``PROFILE_ATTEMPTS`` times. A profile during which anyone else sent the worker work
    (``Readiness.foreign_requests``) or other processes kept more than ``QUIET_HOST_FRACTION`` of the host's cores
    busy (``HostLoad``) is disturbed: it is run again after the host is quiet, and after ``PROFILE_ATTEMPTS``
    disturbed ones the fallback is kept with state ``disturbed`` (a noisy Θ is worse than the fallback: once
    one ran into traffic and published 437 x the fallback). The worker's ``/health`` answers 503 until the
    profile ends (``readiness``), so no router sends it traffic meanwhile, and its cache flush never drops a
    user's prefix. Tens of seconds on an idle 2-core host; a worker given ``--moe-saturation-flops`` or
    ``--no-moe-theta-profile`` skips it.
    """

    def __init__(self, base_url: str, shape: Callable[[], WorkerShape], margin: float, timeout_s: float,
                 keys: Keys = _no_keys, readiness: Readiness | None = None, host: HostLoad | None = None) -> None:
        super().__init__(base_url, "", shape, margin, timeout_s, keys, readiness)
        self.host = host if host is not None else HostLoad()

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        try:
            self._wait_healthy(deadline)
            self.readiness.say("Θ throughput profile: waiting for the host's other workers to finish theirs")
            with _host_profile_lock():
                self._profile(deadline)
        except Exception as exc:  # noqa: BLE001 - a failed profile keeps the fallback and says why
            fallback = self.current()
            why = f"throughput profile failed ({exc}); kept the fallback: {fallback.source}"
            self.result = SaturationThreshold(fallback.flops, why, "failed", fallback.details)
            log.warning("Θ throughput profile failed: %s; keeping the fallback %.4g FLOPs", exc, fallback.flops)

    def _profile(self, deadline: float) -> None:
        """Time every level of requests in flight, then set ``result`` (the host lock held)."""
        from concurrent.futures import ThreadPoolExecutor

        t_start = time.monotonic()
        shape = self._shape()
        per_prompt = max(16, min(PROFILE_PROMPT_TOKENS, shape.step_tokens, shape.context_length - 8))
        prompt_flops = shape.flops.request_flops(0, per_prompt)
        rng = random.Random(0)
        lock = threading.Lock()

        def prompt(tokens: int) -> list[int]:
            with lock:
                return [rng.randrange(16, shape.vocab_size) for _ in range(tokens)]

        def client(rounds: int, tokens: int) -> None:
            # One kept-alive connection per client, as a router's pool keeps them: a burst of new connections
            # per round measured connection set-up (seconds-long stalls seen on a loaded host), not the worker.
            url = urllib.parse.urlsplit(self.base_url)
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=max(1.0, deadline - time.monotonic()))
            try:
                for _ in range(rounds):
                    body = json.dumps({"input_ids": prompt(tokens), "sampling_params": {"max_new_tokens": 1}})
                    conn.request("POST", "/generate", body=body, headers=self.headers())
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        raise CalibrationError(f"a profile request got HTTP {resp.status}")
            finally:
                conn.close()

        def level_seconds(c: int, repeats: int = PROFILE_REPEATS, rounds: int = PROFILE_ROUNDS,
                          tokens: int = per_prompt) -> float:
            times = []
            for _ in range(repeats):
                with ThreadPoolExecutor(c) as pool:
                    t0 = time.perf_counter()
                    for f in [pool.submit(client, rounds, tokens) for _ in range(c)]:
                        f.result()
                    times.append((time.perf_counter() - t0) / rounds)
            return min(times)

        pool_tokens = self._kv_pool_tokens()
        # More requests than the KV pool holds only queue inside SGLang (and a full pool thrashes): no level
        # offers more prompt tokens than the pool has.
        levels = [c for c in (2 ** i for i in range(PROFILE_MAX_CONCURRENCY.bit_length()))
                  if c <= PROFILE_MAX_CONCURRENCY and (c == 1 or not pool_tokens or c * per_prompt <= pool_tokens)]
        limit = QUIET_HOST_FRACTION * self.host.cores
        self.readiness.say("Θ throughput profile: warming up each batch shape")
        for c in levels:  # warm-up, untimed: a CPU backend builds its kernels on the first batch of each shape
            level_seconds(c, repeats=1, rounds=1)
        for attempt in range(1, PROFILE_ATTEMPTS + 1):
            wait_s = min(QUIET_WAIT_S, max(0.0, deadline - time.monotonic() - 60))
            self.readiness.say(f"Θ throughput profile: attempt {attempt} of {PROFILE_ATTEMPTS} waits up to "
                               f"{wait_s:.0f} s for a quiet host (other processes on at most {limit:.2f} of its "
                               f"{self.host.cores} cores)")
            quiet = self.host.wait_quiet(limit, wait_s)
            if quiet > limit:
                log.info("the host stayed busy (%.2f cores outside this worker) for %.0f s; profiling anyway",
                         quiet, wait_s)
            self.readiness.say(f"Θ throughput profile: attempt {attempt} of {PROFILE_ATTEMPTS}, levels {levels}")
            foreign_before, load_start = self.readiness.foreign_requests, self.host.sample()
            try:
                points = [(c, level_seconds(c)) for c in levels]
                try:
                    knee = saturation.from_throughput(points, prompt_flops, per_prompt, self.margin, 0.0)
                    overhead, why = self._overhead(knee.details["saturation_batch"], dict(points), level_seconds,
                                                   shape.flops, per_prompt)
                    result = saturation.from_throughput(points, prompt_flops, per_prompt, self.margin,
                                                        time.monotonic() - t_start, overhead_flops=overhead)
                    failure = None
                except saturation.CalibrationError as exc:
                    failure = exc
                # Checked first: a non-monotone profile is most often the other load's doing.
                disturbed = self._disturbance(foreign_before, load_start, limit)
                if disturbed:
                    raise ProfileDisturbed(disturbed)
                if failure is not None:
                    raise failure
            except saturation.CalibrationError as exc:
                self._flush(deadline)
                if attempt == PROFILE_ATTEMPTS or time.monotonic() + PROFILE_RETRY_PAUSE_S >= deadline:
                    if isinstance(exc, ProfileDisturbed):
                        self._keep_fallback_disturbed(str(exc), attempt)
                        return
                    raise CalibrationError(f"{exc}; {attempt} profile(s) tried") from None
                log.info("Θ profile %d of %d not usable (%s); again in %.0f s", attempt, PROFILE_ATTEMPTS, exc,
                         PROFILE_RETRY_PAUSE_S)
                time.sleep(PROFILE_RETRY_PAUSE_S)
                continue
            self._flush(deadline)
            self.result = replace(result, details={**result.details, "profile_attempts": attempt,
                                                   "kv_pool_tokens": pool_tokens,
                                                   "overhead_prompt_tokens": OVERHEAD_PROMPT_TOKENS})
            if why:
                log.info("request overhead not measured: %s", why)
            log.info("Θ = %.4g FLOPs: %s", self.result.flops, self.result.source)
            return

    def _disturbance(self, foreign_before: int, load_start, limit: float) -> str | None:
        """Why the attempt that started at ``load_start`` measured more than this worker, or None."""
        foreign = self.readiness.foreign_requests - foreign_before
        cores = self.host.foreign_cores(load_start, self.host.sample())
        parts = []
        if foreign:
            parts.append(f"{foreign} request(s) from elsewhere arrived during the profile")
        if cores > limit:
            parts.append(f"other processes used {cores:.2f} of the host's {self.host.cores} cores (limit {limit:.2f})")
        return "; ".join(parts) or None

    def _keep_fallback_disturbed(self, last: str, attempts: int) -> None:
        fallback = self.current()
        why = (f"the throughput profile was disturbed ({attempts} tried; the last: {last}); kept the fallback: "
               f"{fallback.source}")
        self.result = SaturationThreshold(fallback.flops, why, "disturbed",
                                          {**fallback.details, "profile_attempts": attempts})
        log.warning("Θ: %s", why)

    @staticmethod
    def _overhead(batch: int, points: dict[int, float], level_seconds: Callable[..., float], flops: FlopsModel,
                  per_prompt: int) -> tuple[float, str | None]:
        """A request's fixed cost in FLOPs-equivalent and, when it is 0 for want of a measurement, why: short
        prompts timed at the saturation level against the profile's own prompts there."""
        short = OVERHEAD_PROMPT_TOKENS
        if short >= per_prompt:
            return 0.0, f"the profile's prompts ({per_prompt} tokens) are no longer than the short ones"
        level_seconds(batch, repeats=1, rounds=1, tokens=short)  # warm-up: a new batch shape
        t_short = level_seconds(batch, tokens=short) / batch
        t_long = points[batch] / batch
        overhead = saturation.request_overhead((flops.request_flops(0, per_prompt), t_long),
                                               (flops.request_flops(0, short), t_short))
        if overhead is None:
            return 0.0, (f"{short}-token requests ({t_short * 1e3:.2f} ms) were not faster than {per_prompt}-token "
                         f"ones ({t_long * 1e3:.2f} ms) at {batch} in flight")
        log.info("request overhead: %.3g FLOPs (%d in flight: %.2f ms per %d-token request, %.2f ms per %d-token "
                 "one)", overhead, batch, t_long * 1e3, per_prompt, t_short * 1e3, short)
        return overhead, None

    def _kv_pool_tokens(self) -> int | None:
        """The worker's KV pool in tokens (SGLang's ``max_total_num_tokens``), None if it does not say."""
        try:
            req = urllib.request.Request(self.base_url + "/get_server_info", headers=self.headers())
            with urllib.request.urlopen(req, timeout=30) as resp:
                value = json.loads(resp.read()).get("max_total_num_tokens")
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return int(value) if isinstance(value, int | float) and value > 0 else None

    def _flush(self, deadline: float) -> None:
        """Drop the profile's random prompts from the prefix cache (SGLang refuses while requests run)."""
        while time.monotonic() < deadline:
            try:
                self._post("/flush_cache", {}, deadline, admin=True)
                return
            except urllib.error.HTTPError as exc:
                if exc.code in (401, 403):
                    raise CalibrationError(f"the worker refused its own /flush_cache (HTTP {exc.code})") from None
                time.sleep(0.2)
