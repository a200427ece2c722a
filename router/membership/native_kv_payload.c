/* ``decode(payload)``: SGLang's KV-event batch payload (msgpack) in its common form, read in one pass in C.

   ``kv_events.decode_frames`` calls it first and decodes with msgspec whenever it answers None. It answers only
   for the form SGLang sends today (``[ts, [event, ...], attn_dp_rank]``, each event a map whose first key is the
   ``type`` tag, ``BlockStored``, ``BlockRemoved`` or ``AllBlocksCleared``), and only where every field it keeps
   has the type the typed msgspec decoder takes; anything else (the positional format, an unknown event type, a
   field of another type, a known field twice, bytes after the batch, a truncated payload) answers None, and the
   msgspec path decides. Its test (``tests/router/test_kv_payload.py``) compares both on SGLang's own batches,
   random ones and damaged ones.

   Why: a ``BlockStored`` event carries the token ids of its blocks (4,000 ints for a 4,000-token prompt), which
   the router never reads; msgspec skips them at ~7.5 ns an int (30 of the 39 us a 4,000-token batch took on the
   2-core VM). Here an int is skipped by its one type byte.

   Answer: ``(ts, events, attn_dp_rank)``, each event a tuple: ``(0, block_hashes, block_size, parent_block_hash,
   lora_id, medium, cache_salt, lora_name)`` for ``BlockStored`` (absent optional fields None), ``(1, block_hashes,
   medium)`` for ``BlockRemoved``, ``(2,)`` for ``AllBlocksCleared``; ``block_hashes`` packed (``hash_array``: a
   ``bytes`` of int64s), or a list of ints where one does not fit in 64 signed bits. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const uint8_t *p, *end;
} Reader;

/* Big-endian reads; the caller has checked the length. */
static inline uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static inline int need(Reader *r, size_t n) { return (size_t)(r->end - r->p) >= n; }

/* The whole size of a value by its first byte where that fixes it (ints, floats, nil, booleans, fixext), else 0.
   Set by the module's init. */
static uint8_t FIXED[256];

static void fill_fixed(void) {
    for (int b = 0; b < 256; b++) {
        uint8_t n = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
            n = 1;
        else if (b == 0xcc || b == 0xd0)
            n = 2;
        else if (b == 0xcd || b == 0xd1 || b == 0xd4)
            n = 3;
        else if (b == 0xd5)
            n = 4;
        else if (b == 0xca || b == 0xce || b == 0xd2)
            n = 5;
        else if (b == 0xd6)
            n = 6;
        else if (b == 0xcb || b == 0xcf || b == 0xd3)
            n = 9;
        else if (b == 0xd7)
            n = 10;
        else if (b == 0xd8)
            n = 18;
        FIXED[b] = n;
    }
}

/* Skip one whole value (nested arrays and maps included, without recursion); 0 when the payload ends first or
   holds the never-used byte 0xc1. A value of fixed size (a token id) costs one table lookup: a branch on each
   int's encoding (1, 3 or 5 bytes, mixed at random in a list of token ids) was mispredicted at ~6 ns an id. */
