"""Seeded generator of the six prefill-only workloads of seed 000 Table 2 (contract B).

``generate(WorkloadConfig(...))`` yields ``WorkloadRequest``s made of ``Segment``s (key + exact token
count under the shipped tokenizer); ``to_task`` renders one as a contract-A ``/v1/classify`` task.
Modules: ``segments`` (text and token ids of a key), ``request`` (the request, its task and prefill
units), ``shapes`` (one function per workload), ``mix`` (proportions and interleaving), ``oracle``
(cached tokens of an unbounded radix cache), ``cli`` (``python -m sgl_moe.workloads``).
"""

from sgl_moe.workloads.config import PAGE, TABLE2, WORKLOADS, TableRow, WorkloadConfig
from sgl_moe.workloads.mix import generate
from sgl_moe.workloads.oracle import OracleCache, oracle_cached_tokens
from sgl_moe.workloads.request import WorkloadRequest, choice_text, prompt_text, prompt_tokens, to_task, unit_segments
from sgl_moe.workloads.segments import Segment, literal, segment_text, segment_token_ids

__all__ = [
    "PAGE", "TABLE2", "WORKLOADS", "OracleCache", "Segment", "TableRow", "WorkloadConfig", "WorkloadRequest",
    "choice_text", "generate", "literal", "oracle_cached_tokens", "prompt_text", "prompt_tokens",
    "segment_text", "segment_token_ids", "to_task", "unit_segments",
]
