"""Every command the README and the docs show is run by a test or by CI itself (issue 29: the README's main command
failed from a fresh clone while CI was green, because nothing ran it).

``RUN_BY`` maps each command (a ``python -m`` module, a script, an HTTP example) to where it runs at its smallest
size: a test (``tests/...py::name``) or a CI script (``ci:PATH``, whose text runs it). This test checks that:
- every command in a fenced block of README.md or docs/*.md has an entry, and no entry names a command the docs
  no longer show (the map cannot drift from what users read);
- every test named exists, and its file (or the helper it runs the command through) names the command, so an
  entry cannot point at an unrelated test.
The tests named run in CI's ``bash tools/test.sh``; this one checks the map, not their outcome.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

WORKER = "sgl_moe/harness/worker_process.py"
"""Live tests start workers through ``WorkerProcess``, which runs ``python -m sgl_moe.launch_server``."""
ROUTER = "sgl_moe/harness/router_process.py"
"""And routers through ``RouterProcess``, which runs ``python -m sgl_moe.router``."""

RUN_BY: dict[str, list[str]] = {
    # The two commands.
    "tools/demo.sh": ["tests/harness/test_demo_live.py::test_the_readme_main_command_prints_its_results_and_exits_0"],
    "tools/test.sh": ["ci:.ci/run"],
    "python -m sgl_moe": ["tests/harness/test_demo_live.py::test_the_readme_main_command_prints_its_results_and_exits_0"
                          "@tools/demo.sh"],
    # CI and its set-up.
    ".ci/run": ["ci:.ci/run"],
    "tools/bootstrap.sh": ["ci:tools/test.sh"],
    "tools/torch_only_env.sh": ["ci:.ci/run"],
    "tools/gpu_suite.sh": ["ci:tools/torch_only_env.sh"],
    "tools/nats_server.sh": [
        "tests/router/test_replicas_live.py::test_replicas_share_promised_blocks_and_load_and_survive_the_broker"],
    # Worker, router and clients.
    "python -m sgl_moe.launch_server": [
        "tests/worker/test_launch_server.py::test_defaults_serve_the_shipped_model_with_pages_and_bound_events",
        f"tests/live/test_readiness_live.py::test_first_prefix_after_health_200_stays_cached@{WORKER}",
        f"tests/live/test_streaming_live.py::test_streamed_experts_give_the_unpatched_logprobs@{WORKER}",
        f"tests/live/test_offload_live.py::test_exact_offload_gives_the_unpatched_logprobs@{WORKER}",
        f"tests/live/test_dual_batch_live.py::test_dual_micro_batch_decode_gives_the_unpatched_tokens@{WORKER}",
    ],
    "python -m sgl_moe.router": [f"tests/live/test_routing_live.py::test_worker_killed_mid_request@{ROUTER}"],
    "python -m sgl_moe.classify": ["tests/live/test_frontend_live.py::test_classify_cli_answers_every_line"],
    "python -m sgl_moe.loadtest": [
        "tests/live/test_frontend_live.py::test_locust_load_test_counts_requests_and_no_failures"],
    "python -m sgl_moe.kv_event_keys": [
        "tests/worker/test_kv_event_keys.py::test_command_line_prints_the_flags_to_pass"],
    "python -m sgl_moe.workloads": ["tests/workloads/test_task.py::test_cli_writes_tasks_and_a_summary"],
    "curl /v1/classify": ["tests/live/test_classify_live.py::test_single_choice_scores_the_identifiers"],
    # Benchmarks and the simulator.
    "python -m sgl_moe.policy_bench": [
        "tests/live/test_frontend_live.py::test_policy_benchmark_smoke",
        "tests/policy_bench/test_matrix.py::test_smoke_matrix_runs_every_router_and_arrival"],
    "python -m sgl_moe.simulator": [
        "tests/simulator/test_cli.py::test_policy_table_and_json",
        "tests/simulator/test_cli.py::test_theta_sweep_shows_transfer_bound_small_theta",
        "tests/simulator/test_cli.py::test_compare_prints_errors_and_ordering",
        "tests/simulator/test_live_replay.py::test_cli_replays_a_matrix_and_writes_its_table",
        "tests/simulator/test_matrix.py::test_smoke_matrix_runs_every_scenario_and_writes_json_and_markdown"],
    "python -m sgl_moe.policy_bench.bench_model": [
        "tests/policy_bench/test_bench_model.py::"
        "test_the_command_writes_the_directory_and_prints_its_path_and_refuses_a_bad_shape"],
    "python -m sgl_moe.simulator.fit_timing": [
        "tests/simulator/test_fit_timing.py::test_fit_recovers_the_workers_timing_and_reads_its_info"],
    "python -m sgl_moe.streaming.bench": ["tests/streaming/test_bench.py::test_tiny_benchmark_runs_every_way"],
    "python -m sgl_moe.streaming.selfcheck": ["tests/streaming/test_selfcheck.py::test_one_rank_runs_the_modes_it_can"],
    "python -m sgl_moe.offload.bench": ["tests/offload/test_bench.py::test_tiny_benchmark_runs_every_mode"],
    "python -m sgl_moe.overlap.bench": ["tests/overlap/test_bench.py::test_tiny_bench_writes_json"],
    "python -m sgl_moe.prediction.train": ["tests/prediction/test_train_cli.py::test_short_train_run_writes_a_bundle"],
    "python -m sgl_moe.prediction.quality": [
        "tests/prediction/test_quality_cli.py::test_quality_report_at_its_smallest_size"],
    "python -m sgl_moe.training.fixtures": [
        "tests/training/test_fixtures.py::test_build_is_reproducible_and_idempotent"],
    "benchmarks/router_bench.py": ["tests/benchmarks/test_router_bench.py"],
    "benchmarks/router_capacity.py": ["tests/benchmarks/test_router_capacity.py"],
    "benchmarks/parse_path.py": ["tests/benchmarks/test_parse_path.py"],
    "benchmarks/replicas_bench.py": ["tests/benchmarks/test_replicas_bench.py"],
    "benchmarks/replicas_soak.py": ["tests/benchmarks/test_replicas_soak.py"],
    "benchmarks/tokenizer_bench.py": ["tests/benchmarks/test_tokenizer_bench.py"],
    "benchmarks/bench_serving_routers.py": ["tests/live/test_bench_scripts_live.py"],
    "benchmarks/offload_worker_bench.py": ["tests/live/test_bench_scripts_live.py"],
    "benchmarks/worker_front_cpu.py": ["tests/live/test_bench_scripts_live.py"],
}

_COMMAND = re.compile(
    r"(?:^|\s)(?:\S*/)?python3?\s+-m\s+(?P<module>[\w.]+)"
    r"|(?:^|\s)(?:\S*/)?python3?\s+(?P<script>benchmarks/\w+\.py)"
    r"|(?:^|\s)bash\s+(?P<bash>[\w./-]+)"
    r"|(?:^|\s)curl\s.*?(?P<curl>/v1/\w+|/generate|/workers)")


def _fenced_lines(text: str) -> list[str]:
    lines, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
            continue
        if inside:
            lines.append(line.split("#", 1)[0] if not line.lstrip().startswith("#") else "")
    return lines


def documented_commands() -> dict[str, set[str]]:
    """Each command shown in a fenced block of the README or the docs, and the pages showing it."""
    found: dict[str, set[str]] = {}
    for page in DOCS:
        for line in _fenced_lines(page.read_text()):
            for m in _COMMAND.finditer(line):
                key = (f"python -m {m['module']}" if m["module"] else m["script"] or m["bash"]
                       or f"curl {m['curl']}")
                if key.startswith("python -m sglang"):  # SGLang's own launcher, named for comparison
                    continue
                found.setdefault(key, set()).add(page.relative_to(ROOT).as_posix())
    return found


def _patterns(command: str) -> list[str]:
    """Regular expressions one of which a file running ``command`` must match."""
    if command.startswith("python -m "):
        module = command.removeprefix("python -m ")
        parent, _, leaf = module.rpartition(".")
        return [re.escape(module)] + ([rf"from {re.escape(parent)} import [^\n]*\b{leaf}\b"] if parent else [])
    if command.startswith("curl "):
        return [re.escape(command.removeprefix("curl "))]
    return [re.escape(Path(command).name)]


def _mentions(path: Path, command: str) -> bool:
    text = path.read_text()
    return any(re.search(pattern, text) for pattern in _patterns(command))


def test_every_documented_command_is_run_somewhere_and_the_map_has_no_stale_entry():
    documented = documented_commands()
    assert documented, "no command found in the README's fenced blocks"
    missing = {cmd: sorted(pages) for cmd, pages in documented.items() if cmd not in RUN_BY}
    assert not missing, f"commands the docs show that no test runs (add a test and a RUN_BY entry): {missing}"
    stale = sorted(set(RUN_BY) - set(documented))
    assert not stale, f"RUN_BY names commands the docs no longer show: {stale}"
    # The README's two commands are the first thing a newcomer runs.
    assert {"tools/demo.sh", "tools/test.sh"} <= {c for c, pages in documented.items() if "README.md" in pages}


def _test_exists(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body)


@pytest.mark.parametrize("command", sorted(RUN_BY))
def test_each_entry_names_a_test_that_runs_that_command(command):
    for entry in RUN_BY[command]:
        if entry.startswith("ci:"):
            script = ROOT / entry.removeprefix("ci:")
            assert script.is_file(), entry
            if script.relative_to(ROOT).as_posix() != command:  # .ci/run is what CI runs
                assert _mentions(script, command), f"{entry} does not run {command}"
            continue
        node, _, via = entry.partition("@")
        file, _, name = node.partition("::")
        path = ROOT / file
        assert path.is_file(), f"{command}: {file} does not exist"
        if name:
            assert _test_exists(path, name), f"{command}: no test {name} in {file}"
        else:
            assert any(n.startswith("test_") for n in re.findall(r"^def (\w+)", path.read_text(), re.M)), file
        runner = ROOT / via if via else path
        assert _mentions(runner, command), f"{command}: {runner.relative_to(ROOT)} never names it"
    # .ci/run runs the README's test command: the suite that holds every test above.
    assert "bash tools/test.sh" in (ROOT / ".ci/run").read_text()
