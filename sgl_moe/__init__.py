"""sgl_moe: prefill-only Mixture-of-Experts serving on top of SGLang.

Light on import: nothing here imports torch or sglang.
"""

from pathlib import Path

from sgl_moe import _source_layout

__version__ = "0.1.0"

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "models" / "tiny-qwen3-moe"
"""The small Qwen3-MoE model the project ships and trains itself (see its MODEL_CARD.md)."""

_source_layout.install(__file__)
