/* ``Bpe`` in C: the ids of new word pieces from a sentencepiece-style BPE model (no pre-tokenizer), without the
   tokenizers library's call, its ``Token`` objects and their offsets.

   ``router_tokenizer.bpe_encoder`` builds it from a tokenizer's ``tokenizer.json`` and uses it only after
   its ids agree with the library's on the probe pieces; its tests (``tests/router/test_native_bpe.py``) compare
   the two on random and adversarial pieces. What it does is what the library's ``BPE`` model does for one word
   (``tokenizers/src/models/bpe``: ``merge_word`` then ``Word::merge_all``, without dropout):

   - each character (after the normalizer's single-character replacements) is its vocabulary id; a character
     without one is, with byte fallback, the ids of its UTF-8 bytes' ``<0xXX>`` tokens (when all exist), else the
     unknown token's id, consecutive unknown characters fused into one when ``fuse_unk`` (an unknown character
     still waiting is not added before byte-fallback ids, as there);
   - then, while two neighbouring symbols form a merge, the merge of lowest rank is applied, the leftmost first
     among equal ranks. A pair listed twice takes the later rank, as the library's map does.

   This runs that loop as it reads (a scan of the neighbours per merge), so a piece of more than MAX_SYMBOLS
   symbols is declined (None in its place: the caller asks the library, whose loop keeps a heap).

   Bpe(char_ids: dict[int, int], byte_ids: list[int] | None, unk_id: int, fuse_unk: bool,
       merges: list[tuple[int, int, int]], replacements: list[tuple[int, int]])
       char_ids: code point -> id of the single-character tokens; byte_ids: 256 ids (-1 where none), None without
       byte fallback; unk_id: -1 for none; merges: (left id, right id, merged id) in rank order; replacements:
       (code point, code point) applied to every character first.
   encode(pieces: list[str]) -> list[list[int] | None] */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_SYMBOLS 256
#define MAX_REPLACEMENTS 8

typedef struct {
    uint64_t key; /* left << 32 | right; UINT64_MAX marks an empty slot */
    uint32_t rank, merged;
} Pair;

typedef struct {
    uint32_t key; /* a code point + 1; 0 marks an empty slot */
    uint32_t id;
} Char;

typedef struct {
    PyObject_HEAD
    Pair *pairs;
    size_t pairs_mask;
    Char *chars;
    size_t chars_mask;
    int32_t byte_ids[256];
    int byte_fallback, fuse_unk;
    int64_t unk_id;
    uint32_t from[MAX_REPLACEMENTS], to[MAX_REPLACEMENTS];
    int replacements;
    PyObject **id_objs; /* id -> its int object */
    size_t id_objs_len;
} Bpe;

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 31;
    h *= 0x7fb5d329728ea185ULL;
    h ^= h >> 27;
    h *= 0x81dadef4bc2dd44dULL;
    return h ^ (h >> 33);
}

static size_t table_size(size_t n) {
    size_t size = 16;
    while (size < 2 * n)
        size *= 2;
    return size;
}

static Pair *pair_slot(const Bpe *b, uint64_t key) { /* the slot holding key, or the empty one it would take */
    size_t at = (size_t)mix(key) & b->pairs_mask;
    while (b->pairs[at].key != UINT64_MAX && b->pairs[at].key != key)
        at = (at + 1) & b->pairs_mask;
    return &b->pairs[at];
}

static Char *char_slot(const Bpe *b, uint32_t key) {
    size_t at = (size_t)mix(key) & b->chars_mask;
    while (b->chars[at].key != 0 && b->chars[at].key != key)
        at = (at + 1) & b->chars_mask;
    return &b->chars[at];
}

