"""GET /sgl_moe/info from a real worker: what a router needs, with no other configuration."""

import json

import httpx
import pytest

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.flops import FlopsModel


def test_info_describes_the_worker(worker):
    info = worker.info
    assert info["model_path"] == DEFAULT_MODEL_DIR.name  # no absolute path without the admin key
    assert info["page_size"] == 16 and info["prefix_caching"] is True
    [events] = info["kv_events"]
    assert events["endpoint"].startswith("tcp://127.0.0.1:") and events["topic"] == "kv"
    assert events["replay_endpoint"].startswith("tcp://127.0.0.1:")
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    assert FlopsModel.from_dict(info["flops"]) == FlopsModel.from_hf_config(config)
    # No weight streaming and no start-up profile (the session worker is the cluster's first, started with
    # --no-moe-theta-profile): Θ is the fixed FLOPs of one full prefill step. The profile's Θ is checked on the
    # fresh worker of test_readiness_live.py.
    sat = info["saturation"]
    assert sat["state"] == "fixed", sat
    assert sat["flops"] == pytest.approx(FlopsModel.from_hf_config(config).request_flops(0, sat["step_tokens"]))
    assert info["context_length"] == config["max_position_embeddings"]
    assert len(info["instance_id"]) == 32


def test_tokenizer_is_served_byte_for_byte(worker):
    body = httpx.get(f"{worker.url}/sgl_moe/tokenizer.json", timeout=30).content
    assert body == (DEFAULT_MODEL_DIR / "tokenizer.json").read_bytes()
    body = httpx.get(f"{worker.url}/sgl_moe/tokenizer_config.json", timeout=30).content
    assert body == (DEFAULT_MODEL_DIR / "tokenizer_config.json").read_bytes()


def test_worker_memory_is_reported(worker):
    assert worker.rss_bytes() > 0


def test_every_tokenizer_file_is_served_byte_for_byte(worker):
    """The files SGLang's AutoTokenizer may read, as the info lists them; nothing else under the route."""
    files = worker.info["tokenizer"]["files"]
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json"} <= set(files)
    for name in files:
        body = httpx.get(f"{worker.url}/sgl_moe/tokenizer/{name}", timeout=30).content
        assert body == (DEFAULT_MODEL_DIR / name).read_bytes(), name
    for name in ("model.safetensors", "..%2Fconfig.json", "expert_predictor/x"):
        assert httpx.get(f"{worker.url}/sgl_moe/tokenizer/{name}", timeout=30).status_code == 404, name
