/* The JSON text of token ids packed as uint32 (``token_ids.TokenIds``), without an int object per id.

   json_text(ids, start=0, end=len(ids)) -> bytes: ``orjson.dumps(list(ids[start:end]))``, byte for byte (``[``,
   the ids in decimal joined by ``,``, ``]``; no spaces). ``ids``: any buffer of 4-byte unsigned ints (format "I",
   or "L"/"=I"/"<I" where that is 4 bytes, as ``array('I')`` gives). ``start``/``end`` are clipped to the ids as a
   slice's are; negative ones count from the end.

   ``token_ids.py`` holds the Python reference (``json_text_py``); the tests compare the two on random ids and at
   every decimal length's boundaries. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const char DIGIT_PAIRS[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                     "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                     "8081828384858687888990919293949596979899";

static inline size_t decimal_length(uint32_t v) {
    return v < 10 ? 1 : v < 100 ? 2 : v < 1000 ? 3 : v < 10000 ? 4 : v < 100000 ? 5 : v < 1000000 ? 6
         : v < 10000000 ? 7 : v < 100000000 ? 8 : v < 1000000000 ? 9 : 10;
}

/* ``v`` in decimal at ``out``, written from its last digit back, two at a time; answers the characters written. */
static inline size_t write_u32(char *out, uint32_t v) {
    size_t n = decimal_length(v);
    char *p = out + n;
    while (v >= 100) {
        uint32_t q = v / 100, r = v - q * 100;
        p -= 2;
        memcpy(p, DIGIT_PAIRS + 2 * r, 2);
        v = q;
    }
    if (v >= 10) {
        p -= 2;
        memcpy(p, DIGIT_PAIRS + 2 * v, 2);
    } else {
        *--p = (char)('0' + v);
    }
    return n;
}

static int is_u32_format(const Py_buffer *view) {
    if (view->itemsize != 4 || view->format == NULL)
        return 0;
    const char *f = view->format;
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    return (strcmp(f, "I") == 0 || strcmp(f, "L") == 0) && (view->format[0] != '<' || PY_LITTLE_ENDIAN);
}

static Py_ssize_t clip(Py_ssize_t i, Py_ssize_t n) {
    if (i < 0)
        i += n;
    return i < 0 ? 0 : (i > n ? n : i);
}

static PyObject *json_text(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "json_text(ids, start=0, end=None)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (!is_u32_format(&view)) {
        PyErr_Format(PyExc_TypeError, "json_text: ids must be uint32 (an array of 'I'), not format %s",
                     view.format ? view.format : "B");
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t n = view.len / 4, start = 0, end = n;
    if (nargs > 1 && args[1] != Py_None && ((start = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()))
        goto fail;
    if (nargs > 2 && args[2] != Py_None && ((end = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()))
        goto fail;
    start = clip(start, n);
    end = clip(end, n);
    if (end < start)
        end = start;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 2 + (end - start) * 11);
    if (out == NULL)
        goto fail;
    char *w = PyBytes_AS_STRING(out), *begin = w;
    const uint32_t *ids = (const uint32_t *)view.buf;
    *w++ = '[';
    for (Py_ssize_t i = start; i < end; i++) {
        w += write_u32(w, ids[i]);
        *w++ = ',';
    }
    if (end > start)
        w--;
    *w++ = ']';
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, w - begin) < 0)
        return NULL;
    return out;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"json_text", (PyCFunction)(void (*)(void))json_text, METH_FASTCALL,
     "json_text(ids, start=0, end=None) -> bytes: the JSON array of ids[start:end] (uint32), as orjson writes it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_token_ids", NULL, -1, methods};

PyMODINIT_FUNC PyInit_native_token_ids(void) { return PyModule_Create(&module); }
