/* ``Reader(libzmq_path)``: the messages a ZMQ socket holds, read in C through the libzmq pyzmq itself loaded.

   ``event_listener._ready_messages`` reads every KV-event batch a worker publishes (about one per request in front
   of a busy router): it asks the socket whether a message is there (``EVENTS``) and takes its frames without
   waiting. Through pyzmq each ``getsockopt`` builds a ``SocketOption`` enum in Python (1.4 interpreted calls a
   request, ~2 us each) and each frame becomes a ``Frame`` object before its bytes are copied out. Here the same
   calls go straight to libzmq: ``zmq_getsockopt(ZMQ_EVENTS)``, then ``zmq_msg_recv`` with ``ZMQ_DONTWAIT`` per
   frame, each frame's bytes copied into a ``bytes``.

   The library is the one already mapped into this process by pyzmq (``event_listener`` finds its path in
   ``/proc/self/maps``); ``dlopen`` of a loaded library returns it, so the socket handle pyzmq made
   (``Socket.underlying``, the ``void *`` libzmq gave it) is one this library knows. Where that path cannot be
   found, or a symbol is missing, ``Reader`` raises and the listener reads through pyzmq as before.

   Reader(libzmq_path)
   reader.ready(handle: int, limit: int) -> list[list[bytes]]: up to ``limit`` whole messages, each its frames;
       stops when ``ZMQ_EVENTS`` shows no ``ZMQ_POLLIN`` (asking also has the socket take in its pending commands,
       after which its ``ZMQ_FD`` signals the next change, as pyzmq's ``getsockopt`` does). A frame that is not
       there after ``POLLIN`` (``EAGAIN``) ends the read, the message so far kept for the next call; any other
       error raises ``OSError`` with libzmq's message. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>

/* From zmq.h (stable ABI since libzmq 3.x): the message is 64 bytes, opaque, pointer-aligned. */
typedef struct {
    unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) zmq_msg;

#define ZMQ_EVENTS_OPT 15
#define ZMQ_POLLIN_BIT 1
#define ZMQ_DONTWAIT_FLAG 1

typedef int (*getsockopt_fn)(void *, int, void *, size_t *);
typedef int (*msg_init_fn)(zmq_msg *);
typedef int (*msg_recv_fn)(zmq_msg *, void *, int);
typedef void *(*msg_data_fn)(zmq_msg *);
typedef size_t (*msg_size_fn)(const zmq_msg *);
typedef int (*msg_more_fn)(const zmq_msg *);
typedef int (*msg_close_fn)(zmq_msg *);
typedef int (*errno_fn)(void);
typedef const char *(*strerror_fn)(int);

typedef struct {
    PyObject_HEAD
    void *lib;
    getsockopt_fn getsockopt;
    msg_init_fn msg_init;
    msg_recv_fn msg_recv;
    msg_data_fn msg_data;
    msg_size_fn msg_size;
    msg_more_fn msg_more;
    msg_close_fn msg_close;
    errno_fn zmq_errno;
    strerror_fn zmq_strerror;
    PyObject *partial; /* frames of a message cut short by EAGAIN (a list), or NULL */
} Reader;

static int reader_init(Reader *self, PyObject *args, PyObject *kwds) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return -1;
    if (self->lib != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Reader: already initialised");
        return -1;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "Reader: %s is not loaded in this process", path);
        return -1;
    }
    struct {
        const char *name;
        void **slot;
    } want[] = {
        {"zmq_getsockopt", (void **)&self->getsockopt}, {"zmq_msg_init", (void **)&self->msg_init},
        {"zmq_msg_recv", (void **)&self->msg_recv},     {"zmq_msg_data", (void **)&self->msg_data},
        {"zmq_msg_size", (void **)&self->msg_size},     {"zmq_msg_more", (void **)&self->msg_more},
        {"zmq_msg_close", (void **)&self->msg_close},   {"zmq_errno", (void **)&self->zmq_errno},
        {"zmq_strerror", (void **)&self->zmq_strerror},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        *want[i].slot = dlsym(lib, want[i].name);
        if (*want[i].slot == NULL) {
            PyErr_Format(PyExc_OSError, "Reader: %s has no %s", path, want[i].name);
            dlclose(lib);
            return -1;
        }
    }
    self->lib = lib;
    return 0;
}

static PyObject *zmq_error(Reader *self) {
    int e = self->zmq_errno();
    PyErr_Format(PyExc_OSError, "libzmq: %s (errno %d)", self->zmq_strerror(e), e);
    return NULL;
}

static PyObject *reader_ready(Reader *self, PyObject *const *args, Py_ssize_t nargs) {
    if (self->lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Reader: not initialised");
        return NULL;
    }
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "ready(handle: int, limit: int)");
        return NULL;
    }
    void *socket = PyLong_AsVoidPtr(args[0]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (socket == NULL) {
        PyErr_SetString(PyExc_ValueError, "ready: the socket handle is null (closed?)");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    while (PyList_GET_SIZE(out) < limit) {
        int events = 0;
        size_t size = sizeof(events);
        if (self->getsockopt(socket, ZMQ_EVENTS_OPT, &events, &size) != 0) {
            Py_DECREF(out);
            return zmq_error(self);
        }
        if (!(events & ZMQ_POLLIN_BIT))
            break;
        PyObject *frames = self->partial != NULL ? self->partial : PyList_New(0);
        self->partial = NULL;
        if (frames == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        int more = 1, again = 0;
        while (more) {
            zmq_msg msg;
            self->msg_init(&msg);
            if (self->msg_recv(&msg, socket, ZMQ_DONTWAIT_FLAG) < 0) {
                int e = self->zmq_errno();
                self->msg_close(&msg);
                if (e == EAGAIN) { /* not expected after POLLIN: keep what came, read on next time */
                    again = 1;
                    break;
                }
                Py_DECREF(frames);
                Py_DECREF(out);
                PyErr_Format(PyExc_OSError, "libzmq: %s (errno %d)", self->zmq_strerror(e), e);
                return NULL;
            }
            PyObject *b = PyBytes_FromStringAndSize((const char *)self->msg_data(&msg), (Py_ssize_t)self->msg_size(&msg));
            more = self->msg_more(&msg);
            self->msg_close(&msg);
            if (b == NULL || PyList_Append(frames, b) < 0) {
                Py_XDECREF(b);
                Py_DECREF(frames);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(b);
        }
        if (again) {
            if (PyList_GET_SIZE(frames) > 0)
                self->partial = frames;
            else
                Py_DECREF(frames);
            break;
        }
        int rc = PyList_Append(out, frames);
        Py_DECREF(frames);
        if (rc < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static void reader_dealloc(Reader *self) {
    Py_CLEAR(self->partial);
    if (self->lib != NULL)
        dlclose(self->lib); /* drops this module's reference; pyzmq's keeps the library loaded */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef reader_methods[] = {
    {"ready", (PyCFunction)(void (*)(void))reader_ready, METH_FASTCALL,
     "ready(handle, limit) -> list of messages (each a list of frames' bytes) the socket holds now"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sgl_moe.router.membership.native_zmq_read.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reads a ZMQ socket's waiting messages through the libzmq pyzmq loaded; see the module.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)reader_init,
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_methods = reader_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_zmq_read", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_native_zmq_read(void) {
    if (PyType_Ready(&ReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
