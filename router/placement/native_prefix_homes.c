/* ``PrefixHomesPy`` in C: block hash -> id of the worker the last request holding that prefix was placed on,
   bounded, the least recently recorded dropped first.

   ``prefix_homes.py`` holds the reference (``PrefixHomesPy``, an OrderedDict) and says what the map is for; the
   type here, ``PrefixHomes``, has the same methods and answers, and keeps and drops the same hashes in the same
   order. Its tests (``tests/router/test_prefix_homes.py``) run random record / home sequences through both.

   Why: the reference moves up to a million boxed ints through an OrderedDict on every placement. Here a hash is an
   entry of a flat array (hash, worker id, LRU links), found through an open-addressing table of entry numbers
   (linear probing, backward-shift deletion); the LRU order is a list threaded through the entries.

   Hashes are signed 64-bit integers (the router's page hashes are): ``record`` raises OverflowError for one
   outside that range, before changing anything; ``home`` finds no home for it. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "packed_hashes.h"

#define NONE (-1)

typedef struct {
    int64_t key;
    PyObject *worker; /* the worker id (a new reference); NULL: a free entry */
    int32_t prev, next; /* LRU neighbours (older, younger); ``next`` links the free entries */
} Home;

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    Home *entries;
    int32_t n_entries;
    int32_t free_head;
    int32_t used;
    int32_t *slots; /* entry number per slot, NONE if empty */
    uint64_t mask;
    int32_t oldest, youngest;
} PrefixHomes;

static inline uint64_t mix(int64_t key) {
    uint64_t z = (uint64_t)key + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline int64_t find_slot(PrefixHomes *m, int64_t key) {
    uint64_t i = mix(key) & m->mask;
    for (;;) {
        int32_t e = m->slots[i];
        if (e == NONE)
            return NONE;
        if (m->entries[e].key == key)
            return (int64_t)i;
        i = (i + 1) & m->mask;
    }
}

static int grow_slots(PrefixHomes *m) {
    uint64_t old_n = m->mask + 1, n = old_n * 2;
    int32_t *old = m->slots, *slots = PyMem_Malloc(n * sizeof(int32_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < n; i++)
        slots[i] = NONE;
    for (uint64_t i = 0; i < old_n; i++) {
        if (old[i] == NONE)
            continue;
        uint64_t j = mix(m->entries[old[i]].key) & (n - 1);
        while (slots[j] != NONE)
            j = (j + 1) & (n - 1);
        slots[j] = old[i];
    }
    PyMem_Free(old);
    m->slots = slots;
    m->mask = n - 1;
    return 0;
}

static int grow_entries(PrefixHomes *m) {
    if (m->n_entries > INT32_MAX / 2) {
        PyErr_SetString(PyExc_MemoryError, "PrefixHomes: too many hashes");
        return -1;
    }
    int32_t n = m->n_entries * 2;
    Home *entries = PyMem_Realloc(m->entries, (size_t)n * sizeof(Home));
    if (entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int32_t i = m->n_entries; i < n; i++) {
        entries[i].worker = NULL;
        entries[i].next = i + 1 < n ? i + 1 : m->free_head;
    }
    m->free_head = m->n_entries;
    m->entries = entries;
    m->n_entries = n;
    return 0;
}

static inline void lru_push(PrefixHomes *m, int32_t e) {
    Home *x = &m->entries[e];
    x->prev = m->youngest;
    x->next = NONE;
    if (m->youngest != NONE)
        m->entries[m->youngest].next = e;
    else
        m->oldest = e;
    m->youngest = e;
}

static inline void lru_unlink(PrefixHomes *m, int32_t e) {
    Home *x = &m->entries[e];
    if (x->prev != NONE)
        m->entries[x->prev].next = x->next;
    else
        m->oldest = x->next;
    if (x->next != NONE)
        m->entries[x->next].prev = x->prev;
    else
        m->youngest = x->prev;
}

/* Take the entry in slot ``i`` out of the table (backward-shift deletion) and free it; the caller has unlinked
   it from the LRU list. */
static void delete_slot(PrefixHomes *m, uint64_t i) {
    int32_t e = m->slots[i];
    m->slots[i] = NONE;
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        int32_t f = m->slots[j];
        if (f == NONE)
            break;
        uint64_t home = mix(m->entries[f].key) & m->mask;
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            m->slots[i] = f;
            m->slots[j] = NONE;
            i = j;
        }
    }
    Py_CLEAR(m->entries[e].worker);
    m->entries[e].next = m->free_head;
    m->free_head = e;
    m->used--;
}

