"""``live_replay``: a live policy matrix's scenarios replayed on the live run's stream, arrivals and workers."""

import json
from dataclasses import asdict

import pytest

from sgl_moe import DEFAULT_MODEL_DIR
from sgl_moe.policy_bench import scenarios as live_scenarios
from sgl_moe.policy_bench.matrix import router_settings
from sgl_moe.policy_bench.prefix_stream import build_prefix_stream
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.simulator.__main__ import main
from sgl_moe.simulator.live_replay import LiveWorkers, replay_matrix, scenario_config, scenario_units
from sgl_moe.simulator.simulation import SimConfig
from sgl_moe.simulator.timing_model import cpu_tiny

SIZES = live_scenarios.SMOKE


def live_matrix(names=("bulk-zipf-bounded", "closed-uniform-bounded", "open50-zipf-bounded")) -> dict:
    """A matrix JSON as ``policy_bench --matrix`` writes it, with made-up live figures."""
    scenarios = []
    for name in names:
        scn = next(s for s in live_scenarios.MATRIX if s.name == name)
        requests = 18 if scn.arrival == "open" else SIZES.requests
        results = [{"policy": p, "throughput_rps": rps, "cached_fraction": 0.5, "tasks": requests,
                    "prompt_tokens": requests * 80, "router_stats": {}}
                   for p, rps in (("longest_block_match", 12.0), ("cache_aware", 10.0), ("round_robin", 8.0))]
        scenarios.append({"name": name, "arrival": scn.arrival, "pool": scn.pool, "popularity": scn.stream,
                          "offered_rps": 7.5 if scn.arrival == "open" else None,
                          "stream": {"requests": requests}, "results": results,
                          "verdict": {"runs_rps_vs_cache_aware": [1.1, 1.3]}})
    theta = [{"flops": f, "request_overhead_flops": o} for f, o in ((1e10, 1e9), (3e10, 3e9), (2e10, 2e9))]
    return {"workers": 3, "sizes": asdict(SIZES), "seed": 4, "machine": {"cpus": 2}, "worker_theta": theta,
            "router_args": "--prefix-wait-s=0.25", "scenarios": scenarios}


def test_the_stream_is_the_live_one_group_for_group():
    matrix = live_matrix()
    entry = matrix["scenarios"][0]
    tok = RouterTokenizer.from_files((DEFAULT_MODEL_DIR / "tokenizer.json").read_bytes(),
                                     json.loads((DEFAULT_MODEL_DIR / "tokenizer_config.json").read_text()))
    scn = next(s for s in live_scenarios.MATRIX if s.name == entry["name"])
    live = build_prefix_stream(scn.prefix_stream(SIZES, 4, SIZES.requests), tok)
    sim = list(scenario_units(entry, SIZES, 4, cpu_tiny()))
    assert [u.rid for u in sim] == [u.task_id for u in live]  # the same group drawn for every request, in order
    assert [u.tokens for u in sim] == [u.prompt_tokens for u in live]
    assert len({u.task for u in sim}) > 1


def test_arrivals_and_workers_are_the_live_runs():
    matrix = live_matrix()
    workers = LiveWorkers.of(matrix)
    assert (workers.theta_flops, workers.request_overhead_flops) == (2e10, 2e9)  # the medians the router pools
    assert workers.shared_compute == 2.0  # three one-thread workers on two cores
    bulk, closed, open_ = (scenario_config(e, SIZES, workers, SimConfig(), "round_robin")
                           for e in matrix["scenarios"])
    assert bulk.arrival == "offline"
    assert (closed.arrival, closed.concurrency) == ("closed", SIZES.clients)
    assert (open_.arrival, open_.rate) == ("open", 7.5)
    assert all(c.workers == 3 and c.theta_flops == 2e10 and c.request_overhead_flops == 2e9
               for c in (bulk, closed, open_))
    # the live router's settings: the matrix's --router-args over the router's defaults
    assert (bulk.prefix_wait_s, bulk.hold_spills) == (0.25, True)
    pinned = LiveWorkers.of({**matrix, "router_args": "--saturation-flops=5e10 --request-overhead-flops=0"})
    assert (pinned.theta_flops, pinned.request_overhead_flops) == (5e10, 0.0)  # the router's pins win
    # A matrix that did not record its router's settings ran before holds became the default: replayed without
    # them. One that did (``router_config``, written by policy_bench since) is replayed with what it recorded.
    assert LiveWorkers.of({**matrix, "router_args": ""}).router["prefix_wait_s"] == 0.0
    recorded = router_settings("")
    assert recorded["prefix_wait_s"] == RouterConfig.prefix_wait_s == 1.0 and "api_key" not in recorded
    assert LiveWorkers.of({**matrix, "router_args": "", "router_config": recorded}).router["prefix_wait_s"] == 1.0
    assert LiveWorkers.of({**matrix, "router_config": {**recorded, "prefix_wait_s": 0.5}}).router[
        "prefix_wait_s"] == 0.5


def test_replay_compares_each_ratio_with_the_live_one():
    result = replay_matrix(live_matrix(), cpu_tiny(), SimConfig())
    assert [s["name"] for s in result["scenarios"]] == ["bulk-zipf-bounded", "closed-uniform-bounded",
                                                        "open50-zipf-bounded"]
    for s in result["scenarios"]:
        by = {r["policy"]: r for r in s["rows"]}
        assert by["longest_block_match"]["sim_units"] == by["longest_block_match"]["live_units"]
        lbm_ca, lbm_rr = s["ratios"]
        assert lbm_ca["live"] == pytest.approx(1.2) and lbm_rr["live"] == pytest.approx(1.5)
        sim = by["longest_block_match"]["sim_rps"] / by["cache_aware"]["sim_rps"]
        assert lbm_ca["sim"] == pytest.approx(sim)
        assert lbm_ca["difference"] == pytest.approx(sim / 1.2 - 1)
        assert lbm_ca["within"] == (abs(sim / 1.2 - 1) <= 0.10)
    assert result["checked"] == 6


def test_cli_replays_a_matrix_and_writes_its_table(tmp_path, capsys):
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(live_matrix(("closed-uniform-bounded",))))
    out = tmp_path / "replay.json"
    assert main(["--compare", str(path), "--calibration", "cpu_tiny", "--out", str(out)]) == 0
    assert "closed-uniform-bounded" in out.with_suffix(".md").read_text()
    assert json.loads(out.read_text())["replay"]["checked"] == 2
    assert main(["--compare", str(path)]) == 2
    assert "needs --calibration" in capsys.readouterr().err
