/* HTTP/1.1 heads of the common shape, read in one call (``http_head.py`` says what the shape is and who uses it).

   request_head(buf)  -> None (no "\r\n\r\n" yet) | False (another shape) |
                         (method: bytes, target: str, headers: dict, head_len: int, keep_alive: bool)
   response_head(buf) -> None | False | (status: int, headers: dict, head_len: int, keep_alive: bool); a response
                         of the common shape has a Content-Length and a status that allows a body (not 1xx,
                         204, 304)

   headers: names in lower case -> values (latin-1), each name once (a repeated name is another shape); a
   Content-Length of digits only; no Transfer-Encoding (both are llhttp's to judge). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static int is_tchar(unsigned char c) {
    /* RFC 9110 token characters */
    if (c >= 'a' && c <= 'z') return 1;
    if (c >= 'A' && c <= 'Z') return 1;
    if (c >= '0' && c <= '9') return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Methods llhttp knows that the router may serve; any other is llhttp's to judge. */
static int known_method(const unsigned char *m, Py_ssize_t n) {
    static const char *known[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", NULL};
    for (int i = 0; known[i] != NULL; i++) {
        if ((Py_ssize_t)strlen(known[i]) == n && memcmp(known[i], m, n) == 0) return 1;
    }
    return 0;
}

/* Where the head ends ("\r\n\r\n" included), or -1. */
static Py_ssize_t head_end(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 3; i < n; i++) {
        if (p[i] == '\n' && p[i - 1] == '\r' && p[i - 2] == '\n' && p[i - 3] == '\r') return i + 1;
    }
    return -1;
}

/* Does a comma-separated header value hold ``token`` (case-insensitive, spaces around items ignored)? */
static int has_token(const unsigned char *v, Py_ssize_t n, const char *token) {
    Py_ssize_t tl = (Py_ssize_t)strlen(token), i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t')) i++;
        Py_ssize_t s = i;
        while (i < n && v[i] != ',') i++;
        Py_ssize_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
        if (e - s == tl) {
            Py_ssize_t k = 0;
            while (k < tl && (v[s + k] | 0x20) == token[k]) k++;
            if (k == tl) return 1;
        }
        i++;
    }
    return 0;
}

/* Header lines from ``p`` (just after the first line's CRLF) to ``end`` (just after the blank line's CRLF) into
   ``headers``. Returns 1, 0 for another shape, -1 on a Python error. ``close``/``upgrade``: the Connection header's
   tokens. */
static int read_headers(const unsigned char *p, const unsigned char *end, PyObject *headers, int *close,
                        int *upgrade) {
    char name[256];
    while (p < end - 2) { /* the last two bytes are the blank line's CRLF */
        const unsigned char *s = p;
        while (p < end && is_tchar(*p)) p++;
        Py_ssize_t nl = p - s;
        if (nl == 0 || nl >= (Py_ssize_t)sizeof(name) || p >= end || *p != ':') return 0;
        for (Py_ssize_t k = 0; k < nl; k++) {
            unsigned char c = s[k];
            name[k] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        }
        p++;
        while (p < end && (*p == ' ' || *p == '\t')) p++;
        const unsigned char *v = p;
        while (p < end && *p != '\r') {
            if (*p != '\t' && (*p < 0x20 || *p > 0x7e)) return 0; /* controls, obs-text, a bare LF */
            p++;
        }
        if (p + 1 >= end || p[1] != '\n') return 0;
        Py_ssize_t vl = p - v;
        if (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) return 0; /* trailing space: another shape */
        p += 2;
        PyObject *key = PyUnicode_DecodeLatin1(name, nl, NULL);
        if (key == NULL) return -1;
        int seen = PyDict_Contains(headers, key);
        if (seen != 0) {
            Py_DECREF(key);
            return seen < 0 ? -1 : 0;
        }
        PyObject *value = PyUnicode_DecodeLatin1((const char *)v, vl, NULL);
        if (value == NULL || PyDict_SetItem(headers, key, value) < 0) {
            Py_DECREF(key);
            Py_XDECREF(value);
            return -1;
        }
        Py_DECREF(key);
        Py_DECREF(value);
        if (nl == 14 && memcmp(name, "content-length", 14) == 0) {
            Py_ssize_t k = 0;
            while (k < vl && v[k] >= '0' && v[k] <= '9') k++;
            if (k == 0 || k != vl) return 0; /* llhttp's error, not a length */
        }
        if (nl == 17 && memcmp(name, "transfer-encoding", 17) == 0) return 0; /* llhttp's rules */
        if (nl == 10 && memcmp(name, "connection", 10) == 0) {
            *close = has_token(v, vl, "close");
            *upgrade = has_token(v, vl, "upgrade");
        }
    }
    return p == end - 2 ? 1 : 0;
}

