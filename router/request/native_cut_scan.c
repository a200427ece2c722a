/* ``CutScan`` in C: the first place at or after ``c`` where ``CutRule`` lets a text be cut, found without a Python
   step per character.

   ``token_cuts.py`` says why a cut keeps a text's ids and holds the reference (``CutRule.allows`` and
   ``CutRule.next_cut_py``); this type answers ``next_cut``'s question from the rule's data, read once. Its tests
   (``tests/router/test_token_cuts.py``) compare the two over every fixture tokenizer on random and adversarial
   texts.

   The memo asks at every checkpoint of every text (``PrefixMemo._seen_cuts``): the first allowed cut from a
   multiple of ``segment_chars`` on. In Python that was a call to ``allows`` at each character tried (about four per
   checkpoint on the shipped model, where most adjacent letters sit together in some vocabulary token). Here every
   test of ``allows`` runs on the text's code points: the rule's family, ASCII at the cut, the character map, the
   pairs of adjacent characters in vocabulary tokens, the alphabet, and whether an added token's occurrence covers
   the cut (``covers``: the contents compared around the cut where either character at it is one an added token
   holds). Only where added tokens match lowercased text and a character near the cut is not ASCII (``str.lower``
   may lengthen it) is the place returned negated, for the caller to ask ``CutRule``. On the shipped model every
   letter is in some added token (``<|im_start|>``, ``<think>``): that question was asked at most checkpoints, a
   regex in Python each time (2.5% of the live router's CPU at shared-4000, 2026-12-01).

   CutScan(regex_pieces, space_before_cut, ascii_at_cut, space_before_newline, char_map, pairs, alphabet,
           added_chars, lowercase_added, added_contents)
       char_map: dict of one character -> one character; pairs: iterable of 2-character strings; alphabet:
       iterable of characters, or None; added_chars: iterable of characters; added_contents: iterable of
       non-empty strs (lowercased where ``lowercase_added``).
   next(text, c, stop) -> the first allowed cut p in [max(c, 1), stop), or -p for a place only ``CutRule`` can judge
       (see above); None when there is none. ``stop`` <= len(text). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_MAP 16

/* A set of 64-bit keys (open addressing, linear probing; key 0 is held by a flag). */
typedef struct {
    uint64_t *keys;
    size_t mask;
    int has_zero;
} KeySet;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int set_init(KeySet *s, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2)
        cap <<= 1;
    s->keys = PyMem_Calloc(cap, sizeof(uint64_t));
    if (s->keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->mask = cap - 1;
    s->has_zero = 0;
    return 0;
}

static void set_add(KeySet *s, uint64_t k) {
    if (k == 0) {
        s->has_zero = 1;
        return;
    }
    size_t i = mix(k) & s->mask;
    while (s->keys[i] != 0 && s->keys[i] != k)
        i = (i + 1) & s->mask;
    s->keys[i] = k;
}

static int set_has(const KeySet *s, uint64_t k) {
    if (k == 0)
        return s->has_zero;
    size_t i = mix(k) & s->mask;
    while (s->keys[i] != 0) {
        if (s->keys[i] == k)
            return 1;
        i = (i + 1) & s->mask;
    }
    return 0;
}

typedef struct {
    PyObject_HEAD
    int regex_pieces, space_before_cut, ascii_at_cut, space_before_newline, lowercase_added, has_alphabet;
    int map_len;
    Py_UCS4 map_from[MAX_MAP], map_to[MAX_MAP];
    KeySet pairs, alphabet, added, added_first;
    Py_ssize_t n_contents, max_len;
    Py_ssize_t *content_len;
    Py_UCS4 **contents; /* the added tokens' contents (``CutRule.added_contents``), code points */
} CutScan;

/* One character of a str, or -1 (and an error) when it is not one. */
static long one_char(PyObject *o, const char *what) {
    if (!PyUnicode_Check(o) || PyUnicode_GET_LENGTH(o) != 1) {
        PyErr_Format(PyExc_ValueError, "CutScan: %s must be one character", what);
        return -1;
    }
    return (long)PyUnicode_READ_CHAR(o, 0);
}

/* Adds every item of ``items`` (strs of ``width`` characters) to ``s``, the characters packed 32 bits each. */
static int fill_set(KeySet *s, PyObject *items, Py_ssize_t width, const char *what) {
    PyObject *seq = PySequence_Fast(items, "CutScan: an iterable of strs");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (set_init(s, (size_t)n) < 0) {
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(o) || PyUnicode_GET_LENGTH(o) != width) {
            PyErr_Format(PyExc_ValueError, "CutScan: every item of %s must be %zd characters", what, width);
            Py_DECREF(seq);
            return -1;
        }
        uint64_t k = PyUnicode_READ_CHAR(o, 0);
        if (width == 2)
            k = (k << 32) | PyUnicode_READ_CHAR(o, 1);
        set_add(s, k);
    }
    Py_DECREF(seq);
    return 0;
}

