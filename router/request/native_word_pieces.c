/* ``PieceTable`` in C: the ids of word pieces, looked up without a Python object per piece.

   ``word_pieces.py`` says what a piece is and holds the reference (``PieceTablePy``, two dicts); this type answers
   the same calls. Its tests (``tests/router/test_native_paths.py``) compare the two on random and adversarial
   texts.

   The Python table made a str for every piece of every text (to look it up in a dict), then copied the pieces'
   ids from their lists. Here a text's pieces are found in its UTF-8 bytes (a space is one byte there and is never
   part of another character's bytes, so the pieces are the same), hashed where they lie, and looked up in one
   open-addressing table whose keys and ids live in two arenas. The ids of a text come out as one list of ints,
   each taken from a vector of int objects indexed by id, so a kept piece costs no allocation.

   A piece is hashed with a seed drawn per table, and none is kept more than MAX_PROBE slots from its home slot:
   text that makes hashes collide (the router reads its users' text) slows a lookup by at most that many slots,
   and such a piece is encoded each time instead of kept.

   PieceTable(max_pieces, max_chars, *, packed=False)
   lookup(text) -> (ids, [], pieces) when every piece of ``text`` is kept, else (partial, new, pieces): ``new`` the
       texts of the pieces not kept, in order of appearance, once each; ``pieces`` how many pieces ``text`` has.
   partial.fill(fresh) -> (ids, []) with the pieces not kept taken from ``fresh`` (a dict of piece -> ids), or
       (None, unknown) when some are in neither (dropped from the table since ``lookup``). A partial keeps where
       the kept pieces lie, so ``fill`` does not look them up again unless the table was rebuilt since.
   keep(fresh) -> None: keeps each piece of ``fresh`` up to ``max_chars`` characters; at ``max_pieces`` pieces
       the older half is dropped (the table is rebuilt from the newer half).
   len(table): pieces kept.
   With ``packed``, every ``ids`` answered is the uint32 bytes of the ids (native order) instead of a list: the list
   cost an int object's reference count touched per id, a cache miss each in a vector of megabytes, and the ids'
   consumers read them back from those objects (``token_ids.TokenIds``). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_PROBE 128
#define MAX_CACHED_ID (1u << 22) /* ids below this share one int object each (a vocabulary is smaller) */

#define INLINE_KEY 20 /* bytes of a piece kept in its slot (most words): a lookup reads one cache line */
#define INLINE_IDS 4

typedef struct {
    uint64_t hash; /* 0: an empty slot */
    uint64_t seq;  /* when it was kept: the older half goes first */
    uint32_t key_at, ids_at; /* in the arenas, for a key or ids longer than fit here */
    uint16_t key_len, ids_len;
    char key[INLINE_KEY];
    uint32_t ids[INLINE_IDS];
} Slot;

_Static_assert(sizeof(Slot) == 64, "a slot is one cache line");

typedef struct {
    PyObject_HEAD
    Slot *slots;
    size_t mask; /* slots - 1 */
    size_t count;
    uint64_t seq, seed;
    uint64_t generation; /* rebuilds so far (slots move) */
    char *keys;
    size_t keys_len, keys_cap;
    uint32_t *ids;
    size_t ids_len, ids_cap;
    PyObject **id_objs; /* id -> its int object, made on first use */
    size_t id_objs_len;
    Py_ssize_t max_pieces, max_chars;
    int packed; /* ids answered as uint32 bytes, not a list of ints */
} PieceTable; /* slots: a power of two, at least twice ``count`` (they double as pieces are kept) */

static inline const char *slot_key(const PieceTable *t, const Slot *s) {
    return s->key_len <= INLINE_KEY ? s->key : t->keys + s->key_at;
}

static inline const uint32_t *slot_ids(const PieceTable *t, const Slot *s) {
    return s->ids_len <= INLINE_IDS ? s->ids : t->ids + s->ids_at;
}

