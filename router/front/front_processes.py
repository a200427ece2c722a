"""``--front-processes N``: the placement owner's N front processes, started, watched and stopped.

The owner (the process ``python -m sgl_moe.router`` started) keeps the workers, their KV events, the tables,
admission and the queue, and serves its HTTP routes on a Unix socket only. Each front (a spawned process running
``front_router``) listens on the router's ``--host``/``--port`` with ``SO_REUSEPORT``, so the kernel spreads
client connections over the fronts. A front that exits stops the router (its supervisor restarts it): a router
running with fewer fronts than asked for would hide the loss.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sgl_moe.router.config import RouterConfig

log = logging.getLogger("sgl_moe.router.fronts")


class FrontStartError(RuntimeError):
    """The front processes did not all start (``python -m sgl_moe.router`` says why in one line, exits 1)."""


@dataclass(frozen=True)
class FrontSockets:
    """The owner's two Unix sockets, in a directory only the router's user can enter."""

    placement: str
    """``PlacementOwner``'s: the fronts' ``Place``/``Release`` messages."""
    http: str
    """The owner's HTTP service: the routes fronts hand on."""

    @classmethod
    def make(cls) -> FrontSockets:
        folder = Path(tempfile.mkdtemp(prefix="sgl-moe-router-"))
        folder.chmod(0o700)
        return cls(str(folder / "placement.sock"), str(folder / "http.sock"))

    def remove(self) -> None:
        for path in (self.placement, self.http):
            Path(path).unlink(missing_ok=True)
        try:
            Path(self.placement).parent.rmdir()
        except OSError:
            pass


def front_main(cfg: RouterConfig, front: int, sockets: FrontSockets) -> None:
    """A front process's body (the target of each spawned process)."""
    import logging as _logging

    import uvloop
    from aiohttp import web

    from sgl_moe.router.front.front_router import build_front_app, front_hot_routes
    from sgl_moe.router.front.http_server import serve
    from sgl_moe.router.front.service import tune_gc
    from sgl_moe.router.request.router_tokenizer import keep_torch_out

    keep_torch_out()
    _logging.basicConfig(level=cfg.log_level.upper(),
                         format=f"%(asctime)s %(levelname)s %(name)s [front {front}]: %(message)s")
    tune_gc()
    try:
        app = build_front_app(cfg, front, sockets.placement, sockets.http)
        if cfg.http_server == "bare":
            serve(app, front_hot_routes(app), host=cfg.host, port=cfg.port, loop=uvloop.new_event_loop(),
                  reuse_port=True)
        else:
            web.run_app(app, host=cfg.host, port=cfg.port, reuse_port=True, print=None, access_log=None,
                        handle_signals=True, keepalive_timeout=cfg.header_timeout_s, handler_cancellation=True,
                        loop=uvloop.new_event_loop())
    except OSError as exc:
        print(f"sgl_moe.router: error: front {front} cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}",
              file=sys.stderr)
        sys.exit(2)


class FrontProcesses:
    def __init__(self, cfg: RouterConfig, sockets: FrontSockets) -> None:
        self.cfg = cfg
        self.sockets = sockets
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self._watch: asyncio.Task | None = None
        self.stopping = False
        self.failed: str | None = None
        """Why the router stopped on its own: a front exited (``python -m sgl_moe.router`` then exits 1)."""

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads and an event loop
        for i in range(self.cfg.front_processes):
            proc = ctx.Process(target=front_main, args=(self.cfg, i, self.sockets), name=f"sgl-moe-front-{i}",
                               daemon=True)
            proc.start()
            self.procs.append(proc)
        log.info("started %d front processes on %s:%d (SO_REUSEPORT): pids %s", len(self.procs), self.cfg.host,
                 self.cfg.port, ", ".join(str(p.pid) for p in self.procs))
        self._watch = asyncio.get_running_loop().create_task(self._watch_fronts())

    async def _watch_fronts(self) -> None:
        while not self.stopping:
            await asyncio.sleep(0.5)
            for i, proc in enumerate(self.procs):
                if not proc.is_alive() and not self.stopping:
                    self.failed = f"front process {i} (pid {proc.pid}) exited with code {proc.exitcode}"
                    log.error("%s; stopping the router", self.failed)
                    self.stopping = True
                    os.kill(os.getpid(), 15)  # SIGTERM: run_app closes the owner, whose cleanup stops the rest
                    return

    async def stop(self) -> None:
        self.stopping = True
        if self._watch is not None:
            self._watch.cancel()
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs:
            await asyncio.to_thread(proc.join, 10)
            if proc.is_alive():
                proc.kill()
        self.sockets.remove()
