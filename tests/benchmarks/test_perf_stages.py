"""``benchmarks/perf_stages.py`` charges each ``perf`` sample to the innermost stage on its stack, and the rest to the
file its leaf ran in. Three hand-written samples, in ``perf script -F ip,sym,dso``'s shape."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
R = "/work/x/router"

STACKS = f"""
    1a2b _PyObject_GenericGetAttrWithDict (/usr/bin/python3.11)
    1c3d __pyx_pw_7sgl_moe_6router_9placement_9scheduler_9Scheduler_8release ({R}/placement/scheduler.so)
    2d4e __pyx_gb_7sgl_moe_6router_5front_10forwarding_9Forwarder_8generator ({R}/front/forwarding.so)

    3e5f split_and_find ({R}/request/native_word_pieces.so)
    4f60 __pyx_pw_7sgl_moe_6router_7request_11piece_cache_10PieceCache_11_encode ({R}/request/piece_cache.so)
    5a71 __pyx_pw_7sgl_moe_6router_7request_15request_parsing_1parse_request ({R}/request/request_parsing.so)

    6b82 finish_task_switch ([kernel.kallsyms])
    7c93 epoll_wait (/usr/lib/x86_64-linux-gnu/libc.so.6)
"""


def test_each_sample_goes_to_its_innermost_stage(tmp_path):
    stacks = tmp_path / "router.stacks"
    stacks.write_text(STACKS)
    out = tmp_path / "stages.json"
    proc = subprocess.run([sys.executable, "benchmarks/perf_stages.py", str(stacks), "--stage", "parse",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["samples"] == 3
    # The release inside the forwarder is the release's; the parse path's C loop is parse's; no stage: the leaf's file.
    assert result["stages"] == {"release": 1 / 3, "parse": 1 / 3, "other: kernel": 1 / 3}
    assert result["stage"]["own"] == {"split_and_find": 1}
    assert set(result["stage"]["inclusive"]) == {"split_and_find", "7request_11piece_cache_10PieceCache_11_encode",
                                                 "7request_15request_parsing_1parse_request"}
    assert "| parse | 33.3% |" in proc.stdout
