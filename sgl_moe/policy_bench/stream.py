"""The benchmark's request stream: workload tasks expanded into prefill units, and the oracle cache reuse."""

from __future__ import annotations

from dataclasses import dataclass

from sgl_moe.router.front.prefill_tasks import expand_text
from sgl_moe.router.request.block_hash import block_hashes
from sgl_moe.router.request.router_tokenizer import RouterTokenizer
from sgl_moe.workloads import WorkloadConfig, generate, to_task


@dataclass(frozen=True)
class StreamUnit:
    """One prefill-only call: what every router under test receives, byte for byte."""

    task_id: str
    workload: str
    text: str
    prompt_tokens: int
    """Tokens the worker prefills for ``text`` (the router's exact tokenizer, specials included)."""

    def body(self) -> dict:
        return {"text": self.text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}


def build_stream(cfg: WorkloadConfig, tok: RouterTokenizer) -> list[StreamUnit]:
    """Tasks in arrival order; a multi-selection task contributes its sibling units back to back."""
    units = []
    for req in generate(cfg):
        for u in expand_text(to_task(req)):
            units.append(StreamUnit(req.id, req.workload, u.prompt, len(tok.encode(u.prompt))))
    return units


def oracle_cached_tokens(units: list[StreamUnit], tok: RouterTokenizer, page: int) -> int:
    """Tokens an unbounded prefix cache holding every earlier unit would serve (all on one worker, no load).

    A unit reuses its longest run of leading full pages already seen (chained block hashes make page k
    match only if pages 0..k-1 match), and always computes at least its last token, as SGLang does.
    """
    seen: set[int] = set()
    cached = 0
    for u in units:
        hashes = block_hashes(tok.encode(u.text), page, None)
        hit = 0
        for h in hashes:
            if h not in seen:
                break
            hit += 1
        cached += min(hit * page, (u.prompt_tokens - 1) // page * page)
        seen.update(hashes)
    return cached
