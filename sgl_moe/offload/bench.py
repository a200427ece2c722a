"""``python -m sgl_moe.offload.bench``: decode time per output token with experts offloaded to the host.

Torch only (no SGLang). Decode layers shaped like Qwen3-30B-A3B (hidden 2048, 128 experts of width 768,
top-8, GQA 32/4 heads; random bf16 weights; 8 layers by default so any GPU fits them) decode B tokens over
a random KV cache of ``--context`` tokens, four ways:
- ``resident``: every expert on the device (the reference, and the per-layer compute time);
- ``on_demand``: experts in pinned host memory, the true experts copied after routing (seed 003's baseline);
- ``exact``: layer l+1's predicted experts prefetched during layer l, mispredictions fetched at entry;
- ``speculative``: the predicted experts run with the predicted gating weights (no misses after layer 0).
Predictions come from a synthetic predictor with a measured per-layer hit rate (``decode_stack``).
Per layer, the batched copy of the experts a step needs and the layer's compute are measured; the
bound on the saving is ΔT_max = Σ_l min(copy_l, compute_l) (seed 003 Eq. 1) over the layers that can be
prefetched (l ≥ 1; layer 0 is a cold start in Algorithm 1). CUDA graphs are not used: the engine keeps its
slot bookkeeping on the host and reads each layer's expert ids there (a device→host sync per layer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from sgl_moe.offload.config import OffloadConfig
from sgl_moe.offload.decode_stack import DecodeStack, synthetic_predictions
from sgl_moe.offload.engine import OffloadEngine, gather_rows
from sgl_moe.offload.resident import choose_resident
from sgl_moe.streaming.expert_store import ExpertStore
from sgl_moe.streaming.moe_stack import MoEStackConfig

MODES = ("resident", "on_demand", "exact", "speculative")
DEFAULT_HIT_RATE_JSON = Path("benchmarks/results/offload/tiny-prediction-quality.json")
NO_GRAPHS = ("CUDA graphs: not used. The engine's slot bookkeeping is on the host, so every layer reads its "
             "expert ids on the host (a device->host sync); that cannot be captured.")


class _Clock:
    """Marks on the compute stream (CUDA events) or the wall clock (CPU); seconds between marks."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a


def load_hit_rates(path: Path | None, fallback: float, layers: int) -> tuple[list[float], str]:
    """Hit rate per benchmark layer (index 0 unused: layer 0 is never predicted) and where it came from.

    The file's ``per_layer[i]["hybrid"]`` (recall@k by target layer) is cycled over layers 1..L-1."""
    if path is not None and path.exists():
        per_layer = [float(e["hybrid"]) for e in json.loads(path.read_text())["per_layer"]]
        if per_layer:
            return [0.0] + [per_layer[(i - 1) % len(per_layer)] for i in range(1, layers)], \
                f"{path} (per_layer[].hybrid, {len(per_layer)} layers, cycled over benchmark layers 1..{layers - 1})"
    return [0.0] + [fallback] * (layers - 1), f"--hit-rate {fallback} ({path} not found)"


def _copy_seconds(store: ExpertStore, layer: int, experts: list[int], device: torch.device, clock: _Clock) -> float:
    """One batched host→device copy of ``experts`` of ``layer`` (what a step needs), alone."""
    if not experts:
        return 0.0
    w = store[layer]
    dst13 = torch.empty((len(experts), *w.w13.shape[1:]), dtype=w.w13.dtype, device=device)
    dst2 = torch.empty((len(experts), *w.w2.shape[1:]), dtype=w.w2.dtype, device=device)
    src = [w.w13[e] for e in experts] + [w.w2[e] for e in experts]
    dst = list(dst13.unbind(0)) + list(dst2.unbind(0))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    a = clock.mark()
    gather_rows(dst, src)
    return clock.seconds(a, clock.mark())