/* Slots from 2 MB on are aligned to 2 MB and advised to the kernel as wanting huge pages (``MADV_HUGEPAGE``,
   honoured where transparent huge pages are ``madvise`` or ``always``): a lookup lands anywhere in the slots, and
   with 4 kB pages nearly every cold lookup also missed the TLB. */
#define HUGE_PAGE ((size_t)2 << 20)

static Slot *new_slots(size_t n) { /* zeroed, aligned to cache lines */
    size_t bytes = n * sizeof(Slot);
    Slot *slots = aligned_alloc(bytes >= HUGE_PAGE ? HUGE_PAGE : 64, bytes); /* (n a power of two) */
#ifdef MADV_HUGEPAGE
    if (slots != NULL && bytes >= HUGE_PAGE)
        madvise(slots, bytes, MADV_HUGEPAGE);
#endif
    if (slots == NULL)
        PyErr_NoMemory();
    else
        memset(slots, 0, n * sizeof(Slot));
    return slots;
}

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 31;
    h *= 0x7fb5d329728ea185ULL;
    h ^= h >> 27;
    h *= 0x81dadef4bc2dd44dULL;
    return h ^ (h >> 33);
}

/* The hash of the n bytes at s, which lie in a text ending at ``end``: eight bytes a step, the last partial word read
   as one 8-byte load and masked where 8 bytes are there to read (most pieces; not the text's last few), else copied
   (the same value either way: the first bytes are the low ones). Never 0: 0 marks an empty slot. */
static inline uint64_t hash_piece(const char *s, size_t n, const char *end, uint64_t seed) {
    uint64_t h = seed ^ (n * 0x9e3779b97f4a7c15ULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = mix(h ^ w);
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
#if PY_LITTLE_ENDIAN
    if (end - s >= 8) {
        memcpy(&w, s, 8);
        w = n ? w & (~0ULL >> (64 - 8 * n)) : 0; /* the first n bytes are the low ones */
    } else
#endif
    {
        memcpy(&w, s, n);
    }
    h = mix(h ^ w ^ ((uint64_t)n << 56));
    return h | 1;
}

static uint64_t hash_bytes(const char *s, size_t n, uint64_t seed) { return hash_piece(s, n, s + n, seed); }

/* The index of the first space at ``i`` or after, or ``n``: eight bytes a step (a zero byte of ``word ^ 0x20..20``
   is a space), then byte by byte. */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline Py_ssize_t next_space(const char *s, Py_ssize_t i, Py_ssize_t n) {
#if PY_LITTLE_ENDIAN
    while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        uint64_t x = w ^ (0x20 * ONES);
        uint64_t zero = (x - ONES) & ~x & HIGHS; /* its lowest set bit marks the first space exactly */
        if (zero)
            return i + (__builtin_ctzll(zero) >> 3);
        i += 8;
    }
#endif
    while (i < n && s[i] != ' ')
        i++;
    return i;
}

/* The slot holding this key, or NULL. */
static Slot *find(PieceTable *t, const char *key, size_t len, uint64_t h) {
    size_t at = (size_t)h & t->mask;
    for (int probe = 0; probe < MAX_PROBE; probe++, at = (at + 1) & t->mask) {
        Slot *s = &t->slots[at];
        if (s->hash == 0)
            return NULL;
        if (s->hash == h && s->key_len == len && memcmp(slot_key(t, s), key, len) == 0)
            return s;
    }
    return NULL;
}

static int grow(void **buf, size_t *cap, size_t need, size_t item) {
    if (need <= *cap)
        return 0;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need)
        cap2 *= 2;
    void *p = PyMem_Realloc(*buf, cap2 * item);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = cap2;
    return 0;
}

/* Puts a key not in the table in its first empty slot within MAX_PROBE of home; 0 when there is none (not kept). */
static Slot *place(PieceTable *t, uint64_t h) {
    size_t at = (size_t)h & t->mask;
    for (int probe = 0; probe < MAX_PROBE; probe++, at = (at + 1) & t->mask)
        if (t->slots[at].hash == 0)
            return &t->slots[at];
    return NULL;
}

