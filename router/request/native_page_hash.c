/* SGLang 0.5.23's page hash chain in C: what ``block_hash.block_hash_chain`` computes in Python, at C speed.

   Each full page of ``page_size`` token ids is hashed with SHA-256 over the previous page's 32-byte digest (none for
   the first page, or the seed) followed by the page's ids as uint32 little-endian; a page's hash is the first 8
   digest bytes read as a signed big-endian int64. ``block_hash.py`` holds the reference and the explanation; this
   module only computes the same values without a Python call per page (about 1 us a page in Python on the 2-core
   VM, most of it the three calls).

   SHA-256 comes from the libcrypto that Python's own ``hashlib`` loads (looked up at import), so the
   digests are OpenSSL's with its CPU-specific code (SHA-NI on x86); where no libcrypto can be opened, a portable
   implementation written here from FIPS 180-4 runs instead. ``tests/router/test_native_paths.py`` checks both
   against ``hashlib``. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

/* OpenSSL's low-level SHA-256 (``SHA256_Init/Update/Final``): deprecated in 3.0 but exported, and without the
   per-call algorithm fetch of the one-shot ``SHA256()`` (which made a page cost 0.5 us instead of 0.1). The context
   is opaque here: its 112 bytes fit in ``ctx``. */
typedef int (*sha256_init_fn)(void *ctx);
typedef int (*sha256_update_fn)(void *ctx, const void *data, size_t n);
typedef int (*sha256_final_fn)(unsigned char *md, void *ctx);

static sha256_init_fn ossl_init = NULL;
static sha256_update_fn ossl_update = NULL;
static sha256_final_fn ossl_final = NULL;
static int use_openssl = 0;

/* -- portable SHA-256 (FIPS 180-4) --------------------------------------------------------------------------- */

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void compress(uint32_t h[8], const unsigned char *block) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 | (uint32_t)block[4 * i + 2] << 8 |
               (uint32_t)block[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR(w[i - 15], 7) ^ ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR(w[i - 2], 17) ^ ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

static void portable_sha256(const unsigned char *data, size_t n, unsigned char *md) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t full = n / 64;
    for (size_t i = 0; i < full; i++)
        compress(h, data + 64 * i);
    unsigned char last[128] = {0};
    size_t rest = n - 64 * full;
    memcpy(last, data + 64 * full, rest);
    last[rest] = 0x80;
    size_t blocks = rest + 9 > 64 ? 2 : 1;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++)
        last[64 * blocks - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t i = 0; i < blocks; i++)
        compress(h, last + 64 * i);
    for (int i = 0; i < 8; i++) {
        md[4 * i] = (unsigned char)(h[i] >> 24);
        md[4 * i + 1] = (unsigned char)(h[i] >> 16);
        md[4 * i + 2] = (unsigned char)(h[i] >> 8);
        md[4 * i + 3] = (unsigned char)h[i];
    }
}

static inline void sha256(const unsigned char *data, size_t n, unsigned char *md) {
    if (use_openssl) {
        _Alignas(16) unsigned char ctx[256];
        ossl_init(ctx);
        ossl_update(ctx, data, n);
        ossl_final(md, ctx);
    } else {
        portable_sha256(data, n, md);
    }
}

/* -- the chain ----------------------------------------------------------------------------------------------- */

static int token_id(PyObject *item, uint32_t *out) {
    /* ``array.array("I", ids)``'s rule: an int in [0, 2**32), OverflowError outside it. */
    unsigned long v = PyLong_AsUnsignedLong(item);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (v > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_OverflowError, "unsigned int is greater than maximum");
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* The page size and seed of a chain call (``f(data, page_size, seed=None)``); -1 with an exception set. */
static int chain_args(PyObject *const *args, Py_ssize_t nargs, const char *usage, Py_ssize_t *page, PyObject **seed,
                      const char **seed_bytes, Py_ssize_t *seed_len) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *seed = nargs == 3 ? args[2] : Py_None;
    *page = PyLong_AsSsize_t(args[1]);
    if (*page == -1 && PyErr_Occurred())
        return -1;
    if (*page <= 0) {
        PyErr_Format(PyExc_ValueError, "page_size must be positive, got %zd", *page);
        return -1;
    }
    *seed_bytes = NULL;
    *seed_len = 0;
    if (*seed != Py_None && PyBytes_AsStringAndSize(*seed, (char **)seed_bytes, seed_len) < 0)
        return -1;
    return 0;
}

/* The hashes of a chain as the caller asked: a list of ints, or packed (a ``bytes`` of their int64s, native order,
   which ``block_hash.PackedHashes`` wraps: no int object per page). */
static PyObject *hashes_object(Py_ssize_t pages, int packed) {
    return packed ? PyBytes_FromStringAndSize(NULL, pages * 8) : PyList_New(pages);
}