def run_batch(stack: DecodeStack, store: ExpertStore, batch: int, hit_rates: list[float], resident_count: int,
              warmup: int, steps: int, progress=print) -> dict:
    cfg, device = stack.cfg, stack.device
    clock = _Clock(device)
    n = warmup + steps
    xs = [stack.token_inputs(batch, seed=s) for s in range(n)]

    # Resident reference: outputs, true routing, step time and per-layer compute time.
    ref, truth, res_times, layer_s = [], [], [], [[] for _ in range(cfg.layers)]
    for s, x in enumerate(xs):
        marks = []
        start = clock.mark()
        out, ids = stack.step(x, on_layer=lambda layer, marks=marks: marks.append(clock.mark()))
        marks.append(clock.mark())
        total = clock.seconds(start, marks[-1])
        ref.append(out)
        truth.append(ids)
        if s >= warmup:
            res_times.append(total)
            for layer in range(cfg.layers):
                layer_s[layer].append(clock.seconds(marks[layer], marks[layer + 1]))
    compute = [statistics.median(t) for t in layer_s]

    freqs = torch.zeros(cfg.layers, cfg.experts)
    for ids in truth:
        for layer, t in enumerate(ids):
            freqs[layer] += torch.bincount(t.reshape(-1).cpu(), minlength=cfg.experts).float()
    resident = choose_resident(freqs, resident_count) if resident_count else {}

    copy = []
    for layer in range(cfg.layers):
        keep = set(resident.get(layer, []))
        copy.append(statistics.median(_copy_seconds(
            store, layer, sorted(set(truth[s][layer].reshape(-1).tolist()) - keep), device, clock)
            for s in range(warmup, n)))
    bound = sum(min(c, t) for c, t in zip(copy[1:], compute[1:]))
    bound_all = sum(min(c, t) for c, t in zip(copy, compute))
    predictions = [synthetic_predictions(truth[s], hit_rates, cfg.experts, seed=1000 * batch + s) for s in range(n)]

    modes: dict[str, dict] = {"resident": {"tpot_s": statistics.median(res_times), "max_abs_diff": 0.0}}
    for mode in MODES[1:]:
        engine = OffloadEngine(store, OffloadConfig(execution=mode), device, resident=resident)
        times, diff = [], 0.0
        try:
            for s, x in enumerate(xs):
                if s == warmup:
                    engine.reset_stats()
                a = clock.mark()
                out, _ = stack.step(x, engine, predicted=None if mode == "on_demand" else predictions[s],
                                    speculative=mode == "speculative")
                t = clock.seconds(a, clock.mark())
                if s >= warmup:
                    times.append(t)
                    diff = max(diff, float((out.float() - ref[s].float()).abs().max()))
            modes[mode] = {"tpot_s": statistics.median(times), "max_abs_diff": diff,
                           "stats_per_step": {k: v / steps for k, v in engine.stats.as_dict().items()},
                           "device_expert_bytes": engine.device_expert_bytes()}
        finally:
            engine.close()
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    od = modes["on_demand"]["tpot_s"]
    for mode in ("exact", "speculative"):
        saved = od - modes[mode]["tpot_s"]
        modes[mode]["saved_s"] = saved
        modes[mode]["fraction_of_bound"] = saved / bound if bound > 0 else None
    row = {"batch": batch, "modes": modes, "copy_s_per_layer": copy, "compute_s_per_layer": compute,
           "bound_s": bound, "bound_eq1_all_layers_s": bound_all,
           "resident_experts_per_layer": resident_count}
    progress(f"batch {batch}: " + ", ".join(f"{m} {modes[m]['tpot_s'] * 1e3:.2f} ms" for m in MODES)
             + f"; bound {bound * 1e3:.2f} ms")
    return row


def run(cfg: MoEStackConfig, device: torch.device, batches: list[int], context: int, resident_count: int,
        hit_rates: list[float], hit_source: str, warmup: int, steps: int, progress=print) -> dict:
    stack = DecodeStack(cfg, device, context)
    store = stack.store(pin=True)
    rows = [run_batch(stack, store, b, hit_rates, resident_count, warmup, steps, progress) for b in batches]
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "config": asdict(cfg), "context": context, "warmup": warmup,
            "steps": steps, "expert_bytes": store.layer_bytes // cfg.experts, "hit_rates": hit_rates,
            "hit_rate_source": hit_source, "cuda_graphs": NO_GRAPHS, "rows": rows}


