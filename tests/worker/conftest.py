"""One real SGLang worker on the shipped model, shared by every test in this folder (~1 min to start), and a
factory for the extra workers some modules start with other flags."""

import pytest

from sgl_moe.worker_process import WorkerProcess, WorkerStartError


def _start(log_path, args=()):
    proc = WorkerProcess(log_path=log_path, args=list(args)).start()
    try:
        proc.info = proc.wait_ready(timeout=600)
    except WorkerStartError as exc:
        proc.stop()
        pytest.fail(str(exc))
    return proc


@pytest.fixture(scope="session")
def start_worker():
    """``start_worker(log_path, args)``: a ready worker (the caller stops it)."""
    return _start


@pytest.fixture(scope="session")
def worker(tmp_path_factory):
    proc = _start(tmp_path_factory.mktemp("worker") / "worker.log")
    yield proc
    proc.stop()
