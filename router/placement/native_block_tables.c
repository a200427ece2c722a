/* ``BlockTables`` in C: every target's committed and pending block tables and the index over them, for
   targets in slots 0-63.

   ``block_tables.py`` holds the reference (``BlockTablesPy``, the same methods in Python) and says what the tables
   are; the type here has the same methods and answers. Its tests (``tests/router/test_native_paths.py``) run
   random operation sequences through both and compare every answer and every table.

   Why: the Python tables are a set and a dict per target and one dict for the index, so each block of every
   promise, retire, KV event and match costs dictionary steps on boxed ints, and a new int object per mask; at a
   million blocks those dicts no longer fit in the caches. Here a block is one 24-byte entry of an open-addressing
   table (linear probing, backward-shift deletion) keyed by its hash, holding two masks: the targets that hold it
   committed, and those that hold it promised. A target's promise count is 1 when its pending bit is set and the
   block has no entry in a second, small table, which keeps the counts of 2 and more (most blocks are promised
   once).

   Limits, which ``BlockIndex`` handles by moving to the Python tables (``export``): slots 0-63 (a mask is one
   64-bit word), and signed 64-bit hashes (SGLang's page hashes are); ``add_target`` past slot 63 and ``store`` or
   ``promise`` of a hash outside that range raise OverflowError and change nothing. A hash outside the range is
   simply absent for every query and for ``remove`` and ``retire``. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "packed_hashes.h"

#define MAX_SLOTS 64

typedef struct {
    int64_t key;
    uint64_t committed; /* targets holding the block committed */
    uint64_t pending;   /* targets holding it promised; an entry with both masks 0 is empty */
} Block;

typedef struct {
    int64_t key;
    int32_t slot;
    int32_t count; /* promises of the block on the slot, >= 2; 0: empty entry */
} Count;

typedef struct {
    PyObject_HEAD
    Block *blocks;
    uint64_t bmask; /* capacity - 1 (a power of two) */
    Py_ssize_t bused;
    Count *counts;
    uint64_t cmask;
    Py_ssize_t cused;
    uint64_t live; /* slots added and not removed */
    int next_slot;
    Py_ssize_t n_committed[MAX_SLOTS];
    Py_ssize_t n_pending[MAX_SLOTS];
} BlockTables;

static inline uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t count_home(int64_t key, int32_t slot) {
    return mix((uint64_t)key ^ ((uint64_t)(uint32_t)slot * 0xd6e8feb86659fd93ULL));
}

/* -- memory -------------------------------------------------------------------------------------------------- */
/* A table of ``bytes`` bytes, zeroed. From 2 MB on it is its own mapping, advised to the kernel as wanting huge
   pages (``MADV_HUGEPAGE``, honoured where transparent huge pages are ``madvise`` or ``always``): a probe lands
   anywhere in it, and with 4 kB pages nearly every probe of a table much larger than the caches also missed the
   TLB. ``table_free`` takes the same size. */
#define HUGE_FROM ((size_t)2 << 20)

static void *table_alloc(size_t bytes) {
    if (bytes < HUGE_FROM)
        return PyMem_Calloc(1, bytes);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

static void table_free(void *p, size_t bytes) {
    if (p == NULL)
        return;
    if (bytes < HUGE_FROM)
        PyMem_Free(p);
    else
        munmap(p, bytes);
}

/* -- the block table ------------------------------------------------------------------------------------------- */
static inline int empty(const Block *b) { return (b->committed | b->pending) == 0; }

/* Position of ``key``'s entry, or -1. */
static inline int64_t find(BlockTables *t, int64_t key) {
    uint64_t i = mix((uint64_t)key) & t->bmask;
    for (;;) {
        Block *b = &t->blocks[i];
        if (empty(b))
            return -1;
        if (b->key == key)
            return (int64_t)i;
        i = (i + 1) & t->bmask;
    }
}

/* Lookups of keys one after another wait for each one's cache miss in turn: a prompt's blocks land anywhere in a
   table much larger than the caches. The loops below prefetch the home entry of the key ``AHEAD`` places on
   (``prefetch_first`` the first ``AHEAD`` before the loop). ``match_groups`` was 3.8% of the live router's CPU at
   shared-4000 against 0.65% of its instructions; ``benchmarks/block_table_probes.py`` times these calls with the
   tables out of cache (2026-12-01). Both helpers are ``always_inline``: GCC (12, -O2) judged a function that only
   prefetches to have no effect (IPA pure-const) and dropped every call to it, prefetches and all. */
#define AHEAD 8 /* a power of two: ``walk_next`` indexes its ring with a mask */

static inline __attribute__((always_inline)) void prefetch_home(BlockTables *t, int64_t key) {
    __builtin_prefetch(&t->blocks[mix((uint64_t)key) & t->bmask]);
}

static inline __attribute__((always_inline)) void prefetch_first(BlockTables *t, const int64_t *keys, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n && k < AHEAD; k++)
        prefetch_home(t, keys[k]);
}

