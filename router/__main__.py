"""``python -m sgl_moe.router``: the front router.

The routing service itself is built in the router issue; until then this entry point says so
plainly instead of pretending to route.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sgl_moe.router",
        description="Prefix-aware, FLOPs-aware router in front of sgl_moe workers (not yet available).",
    )
    parser.add_argument("--worker-urls", nargs="+", metavar="URL", help="base URLs of the workers")
    parser.parse_args(argv)
    print(
        "sgl_moe.router: the routing service is not implemented in this version yet; "
        "run a worker with `python -m sgl_moe.launch_server` and send requests to it directly.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
