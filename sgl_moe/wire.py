"""The contracts between sgl_moe's processes, each defined once: paths, file names, ports and messages.

Three processes talk: the worker (SGLang's HTTP process with sgl_moe's routes, and its scheduler processes
running the patches), the router, and the clients. What crosses between them is declared here and nowhere
else: the ``/sgl_moe/*`` paths, the files the patches leave for the HTTP process, the KV-event port offsets,
the environment variable that carries the runtime configuration, and ``WorkerInfo``, the message the worker
encodes at ``GET /sgl_moe/info`` and the router decodes.

Messages are frozen dataclasses validated by msgspec on decode (a wrong type or a missing field is a
``WireError`` naming it). Pure: imports neither torch nor sglang, and msgspec only when a message is encoded
or decoded, so the torch-only engines (``prediction.bundle``) can share the names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sgl_moe.flops import FlopsModel

# -- HTTP paths a worker serves besides SGLang's own ------------------------------------------------------------
INFO_PATH = "/sgl_moe/info"
TOKENIZER_PATH = "/sgl_moe/tokenizer.json"
TOKENIZER_CONFIG_PATH = "/sgl_moe/tokenizer_config.json"
TOKENIZER_FILES_PATH = "/sgl_moe/tokenizer"
"""``GET /sgl_moe/tokenizer/{name}``: one file of the worker's tokenizer directory, for a name in
``TokenizerFiles.files``."""

# -- the tokenizer files a worker serves ------------------------------------------------------------------------
TOKENIZER_FILE_NAMES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "config.json",
    "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt",
    "spiece.model", "sentencepiece.bpe.model", "sentencepiece.model", "tekken.json", "tiktoken.model",
)
"""Files of a tokenizer directory that SGLang's ``AutoTokenizer.from_pretrained(tokenizer_path)`` may read
(transformers 5: ``tokenization_utils_base.py: from_pretrained`` and the classes' ``vocab_files_names``;
``config.json`` picks the class when ``tokenizer_config.json`` names none)."""
CHAT_TEMPLATE_DIR = "additional_chat_templates"
"""transformers 5 also reads ``additional_chat_templates/*.jinja`` (named chat templates)."""


def is_tokenizer_file_name(name: str) -> bool:
    """A name the worker may serve and the router may write: one of ``TOKENIZER_FILE_NAMES`` or a named
    template ``additional_chat_templates/<name>.jinja`` (no other folders, no ``..``)."""
    if name in TOKENIZER_FILE_NAMES:
        return True
    folder, _, file = name.partition("/")
    return (folder == CHAT_TEMPLATE_DIR and file.endswith(".jinja") and "/" not in file and "\\" not in file
            and not file.startswith("."))

# -- ports derived from a worker's own port (launcher writes them, nothing else guesses them) ------------------
KV_EVENTS_PORT_OFFSET = 1000
"""The worker's KV-event publisher binds port + 1000 (+ DP rank)."""
REPLAY_PORT_OFFSET = 2000
"""The publisher's replay endpoint binds port + 2000 (+ DP rank)."""
NCCL_PORT_OFFSET = -1000
"""torch.distributed's rendezvous (SGLang's ``--nccl-port``) binds port - 1000 unless the user gives one: SGLang's
own choice is a random port in 22,000-29,999, the band where a worker's KV-event ports lie when its port is below
28,000, and it once took its own worker's replay port."""

# -- KV-event publishers --------------------------------------------------------------------------------------------
KV_EVENTS_PUBLISHERS = ("zmq", "sgl_moe_curve")
"""``--kv-events-config`` publishers that publish on ZMQ: SGLang's own, and sgl_moe's CURVE-authenticated one
(``patches.kv_events_curve``, registered in the worker's scheduler when ``--moe-kv-events-keys`` is given)."""
KV_EVENTS_CURVE_PUBLISHER = "sgl_moe_curve"
SGLANG_DEFAULT_KV_ENDPOINT = "tcp://*:5557"
"""SGLang 0.5.23's ``KVEventsConfig.endpoint`` default."""

# -- files --------------------------------------------------------------------------------------------------------
PREDICTOR_DIR = "expert_predictor"
"""``<model_dir>/expert_predictor/``: the next-layer expert predictor bundle (``python -m
sgl_moe.prediction.train``), read by the offload patch and checked by the launcher."""
OFFLOAD_STATS_FILE = "offload.json"
"""Written by the scheduler's offload patch in the runtime directory at most once a second; served in
``WorkerInfo.offload``."""
DUAL_BATCH_STATS_FILE = "dual_batch.json"
"""Written by the scheduler's dual micro-batch patch at most once a second; served in ``WorkerInfo.dual_batch``."""
PROFILE_REQUEST_FILE = "request.json"
"""Θ calibration handshake, HTTP process -> scheduler: the minimum tokens of the forward to profile."""
PROFILE_FILE = "profile.json"
"""Θ calibration handshake, scheduler -> HTTP process: per-layer timings of the profiled forward."""

# -- environment ----------------------------------------------------------------------------------------------------
RUNTIME_ENV_VAR = "SGLMOE_RUNTIME"
"""Carries ``patches.runtime_env.RuntimeConfig`` from the launcher to SGLang's scheduler processes. Not ``SGL_*``:
SGLang warns that every ``SGL_*`` variable is a deprecated spelling of ``SGLANG_*``."""


class WireError(ValueError):
    """A message that does not decode into its declared type (the text names the field)."""


@dataclass(frozen=True)
class TokenizerFiles:
    """Where the worker's tokenizer lives and which of its files the worker serves (None: not present)."""

    path: str = ""
    tokenizer_json_url: str | None = None
    tokenizer_config_url: str | None = None
    files: list[str] = field(default_factory=list)
    """The files of ``path`` that ``AutoTokenizer`` may read (``is_tokenizer_file_name``), each served at
    ``TOKENIZER_FILES_PATH/<name>``. Empty from a worker older than this field: it serves the two URLs above."""


@dataclass(frozen=True)
class KvEventEndpoint:
    """One attention-DP rank's ZMQ KV-event publisher (SGLang's rule: configured port + rank)."""

    dp_rank: int
    endpoint: str | None
    replay_endpoint: str | None = None
    topic: str = ""
    curve_public_key: str | None = None
    """The publisher's CURVE public key (Z85) when it accepts only CURVE clients (``--moe-kv-events-keys``);
    None: plain ZMQ."""


@dataclass(frozen=True)
class SaturationInfo:
    """The worker's saturation threshold Θ in FLOPs (seed 000 Eq. 1 and 3) and how it was obtained."""

    flops: float
    source: str
    """In words, for logs and ``GET /workers``."""
    state: str
    """``manual``, ``fixed``, ``calibrating`` (fallback until the profile arrives), ``calibrated``, ``failed``."""
    step_tokens: int | None = None
    """The worker's largest prefill step (the reference batch of Eq. 3)."""
    margin: float | None = None
    profile_tokens: int | None = None
    f_ref: float | None = None
    ratio: float | None = None
    t0_s: float | None = None
    t_max_s: float | None = None
    slowest_layer: int | None = None
    mean_wait_s: float | None = None
    # Throughput profile (workers without weight streaming: ``saturation.from_throughput``).
    profile_prompt_tokens: int | None = None
    """Tokens per prompt of the profile's requests."""
    batch_sizes: list[int] | None = None
    """Requests in flight at each level, in the order profiled."""
    throughput_flops_per_s: list[float] | None = None
    """FLOPs/s measured at each level."""
    saturation_batch: int | None = None
    """Requests in flight where throughput stopped growing (Θ = margin x their FLOPs)."""
    profile_seconds: float | None = None
    """Wall time the profile took at start-up."""
    kv_pool_tokens: int | None = None
    """The worker's KV pool in tokens when it profiled (levels stop where the prompts would not fit)."""
    profile_attempts: int | None = None
    """Whole profiles run until one was monotone (another process on the host can spoil one)."""
    request_overhead_flops: float | None = None
    """A request's fixed cost in FLOPs-equivalent (``saturation.request_overhead``): the router counts every
    prompt it places here as its FLOPs plus this, and Θ and ``throughput_flops_per_s`` count the same way.
    None or 0: a request costs its FLOPs alone."""
    overhead_prompt_tokens: int | None = None
    """Tokens per prompt of the short requests timed against the profile's own to find the overhead."""


@dataclass(frozen=True)
class WorkerInfo:
    """``GET /sgl_moe/info``: everything a router needs to know about a worker, with no other configuration."""

    model_name: str
    page_size: int
    flops: FlopsModel
    """Per-token FLOPs constants (seed 000 Eq. 2): the router measures load with them."""
    saturation: SaturationInfo
    model_path: str = ""
    instance_id: str | None = None
    """New on every start: a router that sees it change knows the worker restarted with an empty cache."""
    context_length: int = 0
    vocab_size: int = 0
    """Rows of the embedding table: the router refuses token ids at or above it (0: unknown)."""
    hidden_size: int = 0
    """Width of an ``input_embeds`` row (0: unknown)."""
    dp_size: int = 1
    prefix_caching: bool = True
    kv_events: list[KvEventEndpoint] = field(default_factory=list)
    tokenizer: TokenizerFiles = field(default_factory=TokenizerFiles)
    device: str = ""
    sgl_moe_version: str = ""
    sglang_version: str = ""
    moe_args: dict[str, Any] = field(default_factory=dict)
    """The worker's ``--moe-*`` flags (``worker.args.MoeArgs`` as a dict)."""
    offload: dict[str, Any] | None = None
    """Expert offload settings and the scheduler's latest counts (only with ``--moe-expert-offload``)."""
    dual_batch: dict[str, Any] | None = None
    """Dual micro-batch placement and counts (only with ``--moe-dual-batch``)."""

    @property
    def calibrating(self) -> bool:
        return self.saturation.state == "calibrating"


def kv_events_config(text: str) -> dict[str, Any]:
    """SGLang's ``--kv-events-config`` JSON as a dict; ValueError naming what does not parse."""
    import json

    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--kv-events-config is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    return cfg


def tcp_endpoint(endpoint: str, key: str = "endpoint") -> tuple[str, int]:
    """``tcp://host:port`` -> (``tcp://host``, port); ValueError for anything else (a router subscribes to TCP only)."""
    head, _, port = str(endpoint).rpartition(":")
    if not head.startswith("tcp://") or not port.isdigit():
        raise ValueError(f"--kv-events-config {key} must be tcp://HOST:PORT, got {endpoint!r}")
    return head, int(port)


def kv_event_endpoints(config: str, dp_size: int, curve_public_key: str | None = None) -> list[KvEventEndpoint]:
    """The publishers a ``--kv-events-config`` JSON starts: one per DP rank, on the configured port + rank
    (SGLang's ``ZmqEventPublisher.offset_endpoint_port``). A publisher that is not ZMQ publishes nothing.
    ValueError naming what does not parse."""
    cfg = kv_events_config(config)
    if cfg.get("publisher", "null") not in KV_EVENTS_PUBLISHERS:
        return []
    endpoint = tcp_endpoint(cfg.get("endpoint") or SGLANG_DEFAULT_KV_ENDPOINT)
    replay = tcp_endpoint(cfg["replay_endpoint"], "replay_endpoint") if cfg.get("replay_endpoint") else None
    return [KvEventEndpoint(dp_rank=r, endpoint=f"{endpoint[0]}:{endpoint[1] + r}",
                            replay_endpoint=f"{replay[0]}:{replay[1] + r}" if replay else None,
                            topic=str(cfg.get("topic") or ""), curve_public_key=curve_public_key)
            for r in range(max(1, dp_size))]


def encode(message: Any) -> bytes:
    """JSON bytes of a message (or of any JSON-able value)."""
    import msgspec

    return msgspec.json.encode(message)


def to_builtins(message: Any) -> Any:
    """A message as plain dicts and lists (for a caller that merges it into a larger JSON document)."""
    import msgspec

    return msgspec.to_builtins(message)


def decode_info(data: bytes | str | dict[str, Any]) -> WorkerInfo:
    """``WorkerInfo`` from the JSON bytes of ``GET /sgl_moe/info`` (or its already parsed dict)."""
    import msgspec

    try:
        if isinstance(data, dict):
            return msgspec.convert(data, WorkerInfo)
        return msgspec.json.decode(data, type=WorkerInfo)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise WireError(f"{INFO_PATH} does not match this sgl_moe version's WorkerInfo: {exc}") from None