static int grow_blocks(BlockTables *t) {
    uint64_t old_n = t->bmask + 1, n = old_n * 2;
    Block *old = t->blocks, *blocks = table_alloc(n * sizeof(Block));
    if (blocks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < old_n; i++) {
        if (empty(&old[i]))
            continue;
        uint64_t j = mix((uint64_t)old[i].key) & (n - 1);
        while (!empty(&blocks[j]))
            j = (j + 1) & (n - 1);
        blocks[j] = old[i];
    }
    table_free(old, old_n * sizeof(Block));
    t->blocks = blocks;
    t->bmask = n - 1;
    return 0;
}

/* Position of ``key``'s entry, made (both masks 0: the caller sets one at once) when absent; -1 on no memory. */
static int64_t find_or_add(BlockTables *t, int64_t key) {
    int64_t at = find(t, key);
    if (at >= 0)
        return at;
    if ((uint64_t)(t->bused + 1) * 2 > t->bmask + 1 && grow_blocks(t) < 0)
        return -1;
    uint64_t i = mix((uint64_t)key) & t->bmask;
    while (!empty(&t->blocks[i]))
        i = (i + 1) & t->bmask;
    t->blocks[i].key = key;
    t->bused++;
    return (int64_t)i;
}

/* Empty the entry at ``i`` (backward-shift deletion). */
static void delete_block(BlockTables *t, uint64_t i) {
    Block *blocks = t->blocks;
    uint64_t m = t->bmask, j = i;
    blocks[i].committed = blocks[i].pending = 0;
    for (;;) {
        j = (j + 1) & m;
        if (empty(&blocks[j]))
            break;
        uint64_t home = mix((uint64_t)blocks[j].key) & m;
        /* the entry at ``j`` may move back to ``i`` unless its home lies cyclically in (i, j] */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            blocks[i] = blocks[j];
            blocks[j].committed = blocks[j].pending = 0;
            i = j;
        }
    }
    t->bused--;
}

/* -- the table of promise counts >= 2 -------------------------------------------------------------------------- */
static inline int64_t find_count(BlockTables *t, int64_t key, int32_t slot) {
    uint64_t i = count_home(key, slot) & t->cmask;
    for (;;) {
        Count *c = &t->counts[i];
        if (c->count == 0)
            return -1;
        if (c->key == key && c->slot == slot)
            return (int64_t)i;
        i = (i + 1) & t->cmask;
    }
}

static int grow_counts(BlockTables *t) {
    uint64_t old_n = t->cmask + 1, n = old_n * 2;
    Count *old = t->counts, *counts = table_alloc(n * sizeof(Count));
    if (counts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < old_n; i++) {
        if (old[i].count == 0)
            continue;
        uint64_t j = count_home(old[i].key, old[i].slot) & (n - 1);
        while (counts[j].count != 0)
            j = (j + 1) & (n - 1);
        counts[j] = old[i];
    }
    table_free(old, old_n * sizeof(Count));
    t->counts = counts;
    t->cmask = n - 1;
    return 0;
}

/* One more promise of a block whose pending bit is already set on ``slot`` (count 1 -> 2, or n -> n + 1). */
static int count_up(BlockTables *t, int64_t key, int32_t slot) {
    int64_t at = find_count(t, key, slot);
    if (at >= 0) {
        if (t->counts[at].count == INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "BlockTables: too many promises of one block");
            return -1;
        }
        t->counts[at].count++;
        return 0;
    }
    if ((uint64_t)(t->cused + 1) * 2 > t->cmask + 1 && grow_counts(t) < 0)
        return -1;
    uint64_t i = count_home(key, slot) & t->cmask;
    while (t->counts[i].count != 0)
        i = (i + 1) & t->cmask;
    t->counts[i].key = key;
    t->counts[i].slot = slot;
    t->counts[i].count = 2;
    t->cused++;
    return 0;
}

