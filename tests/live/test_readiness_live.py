"""Ready means ready (issue 29): a fresh worker answers ``/health`` 200 only once its start-up Θ profile has
ended, and the first prefix a user caches right after that 200 is still cached a minute later.

Measured before the gate: a 2,032-token prompt sent the moment ``/health`` first answered 200 was cached 0 of
2,032 tokens when sent again 75 s later (the profile, still running, flushed the cache at its end).
"""

from __future__ import annotations

import random
import time

import httpx

from sgl_moe.harness.worker_process import WorkerProcess

PROMPT_TOKENS = 2032
PAGE = 16


def test_first_prefix_after_health_200_is_still_cached_a_minute_later(tmp_path):
    worker = WorkerProcess(log_path=tmp_path / "worker.log", args=["--max-total-tokens", "16384"]).start()
    try:
        starting: list[str] = []
        deadline = time.monotonic() + 600
        with httpx.Client(timeout=10.0) as client:
            while True:
                assert worker.proc.poll() is None, worker.log_tail()
                assert time.monotonic() < deadline, f"not ready in 600 s; saw {starting[-3:]}\n{worker.log_tail()}"
                try:
                    r = client.get(f"{worker.url}/health")
                except httpx.TransportError:
                    time.sleep(0.2)
                    continue
                if r.status_code == 200:
                    break
                assert r.status_code == 503
                starting.append(r.json()["detail"])
                time.sleep(0.2)
            # The gate held while the profile ran, and at the first 200 the profile is over.
            assert any("profile" in s for s in starting), starting
            state = client.get(f"{worker.url}/sgl_moe/info").json()["saturation"]["state"]
            assert state in ("calibrated", "disturbed", "failed"), state
            rng = random.Random(29)
            ids = [rng.randrange(16, 4000) for _ in range(PROMPT_TOKENS)]
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
            first = client.post(f"{worker.url}/generate", json=body, timeout=120).json()["meta_info"]
            assert first["cached_tokens"] == 0
            time.sleep(60)
            again = client.post(f"{worker.url}/generate", json=body, timeout=120).json()["meta_info"]
        assert again["cached_tokens"] >= PROMPT_TOKENS - PAGE, (again, worker.log_tail())
    finally:
        worker.stop()
