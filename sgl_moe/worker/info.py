"""Build the worker's ``wire.WorkerInfo`` (``GET /sgl_moe/info``) from its arguments and the model's config.

Built once at launch from the server arguments and the model's ``config.json``; values SGLang resolves at
start-up (page size, step size) are read when the first request arrives (see ``routes``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sgl_moe import __version__
from sgl_moe.flops import FlopsModel
from sgl_moe.saturation import SaturationThreshold
from sgl_moe.wire import (
    CHAT_TEMPLATE_DIR,
    TOKENIZER_CONFIG_PATH,
    TOKENIZER_FILE_NAMES,
    TOKENIZER_PATH,
    KvEventEndpoint,
    SaturationInfo,
    TokenizerFiles,
    WorkerInfo,
)
from sgl_moe.worker.args import MoeArgs


def kv_event_endpoints(kv_events_config: str | None, dp_size: int) -> list[KvEventEndpoint]:
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

    return [KvEventEndpoint(dp_rank=r, endpoint=offset(cfg.get("endpoint"), r),
                            replay_endpoint=offset(cfg.get("replay_endpoint"), r), topic=cfg.get("topic", ""))
            for r in range(max(1, dp_size))]


def saturation_info(theta: SaturationThreshold, step_tokens: int) -> SaturationInfo:
    """Θ as the wire carries it: the threshold's figures flattened beside the worker's step size."""
    fields = SaturationInfo.__dataclass_fields__
    details = {k: v for k, v in theta.details.items() if k in fields and k != "step_tokens"}
    return SaturationInfo(flops=theta.flops, source=theta.source, state=theta.state, step_tokens=step_tokens,
                          **details)


def with_saturation(info: WorkerInfo, theta: SaturationThreshold) -> WorkerInfo:
    """The same info with a new Θ (the calibration finished), keeping the step size."""
    return replace(info, saturation=saturation_info(theta, info.saturation.step_tokens or 0))


def tokenizer_files(tokenizer_path: str) -> TokenizerFiles:
    """The tokenizer files SGLang's ``AutoTokenizer.from_pretrained(tokenizer_path)`` may read that exist there."""
    tok_dir = Path(tokenizer_path)
    files = [name for name in TOKENIZER_FILE_NAMES if (tok_dir / name).is_file()]
    templates = tok_dir / CHAT_TEMPLATE_DIR
    if templates.is_dir():
        files += sorted(f"{CHAT_TEMPLATE_DIR}/{p.name}" for p in templates.glob("*.jinja") if p.is_file())
    return TokenizerFiles(
        path=tokenizer_path,
        tokenizer_json_url=TOKENIZER_PATH if "tokenizer.json" in files else None,
        tokenizer_config_url=TOKENIZER_CONFIG_PATH if "tokenizer_config.json" in files else None,
        files=files,
    )


def build_info(*, model_name: str, model_path: str, tokenizer_path: str, hf_config: dict[str, Any],
               instance_id: str, context_length: int, page_size: int, step_tokens: int, dp_size: int,
               kv_events_config: str | None, prefix_caching: bool, device: str, sglang_version: str, moe: MoeArgs,
               theta: SaturationThreshold) -> WorkerInfo:
    return WorkerInfo(
        sgl_moe_version=__version__,
        instance_id=instance_id,
        sglang_version=sglang_version,
        model_name=model_name,
        model_path=model_path,
        tokenizer=tokenizer_files(tokenizer_path),
        context_length=context_length,
        page_size=page_size,
        prefix_caching=prefix_caching,
        dp_size=dp_size,
        kv_events=kv_event_endpoints(kv_events_config, dp_size),
        flops=FlopsModel.from_hf_config(hf_config),
        saturation=saturation_info(theta, step_tokens),
        device=device,
        moe_args=asdict(moe),
    )