/* Moves the pieces kept since ``cut`` (their ``seq``) into ``n`` new slots and fresh, compact arenas. Pieces get
   their ``seq`` when kept, one after another, and only a rebuild drops any, keeping every one from ``cut`` on: the
   kept seqs are always the last ``count`` given, so the newer half is the seqs from ``seq - count / 2``. */
static int rebuild(PieceTable *t, size_t n, uint64_t cut) {
    size_t old_n = t->mask + 1;
    Slot *old = t->slots;
    char *old_keys = t->keys;
    uint32_t *old_ids = t->ids;
    Slot *slots = new_slots(n);
    char *keys = PyMem_Malloc(t->keys_cap ? t->keys_cap : 1); /* the kept pieces fit in the caps they had */
    uint32_t *ids = PyMem_Malloc((t->ids_cap ? t->ids_cap : 1) * sizeof(uint32_t));
    if (slots == NULL || keys == NULL || ids == NULL) {
        free(slots);
        PyMem_Free(keys);
        PyMem_Free(ids);
        PyErr_NoMemory();
        return -1;
    }
    t->slots = slots;
    t->keys = keys;
    t->ids = ids;
    t->mask = n - 1;
    t->keys_len = t->ids_len = t->count = 0;
    for (size_t i = 0; i < old_n; i++) {
        Slot *s = &old[i];
        if (s->hash == 0 || s->seq < cut)
            continue;
        Slot *d = place(t, s->hash); /* as many slots or more for fewer pieces: it finds room but by rare chance */
        if (d == NULL)
            continue;
        *d = *s;
        if (s->key_len > INLINE_KEY) {
            memcpy(t->keys + t->keys_len, old_keys + s->key_at, s->key_len);
            d->key_at = (uint32_t)t->keys_len;
            t->keys_len += s->key_len;
        }
        if (s->ids_len > INLINE_IDS) {
            memcpy(t->ids + t->ids_len, old_ids + s->ids_at, s->ids_len * sizeof(uint32_t));
            d->ids_at = (uint32_t)t->ids_len;
            t->ids_len += s->ids_len;
        }
        t->count++;
    }
    t->generation++;
    free(old);
    PyMem_Free(old_keys);
    PyMem_Free(old_ids);
    return 0;
}

static PyObject *id_object(PieceTable *t, uint32_t id) {
    if (id >= MAX_CACHED_ID)
        return PyLong_FromUnsignedLong(id);
    if (id >= t->id_objs_len) {
        size_t n = t->id_objs_len ? t->id_objs_len : 1024;
        while (n <= id)
            n *= 2;
        PyObject **objs = PyMem_Realloc(t->id_objs, n * sizeof(PyObject *));
        if (objs == NULL)
            return PyErr_NoMemory();
        t->id_objs = objs;
        for (size_t i = t->id_objs_len; i < n; i++) /* made together: neighbours in memory, as ids in a text */
            if ((objs[i] = PyLong_FromSize_t(i)) == NULL) {
                for (size_t j = t->id_objs_len; j < i; j++)
                    Py_DECREF(objs[j]);
                return NULL;
            }
        t->id_objs_len = n;
    }
    return Py_NewRef(t->id_objs[id]);
}

/* A text's piece: where it lies in the UTF-8 bytes, and its slot (-1: not kept). */
typedef struct {
    Py_ssize_t start, end, slot;
} Piece;

typedef struct {
    Piece *items;
    size_t len, cap, missing, total; /* pieces, of which missing are not kept; total: the kept ones' ids */
} Pieces;

static int pieces_push(Pieces *v, Py_ssize_t start, Py_ssize_t end, Py_ssize_t slot) {
    if (v->len == v->cap && grow((void **)&v->items, &v->cap, v->len + 1, sizeof(Piece)) < 0)
        return -1;
    v->items[v->len++] = (Piece){start, end, slot};
    return 0;
}

