"""The block tables' calls a request and its KV events make, with the tables in cache and after other work evicted them.

    .venv/bin/python benchmarks/block_table_probes.py [--blocks 1000000] [--prompt-blocks 250] [--calls 300]
                                                      [--repeats 3]

Fills a ``BlockIndex`` (the C tables where built) over 4 targets with ``--blocks`` committed blocks, among them 40
prefixes of 90% of ``--prompt-blocks`` blocks (the capacity benchmark's shared stream), then times, per call:

- ``match_groups``: a prompt of one prefix and a new tail, against every target (placement);
- ``store`` then ``remove`` of ``--prompt-blocks`` new blocks (one request's ``BlockStored`` and an eviction's
  ``BlockRemoved``), the table's size kept steady;
- decoding the KV-event payload of that store and removal as SGLang's publisher encodes it (``BlockStored`` with
  its ``--prompt-blocks`` x 16 token ids), with ``kv_events.decode_payload``: the C reader where built, and msgspec
  alone.

Each call is timed *warm* (right after the previous one) and *cold* (after writing one byte per cache line of a
64 MB buffer: what a router sharing its cores with workers and clients meets). Prints microseconds per call, the
minimum over ``--repeats`` passes. Run it in two checkouts to compare them (each imports its own tables).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import msgspec

from sgl_moe.router.membership import kv_events
from sgl_moe.router.placement import block_tables
from sgl_moe.router.placement.block_index import BlockIndex

EVICT_BYTES = 64 << 20
TARGETS = 4
PREFIXES = 40
PAGE = 16


def _payload(rng: random.Random, stored: list[int], removed: list[int]) -> bytes:
    from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored, KVEventBatch

    ids = [rng.randrange(150_000) for _ in range(len(stored) * PAGE)]
    return msgspec.msgpack.encode(KVEventBatch(ts=time.time(), events=[
        BlockStored(block_hashes=stored, parent_block_hash=None, token_ids=ids, block_size=PAGE, lora_id=None),
        BlockRemoved(block_hashes=removed)], attn_dp_rank=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--prompt-blocks", type=int, default=250)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if min(args.blocks, args.prompt_blocks, args.calls, args.repeats) < 1:
        parser.error("--blocks, --prompt-blocks, --calls and --repeats must be at least 1")
    rng = random.Random(7)
    index = BlockIndex()
    slots = [index.add_target() for _ in range(TARGETS)]
    n = args.prompt_blocks

    def new(k: int) -> list[int]:
        return [rng.randrange(-2 ** 63, 2 ** 63) for _ in range(k)]

    prefixes = [new(n * 9 // 10) for _ in range(PREFIXES)]
    for g, prefix in enumerate(prefixes):
        index.store(slots[g % TARGETS], prefix)
    live: list[tuple[int, list[int]]] = []
    while index.blocks < args.blocks:
        slot, batch = slots[len(live) % TARGETS], new(min(n, args.blocks - index.blocks))
        index.store(slot, batch)
        live.append((slot, batch))
    print(f"{'C' if block_tables.NATIVE else 'Python'} tables: {index.blocks:,} blocks over {TARGETS} targets; "
          f"prompts of {n} blocks; KV payloads read {'in C' if getattr(kv_events, 'NATIVE', False) else 'by msgspec'}",
          flush=True)
    prompts = [rng.choice(prefixes) + new(n - n * 9 // 10) for _ in range(args.calls)]
    churn = [new(n) for _ in range(args.calls)]
    payloads = [_payload(rng, churn[i], live[i % len(live)][1]) for i in range(args.calls)]
    mask = (1 << TARGETS) - 1
    decode = getattr(kv_events, "decode_payload", None)
    if decode is None:  # a checkout from before the C reader (2026-11-30): msgspec only, through decode_frames
        def decode(payload: bytes, native: bool = True) -> object:
            return kv_events.decode_frames([b"", bytes(8), payload])

    def store_remove(i: int) -> None:
        slot, old = live.pop(0)
        index.store(slot, churn[i])
        index.remove(slot, old)
        live.append((slot, churn[i]))

    calls: dict[str, Callable[[int], object]] = {
        "match_groups": lambda i: index.match_groups(prompts[i], mask),
        "store + remove": store_remove,
        "decode payload": lambda i: decode(payloads[i]),
        "decode payload (msgspec alone)": lambda i: decode(payloads[i], native=False),
    }
    junk = bytearray(EVICT_BYTES)
    line = b"\x01" * (EVICT_BYTES // 64)
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.repeats):
        for name, call in calls.items():
            for mode in ("warm", "cold"):
                total = 0.0
                for i in range(args.calls):
                    if mode == "cold":
                        junk[::64] = line
                    t0 = time.perf_counter()
                    call(i)
                    total += time.perf_counter() - t0
                best[name, mode] = min(best.get((name, mode), float("inf")), total / args.calls)
    for (name, mode), seconds in best.items():
        print(f"{name:32s} {mode}: {seconds * 1e6:7.1f} us per call (minimum of {args.repeats} passes)")


if __name__ == "__main__":
    main()
