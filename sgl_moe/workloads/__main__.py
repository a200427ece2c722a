"""``python -m sgl_moe.workloads``: write contract-A tasks, one per line (see sgl_moe.workloads.cli)."""

from sgl_moe.workloads.cli import main

if __name__ == "__main__":  # tests import every module of the package
    raise SystemExit(main())
