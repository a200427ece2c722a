"""Signals: the quasi-hidden state, default vectors and router-based prediction against direct computation."""

import math

import torch

from sgl_moe.prediction.activations import _expert_outputs_sum
from sgl_moe.prediction.signals import DefaultVectors, quasi_hidden, recall_at_k, router_predict


def test_quasi_hidden_matches_a_hand_computation():
    g = torch.Generator().manual_seed(0)
    r, d, w = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g), torch.randn(5, generator=g)
    eps = 1e-6
    got = quasi_hidden(r.to(torch.bfloat16).float(), d, w, eps)
    rb = r.to(torch.bfloat16).float()
    for t in range(3):
        x = [float(rb[t, i] + d[t, i]) for i in range(5)]
        scale = 1 / math.sqrt(sum(v * v for v in x) / 5 + eps)
        for i in range(5):
            assert math.isclose(float(got[t, i]), x[i] * scale * float(w[i]), rel_tol=1e-5, abs_tol=1e-6)


def test_default_vectors_are_the_per_expert_mean_of_unweighted_outputs():
    g = torch.Generator().manual_seed(0)
    T, H, I, E = 40, 6, 4, 5
    x = torch.randn(T, H, generator=g)
    gate_up, down = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    ids = torch.stack([torch.randperm(E - 1, generator=g)[:2] for _ in range(T)])  # expert E-1 never routed
    sums, counts = torch.zeros(1, E, H, dtype=torch.float64), torch.zeros(1, E, dtype=torch.long)
    _expert_outputs_sum(x, ids, gate_up, down, sums[0], counts[0])
    vectors = DefaultVectors.from_sums(sums, counts).vectors[0]
    for e in range(E):
        outs = []
        for t in range(T):
            if e in ids[t].tolist():
                gate, up = (gate_up[e] @ x[t]).chunk(2)
                outs.append(down[e] @ (torch.nn.functional.silu(gate) * up))
        want = torch.stack(outs).mean(0) if outs else torch.zeros(H)
        torch.testing.assert_close(vectors[e], want, rtol=1e-5, atol=1e-5)


def test_layer_default_is_the_routing_weighted_sum():
    vectors = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    dv = DefaultVectors(vectors)
    weights = torch.tensor([[0.75, 0.25]])
    ids = torch.tensor([[2, 0]])
    torch.testing.assert_close(dv.layer_default(1, weights, ids), 0.75 * vectors[1, 2:3] + 0.25 * vectors[1, 0:1])


def test_router_predict_on_the_true_router_input_reproduces_hf_routing():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    cfg = Qwen3MoeConfig(hidden_size=32, num_experts=16, num_experts_per_tok=2, norm_topk_prob=True)
    gate = Qwen3MoeTopKRouter(cfg)
    torch.manual_seed(0)
    torch.nn.init.normal_(gate.weight)
    s = torch.randn(200, 32)
    _, want_w, want_ids = gate(s)
    got_w, got_ids = router_predict(s, gate.weight.detach(), top_k=2)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w.float())
    assert recall_at_k(got_ids, want_ids).min().item() == 1.0


def test_recall_at_k_counts_the_overlap_regardless_of_order():
    pred = torch.tensor([[1, 2], [3, 4], [5, 6]])
    true = torch.tensor([[2, 1], [4, 9], [7, 8]])
    assert recall_at_k(pred, true).tolist() == [1.0, 0.5, 0.0]
