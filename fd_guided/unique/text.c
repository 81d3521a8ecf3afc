/*
 * Small shared pieces of the C guard: growable byte buffers, strict UTF-8 (as Python decodes it)
 * and the hash of canonical keys.
 */
#include "native.h"

int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->size + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 64;
    while (cap < b->size + extra) cap *= 2;
    uint8_t *p = PyMem_RawRealloc(b->data, (size_t)cap);
    if (p == NULL) return -1;
    b->data = p, b->cap = cap;
    return 0;
}

int buf_put(Buf *b, const void *p, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->data + b->size, p, (size_t)n);
    b->size += n;
    return 0;
}

void buf_free(Buf *b) {
    PyMem_RawFree(b->data);
    b->data = NULL, b->size = b->cap = 0;
}

uint64_t canon_hash(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* The length of the strict UTF-8 character at p (as Python decodes: no surrogates, no
 * overlongs, at most U+10FFFF), 0 if there is none. */
int utf8_char(const uint8_t *p, const uint8_t *end) {
    const uint8_t c = p[0];
    int len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if (end - p < len || p[1] < lo || p[1] > hi) return 0;
    for (int k = 2; k < len; k++) if (p[k] < 0x80 || p[k] > 0xBF) return 0;
    return len;
}

int valid_utf8(const uint8_t *p, Py_ssize_t n) {
    const uint8_t *end = p + n;
    while (p < end) {
        int len = utf8_char(p, end);
        if (!len) return 0;
        p += len;
    }
    return 1;
}

/* The bytes object x against the concatenation a + b, over their common length (memcmp's sign):
 * 0 when one begins as the other; each caller breaks that tie by length as it needs. */
int compare_with_concat(PyObject *x, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb) {
    const uint8_t *s = (const uint8_t *)PyBytes_AS_STRING(x);
    const Py_ssize_t n = PyBytes_GET_SIZE(x), ca = n < na ? n : na;
    int c = ca ? memcmp(s, a, (size_t)ca) : 0;
    if (!c && n > na && nb) {
        const Py_ssize_t cb = n - na < nb ? n - na : nb;
        c = memcmp(s + na, b, (size_t)cb);
    }
    return c;
}