static void delete_count(BlockTables *t, uint64_t i) {
    Count *counts = t->counts;
    uint64_t m = t->cmask, j = i;
    counts[i].count = 0;
    for (;;) {
        j = (j + 1) & m;
        if (counts[j].count == 0)
            break;
        uint64_t home = count_home(counts[j].key, counts[j].slot) & m;
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            counts[i] = counts[j];
            counts[j].count = 0;
            i = j;
        }
    }
    t->cused--;
}

/* A target's promise count of the block at ``i`` (0 when its pending bit is clear). */
static int32_t promises(BlockTables *t, uint64_t i, int32_t slot) {
    if (!(t->blocks[i].pending & (1ULL << slot)))
        return 0;
    int64_t at = find_count(t, t->blocks[i].key, slot);
    return at >= 0 ? t->counts[at].count : 1;
}

/* -- arguments ------------------------------------------------------------------------------------------------- */
/* The slot argument of a live target, or -1 with KeyError set. */
static int live_slot(BlockTables *t, PyObject *arg) {
    int overflow = 0;
    long s = PyLong_AsLongAndOverflow(arg, &overflow);
    if (s == -1 && PyErr_Occurred())
        return -1;
    if (overflow || s < 0 || s >= MAX_SLOTS || !(t->live & (1ULL << s))) {
        PyErr_SetObject(PyExc_KeyError, arg);
        return -1;
    }
    return (int)s;
}

/* ``h`` as a key: 1, or 0 when it is an int outside the signed 64-bit range (absent from every table), or -1
   with an error set (not an int). */
static inline int key_of(PyObject *h, int64_t *key) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(h, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *key = (int64_t)v;
    return overflow ? 0 : 1;
}

/* Hashes read as keys, for the calls that go over all of them (``store``, ``remove``, ``promise``, ``retire``):
   ``keys[k]`` (PyMem), ``ok[k]`` 0 for a hash outside the key range. Packed hashes (``packed_view``) are copied as
   they are; a sequence of ints is converted, and ``items`` are its ints (the same objects go in a list answer);
   with ``strict`` a hash outside the range raises OverflowError. */
typedef struct {
    Py_ssize_t n;
    int64_t *keys;
    char *ok;
    int packed;
    Py_buffer view; /* held while ``packed`` */
    PyObject *seq;  /* the sequence (not packed) */
    PyObject **items;
} Keys;

static void keys_close(Keys *k) {
    PyMem_Free(k->keys);
    PyMem_Free(k->ok);
    k->keys = NULL;
    k->ok = NULL;
    if (k->packed)
        PyBuffer_Release(&k->view);
    Py_CLEAR(k->seq);
    k->packed = 0;
}

/* 0, or -1 with an error set (nothing held). */
static int keys_open(PyObject *hashes, int strict, Keys *k) {
    memset(k, 0, sizeof *k);
    k->packed = packed_view(hashes, &k->view);
    if (k->packed < 0) {
        k->packed = 0;
        return -1;
    }
    if (k->packed) {
        k->n = k->view.len / 8;
    } else {
        if ((k->seq = PySequence_Fast(hashes, "hashes must be iterable")) == NULL)
            return -1;
        k->n = PySequence_Fast_GET_SIZE(k->seq);
        k->items = PySequence_Fast_ITEMS(k->seq);
    }
    k->keys = PyMem_Malloc((size_t)(k->n ? k->n : 1) * sizeof(int64_t));
    k->ok = PyMem_Malloc((size_t)(k->n ? k->n : 1));
    if (k->keys == NULL || k->ok == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (k->packed) {
        memcpy(k->keys, k->view.buf, (size_t)k->n * sizeof(int64_t));
        memset(k->ok, 1, (size_t)k->n);
        return 0;
    }
    for (Py_ssize_t i = 0; i < k->n; i++) {
        int r = key_of(k->items[i], &k->keys[i]);
        if (r < 0)
            goto fail;
        if (r == 0 && strict) {
            PyErr_SetString(PyExc_OverflowError, "block hash outside the signed 64-bit range");
            goto fail;
        }
        k->ok[i] = (char)r;
    }
    return 0;
fail:
    keys_close(k);
    return -1;
}

/* The answer of a call over ``k``: the hashes at the positions ``chosen`` marks (``ok`` reused as the mark), a list
   of the same ints for a sequence, a ``bytes`` of their int64s for packed hashes (``BlockIndex`` wraps it). */
static PyObject *chosen_answer(const Keys *k, const char *chosen) {
    Py_ssize_t m = 0;
    for (Py_ssize_t i = 0; i < k->n; i++)
        m += chosen[i] != 0;
    if (k->packed) {
        PyObject *out = PyBytes_FromStringAndSize(NULL, m * 8);
        if (out == NULL)
            return NULL;
        int64_t *to = (int64_t *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < k->n; i++)
            if (chosen[i])
                *to++ = k->keys[i];
        return out;
    }
    PyObject *out = PyList_New(m);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0, j = 0; i < k->n; i++)
        if (chosen[i])
            PyList_SET_ITEM(out, j++, Py_NewRef(k->items[i]));
    return out;
}

