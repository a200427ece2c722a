/* ``BlockIndex``'s per-block loops in C: one dictionary step per block of every promise, retire, stored or
   removed event and match, without a Python step per block.

   ``block_tables.py`` holds the reference (the same functions in Python) and says what the tables are; the
   functions here take the same arguments and return the same values, working on the same Python dicts and sets
   through the C API. Its tests (``tests/router/test_native_paths.py``) run random operation sequences through both
   and compare every answer and every table.

   A mask is a Python int with bit ``slot`` set for each target; masks below 2**62 are combined as C integers,
   larger ones (slots 62 and up: a router whose workers came and went many times) through Python's int
   operations. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* ``a | b`` (or ``a & b`` when ``and``), as a new reference; C integers when both fit in a long. */
static PyObject *mask_op(PyObject *a, PyObject *b, int and) {
    int oa = 0, ob = 0;
    long x = PyLong_AsLongAndOverflow(a, &oa);
    if (x == -1 && PyErr_Occurred())
        return NULL;
    long y = PyLong_AsLongAndOverflow(b, &ob);
    if (y == -1 && PyErr_Occurred())
        return NULL;
    if (!oa && !ob)
        return PyLong_FromLong(and ? (x & y) : (x | y));
    return and ? PyNumber_And(a, b) : PyNumber_Or(a, b);
}

/* index[h] = index.get(h, 0) | bit */
static int index_set_bit(PyObject *index, PyObject *h, PyObject *bit) {
    PyObject *old = PyDict_GetItemWithError(index, h); /* borrowed */
    if (old == NULL && PyErr_Occurred())
        return -1;
    PyObject *mask = old == NULL ? Py_NewRef(bit) : mask_op(old, bit, 0);
    if (mask == NULL)
        return -1;
    int rc = PyDict_SetItem(index, h, mask);
    Py_DECREF(mask);
    return rc;
}

/* mask = index.get(h, 0) & keep; index[h] = mask if mask else pop (``BlockIndex._drop_bit``) */
static int index_drop_bit(PyObject *index, PyObject *h, PyObject *keep) {
    PyObject *old = PyDict_GetItemWithError(index, h);
    if (old == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *mask = mask_op(old, keep, 1);
    if (mask == NULL)
        return -1;
    int truth = PyObject_IsTrue(mask);
    int rc = truth < 0 ? -1 : truth ? PyDict_SetItem(index, h, mask) : PyDict_DelItem(index, h);
    Py_DECREF(mask);
    return rc;
}

static int check_types(PyObject *dict_or_null, PyObject *set_or_null, PyObject *index) {
    if ((dict_or_null != NULL && !PyDict_CheckExact(dict_or_null)) || !PyDict_CheckExact(index)) {
        PyErr_SetString(PyExc_TypeError, "pending tables and the index must be dicts");
        return -1;
    }
    if (set_or_null != NULL && !PySet_CheckExact(set_or_null)) {
        PyErr_SetString(PyExc_TypeError, "committed tables must be sets");
        return -1;
    }
    return 0;
}

/* promise(pending, index, bit, hashes) -> gained */
static PyObject *promise(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "promise(pending, index, bit, hashes)");
        return NULL;
    }
    PyObject *pending = args[0], *index = args[1], *bit = args[2];
    if (check_types(pending, NULL, index) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[3], "hashes must be iterable");
    if (seq == NULL)
        return NULL;
    PyObject *gained = PyList_New(0);
    if (gained == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i];
        PyObject *count = PyDict_GetItemWithError(pending, h);
        if (count == NULL && PyErr_Occurred())
            goto fail;
        long c = 0;
        if (count != NULL) {
            c = PyLong_AsLong(count);
            if (c == -1 && PyErr_Occurred())
                goto fail;
        }
        PyObject *next = PyLong_FromLong(c + 1);
        if (next == NULL)
            goto fail;
        int rc = PyDict_SetItem(pending, h, next);
        Py_DECREF(next);
        if (rc < 0)
            goto fail;
        if (c == 0) {
            if (index_set_bit(index, h, bit) < 0 || PyList_Append(gained, h) < 0)
                goto fail;
        }
    }
    Py_DECREF(seq);
    return gained;
