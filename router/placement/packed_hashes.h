/* Block hashes packed: one buffer of signed 64-bit ints (``block_hash.PackedHashes``, an ``array`` of ``q``; a
   prompt's page hashes from ``block_hash.block_hashes_packed``, a KV event's from the payload reader). The C tables
   (``native_block_tables.c``) and the prefix homes (``native_prefix_homes.c``) read them where they lie, without
   an int object per hash; a list or tuple of ints is read as before. */
#ifndef SGL_MOE_PACKED_HASHES_H
#define SGL_MOE_PACKED_HASHES_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Whether ``hashes`` is a buffer of signed 64-bit ints: then ``view`` holds it (released by the caller). 0 for
   anything else (a list, a tuple); -1 with an error set. */
static int packed_view(PyObject *hashes, Py_buffer *view) {
    if (PyList_CheckExact(hashes) || PyTuple_CheckExact(hashes) || !PyObject_CheckBuffer(hashes))
        return 0;
    if (PyObject_GetBuffer(hashes, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    if (view->itemsize != 8 || (strcmp(f, "q") != 0 && strcmp(f, "l") != 0)) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* The ``i``-th hash of a packed view (read byte-wise: a view need not be aligned; the compiler makes it one load). */
static inline int64_t packed_at(const Py_buffer *view, Py_ssize_t i) {
    int64_t v;
    memcpy(&v, (const char *)view->buf + 8 * i, sizeof v);
    return v;
}

#endif