static int set_hash(PyObject *hashes, Py_ssize_t p, uint64_t first, int packed) {
    if (packed) {
        int64_t v = (int64_t)first;
        memcpy(PyBytes_AS_STRING(hashes) + 8 * p, &v, sizeof v);
        return 0;
    }
    PyObject *h = PyLong_FromLongLong((long long)first);
    if (h == NULL)
        return -1;
    PyList_SET_ITEM(hashes, p, h);
    return 0;
}

/* The chain over ids laid out as uint32 little-endian bytes: every full page of ``data`` (``len`` bytes) hashed,
   trailing bytes left alone; the same answer as ``block_hash_chain`` over the same ids. */
static PyObject *chain_over_bytes(const unsigned char *data, Py_ssize_t len, Py_ssize_t page, PyObject *seed,
                                  const char *seed_bytes, Py_ssize_t seed_len, int packed) {
    size_t step = 4 * (size_t)page;
    Py_ssize_t pages = len / (Py_ssize_t)step;
    PyObject *hashes = hashes_object(pages, packed);
    unsigned char *buf = PyMem_Malloc((size_t)(seed_len > 32 ? seed_len : 32) + step);
    if (hashes == NULL || buf == NULL) {
        if (buf == NULL)
            PyErr_NoMemory();
        PyMem_Free(buf);
        Py_XDECREF(hashes);
        return NULL;
    }
    unsigned char digest[32];
    for (Py_ssize_t p = 0; p < pages; p++) {
        unsigned char *w = buf;
        if (p > 0) {
            memcpy(w, digest, 32);
            w += 32;
        } else if (seed_len > 0) {
            memcpy(w, seed_bytes, (size_t)seed_len);
            w += seed_len;
        }
        memcpy(w, data + (size_t)p * step, step);
        sha256(buf, (size_t)(w - buf) + step, digest);
        uint64_t first = 0;
        for (int i = 0; i < 8; i++)
            first = first << 8 | digest[i];
        if (set_hash(hashes, p, first, packed) < 0) {
            PyMem_Free(buf);
            Py_DECREF(hashes);
            return NULL;
        }
    }
    PyMem_Free(buf);
    PyObject *last = pages > 0 ? PyBytes_FromStringAndSize((const char *)digest, 32) : Py_NewRef(seed);
    if (last == NULL) {
        Py_DECREF(hashes);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, hashes, last);
    Py_DECREF(hashes);
    Py_DECREF(last);
    return out;
}