fail:
    Py_XDECREF(gained);
    Py_DECREF(seq);
    return NULL;
}

/* retire(pending, committed, index, keep, hashes) -> dropped; keep is ~bit */
static PyObject *retire(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "retire(pending, committed, index, keep, hashes)");
        return NULL;
    }
    PyObject *pending = args[0], *committed = args[1], *index = args[2], *keep = args[3];
    if (check_types(pending, committed, index) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[4], "hashes must be iterable");
    if (seq == NULL)
        return NULL;
    PyObject *dropped = PyList_New(0);
    if (dropped == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = items[i];
        PyObject *count = PyDict_GetItemWithError(pending, h);
        if (count == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        long c = PyLong_AsLong(count);
        if (c == -1 && PyErr_Occurred())
            goto fail;
        if (c > 1) {
            PyObject *next = PyLong_FromLong(c - 1);
            if (next == NULL)
                goto fail;
            int rc = PyDict_SetItem(pending, h, next);
            Py_DECREF(next);
            if (rc < 0)
                goto fail;
        } else if (c == 1) {
            Py_INCREF(h); /* the dict may hold the only other reference */
            int rc = PyDict_DelItem(pending, h);
            int held = rc < 0 ? -1 : PySet_Contains(committed, h);
            if (held == 0 && (index_drop_bit(index, h, keep) < 0 || PyList_Append(dropped, h) < 0))
                held = -1;
            Py_DECREF(h);
            if (held < 0)
                goto fail;
        }
    }
    Py_DECREF(seq);
    return dropped;
fail:
    Py_XDECREF(dropped);
    Py_DECREF(seq);
    return NULL;
}

/* The hashes of seq in committed (want_in) or not in it, as a new list; membership read before any change. */
static PyObject *filter_committed(PyObject *committed, PyObject *seq, int want_in) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        int in = PySet_Contains(committed, items[i]);
        if (in < 0 || (in == want_in && PyList_Append(out, items[i]) < 0)) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* store (storing) or remove: the hashes the committed table gains (not in it) or loses (in it), membership read
   before any change; then the table changes, and the index for each one not also pending (a pending block keeps the
   target's bit either way). ``mask`` is bit for a store, keep for a removal. */
static PyObject *commit(PyObject *const *args, Py_ssize_t nargs, int storing) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, storing ? "store(committed, pending, index, bit, hashes)"
                                                 : "remove(committed, pending, index, keep, hashes)");
        return NULL;
    }
    PyObject *committed = args[0], *pending = args[1], *index = args[2], *mask = args[3];
    if (check_types(pending, committed, index) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[4], "hashes must be iterable");
    if (seq == NULL)
        return NULL;
    PyObject *changed = filter_committed(committed, seq, !storing);
    Py_DECREF(seq);
    if (changed == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(changed);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PyList_GET_ITEM(changed, i);
        if ((storing ? PySet_Add(committed, h) : PySet_Discard(committed, h)) < 0)
            goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *h = PyList_GET_ITEM(changed, i);
        int promised = PyDict_Contains(pending, h);
        if (promised < 0 || (!promised && (storing ? index_set_bit(index, h, mask)
                                                   : index_drop_bit(index, h, mask)) < 0))
            goto fail;
    }
    return changed;
fail:
    Py_DECREF(changed);
    return NULL;
}

