"""A router in front of real workers finds its token ids equal to theirs (``tokenizer_probe``): the shipped
model, and the Qwen2Tokenizer fixture (byte-level BPE, ChatML template)."""

import httpx
import pytest


def _checks(router) -> list[dict]:
    return [w["tokenizer_check"] for w in httpx.get(f"{router.url}/workers", timeout=10).json()["workers"]]


def _assert_match(router, chat: bool) -> None:
    for check in _checks(router):
        assert check["state"] == "match", check
        if chat:  # every text probe and the chat probe
            assert check["probes"] >= 9 and check["detail"] == "", check
        else:  # the shipped tokenizer has no chat template: the text probes only
            assert check["probes"] >= 8 and "no chat template" in check["detail"], check
    metrics = httpx.get(f"{router.url}/metrics", timeout=10).text
    assert "sgl_moe_router_tokenizer_mismatches_total 0.0" in metrics


def test_shipped_model_matches(cluster, router_factory):
    _assert_match(router_factory(cluster), chat=False)


@pytest.mark.parametrize("worker_group", ["fixture-models"], indirect=True)  # conftest.py: shared worker
def test_qwen_fixture_matches(worker_group, router_factory):
    _assert_match(router_factory([worker_group["qwen"]]), chat=True)