#define NEED_ARGS(n, name)                                                                  \
    if (nargs != (n)) {                                                                     \
        PyErr_SetString(PyExc_TypeError, name "() takes " #n " arguments");                 \
        return NULL;                                                                        \
    }

/* -- targets --------------------------------------------------------------------------------------------------- */
static PyObject *BT_add_target(BlockTables *t, PyObject *Py_UNUSED(ignored)) {
    if (t->next_slot >= MAX_SLOTS) {
        PyErr_SetString(PyExc_OverflowError, "BlockTables holds slots 0-63 only");
        return NULL;
    }
    int s = t->next_slot++;
    t->live |= 1ULL << s;
    t->n_committed[s] = t->n_pending[s] = 0;
    return PyLong_FromLong(s);
}

static PyObject *BT_has_target(BlockTables *t, PyObject *arg) {
    int overflow = 0;
    long s = PyLong_AsLongAndOverflow(arg, &overflow);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(!overflow && s >= 0 && s < MAX_SLOTS && (t->live & (1ULL << s)));
}

/* Clear ``which`` (committed and/or pending) bits of ``slot`` everywhere, dropping entries left empty and, with
   pending, the slot's counts. */
static int clear_slot(BlockTables *t, int slot, int committed, int pending) {
    uint64_t bit = 1ULL << slot, n = t->bmask + 1;
    Py_ssize_t cap = 64, k = 0;
    int64_t *gone = PyMem_Malloc((size_t)cap * sizeof(int64_t));
    if (gone == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        Block *b = &t->blocks[i];
        if (empty(b))
            continue;
        if (committed)
            b->committed &= ~bit;
        if (pending)
            b->pending &= ~bit;
        if (empty(b)) {
            b->committed = bit; /* keep the slot occupied until the scan is over: probes still pass it */
            if (k == cap) {
                int64_t *more = PyMem_Realloc(gone, (size_t)(cap *= 2) * sizeof(int64_t));
                if (more == NULL) {
                    PyMem_Free(gone);
                    PyErr_NoMemory();
                    return -1;
                }
                gone = more;
            }
            gone[k++] = b->key;
        }
    }
    for (Py_ssize_t j = 0; j < k; j++)
        delete_block(t, (uint64_t)find(t, gone[j]));
    PyMem_Free(gone);
    if (pending) {
        for (uint64_t i = 0; i <= t->cmask;) {
            if (t->counts[i].count != 0 && t->counts[i].slot == slot)
                delete_count(t, i); /* an entry may move into ``i``: look at it again */
            else
                i++;
        }
        t->n_pending[slot] = 0;
    }
    if (committed)
        t->n_committed[slot] = 0;
    return 0;
}

static PyObject *BT_remove_target(BlockTables *t, PyObject *arg) {
    int s = live_slot(t, arg);
    if (s < 0 || clear_slot(t, s, 1, 1) < 0)
        return NULL;
    t->live &= ~(1ULL << s);
    Py_RETURN_NONE;
}

/* -- committed tables (KV events) ------------------------------------------------------------------------------ */
/* store / remove: the hashes the committed table gained / lost, judged against the table before the call (a
   hash listed twice is listed twice), then the change. */
/* ``store``/``remove``. The hashes come as a sequence of ints (the answer: a list of those chosen, the same objects)
   or packed (``packed_view``: the answer packed too, a ``bytes`` of their int64s that ``BlockIndex`` wraps), which
   spares a KV event's hashes an int object each both ways: made by the payload's reader, read back here (250 stored
   and about as many removed a 4,000-token request). */
static PyObject *commit(BlockTables *t, PyObject *const *args, Py_ssize_t nargs, int storing) {
    NEED_ARGS(2, "store/remove")
    int s = live_slot(t, args[0]);
    if (s < 0)
        return NULL;
    uint64_t bit = 1ULL << s;
    Keys k;
    if (keys_open(args[1], storing, &k) < 0)
        return NULL;
    Py_ssize_t n = k.n;
    int64_t *keys = k.keys;
    char *ok = k.ok;
    prefetch_first(t, keys, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            prefetch_home(t, keys[i + AHEAD]);
        if (!ok[i])
            continue;
        int64_t at = find(t, keys[i]);
        int held = at >= 0 && (t->blocks[at].committed & bit);
        ok[i] = (char)(storing ? !held : held); /* now: whether it goes in the answer */
    }
    PyObject *out = chosen_answer(&k, ok);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!ok[i])
            continue;
        if (storing) {
            int64_t at = find_or_add(t, keys[i]);
            if (at < 0) {
                Py_CLEAR(out); /* (no memory: the tables hold the blocks committed so far) */
                goto done;
            }
            Block *b = &t->blocks[at];
            if (!(b->committed & bit)) {
                b->committed |= bit;
                t->n_committed[s]++;
            }
        } else {
            int64_t at = find(t, keys[i]);
            if (at < 0 || !(t->blocks[at].committed & bit))
                continue; /* (listed twice) */
            t->blocks[at].committed &= ~bit;
            t->n_committed[s]--;
            if (empty(&t->blocks[at]))
                delete_block(t, (uint64_t)at);
        }
    }
