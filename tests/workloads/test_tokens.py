"""Concatenated segments tokenize to the concatenation of their ids, prompts and rendered units alike.

The units are rendered from ``to_task``'s output with contract A's own formulas (written out here, not
taken from the package), so the segment cut of ``unit_segments`` is checked against the real text.
"""

import pytest
from tokenizers import Tokenizer

from sgl_moe.workloads import (
    WorkloadConfig,
    generate,
    prompt_text,
    prompt_tokens,
    segment_token_ids,
    to_task,
    unit_segments,
)
from sgl_moe.workloads.segments import TOKENIZER_PATH


def contract_a_units(task: dict) -> list[str]:
    kind = task.get("type", "classify")
    if kind == "classify":
        return [task["prompt"]]
    if kind == "choice":
        ids = task.get("ids") or [chr(ord("A") + i) for i in range(len(task["choices"]))]
        return [task["prompt"] + "\n" + "".join(f"{i}. {c}\n" for i, c in zip(ids, task["choices"])) + "Answer:"]
    return [task["prompt"] + f"\nCandidate: {c}\nDoes the candidate apply? Answer:" for c in task["choices"]]


def ids_of(segments) -> list[int]:
    return [i for s in segments for i in segment_token_ids(s)]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER_PATH))


@pytest.mark.parametrize("scale,seed", [(8.0, 0), (8.0, 3), (32.0, 1), (2.0, 2)])
def test_prompts_and_units_tokenize_segment_by_segment(tokenizer, scale, seed):
    cfg = WorkloadConfig(requests=400, length_scale=scale, seed=seed)
    seen = set()
    for req in generate(cfg):
        seen.add(req.workload)
        prompt = prompt_text(req)
        ids = tokenizer.encode(prompt, add_special_tokens=True).ids
        assert ids == ids_of(req.context), req.id
        assert len(ids) == prompt_tokens(req) <= cfg.max_context
        units = unit_segments(req)
        texts = contract_a_units(to_task(req))
        assert len(texts) == len(units)
        for text, unit in zip(texts, units):
            unit_ids = tokenizer.encode(text, add_special_tokens=True).ids
            assert unit_ids == ids_of(unit), req.id
            assert len(unit_ids) == sum(s.tokens for s in unit)
    assert seen == set(cfg.workloads)


def test_rare_workloads_tokenize_too(tokenizer):
    # quality and arxiv are ~2.4% of the mix: check more of them, with their longest prompts
    for req in generate(WorkloadConfig(workloads=("quality", "arxiv"), requests=60, length_scale=4)):
        for text, unit in zip(contract_a_units(to_task(req)), unit_segments(req)):
            assert tokenizer.encode(text, add_special_tokens=True).ids == ids_of(unit), req.id


def test_units_match_the_routers_own_rendering():
    prefill_tasks = pytest.importorskip("sgl_moe.router.front.prefill_tasks")
    for req in generate(WorkloadConfig(requests=200, seed=5)):
        task = to_task(req)
        rendered = [u.prompt for u in prefill_tasks.expand_text(task)]
        assert rendered == contract_a_units(task)
