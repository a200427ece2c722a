"""Real SGLang workers on the shipped model, started once per session and shared, and router processes.

Every test in this folder is marked ``worker`` here (``-m "not worker"`` skips the folder). Fixtures:
``cluster``: two small-pool workers for the router tests. ``worker``: the unpatched reference worker (the cluster's
first). ``worker_group``: named workers with other flags, started side by side once for every test (in any module)
that names the group (``WORKER_GROUPS``). ``start_side_by_side({name: WorkerProcess(...)})``: ready workers of a
module's own (the caller stops them, ``stop_side_by_side``). ``worker_factory``: an extra worker one test may kill.
``router_factory``: ``python -m sgl_moe.router`` processes in front of given workers (each test gets fresh router
state).

A worker start costs 35-55 s on the 2-core CI host (imports in the launcher and in SGLang's scheduler process; the
model load and warm-up are ~2 s) plus, unless it is switched off, the start-up Θ profile (15-60 s; minutes when
other processes keep the host busy, as it waits for a quiet host and runs again when disturbed), and 1-6 s to
stop. So tests share workers where their flags agree, workers start and stop side by side where several are
needed, and the ones whose tests are not about Θ skip the profile.
"""

import os
import shutil
from pathlib import Path

import pytest

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.harness.router_process import RouterProcess, RouterStartError
from sgl_moe.harness.worker_process import WorkerProcess, WorkerStartError, stop_all
from sgl_moe.training import fixtures

HERE = Path(__file__).resolve().parent

WORKER_ARGS = ["--max-total-tokens", "16384"]
"""A small KV pool: three or four workers fit in the CI machine's memory next to each other."""

NO_THETA_PROFILE = "--no-moe-theta-profile"
"""For workers whose tests are not about Θ (docs/worker.md): ready as soon as SGLang is, with the fixed Θ of one
full step, which never holds work back. The profile itself is tested on a fresh worker (test_readiness_live.py)
and by the demo (tests/harness)."""

OFFLOAD_ARGS = ["--moe-expert-offload", "--max-total-tokens", "16384"]

WORKER_GROUPS = {
    # The shipped weights behind real checkpoints' tokenizers (sgl_moe.training.fixtures), one worker per kind:
    # test_fixture_models_live.py, test_real_models_live.py and test_tokenizer_probe_live.py.
    "fixture-models": lambda request: {
        kind: ["--model-path", str(request.getfixturevalue(f"{kind}_model_dir")), *WORKER_ARGS, NO_THETA_PROFILE]
        for kind in fixtures.KINDS},
    # Expert offload, both execution modes: test_offload_live.py and the offload benchmark in
    # test_bench_scripts_live.py. (Offload streams weights, so Θ comes from one profiled forward, not the profile.)
    "offload": lambda request: {
        "exact": [*OFFLOAD_ARGS, "--moe-execution", "exact", "--moe-predictor", "hybrid",
                  "--moe-resident-experts", "4"],
        "speculative": [*OFFLOAD_ARGS, "--moe-execution", "speculative", "--moe-predictor", "hybrid"]},
    # Weight streaming from host memory, on the shipped model and on a small random Mixtral: test_streaming_live.py
    # and test_streaming_mixtral_live.py (Θ from one profiled forward; both tests check it).
    "weight-streaming": lambda request: {
        "shipped": ["--moe-weight-streaming", "host", "--moe-stream-window", "2", *WORKER_ARGS],
        "mixtral": ["--model-path", str(request.getfixturevalue("mixtral_dir")), "--moe-weight-streaming", "host",
                    *WORKER_ARGS]},
    # Dual micro-batch overlap, both placements: test_dual_batch_live.py.
    "dual-batch": lambda request: {
        placement: ["--moe-dual-batch", placement, "--moe-dual-batch-always", *WORKER_ARGS, NO_THETA_PROFILE]
        for placement in ("cpu-experts", "streams")},
}
"""Each group: a function of the fixture request giving each worker's name and flags."""


