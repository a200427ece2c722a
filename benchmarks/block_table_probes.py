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

``--baseline-so PATH``: another build of the C tables (``native_block_tables.c`` of an older commit, compiled on its
own: ``gcc -O2 -fPIC -shared -I/usr/include/python3.11 OLD.c -o OLD.so``) loaded beside this checkout's in the same
process. Both get the same blocks; then, in ``--repeats`` x 10 rounds taking turns (which goes first alternates), each
runs the same ``--calls`` prompts through a walk (``match_groups`` then ``committed_prefix``, as placement and the
prefix hold do) and the same store + remove, with 8 MB written between the two builds' turns and ``--between-mb``
(1) before each call (the other work a router does between two requests). Prints the median and minimum over the
rounds: on this shared VM two separate runs of the same build differ by more than the change.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import random
import statistics
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
    parser.add_argument("--baseline-so", metavar="PATH", help="another build of native_block_tables, timed beside "
                        "this checkout's in turns")
    parser.add_argument("--between-mb", type=int, default=1, choices=range(0, 257), metavar="MB",
                        help="with --baseline-so: MB written before each call (1: most of the tables' recent entries "
                        "stay in the last-level cache; 8: they do not)")
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
    if args.baseline_so:
        if not block_tables.NATIVE:
            parser.error("--baseline-so compares two builds of the C tables; this checkout's are not built")
        side_by_side(args.baseline_so, live, prefixes, prompts, n, args.repeats * 10, args.between_mb)


def _load_tables(path: str) -> type:
    """``BlockTables`` of the extension at ``path`` (loaded under its own name, beside the imported one)."""
    loader = importlib.machinery.ExtensionFileLoader("native_block_tables", path)
    spec = importlib.util.spec_from_file_location("native_block_tables", path, loader=loader)
    if spec is None:
        raise SystemExit(f"--baseline-so {path}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.BlockTables


def side_by_side(baseline_so: str, live: list[tuple[int, list[int]]], prefixes: list[list[int]],
                 prompts: list[list[int]], batch_blocks: int, rounds: int, between_mb: int) -> None:
    """This build's tables and ``baseline_so``'s, the same blocks in each, timed in turns on the same calls: the
    prompts' walks, and a store of ``len(prompts)`` new batches of ``batch_blocks`` blocks, each with the removal
    of the oldest batch held (new batches every round, the same for both)."""
    builds = {"this build": block_tables.native_block_tables.BlockTables, "baseline": _load_tables(baseline_so)}
    tables = {}
    for name, kind in builds.items():
        t = kind()
        for _ in range(TARGETS):
            t.add_target()
        for g, prefix in enumerate(prefixes):
            t.store(g % TARGETS, prefix)
        for slot, batch in live:
            t.store(slot, batch)
        tables[name] = t
    mask = (1 << TARGETS) - 1
    spans: dict[str, list[list[int]]] = {name: list(live) for name in builds}  # each build's own FIFO of stored blocks
    junk = bytearray(8 << 20)
    line = b"\x01" * (len(junk) // 64)
    between = bytearray(between_mb << 20)  # written before each call: the other work a router does between requests
    line_between = b"\x01" * (len(between) // 64)
    walk: dict[str, list[float]] = {name: [] for name in builds}
    churned: dict[str, list[float]] = {name: [] for name in builds}
    rng = random.Random(11)
    for r in range(rounds):
        churn = [[rng.randrange(-2 ** 63, 2 ** 63) for _ in range(batch_blocks)] for _ in prompts]
        for name in (list(builds) if r % 2 == 0 else list(builds)[::-1]):
            t, fifo = tables[name], spans[name]
            junk[::64] = line
            spent_walk = spent_churn = 0.0
            for i, p in enumerate(prompts):
                between[::64] = line_between
                t0 = time.perf_counter()
                t.match_groups(p, mask)
                t.committed_prefix(i % TARGETS, p)
                spent_walk += time.perf_counter() - t0
            for batch in churn:
                slot, old = fifo.pop(0)
                between[::64] = line_between
                t0 = time.perf_counter()
                t.store(slot, batch)
                t.remove(slot, old)
                spent_churn += time.perf_counter() - t0
                fifo.append((slot, batch))
            walk[name].append(spent_walk / len(prompts))
            churned[name].append(spent_churn / len(churn))
    print(f"\nside by side with {baseline_so} ({rounds} rounds in turns, {between_mb} MB written before each call):")
    for label, spent in (("match_groups + committed_prefix", walk), ("store + remove", churned)):
        for name in builds:
            xs = spent[name]
            print(f"{label:32s} {name:10s}: median {statistics.median(xs) * 1e6:7.1f} us, "
                  f"minimum {min(xs) * 1e6:7.1f} us per call")


if __name__ == "__main__":
    main()
