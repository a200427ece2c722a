"""Real SGLang workers on the shipped model, started once per session and shared, and router processes.

Every test in this folder is marked ``worker`` here (``-m "not worker"`` skips the folder). Fixtures:
``worker``: one worker with default flags. ``start_worker(log_path, args)``: a ready worker with other flags
(the caller stops it). ``cluster``: two small-pool workers for the router tests. ``worker_factory``: an extra
worker one test may kill. ``router_factory``: ``python -m sgl_moe.router`` processes in front of given workers
(each test gets fresh router state).
"""

from pathlib import Path

import pytest

from sgl_moe.harness.router_process import RouterProcess, RouterStartError
from sgl_moe.harness.worker_process import WorkerProcess, WorkerStartError

HERE = Path(__file__).resolve().parent

WORKER_ARGS = ["--max-total-tokens", "16384"]
"""A small KV pool: three or four workers fit in the CI machine's memory next to each other."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.worker)


def _start(log_path, args=()):
    proc = WorkerProcess(log_path=log_path, args=list(args)).start()
    try:
        proc.info = proc.wait_ready(timeout=600)
    except WorkerStartError as exc:
        proc.stop()
        pytest.fail(str(exc))
    return proc


def _start_workers(folder, ports):
    """Start workers side by side (they load in parallel), then wait for each."""
    workers = [WorkerProcess(log_path=folder / f"worker{i}-{port}.log", args=WORKER_ARGS, port=port).start()
               for i, port in enumerate(ports)]
    try:
        for w in workers:
            w.info = w.wait_ready(timeout=600)
    except WorkerStartError as exc:
        for w in workers:
            w.stop()
        pytest.fail(str(exc))
    return workers


@pytest.fixture(scope="session")
def start_worker():
    """``start_worker(log_path, args)``: a ready worker (the caller stops it)."""
    return _start


@pytest.fixture(scope="session")
def worker(tmp_path_factory):
    proc = _start(tmp_path_factory.mktemp("worker") / "worker.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    workers = _start_workers(tmp_path_factory.mktemp("cluster"), [0, 0])
    yield workers
    for w in workers:
        w.stop()


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

    def start(port=0):
        [w] = _start_workers(tmp_path, [port])
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
