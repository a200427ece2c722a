"""Token ids and page hashes of text prefixes the router has seen, so a request pays only for its new text.

Texts are cut at *checkpoints*: the first cut ``CutRule`` allows at or after every ``segment_chars`` characters.
A checkpoint depends only on the text up to one character past it, so two texts that share a prefix share its
checkpoints. The memo is a tree of segments (the text between two checkpoints) keyed by their text: a path from
the root spells a prefix, and each node keeps its segment's ids (no special tokens). A text's ids are the
special tokens its tokenizer adds in front, the ids along the longest path it matches, the ids of the segments
it memoises now and of the rest (encoded in one batch call, without the GIL), and the special tokens
added at the end. Cut where ``CutRule`` allows, that equals a whole encode. A new segment becomes a node the
second time it follows the same prefix: a popular prefix is memoised twice as far each time it is seen again,
and text seen once (a unique prompt, each request's own tail) is encoded in one piece and costs no nodes.

Each node also keeps the page hashes (``block_hash``) of the pages that end inside it, per page size and seed,
so a shared prefix is hashed once too.

One text in ``check_every`` is also encoded whole and compared: a difference turns the memo off for good (the
tokenizer then encodes every text whole), logged once and counted. The interval doubles after every
``CHECKS_PER_DOUBLING`` clean checks, up to ``check_every_max``: a memo that has agreed with the whole encode
many times is checked less often. The interval is a CPU budget: at 2,000 tokens on a shared prefix one whole encode
costs the instructions of about 11 whole requests through the router (callgrind, 2026-11-30), so one text in 256
is about 4% of the router's CPU at first and one in 4,096, reached after about 123,000 clean texts, a quarter of a
percent. (It started at one in 64 when that was 4%; the router's own cost per request has since fallen about
fourfold and the whole encode's has not, so one in 64 had grown to 17%.)

Nodes are dropped least recently used first once they hold more than ``budget_tokens`` ids, down to
``EVICT_TO`` of it in one pass. A text's use stamps only the deepest node of its path (one integer, whatever the
path's length); a node was last used when the most recent stamp in its subtree was set, so a node is always at
least as recent as its descendants, and a pass drops the least recent first and, among equals, the deepest first:
a node goes only after every node under it. The memo is shared by the threads that parse requests: one lock
guards the tree, never held while encoding.

*Hints* spare a popular prefix its walk: for the first ``segment_chars`` characters of a text (the root's bucket
key), the memo keeps the last few deepest paths texts took from there, each with its whole text and its ids in
one buffer. A text that starts with a hint's text (one comparison at C speed) starts its walk at the hint's node,
and its ids start as a copy of the hint's. That path is one the walk could have taken (every segment on it starts
the text where the walk would look for it); its ends are checked as the walk's are (``_plan``), the few that can
need it listed on the hint. A hint's deepest node also keeps the page hashes of the whole path (``through``), so
a hinted text's hashes start as a copy of them too.

A text's ids come out packed (``token_ids.TokenIds``: uint32 in one buffer, as the nodes and hints keep them and as
the piece cache gives them), so assembling them copies runs of bytes and makes no int object per id; ``ids_json``
and ``page_hashes`` read them where they lie. With the memo off, ids are the tokenizer's lists.
"""

from __future__ import annotations

import array
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from sgl_moe.router.request.block_hash import PackedHashes, block_hash_chain_packed
from sgl_moe.router.request.token_cuts import CutRule
from sgl_moe.router.request.token_ids import TokenIds, json_text, packed

log = logging.getLogger("sgl_moe.router.tokenizer")

SEGMENT_CHARS = 256
"""Characters between checkpoints (about 50-70 tokens of English): what a request may encode again at most
before its own new text."""
BUDGET_TOKENS = 2_000_000
"""Ids the memo keeps (4 bytes each) before it drops the least recently used segments."""
GROW_SEGMENTS = 4
"""Segments after its match a text remembers as seen at least (``_seen_cuts``): what a unique text pays for."""
EVICT_TO = 0.9
"""Share of ``budget_tokens`` an eviction pass leaves (a pass walks every node, so it frees a tenth at once)."""
GHOSTS = 65_536
"""Segments remembered as seen once (a hash each) before they become nodes on a second sight."""
CHECK_EVERY = 256
"""One text in this many is also encoded whole and compared, at first."""
CHECK_EVERY_MAX = 4096
"""The longest the check interval grows."""
CHECKS_PER_DOUBLING = 32
"""Clean checks at one interval before it doubles."""
HASH_KEYS_PER_NODE = 4
"""Page-hash chains a node keeps (one per page size and ``cache_salt`` seed)."""
HINTS_PER_HEAD = 4
"""Deepest paths kept per first segment's head (``_Hint``): prefixes that share their first characters."""
HINT_IDS = 500_000
"""Ids the hints hold together (uint32 each: 2 MB) before the least recently used go."""

