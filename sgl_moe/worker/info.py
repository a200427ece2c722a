"""Build the worker's ``wire.WorkerInfo`` (``GET /sgl_moe/info``) from its arguments and the model's config.

Built once at launch from the server arguments and the model's ``config.json``; values SGLang resolves at
start-up (page size, step size) are read when the first request arrives (see ``routes``).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from sgl_moe import __version__
from sgl_moe.flops import FlopsModel, embedding_shape
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
from sgl_moe.wire import kv_event_endpoints as wire_kv_event_endpoints
from sgl_moe.worker.args import MoeArgs


def kv_event_endpoints(kv_events_config: str | None, dp_size: int,
                       curve_public_key: str | None = None) -> list[KvEventEndpoint]:
    """One publisher per data-parallel rank, on the configured port + rank (``wire.kv_event_endpoints``; the
    launcher checked the config)."""
    return wire_kv_event_endpoints(kv_events_config, dp_size, curve_public_key) if kv_events_config else []


def public_view(info: WorkerInfo) -> WorkerInfo:
    """The info as anyone may read it: no absolute paths of this machine (the model and tokenizer directories,
    the key directory become their last component). The router needs none of them: it reads the tokenizer
    files through ``TOKENIZER_FILES_PATH``."""
    moe_args = dict(info.moe_args)
    if moe_args.get("kv_events_keys"):
        moe_args["kv_events_keys"] = _base_name(moe_args["kv_events_keys"])
    return replace(info, model_path=_base_name(info.model_path), moe_args=moe_args,
                   tokenizer=replace(info.tokenizer, path=_base_name(info.tokenizer.path)))


def _base_name(path: str) -> str:
    """A local path's last component (a hub id such as ``org/model`` is not a path and stays whole)."""
    if not path.startswith(("/", "~", ".")) and not Path(path).expanduser().exists():
        return path
    return Path(path.rstrip("/")).name or path


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
               theta: SaturationThreshold, curve_public_key: str | None = None) -> WorkerInfo:
    return WorkerInfo(
        sgl_moe_version=__version__,
        instance_id=instance_id,
        sglang_version=sglang_version,
        model_name=model_name,
        model_path=model_path,
        tokenizer=tokenizer_files(tokenizer_path),
        context_length=context_length,
        vocab_size=embedding_shape(hf_config)[0],
        hidden_size=embedding_shape(hf_config)[1],
        page_size=page_size,
        prefix_caching=prefix_caching,
        dp_size=dp_size,
        kv_events=kv_event_endpoints(kv_events_config, dp_size, curve_public_key),
        flops=FlopsModel.from_hf_config(hf_config),
        saturation=saturation_info(theta, step_tokens),
        device=device,
        moe_args=asdict(moe),
    )
