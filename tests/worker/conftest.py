"""One real SGLang worker on the shipped model, shared by every test in this folder (~1 min to start)."""

import pytest

from sgl_moe.worker_process import WorkerProcess, WorkerStartError


@pytest.fixture(scope="session")
def worker(tmp_path_factory):
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    proc = WorkerProcess(log_path=log).start()
    try:
        info = proc.wait_ready(timeout=600)
    except WorkerStartError as exc:
        pytest.fail(str(exc))
    proc.info = info
    yield proc
    proc.stop()
