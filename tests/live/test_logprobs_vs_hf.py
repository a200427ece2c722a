"""Next-token logprobs of the SGLang CPU worker agree with HF transformers on the same weights.

Tolerance: 1e-4 absolute on each of the top-10 logprobs, and the same top-1 token. Both engines
compute in float32 from identical (bf16-stored, losslessly widened) weights; they differ only in
summation order (SGLang's torch-native paged attention and its MoE path vs HF's eager modules).
Measured on the 2-core CPU: 4.9e-6 at worst, so 1e-4 leaves a 20x margin for float32 reordering
while staying far below what a wrong kernel, a flipped top-k expert choice or a wrong position does
(those move logprobs by 1e-2 and more).
"""

import httpx
import pytest

from sgl_moe import DEFAULT_MODEL_DIR

TOLERANCE = 1e-4
TOP_N = 10


def _prompts(tokenizer, n=20):
    """20 deterministic prompts of 24..400 tokens cut from held-out stdlib files."""
    from sgl_moe.training.corpus import load_corpus

    docs = load_corpus().heldout
    prompts = []
    for i in range(n):
        ids = tokenizer.encode(docs[i % len(docs)], add_special_tokens=False).ids
        length = 24 + (i * 97) % 377
        start = (i * 131) % max(1, len(ids) - length)
        prompts.append(ids[start : start + length])
    return prompts


@pytest.fixture(scope="module")
def hf_model():
    import torch
    from transformers import Qwen3MoeForCausalLM

    torch.set_num_threads(2)
    return Qwen3MoeForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, dtype=torch.float32).eval()


def test_top_logprobs_match_hf(worker, hf_model):
    import torch
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(DEFAULT_MODEL_DIR / "tokenizer.json"))
    worst = 0.0
    with httpx.Client(base_url=worker.url, timeout=120) as client:
        for ids in _prompts(tokenizer):
            resp = client.post("/generate", json={
                "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                "return_logprob": True, "top_logprobs_num": TOP_N})
            assert resp.status_code == 200, resp.text
            top = resp.json()["meta_info"]["output_top_logprobs"][0]
            with torch.no_grad():
                logits = hf_model(input_ids=torch.tensor([ids])).logits[0, -1]
            ref = torch.log_softmax(logits.double(), dim=-1)
            assert top[0][1] == int(ref.argmax()), "top-1 token differs from HF"
            for logprob, token_id, _ in top:
                worst = max(worst, abs(logprob - ref[token_id].item()))
    print(f"max |logprob(SGLang) - logprob(HF)| over 20 prompts x top-{TOP_N}: {worst:.2e}")
    assert worst < TOLERANCE
