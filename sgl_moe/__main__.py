"""``python -m sgl_moe``: the main job on the embedded default (see sgl_moe.demo)."""

from sgl_moe.demo import main

raise SystemExit(main())
