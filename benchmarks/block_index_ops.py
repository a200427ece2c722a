"""One placement's worth of ``BlockIndex`` operations, timed in-process: the router's block tables on their own.

    .venv/bin/python benchmarks/block_index_ops.py [--native | --python] [--ops 200000]

Four targets; 2,000 chains of 13 block hashes, half of them stored on a target first. Each step does what a placed
request does to the tables: ``match_groups`` over the chain, ``promise`` of its last 10 blocks, ``committed_prefix``,
``retire`` of the same 10. Prints microseconds per step. To compare two checkouts, run it from each (``PYTHONPATH``
set to a ``git worktree`` of the other), alternated.
"""

from __future__ import annotations

import argparse
import random
import time

from sgl_moe.router.placement.block_index import BlockIndex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--native", dest="native", action="store_true", default=None, help="the C tables")
    which.add_argument("--python", dest="native", action="store_false", help="the Python reference tables")
    ap.add_argument("--ops", type=int, default=200_000, help="steps timed (default 200000)")
    args = ap.parse_args()
    try:
        ix = BlockIndex() if args.native is None else BlockIndex(native=args.native)
    except TypeError:  # a checkout from before BlockIndex took ``native``
        ix = BlockIndex()
    rng = random.Random(1)
    slots = [ix.add_target() for _ in range(4)]
    chains = [[rng.randrange(-2**63, 2**63) for _ in range(13)] for _ in range(2000)]
    for i, chain in enumerate(chains[:1000]):
        ix.store(slots[i % 4], chain)
    mask = sum(1 << s for s in slots)
    t0 = time.perf_counter()
    for i in range(args.ops):
        chain, slot = chains[i % 2000], slots[i % 4]
        ix.match_groups(chain, mask)
        ix.promise(slot, chain[3:])
        ix.committed_prefix(slot, chain)
        ix.retire(slot, chain[3:])
    dt = time.perf_counter() - t0
    tables = ("C" if ix.native else "Python") if hasattr(ix, "native") else "a checkout from before the C type"
    print(f"{dt / args.ops * 1e6:.2f} us per step (match, promise, committed prefix, retire of 13 blocks); "
          f"tables: {tables}")


if __name__ == "__main__":
    main()
