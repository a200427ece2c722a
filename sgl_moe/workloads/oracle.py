"""The oracle prefix cache: what one SGLang worker with an unbounded radix cache would serve.

Every prefill unit (classify: the prompt; choice: the prompt with its choice listing; multi: one unit per
candidate, sharing the prompt) is matched against all earlier units, in order. SGLang's radix cache with
page size P serves the longest shared prefix floored to whole pages, and never the whole unit: at most
``len - 1`` tokens (floored to pages) so that the last position is computed and yields logits.

The match runs on segment keys, not text or ids: a trie of keys whose edges carry token counts. Equal
keys mean equal tokens; text that different keys happen to share (a common first word, with probability
~1/900) is ignored, which can only under-count by a page now and then.
"""

from __future__ import annotations

from collections.abc import Iterable

from sgl_moe.workloads.config import PAGE
from sgl_moe.workloads.request import WorkloadRequest, unit_segments
from sgl_moe.workloads.segments import Segment


class OracleCache:
    """An unbounded radix cache over segment keys, shared by every unit it is shown."""

    def __init__(self, page: int = PAGE) -> None:
        if page < 1:
            raise ValueError(f"page must be >= 1, got {page}")
        self.page = page
        self._root: dict[str, dict] = {}

    def prefill(self, unit: list[Segment]) -> int:
        """Tokens of ``unit`` served from the cache; then the unit is cached."""
        node = self._root
        matched = 0
        i = 0
        while i < len(unit):
            child = node.get(unit[i].key)
            if child is None:
                break
            matched += unit[i].tokens
            node = child
            i += 1
        for seg in unit[i:]:
            child = {}
            node[seg.key] = child
            node = child
        length = sum(s.tokens for s in unit)
        return max(0, min(matched, length - 1)) // self.page * self.page


def oracle_cached_tokens(requests: Iterable[WorkloadRequest], page: int = PAGE) -> tuple[int, int]:
    """``(cached, total)`` prefill tokens of ``requests`` in order, all on one worker with unbounded cache."""
    cache = OracleCache(page)
    cached = total = 0
    for req in requests:
        for unit in unit_segments(req):
            cached += cache.prefill(unit)
            total += sum(s.tokens for s in unit)
    return cached, total