/* store(committed, pending, index, bit, hashes) -> gained */
static PyObject *store(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { return commit(args, nargs, 1); }

/* remove(committed, pending, index, keep, hashes) -> lost */
static PyObject *remove_(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { return commit(args, nargs, 0); }

static int append_group(PyObject *groups, Py_ssize_t blocks, PyObject *mask) {
    PyObject *n = PyLong_FromSsize_t(blocks);
    if (n == NULL)
        return -1;
    PyObject *pair = PyTuple_Pack(2, n, mask);
    Py_DECREF(n);
    if (pair == NULL)
        return -1;
    int rc = PyList_Append(groups, pair);
    Py_DECREF(pair);
    return rc;
}

/* match_groups(index, hashes, slots_mask) -> [(matched_blocks, mask), ...], longest first */
static PyObject *match_groups(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "match_groups(index, hashes, slots_mask)");
        return NULL;
    }
    PyObject *index = args[0];
    if (check_types(NULL, NULL, index) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[1], "hashes must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *groups = PyList_New(0);
    PyObject *live = Py_NewRef(args[2]), *zero = PyLong_FromLong(0);
    if (groups == NULL || zero == NULL)
        goto fail;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        PyObject *held = PyDict_GetItemWithError(index, items[i]);
        if (held == NULL && PyErr_Occurred())
            goto fail;
        PyObject *have = mask_op(held == NULL ? zero : held, live, 1);
        if (have == NULL)
            goto fail;
        int same = PyObject_RichCompareBool(have, live, Py_EQ);
        if (same < 0) {
            Py_DECREF(have);
            goto fail;
        }
        if (same) {
            Py_DECREF(have);
            continue;
        }
        if (i) { /* the targets that dropped out here: live ^ have (have is within live) */
            PyObject *out = PyNumber_Xor(live, have);
            int rc = out == NULL ? -1 : append_group(groups, i, out);
            Py_XDECREF(out);
            if (rc < 0) {
                Py_DECREF(have);
                goto fail;
            }
        }
        Py_SETREF(live, have);
        int any = PyObject_IsTrue(live);
        if (any < 0)
            goto fail;
        if (!any)
            break;
    }
    if (i == n && n > 0) {
        int any = PyObject_IsTrue(live);
        if (any < 0 || (any && append_group(groups, n, live) < 0))
            goto fail;
    }
    if (PyList_Reverse(groups) < 0)
        goto fail;
    Py_DECREF(live);
    Py_DECREF(zero);
    Py_DECREF(seq);
    return groups;
fail:
    Py_XDECREF(groups);
    Py_XDECREF(live);
    Py_XDECREF(zero);
    Py_DECREF(seq);
    return NULL;
}

/* committed_prefix(committed, hashes) -> leading hashes in committed */
static PyObject *committed_prefix(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "committed_prefix(committed, hashes)");
        return NULL;
    }
    if (!PySet_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "committed tables must be sets");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[1], "hashes must be iterable");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (; i < n; i++) {
        int in = PySet_Contains(args[0], items[i]);
        if (in < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        if (!in)
            break;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
    {"promise", (PyCFunction)(void (*)(void))promise, METH_FASTCALL,
     "promise(pending, index, bit, hashes) -> gained: block_tables.promise_py in C."},
    {"retire", (PyCFunction)(void (*)(void))retire, METH_FASTCALL,
     "retire(pending, committed, index, keep, hashes) -> dropped: block_tables.retire_py in C."},
    {"store", (PyCFunction)(void (*)(void))store, METH_FASTCALL,
     "store(committed, pending, index, bit, hashes) -> gained: block_tables.store_py in C."},
    {"remove", (PyCFunction)(void (*)(void))remove_, METH_FASTCALL,
     "remove(committed, pending, index, keep, hashes) -> lost: block_tables.remove_py in C."},
    {"match_groups", (PyCFunction)(void (*)(void))match_groups, METH_FASTCALL,
     "match_groups(index, hashes, slots_mask) -> groups: block_tables.match_groups_py in C."},
    {"committed_prefix", (PyCFunction)(void (*)(void))committed_prefix, METH_FASTCALL,
     "committed_prefix(committed, hashes) -> int: block_tables.committed_prefix_py in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "native_block_tables",
    "BlockIndex's per-block loops in C (reference: sgl_moe.router.placement.block_tables).", -1, methods,
};

PyMODINIT_FUNC PyInit_native_block_tables(void) { return PyModule_Create(&module); }
