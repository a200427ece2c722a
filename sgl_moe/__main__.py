"""``python -m sgl_moe``: the main job on the embedded default (see sgl_moe.harness.demo)."""

from sgl_moe.harness.demo import main

raise SystemExit(main())
