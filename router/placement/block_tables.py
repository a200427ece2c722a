"""``BlockIndex``'s per-block loops: the steps that run once per block of every promise, retire, KV event and match.

The tables are plain Python containers, owned by ``BlockIndex``: a target's committed table is a ``set`` of block
hashes, its pending table a ``dict`` hash -> promise count, and the index a ``dict`` hash -> mask of the targets
holding the block in either table (bit ``slot``). ``bit`` is ``1 << slot``, ``keep`` is ``~bit``. Each function
changes the tables exactly as its docstring says and returns what ``BlockIndex``'s method of the same name returns.

The C extension ``native_block_tables`` (``native_block_tables.c``, built at install) is used when it was built;
otherwise the Python functions here, which are also its reference in the tests (``tests/router/test_native_paths.py``).
``NATIVE`` says which one runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

try:
    from sgl_moe.router.placement import native_block_tables
except ImportError:  # no C compiler at install: the Python functions below
    native_block_tables = None


def promise_py(pending: dict[int, int], index: dict[int, int], bit: int, hashes: Iterable[int]) -> list[int]:
    """One more promise of each hash; returns those the pending table gained (first promise there)."""
    get, get_index = pending.get, index.get
    gained = []
    for h in hashes:
        n = get(h, 0)
        pending[h] = n + 1
        if not n:
            index[h] = get_index(h, 0) | bit
            gained.append(h)
    return gained


def retire_py(pending: dict[int, int], committed: set[int], index: dict[int, int], keep: int,
              hashes: Iterable[int]) -> list[int]:
    """One promise fewer of each hash; returns those the target no longer holds (last promise, not committed)."""
    get = pending.get
    dropped = []
    for h in hashes:
        n = get(h, 0)
        if n > 1:
            pending[h] = n - 1
        elif n == 1:
            del pending[h]
            if h not in committed:
                _drop_bit(index, keep, h)
                dropped.append(h)
    return dropped


def store_py(committed: set[int], pending: dict[int, int], index: dict[int, int], bit: int,
             hashes: Iterable[int]) -> list[int]:
    """Commit the hashes; returns those the committed table gained (not already there)."""
    gained = [h for h in hashes if h not in committed]
    committed.update(gained)
    get = index.get
    for h in gained:
        if h not in pending:  # (a pending block already has the target's bit)
            index[h] = get(h, 0) | bit
    return gained


def remove_py(committed: set[int], pending: dict[int, int], index: dict[int, int], keep: int,
              hashes: Iterable[int]) -> list[int]:
    """Uncommit the hashes; returns those the committed table lost (it held them)."""
    lost = [h for h in hashes if h in committed]
    committed.difference_update(lost)
    for h in lost:
        if h not in pending:
            _drop_bit(index, keep, h)
    return lost


def match_groups_py(index: dict[int, int], hashes: Sequence[int], slots_mask: int) -> list[tuple[int, int]]:
    """``(matched_blocks, mask of the targets in slots_mask that hold exactly that many leading blocks)``, longest
    first, each with at least one block; the masks are disjoint."""
    groups: list[tuple[int, int]] = []
    live = slots_mask
    get = index.get
    for i, h in enumerate(hashes):
        have = get(h, 0) & live
        if have != live:
            if i:
                groups.append((i, live ^ have))  # the targets that dropped out here (``have`` is within ``live``)
            live = have
            if not live:
                break
    else:
        if live and hashes:
            groups.append((len(hashes), live))
    groups.reverse()
    return groups


def committed_prefix_py(committed: set[int], hashes: Iterable[int]) -> int:
    """How many leading hashes are in the committed table."""
    n = 0
    for h in hashes:
        if h not in committed:
            break
        n += 1
    return n


def _drop_bit(index: dict[int, int], keep: int, h: int) -> None:
    mask = index.get(h, 0) & keep
    if mask:
        index[h] = mask
    else:
        index.pop(h, None)


if native_block_tables is not None:
    promise, retire, store, remove = (native_block_tables.promise, native_block_tables.retire,
                                      native_block_tables.store, native_block_tables.remove)
    match_groups, committed_prefix = native_block_tables.match_groups, native_block_tables.committed_prefix
    NATIVE = True
else:
    promise, retire, store, remove = promise_py, retire_py, store_py, remove_py
    match_groups, committed_prefix = match_groups_py, committed_prefix_py
    NATIVE = False
