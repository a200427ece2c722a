"""The thin SGLang adapter for ``/sgl_moe/*`` endpoints: adds routes to SGLang's own FastAPI app."""

from __future__ import annotations

import hmac
import importlib.metadata
import json
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sgl_moe import saturation, wire
from sgl_moe.flops import FlopsModel
from sgl_moe.saturation import SaturationThreshold
from sgl_moe.wire import (
    DUAL_BATCH_STATS_FILE,
    INFO_PATH,
    OFFLOAD_STATS_FILE,
    TOKENIZER_CONFIG_PATH,
    TOKENIZER_FILES_PATH,
    TOKENIZER_PATH,
)
from sgl_moe.worker.args import MoeArgs
from sgl_moe.worker.info import build_info, public_view, with_saturation
from sgl_moe.worker.readiness import Readiness, ReadinessGate
from sgl_moe.worker.theta_calibration import Calibrator, Keys, ThroughputCalibrator, WorkerShape


def _hf_config(model_path: str) -> dict[str, Any]:
    local = Path(model_path).expanduser() / "config.json"
    if local.is_file():
        return json.loads(local.read_text())
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path).to_dict()


def _context_length(resolved: int | None, hf_config: dict[str, Any]) -> int:
    """The longest prompt the worker accepts: SGLang's --context-length, else the model's own limit."""
    if resolved:
        return int(resolved)
    cfg = hf_config.get("text_config", hf_config)
    return int(cfg.get("max_position_embeddings") or 0)


def _theta_source(moe: MoeArgs, profile_dir: str | None, base_url: str, shape,
                  keys: Keys, readiness: Readiness) -> Callable[[], SaturationThreshold]:
    """Θ as it stands: manual; the streaming calibrator's or the throughput profile's current value (each
    reports the fallback with state ``calibrating`` until it ends, and opens ``readiness`` then); or fixed (Eq. 3
    without transfer) when the profile is off (ready as soon as SGLang is)."""
    if moe.saturation_flops is not None:
        fixed = saturation.manual(moe.saturation_flops)
        readiness.open("Θ given by --moe-saturation-flops: no start-up profile")
        return lambda: fixed
    if (not moe.streaming or profile_dir is None) and moe.theta_profile:
        profiler = ThroughputCalibrator(base_url, shape, moe.saturation_margin, moe.calibration_timeout_s, keys,
                                        readiness)
        profiler.start()
        return profiler.current
    if not moe.streaming or profile_dir is None:
        readiness.open("--no-moe-theta-profile: Θ from the step size, no start-up profile")

        def fixed_theta() -> SaturationThreshold:
            s = shape()
            return saturation.without_transfer(s.flops.request_flops(0, s.step_tokens), s.step_tokens,
                                               moe.saturation_margin)
        return fixed_theta
    calibrator = Calibrator(base_url, profile_dir, shape, moe.saturation_margin, moe.calibration_timeout_s, keys,
                            readiness)
    calibrator.start()
    return calibrator.current


def _offload_counts(moe: MoeArgs, profile_dir: str | None) -> dict[str, Any]:
    """The offload settings and the scheduler's latest counts (hits, misses, bytes moved), if any yet."""
    out: dict[str, Any] = {"predictor": moe.predictor, "execution": moe.execution,
                           "resident_experts": moe.resident_experts}
    return _with_counts(out, profile_dir, OFFLOAD_STATS_FILE)


def _dual_batch_counts(moe: MoeArgs, profile_dir: str | None) -> dict[str, Any]:
    """The placement and the scheduler's latest counts (forwards overlapped or not, the cost model, plans)."""
    out: dict[str, Any] = {"placement": moe.dual_batch, "always": moe.dual_batch_always}
    return _with_counts(out, profile_dir, DUAL_BATCH_STATS_FILE)


def _with_counts(out: dict[str, Any], profile_dir: str | None, name: str) -> dict[str, Any]:
    path = Path(profile_dir) / name if profile_dir else None
    if path is not None and path.is_file():
        try:
            out["counts"] = json.loads(path.read_text())
        except (OSError, ValueError):
            pass  # mid-replace or gone: the next request reads it
    return out


ADMIN_KEY_HEADER = "X-Admin-Key"
"""Where the worker's admin key may travel besides ``Authorization: Bearer`` (which SGLang's middleware keeps for
the ``--api-key`` when the worker has both keys)."""


def is_admin(headers, admin_api_key: str | None) -> bool:
    """Whether a request carries the worker's admin key (SGLang's ``--admin-api-key``), compared in constant time."""
    if not admin_api_key:
        return False
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    given = [token.strip()] if scheme.lower() == "bearer" else []
    given.append(headers.get(ADMIN_KEY_HEADER) or "")
    expected = admin_api_key.encode()
    return any(hmac.compare_digest(g.encode(), expected) for g in given if g)


