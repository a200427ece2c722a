"""KV-event decode time: the router's C reader, its typed msgspec decoder and its generic fallback, on SGLang's own
encoding.

    .venv/bin/python benchmarks/event_decode.py [--batches 500] [--repeats 5]

Each shape is a batch as an SGLang worker publishes it (``sglang.srt.disaggregation.kv_events``' own classes and
msgpack encoder): pages removed, then pages stored with their token ids (16 per page). Both paths decode the same
batches in this one process, alternately, best of ``--repeats``; all give the same events (checked). The C reader
(``native_kv_payload``, what ``decode_frames`` tries first since 2026-11-30; timed through ``decode_payload``, with
the events it builds) is left out where it was not built.
"""

from __future__ import annotations

import argparse
import random
import time

import msgspec
from sglang.srt.disaggregation import kv_events as sgl

from sgl_moe.router.membership import kv_events

PAGE = 16
SHAPES = [(1, 0), (12, 12), (125, 125), (250, 0)]
"""(pages stored, pages removed): a short prompt's last page; a 2,000-token prompt sharing 90% with earlier ones;
a unique 2,000-token prompt once the pool is full; a unique 4,000-token prompt."""


def _batch(rng: random.Random, stored: int, removed: int) -> bytes:
    events: list = []
    if removed:
        events.append(sgl.BlockRemoved(block_hashes=[rng.getrandbits(63) for _ in range(removed)], medium="GPU"))
    events.append(sgl.BlockStored(block_hashes=[rng.getrandbits(63) for _ in range(stored)],
                                  parent_block_hash=rng.getrandbits(63),
                                  token_ids=[rng.randrange(150_000) for _ in range(stored * PAGE)], block_size=PAGE,
                                  lora_id=None, medium="GPU"))
    return msgspec.msgpack.encode(sgl.KVEventBatch(ts=time.time(), events=events, attn_dp_rank=0))


def _best_us(decode, payloads: list[bytes], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p in payloads:
            decode(p)
        best = min(best, (time.perf_counter() - t0) / len(payloads))
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    typed = kv_events._typed.decode
    generic = kv_events._decode_generic
    native = kv_events._native_decode
    print("| pages stored / removed | payload bytes | C reader, µs/batch | typed, µs/batch | generic, µs/batch | "
          "C / typed | generic / typed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for stored, removed in SHAPES:
        payloads = [_batch(rng, stored, removed) for _ in range(args.batches)]
        assert typed(payloads[0]).events == generic(payloads[0])[1]  # the same events either way
        assert native is None or kv_events.decode_payload(payloads[0])[1] == generic(payloads[0])[1]
        t_native = t_typed = t_generic = float("inf")
        for _ in range(2):  # alternately, so that none always runs first
            if native is not None:
                t_native = min(t_native, _best_us(kv_events.decode_payload, payloads, args.repeats))
            t_typed = min(t_typed, _best_us(typed, payloads, args.repeats))
            t_generic = min(t_generic, _best_us(generic, payloads, args.repeats))
        c = ("—", "—") if native is None else (f"{t_native:.2f}", f"{t_native / t_typed:.2f}x")
        print(f"| {stored} / {removed} | {len(payloads[0]):,} | {c[0]} | {t_typed:.2f} | {t_generic:.2f} | {c[1]} | "
              f"{t_generic / t_typed:.2f}x |")


if __name__ == "__main__":
    main()
