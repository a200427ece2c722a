"""Locust users that replay the prefill-only workloads of seed 000 Table 2 (contract B) against the router.

One user class per workload (``MoralUser`` ... ``ArxivUser``, weighted by Table 2's request counts) and
``MixUser``, which replays the aggregated mix itself (requests drawn in Table 2's proportions by
``sgl_moe.workloads.generate``). Name the classes to run; with none named, locust runs all seven.

    locust -f loadtest/locustfile.py --headless -H http://127.0.0.1:30080 -u 8 -r 8 -t 60s MixUser

Users are closed-loop (no think time): the load test measures throughput, as in the paper's offline
pipelines. Every failure is reported to locust with its reason: a non-2xx answer, a result carrying
``error``, a malformed answer, a timeout or a connection error. Statistics rows are named
``<path> <workload>``. Request building and checking live in ``sgl_moe.loadtest.traffic``.

Options (each with an environment fallback): ``--api classify|generate`` (``SGL_MOE_API``),
``--workload-scale`` (``SGL_MOE_WORKLOAD_SCALE``), ``--workload-seed`` (``SGL_MOE_WORKLOAD_SEED``),
``--max-context`` (``SGL_MOE_MAX_CONTEXT``), ``--request-timeout`` (``SGL_MOE_REQUEST_TIMEOUT``).
"""

from __future__ import annotations

import csv

from gevent.pool import Group
from locust import FastHttpUser, constant, events, task
from locust.env import Environment
from locust.runners import WorkerRunner
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from sgl_moe.loadtest.traffic import (
    APIS,
    CLASSIFY_PATH,
    GENERATE_PATH,
    StreamOptions,
    TaskStream,
    check_classify,
    check_generate,
    classify_body,
    generate_bodies,
    request_name,
    user_weight,
)
from sgl_moe.workloads import WORKLOADS

HEADERS = {"content-type": "application/json"}
_streams: dict[tuple[str, ...], TaskStream] = {}
_env: list[Environment] = []


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:
    group = parser.add_argument_group("sgl_moe workloads")
    group.add_argument("--api", choices=APIS, default="classify", env_var="SGL_MOE_API",
                       help="classify: one POST /v1/classify per task; generate: one POST /generate "
                            "(max_new_tokens=1) per prefill unit of the task")
    group.add_argument("--workload-scale", type=float, default=StreamOptions.workload_scale,
                       env_var="SGL_MOE_WORKLOAD_SCALE", help="divide Table 2 context lengths by this")
    group.add_argument("--workload-seed", type=int, default=StreamOptions.workload_seed,
                       env_var="SGL_MOE_WORKLOAD_SEED", help="seed of the workload stream")
    group.add_argument("--max-context", type=int, default=StreamOptions.max_context,
                       env_var="SGL_MOE_MAX_CONTEXT", help="clip prompts to this many tokens")
    group.add_argument("--request-timeout", type=float, default=600.0, env_var="SGL_MOE_REQUEST_TIMEOUT",
                       help="seconds before a request counts as failed (timeout)")


@events.init.add_listener
def _remember_environment(environment: Environment, **_) -> None:
    _env[:] = [environment]


@events.quit.add_listener
def _write_final_csv(**_) -> None:
    """Write the CSV files once more from the final statistics.

    Locust rewrites them once a second and not again at shutdown, so without this the last second of a
    run (up to a third of a 3-second test) is missing from them. Its own writer truncates and flushes on
    every rewrite, so closing its handles after this adds nothing.
    """
    env = _env[0] if _env else None
    prefix = getattr(env.parsed_options, "csv_prefix", None) if env is not None else None
    if env is None or not prefix or isinstance(env.runner, WorkerRunner):
        return
    writer = StatsCSV(env, PERCENTILES_TO_REPORT)
    for suffix, write in (("_stats.csv", writer.requests_csv), ("_failures.csv", writer.failures_csv),
                          ("_exceptions.csv", writer.exceptions_csv)):
        with open(prefix + suffix, "w", newline="") as f:
            write(csv.writer(f))


def _stream(user: WorkloadUser) -> TaskStream:
    """The process-wide stream of the user's class (created by its first user)."""
    key = user.workloads
    if key not in _streams:
        o = user.environment.parsed_options
        opts = StreamOptions(workload_scale=o.workload_scale, workload_seed=o.workload_seed,
                             max_context=o.max_context)
        _streams[key] = TaskStream(key, opts, getattr(user.environment.runner, "worker_index", 0))
    return _streams[key]


class WorkloadUser(FastHttpUser):
    """Posts the next task of its class's stream, through the API chosen by ``--api``."""

    abstract = True
    workloads: tuple[str, ...] = WORKLOADS
    wait_time = constant(0)
    concurrency = 32  # a multi task's siblings go out together in the generate API

    def __init__(self, environment) -> None:
        timeout = environment.parsed_options.request_timeout
        self.network_timeout = self.connection_timeout = timeout
        super().__init__(environment)
        self.api = environment.parsed_options.api

    @task
    def send_next(self) -> None:
        req, body_task = _stream(self).next()
        name = request_name(self.api, req.workload)
        if self.api == "classify":
            self._post(CLASSIFY_PATH, classify_body(body_task), name, check_classify)
            return
        bodies = generate_bodies(body_task)
        if len(bodies) == 1:
            self._post(GENERATE_PATH, bodies[0], name, check_generate)
            return
        group = Group()  # siblings share the prompt: sent at once, as the router's own expansion does
        for body in bodies:
            group.spawn(self._post, GENERATE_PATH, body, name, check_generate)
        group.join()

    def _post(self, path: str, body: bytes, name: str, check) -> None:
        with self.client.post(path, data=body, headers=HEADERS, name=name, catch_response=True) as resp:
            error = getattr(resp, "error", None)
            if error is not None and not resp.status_code:  # no HTTP answer: timeout or connection error
                resp.failure(f"{type(error).__name__}: {error}")
                return
            why = check(resp.status_code, resp.content or b"")
            if why is None:
                resp.success()
            else:
                resp.failure(why)


class MixUser(WorkloadUser):
    """The aggregated workload: all six, in Table 2's proportions."""

    workloads = WORKLOADS
    weight = 1


class MoralUser(WorkloadUser):
    workloads = ("moral",)
    weight = user_weight("moral")


class MmluUser(WorkloadUser):
    workloads = ("mmlu",)
    weight = user_weight("mmlu")


class BoolqUser(WorkloadUser):
    workloads = ("boolq",)
    weight = user_weight("boolq")


class ImdbUser(WorkloadUser):
    workloads = ("imdb",)
    weight = user_weight("imdb")


class QualityUser(WorkloadUser):
    workloads = ("quality",)
    weight = user_weight("quality")


class ArxivUser(WorkloadUser):
    workloads = ("arxiv",)
    weight = user_weight("arxiv")