/* The pieces of the UTF-8 text s[0:n], each found in the table or not. They are split and hashed
   ``PREFETCH_PIECES`` at a time, each one's home slot prefetched, then looked up: a text's pieces land on random
   slots of a table of megabytes, and a lookup made right after its hash waits for that slot's cache line (a
   4,000-token text: 92 us with the table in cache, 240-320 us after other processes evicted it, one lookup at a
   time on the 2-core VM). Blocks bound what is prefetched to what the lookups use before it is evicted again. */
#define PREFETCH_PIECES 32

static int split_and_find(PieceTable *t, const char *s, Py_ssize_t n, Pieces *v) {
    v->len = v->missing = v->total = 0;
    uint64_t hashes[PREFETCH_PIECES];
    Py_ssize_t i = 0;
    while (i < n) {
        size_t first = v->len;
        int k = 0;
        for (; k < PREFETCH_PIECES && i < n; k++) {
            Py_ssize_t start = i;
            while (i < n && s[i] == ' ')
                i++;
            i = next_space(s, i, n);
            hashes[k] = hash_piece(s + start, (size_t)(i - start), s + n, t->seed);
            __builtin_prefetch(&t->slots[(size_t)hashes[k] & t->mask]);
            if (pieces_push(v, start, i, -1) < 0)
                return -1;
        }
        for (int j = 0; j < k; j++) {
            Piece *p = &v->items[first + (size_t)j];
            const Slot *slot = find(t, s + p->start, (size_t)(p->end - p->start), hashes[j]);
            if (slot) {
                p->slot = slot - t->slots;
                v->total += slot->ids_len;
                if (slot->ids_len > INLINE_IDS) /* kept out of line: ``assemble`` reads them soon after */
                    __builtin_prefetch(t->ids + slot->ids_at);
            } else {
                v->missing++;
            }
        }
    }
    return 0;
}

/* The ids of the pieces, kept ones from the table, the others from ``fresh`` (borrowed lists, one per missing
   piece, in order): a list of ints, or with ``packed`` their uint32 bytes in native order (no int object made or
   touched per id; a fresh id outside uint32 raises OverflowError). */
static PyObject *assemble(PieceTable *t, const Pieces *v, PyObject *const *fresh, size_t total) {
    if (t->packed) {
        PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(total * sizeof(uint32_t)));
        if (out == NULL)
            return NULL;
        uint32_t *w = (uint32_t *)PyBytes_AS_STRING(out);
        size_t f = 0;
        for (size_t j = 0; j < v->len; j++) {
            const Piece *p = &v->items[j];
            if (p->slot >= 0) {
                const Slot *slot = &t->slots[p->slot];
                const uint32_t *src = slot_ids(t, slot);
                /* Most pieces are one or two ids: copied inline, not through a libc call each. */
                switch (slot->ids_len) {
                case 2:
                    w[1] = src[1];
                    /* fall through */
                case 1:
                    w[0] = src[0];
                    break;
                default:
                    memcpy(w, src, slot->ids_len * sizeof(uint32_t));
                }
                w += slot->ids_len;
                continue;
            }
            PyObject *list = fresh[f++];
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(list); k++) {
                unsigned long id = PyLong_AsUnsignedLong(PyList_GET_ITEM(list, k));
                if (id == (unsigned long)-1 && PyErr_Occurred()) {
                    Py_DECREF(out);
                    return NULL;
                }
                if (id > UINT32_MAX) {
                    Py_DECREF(out);
                    PyErr_SetString(PyExc_OverflowError, "a token id does not fit in uint32");
                    return NULL;
                }
                *w++ = (uint32_t)id;
            }
        }
        return out;
    }
    PyObject *ids = PyList_New((Py_ssize_t)total);
    if (ids == NULL)
        return NULL;
    Py_ssize_t at = 0;
    size_t f = 0;
    for (size_t j = 0; j < v->len; j++) {
        const Piece *p = &v->items[j];
        if (p->slot >= 0) {
            const Slot *slot = &t->slots[p->slot];
            const uint32_t *src = slot_ids(t, slot);
            for (uint32_t k = 0; k < slot->ids_len; k++) {
                PyObject *o = id_object(t, src[k]);
                if (o == NULL) {
                    Py_DECREF(ids);
                    return NULL;
                }
                PyList_SET_ITEM(ids, at++, o);
            }
        } else {
            PyObject *list = fresh[f++];
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(list); k++)
                PyList_SET_ITEM(ids, at++, Py_NewRef(PyList_GET_ITEM(list, k)));
        }
    }
    return ids;
}