/* Keeps the added tokens' contents (non-empty strs) as code points, and the set of their first characters. */
static int fill_contents(CutScan *self, PyObject *contents) {
    PyObject *seq = PySequence_Fast(contents, "CutScan: added_contents must be an iterable of strs");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    self->contents = PyMem_Calloc(n ? n : 1, sizeof(Py_UCS4 *));
    self->content_len = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    if (self->contents == NULL || self->content_len == NULL || set_init(&self->added_first, (size_t)n) < 0) {
        Py_DECREF(seq);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    self->max_len = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyUnicode_Check(o) || PyUnicode_GET_LENGTH(o) == 0) {
            PyErr_SetString(PyExc_ValueError, "CutScan: every added content must be a non-empty str");
            Py_DECREF(seq);
            return -1;
        }
        Py_UCS4 *chars = PyUnicode_AsUCS4Copy(o);
        if (chars == NULL) {
            Py_DECREF(seq);
            return -1;
        }
        Py_ssize_t len = PyUnicode_GET_LENGTH(o);
        self->contents[i] = chars;
        self->content_len[i] = len;
        self->n_contents = i + 1;
        if (len > self->max_len)
            self->max_len = len;
        set_add(&self->added_first, chars[0]);
    }
    Py_DECREF(seq);
    return 0;
}

static int init(CutScan *self, PyObject *args, PyObject *kwds) {
    PyObject *char_map, *pairs, *alphabet, *added, *contents;
    if (!PyArg_ParseTuple(args, "ppppOOOOpO", &self->regex_pieces, &self->space_before_cut, &self->ascii_at_cut,
                          &self->space_before_newline, &char_map, &pairs, &alphabet, &added, &self->lowercase_added,
                          &contents))
        return -1;
    if (self->pairs.keys != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "CutScan: already initialised");
        return -1;
    }
    if (!PyDict_Check(char_map) || PyDict_GET_SIZE(char_map) > MAX_MAP) {
        PyErr_Format(PyExc_ValueError, "CutScan: char_map must be a dict of at most %d entries", MAX_MAP);
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    self->map_len = 0;
    while (PyDict_Next(char_map, &pos, &key, &value)) {
        long from = one_char(key, "a char_map key"), to = one_char(value, "a char_map value");
        if (from < 0 || to < 0)
            return -1;
        self->map_from[self->map_len] = (Py_UCS4)from;
        self->map_to[self->map_len++] = (Py_UCS4)to;
    }
    if (fill_set(&self->pairs, pairs, 2, "pairs") < 0 || fill_set(&self->added, added, 1, "added_chars") < 0)
        return -1;
    self->has_alphabet = alphabet != Py_None;
    if (self->has_alphabet && fill_set(&self->alphabet, alphabet, 1, "alphabet") < 0)
        return -1;
    return fill_contents(self, contents);
}

static Py_UCS4 mapped(const CutScan *s, Py_UCS4 ch) {
    for (int i = 0; i < s->map_len; i++)
        if (s->map_from[i] == ch)
            return s->map_to[i];
    return ch;
}

/* Whether an added token may hold ``ch`` (``CutRule._added_token_covers``'s first test, or more). */
static int maybe_added(const CutScan *s, Py_UCS4 ch) {
    if (s->lowercase_added) {
        if (ch >= 128)
            return 1; /* str.lower of a non-ASCII character: asked in Python */
        if (ch >= 'A' && ch <= 'Z')
            ch += 'a' - 'A';
    }
    return set_has(&s->added, ch);
}

/* ``CutRule.allows`` but the added tokens' test, at ``c`` (1 <= c < len). */
static int allowed(const CutScan *s, int kind, const void *data, Py_ssize_t c) {
    Py_UCS4 before = PyUnicode_READ(kind, data, c - 1), after = PyUnicode_READ(kind, data, c);
    if (s->ascii_at_cut && (before >= 128 || after >= 128))
        return 0;
    if (s->regex_pieces) {
        if (before != '\n' || after >= 128 || Py_UNICODE_ISSPACE(after))
            return 0;
        if (!s->space_before_newline && c >= 2 && Py_UNICODE_ISSPACE(PyUnicode_READ(kind, data, c - 2)))
            return 0;
        return 1;
    }
    if (s->space_before_cut && after != ' ')
        return 0;
    before = mapped(s, before);
    after = mapped(s, after);
    if (set_has(&s->pairs, ((uint64_t)before << 32) | after))
        return 0;
    if (s->has_alphabet && (!set_has(&s->alphabet, before) || !set_has(&s->alphabet, after)))
        return 0;
    return 1;
}

