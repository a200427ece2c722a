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