/* The text of each missing piece, once each, in order; with ``fresh``, only those it lacks, and ``lists`` gets
   fresh's list for each missing piece (NULL where it lacks one). */
static PyObject *missing_pieces(const char *s, const Pieces *v, PyObject *fresh, PyObject **lists) {
    PyObject *new = PyList_New(0), *seen = PySet_New(NULL);
    if (new == NULL || seen == NULL)
        goto fail;
    size_t f = 0;
    for (size_t j = 0; j < v->len; j++) {
        const Piece *p = &v->items[j];
        if (p->slot >= 0)
            continue;
        PyObject *piece = PyUnicode_DecodeUTF8(s + p->start, p->end - p->start, "strict");
        if (piece == NULL)
            goto fail;
        PyObject *ids = fresh ? PyDict_GetItemWithError(fresh, piece) : NULL;
        if (ids != NULL && !PyList_Check(ids))
            PyErr_SetString(PyExc_TypeError, "fresh ids must be lists");
        if (PyErr_Occurred()) {
            Py_DECREF(piece);
            goto fail;
        }
        if (lists)
            lists[f++] = ids;
        int had = ids != NULL ? 1 : PySet_Contains(seen, piece);
        if (had < 0 || (!had && (PySet_Add(seen, piece) < 0 || PyList_Append(new, piece) < 0))) {
            Py_DECREF(piece);
            goto fail;
        }
        Py_DECREF(piece);
    }
    Py_DECREF(seen);
    return new;
fail:
    Py_XDECREF(new);
    Py_XDECREF(seen);
    return NULL;
}

/* What ``lookup`` found of a text with pieces not kept; ``fill`` finishes it. */
typedef struct {
    PyObject_HEAD
    PieceTable *table;
    PyObject *text;
    uint64_t generation; /* the table's when the slots were found: a rebuild moves them */
    Pieces pieces;
} Partial;

static PyTypeObject PartialType;

static PyObject *lookup(PieceTable *t, PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "lookup(text: str)");
        return NULL;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(text, &n);
    if (s == NULL)
        return NULL;
    Pieces v = {NULL, 0, 0, 0, 0};
    if (grow((void **)&v.items, &v.cap, (size_t)n / 4 + 16, sizeof(Piece)) < 0)
        return NULL;
    if (split_and_find(t, s, n, &v) < 0) {
        PyMem_Free(v.items);
        return NULL;
    }
    if (v.missing == 0) {
        PyObject *ids = assemble(t, &v, NULL, v.total), *none = ids ? PyList_New(0) : NULL;
        PyMem_Free(v.items);
        if (none == NULL) {
            Py_XDECREF(ids);
            return NULL;
        }
        return Py_BuildValue("(NNn)", ids, none, (Py_ssize_t)v.len);
    }
    PyObject *new = missing_pieces(s, &v, NULL, NULL);
    Partial *partial = new ? PyObject_New(Partial, &PartialType) : NULL;
    if (partial == NULL) {
        Py_XDECREF(new);
        PyMem_Free(v.items);
        return NULL;
    }
    partial->table = (PieceTable *)Py_NewRef(t);
    partial->text = Py_NewRef(text);
    partial->generation = t->generation;
    partial->pieces = v;
    return Py_BuildValue("(NNn)", partial, new, (Py_ssize_t)v.len);
}