EncodeBatch = Callable[[list[str]], list[list[int]]]


@dataclass(eq=False)
class MemoNode:
    """One segment of a memoised prefix."""

    parent: MemoNode | None
    key: str
    """The segment's text."""
    ids: array.array
    """The segment's ids (uint32)."""
    end: int
    """Ids from the start of the text through this segment, the special tokens added in front included."""
    chars: int = 0
    """Characters from the start of the text through this segment."""
    children: dict[str, dict[str, MemoNode]] = field(default_factory=dict)
    """Child segments by their first characters up to the next multiple of ``segment_chars`` (every segment
    from here is at least that long, so a text finds its candidates with one lookup), then by their text."""
    hashes: dict[tuple[int, bytes | None], tuple[PackedHashes, bytes | None]] = field(default_factory=dict)
    """(page size, seed) -> hashes of the pages that end in this segment, and the chain's digest after them."""
    depth: int = 0
    """Nodes from the root's child through this one (the root's is 0)."""
    stamp: int = 0
    """When a text's path last ended here (``PrefixMemo._clock``); a node's own last use is the largest stamp in
    its subtree."""
    alive: bool = True
    """False once evicted (a hint that holds it is dropped on sight)."""
    hint_refs: int = 0
    """Hints whose deepest node this is."""
    through: dict[tuple[int, bytes | None], tuple[PackedHashes, bytes | None]] | None = None
    """While ``hint_refs``: (page size, seed) -> hashes of every page that ends in this node or before it, from
    the text's start, and the chain's digest after them."""
    through_json: bytes | None = None
    """While ``hint_refs``: the JSON text of the ids through this node's end (``[`` and the ids, no closing
    bracket), written the second time ``ids_json`` asks for it (``b""``: asked once), or at once from the kept text
    of the hint this one went on from (``_extend_json``)."""


MemoPath = tuple[MemoNode, ...]
"""The memo's nodes a text passes through, root's child first."""


@dataclass
class MemoStats:
    texts: int = 0
    """Texts encoded through the memo."""
    memo_ids: int = 0
    """Ids taken from the memo instead of encoded."""
    encoded_chars: int = 0
    """Characters the tokenizer still encoded."""
    checks: int = 0
    mismatches: int = 0
    hinted: int = 0
    """Texts whose walk started at a hint (``_Hint``)."""