def _curve_public_key(moe: MoeArgs) -> str | None:
    if moe.kv_events_keys is None:
        return None
    from sgl_moe.kv_event_keys import load_server_keys

    return load_server_keys(moe.kv_events_keys).public.decode()


def install_routes(server_args, moe: MoeArgs, device: str, profile_dir: str | None = None) -> None:
    """Register the routes; the info payload is built on first request, after SGLang resolved its args.

    A Θ profile (or, with weight streaming, the calibration) starts here in a thread and runs once SGLang is
    healthy; ``ReadinessGate`` keeps ``/health`` at 503 until it ends (``readiness``)."""
    from fastapi import Request
    from fastapi.responses import FileResponse, JSONResponse, Response
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.entrypoints.http_server import app

    hf_config = _hf_config(server_args.model_path)
    cache: dict[str, wire.WorkerInfo] = {}
    # New on every start: a router that sees it change knows the worker restarted with an empty cache.
    instance_id = uuid.uuid4().hex
    curve_public_key = _curve_public_key(moe)

    def resolved():
        a = resolving_view(server_args)  # values SGLang resolved at start-up (page size, step)
        step = a.chunked_prefill_size if (a.chunked_prefill_size or 0) > 0 else a.max_prefill_tokens
        return a, int(step)

    def shape() -> WorkerShape:
        a, step = resolved()
        cfg = hf_config.get("text_config", hf_config)
        return WorkerShape(FlopsModel.from_hf_config(hf_config), step,
                           _context_length(a.context_length, hf_config), int(cfg["vocab_size"]))

    host = "127.0.0.1" if server_args.host in ("0.0.0.0", "", None, "*") else server_args.host
    def keys() -> tuple[str | None, str | None]:
        a = resolving_view(server_args)
        return a.api_key, a.admin_api_key

    # Outermost middleware: /health answers 503 until the start-up work (the Θ profile) is done.
    readiness = Readiness()
    app.add_middleware(ReadinessGate, readiness=readiness)
    theta = _theta_source(moe, profile_dir, f"http://{host}:{server_args.port}", shape, keys, readiness)

    def info() -> wire.WorkerInfo:
        if "info" not in cache:
            a, step = resolved()
            tokenizer_path = a.tokenizer_path or a.model_path
            cache["info"] = build_info(
                model_name=a.served_model_name or a.model_path, model_path=str(a.model_path),
                tokenizer_path=str(tokenizer_path), hf_config=hf_config, instance_id=instance_id,
                context_length=_context_length(a.context_length, hf_config), page_size=int(a.page_size or 1),
                step_tokens=int(step), dp_size=int(a.dp_size or 1), kv_events_config=a.kv_events_config,
                prefix_caching=not a.disable_radix_cache, device=device,
                sglang_version=importlib.metadata.version("sglang"), moe=moe, theta=theta(),
                curve_public_key=curve_public_key,
            )
        current = cache["info"]
        if current.calibrating:
            latest = theta()
            if latest.state != "calibrating":  # calibration finished: freeze the info with its result
                current = cache["info"] = with_saturation(current, latest)
        return current

    async def get_info(request) -> Response:
        """The info; absolute paths of this machine only for a request carrying the admin key."""
        payload = info()
        if not is_admin(request.headers, resolving_view(server_args).admin_api_key):
            payload = public_view(payload)
        if moe.expert_offload:
            payload = replace(payload, offload=_offload_counts(moe, profile_dir))
        if moe.dual_batch != "off":
            payload = replace(payload, dual_batch=_dual_batch_counts(moe, profile_dir))
        return Response(wire.encode(payload), media_type="application/json")

    async def get_tokenizer_file(name: str) -> Response:
        """A file of SGLang's tokenizer directory (``--tokenizer-path``, else the model path) named in the info."""
        files = info().tokenizer
        path = Path(files.path) / name
        if name not in files.files or not path.is_file():
            return JSONResponse({"error": f"this worker serves no tokenizer file {name!r}; it serves {files.files}"},
                                status_code=404)
        return FileResponse(path, media_type="application/json" if name.endswith(".json") else
                            "application/octet-stream")

    def fixed(name: str):  # the routes older routers read
        async def get_file() -> Response:
            return await get_tokenizer_file(name)
        return get_file

    get_info.__annotations__["request"] = Request  # a class, not a string: FastAPI then passes the request
    app.add_api_route(INFO_PATH, get_info, methods=["GET"])
    app.add_api_route(TOKENIZER_FILES_PATH + "/{name:path}", get_tokenizer_file, methods=["GET"])
    app.add_api_route(TOKENIZER_PATH, fixed("tokenizer.json"), methods=["GET"])
    app.add_api_route(TOKENIZER_CONFIG_PATH, fixed("tokenizer_config.json"), methods=["GET"])
