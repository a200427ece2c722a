"""``worker_steps``: the prefill steps SGLang logged after a mark, as the matrix records them per run."""

from sgl_moe.policy_bench.worker_steps import LogMark, read, steps_since

BEFORE = ("[2026-11-26 15:28:48] Prefill batch, #new-seq: 1, #new-token: 311, #cached-token: 0, token usage: 0.00, "
          "#running-req: 0, #queue-req: 0, #pending-token: 0, cpu graph: False, input throughput (token/s): 9.08\n")
RUN = [  # SGLang 0.5.23's lines (bench-model worker, policy matrix bulk scenario)
    "[2026-11-26 15:28:51] Prefill batch, #new-seq: 4, #new-token: 1152, #cached-token: 0, token usage: 0.51, "
    "#running-req: 1, #queue-req: 36, #pending-token: 0, cpu graph: False, input throughput (token/s): 5.3\n",
    "[2026-11-26 15:28:51] INFO other line\n",
    "[2026-11-26 15:28:52] Prefill batch, #new-seq: 9, #new-token: 1056, #cached-token: 1536, token usage: 0.56, "
    "#running-req: 4, #queue-req: 56, #pending-token: 0, cpu graph: False, input throughput (token/s): 2.0\n",
    "[2026-11-26 15:28:53] Prefill batch, #new-seq: 6, #new-token: 960, #cached-token: 768, token usage: 0.38, "
    "#running-req: 0, #queue-req: 52, #pending-token: 0, cpu graph: False, input throughput (token/s): 2.0\n",
]


def test_only_the_steps_after_the_mark_are_read(tmp_path):
    a, b = tmp_path / "w0.log", tmp_path / "w1.log"
    a.write_text(BEFORE)
    mark = LogMark.now([a, b])  # b does not exist yet: everything it will log counts
    with open(a, "a") as f:
        f.writelines(RUN)
    b.write_text(RUN[0])
    assert [s.requests for s in steps_since(a, mark.offsets[0])] == [4, 9, 6]
    got = read([a, b], mark)
    assert (got["steps"], got["steps_per_worker"], got["requests"]) == (4, [3, 1], 23)
    assert (got["new_tokens"], got["cached_tokens"], got["max_queued"]) == (1152 * 2 + 1056 + 960, 2304, 56)
    assert got["steps_admitted_with_previous_running"] == 1  # the 9-request step: the 4 before it still running
    assert got["requests_per_step"] == 23 / 4


def test_no_log_reads_as_no_steps(tmp_path):
    got = read([tmp_path / "missing.log"], LogMark((0,)))
    assert (got["steps"], got["requests_per_step"]) == (0, None)
