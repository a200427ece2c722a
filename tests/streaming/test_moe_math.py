"""The benchmark model's expert arithmetic equals a per-token float64 reference (fresh random inputs)."""

import pytest
import torch
import torch.nn.functional as F

from sgl_moe.streaming.expert_store import LayerWeights
from sgl_moe.streaming.moe_math import expert_offsets, experts_forward, route


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_experts_forward_matches_float64_reference(grouped, seed):
    torch.manual_seed(seed)
    t, h, e, k, i = 50, 32, 8, 2, 16
    x = torch.randn(t, h)
    w = LayerWeights(torch.randn(e, 2 * i, h) / 6, torch.randn(e, h, i) / 4)
    weights, ids = route(torch.randn(t, e), k)
    assert torch.allclose(weights.sum(-1), torch.ones(t))  # renormalised top-k
    out = experts_forward(x, weights, ids, w, grouped=grouped)
    ref = torch.zeros(t, h, dtype=torch.float64)
    for tok in range(t):
        for j in range(k):
            ex = int(ids[tok, j])
            gate, up = (w.w13[ex].double() @ x[tok].double()).split(i)
            ref[tok] += weights[tok, j].double() * (w.w2[ex].double() @ (F.silu(gate) * up))
    # float32 arithmetic: relative error far under 1e-3 (METHOD.md); seen ~2e-7.
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expert_offsets_equal_bincount_cumsum(seed):
    """The sync-free group offsets are exactly cumsum(bincount): experts with no rows, the first and the last."""
    g = torch.Generator().manual_seed(seed)
    e = 16
    ids = torch.randint(0, e, (37, 4), generator=g)
    ids[ids == 3] = 4  # an empty expert in the middle
    ids[0, 0], ids[-1, -1] = 0, e - 1
    flat = ids.reshape(-1)
    got = expert_offsets(flat[torch.argsort(flat, stable=True)], e)
    assert got.dtype == torch.int32
    assert torch.equal(got, torch.cumsum(torch.bincount(flat, minlength=e), 0).to(torch.int32))
    assert expert_offsets(torch.tensor([5, 5, 5]), 8).tolist() == [0, 0, 0, 0, 0, 3, 3, 3]
