"""The piece table's lookup of whole texts, with its slots in cache and after other work evicted them.

    .venv/bin/python benchmarks/piece_lookup.py [--prompt-tokens 4000] [--texts 200] [--repeats 3]

Builds ``router_capacity``'s unique stream (prompts that share nothing, words from its filler), keeps every piece
of it in a ``word_pieces`` table (what the router's piece cache holds after serving that stream), then times
``lookup`` of each text (every piece kept: the ids come back whole) twice: right after the previous lookup
(*warm*), and after writing one byte per cache line of a 64 MB buffer (*cold*: what a router sharing its cores
with workers and clients meets). Prints microseconds per lookup, the minimum over ``--repeats`` passes. Run it in
two checkouts to compare them (each imports its own table).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import router_capacity  # noqa: E402

from sgl_moe import DEFAULT_MODEL_DIR  # noqa: E402
from sgl_moe.router.request.piece_cache import MAX_PIECE_CHARS, MAX_PIECES  # noqa: E402
from sgl_moe.router.request.router_tokenizer import RouterTokenizer  # noqa: E402
from sgl_moe.router.request.word_pieces import NATIVE, new_table  # noqa: E402

EVICT_BYTES = 64 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--texts", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.texts < 1 or args.repeats < 1 or args.prompt_tokens < 1:
        parser.error("--texts, --repeats and --prompt-tokens must be at least 1")
    stream = router_capacity.build_stream(router_capacity.Filler(), "unique", args.prompt_tokens, 0, args.texts, 0)
    texts = [unit.text for unit in stream.measured]
    tok = RouterTokenizer.from_dir(DEFAULT_MODEL_DIR)
    table = new_table(MAX_PIECES, MAX_PIECE_CHARS)
    pieces = 0
    for text in texts:
        _, new, pieces = table.lookup(text)
        if new:
            table.keep({piece: tok.encode_plain(piece) for piece in new})
    print(f"{'C' if NATIVE else 'Python'} table: {len(table):,} pieces kept; {len(texts)} texts of "
          f"~{args.prompt_tokens} tokens, {pieces:,} pieces in the last", flush=True)
    junk = bytearray(EVICT_BYTES)
    line = b"\x01" * (EVICT_BYTES // 64)
    best: dict[str, float] = {}
    for _ in range(args.repeats):
        for mode in ("warm", "cold"):
            total = 0.0
            for text in texts:
                if mode == "cold":
                    junk[::64] = line
                t0 = time.perf_counter()
                ids, missing, _ = table.lookup(text)
                total += time.perf_counter() - t0
                assert not missing and isinstance(ids, list)
            best[mode] = min(best.get(mode, float("inf")), total / len(texts))
    for mode, seconds in best.items():
        print(f"{mode}: {seconds * 1e6:.1f} us per lookup (minimum of {args.repeats} passes)")


if __name__ == "__main__":
    main()
