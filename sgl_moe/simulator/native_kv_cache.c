/* ``KVCacheModel`` in C: one simulated worker's radix cache of pages, with lock counts and LRU eviction.

   ``kv_cache.py`` holds the reference (``KVCacheModel``, the same methods in Python) and says what the model is;
   the type here, ``KVPages``, has the same methods, attributes and answers. Its tests
   (``tests/simulator/test_native_kv_cache.py``) run random operation sequences through both and compare every
   answer, every event list and the eviction order.

   Why: the Python model keeps a dict of lock counts and an OrderedDict for the LRU order, so every page of every
   request costs a few dictionary steps on boxed ints; at a million requests those tables no longer fit in the
   caches. Here a page is an entry of a flat array (hash, lock count, LRU links), found through an open-addressing
   table of entry numbers (linear probing, backward-shift deletion), and the LRU order is a list threaded through
   the entries.

   Page hashes are signed 64-bit integers (SGLang's and the simulator's are); a hash outside that range raises
   OverflowError. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#define NONE (-1)

typedef struct {
    int64_t key;
    Py_ssize_t locks;   /* running requests holding the page (0: in the LRU list) */
    int32_t prev, next; /* LRU neighbours (older, younger); ``next`` links the free entries */
    char in_lru;
} Entry;

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    Py_ssize_t reserved;
    Py_ssize_t evicted;
    PyObject *stored;  /* list: hashes that entered the tree since the last ``take_events`` */
    PyObject *removed; /* list: hashes evicted since then */
    Entry *entries;
    int32_t n_entries; /* entries allocated */
    int32_t free_head; /* first free entry, NONE if none */
    int32_t used;      /* pages in the tree */
    int32_t *slots;    /* entry number per slot, NONE if empty */
    uint64_t mask;     /* slots - 1 (slots is a power of two) */
    int32_t oldest, youngest;
    Py_ssize_t lru_len;
} KVPages;

static inline uint64_t mix(int64_t key) {
    uint64_t z = (uint64_t)key + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The slot holding ``key``, or NONE. */
static inline int64_t find_slot(KVPages *c, int64_t key) {
    uint64_t i = mix(key) & c->mask;
    for (;;) {
        int32_t e = c->slots[i];
        if (e == NONE)
            return NONE;
        if (c->entries[e].key == key)
            return (int64_t)i;
        i = (i + 1) & c->mask;
    }
}

static inline int32_t find(KVPages *c, int64_t key) {
    int64_t s = find_slot(c, key);
    return s == NONE ? NONE : c->slots[s];
}

static int grow_slots(KVPages *c) {
    uint64_t old_n = c->mask + 1, n = old_n * 2;
    int32_t *old = c->slots;
    int32_t *slots = PyMem_Malloc(n * sizeof(int32_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < n; i++)
        slots[i] = NONE;
    c->slots = slots;
    c->mask = n - 1;
    for (uint64_t i = 0; i < old_n; i++) {
        int32_t e = old[i];
        if (e == NONE)
            continue;
        uint64_t j = mix(c->entries[e].key) & c->mask;
        while (slots[j] != NONE)
            j = (j + 1) & c->mask;
        slots[j] = e;
    }
    PyMem_Free(old);
    return 0;
}

static int grow_entries(KVPages *c) {
    if (c->n_entries > INT32_MAX / 2) {
        PyErr_SetString(PyExc_MemoryError, "KVPages: too many pages");
        return -1;
    }
    int32_t n = c->n_entries * 2;
    Entry *entries = PyMem_Realloc(c->entries, (size_t)n * sizeof(Entry));
    if (entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int32_t i = c->n_entries; i < n; i++)
        entries[i].next = i + 1 < n ? i + 1 : c->free_head;
    c->free_head = c->n_entries;
    c->entries = entries;
    c->n_entries = n;
    return 0;
}

/* A new entry for ``key`` (not in the table), locked once, in the table; its number, or NONE with an error set. */
static int32_t add(KVPages *c, int64_t key) {
    if ((uint64_t)(c->used + 1) * 2 > c->mask + 1 && grow_slots(c) < 0)
        return NONE;
    if (c->free_head == NONE && grow_entries(c) < 0)
        return NONE;
    int32_t e = c->free_head;
    Entry *x = &c->entries[e];
    c->free_head = x->next;
    x->key = key;
    x->locks = 1;
    x->prev = x->next = NONE;
    x->in_lru = 0;
    uint64_t i = mix(key) & c->mask;
    while (c->slots[i] != NONE)
        i = (i + 1) & c->mask;
    c->slots[i] = e;
    c->used++;
    return e;
}

/* Take the entry in slot ``i`` out of the table (backward-shift deletion) and free it. */
static void delete_slot(KVPages *c, uint64_t i) {
    int32_t e = c->slots[i];
    c->slots[i] = NONE;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & c->mask;
        int32_t f = c->slots[j];
        if (f == NONE)
            break;
        uint64_t home = mix(c->entries[f].key) & c->mask;
        /* ``f`` may move back to ``i`` unless its home lies cyclically in (i, j]. */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            c->slots[i] = f;
            c->slots[j] = NONE;
            i = j;
        }
    }
    c->entries[e].next = c->free_head;
    c->free_head = e;
    c->used--;
}

