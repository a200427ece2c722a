"""How long a simulated worker takes: per-step, per-request, per-token and per-attention-pair seconds.

One linear model covers both presets. A step that computes chunks ``(s new tokens after p tokens
already in the KV cache)`` lasts

    step_s + Σ [request_s (a request's first chunk) + token_s·s + pair_s·(s·p + s(s+1)/2)
                + context_token_s·(p + s)]

and, when weight transfers must be hidden, at least the transfer time of one forward pass.

* ``cpu_tiny``: the shipped tiny model on this 2-core CPU (SGLang's CPU engine, torch-native attention).
  Defaults come from two sequential measurements in ``/work/shared/notes/sglang-facts.md`` (1,024 and
  2,048 tokens, uncached vs cached); ``python -m sgl_moe.simulator.fit_timing`` measures a running worker
  and writes a JSON that replaces them. ``context_token_s`` is the CPU attention backend's cost of
  gathering the cached KV of a request: a fully cached 2,048-token prompt takes twice a 1,024-token one.
* ``h100_30b``: Qwen3-30B-A3B-like (bf16) on one H100: FLOPs per token and per pair from the model's config
  (``FlopsModel``), executed at ``MFU`` of the 989 TFLOP/s bf16 peak, plus a fixed ``H100_LAYER_FIXED_S`` per layer
  and step; expert transfers per MoE layer (all but the first, which every GPU keeps) of 2.9 ms over NVLink
  (all-gather across 8 GPUs, physics.md) or ``PCIE_LAYER_S`` over PCIe (whole layer from pinned host memory).
  Measured on one H100 by the GPU suite (benchmarks/results/gpu/2026-11-26-h100/streaming_bench.json: the
  project's torch MoE stack at Qwen3-30B-A3B layer shapes, 8 layers, 4,096-token sequences, resident weights):
  a forward of T tokens took 3.74 ms + 4.11 µs·T (4k-128k tokens, within 2%), i.e. per layer 0.47 ms fixed
  (about one read of the layer's 1.21 GB of experts from HBM: 0.42 ms at 2.9 TB/s) and a marginal 29% of peak;
  one layer's experts copied from pinned memory in 22.0 ms. Until then the model assumed MFU 0.40, 1.5 ms per
  step and 22.8 ms per layer. Still assumed: the NVLink gather, the per-request overhead and the KV capacity;
  the measured stack is the project's torch reference (grouped GEMM, SDPA), not SGLang's fused kernels.

Both presets run SGLang's overlap scheduler, SGLang's default (``Calibration.overlap``): with requests waiting, a
step's results (its pages into the radix tree, its memory freed, its answers) are processed only after the next
step has been admitted; after its launch on a GPU (``async``), after its compute on a CPU (``sync``). Before
2026-11-26 the simulator processed them at the end of the step, which let a follower reuse, in the very next
step, a prefix SGLang had not yet inserted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from sgl_moe import DEFAULT_MODEL_DIR, saturation
from sgl_moe.flops import FlopsModel
from sgl_moe.saturation import SaturationThreshold
from sgl_moe.worker.theta_calibration import PROFILE_MAX_CONCURRENCY, PROFILE_PROMPT_TOKENS

Overlap = Literal["off", "async", "sync"]
Transfer = Literal["none", "nvlink", "pcie"]
"""Weight transfers each forward pass must hide: none (weights resident), NVLink all-gather, PCIe stream."""

H100_BF16_PEAK = 989e12
"""FLOP/s, dense bf16 tensor peak of an H100 SXM (physics.md)."""
MFU = 0.29
"""Model FLOPs utilisation of an H100 per added prefill token: measured 0.290 (the slope of a forward's time over
4k-128k tokens, GPU suite 2026-11-26; the seed reports 30-36% overall). Was an assumed 0.40."""
H100_LAYER_FIXED_S = 0.467e-3
"""A forward's fixed time per layer on an H100 (the intercept of the same fit; ~ one HBM read of the layer's
experts). Was an assumed 1.5 ms per step for all 48 layers, a fifteenth of what reading the weights takes."""
NVLINK_LAYER_S = 2.9e-3
"""All-gather of one MoE layer's experts across 8 GPUs over NVLink (physics.md; not measured: one GPU lent)."""
PCIE_LAYER_S = 22.04e-3
"""Copy of one MoE layer's experts (1.21 GB) from pinned host memory: measured 22.04 ms (54.8 GB/s) on an H100
(GPU suite 2026-11-26); physics.md's estimate was 22.8 ms."""