static PyObject *fill(Partial *self, PyObject *fresh) {
    if (!PyDict_Check(fresh)) {
        PyErr_SetString(PyExc_TypeError, "fill(fresh: dict[str, list[int]])");
        return NULL;
    }
    PieceTable *t = self->table;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(self->text, &n);
    if (s == NULL)
        return NULL;
    if (self->generation != t->generation) { /* rebuilt since: find the pieces again */
        if (split_and_find(t, s, n, &self->pieces) < 0)
            return NULL;
        self->generation = t->generation;
    }
    const Pieces *v = &self->pieces;
    PyObject **lists = PyMem_Malloc((v->missing ? v->missing : 1) * sizeof(PyObject *));
    if (lists == NULL)
        return PyErr_NoMemory();
    PyObject *unknown = missing_pieces(s, v, fresh, lists), *out = NULL;
    if (unknown != NULL && PyList_GET_SIZE(unknown) > 0) {
        out = Py_BuildValue("(ON)", Py_None, unknown);
    } else if (unknown != NULL) {
        size_t total = v->total;
        for (size_t f = 0; f < v->missing; f++)
            total += (size_t)PyList_GET_SIZE(lists[f]);
        PyObject *ids = assemble(t, v, lists, total);
        out = ids ? Py_BuildValue("(NN)", ids, unknown) : NULL;
        if (out == NULL)
            Py_DECREF(unknown);
    }
    PyMem_Free(lists);
    return out;
}

static void partial_dealloc(Partial *self) {
    Py_XDECREF(self->table);
    Py_XDECREF(self->text);
    PyMem_Free(self->pieces.items);
    PyObject_Free(self);
}

static PyMethodDef partial_methods[] = {
    {"fill", (PyCFunction)fill, METH_O,
     "fill(fresh) -> (ids, []) or (None, unknown): the text's ids, its pieces not kept taken from fresh."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PartialType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_moe.router.request.native_word_pieces.Partial",
    .tp_basicsize = sizeof(Partial),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A text looked up with pieces not kept; see the module.",
    .tp_dealloc = (destructor)partial_dealloc,
    .tp_methods = partial_methods,
};

static PyObject *keep(PieceTable *t, PyObject *fresh) {
    if (!PyDict_Check(fresh)) {
        PyErr_SetString(PyExc_TypeError, "keep(fresh: dict[str, list[int]])");
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(fresh, &pos, &key, &value)) {
        if (!PyUnicode_Check(key) || !PyList_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "keep(fresh: dict[str, list[int]])");
            return NULL;
        }
        Py_ssize_t chars = PyUnicode_GET_LENGTH(key);
        if (chars == 0 || chars > t->max_chars)
            continue;
        Py_ssize_t len, m = PyList_GET_SIZE(value);
        const char *s = PyUnicode_AsUTF8AndSize(key, &len);
        if (s == NULL) { /* a lone surrogate: no UTF-8, never looked up (``lookup`` refuses such a text) */
            PyErr_Clear();
            continue;
        }
        uint64_t h = hash_bytes(s, (size_t)len, t->seed);
        if (find(t, s, (size_t)len, h) != NULL)
            continue;
        if ((Py_ssize_t)t->count >= t->max_pieces && rebuild(t, t->mask + 1, t->seq - t->count / 2) < 0)
            return NULL;
        if (2 * (t->count + 1) > t->mask + 1 && rebuild(t, 2 * (t->mask + 1), 0) < 0)
            return NULL; /* at most half full: the slots start few and double (a small table stays in cache) */
        if (len > UINT16_MAX || m > UINT16_MAX || t->keys_len + (size_t)len > UINT32_MAX ||
            t->ids_len + (size_t)m > UINT32_MAX)
            continue; /* far beyond max_chars' pieces; the arenas' offsets are 32-bit */
        Slot *d = place(t, h);
        if (d == NULL) /* its neighbourhood is full (colliding text): not kept, encoded each time */
            continue;
        if (grow((void **)&t->keys, &t->keys_cap, t->keys_len + (size_t)len, 1) < 0 ||
            grow((void **)&t->ids, &t->ids_cap, t->ids_len + (size_t)m, sizeof(uint32_t)) < 0)
            return NULL;
        uint32_t *ids = m <= INLINE_IDS ? d->ids : t->ids + t->ids_len; /* d stays empty (hash 0) until kept */
        int fits = 1;
        for (Py_ssize_t k = 0; k < m && fits; k++) {
            PyObject *o = PyList_GET_ITEM(value, k);
            unsigned long v = PyLong_Check(o) ? PyLong_AsUnsignedLong(o) : (unsigned long)-1;
            fits = !PyErr_Occurred() && PyLong_Check(o) && v <= UINT32_MAX;
            PyErr_Clear();
            ids[k] = (uint32_t)v;
        }
        if (!fits) /* not ids this table can hold: left out, encoded each time */
            continue;
        if (m > INLINE_IDS) {
            d->ids_at = (uint32_t)t->ids_len;
            t->ids_len += (size_t)m;
        }
        if (len <= INLINE_KEY) {
            memcpy(d->key, s, (size_t)len);
        } else {
            memcpy(t->keys + t->keys_len, s, (size_t)len);
            d->key_at = (uint32_t)t->keys_len;
            t->keys_len += (size_t)len;
        }
        d->hash = h;
        d->seq = t->seq++;
        d->key_len = (uint16_t)len;
        d->ids_len = (uint16_t)m;
        t->count++;
    }
    Py_RETURN_NONE;
}