static int skip(Reader *r) {
    uint64_t left = 1; /* values still to skip */
    while (left) {
        if (!need(r, 1))
            return 0;
        uint8_t fixed = FIXED[*r->p];
        if (fixed) {
            if (!need(r, fixed))
                return 0;
            r->p += fixed;
            left--;
            continue;
        }
        uint8_t b = *r->p++;
        left--;
        uint64_t len = 0, items = 0;
        if ((b & 0xf0) == 0x80) {
            items = 2 * (uint64_t)(b & 0x0f);
        } else if ((b & 0xf0) == 0x90) {
            items = b & 0x0f;
        } else if ((b & 0xe0) == 0xa0) {
            len = b & 0x1f;
        } else {
            switch (b) {
            case 0xc4: case 0xd9:
                if (!need(r, 1)) return 0;
                len = be(r->p, 1); r->p += 1; break;
            case 0xc5: case 0xda:
                if (!need(r, 2)) return 0;
                len = be(r->p, 2); r->p += 2; break;
            case 0xc6: case 0xdb:
                if (!need(r, 4)) return 0;
                len = be(r->p, 4); r->p += 4; break;
            case 0xc7:
                if (!need(r, 1)) return 0;
                len = be(r->p, 1) + 1; r->p += 1; break;
            case 0xc8:
                if (!need(r, 2)) return 0;
                len = be(r->p, 2) + 1; r->p += 2; break;
            case 0xc9:
                if (!need(r, 4)) return 0;
                len = be(r->p, 4) + 1; r->p += 4; break;
            case 0xdc:
                if (!need(r, 2)) return 0;
                items = be(r->p, 2); r->p += 2; break;
            case 0xdd:
                if (!need(r, 4)) return 0;
                items = be(r->p, 4); r->p += 4; break;
            case 0xde:
                if (!need(r, 2)) return 0;
                items = 2 * be(r->p, 2); r->p += 2; break;
            case 0xdf:
                if (!need(r, 4)) return 0;
                items = 2 * be(r->p, 4); r->p += 4; break;
            default:
                return 0; /* 0xc1 */
            }
        }
        if (!need(r, len))
            return 0;
        r->p += len;
        left += items;
    }
    return 1;
}

/* The length of an array (``map`` 0) or map (``map`` 1) header; -1 when the next value is not one. */
static int64_t container(Reader *r, int map) {
    if (!need(r, 1))
        return -1;
    uint8_t b = *r->p;
    if ((b & 0xf0) == (map ? 0x80 : 0x90)) {
        r->p += 1;
        return b & 0x0f;
    }
    uint8_t b16 = map ? 0xde : 0xdc, b32 = map ? 0xdf : 0xdd;
    if (b == b16 && need(r, 3)) {
        r->p += 3;
        return (int64_t)be(r->p - 2, 2);
    }
    if (b == b32 && need(r, 5)) {
        r->p += 5;
        return (int64_t)be(r->p - 4, 4);
    }
    return -1;
}

/* A str value: its bytes and length; 0 when the next value is not a str. */
static int str(Reader *r, const char **s, Py_ssize_t *n) {
    if (!need(r, 1))
        return 0;
    uint8_t b = *r->p;
    uint64_t len;
    int head;
    if ((b & 0xe0) == 0xa0) {
        len = b & 0x1f;
        head = 1;
    } else if (b == 0xd9 && need(r, 2)) {
        len = be(r->p + 1, 1);
        head = 2;
    } else if (b == 0xda && need(r, 3)) {
        len = be(r->p + 1, 2);
        head = 3;
    } else if (b == 0xdb && need(r, 5)) {
        len = be(r->p + 1, 4);
        head = 5;
    } else {
        return 0;
    }
    if (!need(r, head + len))
        return 0;
    *s = (const char *)r->p + head;
    *n = (Py_ssize_t)len;
    r->p += head + len;
    return 1;
}

static inline int str_is(const char *s, Py_ssize_t n, const char *want) {
    return (size_t)n == strlen(want) && memcmp(s, want, (size_t)n) == 0;
}

/* The next value if it is an int: 1 with its value in ``*v``; 2 for an unsigned int past INT64_MAX (its bits in
   ``*v``); 0 when it is not an int or is cut short (the reader not moved). */
static int read_int(Reader *r, int64_t *v) {
    if (!need(r, 1))
        return 0;
    uint8_t b = *r->p;
    if (b <= 0x7f || b >= 0xe0) { /* a fixint, positive or negative */
        *v = (int8_t)b;
        r->p += 1;
        return 1;
    }
    int n;
    switch (b) {
    case 0xcc: case 0xd0: n = 1; break;
    case 0xcd: case 0xd1: n = 2; break;
    case 0xce: case 0xd2: n = 4; break;
    case 0xcf: case 0xd3: n = 8; break;
    default: return 0;
    }
    if (!need(r, 1 + (size_t)n))
        return 0;
    uint64_t u = be(r->p + 1, n);
    r->p += 1 + n;
    if (b >= 0xd0) { /* signed: sign-extend from n bytes */
        int shift = 64 - 8 * n;
        *v = (int64_t)(u << shift) >> shift;
        return 1;
    }
    *v = (int64_t)u;
    return u > (uint64_t)INT64_MAX ? 2 : 1;
}

