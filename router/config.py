"""The router's configuration: one frozen dataclass; every field is a ``--flag`` of ``python -m sgl_moe.router``."""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Literal

from sgl_moe.cli_args import add_dataclass_args, from_namespace

Policy = Literal["longest_block_match", "round_robin", "least_flops"]
KEY_ENV = {"api_key": "SGL_MOE_API_KEY", "admin_api_key": "SGL_MOE_ADMIN_API_KEY", "peers_token": "SGL_MOE_PEERS_TOKEN"}
"""Environment variables the keys are read from when their flags are not given (flags show in ``ps``)."""
SECRET_FIELDS = frozenset(KEY_ENV)
"""Fields never printed or served (``describe_config`` redacts them)."""


def is_loopback(host: str) -> bool:
    """``host`` (as given to ``--host``) only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    """Address the router listens on."""
    port: int = 30080
    """Port the router listens on."""
    api_key: str | None = None
    """Key clients must send (``Authorization: Bearer KEY``) on every inference route; the router sends it on
    to the workers (start them with SGLang's ``--api-key`` set to the same key). Default: $SGL_MOE_API_KEY."""
    admin_api_key: str | None = None
    """Key for the routes that change state (POST/DELETE /workers) and list workers (GET /workers); it also
    opens the inference routes. Default: $SGL_MOE_ADMIN_API_KEY."""
    allow_unauthenticated_admin: bool = False
    """Start on a non-loopback --host without --admin-api-key (anyone who reaches the port may then add or
    remove workers). Without this flag the router refuses to start that way."""
    max_body_bytes: int = 16 * 2**20
    """Largest request body; a larger one is answered 413 before it is read (Content-Length) or as soon as
    the bytes read exceed it."""
    parse_inline_bytes: int = 64 * 1024
    """Bodies up to this size are parsed and tokenized on the event loop; larger ones in a thread (the
    tokenizers library releases the GIL), placed in arrival order all the same. 0: every body in a thread."""
    front_processes: int = 1
    """Processes that take clients' requests (HTTP, parsing, tokenizing, hashing, forwarding), each on its own
    SO_REUSEPORT socket on --host/--port, in front of one process that owns placement (the tables, Θ admission and
    the queue). 1: one process does everything. More lets a router use more cores; each costs ~100 MB and a
    message round trip per request to the owner."""
    http_server: Literal["bare", "aiohttp"] = "bare"
    """bare: the proxied routes' common requests (a small body, an answer not streamed) are served on bare
    asyncio protocols, everything else by aiohttp's server on the same port (``http_server``: 120-134k fewer
    instructions per request, 7-11% of a short one); aiohttp: every request on aiohttp's server. With
    --front-processes > 1 each front serves this way."""
    max_prompts: int = 1024
    """Most prompts (batch entries, score items, decision options) one request may carry."""
    max_request_tokens: int = 262_144
    """Most prompt tokens one request may carry, summed over its prompts (text is checked by length before it
    is tokenized)."""
    max_n: int = 64
    """Most parallel samples (``n``; also ``best_of`` and ``beam_width``) one prompt may ask for; with several prompts,
    ``n`` times the prompts may not pass --max-prompts either (SGLang turns each sample into a request of its
    own). Checked before tokenizing. OpenAI allows up to 128; a prefill-only server rarely wants more than a few."""
    max_grammar_chars: int = 32_768
    """Longest constrained-decoding grammar one request may carry, in characters: ``regex``, ``json_schema``,
    ``ebnf``, ``structural_tag`` and ``stop_regex`` (in ``sampling_params`` or at the top level of the OpenAI
    routes) and ``response_format``. The worker compiles these before it runs the request; real schemas and
    patterns are a few KB (OpenAI's structured outputs cap property names and enums at 15,000 characters)."""
    max_grammar_depth: int = 64
    """Deepest nesting in such a grammar: groups in a regex, parentheses in an EBNF grammar, objects and arrays in
    a JSON schema. A regex of 3,000 nested groups held a worker's grammar compiler for 11.8 s before SGLang
    refused it; hand-written patterns nest a few levels, schemas a few dozen at most."""
    header_timeout_s: float = 30.0
    """A connection that has not sent a complete request head (line and headers) this long after it opened,
    or after its previous response, is closed."""
    body_timeout_s: float = 60.0
    """A request whose body has not arrived in full this long after its head is answered 408."""
    suspect_ttl_s: float = 3600.0
    """How long the router remembers the requests that were running on a worker when it died (suspects: one of
    them may have killed it). The router retries each itself, alone on a healthy worker and one at a time (the
    quarantine lane); one whose retry kills that worker too is poison and is refused (400) for this long, the
    others are answered."""
    abort_timeout_s: float = 10.0
    """Longest the router waits for a worker to accept the abort of a request whose client went away. The
    request's load stays counted on the worker until then: a worker too busy to answer the abort is still
    running it. An abort not accepted in time is counted (``abort_failures``) and the load released."""
    policy: Policy = "longest_block_match"
    """Placement policy. All share discovery, admission (Θ), the FIFO queue and the proxy; only the choice
    of worker differs: longest_block_match (prefix affinity with FLOPs-aware spill), round_robin,
    least_flops (in-flight FLOPs relative to Θ, no affinity)."""
    saturation_flops: float | None = None
    """Θ for every worker in FLOPs, overriding the value each worker reports (and its later calibration)."""
    request_overhead_flops: float | None = None
    """Fixed work of one request (FLOPs) for every worker, overriding what each measured. Workers of one kind
    measure slightly different values; pinned with ``saturation_flops``, they cost every job alike, so placement
    takes the load-ordered fast path instead of scoring every worker."""
    pool_calibrations: bool = True
    """Workers of one kind (model, FLOPs constants, device, DP ranks, step size, ``--moe-*`` flags) share one Θ and
    one request overhead: the median of their start-up calibrations (``calibration_pool``). A compute-bound
    worker's profile is flat, so its knee is noise: three identical CPU workers measured Θ 3x apart, and the one
    with the smallest sat idle. ``--no-pool-calibrations``: each worker keeps its own."""
    queue_size: int = 4096
    """Requests that may wait for admission; beyond it the router answers 429 with Retry-After."""
    queue_timeout_s: float = 300.0
    """A request that waited this long for admission is answered 503."""
    max_affinity_wait_s: float = 2.0
    """Longest a queued request waits for its best-matching (saturated) worker while another has room."""
    prefix_wait_s: float = 1.0
    """``longest_block_match``: a request whose best match ends in blocks only *promised* by a request still
    running on that worker waits (up to this long) until they are stored, then reuses them instead of
    computing the same prefix again. SGLang's overlap scheduler admits a worker's next step before the previous
    step's prefixes enter its radix cache, so a request sent behind its prefix's leader recomputes it. Measured
    on the bench model (benchmarks/results/router/matrix-4scen-bench-model-theta4req-holds*-e173884.md, Θ fixed):
    with holds the router's predicted cached tokens were within 3% of what the workers reported in 8 of 8 runs,
    without them 5-20% high in 6 of 8, and req/s moved by -3% to +1%. 0 disables the wait (the default until
    2026-11-26, chosen on the shipped model, whose steps are mostly fixed cost)."""
    prefix_wait_min_tokens: int = 64
    """Hold a request for promised blocks only when they cover at least this many tokens."""
    prefix_memo: bool = True
    """Tokenize and page-hash a prefix the router has seen once (``prefix_memo``); off: every text is encoded
    whole (for comparisons, or should the memo's sampled check ever be doubted)."""
    hold_spills: bool = True
    """A request about to be held for promised blocks goes to another worker with room instead when recomputing
    its prompt there finishes sooner than waiting behind the holder (the spill rule applied to a hold)."""
    prefix_homes: bool = True
    """``longest_block_match``: a request whose prefix no worker holds (evicted everywhere) goes to the worker
    its prefix was last placed on when that has room; in a backlog it waits for it in the pump's first pass,
    where room goes to the jobs whose home it is (``prefix_homes``). Without it (``--no-prefix-homes``) such a
    request goes to the least-loaded worker and, with KV pools smaller than the live prefixes, every worker ends
    up serving (and evicting) every prefix: measured on 3 CPU workers with bounded pools, open loop at 95% of
    capacity, cached fraction 0.55 without against 0.69 with (``cache_aware`` 0.66 / 0.69 in the same runs)."""
    pending_ttl_s: float = 10.0
    """Safety net: a completed request's pending blocks are dropped this long after completion even if the
    worker never reports them stored (e.g. evicted at once, or KV events lost)."""
    health_interval_s: float = 2.0
    """Seconds between health checks of each worker."""
    health_timeout_s: float = 5.0
    """A health check not answered within this time counts as failed (a busy worker answers slowly)."""
    health_failures: int = 3
    """Consecutive failed health checks that take a worker out of rotation (a refused connection during a
    request takes it out at once)."""
    health_stall_s: float = 60.0
    """A worker with requests in flight whose health probes fail stays in rotation while it made progress (an
    answer, KV events) within this many seconds; a refused connection takes it out at once."""
    request_timeout_s: float = 600.0
    """Longest a worker may take to answer one request."""
    worker_keepalive_s: float = 2.0
    """An idle connection to a worker is reused only this long, well inside SGLang's own keep-alive (uvicorn's
    ``SGLANG_TIMEOUT_KEEP_ALIVE``, 5 s): a connection the worker closed while idle would otherwise break the
    next request sent on it (seen at 100 req/s on the policy matrix: hundreds of requests failed with "Server
    disconnected" on three healthy workers, with aiohttp's default of 15 s)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Logging level; debug prints one line per routing decision."""
    debug_drop_event_seqs: str = ""
    """Fault injection for tests: comma-separated KV-event sequence numbers to drop on receipt."""
    tokenizer_path: str | None = None
    """Plain SGLang workers (no /sgl_moe/info): local directory with the model's tokenizer files, which the
    router loads as SGLang does to hash prompts. Default: the server's tokenizer_path when it is such a
    directory on the router's machine."""
    model_dir: str | None = None
    """Plain SGLang workers: local directory with the model's config.json (FLOPs constants, context length).
    Default: the server's model_path when it is such a directory on the router's machine."""
    page_size: int | None = None
    """Plain SGLang workers: page size (tokens per KV block), overriding the one /server_info reports."""
    kv_events_config: str | None = None
    """Plain SGLang workers: their --kv-events-config JSON (publisher, endpoint, replay_endpoint, topic),
    overriding the publisher /server_info reports; rank r publishes on the endpoint's port + r.
    '{"publisher": "null"}': subscribe to none."""
    kv_events_keys: str | None = None
    """Directory with the router's CURVE keys for the workers' KV-event sockets (the router/ folder made by
    `python -m sgl_moe.kv_event_keys DIR`: router.key_secret and worker.key). Needed to read the events of
    workers started with --moe-kv-events-keys; used for every worker's event and replay sockets."""
    peers: str | None = None
    """NATS broker through which router replicas in front of the same workers share their pending blocks and
    in-flight FLOPs (``nats://HOST:4222``; ``nats://USER:PASSWORD@HOST:4222`` for user/password auth), so that Θ
    admission counts every replica's work. Unset: this router runs alone. Every replica must list the same worker
    URLs (workers are named by URL between replicas). How they place: --replica-placement."""
    peers_token: str | None = None
    """Token for the broker's token authentication. Default: $SGL_MOE_PEERS_TOKEN."""
    peers_cluster: str = "default"
    """Replicas share state with those of the same cluster name (the NATS subject ``sgl_moe.router.<name>``)."""
    replica_placement: Literal["owner", "shared"] = "owner"
    """With --peers: ``owner``, the replica up longest places every replica's requests (one set of tables, one Θ
    admission, one queue; the others parse, tokenize, hash and forward; if it goes away they place on their own
    shared tables until the next owner answers); ``shared``, each replica places its own requests on tables shared
    with the others (herds within a message delay; docs/router.md, Replicas)."""
    replica_name: str | None = None
    """This replica's name among its peers (logs, ``GET /workers``; letters, digits, '-', '_' or '.').
    Default: host, process id and a random tag."""
    peer_heartbeat_s: float = 1.0
    """How often a replica publishes its load even when it has not changed (and checks its peers' heartbeats)."""
    peer_timeout_s: float = 5.0
    """A replica not heard from this long (killed, partitioned) is dropped: its promises and load are removed."""
    worker_urls: tuple[str, ...] = field(default=())

    def validate(self) -> None:
        for name in ("front_processes", "queue_size", "health_failures", "max_body_bytes", "max_prompts",
                     "max_request_tokens", "max_n",
                     "max_grammar_chars", "max_grammar_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("queue_timeout_s", "pending_ttl_s", "health_interval_s", "health_timeout_s", "request_timeout_s",
                     "worker_keepalive_s", "health_stall_s",
                     "header_timeout_s", "body_timeout_s", "suspect_ttl_s", "abort_timeout_s", "peer_heartbeat_s",
                     "peer_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.parse_inline_bytes < 0:
            raise ValueError(f"--parse-inline-bytes must be >= 0, got {self.parse_inline_bytes}")
        if self.prefix_wait_s < 0 or self.prefix_wait_min_tokens < 0:
            raise ValueError("--prefix-wait-s and --prefix-wait-min-tokens must be >= 0")
        if self.max_affinity_wait_s < 0:
            raise ValueError(f"--max-affinity-wait-s must be >= 0, got {self.max_affinity_wait_s}")
        if self.saturation_flops is not None and not self.saturation_flops > 0:
            raise ValueError(f"--saturation-flops must be positive, got {self.saturation_flops}")
        if self.request_overhead_flops is not None and not self.request_overhead_flops >= 0:
            raise ValueError(f"--request-overhead-flops must be >= 0, got {self.request_overhead_flops}")
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be in 1..65535, got {self.port}")
        for url in self.worker_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"worker URL must start with http:// or https://, got {url!r}")
        if self.peers is not None and not self.peers.startswith(("nats://", "tls://")):
            raise ValueError(f"--peers must be a NATS URL (nats://HOST:PORT), got {self.peers!r}")
        if not self.peers_cluster or not all(c.isalnum() or c in "-_" for c in self.peers_cluster):
            raise ValueError(f"--peers-cluster must be letters, digits, '-' or '_', got {self.peers_cluster!r}")
        if self.replica_name is not None and (not self.replica_name or not all(
                c.isalnum() or c in "-_." for c in self.replica_name) or not self.replica_name.isascii()):
            raise ValueError(f"--replica-name must be letters, digits, '-', '_' or '.', got {self.replica_name!r}")
        if self.peers is not None and self.replica_placement == "owner" and self.front_processes > 1:
            raise ValueError("--front-processes > 1 with --peers places the fronts' requests on this replica's "
                             "tables, not through the placement owner: add --replica-placement shared, or run "
                             "more replicas of one process each")
        if self.peer_timeout_s <= self.peer_heartbeat_s:
            raise ValueError("--peer-timeout-s must be longer than --peer-heartbeat-s")
        for name in ("api_key", "admin_api_key", "peers_token"):
            key = getattr(self, name)
            if key is not None and (not key or key != key.strip() or not key.isprintable()):
                raise ValueError(f"--{name.replace('_', '-')} must be a non-empty printable string without "
                                 "surrounding spaces")
        if not is_loopback(self.host) and not self.admin_api_key and not self.allow_unauthenticated_admin:
            raise ValueError(f"--host {self.host} is not a loopback address: anyone who reaches it could add or "
                             "remove workers. Set --admin-api-key (or $SGL_MOE_ADMIN_API_KEY), or pass "
                             "--allow-unauthenticated-admin to accept that")
        self.drop_seqs()
        from sgl_moe.router.membership.plain_worker import check_flags  # here, so that this module stays a leaf

        check_flags(self)

    def drop_seqs(self) -> frozenset[int]:
        try:
            return frozenset(int(s) for s in self.debug_drop_event_seqs.split(",") if s.strip())
        except ValueError:
            raise ValueError(f"--debug-drop-event-seqs must be integers, got {self.debug_drop_event_seqs!r}") from None

    @staticmethod
    def parser() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog="python -m sgl_moe.router",
            description="Prefix-aware, FLOPs-aware router in front of sgl_moe workers (SGLang).")
        parser.add_argument("--worker-urls", nargs="*", default=[], metavar="URL",
                            help="base URLs of workers started with `python -m sgl_moe.launch_server`, or plain SGLang "
                                 "servers (see --tokenizer-path; more can be added at run time with POST /workers)")
        add_dataclass_args(parser, RouterConfig, "", "router options", exclude=("worker_urls",))
        return parser

    @classmethod
    def from_argv(cls, argv: list[str] | None) -> RouterConfig:
        ns = cls.parser().parse_args(argv)
        keys = {name: getattr(ns, name) if getattr(ns, name) is not None else os.environ.get(env) or None
                for name, env in KEY_ENV.items()}
        cfg = from_namespace(cls, ns, "", worker_urls=tuple(u.rstrip("/") for u in ns.worker_urls), **keys)
        cfg.validate()
        return cfg