/* The positions ``sampled_positions(n)`` gives, deepest first: n - 1, then 2^k - 1 below it down to 0. */
static int positions(Py_ssize_t n, Py_ssize_t *out) {
    if (n <= 0)
        return 0;
    int k = 0;
    out[k++] = n - 1;
    Py_ssize_t p = 1;
    while (p * 2 - 1 < n - 1)
        p *= 2;
    for (; p >= 1; p /= 2)
        if (p - 1 < n - 1)
            out[k++] = p - 1;
    return k;
}

static int key_of(PyObject *h, int64_t *key) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(h, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *key = (int64_t)v;
    return overflow ? 0 : 1;
}

/* The keys at ``at[0..k)`` of ``keys`` (packed hashes, ``packed_view``, or a sequence of ints) into ``out``, ``ok[j]``
   0 for an int outside the key range (-1: not an int, an error set). The number of positions (``positions`` of
   its length) or -1 with an error set. */
static int sampled_keys(PyObject *keys, int64_t *out, int *ok) {
    Py_ssize_t at[80];
    Py_buffer view;
    int packed = packed_view(keys, &view);
    if (packed < 0)
        return -1;
    if (packed) {
        int k = positions(view.len / 8, at);
        for (int j = 0; j < k; j++) {
            out[j] = packed_at(&view, at[j]);
            ok[j] = 1;
        }
        PyBuffer_Release(&view);
        return k;
    }
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL)
        return -1;
    int k = positions(PySequence_Fast_GET_SIZE(seq), at);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (int j = 0; j < k; j++) {
        ok[j] = key_of(items[at[j]], &out[j]);
        if (ok[j] < 0) {
            k = j + 1; /* (``home`` stops at the first error, ``record`` too) */
            break;
        }
    }
    Py_DECREF(seq);
    return k;
}

/* record(keys, worker_id): a request with block hashes ``keys`` was placed on ``worker_id``. */
static PyObject *PH_record(PrefixHomes *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "record() takes 2 arguments");
        return NULL;
    }
    PyObject *worker = args[1];
    int64_t keys[80];
    int ok[80];
    int k = sampled_keys(args[0], keys, ok);
    if (k < 0)
        return NULL;
    for (int j = 0; j < k; j++) {
        if (ok[j] <= 0) {
            if (ok[j] == 0)
                PyErr_SetString(PyExc_OverflowError, "block hash outside the signed 64-bit range");
            return NULL;
        }
    }
    for (int j = 0; j < k; j++) {
        int64_t s = find_slot(m, keys[j]);
        if (s != NONE) {
            int32_t e = m->slots[s];
            Py_SETREF(m->entries[e].worker, Py_NewRef(worker));
            lru_unlink(m, e);
            lru_push(m, e);
            continue;
        }
        if ((uint64_t)(m->used + 1) * 2 > m->mask + 1 && grow_slots(m) < 0)
            return NULL;
        if (m->free_head == NONE && grow_entries(m) < 0)
            return NULL;
        int32_t e = m->free_head;
        Home *x = &m->entries[e];
        m->free_head = x->next;
        x->key = keys[j];
        x->worker = Py_NewRef(worker);
        uint64_t i = mix(keys[j]) & m->mask;
        while (m->slots[i] != NONE)
            i = (i + 1) & m->mask;
        m->slots[i] = e;
        m->used++;
        lru_push(m, e);
    }
    while (m->used > m->capacity) {
        int32_t e = m->oldest;
        lru_unlink(m, e);
        delete_slot(m, (uint64_t)find_slot(m, m->entries[e].key));
    }
    Py_RETURN_NONE;
}