done:
    keys_close(&k);
    return out;
}

static PyObject *BT_store(BlockTables *t, PyObject *const *args, Py_ssize_t nargs) { return commit(t, args, nargs, 1); }

static PyObject *BT_remove(BlockTables *t, PyObject *const *args, Py_ssize_t nargs) {
    return commit(t, args, nargs, 0);
}

static PyObject *BT_clear_committed(BlockTables *t, PyObject *arg) {
    int s = live_slot(t, arg);
    if (s < 0)
        return NULL;
    Py_ssize_t n = t->n_committed[s];
    if (n && clear_slot(t, s, 1, 0) < 0)
        return NULL;
    return PyLong_FromSsize_t(n);
}

static PyObject *BT_is_committed(BlockTables *t, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(2, "is_committed")
    int s = live_slot(t, args[0]);
    if (s < 0)
        return NULL;
    int64_t key;
    int r = key_of(args[1], &key);
    if (r < 0)
        return NULL;
    int64_t at = r ? find(t, key) : -1;
    return PyBool_FromLong(at >= 0 && (t->blocks[at].committed & (1ULL << s)));
}

/* A walk over a prompt's hashes, in order, for the queries that stop at the first block a target lacks: the
   hashes are read (and their home entries prefetched) ``AHEAD`` before they are looked up, so a walk that stops
   early has converted and prefetched at most ``AHEAD`` more (a prompt unknown everywhere stops at its first
   block). */
#define WALK_END (-2)
#define WALK_ERROR (-3)

typedef struct {
    PyObject **items; /* the ints of a sequence; NULL for packed hashes (``view``) */
    Py_ssize_t n;
    Py_ssize_t next;  /* the next hash to read (into ``keys[next % AHEAD]``) */
    Py_ssize_t taken; /* hashes already looked up */
    int64_t keys[AHEAD];
    signed char ok[AHEAD]; /* 1: a key; 0: an int outside the key range (absent); -1: not an int */
    PyObject *seq;    /* the sequence ``items`` are of */
    Py_buffer view;   /* packed hashes (``packed_view``), held while ``items`` is NULL */
} Walk;

/* A walk over ``hashes``: packed (``packed_view``) or any sequence of ints. 0, or -1 with an error set; a walk
   opened is closed with ``walk_close``. */
static int walk_open(PyObject *hashes, Walk *w, const char *not_a_sequence) {
    w->next = w->taken = 0;
    w->seq = NULL;
    w->items = NULL;
    int packed = packed_view(hashes, &w->view);
    if (packed < 0)
        return -1;
    if (packed) {
        w->n = w->view.len / 8;
        return 0;
    }
    if ((w->seq = PySequence_Fast(hashes, not_a_sequence)) == NULL)
        return -1;
    w->items = PySequence_Fast_ITEMS(w->seq);
    w->n = PySequence_Fast_GET_SIZE(w->seq);
    return 0;
}

static void walk_close(Walk *w) {
    if (w->seq != NULL)
        Py_CLEAR(w->seq);
    else
        PyBuffer_Release(&w->view);
}

/* The entry of the walk's next hash (-1: absent, or a hash outside the key range), WALK_END after the last, or
   WALK_ERROR with an error set (not an int). Inlined into each walk: called, the read-ahead cost 77% more
   instructions a walk than the walk without it, inlined 49% (callgrind, 2026-12-01). */