static int read_u32(PyObject *o, uint32_t *out, const char *what) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v > (long long)UINT32_MAX - 1) {
        PyErr_Format(PyExc_ValueError, "%s out of range: %lld", what, v);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static void note_id(uint32_t id, uint32_t *max_id) {
    if (id > *max_id)
        *max_id = id;
}

static int init(Bpe *b, PyObject *args, PyObject *kwds) {
    static char *names[] = {"char_ids", "byte_ids", "unk_id", "fuse_unk", "merges", "replacements", NULL};
    PyObject *char_ids, *byte_ids, *merges, *replacements;
    long long unk_id;
    int fuse_unk;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OLpO!O!", names, &PyDict_Type, &char_ids, &byte_ids, &unk_id,
                                     &fuse_unk, &PyList_Type, &merges, &PyList_Type, &replacements))
        return -1;
    if (b->pairs != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Bpe is built once");
        return -1;
    }
    uint32_t max_id = 0;
    b->unk_id = unk_id < 0 ? -1 : unk_id;
    if (b->unk_id > (int64_t)UINT32_MAX - 1) {
        PyErr_SetString(PyExc_ValueError, "unk_id out of range");
        return -1;
    }
    if (b->unk_id >= 0)
        note_id((uint32_t)b->unk_id, &max_id);
    b->fuse_unk = fuse_unk;
    b->byte_fallback = byte_ids != Py_None;
    for (int i = 0; i < 256; i++)
        b->byte_ids[i] = -1;
    if (b->byte_fallback) {
        if (!PyList_Check(byte_ids) || PyList_GET_SIZE(byte_ids) != 256) {
            PyErr_SetString(PyExc_TypeError, "byte_ids: a list of 256 ids (-1 where none) or None");
            return -1;
        }
        for (int i = 0; i < 256; i++) {
            long long v = PyLong_AsLongLong(PyList_GET_ITEM(byte_ids, i));
            if (v == -1 && PyErr_Occurred())
                return -1;
            if (v > (long long)INT32_MAX) {
                PyErr_SetString(PyExc_ValueError, "byte id out of range");
                return -1;
            }
            b->byte_ids[i] = v < 0 ? -1 : (int32_t)v;
            if (v >= 0)
                note_id((uint32_t)v, &max_id);
        }
    }
    Py_ssize_t nrep = PyList_GET_SIZE(replacements);
    if (nrep > MAX_REPLACEMENTS) {
        PyErr_SetString(PyExc_ValueError, "too many replacements");
        return -1;
    }
    for (Py_ssize_t i = 0; i < nrep; i++) {
        PyObject *item = PyList_GET_ITEM(replacements, i);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError, "replacements: (code point, code point) tuples");
            return -1;
        }
        if (read_u32(PyTuple_GET_ITEM(item, 0), &b->from[i], "code point") < 0 ||
            read_u32(PyTuple_GET_ITEM(item, 1), &b->to[i], "code point") < 0)
            return -1;
    }
    b->replacements = (int)nrep;

    Py_ssize_t nchars = PyDict_Size(char_ids);
    size_t csize = table_size((size_t)nchars);
    b->chars = PyMem_Calloc(csize, sizeof(Char));
    if (b->chars == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->chars_mask = csize - 1;
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(char_ids, &pos, &k, &v)) {
        uint32_t cp, id;
        if (read_u32(k, &cp, "code point") < 0 || read_u32(v, &id, "id") < 0)
            return -1;
        Char *c = char_slot(b, cp + 1);
        c->key = cp + 1;
        c->id = id;
        note_id(id, &max_id);
    }

    Py_ssize_t nmerges = PyList_GET_SIZE(merges);
    size_t psize = table_size((size_t)nmerges);
    b->pairs = PyMem_Malloc(psize * sizeof(Pair));
    if (b->pairs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(b->pairs, 0xff, psize * sizeof(Pair));
    b->pairs_mask = psize - 1;
    for (Py_ssize_t rank = 0; rank < nmerges; rank++) {
        PyObject *item = PyList_GET_ITEM(merges, rank);
        uint32_t left, right, merged;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "merges: (left id, right id, merged id) tuples");
            return -1;
        }
        if (read_u32(PyTuple_GET_ITEM(item, 0), &left, "id") < 0 ||
            read_u32(PyTuple_GET_ITEM(item, 1), &right, "id") < 0 ||
            read_u32(PyTuple_GET_ITEM(item, 2), &merged, "id") < 0)
            return -1;
        Pair *p = pair_slot(b, (uint64_t)left << 32 | right);
        p->key = (uint64_t)left << 32 | right;
        p->rank = (uint32_t)rank; /* a pair listed again: the later rank, as the library's map keeps it */
        p->merged = merged;
        note_id(merged, &max_id);
    }

    b->id_objs_len = (size_t)max_id + 1;
    b->id_objs = PyMem_Calloc(b->id_objs_len, sizeof(PyObject *));
    if (b->id_objs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *id_object(Bpe *b, uint32_t id) {
    if (id >= b->id_objs_len)
        return PyLong_FromUnsignedLong(id);
    if (b->id_objs[id] == NULL && (b->id_objs[id] = PyLong_FromUnsignedLong(id)) == NULL)
        return NULL;
    return Py_NewRef(b->id_objs[id]);
}

static inline uint32_t normalized(const Bpe *b, uint32_t cp) {
    for (int i = 0; i < b->replacements; i++)
        if (cp == b->from[i])
            return b->to[i];
    return cp;
}

static int utf8(uint32_t cp, unsigned char *out) { /* bytes written; 0 for a surrogate (no UTF-8 form) */
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF)
        return 0;
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The symbols of one piece before merging; -1 when there are more than MAX_SYMBOLS (declined), -2 for a surrogate
   (raised: the library cannot read it either). */
static int symbols_of(const Bpe *b, PyObject *piece, uint32_t *out) {
    int kind = PyUnicode_KIND(piece);
    const void *data = PyUnicode_DATA(piece);
    Py_ssize_t n = PyUnicode_GET_LENGTH(piece);
    int count = 0, unk_waiting = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t cp = normalized(b, PyUnicode_READ(kind, data, i));
        Char *c = char_slot(b, cp + 1);
        if (c->key != 0) {
            if (count + unk_waiting + 1 > MAX_SYMBOLS)
                return -1;
            if (unk_waiting) {
                out[count++] = (uint32_t)b->unk_id;
                unk_waiting = 0;
            }
            out[count++] = c->id;
            continue;
        }
        unsigned char bytes[4];
        int nb = utf8(cp, bytes);
        if (nb == 0) {
            if (PyUnicode_AsUTF8AndSize(piece, NULL) == NULL) /* raises what the library's encode does */
                return -2;
            PyErr_SetString(PyExc_ValueError, "a surrogate in a piece UTF-8 can hold");
            return -2;
        }
        if (b->byte_fallback) {
            int all = 1;
            for (int j = 0; j < nb; j++)
                all &= b->byte_ids[bytes[j]] >= 0;
            if (all) {
                if (count + nb + unk_waiting > MAX_SYMBOLS)
                    return -1;
                for (int j = 0; j < nb; j++)
                    out[count++] = (uint32_t)b->byte_ids[bytes[j]];
                continue;
            }
        }
        if (b->unk_id < 0)
            continue; /* no unknown token: the character gives nothing, as in the library */
        if (unk_waiting && !b->fuse_unk) {
            if (count + 1 > MAX_SYMBOLS)
                return -1;
            out[count++] = (uint32_t)b->unk_id;
        }
        unk_waiting = 1;
    }
    if (unk_waiting) {
        if (count + 1 > MAX_SYMBOLS)
            return -1;
        out[count++] = (uint32_t)b->unk_id;
    }
    return count;
}