static inline void lru_push(KVPages *c, int32_t e) {
    Entry *x = &c->entries[e];
    x->prev = c->youngest;
    x->next = NONE;
    if (c->youngest != NONE)
        c->entries[c->youngest].next = e;
    else
        c->oldest = e;
    c->youngest = e;
    x->in_lru = 1;
    c->lru_len++;
}

static inline void lru_unlink(KVPages *c, int32_t e) {
    Entry *x = &c->entries[e];
    if (x->prev != NONE)
        c->entries[x->prev].next = x->next;
    else
        c->oldest = x->next;
    if (x->next != NONE)
        c->entries[x->next].prev = x->prev;
    else
        c->youngest = x->prev;
    x->prev = x->next = NONE;
    x->in_lru = 0;
    c->lru_len--;
}

static int key_of(PyObject *h, int64_t *key) {
    long long v = PyLong_AsLongLong(h);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *key = (int64_t)v;
    return 0;
}

static void key_error(PyObject *h) { PyErr_SetObject(PyExc_KeyError, h); }

/* One more lock on entry ``e`` (of hash object ``h``), out of the LRU list when it was unlocked. */
static inline int lock_entry(KVPages *c, int32_t e, PyObject *h) {
    Entry *x = &c->entries[e];
    if (!x->locks) {
        if (!x->in_lru) {
            key_error(h);
            return -1;
        }
        lru_unlink(c, e);
    }
    x->locks++;
    return 0;
}

/* One lock fewer on the page ``h`` (in the tree), into the LRU list when none is left. */
static inline int unlock_one(KVPages *c, PyObject *h) {
    int64_t key;
    if (key_of(h, &key) < 0)
        return -1;
    int32_t e = find(c, key);
    if (e == NONE) {
        key_error(h);
        return -1;
    }
    Entry *x = &c->entries[e];
    if (--x->locks == 0 && !x->in_lru) /* (an OrderedDict assignment does not move a key already there) */
        lru_push(c, e);
    return 0;
}

static int insert_range(KVPages *c, PyObject **items, Py_ssize_t start, Py_ssize_t end, Py_ssize_t *new_out) {
    Py_ssize_t new = 0;
    for (Py_ssize_t k = start; k < end; k++) {
        PyObject *h = items[k];
        int64_t key;
        if (key_of(h, &key) < 0)
            return -1;
        int32_t e = find(c, key);
        if (e == NONE) {
            if (add(c, key) == NONE || PyList_Append(c->stored, h) < 0)
                return -1;
            new++;
        } else if (lock_entry(c, e, h) < 0) {
            return -1;
        }
    }
    *new_out = new;
    return 0;
}

/* -- the type --------------------------------------------------------------------------------------------------- */

static int KVPages_init(KVPages *c, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"capacity_pages", NULL};
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &capacity))
        return -1;
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity must be at least one page, got %zd", capacity);
        return -1;
    }
    if (c->entries != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "KVPages is initialised once");
        return -1;
    }
    c->capacity = capacity;
    c->reserved = c->evicted = 0;
    c->stored = PyList_New(0);
    c->removed = PyList_New(0);
    c->n_entries = 64;
    c->entries = PyMem_Malloc(64 * sizeof(Entry));
    c->slots = PyMem_Malloc(128 * sizeof(int32_t));
    if (c->stored == NULL || c->removed == NULL || c->entries == NULL || c->slots == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    for (int32_t i = 0; i < 64; i++)
        c->entries[i].next = i + 1 < 64 ? i + 1 : NONE;
    c->free_head = 0;
    for (int i = 0; i < 128; i++)
        c->slots[i] = NONE;
    c->mask = 127;
    c->used = 0;
    c->oldest = c->youngest = NONE;
    c->lru_len = 0;
    return 0;
}