/* An int value as a new Python int; NULL without an error set when the next value is not an int, NULL with an
   error set on no memory. */
static PyObject *integer(Reader *r) {
    int64_t v;
    int got = read_int(r, &v);
    if (got == 0)
        return NULL;
    return got == 2 ? PyLong_FromUnsignedLongLong((uint64_t)v) : PyLong_FromLongLong(v);
}

/* An int or nil (Py_None, new reference); NULL as ``integer``. */
static PyObject *optional_int(Reader *r) {
    if (need(r, 1) && *r->p == 0xc0) {
        r->p += 1;
        Py_RETURN_NONE;
    }
    return integer(r);
}

/* A str or nil as a new reference; NULL without an error for another type, NULL with one for bad UTF-8 (cleared by
   the caller's answer of None) or no memory. */
static PyObject *optional_str(Reader *r) {
    if (need(r, 1) && *r->p == 0xc0) {
        r->p += 1;
        Py_RETURN_NONE;
    }
    const char *s;
    Py_ssize_t n;
    if (!str(r, &s, &n))
        return NULL;
    return PyUnicode_DecodeUTF8(s, n, "strict");
}

/* An array of block hashes packed: a ``bytes`` of their signed 64-bit values in native order, which
   ``kv_events`` hands on as a ``memoryview`` of ``q``s and the C block tables read without an int object per hash.
   Where one does not fit (an unsigned value past 2^63 - 1), the list ``int_list`` makes, as before. NULL as
   ``integer``. */
static PyObject *int_list(Reader *r);

static PyObject *hash_array(Reader *r) {
    const uint8_t *at = r->p;
    int64_t n = container(r, 0);
    if (n < 0 || !need(r, (size_t)n)) /* each int takes at least one byte */
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n * 8);
    if (out == NULL)
        return NULL;
    int64_t *to = (int64_t *)PyBytes_AS_STRING(out);
    for (int64_t i = 0; i < n; i++)
        if (read_int(r, &to[i]) != 1) /* not an int (the list's reading says so), or past 64 signed bits */
            goto not_packed;
    return out;
not_packed:
    Py_DECREF(out);
    r->p = at;
    return int_list(r);
}