static inline __attribute__((always_inline)) int64_t walk_next(BlockTables *t, Walk *w) {
    for (; w->next < w->n && w->next - w->taken < AHEAD; w->next++) {
        Py_ssize_t k = w->next & (AHEAD - 1);
        int r = 1;
        if (w->items == NULL)
            w->keys[k] = packed_at(&w->view, w->next);
        else if ((r = key_of(w->items[w->next], &w->keys[k])) < 0)
            PyErr_Clear(); /* raised when the walk reaches it: a walk that stops before it raises nothing */
        w->ok[k] = (signed char)r;
        if (r > 0)
            prefetch_home(t, w->keys[k]);
    }
    if (w->taken == w->n)
        return WALK_END;
    Py_ssize_t i = w->taken++, k = i & (AHEAD - 1);
    if (w->ok[k] < 0) {
        int r = key_of(w->items[i], &w->keys[k]); /* its error again, now that the walk reached it */
        if (r < 0)
            return WALK_ERROR;
        w->ok[k] = (signed char)r;
    }
    return w->ok[k] ? find(t, w->keys[k]) : -1;
}

static PyObject *BT_all_committed(BlockTables *t, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(2, "all_committed")
    int s = live_slot(t, args[0]);
    if (s < 0)
        return NULL;
    Walk w;
    if (walk_open(args[1], &w, "hashes must be iterable") < 0)
        return NULL;
    int all = 1;
    for (;;) {
        int64_t at = walk_next(t, &w);
        if (at == WALK_ERROR) {
            walk_close(&w);
            return NULL;
        }
        if (at == WALK_END)
            break;
        if (at < 0 || !(t->blocks[at].committed & (1ULL << s))) {
            all = 0;
            break;
        }
    }
    walk_close(&w);
    return PyBool_FromLong(all);
}

static PyObject *BT_committed_prefix(BlockTables *t, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(2, "committed_prefix")
    int s = live_slot(t, args[0]);
    if (s < 0)
        return NULL;
    Walk w;
    if (walk_open(args[1], &w, "hashes must be iterable") < 0)
        return NULL;
    Py_ssize_t k = 0;
    for (;; k++) {
        int64_t at = walk_next(t, &w);
        if (at == WALK_ERROR) {
            walk_close(&w);
            return NULL;
        }
        if (at == WALK_END || at < 0 || !(t->blocks[at].committed & (1ULL << s)))
            break;
    }
    walk_close(&w);
    return PyLong_FromSsize_t(k);
}

/* -- pending tables (routed requests) -------------------------------------------------------------------------- */
static PyObject *BT_promise(BlockTables *t, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(2, "promise")
    int s = live_slot(t, args[0]);
    if (s < 0)
        return NULL;
    uint64_t bit = 1ULL << s;
    Keys k;
    if (keys_open(args[1], 1, &k) < 0)
        return NULL;
    Py_ssize_t n = k.n;
    int64_t *keys = k.keys;
    char *gained = k.ok; /* (every ``ok`` is 1: strict) now: whether the pending table gained it */
    PyObject *out = NULL;
    prefetch_first(t, keys, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            prefetch_home(t, keys[i + AHEAD]);
        gained[i] = 0;
        int64_t at = find_or_add(t, keys[i]);
        if (at < 0)
            goto done;
        Block *b = &t->blocks[at];
        if (b->pending & bit) {
            if (count_up(t, keys[i], s) < 0)
                goto done;
            continue;
        }
        b->pending |= bit;
        t->n_pending[s]++;
        gained[i] = 1;
    }
    out = chosen_answer(&k, gained);
done:
    keys_close(&k);
    return out;
}

static PyObject *BT_retire(BlockTables *t, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(2, "retire")
    int overflow = 0;
    long s = PyLong_AsLongAndOverflow(args[0], &overflow);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    if (overflow || s < 0 || s >= MAX_SLOTS || !(t->live & (1ULL << s)))
        Py_RETURN_NONE; /* the target is gone */
    uint64_t bit = 1ULL << s;
    Keys k;
    if (keys_open(args[1], 0, &k) < 0)
        return NULL;
    Py_ssize_t n = k.n;
    int64_t *keys = k.keys;
    char *lost = k.ok; /* now: whether the target no longer holds it in either table */
    prefetch_first(t, keys, n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            prefetch_home(t, keys[i + AHEAD]);
        int64_t at = lost[i] ? find(t, keys[i]) : -1;
        lost[i] = 0;
        if (at < 0 || !(t->blocks[at].pending & bit))
            continue;
        int64_t c = find_count(t, keys[i], (int32_t)s);
        if (c >= 0) {
            if (t->counts[c].count > 2)
                t->counts[c].count--;
            else
                delete_count(t, (uint64_t)c);
            continue;
        }
        Block *b = &t->blocks[at];
        b->pending &= ~bit;
        t->n_pending[s]--;
        lost[i] = !(b->committed & bit);
        if (empty(b))
            delete_block(t, (uint64_t)at);
    }
    PyObject *out = chosen_answer(&k, lost);
    keys_close(&k);
    return out;
}