/* ``CutRule._added_token_covers``: whether an added token's occurrence holds ``text[c-1]`` or ``text[c]``, i.e.
   starts at some ``s <= c`` and ends at ``s + len >= c``, inside ``text[max(0, c - max_len):c + max_len]``. 1: it
   does; 0: it does not; -1: ask Python (lowercase added tokens and a non-ASCII character in that window, which
   ``str.lower`` may turn into more than one). */
static int covers(const CutScan *s, int kind, const void *data, Py_ssize_t n, Py_ssize_t c) {
    Py_ssize_t start = c > s->max_len ? c - s->max_len : 0, end = c + s->max_len < n ? c + s->max_len : n;
    if (s->lowercase_added)
        for (Py_ssize_t i = start; i < end; i++)
            if (PyUnicode_READ(kind, data, i) >= 128)
                return -1;
    for (Py_ssize_t at = start; at <= c; at++) {
        Py_UCS4 first = PyUnicode_READ(kind, data, at);
        if (s->lowercase_added && first >= 'A' && first <= 'Z')
            first += 'a' - 'A';
        if (!set_has(&s->added_first, first))
            continue;
        for (Py_ssize_t k = 0; k < s->n_contents; k++) {
            Py_ssize_t len = s->content_len[k];
            if (at + len < c || at + len > end || s->contents[k][0] != first)
                continue;
            Py_ssize_t j = 1;
            for (; j < len; j++) {
                Py_UCS4 ch = PyUnicode_READ(kind, data, at + j);
                if (s->lowercase_added && ch >= 'A' && ch <= 'Z')
                    ch += 'a' - 'A';
                if (ch != s->contents[k][j])
                    break;
            }
            if (j == len)
                return 1;
        }
    }
    return 0;
}

static PyObject *next_cut(CutScan *self, PyObject *const *args, Py_ssize_t nargs) {
    if (self->pairs.keys == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "CutScan: not initialised");
        return NULL;
    }
    if (nargs != 3 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "next(text: str, c: int, stop: int)");
        return NULL;
    }
    PyObject *text = args[0];
    Py_ssize_t c = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]);
    if ((c == -1 || stop == -1) && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (stop > n)
        stop = n;
    if (c < 1)
        c = 1;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    int need_before = self->regex_pieces, need_after = self->space_before_cut && !self->regex_pieces;
    for (; c < stop; c++) {
        /* the family's cheapest test first: most places fail it */
        if (need_before && PyUnicode_READ(kind, data, c - 1) != '\n')
            continue;
        if (need_after && PyUnicode_READ(kind, data, c) != ' ')
            continue;
        if (!allowed(self, kind, data, c))
            continue;
        if (maybe_added(self, PyUnicode_READ(kind, data, c - 1)) || maybe_added(self, PyUnicode_READ(kind, data, c))) {
            int r = covers(self, kind, data, n, c);
            if (r > 0)
                continue;
            if (r < 0)
                return PyLong_FromSsize_t(-c);
        }
        return PyLong_FromSsize_t(c);
    }
    Py_RETURN_NONE;
}

static void dealloc(CutScan *self) {
    PyMem_Free(self->pairs.keys);
    PyMem_Free(self->alphabet.keys);
    PyMem_Free(self->added.keys);
    PyMem_Free(self->added_first.keys);
    for (Py_ssize_t i = 0; i < self->n_contents; i++)
        PyMem_Free(self->contents[i]);
    PyMem_Free(self->contents);
    PyMem_Free(self->content_len);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef methods[] = {
    {"next", (PyCFunction)(void (*)(void))next_cut, METH_FASTCALL,
     "next(text, c, stop) -> the first allowed cut p in [c, stop) (-p: ask CutRule), or None"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CutScanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_moe.router.request.native_cut_scan.CutScan",
    .tp_basicsize = sizeof(CutScan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A CutRule's scan for the next allowed cut; see the module.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)init,
    .tp_dealloc = (destructor)dealloc,
    .tp_methods = methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_cut_scan", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_native_cut_scan(void) {
    if (PyType_Ready(&CutScanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "CutScan", (PyObject *)&CutScanType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
