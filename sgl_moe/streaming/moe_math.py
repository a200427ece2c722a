"""Reference MoE arithmetic in plain torch: routing and the experts of one layer.

Shapes: T tokens, H hidden, E experts, k experts per token, I expert width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_moe.streaming.expert_store import LayerWeights


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing (Qwen3-MoE): returns (weights [T, k] float32, expert ids [T, k])."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _grouped_matmul(xs: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, counts: list[int] | None) -> torch.Tensor:
    """xs [N, K] (rows grouped by expert) times w[e]^T for each group: [N, out]."""
    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is not None and counts is None:
        return grouped(xs, w.transpose(1, 2), offs=offsets)
    assert counts is not None
    out = xs.new_empty((xs.shape[0], w.shape[1]))
    start = 0
    for e, n in enumerate(counts):
        if n:
            out[start:start + n] = xs[start:start + n] @ w[e].T
        start += n
    return out


_GROUPED_OK: dict[tuple[str, torch.dtype], bool] = {}


def _use_grouped(x: torch.Tensor) -> bool:
    """torch._grouped_mm where this torch build supports it for this device and dtype (checked once)."""
    key = (x.device.type, x.dtype)
    if key not in _GROUPED_OK:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                # The layout experts_forward uses: weights [G, N, K] seen transposed (column-major per group).
                a = torch.ones(64, 32, dtype=x.dtype, device=x.device)
                b = torch.ones(2, 32, 32, dtype=x.dtype, device=x.device).transpose(1, 2)
                out = torch._grouped_mm(a, b, offs=torch.tensor([32, 64], dtype=torch.int32, device=x.device))
                ok = bool(torch.allclose(out.float(), torch.full_like(out.float(), 32.0)))
            except (RuntimeError, TypeError, NotImplementedError):
                ok = False
        _GROUPED_OK[key] = ok
    return _GROUPED_OK[key]


def expert_offsets(sorted_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """End row of each expert's group in ``sorted_ids`` (ascending): int32 [E], cumulative counts.

    Same values as ``cumsum(bincount(ids, minlength=E))`` for ids in [0, E), without a host sync."""
    bounds = torch.arange(num_experts, device=sorted_ids.device, dtype=sorted_ids.dtype)
    return torch.searchsorted(sorted_ids, bounds, right=True).to(torch.int32)


def experts_forward(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w: LayerWeights,
                    grouped: bool | None = None) -> torch.Tensor:
    """Σ_j weights[t, j] · down(silu(gate(x_t)) · up(x_t)) over the k experts ids[t, j]; returns [T, H].

    Tokens are sorted by expert so each expert runs one matmul over its rows (grouped GEMM where available).
    """
    t, k = ids.shape
    e = w.w13.shape[0]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token_of = order // k
    xs = x[token_of]  # [T·k, H] grouped by expert
    use_grouped = _use_grouped(x) if grouped is None else grouped
    # offsets[e] = rows of experts 0..e, found in the sorted ids on the device. (torch.bincount would read the
    # largest id on the host: a device→host sync per call on a GPU, blocking the issuing thread.)
    offsets = expert_offsets(flat[order], e)
    # The per-expert loop needs the row counts on the host (one read); the grouped GEMM needs none.
    host_counts = None if use_grouped else torch.diff(offsets, prepend=offsets.new_zeros(1)).tolist()
    gate_up = _grouped_matmul(xs, w.w13, offsets, host_counts)  # [T·k, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate) * up
    down = _grouped_matmul(act, w.w2, offsets, host_counts)  # [T·k, H]
    scale = weights.reshape(-1)[order].to(down.dtype).unsqueeze(-1)
    # Back to token order and a sum over each token's k experts: deterministic (no atomic scatter-add).
    unsorted = torch.empty_like(down)
    unsorted[order] = down * scale
    return unsorted.view(t, k, -1).sum(dim=1)
