"""``python -m sgl_moe.launch_server``: SGLang's HTTP server with sgl_moe's defaults, flags and endpoints.

Accepts every SGLang server flag plus the ``--moe-*`` flags. With no arguments it serves the shipped
model on 127.0.0.1 with page size 16, prefix caching on and KV-cache events published on a bound
loopback ZMQ endpoint; on a machine without a usable CUDA device it selects SGLang's CPU engine
through ``sgl_moe.cpu_compat``. Bad input fails fast with one line on stderr and exit status 2.

The steps live in ``sgl_moe.worker``: flags (``args``, ``argv``), checks and defaults (``preflight``,
``platform``), the patches' configuration (``runtime``) and the routes (``routes``); this module runs them
in order and starts SGLang.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time

from sgl_moe.worker.args import MoeArgs, MoeArgsError
from sgl_moe.worker.argv import ArgvView
from sgl_moe.worker.platform import apply_platform
from sgl_moe.worker.preflight import LaunchError, check_values, preflight, with_defaults
from sgl_moe.worker.runtime import export_runtime

logger = logging.getLogger("sgl_moe.launch_server")

__all__ = ["LaunchError", "build_parser", "main", "prepare", "serve"]


class _OneLineArgumentParser(argparse.ArgumentParser):
    """Argparse errors become LaunchError (one line) instead of a usage dump of SGLang's ~400 flags."""

    def error(self, message: str):
        raise LaunchError(f"{message} (see --help)")


def build_parser(with_sglang: bool) -> argparse.ArgumentParser:
    parser = _OneLineArgumentParser(
        prog="python -m sgl_moe.launch_server", allow_abbrev=False,
        description="SGLang server with sgl_moe's defaults (shipped model, page size 16, KV events on "
                    "loopback, CPU engine when no GPU) and its --moe-* options.",
    )
    if with_sglang:
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import ServerArgs

        load_plugins()  # plugins may add server flags (in every SGLang process, as SGLang's own launcher does)

        ServerArgs.add_cli_args(parser.add_argument_group("SGLang server options"))
    MoeArgs.add_cli_args(parser)
    return parser


def prepare(argv: ArgvView, moe: MoeArgs, device: str, profile_dir: str | None = None):
    """Import SGLang, let it parse and check its arguments, and add the sgl_moe routes to its app."""
    from sglang.srt.server_args import prepare_server_args

    from sgl_moe.worker import input_guard
    from sgl_moe.worker.routes import install_routes

    args = list(argv)
    build_parser(with_sglang=True).parse_args(args)  # unknown flags and bad values: one line, before SGLang
    try:
        server_args = prepare_server_args(args)
        # SGLang validates flag combinations (e.g. --prefill-only-disable-kv-cache without --is-embedding) while
        # resolving; doing it here turns its refusal into one line instead of a traceback from run_server.
        server_args.resolve_once()
    except (ValueError, AssertionError, TypeError) as exc:
        raise LaunchError(f"SGLang rejected the arguments: {str(exc).strip().splitlines()[0]}") from None
    install_routes(server_args, moe, device, profile_dir)
    from sglang.srt.entrypoints.http_server import app

    input_guard.install(app, server_args.model_path)
    return server_args


def serve(server_args) -> None:
    """Run SGLang's HTTP server (blocks until shutdown), then make sure its child processes are gone."""
    from sglang.launch_server import run_server
    from sglang.srt.utils import kill_process_tree

    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(name)s: %(message)s", datefmt="%H:%M:%S")
    if "-h" in args or "--help" in args:
        build_parser(with_sglang=True).print_help()
        return 0
    moe_parser = _OneLineArgumentParser(add_help=False, allow_abbrev=False)
    MoeArgs.add_cli_args(moe_parser)
    profile_dir: str | None = None
    try:
        moe_ns, sglang_args = moe_parser.parse_known_args(args)
        moe = MoeArgs.from_cli_args(moe_ns)
        moe.validate()
        sglang_argv = ArgvView(sglang_args)
        check_values(sglang_argv)
        sglang_argv = with_defaults(sglang_argv, moe)
        preflight(sglang_argv)
        plan, sglang_argv = apply_platform(sglang_argv)
        profile_dir = export_runtime(sglang_argv, moe, plan.cpu_engine)
        logger.info("starting SGLang: %s", " ".join(sglang_argv))
        server_args = prepare(sglang_argv, moe, "cpu" if plan.cpu_engine else "cuda", profile_dir)
    except (LaunchError, MoeArgsError) as exc:
        print(f"sgl_moe.launch_server: error: {exc}", file=sys.stderr)
        if profile_dir:
            shutil.rmtree(profile_dir, ignore_errors=True)
        return 2
    t0 = time.time()
    try:
        serve(server_args)
    finally:
        if profile_dir:
            shutil.rmtree(profile_dir, ignore_errors=True)
    logger.info("server stopped after %.0f s", time.time() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
