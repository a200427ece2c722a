"""Plain SGLang workers (``python -m sglang.launch_server``, no ``/sgl_moe/info``): the router builds their
``WorkerInfo`` itself, from SGLang's own endpoints and its flags, and records where each field came from.

SGLang 0.5.23 publishes its resolved server arguments at ``GET /server_info`` (page size, context length, DP
size, prefill step, the KV-event publisher both as a descriptor ``kv_events`` and as the raw
``kv_events_config``) and the model's identity at ``GET /model_info``; older versions serve the same at
``/get_server_info`` and ``/get_model_info``. What cannot be read remotely comes from the router's flags
(``RouterConfig``) or from directories on the router's machine: the tokenizer files (``--tokenizer-path``) and
the model's ``config.json`` (``--model-dir``, for the FLOPs constants). A plain worker streams no weights, so
its Θ is Eq. 3 with no transfer at the server's prefill step, computed here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from sgl_moe import saturation
from sgl_moe.flops import FlopsModel, embedding_shape
from sgl_moe.router.membership.worker import WorkerError
from sgl_moe.router.request.router_tokenizer import VOCABULARY_FILES, RouterTokenizer
from sgl_moe.wire import INFO_PATH, KvEventEndpoint, SaturationInfo, TokenizerFiles, WorkerInfo, kv_event_endpoints

if TYPE_CHECKING:
    from sgl_moe.router.config import RouterConfig

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
"""SGLang's resolved server arguments: the 0.5.23 path first, then the older (deprecated in 0.5.23) one."""
MODEL_INFO_PATHS = ("/model_info", "/get_model_info")

Get = Callable[..., Awaitable[aiohttp.ClientResponse]]
"""``Discovery.get``: the router's one HTTP session."""


class PlainWorkers:
    """Reads plain SGLang workers for the pool's discovery, and remembers what it learned about each."""

    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self._read: dict[str, tuple[WorkerInfo, dict[str, str]]] = {}

    async def read(self, get: Get, url: str) -> WorkerInfo:
        """The worker's info from ``/server_info``, ``/model_info``, the router's flags and local files."""
        server, server_path = await _first_json(get, url, SERVER_INFO_PATHS)
        if server is None:
            raise WorkerError(400, f"{url} is neither an sgl_moe worker (GET {INFO_PATH} answered 404) nor an "
                                   f"SGLang server (GET {SERVER_INFO_PATHS[0]} answered 404)")
        model, model_path = await _first_json(get, url, MODEL_INFO_PATHS)
        info, learned = build_info(url, self.cfg, server, server_path, model or {}, model_path or "")
        self._read[url] = (info, learned)
        return info

    def learned_about(self, url: str, info: WorkerInfo) -> dict[str, str] | None:
        """Field -> where it came from, if ``info`` is the one ``read`` built for ``url`` (else None)."""
        entry = self._read.get(url)
        return entry[1] if entry is not None and entry[0] is info else None

    @staticmethod
    def tokenizer(info: WorkerInfo) -> RouterTokenizer:
        """The tokenizer from the local directory ``read`` chose (``info.tokenizer.path``), loaded as SGLang does."""
        try:
            return RouterTokenizer.from_dir(Path(info.tokenizer.path).expanduser())
        except Exception as exc:  # whatever transformers or the tokenizers library raise on files they cannot load
            raise WorkerError(400, f"cannot load the tokenizer from {info.tokenizer.path}: {exc}") from None


def check_flags(cfg: RouterConfig) -> None:
    """``RouterConfig.validate``'s part for the plain-worker flags: a ValueError naming the flag."""
    if cfg.tokenizer_path is not None and _local_dir(cfg.tokenizer_path, *VOCABULARY_FILES) is None:
        raise ValueError(f"--tokenizer-path {cfg.tokenizer_path}: no tokenizer files in that directory (any of "
                         f"{', '.join(VOCABULARY_FILES)})")
    if cfg.model_dir is not None and _local_dir(cfg.model_dir, "config.json") is None:
        raise ValueError(f"--model-dir {cfg.model_dir}: no config.json in that directory")
    if cfg.page_size is not None and cfg.page_size < 1:
        raise ValueError(f"--page-size must be >= 1, got {cfg.page_size}")
    if cfg.kv_events_config is not None:
        kv_event_endpoints(cfg.kv_events_config, 1)
    if cfg.kv_events_keys is not None:  # the keys serve every worker's events; checked here with the other KV flags
        from sgl_moe.kv_event_keys import KeyFileError, load_client_keys

        try:
            load_client_keys(cfg.kv_events_keys)
        except KeyFileError as exc:
            raise ValueError(f"--kv-events-keys: {exc}") from None