/* home(keys): the worker the longest recorded prefix of ``keys`` was last placed on, or None. */
static PyObject *PH_home(PrefixHomes *m, PyObject *keys) {
    int64_t key[80];
    int ok[80];
    int k = sampled_keys(keys, key, ok);
    if (k < 0)
        return NULL;
    for (int j = 0; j < k; j++) {
        if (ok[j] < 0)
            return NULL;
        int64_t s = ok[j] ? find_slot(m, key[j]) : NONE;
        if (s != NONE) {
            PyErr_Clear(); /* (a later position's error is never reached: the answer is found first) */
            return Py_NewRef(m->entries[m->slots[s]].worker);
        }
    }
    Py_RETURN_NONE;
}

/* items() -> [(hash, worker id)], least recently recorded first. */
static PyObject *PH_items(PrefixHomes *m, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(0);
    for (int32_t e = m->oldest; e != NONE && out != NULL; e = m->entries[e].next) {
        PyObject *pair = Py_BuildValue("(LO)", (long long)m->entries[e].key, m->entries[e].worker);
        if (pair == NULL || PyList_Append(out, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    return out;
}

static Py_ssize_t PH_len(PrefixHomes *m) { return m->used; }

static void clear_all(PrefixHomes *m) {
    if (m->entries != NULL)
        for (int32_t e = 0; e < m->n_entries; e++)
            Py_CLEAR(m->entries[e].worker);
    PyMem_Free(m->entries);
    PyMem_Free(m->slots);
    m->entries = NULL;
    m->slots = NULL;
}

static int PH_init(PrefixHomes *m, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"capacity", NULL};
    Py_ssize_t capacity = (Py_ssize_t)1 << 20;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:PrefixHomes", kwlist, &capacity))
        return -1;
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "capacity must be >= 1, got %zd", capacity);
        return -1;
    }
    if (capacity > INT32_MAX / 4) {
        PyErr_Format(PyExc_ValueError, "capacity must be at most %d, got %zd", INT32_MAX / 4, capacity);
        return -1;
    }
    clear_all(m);
    m->capacity = capacity;
    m->n_entries = 256;
    m->entries = PyMem_Malloc(256 * sizeof(Home));
    m->slots = PyMem_Malloc(512 * sizeof(int32_t));
    if (m->entries == NULL || m->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int32_t i = 0; i < 256; i++) {
        m->entries[i].worker = NULL;
        m->entries[i].next = i + 1 < 256 ? i + 1 : NONE;
    }
    for (int i = 0; i < 512; i++)
        m->slots[i] = NONE;
    m->mask = 511;
    m->free_head = 0;
    m->used = 0;
    m->oldest = m->youngest = NONE;
    return 0;
}

static void PH_dealloc(PrefixHomes *m) {
    clear_all(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *PH_get_capacity(PrefixHomes *m, void *Py_UNUSED(closure)) { return PyLong_FromSsize_t(m->capacity); }

static PyMethodDef PH_methods[] = {
    {"record", (PyCFunction)(void (*)(void))PH_record, METH_FASTCALL,
     "A request with block hashes ``keys`` was placed on ``worker_id``."},
    {"home", (PyCFunction)PH_home, METH_O,
     "The worker the longest recorded prefix of ``keys`` was last placed on, or None."},
    {"items", (PyCFunction)PH_items, METH_NOARGS, "[(hash, worker id)], least recently recorded first."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PH_getset[] = {
    {"capacity", (getter)PH_get_capacity, NULL, "hashes the map keeps", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods PH_as_sequence = {.sq_length = (lenfunc)PH_len};

static PyTypeObject PrefixHomesType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_moe.router.placement.native_prefix_homes.PrefixHomes",
    .tp_doc = "PrefixHomesPy in C (reference: sgl_moe.router.placement.prefix_homes.PrefixHomesPy).",
    .tp_basicsize = sizeof(PrefixHomes),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PH_init,
    .tp_dealloc = (destructor)PH_dealloc,
    .tp_methods = PH_methods,
    .tp_getset = PH_getset,
    .tp_as_sequence = &PH_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "native_prefix_homes",
    "The router's prefix homes in C (reference: sgl_moe.router.placement.prefix_homes.PrefixHomesPy).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_native_prefix_homes(void) {
    if (PyType_Ready(&PrefixHomesType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod == NULL)
        return NULL;
    if (PyModule_AddObjectRef(mod, "PrefixHomes", (PyObject *)&PrefixHomesType) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