/* -- queries --------------------------------------------------------------------------------------------------- */
static PyObject *append_group(PyObject *groups, Py_ssize_t blocks, uint64_t mask) {
    PyObject *g = Py_BuildValue("(nK)", blocks, (unsigned long long)mask);
    if (g == NULL)
        return NULL;
    int rc = PyList_Append(groups, g);
    Py_DECREF(g);
    return rc < 0 ? NULL : groups;
}

static PyObject *BT_match_groups(BlockTables *t, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ARGS(2, "match_groups")
    if (!PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slots_mask must be an int");
        return NULL;
    }
    uint64_t live = PyLong_AsUnsignedLongLongMask(args[1]); /* (no target has a slot past 63) */
    if (live == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    Walk w;
    if (walk_open(args[0], &w, "hashes must be a sequence") < 0)
        return NULL;
    Py_ssize_t n = w.n;
    PyObject *groups = PyList_New(0);
    for (Py_ssize_t i = 0; groups != NULL && live; i++) {
        int64_t at = walk_next(t, &w);
        if (at == WALK_ERROR) {
            Py_CLEAR(groups);
            break;
        }
        if (at == WALK_END)
            break;
        uint64_t have = at >= 0 ? (t->blocks[at].committed | t->blocks[at].pending) & live : 0;
        if (have != live) {
            if (i && append_group(groups, i, live ^ have) == NULL)
                Py_CLEAR(groups);
            live = have;
        }
    }
    if (groups != NULL && live && n && append_group(groups, n, live) == NULL)
        Py_CLEAR(groups);
    walk_close(&w);
    if (groups != NULL && PyList_Reverse(groups) < 0)
        Py_CLEAR(groups);
    return groups;
}

static PyObject *BT_holders(BlockTables *t, PyObject *arg) {
    int64_t key;
    int r = key_of(arg, &key);
    if (r < 0)
        return NULL;
    int64_t at = r ? find(t, key) : -1;
    return PyLong_FromUnsignedLongLong(at >= 0 ? t->blocks[at].committed | t->blocks[at].pending : 0);
}

static PyObject *BT_sizes(BlockTables *t, PyObject *arg) {
    int s = live_slot(t, arg);
    if (s < 0)
        return NULL;
    return Py_BuildValue("(nn)", t->n_committed[s], t->n_pending[s]);
}

/* export() -> (next_slot, {slot: (committed hashes, {hash: promises})}) for the live slots. */
static PyObject *BT_export(BlockTables *t, PyObject *Py_UNUSED(ignored)) {
    PyObject *tables = PyDict_New();
    if (tables == NULL)
        return NULL;
    for (int s = 0; s < MAX_SLOTS; s++) {
        if (!(t->live & (1ULL << s)))
            continue;
        PyObject *entry = Py_BuildValue("(NN)", PyList_New(0), PyDict_New());
        PyObject *key = PyLong_FromLong(s);
        if (entry == NULL || key == NULL || PyDict_SetItem(tables, key, entry) < 0) {
            Py_XDECREF(entry);
            Py_XDECREF(key);
            Py_DECREF(tables);
            return NULL;
        }
        Py_DECREF(entry);
        Py_DECREF(key);
    }
    for (uint64_t i = 0; i <= t->bmask; i++) {
        Block *b = &t->blocks[i];
        if (empty(b))
            continue;
        PyObject *h = PyLong_FromLongLong(b->key);
        if (h == NULL)
            goto fail;
        for (int s = 0; s < MAX_SLOTS; s++) {
            uint64_t bit = 1ULL << s;
            if (!((b->committed | b->pending) & bit))
                continue;
            PyObject *key = PyLong_FromLong(s);
            PyObject *entry = key ? PyDict_GetItemWithError(tables, key) : NULL; /* borrowed */
            Py_XDECREF(key);
            if (entry == NULL)
                goto fail_h;
            if ((b->committed & bit) && PyList_Append(PyTuple_GET_ITEM(entry, 0), h) < 0)
                goto fail_h;
            if (b->pending & bit) {
                PyObject *count = PyLong_FromLong(promises(t, i, s));
                int rc = count ? PyDict_SetItem(PyTuple_GET_ITEM(entry, 1), h, count) : -1;
                Py_XDECREF(count);
                if (rc < 0)
                    goto fail_h;
            }
        }
        Py_DECREF(h);
        continue;
    fail_h:
        Py_DECREF(h);
        goto fail;
    }
    return Py_BuildValue("(iN)", t->next_slot, tables);
fail:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_SystemError, "BlockTables.export: a slot's entry is missing");
    Py_DECREF(tables);
    return NULL;
}

