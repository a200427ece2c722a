"""Real CPU workers of the shipped model, started once for all router tests that need them, and routers.

``cluster``: two workers that live for the whole session. ``router_factory``: starts
``python -m sgl_moe.router`` processes in front of given workers (each test gets fresh router state).
"""

import pytest

from sgl_moe.router_process import RouterProcess, RouterStartError
from sgl_moe.worker_process import WorkerProcess, WorkerStartError

# A small KV pool: three or four workers fit in the CI machine's memory next to each other.
WORKER_ARGS = ["--max-total-tokens", "16384"]


def start_workers(tmp_path_factory, n, name):
    workers = [WorkerProcess(log_path=tmp_path_factory.mktemp(name) / f"worker{i}.log", args=WORKER_ARGS).start()
               for i in range(n)]
    try:
        for w in workers:
            w.info = w.wait_ready(timeout=600)
    except WorkerStartError as exc:
        for w in workers:
            w.stop()
        pytest.fail(str(exc))
    return workers


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    workers = start_workers(tmp_path_factory, 2, "cluster")
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
    """Start extra workers for one test (one that test may kill); all are stopped afterwards."""
    started = []

    def start(port=0):
        w = WorkerProcess(log_path=tmp_path / f"worker{len(started)}.log", args=WORKER_ARGS, port=port).start()
        started.append(w)
        try:
            w.info = w.wait_ready(timeout=600)
        except WorkerStartError as exc:
            pytest.fail(str(exc))
        return w

    yield start
    for w in started:
        w.stop()