QWEN3_30B_A3B: dict[str, Any] = {
    "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8,
    "moe_intermediate_size": 768, "intermediate_size": 6144, "decoder_sparse_step": 1, "mlp_only_layers": [],
}
"""The parts of Qwen3-30B-A3B's ``config.json`` that ``FlopsModel.from_hf_config`` reads."""


@dataclass(frozen=True)
class Calibration:
    """Timing and capacity of one simulated worker, and the FLOPs constants the router sees."""

    name: str
    """Preset name, or where a measured calibration came from."""
    flops: FlopsModel
    """What the worker reports in ``/sgl_moe/info``: the router's cost model uses it."""
    step_s: float
    """Fixed cost of one forward pass (scheduling, kernel launches)."""
    request_s: float
    """Cost per request, paid in the step that computes its first chunk (LM head, HTTP, bookkeeping)."""
    token_s: float
    """Seconds per computed prompt token (linear layers)."""
    pair_s: float
    """Seconds per causal attention (query, key) pair."""
    context_token_s: float = 0.0
    """Seconds per token of KV a chunk attends (cached prefix + the chunk); the CPU backend gathers it."""
    step_tokens: int = 8192
    """New tokens one forward pass computes at most (chunked prefill budget)."""
    cache_tokens: int = 131072
    """KV cache capacity in tokens (radix cache plus running requests)."""
    page_size: int = 16
    """KV page size: the unit of prefix caching and of the router's block hashes."""
    theta_flops: float | None = None
    """Θ the worker reports; ``None``: what a live worker measures at start-up, its throughput profile run on
    this model (``profiled_theta``)."""
    nvlink_transfer_s: float = 0.0
    """Expert transfer per forward pass over NVLink (all MoE layers but the first)."""
    pcie_transfer_s: float = 0.0
    """Expert transfer per forward pass over PCIe."""
    shared_compute: float | None = None
    """Workers that can compute at full speed at once on one shared machine (CPU workers on the same
    cores): a step starting while k workers are busy lasts k / shared_compute times longer (k > it).
    ``None``: each worker has its own device."""
    event_delay_s: float = 0.001
    """From a cache change on the worker to the router applying its KV event."""
    overlap: Overlap = "off"
    """SGLang's overlap scheduler (its default): when requests are waiting at the end of a step, the next step is
    admitted and launched before the finished step's results are processed, so the finished requests still
    hold their KV memory, their pages are not yet in the radix tree (the next step cannot reuse them) and their
    answers wait. ``async`` (a GPU: the forward is launched asynchronously): the results are processed as soon
    as the next step is launched. ``sync`` (a CPU worker: the forward runs inside the launch): only after the
    next step has computed. ``off``: at the end of the step. Measured on the bench model's CPU workers: in
    every one of 1,732 steps that had requests running, they were exactly the previous step's
    (benchmarks/results/simulator/replay-*.md)."""

    @property
    def theta(self) -> float:
        """Θ with no weight transfer to hide (``theta_for``)."""
        return self.theta_for()

    def theta_for(self, transfer_s: float = 0.0) -> float:
        """Θ the worker reports: ``theta_flops``, else the knee of its throughput profile with ``transfer_s`` of
        weight transfer to hide per step (``profiled_theta``)."""
        return self.theta_flops if self.theta_flops is not None else profiled_theta(self, transfer_s).flops

    def step_seconds(self, prompts: int, tokens: int, transfer_s: float = 0.0) -> float:
        """One forward pass computing ``prompts`` uncached prompts of ``tokens`` tokens each (``Engine``'s
        step time: fixed, per request, per token, per attention pair and per token of KV; the weight
        transfer hides it when longer)."""
        computed = prompts * tokens
        compute = (self.step_s + prompts * self.request_s + self.token_s * computed
                   + self.pair_s * prompts * tokens * (tokens + 1) / 2 + self.context_token_s * computed)
        return max(compute, transfer_s)

    def transfer_s(self, transfer: Transfer) -> float:
        return {"none": 0.0, "nvlink": self.nvlink_transfer_s, "pcie": self.pcie_transfer_s}[transfer]

    def hidden_theta(self, transfer: Transfer) -> float:
        """Θ* for a transfer: the in-flight FLOPs whose linear compute lasts as long as the transfer
        (seed 000 Eq. 3 with this model's times: Θ = transfer time x effective FLOP rate)."""
        return self.transfer_s(transfer) * self.flops.linear_flops_per_token / self.token_s

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["flops"] = self.flops.to_dict()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["flops"] = FlopsModel.from_dict(values["flops"])
        return cls(**values)