static PyObject *BT_len(BlockTables *t, void *Py_UNUSED(closure)) { return PyLong_FromSsize_t(t->bused); }

static PyObject *BT_get_next_slot(BlockTables *t, void *Py_UNUSED(closure)) { return PyLong_FromLong(t->next_slot); }

static void free_tables(BlockTables *t) {
    if (t->blocks != NULL)
        table_free(t->blocks, (t->bmask + 1) * sizeof(Block));
    if (t->counts != NULL)
        table_free(t->counts, (t->cmask + 1) * sizeof(Count));
    t->blocks = NULL;
    t->counts = NULL;
}

/* -- the type -------------------------------------------------------------------------------------------------- */
static int BT_init(BlockTables *t, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":BlockTables", kwlist))
        return -1;
    free_tables(t);
    t->blocks = table_alloc(1024 * sizeof(Block));
    t->counts = table_alloc(256 * sizeof(Count));
    if (t->blocks == NULL || t->counts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->bmask = 1023;
    t->cmask = 255;
    t->bused = t->cused = 0;
    t->live = 0;
    t->next_slot = 0;
    return 0;
}

static void BT_dealloc(BlockTables *t) {
    free_tables(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

static PyMethodDef BT_methods[] = {
    {"add_target", (PyCFunction)BT_add_target, METH_NOARGS, "A new slot (never reused); OverflowError past 63."},
    {"has_target", (PyCFunction)BT_has_target, METH_O, "Whether the slot was added and not removed."},
    {"remove_target", (PyCFunction)BT_remove_target, METH_O, "Forget the target entirely."},
    {"store", FAST(BT_store), "Commit the hashes; returns those the committed table gained (packed hashes: packed)."},
    {"remove", FAST(BT_remove), "Uncommit the hashes; returns those the committed table lost (packed: packed)."},
    {"clear_committed", (PyCFunction)BT_clear_committed, METH_O, "Empty the committed table; returns its size."},
    {"is_committed", FAST(BT_is_committed), "Whether the hash is in the target's committed table."},
    {"all_committed", FAST(BT_all_committed), "Whether every hash is in the target's committed table."},
    {"committed_prefix", FAST(BT_committed_prefix), "Leading hashes in the target's committed table."},
    {"promise", FAST(BT_promise), "One more promise of each hash; returns those the pending table gained."},
    {"retire", FAST(BT_retire),
     "One promise fewer of each hash; returns those the target no longer holds, None if it is gone."},
    {"match_groups", FAST(BT_match_groups),
     "(matched_blocks, mask of the targets that hold exactly that many leading blocks), longest first."},
    {"holders", (PyCFunction)BT_holders, METH_O, "Mask of the targets holding the block (committed or pending)."},
    {"sizes", (PyCFunction)BT_sizes, METH_O, "(committed blocks, pending blocks) of a target."},
    {"export", (PyCFunction)BT_export, METH_NOARGS,
     "(next_slot, {slot: (committed hashes, {hash: promises})}): the tables, for BlockTablesPy.from_export."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef BT_getset[] = {
    {"blocks", (getter)BT_len, NULL, "distinct blocks held by any target", NULL},
    {"next_slot", (getter)BT_get_next_slot, NULL, "the slot add_target gives next", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BlockTablesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_moe.router.placement.native_block_tables.BlockTables",
    .tp_doc = "BlockTablesPy in C (reference: sgl_moe.router.placement.block_tables.BlockTablesPy).",
    .tp_basicsize = sizeof(BlockTables),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BT_init,
    .tp_dealloc = (destructor)BT_dealloc,
    .tp_methods = BT_methods,
    .tp_getset = BT_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "native_block_tables",
    "The router's block tables in C (reference: sgl_moe.router.placement.block_tables.BlockTablesPy).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_native_block_tables(void) {
    if (PyType_Ready(&BlockTablesType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "BlockTables", (PyObject *)&BlockTablesType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_SLOTS", MAX_SLOTS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