static PyObject *chain(PyObject *const *args, Py_ssize_t nargs, int packed) {
    Py_ssize_t page, seed_len;
    PyObject *seed;
    const char *seed_bytes;
    if (chain_args(args, nargs, packed ? "block_hash_chain_packed(token_ids, page_size, seed=None)"
                                       : "block_hash_chain(token_ids, page_size, seed=None)",
                   &page, &seed, &seed_bytes, &seed_len) < 0)
        return NULL;
#if PY_LITTLE_ENDIAN
    if (!PyList_Check(args[0]) && !PyTuple_Check(args[0]) && PyObject_CheckBuffer(args[0])) {
        /* ids packed as uint32 (``token_ids.TokenIds``, an ``array`` of ``I``): hashed where they lie */
        Py_buffer view;
        if (PyObject_GetBuffer(args[0], &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        const char *f = view.format ? view.format : "B";
        if (*f == '@' || *f == '=' || *f == '<')
            f++;
        if (view.itemsize == 4 && (strcmp(f, "I") == 0 || strcmp(f, "L") == 0)) {
            PyObject *out = chain_over_bytes(view.buf, view.len, page, seed, seed_bytes, seed_len, packed);
            PyBuffer_Release(&view);
            return out;
        }
        PyBuffer_Release(&view); /* another buffer (bytes, signed ints): read as a sequence of ints, as before */
    }
#endif
    PyObject *seq = PySequence_Fast(args[0], "token_ids must be a sequence of ints");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t pages = n / page;
    PyObject *hashes = hashes_object(pages, packed);
    unsigned char *buf = PyMem_Malloc((size_t)(seed_len > 32 ? seed_len : 32) + 4 * (size_t)page);
    if (hashes == NULL || buf == NULL)
        goto fail;
    unsigned char digest[32];
    Py_ssize_t at = 0;
    for (Py_ssize_t p = 0; p < pages; p++) {
        unsigned char *w = buf;
        if (p > 0) {
            memcpy(w, digest, 32);
            w += 32;
        } else if (seed_len > 0) {  /* ``seed or b""``: an empty seed chains onto nothing, as None does */
            memcpy(w, seed_bytes, (size_t)seed_len);
            w += seed_len;
        }
        for (Py_ssize_t i = 0; i < page; i++, at++) {
            uint32_t t;
            if (token_id(items[at], &t) < 0)
                goto fail;
            w[0] = (unsigned char)t;
            w[1] = (unsigned char)(t >> 8);
            w[2] = (unsigned char)(t >> 16);
            w[3] = (unsigned char)(t >> 24);
            w += 4;
        }
        sha256(buf, (size_t)(w - buf), digest);
        uint64_t first = 0;
        for (int i = 0; i < 8; i++)
            first = first << 8 | digest[i];
        if (set_hash(hashes, p, first, packed) < 0)
            goto fail;
    }
    for (; at < n; at++) {  /* the trailing partial page is not hashed, but its ids are checked as the array's are */
        uint32_t t;
        if (token_id(items[at], &t) < 0)
            goto fail;
    }
    PyMem_Free(buf);
    Py_DECREF(seq);
    PyObject *last;
    if (pages > 0) {
        last = PyBytes_FromStringAndSize((const char *)digest, 32);
        if (last == NULL) {
            Py_DECREF(hashes);
            return NULL;
        }
    } else {
        last = Py_NewRef(seed);  /* ``parent or seed``: nothing hashed, the seed as given */
    }
    PyObject *out = PyTuple_Pack(2, hashes, last);
    Py_DECREF(hashes);
    Py_DECREF(last);
    return out;
fail:
    PyMem_Free(buf);
    Py_XDECREF(hashes);
    Py_DECREF(seq);
    return NULL;
}

static PyObject *block_hash_chain(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return chain(args, nargs, 0);
}

static PyObject *block_hash_chain_packed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return chain(args, nargs, 1);
}

static PyObject *block_hash_chain_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* The chain over ids already laid out as uint32 little-endian bytes (the simulator's stream makes them so):
       every full page of ``data`` hashed, trailing bytes left alone; the same answer as ``block_hash_chain``. */
    Py_ssize_t page, seed_len;
    PyObject *seed;
    const char *seed_bytes;
    if (chain_args(args, nargs, "block_hash_chain_bytes(data, page_size, seed=None)", &page, &seed, &seed_bytes,
                   &seed_len) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = chain_over_bytes(view.buf, view.len, page, seed, seed_bytes, seed_len, 0);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *set_backend(PyObject *self, PyObject *arg) {
    /* For the tests: "openssl" or "portable"; answers the backend now in use. */
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    if (strcmp(name, "openssl") == 0) {
        if (ossl_final == NULL)
            return PyErr_Format(PyExc_RuntimeError, "no libcrypto was found");
        use_openssl = 1;
    } else if (strcmp(name, "portable") == 0) {
        use_openssl = 0;
    } else {
        return PyErr_Format(PyExc_ValueError, "unknown backend %s", name);
    }
    return PyUnicode_FromString(use_openssl ? "openssl" : "portable");
}

static PyObject *backend(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(use_openssl ? "openssl" : "portable");
}

static PyMethodDef methods[] = {
    {"block_hash_chain", (PyCFunction)(void (*)(void))block_hash_chain, METH_FASTCALL,
     "block_hash_chain(token_ids, page_size, seed=None) -> (hashes, digest): block_hash.block_hash_chain in C."},
    {"block_hash_chain_packed", (PyCFunction)(void (*)(void))block_hash_chain_packed, METH_FASTCALL,
     "block_hash_chain_packed(token_ids, page_size, seed=None) -> (hashes, digest): the hashes as the bytes of their "
     "int64s (native order)."},
    {"block_hash_chain_bytes", (PyCFunction)(void (*)(void))block_hash_chain_bytes, METH_FASTCALL,
     "block_hash_chain_bytes(data, page_size, seed=None) -> (hashes, digest): the chain over uint32 LE bytes."},
    {"set_backend", set_backend, METH_O, "set_backend('openssl' | 'portable') -> the backend in use."},
    {"backend", backend, METH_NOARGS, "The SHA-256 in use: 'openssl' or 'portable'."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_page_hash", NULL, -1, methods};

PyMODINIT_FUNC PyInit_native_page_hash(void) {
    /* The libcrypto hashlib uses is already loaded in most processes; dlopen returns it (or loads it). */
    const char *names[] = {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so", "libcrypto.dylib", NULL};
    for (int i = 0; names[i] != NULL && ossl_final == NULL; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL)
            continue;
        ossl_init = (sha256_init_fn)dlsym(lib, "SHA256_Init");
        ossl_update = (sha256_update_fn)dlsym(lib, "SHA256_Update");
        ossl_final = (sha256_final_fn)dlsym(lib, "SHA256_Final");
        if (ossl_init == NULL || ossl_update == NULL || ossl_final == NULL)
            ossl_init = NULL, ossl_update = NULL, ossl_final = NULL;
    }
    use_openssl = ossl_final != NULL;
    return PyModule_Create(&module);
}
