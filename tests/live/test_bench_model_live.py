"""A worker serves the bench model (``sgl_moe.policy_bench.bench_model``) from its directory alone: SGLang's
dummy weights, the shipped tokenizer (the same prompt token counts as the shipped model), the wider shape."""

import httpx

from sgl_moe.policy_bench.bench_model import BenchModelShape, worker_args, write_bench_model
from sgl_moe.router.request.router_tokenizer import RouterTokenizer

from .conftest import NO_THETA_PROFILE, WORKER_ARGS


def test_a_worker_serves_the_bench_model_with_the_shipped_tokenizer(worker_factory, tmp_path):
    path = write_bench_model(root=tmp_path)
    w = worker_factory(args=[*worker_args(path), *WORKER_ARGS, NO_THETA_PROFILE])
    text = "Classify the ticket: the printer on floor 3 is out of toner.\nLabel:"
    with httpx.Client(timeout=120) as c:
        r = c.post(f"{w.url}/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["prompt_tokens"] == len(RouterTokenizer.from_dir(path).encode(text))
        info = c.get(f"{w.url}/get_server_info").json()
    assert info["model_path"] == str(path) and info["load_format"] == "dummy"
    assert w.info["flops"]["num_layers"] == BenchModelShape().num_hidden_layers  # the router's FLOPs model sees it
