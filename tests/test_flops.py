"""FLOPs constants from a model config, checked against parameter counts of the shipped weights."""

import json

import pytest

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.flops import FlopsModel

QWEN3_30B = {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
             "head_dim": 128, "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8,
             "moe_intermediate_size": 768, "intermediate_size": 6144, "decoder_sparse_step": 1, "mlp_only_layers": []}


def test_qwen3_30b_moe_flops_match_the_physics_notes():
    f = FlopsModel.from_hf_config(QWEN3_30B)
    moe_per_layer = 2 * 8 * 3 * 2048 * 768  # physics.md: 75.5 MFLOP per token per layer
    assert moe_per_layer == pytest.approx(75.5e6, rel=1e-3)
    attn_proj = 2 * (2048 * 32 * 128 * 2 + 2 * 2048 * 4 * 128)
    router = 2 * 2048 * 128
    assert f.linear_flops_per_token == 48 * (moe_per_layer + attn_proj + router)
    assert f.attn_flops_per_pair == 4 * 32 * 128 * 48
    assert f.num_moe_layers == 48


def test_linear_flops_equal_twice_the_active_weights_of_the_shipped_model():
    from safetensors import safe_open

    cfg = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    f = FlopsModel.from_hf_config(cfg)
    k, n_experts = cfg["num_experts_per_tok"], cfg.get("num_experts") or cfg["num_local_experts"]
    active = 0
    with safe_open(DEFAULT_MODEL_DIR / "model.safetensors", "np") as st:
        for name in st.keys():
            shape = st.get_slice(name).get_shape()
            if len(shape) != 2 or "embed_tokens" in name or "lm_head" in name:
                continue  # norms are not matmuls; embeddings are lookups; LM head counted apart
            n = shape[0] * shape[1]
            active += n * k / n_experts if ".experts." in name else n
    assert f.linear_flops_per_token == pytest.approx(2 * active)
    assert f.lm_head_flops_per_token == 2 * cfg["hidden_size"] * cfg["vocab_size"]


def test_request_cost_counts_causal_attention_after_prefix_credit():
    f = FlopsModel(linear_flops_per_token=10.0, attn_flops_per_pair=1.0, lm_head_flops_per_token=100.0,
                   num_layers=1, num_moe_layers=1)
    # 3 new tokens after 4 cached: pairs = 3*4 + (1+2+3) = 18
    assert f.request_flops(4, 3) == 3 * 10 + 18 + 100
    # all cached (a repeat): nothing is computed
    assert f.request_flops(7, 0) == 0
    # splitting a prompt into prefix + suffix costs the same as computing it at once
    assert f.request_flops(0, 4) + f.request_flops(4, 3) - 100 == f.request_flops(0, 7)
    with pytest.raises(ValueError):
        f.request_flops(-1, 2)


def test_round_trip_through_json():
    f = FlopsModel.from_hf_config(QWEN3_30B)
    assert FlopsModel.from_dict(json.loads(json.dumps(f.to_dict()))) == f