/* An array of ints as a new list; NULL as ``integer``. */
static PyObject *int_list(Reader *r) {
    int64_t n = container(r, 0);
    if (n < 0 || !need(r, (size_t)n)) /* each int takes at least one byte */
        return NULL;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *v = integer(r);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

enum { STORED, REMOVED, CLEARED };
enum { F_HASHES, F_SIZE, F_PARENT, F_LORA_ID, F_MEDIUM, F_SALT, F_LORA_NAME, N_FIELDS };
static const char *const FIELD_NAMES[N_FIELDS] = {"block_hashes", "block_size", "parent_block_hash", "lora_id",
                                                  "medium", "cache_salt", "lora_name"};

/* Which of ``kind``'s fields the router keeps ``name`` is; -1: skipped. */
static int field_of(int kind, const char *name, Py_ssize_t n) {
    for (int f = 0; f < N_FIELDS; f++) {
        if (!str_is(name, n, FIELD_NAMES[f]))
            continue;
        if (kind == STORED || (kind == REMOVED && (f == F_HASHES || f == F_MEDIUM)))
            return f;
        return -1;
    }
    return -1;
}

/* One event map as its answer tuple; NULL without an error when it is not in the common form. */
static PyObject *event(Reader *r) {
    int64_t keys = container(r, 1);
    const char *s;
    Py_ssize_t n;
    if (keys < 1 || !str(r, &s, &n) || !str_is(s, n, "type") || !str(r, &s, &n))
        return NULL;
    int kind;
    if (str_is(s, n, "BlockStored"))
        kind = STORED;
    else if (str_is(s, n, "BlockRemoved"))
        kind = REMOVED;
    else if (str_is(s, n, "AllBlocksCleared"))
        kind = CLEARED;
    else
        return NULL; /* an unknown type: msgspec's generic path keeps it */
    PyObject *got[N_FIELDS] = {NULL};
    PyObject *answer = NULL;
    for (int64_t k = 1; k < keys; k++) {
        if (!str(r, &s, &n))
            goto done;
        int f = field_of(kind, s, n);
        if (f < 0) {
            if (str_is(s, n, "type") || !skip(r))
                goto done; /* the tag twice, or a value cut short */
            continue;
        }
        if (got[f] != NULL)
            goto done; /* a field twice */
        if (f == F_HASHES)
            got[f] = hash_array(r);
        else if (f == F_SIZE)
            got[f] = integer(r);
        else if (f == F_PARENT || f == F_LORA_ID)
            got[f] = optional_int(r);
        else
            got[f] = optional_str(r);
        if (got[f] == NULL)
            goto done;
    }
    if (kind == STORED) {
        if (got[F_HASHES] == NULL || got[F_SIZE] == NULL)
            goto done; /* required fields */
        answer = PyTuple_New(8);
        if (answer == NULL)
            goto done;
        PyTuple_SET_ITEM(answer, 0, PyLong_FromLong(STORED));
        int at[7] = {F_HASHES, F_SIZE, F_PARENT, F_LORA_ID, F_MEDIUM, F_SALT, F_LORA_NAME};
        for (int i = 0; i < 7; i++) {
            PyObject *v = got[at[i]] ? got[at[i]] : Py_None;
            Py_INCREF(v);
            PyTuple_SET_ITEM(answer, i + 1, v);
        }
    } else if (kind == REMOVED) {
        if (got[F_HASHES] == NULL)
            goto done;
        PyObject *medium = got[F_MEDIUM] ? got[F_MEDIUM] : Py_None;
        answer = Py_BuildValue("(iOO)", REMOVED, got[F_HASHES], medium);
    } else {
        answer = Py_BuildValue("(i)", CLEARED);
    }
done:
    for (int f = 0; f < N_FIELDS; f++)
        Py_XDECREF(got[f]);
    return answer;
}

static PyObject *decode_reader(Reader *r) {
    int64_t top = container(r, 0);
    if (top != 2 && top != 3)
        return NULL;
    double ts;
    if (need(r, 9) && *r->p == 0xcb) {
        uint64_t bits = be(r->p + 1, 8);
        memcpy(&ts, &bits, 8);
        r->p += 9;
    } else if (need(r, 5) && *r->p == 0xca) {
        uint32_t bits = (uint32_t)be(r->p + 1, 4);
        float f;
        memcpy(&f, &bits, 4);
        ts = f;
        r->p += 5;
    } else {
        return NULL;
    }
    int64_t n = container(r, 0);
    if (n < 0 || !need(r, (size_t)n))
        return NULL;
    PyObject *events = PyList_New((Py_ssize_t)n);
    if (events == NULL)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *e = event(r);
        if (e == NULL) {
            Py_DECREF(events);
            return NULL;
        }
        PyList_SET_ITEM(events, (Py_ssize_t)i, e);
    }
    PyObject *rank = Py_None;
    Py_INCREF(rank);
    if (top == 3) {
        Py_DECREF(rank);
        rank = optional_int(r);
    }
    if (rank == NULL || r->p != r->end) {
        Py_XDECREF(rank);
        Py_DECREF(events);
        return NULL;
    }
    PyObject *answer = Py_BuildValue("(dNN)", ts, events, rank);
    return answer;
}

static PyObject *decode(PyObject *Py_UNUSED(module), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Reader r = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
    PyObject *answer = decode_reader(&r);
    PyBuffer_Release(&view);
    if (answer != NULL)
        return answer;
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return NULL; /* no memory */
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_O,
     "decode(payload) -> (ts, events, attn_dp_rank), or None when the payload is not in the common form."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_kv_payload",
                                    "SGLang KV-event batch payloads in their common form, decoded in C.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_native_kv_payload(void) {
    fill_fixed();
    return PyModule_Create(&module);
}
