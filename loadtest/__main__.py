"""``python -m sgl_moe.loadtest --host URL``: run the locust load test headless (see sgl_moe.loadtest.runner)."""

from sgl_moe.loadtest.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
