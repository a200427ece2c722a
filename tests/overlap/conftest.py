"""Tiny decode and prefill stacks shared by the overlap tests (CPU, float32)."""

import pytest

from sgl_moe.offload.decode_stack import DecodeStack
from sgl_moe.overlap.costs import CostModel
from sgl_moe.streaming.moe_stack import MoEStack, MoEStackConfig

LAYERS = 3


@pytest.fixture(scope="session")
def tiny_cfg() -> MoEStackConfig:
    return MoEStackConfig.tiny(layers=LAYERS)


@pytest.fixture(scope="session")
def decode_stack(tiny_cfg) -> DecodeStack:
    return DecodeStack(tiny_cfg, "cpu", context=32)


@pytest.fixture(scope="session")
def prefill_stack(tiny_cfg) -> MoEStack:
    return MoEStack(tiny_cfg, "cpu")


@pytest.fixture(scope="session")
def model() -> CostModel:
    return CostModel(attn_alpha=1e-5, attn_beta=1e-7, attn_gamma=1e-6, moe_alpha=1e-5, moe_beta=1e-5)