/* The header lines from ``start`` as a dict (*headers), and whether Connection says close. Returns 1, 0 for another
   shape (Connection: upgrade included), -1 on a Python error. */
static int header_dict(const unsigned char *start, const unsigned char *end, PyObject **headers, int *close) {
    int upgrade = 0;
    *headers = PyDict_New();
    if (*headers == NULL) return -1;
    int ok = read_headers(start, end, *headers, close, &upgrade);
    if (ok <= 0 || upgrade) {
        Py_CLEAR(*headers);
        return ok < 0 ? -1 : 0;
    }
    return 1;
}

/* A request head of the common shape in p[0:n] (n: where "\r\n\r\n" ends): the tuple, False, or NULL. */
static PyObject *read_request(const unsigned char *p, Py_ssize_t n) {
    const unsigned char *end = p + n, *m = p;
    while (m < end && *m >= 'A' && *m <= 'Z') m++;
    Py_ssize_t ml = m - p;
    if (ml == 0 || *m != ' ' || !known_method(p, ml)) return Py_NewRef(Py_False);
    const unsigned char *t = m + 1, *q = t;
    if (*t != '/') return Py_NewRef(Py_False); /* origin form only */
    while (q < end && *q > 0x20 && *q < 0x7f) q++;
    if (q == t || end - q < 11 || memcmp(q, " HTTP/1.1\r\n", 11) != 0) return Py_NewRef(Py_False);
    PyObject *headers;
    int close = 0, ok = header_dict(q + 11, end, &headers, &close);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_False);
    return Py_BuildValue("(y#NNnO)", (const char *)p, ml, PyUnicode_DecodeLatin1((const char *)t, q - t, NULL),
                         headers, n, close ? Py_False : Py_True);
}

/* A response head of the common shape in p[0:n]: the tuple, False, or NULL. */
static PyObject *read_response(const unsigned char *p, Py_ssize_t n) {
    const unsigned char *end = p + n;
    /* "HTTP/1.1 DDD reason\r\n", the reason of printable characters */
    if (n < 17 || memcmp(p, "HTTP/1.1 ", 9) != 0) return Py_NewRef(Py_False);
    if (p[9] < '1' || p[9] > '5' || p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9')
        return Py_NewRef(Py_False);
    int status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    if (status < 200 || status == 204 || status == 304) return Py_NewRef(Py_False); /* no body by rule: llhttp's */
    const unsigned char *q = p + 12;
    if (*q == ' ') {
        q++;
        while (q < end && *q != '\r') {
            if (*q != '\t' && (*q < 0x20 || *q > 0x7e)) return Py_NewRef(Py_False);
            q++;
        }
    }
    if (q + 1 >= end || q[0] != '\r' || q[1] != '\n') return Py_NewRef(Py_False);
    PyObject *headers;
    int close = 0, ok = header_dict(q + 2, end, &headers, &close);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_False);
    if (PyDict_GetItemString(headers, "content-length") == NULL) { /* a body until the connection closes: llhttp's */
        Py_DECREF(headers);
        return Py_NewRef(Py_False);
    }
    return Py_BuildValue("(iNnO)", status, headers, n, close ? Py_False : Py_True);
}

/* ``read`` on the buffer ``arg`` once its head is complete; None before. */
static PyObject *read_head(PyObject *arg, PyObject *(*read)(const unsigned char *, Py_ssize_t)) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = head_end(view.buf, view.len);
    PyObject *out = n < 0 ? Py_NewRef(Py_None) : read(view.buf, n);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *request_head(PyObject *self, PyObject *arg) { return read_head(arg, read_request); }

static PyObject *response_head(PyObject *self, PyObject *arg) { return read_head(arg, read_response); }

static PyMethodDef methods[] = {
    {"request_head", request_head, METH_O, "A request head of the common shape, None (incomplete) or False."},
    {"response_head", response_head, METH_O, "A response head of the common shape, None (incomplete) or False."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "native_http_head", NULL, -1, methods};

PyMODINIT_FUNC PyInit_native_http_head(void) { return PyModule_Create(&module); }