@pytest.fixture(scope="session", autouse=True)
def _no_crash_diagnostics_on_stop():
    """Workers stop in ~1 s instead of 5-6 s. Stopping one signals its whole process group, so SGLang takes its
    scheduler's exit for a crash and waits 5 s to let GPU activity settle before its crash diagnostics (a py-spy dump
    of live schedulers, a CUDA core dump), of which a CPU worker whose scheduler is gone has none. A value set in the
    environment wins."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH"):
            mp.setenv(name, os.environ.get(name, "0"))
        yield


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.worker)


def start_side_by_side(workers: dict[str, WorkerProcess]) -> dict[str, WorkerProcess]:
    """Start workers side by side, then wait for each: on the 2-core CI host two take about 1.5 times one start,
    not twice (the caller stops them, e.g. with ``stop_side_by_side``)."""
    for w in workers.values():
        w.start()
    try:
        for w in workers.values():
            w.info = w.wait_ready(timeout=600)
    except WorkerStartError as exc:
        for w in workers.values():
            w.stop()
        pytest.fail(str(exc))
    return workers


stop_side_by_side = stop_all


def _start_workers(folder, ports, args=WORKER_ARGS):
    """Workers with the same flags, started side by side."""
    return list(start_side_by_side({f"worker{i}": WorkerProcess(log_path=folder / f"worker{i}-{port}.log",
                                                                 args=list(args), port=port)
                                     for i, port in enumerate(ports)}).values())


@pytest.fixture(scope="session")
def mixtral_dir(tmp_path_factory):
    """A small random Mixtral (float32) with the shipped tokenizer, for the streaming adapter on another model."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=4096, hidden_size=128, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                        max_position_embeddings=4096, initializer_range=0.1)
    out = tmp_path_factory.mktemp("tiny-mixtral")
    MixtralForCausalLM(cfg).to(torch.float32).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_MODEL_DIR / name, out / name)
    return out


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    # Not about Θ: the router tests that depend on it pin it (the router's --saturation-flops).
    workers = _start_workers(tmp_path_factory.mktemp("cluster"), [0, 0], [*WORKER_ARGS, NO_THETA_PROFILE])
    yield workers
    stop_side_by_side(workers)


@pytest.fixture(scope="session")
def worker(cluster):
    """The unpatched reference worker (no ``--moe-*`` engine flag): the cluster's first, not a start of its own."""
    return cluster[0]


class WorkerGroup:
    """Named workers started side by side on first use; ``stop()`` ends them, and a later use starts them again.
    A failed start fails every later use at once (as a failed fixture does), without starting them again."""

    def __init__(self, folder: Path, specs: dict[str, list[str]]):
        self.folder, self.specs, self.starts = folder, specs, 0
        self._workers: dict[str, WorkerProcess] | None = None
        self._failed: str | None = None

    def __getitem__(self, name: str) -> WorkerProcess:
        if self._failed is not None:
            pytest.fail(self._failed)
        if self._workers is None:
            self.starts += 1
            try:
                self._workers = start_side_by_side({
                    n: WorkerProcess(log_path=self.folder / f"{n}-{self.starts}.log", args=list(args))
                    for n, args in self.specs.items()})
            except pytest.fail.Exception as exc:
                self._failed = str(exc)
                raise
        return self._workers[name]

    def stop(self) -> None:
        stop_side_by_side((self._workers or {}).values())
        self._workers = None


_groups: dict[str, WorkerGroup] = {}


@pytest.fixture(scope="session")
def worker_group(request, tmp_path_factory):
    """``worker_group[name]``: a worker of the group a test names with
    ``@pytest.mark.parametrize("worker_group", ["offload"], indirect=True)`` (``WORKER_GROUPS``).

    pytest orders the tests of a parametrized session fixture by parameter: the tests of one group, whatever their
    module, run one after another (moved up to where the first of them was), so its workers start once.
    ``pytest_runtest_teardown`` stops them after the group's last test, so groups never add up in memory."""
    group = _groups[request.param] = WorkerGroup(tmp_path_factory.mktemp(request.param),
                                                 WORKER_GROUPS[request.param](request))
    yield group
    group.stop()
    _groups.pop(request.param, None)


def _group_of(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("worker_group") if callspec is not None else None


def pytest_runtest_teardown(item, nextitem):
    """A group's tests are contiguous (``worker_group``): once the next test is not one of them, no later test is,
    so its workers stop now (the session fixture would keep them until another group starts or the session ends)."""
    name = _group_of(item)
    if name is not None and name != _group_of(nextitem) and name in _groups:
        _groups[name].stop()


@pytest.fixture
def router_factory(tmp_path):
    routers = []

    def start(workers, *args):
        r = RouterProcess(log_path=tmp_path / f"router{len(routers)}.log",
                          worker_urls=[w.url for w in workers], args=["--log-level", "debug", *args])
        routers.append(r)
        r.start()
        try:
            r.wait_ready(timeout=60)
        except RouterStartError as exc:
            pytest.fail(str(exc))
        return r

    yield start
    for r in routers:
        r.stop()


@pytest.fixture
def worker_factory(tmp_path):
    """Start an extra worker for one test (one the test may kill); all are stopped afterwards."""
    started = []

    def start(port=0, args=WORKER_ARGS):
        [w] = _start_workers(tmp_path, [port], args)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