static void KVPages_dealloc(KVPages *c) {
    Py_XDECREF(c->stored);
    Py_XDECREF(c->removed);
    PyMem_Free(c->entries);
    PyMem_Free(c->slots);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static Py_ssize_t KVPages_len(KVPages *c) { return c->used; }

#define FAST_OR_FAIL(seq, obj)                                           \
    PyObject *seq = PySequence_Fast(obj, "hashes must be a sequence"); \
    if (seq == NULL)                                                     \
        return NULL;

/* match(hashes) -> leading pages of ``hashes`` in the tree */
static PyObject *KVPages_match(KVPages *c, PyObject *hashes) {
    FAST_OR_FAIL(seq, hashes)
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), k = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (; k < n; k++) {
        int64_t key;
        if (key_of(items[k], &key) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (find(c, key) == NONE)
            break;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(k);
}

/* match_lock(hashes, limit) -> pages locked */
static PyObject *KVPages_match_lock(KVPages *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "match_lock(hashes, limit)");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    FAST_OR_FAIL(seq, args[0])
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), k = 0;
    if (limit < n)
        n = limit < 0 ? 0 : limit;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (; k < n; k++) {
        int64_t key;
        if (key_of(items[k], &key) < 0)
            goto fail;
        int32_t e = find(c, key);
        if (e == NONE)
            break;
        if (lock_entry(c, e, items[k]) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(k);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* lock(hashes): a running request holds these pages (all in the tree) */
static PyObject *KVPages_lock(KVPages *c, PyObject *hashes) {
    FAST_OR_FAIL(seq, hashes)
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t key;
        int32_t e;
        if (key_of(items[k], &key) < 0)
            goto fail;
        if ((e = find(c, key)) == NONE) {
            key_error(items[k]);
            goto fail;
        }
        if (lock_entry(c, e, items[k]) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

static int unlock_reversed(KVPages *c, PyObject **items, Py_ssize_t n) {
    for (Py_ssize_t k = n - 1; k >= 0; k--)
        if (unlock_one(c, items[k]) < 0)
            return -1;
    return 0;
}

/* unlock(hashes): deepest first, so parents end up youngest */
static PyObject *KVPages_unlock(KVPages *c, PyObject *hashes) {
    FAST_OR_FAIL(seq, hashes)
    int rc = unlock_reversed(c, PySequence_Fast_ITEMS(seq), PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* insert(hashes) -> how many were new */
static PyObject *KVPages_insert(KVPages *c, PyObject *hashes) {
    FAST_OR_FAIL(seq, hashes)
    Py_ssize_t new;
    int rc = insert_range(c, PySequence_Fast_ITEMS(seq), 0, PySequence_Fast_GET_SIZE(seq), &new);
    Py_DECREF(seq);
    if (rc < 0)
        return NULL;
    return PyLong_FromSsize_t(new);
}

/* finish(hashes, inserted, full): insert hashes[inserted:full], then unlock hashes[:full] */
static PyObject *KVPages_finish(KVPages *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "finish(hashes, inserted, full)");
        return NULL;
    }
    Py_ssize_t inserted = PyLong_AsSsize_t(args[1]);
    if (inserted == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t full = PyLong_AsSsize_t(args[2]);
    if (full == -1 && PyErr_Occurred())
        return NULL;
    FAST_OR_FAIL(seq, args[0])
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    /* Python's slice bounds: hashes[inserted:full] and hashes[:full] */
    Py_ssize_t a = inserted, b = full, a0 = 0, b0 = full;
    PySlice_AdjustIndices(n, &a, &b, 1);
    PySlice_AdjustIndices(n, &a0, &b0, 1);
    Py_ssize_t new;
    int rc = full > inserted ? insert_range(c, items, a, b, &new) : 0;
    if (rc == 0)
        rc = unlock_reversed(c, items, b0);
    Py_DECREF(seq);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* reserve(pages) -> room for ``pages`` more, evicting unlocked pages as needed; False if the locked ones fill it */
static PyObject *KVPages_reserve(KVPages *c, PyObject *arg) {
    Py_ssize_t pages = PyLong_AsSsize_t(arg);
    if (pages == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t short_ = pages - (c->capacity - c->used - c->reserved);
    if (short_ > 0) {
        if (short_ > c->lru_len)
            Py_RETURN_FALSE;
        for (Py_ssize_t k = 0; k < short_; k++) {
            int32_t e = c->oldest;
            int64_t key = c->entries[e].key;
            PyObject *h = PyLong_FromLongLong(key);
            if (h == NULL)
                return NULL;
            int rc = PyList_Append(c->removed, h);
            Py_DECREF(h);
            if (rc < 0)
                return NULL;
            lru_unlink(c, e);
            delete_slot(c, (uint64_t)find_slot(c, key));
        }
        c->evicted += short_;
    }
    c->reserved += pages;
    Py_RETURN_TRUE;
}

/* take_events() -> (removed, stored) since the last call */
static PyObject *KVPages_take_events(KVPages *c, PyObject *Py_UNUSED(ignored)) {
    PyObject *removed = PyList_New(0), *stored = PyList_New(0);
    if (removed == NULL || stored == NULL) {
        Py_XDECREF(removed);
        Py_XDECREF(stored);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, c->removed, c->stored);
    if (out == NULL) {
        Py_DECREF(removed);
        Py_DECREF(stored);
        return NULL;
    }
    Py_SETREF(c->removed, removed);
    Py_SETREF(c->stored, stored);
    return out;
}

static PyObject *KVPages_get_free(KVPages *c, void *Py_UNUSED(closure)) {
    return PyLong_FromSsize_t(c->capacity - c->used - c->reserved);
}

static PyMethodDef KVPages_methods[] = {
    {"match", (PyCFunction)KVPages_match, METH_O, "Leading pages of ``hashes`` in the tree."},
    {"match_lock", (PyCFunction)(void (*)(void))KVPages_match_lock, METH_FASTCALL,
     "``lock`` the leading pages of ``hashes`` in the tree, at most ``limit``; returns how many."},
    {"lock", (PyCFunction)KVPages_lock, METH_O, "A running request holds these pages (all in the tree)."},
    {"unlock", (PyCFunction)KVPages_unlock, METH_O, "Release pages, deepest first."},
    {"insert", (PyCFunction)KVPages_insert, METH_O,
     "Computed pages enter the tree locked by their request; returns how many were new."},
    {"finish", (PyCFunction)(void (*)(void))KVPages_finish, METH_FASTCALL,
     "``insert`` hashes[inserted:full], then ``unlock`` hashes[:full]."},
    {"reserve", (PyCFunction)KVPages_reserve, METH_O,
     "Room for ``pages`` more, evicting unlocked pages as needed; False if the locked ones fill it."},
    {"take_events", (PyCFunction)KVPages_take_events, METH_NOARGS, "``(removed, stored)`` since the last call."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef KVPages_members[] = {
    {"capacity", T_PYSSIZET, offsetof(KVPages, capacity), READONLY, "pages the cache holds"},
    {"reserved", T_PYSSIZET, offsetof(KVPages, reserved), 0, "pages reserved for tokens running requests compute"},
    {"evicted", T_PYSSIZET, offsetof(KVPages, evicted), READONLY, "pages evicted so far"},
    {"stored", T_OBJECT, offsetof(KVPages, stored), READONLY, "hashes stored since the last take_events"},
    {"removed", T_OBJECT, offsetof(KVPages, removed), READONLY, "hashes evicted since the last take_events"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef KVPages_getset[] = {
    {"free", (getter)KVPages_get_free, NULL, "pages neither in the tree nor reserved", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods KVPages_as_sequence = {.sq_length = (lenfunc)KVPages_len};

static PyTypeObject KVPagesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_moe.simulator.native_kv_cache.KVPages",
    .tp_doc = "KVCacheModel in C (reference: sgl_moe.simulator.kv_cache.KVCacheModel).",
    .tp_basicsize = sizeof(KVPages),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KVPages_init,
    .tp_dealloc = (destructor)KVPages_dealloc,
    .tp_methods = KVPages_methods,
    .tp_members = KVPages_members,
    .tp_getset = KVPages_getset,
    .tp_as_sequence = &KVPages_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "native_kv_cache",
    "The simulator's KV cache model in C (reference: sgl_moe.simulator.kv_cache.KVCacheModel).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_native_kv_cache(void) {
    if (PyType_Ready(&KVPagesType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "KVPages", (PyObject *)&KVPagesType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
