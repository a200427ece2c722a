"""The project's own worker flags (``--moe-*``), as one frozen dataclass."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from sgl_moe.cli_args import add_dataclass_args, from_namespace

PREFIX = "moe-"


class MoeArgsError(ValueError):
    """A --moe-* flag has an invalid value or conflicts with another flag."""


@dataclass(frozen=True)
class MoeArgs:
    weight_streaming: Literal["off", "host", "gather", "hybrid"] = "off"
    """AsyncEP expert weight streaming. off: SGLang's own path, untouched. host: every MoE layer's experts
    live in (pinned) host memory and a window of layers is streamed to the device ahead of the compute
    (the first MoE layer stays resident). gather / hybrid: all-gather of expert shards from peer GPUs (plus
    host prefetch): available in the standalone engine (python -m sgl_moe.streaming.bench / selfcheck), not
    yet inside SGLang."""
    stream_window: int = 2
    """Device slots for streamed MoE layers (2 = ping-pong). Expert memory = (1 + window) x one layer."""
    saturation_flops: float | None = None
    """Saturation threshold Θ in FLOPs reported to the router, overriding the worker's own (calibrated) value."""
    saturation_margin: float = 1.0
    """Safety factor α applied to the worker's own Θ (seed 000 Eq. 1 and 3; not to a manual --moe-saturation-flops)."""
    theta_profile: bool = True
    """Without weight streaming: measure Θ at start-up with a short throughput profile (1, 2, 4, ... 32
    concurrent 256-token requests; Θ = the fewest in flight reaching 95 percent of the best FLOPs/s; workers on one
    host profile one at a time). Off: the fixed Θ of one full step (a placeholder that a CPU worker rarely
    reaches, so the router never holds work back)."""
    calibration_timeout_s: float = 600.0
    """How long the worker waits for its profile forward before keeping the fallback Θ (and saying so)."""
    expert_offload: bool = False
    """CPU expert offload for decode (seed 003): experts live in (pinned) host memory; each decode step copies
    only the experts a layer needs into a double buffer, prefetching layer l+1's predicted experts while layer
    l computes. Forwards with many tokens (prefill: tokens x top-k >= experts) stream whole layers instead
    (--moe-weight-streaming host, turned on by this flag). Needs the model's expert_predictor bundle
    (python -m sgl_moe.prediction.train --model DIR)."""
    predictor: Literal["router", "estimator", "hybrid"] = "hybrid"
    """Next-layer expert prediction: router (layer l+1's gate on the quasi-hidden state), estimator (the
    trained estimator everywhere), hybrid (the estimator only on the layers where the router is weak)."""
    execution: Literal["exact", "speculative", "on_demand"] = "exact"
    """exact: run the true experts (same output as SGLang), fetch mispredicted ones after routing.
    speculative: run the predicted experts with the predicted weights (no fetch after routing; the output
    changes, see the README's quality table). on_demand: no prediction, copy the routed experts after routing
    (the baseline)."""
    resident_experts: int = 0
    """Experts per MoE layer kept on the device permanently (the most frequently routed ones, from the
    predictor bundle's activation counts); they are never copied from the host."""

    dual_batch: Literal["off", "streams", "cpu-experts"] = "off"
    """Dual micro-batch attention–MoE overlap for decode (seed 004 §3.3.1): split a decode batch in two by
    measured cost and run one micro-batch's attention while the other's experts run. streams: both on the
    device on two streams; cpu-experts: routed experts on the CPU (host weights) while the device does
    attention. Needs SGLang's torch-native attention backend (per-call metadata) in this version."""

    dual_batch_always: bool = False
    """Split every eligible decode forward, even where the solver predicts no gain (to test and to measure)."""

    kv_events_keys: str | None = None
    """Directory with this worker's CURVE keys for its KV-event sockets (the worker/ folder made by `python -m
    sgl_moe.kv_event_keys DIR`: worker.key_secret, and one *.key per router allowed to read). The events carry
    the prompts' token ids: with keys, the publisher and its replay endpoint talk only, encrypted, to clients
    holding one of those keys, and may bind a non-loopback --host."""
    kv_events_allow_unauthenticated: bool = False
    """Publish KV events without CURVE on a non-loopback --host (bound to that address; with --host 0.0.0.0 or
    :: on every interface): anyone who reaches the ports can read the prompts' token ids. Without it, such a
    --host needs --moe-kv-events-keys."""

    def validate(self) -> None:
        if self.saturation_flops is not None and not self.saturation_flops > 0:
            raise MoeArgsError(f"--moe-saturation-flops must be positive, got {self.saturation_flops}")
        if not self.saturation_margin >= 1.0:
            raise MoeArgsError(f"--moe-saturation-margin must be >= 1.0, got {self.saturation_margin}")
        if self.stream_window < 1:
            raise MoeArgsError(f"--moe-stream-window must be at least 1 layer, got {self.stream_window}")
        if self.weight_streaming in ("gather", "hybrid"):
            raise MoeArgsError(
                f"--moe-weight-streaming {self.weight_streaming} gathers expert shards from peer GPUs; this version "
                "runs it in the standalone engine only (python -m sgl_moe.streaming.selfcheck / .bench), not inside "
                "SGLang (it needs attention data parallelism with per-rank expert shards). Use host, or off.")
        if self.dual_batch != "off" and (self.weight_streaming != "off" or self.expert_offload):
            raise MoeArgsError("--moe-dual-batch cannot be combined with --moe-weight-streaming or "
                               "--moe-expert-offload yet (both own the MoE layer's weights during a forward)")
        if self.resident_experts < 0:
            raise MoeArgsError(f"--moe-resident-experts must be >= 0, got {self.resident_experts}")
        if not self.calibration_timeout_s > 0:
            raise MoeArgsError(f"--moe-calibration-timeout-s must be positive, got {self.calibration_timeout_s}")
        if self.kv_events_keys is not None:
            from sgl_moe.kv_event_keys import KeyFileError, load_server_keys

            try:
                load_server_keys(self.kv_events_keys)
            except KeyFileError as exc:
                raise MoeArgsError(f"--moe-kv-events-keys: {exc}") from None

    @property
    def streaming(self) -> bool:
        """Whole-layer streaming runs: asked for, or implied by expert offload (its prefill path)."""
        return self.weight_streaming != "off" or self.expert_offload

    @property
    def stream_mode(self) -> str:
        return "host" if self.expert_offload and self.weight_streaming == "off" else self.weight_streaming

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_dataclass_args(parser, MoeArgs, PREFIX, "sgl_moe options (--moe-*)")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> MoeArgs:
        return from_namespace(cls, ns, PREFIX)