static int merge_all(const Bpe *b, uint32_t *sym, int n) {
    while (n > 1) {
        uint32_t best_rank = UINT32_MAX, best_merged = 0;
        int best = -1;
        for (int i = 0; i + 1 < n; i++) {
            uint64_t key = (uint64_t)sym[i] << 32 | sym[i + 1];
            const Pair *p = pair_slot(b, key);
            if (p->key == key && p->rank < best_rank) {
                best_rank = p->rank;
                best_merged = p->merged;
                best = i;
            }
        }
        if (best < 0)
            break;
        sym[best] = best_merged;
        memmove(&sym[best + 1], &sym[best + 2], (size_t)(n - best - 2) * sizeof(uint32_t));
        n--;
    }
    return n;
}

static PyObject *encode(Bpe *b, PyObject *pieces) {
    if (!PyList_Check(pieces)) {
        PyErr_SetString(PyExc_TypeError, "encode(pieces: list[str])");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(pieces);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    uint32_t sym[MAX_SYMBOLS];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *piece = PyList_GET_ITEM(pieces, i);
        if (!PyUnicode_Check(piece)) {
            PyErr_SetString(PyExc_TypeError, "encode(pieces: list[str])");
            Py_DECREF(out);
            return NULL;
        }
        int count = symbols_of(b, piece, sym);
        if (count == -2) {
            Py_DECREF(out);
            return NULL;
        }
        if (count < 0) {
            PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
            continue;
        }
        count = merge_all(b, sym, count);
        PyObject *ids = PyList_New(count);
        if (ids == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        for (int j = 0; j < count; j++) {
            PyObject *o = id_object(b, sym[j]);
            if (o == NULL) {
                Py_DECREF(ids);
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(ids, j, o);
        }
        PyList_SET_ITEM(out, i, ids);
    }
    return out;
}

static void dealloc(Bpe *b) {
    if (b->id_objs != NULL)
        for (size_t i = 0; i < b->id_objs_len; i++)
            Py_XDECREF(b->id_objs[i]);
    PyMem_Free(b->id_objs);
    PyMem_Free(b->pairs);
    PyMem_Free(b->chars);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyMethodDef methods[] = {
    {"encode", (PyCFunction)encode, METH_O, "encode(pieces) -> the ids of each piece, None where declined"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BpeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_moe.router.request.native_bpe.Bpe",
    .tp_basicsize = sizeof(Bpe),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A sentencepiece-style BPE model's ids of word pieces; see the module.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)init,
    .tp_dealloc = (destructor)dealloc,
    .tp_methods = methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_bpe", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_native_bpe(void) {
    if (PyType_Ready(&BpeType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Bpe", (PyObject *)&BpeType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