static int init(PieceTable *t, PyObject *args, PyObject *kwds) {
    static char *names[] = {"max_pieces", "max_chars", "packed", NULL};
    Py_ssize_t max_pieces, max_chars;
    int packed = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nn|$p", names, &max_pieces, &max_chars, &packed))
        return -1;
    if (max_pieces < 1 || max_chars < 1 || max_pieces > (1 << 28)) {
        PyErr_SetString(PyExc_ValueError, "max_pieces and max_chars must be positive (max_pieces at most 2**28)");
        return -1;
    }
    size_t n = 64;
    free(t->slots);
    if ((t->slots = new_slots(n)) == NULL)
        return -1;
    t->mask = n - 1;
    t->count = t->keys_len = t->ids_len = 0;
    t->max_pieces = max_pieces;
    t->max_chars = max_chars;
    t->packed = packed;
    uint64_t seed;
    if (_PyOS_URandom(&seed, sizeof seed) < 0)
        return -1;
    t->seed = seed;
    return 0;
}

static void dealloc(PieceTable *t) {
    free(t->slots);
    PyMem_Free(t->keys);
    PyMem_Free(t->ids);
    for (size_t i = 0; i < t->id_objs_len; i++)
        Py_XDECREF(t->id_objs[i]);
    PyMem_Free(t->id_objs);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t length(PieceTable *t) { return (Py_ssize_t)t->count; }

static PyMethodDef methods[] = {
    {"lookup", (PyCFunction)lookup, METH_O, "lookup(text) -> (ids | partial, new, pieces); see the module."},
    {"keep", (PyCFunction)keep, METH_O, "keep(fresh: dict[str, list[int]]) -> None; see the module."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods sequence = {.sq_length = (lenfunc)length};

static PyTypeObject PieceTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_moe.router.request.native_word_pieces.PieceTable",
    .tp_basicsize = sizeof(PieceTable),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Ids of word pieces by their text; see the module.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)init,
    .tp_dealloc = (destructor)dealloc,
    .tp_methods = methods,
    .tp_as_sequence = &sequence,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_word_pieces", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_native_word_pieces(void) {
    if (PyType_Ready(&PieceTableType) < 0 || PyType_Ready(&PartialType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "PieceTable", (PyObject *)&PieceTableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
