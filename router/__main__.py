"""``python -m sgl_moe.router --worker-urls URL [URL ...]``: the front router (see ``--help``)."""

from __future__ import annotations

import logging
import sys

import uvloop
from aiohttp import web

from sgl_moe.router import compiled_modules
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.front.front_processes import FrontSockets, FrontStartError
from sgl_moe.router.front.http_server import serve
from sgl_moe.router.front.service import ROUTER, build_app, hot_routes, tune_gc
from sgl_moe.router.membership import event_listener, kv_events
from sgl_moe.router.placement import block_tables, prefix_homes
from sgl_moe.router.request import block_hash, router_tokenizer, token_cuts, token_ids, word_pieces
from sgl_moe.router.request.router_tokenizer import encode_batches_serially, keep_torch_out


def main(argv: list[str] | None = None) -> int:
    keep_torch_out()  # the router's tokenizer loads transformers, which would import an installed torch
    encode_batches_serially()
    parser = RouterConfig.parser()
    try:
        cfg = RouterConfig.from_argv(argv)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("sgl_moe.router")
    log.info("router on http://%s:%d, policy %s, %d worker URL(s)", cfg.host, cfg.port, cfg.policy,
             len(cfg.worker_urls))
    log.info("%s", native_loops())
    log.info("%s", compiled_modules.summary())
    tune_gc()
    try:
        # keepalive_timeout also closes a connection that has not sent a complete request head in time (aiohttp's
        # keep-alive timer runs from the connection's start until a head is parsed): --header-timeout-s.
        # handler_cancellation: a client that disconnects cancels its handler, which aborts its request.
        # uvloop: with hundreds of client connections at once (a bulk run) ~8% less router CPU per request than
        # asyncio's loop; no difference measured with a few clients (README, router benchmark).
        if cfg.front_processes > 1:  # the fronts take the port; this process owns placement (front_processes)
            sockets = FrontSockets.make()
            where = {"path": sockets.http}
        else:
            sockets, where = None, {"host": cfg.host, "port": cfg.port}
        app = build_app(cfg, sockets)
        if sockets is None and cfg.http_server == "bare":  # the proxied routes on bare protocols (http_server)
            serve(app, hot_routes(app), host=cfg.host, port=cfg.port, loop=uvloop.new_event_loop())
        else:
            web.run_app(app, **where, print=None, access_log=None,
                        handle_signals=True, keepalive_timeout=cfg.header_timeout_s, handler_cancellation=True,
                        loop=uvloop.new_event_loop())
    except FrontStartError as exc:
        print(f"sgl_moe.router: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sgl_moe.router: error: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    fronts = app[ROUTER].fronts
    if fronts is not None and fronts.failed:
        print(f"sgl_moe.router: error: {fronts.failed}; the router stopped", file=sys.stderr)
        return 1
    return 0


def native_loops() -> str:
    """Which of the router's per-page, per-piece and per-block loops and tables run in C (built at install where a
    C compiler was)."""
    where = {"page hashes": block_hash.NATIVE, "word pieces": word_pieces.NATIVE,
             "new pieces' BPE": router_tokenizer.NATIVE_BPE, "block tables": block_tables.NATIVE,
             "prefix homes": prefix_homes.NATIVE, "KV-event payloads": kv_events.NATIVE, "cut scan": token_cuts.NATIVE,
             "ids' JSON": token_ids.NATIVE, "KV-event reads": event_listener.NATIVE}
    if all(where.values()):
        from sgl_moe.router.request import native_page_hash

        return (f"page hashes, word pieces, new pieces' BPE, block tables, prefix homes, KV-event payloads and reads, "
                f"the cut scan and the ids' JSON in C "
                f"(SHA-256: {native_page_hash.backend()})")
    python = ", ".join(name for name, native in where.items() if not native)
    return (f"{python} in Python: the install did not build their C extension (no C compiler?), so the router "
            "spends more CPU per request; with a compiler, `bash tools/bootstrap.sh` or `pip install -e .` builds it")


if __name__ == "__main__":
    sys.exit(main())
