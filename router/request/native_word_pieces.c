/* A text's pieces looked up in ``piece_cache``'s two tables, in C: the per-piece loop of ``PieceCache``.

   ``word_pieces.py`` holds the reference (``lookup`` and ``join`` in Python) and says what a piece is; this module
   computes the same without a Python step per piece. Its tests (``tests/router/test_native_paths.py``) compare the
   two on random and adversarial texts.

   lookup(text, kept, words) -> (ids, None, None, pieces) when every piece's ids are kept, else
                                (found, missing, new, pieces): found[j] the j-th piece's ids or None,
                                missing the j of each None, new the text of each missing piece.
   join(found) -> the ids of found's lists, in order. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject **items;
    Py_ssize_t len, cap;
} Found;

static int found_push(Found *f, PyObject *ids) { /* takes a new reference (or NULL for a missing piece) */
    if (f->len == f->cap) {
        Py_ssize_t cap = f->cap ? 2 * f->cap : 64;
        PyObject **items = PyMem_Realloc(f->items, (size_t)cap * sizeof(PyObject *));
        if (items == NULL) {
            Py_XDECREF(ids);
            PyErr_NoMemory();
            return -1;
        }
        f->items = items;
        f->cap = cap;
    }
    f->items[f->len++] = ids;
    return 0;
}

static void found_clear(Found *f) {
    for (Py_ssize_t i = 0; i < f->len; i++)
        Py_XDECREF(f->items[i]);
    PyMem_Free(f->items);
}

static PyObject *flatten(PyObject **lists, Py_ssize_t n) {
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyList_Check(lists[i])) {
            PyErr_SetString(PyExc_TypeError, "a piece's ids must be a list");
            return NULL;
        }
        total += PyList_GET_SIZE(lists[i]);
    }
    PyObject *out = PyList_New(total);
    if (out == NULL)
        return NULL;
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t m = PyList_GET_SIZE(lists[i]);
        PyObject **src = ((PyListObject *)lists[i])->ob_item;
        for (Py_ssize_t j = 0; j < m; j++)
            PyList_SET_ITEM(out, at++, Py_NewRef(src[j]));
    }
    return out;
}

static PyObject *lookup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "lookup(text: str, kept: dict, words: dict)");
        return NULL;
    }
    PyObject *text = args[0], *kept = args[1], *words = args[2];
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Found found = {NULL, 0, 0};
    PyObject *missing = NULL, *fresh = NULL;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t start = i;
        while (i < n && PyUnicode_READ(kind, data, i) == ' ')
            i++;
        Py_ssize_t spaces = i - start;
        while (i < n && PyUnicode_READ(kind, data, i) != ' ')
            i++;
        /* One space then a word (or a lone space ending the text) is kept by the word; any other piece (the first
           word, two spaces or more with or without a word) by its text. */
        PyObject *key = PyUnicode_Substring(text, spaces == 1 ? start + 1 : start, i);
        if (key == NULL)
            goto fail;
        PyObject *ids = PyDict_GetItemWithError(spaces == 1 ? words : kept, key);
        Py_DECREF(key);
        if (ids == NULL && PyErr_Occurred())
            goto fail;
        if (ids == NULL) {
            if (missing == NULL && ((missing = PyList_New(0)) == NULL || (fresh = PyList_New(0)) == NULL))
                goto fail;
            PyObject *at = PyLong_FromSsize_t(found.len);
            PyObject *piece = at ? PyUnicode_Substring(text, start, i) : NULL;
            int bad = piece == NULL || PyList_Append(missing, at) < 0 || PyList_Append(fresh, piece) < 0;
            Py_XDECREF(at);
            Py_XDECREF(piece);
            if (bad || found_push(&found, NULL) < 0)
                goto fail;
        } else if (found_push(&found, Py_NewRef(ids)) < 0) {
            goto fail;
        }
    }
    PyObject *out;
    if (missing == NULL) {
        PyObject *ids = flatten(found.items, found.len);
        if (ids == NULL)
            goto fail;
        out = Py_BuildValue("(NOOn)", ids, Py_None, Py_None, found.len);
    } else {
        PyObject *list = PyList_New(found.len);
        if (list == NULL)
            goto fail;
        for (Py_ssize_t j = 0; j < found.len; j++) {
            PyList_SET_ITEM(list, j, found.items[j] ? found.items[j] : Py_NewRef(Py_None));
            found.items[j] = NULL;  /* the list holds the reference now */
        }
        out = Py_BuildValue("(NNNn)", list, missing, fresh, found.len);
    }
    found_clear(&found);
    return out;
fail:
    found_clear(&found);
    Py_XDECREF(missing);
    Py_XDECREF(fresh);
    return NULL;
}

static PyObject *join(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "join(found: list[list[int]])");
        return NULL;
    }
    return flatten(((PyListObject *)arg)->ob_item, PyList_GET_SIZE(arg));
}

static PyMethodDef methods[] = {
    {"lookup", (PyCFunction)(void (*)(void))lookup, METH_FASTCALL,
     "lookup(text, kept, words) -> (ids | found, missing | None, new | None, pieces); see the module."},
    {"join", join, METH_O, "join(found) -> the ids of found's lists, in order."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_word_pieces", NULL, -1, methods};

PyMODINIT_FUNC PyInit_native_word_pieces(void) { return PyModule_Create(&module); }
