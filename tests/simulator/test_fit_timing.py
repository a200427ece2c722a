"""``calibrate`` against a fake worker whose time follows a known model: the fit recovers the model."""

import json

import httpx
import pytest

from sgl_moe.simulator import load
from sgl_moe.simulator.fit_timing import calibrate, main, overlap_of
from sgl_moe.simulator.timing_model import cpu_tiny

TRUE = {"fixed": 0.012, "token_s": 2.0e-4, "pair_s": 3.0e-8, "context_token_s": 5.0e-5}
PAGE = 16


class FakeWorker:
    """A worker with a radix cache of pages whose every /generate lasts the model's time on a fake clock."""

    def __init__(self):
        self.now = 0.0
        self.pages: set[tuple] = set()

    def clock(self):
        return self.now

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/sgl_moe/info":
            return httpx.Response(200, json={"model_name": "tiny", "page_size": PAGE,
                                             "flops": cpu_tiny().flops.to_dict(),
                                             "saturation": {"flops": 1.5e12, "step_tokens": 4096}})
        if path == "/get_server_info":
            return httpx.Response(200, json={"max_total_num_tokens": 65536, "chunked_prefill_size": 4096,
                                             "device": "cpu", "disable_overlap_schedule": False})
        if path == "/flush_cache":
            self.pages.clear()
            return httpx.Response(200)
        ids = json.loads(request.content)["input_ids"]
        n = len(ids)
        hit = 0
        while (hit + 1) * PAGE <= n - 1 and tuple(ids[: (hit + 1) * PAGE]) in self.pages:
            hit += 1
        cached = hit * PAGE
        for k in range(1, n // PAGE + 1):
            self.pages.add(tuple(ids[: k * PAGE]))
        s = n - cached
        self.now += (TRUE["fixed"] + TRUE["token_s"] * s + TRUE["pair_s"] * (s * cached + s * (s + 1) / 2)
                     + TRUE["context_token_s"] * n)
        return httpx.Response(200, json={"text": "x", "meta_info": {"prompt_tokens": n, "cached_tokens": cached}})


def test_fit_recovers_the_workers_timing_and_reads_its_info(tmp_path):
    fake = FakeWorker()
    client = httpx.Client(transport=httpx.MockTransport(fake.handler))
    result = calibrate("http://worker", client=client, repeats=2, burst=0, shape=(64, 16), shaped_bursts=(1, 2),
                       clock=fake.clock)
    terms = result["fit"]["terms"]
    assert terms["step_s"] + terms["request_s"] == pytest.approx(TRUE["fixed"], rel=1e-3)
    for name in ("token_s", "pair_s", "context_token_s"):
        assert terms[name] == pytest.approx(TRUE[name], rel=1e-3)
    assert result["fit"]["max_relative_error"] < 1e-3
    assert {m["label"].split()[0] for m in result["measurements"]} == {"cold", "repeat", "half-cached", "cached"}
    shaped = [m for m in result["measurements"] if "burst" in m["label"]]
    assert [(m["label"], m["requests"], m["computed"]) for m in shaped[:4]] == [
        ("cold burst 1x80", 1, 80), ("cached burst 1x64+16", 1, 16), ("cold burst 2x80", 2, 160),
        ("cached burst 2x64+16", 2, 32)]
    assert any(m["label"].startswith("repeat") and m["computed"] <= PAGE for m in result["measurements"])
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(result))
    cal = load(str(path))
    assert (cal.step_tokens, cal.cache_tokens, cal.theta) == (4096, 65536, 1.5e12)
    assert cal.overlap == "sync"  # SGLang's overlap loop on a CPU: results after the next step's compute
    assert cal.token_s == pytest.approx(TRUE["token_s"], rel=1e-3)


def test_overlap_comes_from_the_workers_server_args():
    assert overlap_of({"device": "cuda", "disable_overlap_schedule": False}) == "async"
    assert overlap_of({"device": "cpu", "disable_overlap_schedule": True}) == "off"
    assert overlap_of({}) == "off"  # no server info: nothing assumed


def test_cli_reports_an_unreachable_worker_in_one_line(capsys):
    assert main(["--worker-url", "http://127.0.0.1:9", "--repeats", "1"]) == 1
    assert "cannot measure" in capsys.readouterr().err