class PrefixMemo:
    """Encodes texts as ``encode_full`` would, reusing the ids of prefixes encoded before (see the module)."""

    def __init__(self, rule: CutRule, encode_plain: EncodeBatch, encode_full: EncodeBatch, prefix: list[int],
                 suffix: list[int], *, segment_chars: int = SEGMENT_CHARS, budget_tokens: int = BUDGET_TOKENS,
                 check_every: int = CHECK_EVERY, check_every_max: int = CHECK_EVERY_MAX) -> None:
        self.rule = rule
        self._encode_plain = encode_plain
        """Ids without special tokens, one list per text."""
        self._encode_full = encode_full
        """Ids with special tokens: the reference."""
        self.prefix, self.suffix = prefix, suffix
        """Special tokens the tokenizer adds before and after a text's own ids."""
        self.segment_chars, self.budget_tokens = segment_chars, budget_tokens
        self.check_every, self.check_every_max = check_every, max(check_every, check_every_max)
        """The current interval between checked texts, and the most it grows to."""
        self.enabled = True
        self.disabled_reason = ""
        self.stats = MemoStats()
        self.tokens = 0
        """Ids the nodes hold."""
        self._root = MemoNode(None, "", array.array("I"), len(prefix))
        self._clock = 0
        """Texts assembled so far: the stamp of the next one's deepest node."""
        self._ghosts: OrderedDict[int, None] = OrderedDict()
        """Hashes of (prefix, segment) seen once (``_seen_cuts``)."""
        self._hints: OrderedDict[str, list[_Hint]] = OrderedDict()
        """First ``segment_chars`` characters -> the last deepest paths from there, most recent first."""
        self._hint_ids = 0
        self._lock = threading.Lock()
        self._since_check = 0
        self._clean_at_interval = 0

    def _next_cut(self, text: str, c: int) -> int | None:
        """The first allowed cut at ``c`` or after, within ``segment_chars`` (None: none there)."""
        return self.rule.next_cut(text, c, min(len(text), c + self.segment_chars))

    def encode_batch(self, texts: list[str]) -> tuple[list[list[int]], list[MemoPath]]:
        """The ids of each text (special tokens added; ``TokenIds``, or the whole encode's list where the memo is off
        or a check failed) and the memo path each one's ids came through."""
        if not self.enabled:
            return self._encode_full(texts), [() for _ in texts]
        plans = [self._plan(t) for t in texts]
        pieces = [seg for plan in plans for seg in plan.to_encode]
        encoded = self._encode_plain(pieces) if pieces else []
        out: list = []
        paths: list[MemoPath] = []
        at = 0
        with self._lock:
            for plan in plans:
                k = len(plan.to_encode)
                ids, path = self._assemble(plan, encoded[at:at + k])
                at += k
                out.append(ids)
                paths.append(path)
            self._evict()
        self._check(texts, out, paths)
        return out, paths

    # -- internals -------------------------------------------------------------------------------------
    def _plan(self, text: str) -> _Plan:
        """The longest memoised prefix of ``text`` ending at one of its checkpoints, and what remains to encode.

        A child matches when its segment starts the rest of the text and the text may be cut where the segment
        ends: that end is then the text's own next checkpoint (whether a cut before it is allowed depends on
        the text only up to it, or on an added token that would also cover it), so matching needs no
        checkpoints computed.

        Whether the text may be cut at ``c`` depends only on its characters within ``rule.reach`` of ``c``
        (``CutRule.allows``). A node's end was an allowed cut in the text that made its child, and a text matching
        that child agrees with that text through the child's end: where the child's segment is at least
        ``rule.reach`` long, the cut is allowed here too without asking. So only the deepest match's end, ends
        followed by a short segment, and a choice between two segments that both start the rest are checked."""
        allows, n, reach = self.rule.allows, len(text), self.rule.reach
        head = text[:self.segment_chars]
        with self._lock:
            hint = self._hint(head, text)
            if hint is None:
                node, start, path, checked = self._root, 0, [], []
            else:
                path = list(hint.path)
                node, start, checked = path[-1], path[-1].chars, [False] * len(path)
                first = len(path) - 1  # the hint's ends before its last need a check only where it says
            while node.children:
                bucket = node.children.get(text[start:self._head_end(start)])
                if not bucket:
                    break
                if len(bucket) == 1:
                    [(key, child)] = bucket.items()
                    if not (start + len(key) < n and text.startswith(key, start)):
                        break
                    checked.append(False)
                else:
                    child = next((c for key, c in bucket.items() if start + len(key) < n
                                  and text.startswith(key, start) and allows(text, start + len(key))), None)
                    if child is None:
                        break
                    checked.append(True)
                node, start = child, child.chars
                path.append(child)
            last = len(path) - 1
            for k in (range(last + 1) if hint is None else (*hint.short_before, *range(first, last + 1))):
                if not checked[k] and (k == last or len(path[k + 1].key) < reach) and not allows(text, path[k].chars):
                    del path[k:]  # the ends before k are allowed cuts (checked, or by the argument above)
                    node, start = (path[-1], path[-1].chars) if path else (self._root, 0)
                    break
            if hint is not None and len(path) < len(hint.path):
                hint = None
        cuts = self._seen_cuts(node, text, start, max(GROW_SEGMENTS, len(path)))
        bounds = [start, *cuts, n]
        return _Plan(node, path, [text[a:b] for a, b in zip(bounds, bounds[1:])], hint, text)

    def _hint(self, head: str, text: str) -> _Hint | None:
        """Under the lock: a hint whose text starts ``text`` (and is shorter, as a walk's match is), its nodes
        still in the memo."""
        hints = self._hints.get(head)
        if not hints:
            return None
        n = len(text)
        for i, hint in enumerate(hints):
            if len(hint.text) < n and text.startswith(hint.text):
                if not hint.path[-1].alive:  # evicted (its ancestors may stay): drop the hint
                    del hints[i]
                    self._drop_hint(hint)
                    return None
                if i:
                    hints.insert(0, hints.pop(i))
                self._hints.move_to_end(head)
                self.stats.hinted += 1
                return hint
        return None

    def _remember(self, head: str, text: str, path: MemoPath, ids: TokenIds, extends: _Hint | None) -> None:
        """Under the lock: ``path`` (deepest last) is the newest hint for ``head``; it replaces ``extends``, the hint
        it went on from (a prefix memoised further keeps one hint, not one per length)."""
        deepest, reach = path[-1], self.rule.reach
        short = tuple(k for k in range(len(path) - 1) if len(path[k + 1].key) < reach)
        hint = _Hint(text[:deepest.chars], path, ids[:deepest.end], short)
        hints = self._hints.setdefault(head, [])
        if extends is not None and deepest.through_json is None:
            _extend_json(extends.path[-1], deepest, ids)
        if extends is not None and extends in hints:
            hints.remove(extends)
            self._drop_hint(extends)
        hints.insert(0, hint)
        self._hint_ids += len(hint.ids)
        deepest.hint_refs += 1
        if deepest.through is None:
            deepest.through = {}
        if len(hints) > HINTS_PER_HEAD:
            self._drop_hint(hints.pop())
        self._hints.move_to_end(head)
        while self._hint_ids > HINT_IDS and self._hints:
            _, dropped = self._hints.popitem(last=False)
            for h in dropped:
                self._drop_hint(h)

    def _drop_hint(self, hint: _Hint) -> None:
        """Under the lock: ``hint`` is no longer kept (already out of its list)."""
        self._hint_ids -= len(hint.ids)
        deepest = hint.path[-1]
        deepest.hint_refs -= 1
        if not deepest.hint_refs:
            deepest.through = deepest.through_json = None

    def _seen_cuts(self, node: MemoNode, text: str, start: int, remember: int) -> list[int]:
        """The checkpoints after ``node`` to memoise now: those ending segments already seen once after the same
        prefix (a hash of prefix and segment, in a bounded LRU), up to the first segment not seen; that one and
        up to ``remember`` - 1 more are remembered as seen. A segment thus becomes a node the second time it
        follows the same prefix, so text seen once (a unique prompt, a request's own tail) never costs nodes, cuts
        in its encode or their page hashes; a prefix matched ``d`` segments deep remembers ``d`` more, so a popular
        prefix is memoised twice as far each time it is seen again."""
        cuts: list[int] = []
        step, n = self.segment_chars, len(text)
        key, prev, target, leading = id(node), start, (start // step + 1) * step, True
        with self._lock:
            while target < n and remember > 0:
                c = self._next_cut(text, target)
                if c is None:
                    break
                key = hash((key, text[prev:c]))  # chained: names the whole prefix up to c
                if leading and key in self._ghosts:
                    self._ghosts.move_to_end(key)
                    cuts.append(c)
                else:
                    self._ghosts[key] = None
                    leading = False
                    remember -= 1
                prev, target = c, (c // step + 1) * step
            while len(self._ghosts) > GHOSTS:
                self._ghosts.popitem(last=False)
        return cuts

    def _head_end(self, start: int) -> int:
        """The next checkpoint's earliest place after a checkpoint at ``start``."""
        return (start // self.segment_chars + 1) * self.segment_chars

    def _assemble(self, plan: _Plan, encoded: list[Sequence[int]]) -> tuple[TokenIds, MemoPath]:
        """Under the lock: the text's ids; new checkpoint segments become nodes; the path is touched."""
        self.stats.texts += 1
        self.stats.encoded_chars += sum(map(len, plan.to_encode))
        if not plan.path and len(plan.to_encode) == 1:  # nothing memoised, nothing to memoise: one whole piece
            own = encoded[0]
            if not (self.prefix or self.suffix):
                return packed(own), ()
            ids = TokenIds("I", self.prefix)
            ids.extend(own)
            ids.extend(self.suffix)
            return ids, ()
        path = list(plan.path)
        base = plan.hint
        if base is None:
            ids = TokenIds("I", self.prefix)
            for n in path:
                ids.extend(n.ids)
        else:  # the hint's ids, then the nodes matched past it
            ids = TokenIds("I", base.ids)
            for n in path[len(base.path):]:
                ids.extend(n.ids)
        memo_ids = len(ids) - len(self.prefix)
        node = plan.node
        for seg, seg_ids in zip(plan.to_encode[:-1], encoded):  # every piece but the tail ends at a checkpoint
            if not node.alive:  # evicted by another thread since the plan: nothing hangs from it any more
                ids.extend(seg_ids)
                continue
            bucket = node.children.setdefault(seg[:self._head_end(node.chars) - node.chars], {})
            child = bucket.get(seg)
            if child is None:
                child = MemoNode(node, seg, array.array("I", seg_ids), node.end + len(seg_ids), node.chars + len(seg),
                                 depth=node.depth + 1)
                bucket[seg] = child
                self.tokens += len(seg_ids)
            node = child
            path.append(node)
            ids.extend(child.ids)
        ids.extend(encoded[-1])
        ids.extend(self.suffix)
        if path:
            self._clock += 1
            path[-1].stamp = self._clock  # its ancestors' last use is the largest stamp under them (``_evict``)
        self.stats.memo_ids += memo_ids
        path_t = tuple(path)
        if path and (base is None or base.path[-1] is not path[-1]):
            self._remember(plan.text[:self.segment_chars], plan.text, path_t, ids, base)
        return ids, path_t

    def _evict(self) -> None:
        """Under the lock: over the budget, the least recently used nodes go, deepest first among equals, until
        the nodes hold ``EVICT_TO`` of it. A node's last use is the largest stamp in its subtree, so it is never
        older than a descendant and goes after all of them."""
        if self.tokens <= self.budget_tokens:
            return
        nodes: list[MemoNode] = []  # parents before their children
        stack = [self._root]
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(child for bucket in node.children.values() for child in bucket.values())
        used = {id(node): node.stamp for node in nodes}
        for node in reversed(nodes[1:]):  # children first: a parent's last use is its subtree's latest stamp
            if used[id(node)] > used[id(node.parent)]:
                used[id(node.parent)] = used[id(node)]
        order = sorted(((used[id(node)], -node.depth, i, node) for i, node in enumerate(nodes[1:])))
        target = int(self.budget_tokens * EVICT_TO)
        for *_, node in order:
            if self.tokens <= target:
                break
            parent = node.parent
            head = node.key[:self._head_end(parent.chars) - parent.chars]
            bucket = parent.children[head]
            del bucket[node.key]
            if not bucket:
                del parent.children[head]
            node.alive = False
            self.tokens -= len(node.ids)

    def _check(self, texts: list[str], out: list[list[int]], paths: list[MemoPath]) -> None:
        """Every ``check_every``-th text: encoded whole too; any difference turns the memo off."""
        for i, text in enumerate(texts):
            ids = out[i]
            self._since_check += 1
            if self._since_check < self.check_every:
                continue
            self._since_check = 0
            self.stats.checks += 1
            full = self._encode_full([text])[0]
            if full != ids:
                self.stats.mismatches += 1
                self.disable(f"memoised ids differ from a whole encode for a text of {len(text)} characters "
                             f"(first difference at id {_first_difference(full, ids)})")
                out[i], paths[i] = full, ()
                continue
            self._clean_at_interval += 1
            if self._clean_at_interval >= CHECKS_PER_DOUBLING and self.check_every < self.check_every_max:
                self.check_every = min(2 * self.check_every, self.check_every_max)
                self._clean_at_interval = 0

    def disable(self, reason: str) -> None:
        if self.enabled:
            log.error("prefix memo off: %s; every text is encoded whole from now on", reason)
        self.enabled, self.disabled_reason = False, reason
        with self._lock:
            self._root.children.clear()
            self._hints.clear()
            self.tokens = 0
            self._hint_ids = 0


@dataclass(init=False)
class _Plan:
    node: MemoNode
    """The deepest memo node the text matched (the root: none)."""
    path: list[MemoNode]
    """The nodes matched, root's child first."""
    to_encode: list[str]
    """The text after the match, cut at its remaining checkpoints; the last piece is the tail."""
    hint: _Hint | None
    """The hint ``path`` starts with."""
    text: str
    """The whole text."""

    def __init__(self, node: MemoNode, path: list[MemoNode], to_encode: list[str], hint: _Hint | None,
                 text: str) -> None:
        # Written out (``init=False``): compiled, it runs as C; the one ``dataclass`` writes runs interpreted.
        self.node = node
        self.path = path
        self.to_encode = to_encode
        self.hint = hint
        self.text = text


@dataclass(eq=False)
class _Hint:
    """A path a text took from the root, kept to be matched whole (see the module)."""

    text: str
    """The text through the deepest node's end."""
    path: MemoPath
    ids: array.array
    """The ids through the deepest node's end, the special tokens added in front included (uint32)."""
    short_before: tuple[int, ...]
    """Indices ``k`` of ``path`` (before its last) whose next segment is shorter than ``CutRule.reach``: the ends
    ``_plan`` checks again for a text that starts with the hint (the others are allowed by the argument there)."""


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ids_json(path: MemoPath, ids: Sequence[int]) -> bytes:
    """``orjson.dumps(list(ids))`` for ``ids`` that came with ``path`` from ``PrefixMemo.encode_batch``: the ids through
    a hint's deepest node on the path (a popular prefix: most of a shared prompt) are written once per hint, the
    second time a text passes there, and kept; only the rest is written per request. Every text whose path passes a
    node has the same ids through its end (the special tokens in front, then the nodes' ids), so the kept text is
    theirs too. ``TokenIds`` are written from their buffer (``token_ids.json_text``)."""
    write = json_text if type(ids) is TokenIds else _list_json
    for k in range(len(path) - 1, -1, -1):  # the deepest node a hint ends at (a hinted text's: near the end)
        node = path[k]
        if not node.hint_refs:
            continue
        head = node.through_json
        if head is None:  # first asked: marked only (a text's own new path end often is never passed again)
            node.through_json = b""
            continue
        if not head:
            head = write(ids, 0, node.end)[:-1]
            node.through_json = head  # (a hint dropped meanwhile leaves it set: still these ids, freed with the node)
        if len(ids) == node.end:
            return head + b"]"
        return b"".join((head, b",", memoryview(write(ids, node.end))[1:]))  # the head copied once
    return write(ids)


def _extend_json(old: MemoNode, deepest: MemoNode, ids: TokenIds) -> None:
    """A hint that went on past ``old`` (an ancestor of ``deepest``) to ``deepest``: ``old``'s kept JSON text, if it
    was written, and ``ids`` between the two ends become ``deepest``'s, so a popular prefix memoised further is not
    written whole again twice (``ids_json`` marks a new end when first asked and writes it the second time). ``ids``
    are the text's, which agree through ``deepest.end`` with every text passing there."""
    head = old.through_json
    if not head or deepest.end < old.end:
        return
    if deepest.end == old.end:
        deepest.through_json = head
        return
    more = memoryview(json_text(ids, old.end, deepest.end))[1:-1]  # the ids after ``old``'s, without brackets
    deepest.through_json = b"".join((head, b"," if len(head) > 1 else b"", more))


def _list_json(ids: Sequence[int], start: int = 0, end: int | None = None) -> bytes:
    return orjson.dumps(ids[start:end] if start or end is not None else ids)


def page_hashes(path: MemoPath, ids: Sequence[int], page_size: int, seed: bytes | None) -> PackedHashes:
    """``block_hashes_packed(ids, page_size, seed)``, reusing the hashes ``path``'s nodes hold (``ids`` came with
    ``path`` from ``PrefixMemo.encode_batch``) and leaving there the ones it computes."""
    key = (page_size, seed)
    done, digest, start = 0, seed, 0
    hashes = PackedHashes("q")
    for k in range(len(path) - 1, -1, -1):  # the deepest node that keeps the whole chain (a hint's: near the end)
        through = path[k].through
        if through is not None and key in through:
            kept, digest = through[key]
            hashes, done, start = PackedHashes("q", kept), path[k].end // page_size, k + 1
            break
    for node in path[start:]:
        state = node.hashes.get(key)
        end = node.end // page_size
        if state is None:
            state = block_hash_chain_packed(ids[done * page_size:end * page_size], page_size, digest)
            if len(node.hashes) < HASH_KEYS_PER_NODE:
                node.hashes[key] = state
        hashes += state[0]
        digest, done = state[1], end
        through = node.through
        if through is not None and key not in through and len(through) < HASH_KEYS_PER_NODE:
            through[key] = (PackedHashes("q", hashes), digest)
    rest, _ = block_hash_chain_packed(ids[done * page_size:], page_size, digest)
    hashes += rest
    return hashes
