"""``to_task`` produces contract-A task objects; the CLI writes them as JSON lines."""

import json

import pytest

from sgl_moe.workloads import WorkloadConfig, choice_text, generate, prompt_text, to_task
from sgl_moe.workloads.cli import main


def check_contract_a(task: dict) -> None:
    assert set(task) <= {"type", "prompt", "input_ids", "messages", "labels", "choices", "ids", "threshold",
                         "label_scoring", "id"}
    assert isinstance(task["id"], str) and task["type"] in ("classify", "choice", "multi")
    assert isinstance(task["prompt"], str) and task["prompt"]
    field = "labels" if task["type"] == "classify" else "choices"
    other = "choices" if field == "labels" else "labels"
    assert other not in task
    values = task[field]
    assert all(isinstance(v, str) and v.strip() for v in values) and len(set(values)) == len(values)
    lo, hi = {"classify": (2, 64), "choice": (2, 26), "multi": (1, 256)}[task["type"]]
    assert lo <= len(values) <= hi


def test_tasks_follow_contract_a():
    for req in generate(WorkloadConfig(requests=3000, seed=11)):
        task = to_task(req)
        check_contract_a(task)
        assert task["id"] == req.id and task["prompt"] == prompt_text(req)
        if req.choices:
            assert task["choices"] == [choice_text(c) for c in req.choices]
            assert not any(c.startswith(" ") for c in task["choices"])  # the template adds the space


def test_the_routers_parser_accepts_them():
    prefill_tasks = pytest.importorskip("sgl_moe.router.front.prefill_tasks")
    tasks = [to_task(r) for r in generate(WorkloadConfig(requests=500, seed=12))]
    parsed, _, _ = prefill_tasks.parse_tasks({"inputs": tasks})
    assert len(parsed) == 500


def test_cli_writes_tasks_and_a_summary(tmp_path, capsys):
    out = tmp_path / "tasks.jsonl"
    assert main(["--requests", "300", "--workloads", "quality,moral", "--length-scale", "8", "--seed", "3",
                 "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 300
    tasks = [json.loads(line) for line in lines]
    for task in tasks:
        check_contract_a(task)
    expected = [to_task(r) for r in generate(WorkloadConfig(workloads=("quality", "moral"), requests=300, seed=3))]
    assert tasks == expected
    err = capsys.readouterr().err
    assert "quality" in err and "moral" in err and "oracle" in err and "300 requests" in err


def test_cli_rejects_unknown_workloads(capsys):
    with pytest.raises(SystemExit):
        main(["--workloads", "nope", "--no-tasks"])
    assert "workloads" in capsys.readouterr().err