def table(result: dict) -> str:
    def ms(v: float) -> str:
        return f"{v * 1e3:.3f}"

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.0f}%"

    lines = [f"device {result['device']}, torch {result['torch']}; {result['config']['layers']} layers, "
             f"{result['config']['experts']} experts × {result['expert_bytes'] / 1e6:.2f} MB, "
             f"top-{result['config']['top_k']}, "
             f"context {result['context']}; hit rates from {result['hit_rate_source']}",
             "| batch | resident ms | on_demand ms | exact ms | speculative ms | bound ms | exact / bound | "
             "speculative / bound | exact hits / misses per step | MB moved per step (exact) | "
             "max diff on_demand / exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        m = r["modes"]
        st = m["exact"]["stats_per_step"]
        lines.append(f"| {r['batch']} | {ms(m['resident']['tpot_s'])} | {ms(m['on_demand']['tpot_s'])} | "
                     f"{ms(m['exact']['tpot_s'])} | {ms(m['speculative']['tpot_s'])} | {ms(r['bound_s'])} | "
                     f"{pct(m['exact']['fraction_of_bound'])} | {pct(m['speculative']['fraction_of_bound'])} | "
                     f"{st['hits']:.1f} / {st['misses']:.1f} | {st['bytes_moved'] / 1e6:.2f} | "
                     f"{m['on_demand']['max_abs_diff']:.3g} / {m['exact']['max_abs_diff']:.3g} |")
    dev = result["rows"][0]["modes"]["exact"]["device_expert_bytes"] if result["rows"] else 0
    lines.append(f"bound = Σ_(l≥1) min(copy_l, compute_l) (seed 003 Eq. 1; layer 0 is a cold start); "
                 f"device expert bytes (offload modes) {dev / 1e6:.1f} MB")
    if result["device"] == "cpu":
        lines.append("On a CPU the 'copy' is a host memcpy and the copy lane a thread competing for the cores: times "
                     "and fractions of the bound say nothing about a GPU (physics.md); counts and diffs carry over.")
    lines.append(result["cuda_graphs"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sgl_moe.offload.bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny float32 layers (CPU smoke test, CI)")
    p.add_argument("--batches", default="1,2,4,8", help="decode batch sizes (tokens per step)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--context", type=int, default=4096, help="KV cache tokens each sequence attends over")
    p.add_argument("--resident-experts", type=int, default=0, help="most frequent experts per layer kept on the device")
    p.add_argument("--hit-rate-json", type=Path, default=DEFAULT_HIT_RATE_JSON)
    p.add_argument("--hit-rate", type=float, default=0.8, help="per-layer hit rate when the JSON is missing")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=8, help="timed decode steps per batch and mode (median)")
    p.add_argument("--json", type=Path, help="write the full result here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available (use --device cpu --tiny for the smoke test)")
    try:
        batches = [int(b) for b in args.batches.split(",") if b]
    except ValueError:
        p.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if not batches or min(batches) < 1 or args.layers < 2 or args.steps < 1 or args.warmup < 0 or args.context < 1:
        p.error("need positive batches, at least 2 layers, at least 1 step and a positive context")
    if not 0.0 <= args.hit_rate <= 1.0:
        p.error(f"--hit-rate must be in [0, 1], got {args.hit_rate}")
    cfg = MoEStackConfig.tiny(layers=args.layers) if args.tiny else MoEStackConfig.qwen3_30b_a3b(layers=args.layers)
    if not 0 <= args.resident_experts <= cfg.experts:
        p.error(f"--resident-experts must be between 0 and {cfg.experts}")
    if device.type == "cpu" and not args.tiny:
        print("warning: full-size layers on a CPU take very long; --tiny is the CPU smoke test", file=sys.stderr)
    hit_rates, source = load_hit_rates(args.hit_rate_json, args.hit_rate, args.layers)
    if not args.hit_rate_json.exists():
        print(f"note: {args.hit_rate_json} not found; using --hit-rate {args.hit_rate} for every layer",
              file=sys.stderr)
    print(NO_GRAPHS, file=sys.stderr)
    result = run(cfg, device, batches, args.context, args.resident_experts, hit_rates, source, args.warmup,
                 args.steps, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