async def _first_json(get: Get, url: str, paths: tuple[str, ...]) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object at the first of ``paths`` the worker serves; (None, None) if it serves none."""
    for path in paths:
        async with await get(f"{url}{path}") as resp:
            if resp.status == 404:
                continue
            if resp.status != 200:
                raise WorkerError(502, f"{url}: GET {path} answered {resp.status}")
            data = await resp.json(content_type=None)
        if not isinstance(data, dict):
            raise WorkerError(400, f"{url}: GET {path} is not a JSON object")
        return data, path
    return None, None


def _descriptor_endpoints(desc: dict[str, Any]) -> list[KvEventEndpoint]:
    """``/server_info``'s ``kv_events`` (SGLang's contract for routers): rank r on each port base + r."""
    host = str(desc["endpoint_host"])
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 (``::`` is a wildcard the event sink resolves to the worker's host)
    base, replay = int(desc["endpoint_port_base"]), desc.get("replay_endpoint_port_base")
    return [KvEventEndpoint(dp_rank=r, endpoint=f"tcp://{host}:{base + r}",
                            replay_endpoint=f"tcp://{host}:{int(replay) + r}" if replay is not None else None,
                            topic=str(desc.get("topic") or ""))
            for r in range(max(1, int(desc.get("dp_size") or 1)))]


def build_info(url: str, cfg: RouterConfig, server: dict[str, Any], server_path: str, model: dict[str, Any],
               model_path: str) -> tuple[WorkerInfo, dict[str, str]]:
    """``WorkerInfo`` of a plain worker and, for each field, where it came from; a 400 naming the flag to pass
    when something the router needs is neither published nor given."""
    learned: dict[str, str] = {}

    def pick(name: str, *options: tuple[Any, str]) -> Any:
        """The first option that is set; its source is recorded under ``name``."""
        for value, source in options:
            if value is not None and value != "":
                learned[name] = source
                return value
        return None

    def srv(key: str) -> str:
        return f"server info (GET {server_path}: {key})"

    def mdl(key: str) -> str:
        return f"model info (GET {model_path}: {key})"

    def refuse(what: str, flag: str) -> WorkerError:
        return WorkerError(400, f"{url} is a plain SGLang worker (GET {INFO_PATH} answered 404) and {what}: "
                                f"pass {flag} to the router", sglang=True)

    remote_model_path = str(pick("model_path", (model.get("model_path"), mdl("model_path")),
                                 (server.get("model_path"), srv("model_path"))) or "")
    model_name = str(pick("model_name", (model.get("served_model_name"), mdl("served_model_name")),
                          (server.get("served_model_name"), srv("served_model_name")),
                          (remote_model_path, learned.get("model_path", ""))) or "")

    model_dir = pick("flops", (cfg.model_dir, "router flag --model-dir"),
                     (_local_dir(remote_model_path, "config.json"),
                      "the server's model_path, read on the router's machine"))
    if model_dir is None:
        raise refuse(f"its model path {remote_model_path!r} holds no config.json on the router's machine "
                     "(needed for the FLOPs constants)", "--model-dir DIR (a local copy of the model's config.json)")
    config_file = Path(model_dir).expanduser() / "config.json"
    hf_config = json.loads(config_file.read_text())
    learned["flops"] = f"local config {config_file} ({learned['flops']})"
    served, local = model.get("architectures"), hf_config.get("architectures")
    if served and local and list(served) != list(local):
        raise WorkerError(400, f"{url} serves {served} but {config_file} describes {local}; "
                               "point --model-dir at the model the worker serves", sglang=True)
    flops = FlopsModel.from_hf_config(hf_config)

    remote_tokenizer = str(model.get("tokenizer_path") or server.get("tokenizer_path") or "")
    tokenizer_dir = pick("tokenizer", (cfg.tokenizer_path, "router flag --tokenizer-path"),
                         (_local_dir(remote_tokenizer, *VOCABULARY_FILES),
                          "the server's tokenizer_path, read on the router's machine"))
    if tokenizer_dir is None:
        raise refuse(f"its tokenizer path {remote_tokenizer!r} holds no tokenizer files on the router's machine "
                     "(needed to hash prompts as the worker's cache does)",
                     "--tokenizer-path DIR (a local copy of the model's tokenizer files)")
    learned["tokenizer"] = f"local directory {tokenizer_dir} ({learned['tokenizer']})"

    desc = server.get("kv_events") if isinstance(server.get("kv_events"), dict) else {}
    page_size = pick("page_size", (cfg.page_size, "router flag --page-size"),
                     (server.get("page_size"), srv("page_size")))
    if cfg.page_size is None and desc.get("block_size") not in (None, page_size):
        # The publisher hashes at block_size (page size x decode-context-parallel size): so must the router.
        page_size = pick("page_size", (desc["block_size"], srv("kv_events.block_size")))
    if page_size is None:
        raise refuse(f"GET {server_path} reports no page_size", "--page-size N")
    dp_size = int(pick("dp_size", (desc.get("dp_size"), srv("kv_events.dp_size")),
                       (server.get("dp_size"), srv("dp_size")), (1, "default")))
    if cfg.kv_events_config is not None:
        kv_events = kv_event_endpoints(cfg.kv_events_config, dp_size)
        learned["kv_events"] = "router flag --kv-events-config"
    elif "kv_events" in server:  # SGLang 0.5.23's descriptor: None when no usable publisher is configured
        kv_events = _descriptor_endpoints(desc) if desc else []
        learned["kv_events"] = srv("kv_events")
    else:  # older SGLang: the raw flag
        kv_events = kv_event_endpoints(server.get("kv_events_config") or "{}", dp_size)
        learned["kv_events"] = srv("kv_events_config")
    if not kv_events:
        learned["kv_events"] += ": no publisher"

    text_cfg = hf_config.get("text_config", hf_config)
    context_length = pick("context_length", (server.get("context_length"), srv("context_length")),
                          (text_cfg.get("max_position_embeddings"), f"local config {config_file}"), (0, "unknown"))
    prefix_caching = not pick("prefix_caching", (server.get("disable_radix_cache"), srv("disable_radix_cache")),
                              (False, "default"))
    return WorkerInfo(
        model_name=model_name, model_path=remote_model_path, page_size=int(page_size), flops=flops,
        saturation=_theta(url, cfg, server, flops, learned, srv), instance_id=_instance_id(server, learned, srv),
        context_length=int(context_length), vocab_size=embedding_shape(hf_config)[0],
        hidden_size=embedding_shape(hf_config)[1], dp_size=dp_size, prefix_caching=prefix_caching, kv_events=kv_events,
        tokenizer=TokenizerFiles(path=str(tokenizer_dir)),
        device=str(pick("device", (server.get("device"), srv("device"))) or ""),
        sglang_version=str(pick("sglang_version", (server.get("version"), srv("version"))) or ""),
    ), learned


def _theta(url: str, cfg: RouterConfig, server: dict[str, Any], flops: FlopsModel, learned: dict[str, str],
           srv: Callable[[str], str]) -> SaturationInfo:
    """Eq. 3 with no transfer (margin 1) at the server's largest prefill step, as an sgl_moe worker without
    weight streaming computes it for itself."""
    chunk, max_prefill = server.get("chunked_prefill_size"), server.get("max_prefill_tokens")
    key, step = (("chunked_prefill_size", chunk) if isinstance(chunk, int) and chunk > 0
                 else ("max_prefill_tokens", max_prefill))
    if not isinstance(step, int) or step <= 0:
        if cfg.saturation_flops is None:
            raise WorkerError(400, f"{url} is a plain SGLang worker whose server info reports neither "
                                   "chunked_prefill_size nor max_prefill_tokens, so the router cannot derive its "
                                   "saturation threshold: pass --saturation-flops F to the router", sglang=True)
        learned["saturation"] = "router flag --saturation-flops"
        return SaturationInfo(cfg.saturation_flops, "router flag --saturation-flops", "manual")
    theta = saturation.without_transfer(flops.request_flops(0, step), step, 1.0)
    learned["saturation"] = f"derived by the router (Eq. 3 without transfer) at a {step}-token prefill step: {srv(key)}"
    return SaturationInfo(flops=theta.flops, source=theta.source, state=theta.state, step_tokens=step, margin=1.0)


def _instance_id(server: dict[str, Any], learned: dict[str, str], srv: Callable[[str], str]) -> str:
    """New on every start, as ``WorkerInfo.instance_id`` must be. SGLang publishes no id, but its random seed
    (drawn per start unless fixed) and its measured start-up timings together differ between starts."""
    seed, startup = server.get("random_seed"), server.get("startup_time")
    learned["instance_id"] = f"{srv('random_seed')} and startup_time, hashed"
    digest = hashlib.sha256(json.dumps([seed, startup], sort_keys=True, default=str).encode()).hexdigest()
    return f"sglang-{digest[:16]}"


def _local_dir(path: str, *any_of: str) -> str | None:
    """``path`` if it is a directory on this machine holding any of the files ``any_of``."""
    return path if path and any((Path(path).expanduser() / name).is_file() for name in any_of) else None
