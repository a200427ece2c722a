"""``python -m sgl_moe.classify FILE --router URL``: the bulk classification client (see sgl_moe.classify.cli)."""

from sgl_moe.classify.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
