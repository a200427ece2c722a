"""Prefill-only task parsing, expansion into /v1/score units, and reading answers back (pure logic)."""

import math

import pytest

from sgl_moe.router.front.prefill_tasks import (
    TaskError,
    choice_prompt,
    combine,
    expand_text,
    parse_tasks,
    plan_score,
    read_score,
)


def test_single_task_and_batch_forms():
    tasks, model, batch = parse_tasks({"prompt": "p", "labels": [" a", " b"], "model": "m"})
    assert (len(tasks), model, batch, tasks[0].type) == (1, "m", False, "classify")
    tasks, model, batch = parse_tasks({"inputs": [{"prompt": "p", "labels": [" a", " b"], "id": 7},
                                                  {"type": "choice", "prompt": "q", "choices": ["x", "y", "z"]}]})
    assert batch and [t.index for t in tasks] == [0, 1] and tasks[0].id == 7
    assert tasks[1].ids == ["A", "B", "C"]


@pytest.mark.parametrize("body, param", [
    ({"prompt": "p", "labels": [" a"]}, "labels"),                       # one label
    ({"prompt": "p", "labels": [" a", " a"]}, "labels"),                 # duplicate
    ({"prompt": "p", "labels": [" a", "  "]}, "labels"),                 # blank
    ({"prompt": "", "labels": [" a", " b"]}, "prompt"),
    ({"labels": [" a", " b"]}, "prompt"),                                # no prompt at all
    ({"prompt": "p", "input_ids": [1], "labels": [" a", " b"]}, "prompt"),  # two prompt forms
    ({"input_ids": [1, -2], "labels": [" a", " b"]}, "input_ids"),
    ({"messages": [{"role": "user"}], "labels": [" a", " b"]}, "messages"),
    ({"prompt": "p", "labels": [" a", " b"], "choices": ["x"]}, "choices"),  # field of another type
    ({"prompt": "p", "labels": [" a", " b"], "lables": 1}, "lables"),    # typo
    ({"type": "rank", "prompt": "p"}, "type"),
    ({"type": "choice", "prompt": "p", "choices": ["x", "y"], "ids": ["1"]}, "ids"),
    ({"type": "choice", "prompt": "p", "choices": ["x", "y"], "ids": ["1", "2 3"]}, "ids"),
    ({"type": "multi", "prompt": "p", "choices": ["x"], "threshold": 1.5}, "threshold"),
    ({"prompt": "p", "labels": [" a", " b"], "label_scoring": "mean"}, "label_scoring"),
])
def test_invalid_tasks_name_the_field(body, param):
    with pytest.raises(TaskError) as err:
        parse_tasks(body)
    assert err.value.param == param
    with pytest.raises(TaskError) as err:
        parse_tasks({"inputs": [{"prompt": "ok", "labels": [" a", " b"]}, body]})
    assert err.value.param == f"inputs[1].{param}"


def test_batch_envelope_errors():
    for body in ({"inputs": []}, {"inputs": {"prompt": "p"}}, {"inputs": [1]},
                 {"inputs": [{"prompt": "p", "labels": [" a", " b"]}], "labels": [" a"]}, [1, 2]):
        with pytest.raises(TaskError):
            parse_tasks(body)


def test_expansion_into_units():
    [u] = expand_text({"type": "choice", "prompt": "Q?", "choices": ["red", "blue"]})
    assert u.prompt == choice_prompt("Q?", ["red", "blue"], ["A", "B"]) == "Q?\nA. red\nB. blue\nAnswer:"
    assert u.labels == [" A", " B"]
    units = expand_text({"type": "multi", "prompt": "Doc.", "choices": ["x", "y", "z"]})
    assert len(units) == 3 and all(u.prompt.startswith("Doc.\nCandidate: ") for u in units)
    assert [u.labels for u in units] == [[" yes", " no"]] * 3
    [u] = expand_text({"prompt": "P", "labels": [" a", " b"]})
    assert (u.prompt, u.labels) == ("P", [" a", " b"])


def test_plan_single_token_labels_is_one_item_with_softmax():
    plan = plan_score([5, 6, 7], [[10], [11], [12]], "full")
    assert plan.body["query"] == [5, 6, 7] and plan.body["items"] == [[]]
    assert plan.body["label_token_ids"] == [[10, 11, 12]] and plan.body["apply_softmax"] is True
    assert plan.single_token


def test_plan_multi_token_labels_scores_every_prefix():
    plan = plan_score([1], [[10, 20, 30], [10, 21], [11]], "full")
    items = [tuple(i) for i in plan.body["items"]]
    assert items == [(), (10,), (10, 20)]
    assert plan.body["label_token_ids"] == [[10, 11], [20, 21], [30]]
    assert plan.body["apply_softmax"] is False
    first = plan_score([1], [[10, 20, 30], [11]], "first_token")
    assert first.body["items"] == [[]] and first.label_ids == [[10], [11]] and first.single_token


def _fake_answer(plan, lp):
    """A /v1/score answer whose full-vocabulary log-probabilities come from ``lp[(prefix, token)]``."""
    token_lps = [[lp[(tuple(item), t)] for t in labels]
                 for item, labels in zip(plan.body["items"], plan.body["label_token_ids"])]
    if plan.body["apply_softmax"]:
        w = [math.exp(x) for x in token_lps[0]]
        scores = [[x / sum(w) for x in w]]
    else:
        scores = [[math.exp(x) for x in row] for row in token_lps]
    return {"scores": scores, "token_logprobs": token_lps}


def test_read_multi_token_labels_multiplies_the_chain():
    plan = plan_score([1], [[10, 20], [11]], "full")
    lp = {((), 10): math.log(0.5), ((), 11): math.log(0.2), ((10,), 20): math.log(0.3)}
    probs, logprobs = read_score(plan, _fake_answer(plan, lp))
    assert logprobs == pytest.approx([math.log(0.15), math.log(0.2)])
    assert probs == pytest.approx([0.15 / 0.35, 0.2 / 0.35])


def test_read_single_token_returns_sglang_scores_unchanged():
    plan = plan_score([1], [[10], [11]], "full")
    answer = {"scores": [[0.25, 0.75]], "token_logprobs": [[math.log(0.1), math.log(0.3)]]}
    probs, logprobs = read_score(plan, answer)
    assert probs == [0.25, 0.75] and logprobs == pytest.approx([math.log(0.1), math.log(0.3)])
    with pytest.raises(ValueError):
        read_score(plan, {"scores": [[0.5, 0.5]]})  # worker did not return token_logprobs


def test_combine_results():
    (task,), _, _ = parse_tasks({"prompt": "p", "labels": [" a", " b"], "id": "x"})
    r = combine(task, [([0.3, 0.7], [-2.0, -1.0])])
    assert (r["label"], r["index"], r["id"]) == (" b", 1, "x")
    (task,), _, _ = parse_tasks({"type": "choice", "prompt": "p", "choices": ["u", "v", "w"], "ids": ["1", "2", "3"]})
    assert combine(task, [([0.1, 0.2, 0.7], [-3, -2, -1])])["answer"] == "3"
    (task,), _, _ = parse_tasks({"type": "multi", "prompt": "p", "choices": ["u", "v", "w"], "threshold": 0.6})
    r = combine(task, [([0.9, 0.1], [0, 0]), ([0.5, 0.5], [0, 0]), ([0.6, 0.4], [0, 0])])
    assert r["probs"] == [0.9, 0.5, 0.6] and r["selected"] == [0, 2] and r["index"] == 0
