"""``GET /sgl_moe/info``: everything a router needs to know about a worker, with no other configuration.

Built once at launch from the server arguments and the model's ``config.json``; values SGLang
resolves at start-up (page size, step size) are read when the first request arrives.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sgl_moe import __version__
from sgl_moe.flops import FlopsModel
from sgl_moe.moe_args import MoeArgs
from sgl_moe.saturation import SaturationThreshold

INFO_PATH = "/sgl_moe/info"
TOKENIZER_PATH = "/sgl_moe/tokenizer.json"
TOKENIZER_CONFIG_PATH = "/sgl_moe/tokenizer_config.json"


def kv_event_endpoints(kv_events_config: str | None, dp_size: int) -> list[dict[str, Any]]:
    """One publisher per data-parallel rank, on the configured port + rank (SGLang's own rule)."""
    if not kv_events_config:
        return []
    cfg = json.loads(kv_events_config)
    if cfg.get("publisher", "null") != "zmq":
        return []

    def offset(endpoint: str | None, rank: int) -> str | None:
        if not endpoint:
            return None
        m = re.match(r"^(.*):(\d+)$", endpoint)
        return f"{m.group(1)}:{int(m.group(2)) + rank}" if m else endpoint

    return [{"dp_rank": r, "endpoint": offset(cfg.get("endpoint"), r),
             "replay_endpoint": offset(cfg.get("replay_endpoint"), r), "topic": cfg.get("topic", "")}
            for r in range(max(1, dp_size))]


def build_info(*, model_name: str, model_path: str, tokenizer_path: str, hf_config: dict[str, Any],
               instance_id: str, context_length: int, page_size: int, step_tokens: int, dp_size: int, kv_events_config: str | None,
               prefix_caching: bool, device: str, sglang_version: str, moe: MoeArgs,
               theta: SaturationThreshold) -> dict[str, Any]:
    flops = FlopsModel.from_hf_config(hf_config)
    tok_dir = Path(tokenizer_path)
    return {
        "sgl_moe_version": __version__,
        "instance_id": instance_id,
        "sglang_version": sglang_version,
        "model_name": model_name,
        "model_path": model_path,
        "tokenizer": {
            "path": tokenizer_path,
            "tokenizer_json_url": TOKENIZER_PATH if (tok_dir / "tokenizer.json").is_file() else None,
            "tokenizer_config_url": TOKENIZER_CONFIG_PATH if (tok_dir / "tokenizer_config.json").is_file()
            else None,
        },
        "context_length": context_length,
        "page_size": page_size,
        "prefix_caching": prefix_caching,
        "dp_size": dp_size,
        "kv_events": kv_event_endpoints(kv_events_config, dp_size),
        "flops": flops.to_dict(),
        "saturation": {**theta.to_dict(), "step_tokens": step_tokens},
        "device": device,
        "moe_args": {k: getattr(moe, k) for k in moe.__dataclass_fields__},
    }