def profiled_theta(cal: Calibration, transfer_s: float = 0.0) -> SaturationThreshold:
    """Θ as a live worker without streaming measures it at start-up (``theta_calibration``'s throughput
    profile), on this model: rounds of 1, 2, 4 ... concurrent ``PROFILE_PROMPT_TOKENS``-token prompts up to
    ``PROFILE_MAX_CONCURRENCY`` (and what the KV pool holds), each round as many full steps as its tokens
    need, timed by ``step_seconds``; Θ where throughput reaches the knee (``saturation.from_throughput``,
    margin 1, no request overhead: simulated workers report none)."""
    tokens = max(16, min(PROFILE_PROMPT_TOKENS, cal.step_tokens))
    per_step = max(1, cal.step_tokens // tokens)
    points = []
    for c in (2 ** i for i in range(PROFILE_MAX_CONCURRENCY.bit_length())):
        if c > PROFILE_MAX_CONCURRENCY or (c > 1 and c * tokens > cal.cache_tokens):
            break
        full, rest = divmod(c, per_step)
        seconds = full * cal.step_seconds(per_step, tokens, transfer_s)
        if rest:
            seconds += cal.step_seconds(rest, tokens, transfer_s)
        points.append((c, seconds))
    return saturation.from_throughput(points, cal.flops.request_flops(0, tokens), tokens, 1.0, 0.0)


def cpu_tiny() -> Calibration:
    """The shipped tiny model on this 2-core CPU, until ``fit_timing`` measures it.

    From sglang-facts.md: 1,024 / 2,048 uncached tokens 0.29 / 0.54 s; fully cached 0.07 / 0.14 s.
    With ~7 ms of fixed cost, the cached pair gives ``context_token_s`` ≈ 58 µs per token of KV and the
    uncached pair ≈ 0.21 ms per computed token, attention pairs adding nothing measurable at these
    lengths. Model vs measured: 0.28 / 0.56 s uncached, 0.07 / 0.13 s cached.
    """
    config = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())
    return Calibration(name="cpu_tiny", flops=FlopsModel.from_hf_config(config), step_s=0.004, request_s=0.003,
                       token_s=0.21e-3, pair_s=0.0, context_token_s=0.058e-3, step_tokens=8192,
                       cache_tokens=131072, shared_compute=1.0, event_delay_s=0.002, overlap="sync")


def h100_30b(mfu: float = MFU) -> Calibration:
    """Qwen3-30B-A3B-like on one H100 (bf16), experts streamed (AsyncEP): see the module docstring."""
    flops = FlopsModel.from_hf_config(QWEN3_30B_A3B)
    rate = H100_BF16_PEAK * mfu
    transferred_layers = flops.num_moe_layers - 1
    # KV: 48 layers x 4 KV heads x 128 x (K, V) x 2 bytes = 96 KiB per token. With experts sharded over
    # 8 GPUs and a few layers staged, ~13 GB of weights stay resident; ~47 GB of the 80 GB hold KV.
    return Calibration(name="h100_30b", flops=flops, step_s=flops.num_layers * H100_LAYER_FIXED_S,
                       request_s=20e-6 + flops.lm_head_flops_per_token / rate,
                       token_s=flops.linear_flops_per_token / rate, pair_s=flops.attn_flops_per_pair / rate,
                       step_tokens=16384, cache_tokens=480_000, nvlink_transfer_s=transferred_layers * NVLINK_LAYER_S,
                       pcie_transfer_s=transferred_layers * PCIE_LAYER_S, event_delay_s=0.5e-3, overlap="async")


PRESETS = {"cpu_tiny": cpu_tiny, "h100_30b": h100_30b}
"""Calibrations by name; ``load`` also accepts a JSON file written by ``fit_timing``."""


def load(name_or_path: str) -> Calibration:
    """A preset by name, or a calibration JSON (``fit_timing``'s output, or ``Calibration.to_json``)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]()
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"unknown calibration {name_or_path!r}: neither a preset ({', '.join(PRESETS)}) nor a file")
    data = json.loads(path.read_text())
    return Calibration.from_json(data.get("calibration", data))


def with_theta(cal: Calibration, theta: float | None) -> Calibration:
    return replace(cal, theta_flops=theta)
