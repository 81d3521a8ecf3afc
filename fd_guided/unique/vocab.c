/*
 * `Vocab`: one tokenizer's tokens as the C guard reads them (built once per `TokenClasses`).
 *
 * Besides the bytes and class flags: per class mask (the classes `JsonTracker` says may finish
 * an item in a state) a bitmap of the tokens holding one, ANDed with a row to walk only those
 * the engine allows, and for the short ones the same as a list; per token a shape (what it can do
 * whatever the state: `native.h` SH_*) and its first quote; and the quote tokens sorted by the
 * bytes before their quote, so the tokens that would close a string item as a used string are
 * found by lookup, not by trying each.
 */
#include "native.h"

static int ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int number_byte(uint8_t c) { return (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E'; }

/* Between values (the tracker in no scalar, any frame), a token that is whitespace and commas,
 * then at most the start of one value that stays open: a string without its closing quote or a
 * backslash, a number, "{" and a key begun, or "[". Nothing in it ends a value, starts a literal
 * or closes a container: it finishes no item wherever the generic walk meets it. */
static int harmless_between(const uint8_t *d, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && (ws(d[i]) || d[i] == ',')) i++;
    if (i == n) return 1;
    const uint8_t c = d[i++];
    if (c == '"') {
        for (; i < n; i++) if (d[i] == '"' || d[i] == '\\') return 0;
        return 1;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        for (; i < n; i++) if (!number_byte(d[i])) return 0;
        return 1;
    }
    if (c == '{') {
        while (i < n && ws(d[i])) i++;
        if (i == n) return 1;
        if (d[i++] != '"') return 0;
        for (; i < n; i++) if (d[i] == '"' || d[i] == '\\') return 0;
        return 1;
    }
    if (c == '[') {
        while (i < n && ws(d[i])) i++;
        return i == n;
    }
    return 0;
}

/* the bytes before token t's first quote */
static int only_closing(const uint8_t *d, Py_ssize_t i, Py_ssize_t n) {
    for (; i < n; i++) if (!ws(d[i]) && d[i] != ',' && d[i] != ']' && d[i] != '}') return 0;
    return 1;
}

/* From d[i]: whitespace, at most one comma, at most a string begun (no quote or backslash). */
static int opens_at_most_a_string(const uint8_t *d, Py_ssize_t i, Py_ssize_t n) {
    while (i < n && ws(d[i])) i++;
    if (i < n && d[i] == ',') for (i++; i < n && ws(d[i]); i++) {}
    if (i < n && d[i] == '"') for (i++; i < n; i++) if (d[i] == '"' || d[i] == '\\') return 0;
    return i == n;
}

/* After the quote at d[q]: its simple tails (SH_TAIL_*), 0 if none. */
static int tail_shape(const uint8_t *d, Py_ssize_t n, Py_ssize_t q) {
    Py_ssize_t i = q + 1;
    while (i < n && ws(d[i])) i++;
    if (i == n) return SH_TAIL_OPEN | SH_TAIL_WS;
    if (d[i] == ']') return only_closing(d, i, n) ? SH_TAIL_CLOSE : 0;
    if (d[i] == '}') {
        int shape = only_closing(d, i, n) ? SH_TAIL_CLOSE : 0;
        Py_ssize_t k = i + 1;
        while (k < n && ws(d[k])) k++;
        if (k < n && d[k] == ']' && only_closing(d, k, n)) shape |= SH_TAIL_ITEM_CLOSE;
        if (k == n) return shape | SH_TAIL_ITEM;
        if (d[k] == ',') { /* then at most an object item begun, with a key begun */
            for (k++; k < n && ws(d[k]); k++) {}
            if (k == n) return shape | SH_TAIL_ITEM;
            if (d[k] == '{') {
                for (k++; k < n && ws(d[k]); k++) {}
                if (k == n || (d[k] == '"' && opens_at_most_a_string(d, k, n))) shape |= SH_TAIL_ITEM;
            }
        }
        return shape;
    }
    return opens_at_most_a_string(d, i, n) ? SH_TAIL_OPEN : 0;
}

static int clean(const uint8_t *d, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) if (d[i] < 0x20) return 0;
    return valid_utf8(d, n);
}

static void prefix_of(const Vocab *v, int32_t t, const uint8_t **p, Py_ssize_t *n) {
    *p = v->flat + v->offsets[t];
    *n = v->quote_at[t];
}

static int compare_tokens(const Vocab *v, int32_t a, int32_t b) {
    const Py_ssize_t na = v->offsets[a + 1] - v->offsets[a], nb = v->offsets[b + 1] - v->offsets[b];
    const int c = memcmp(v->flat + v->offsets[a], v->flat + v->offsets[b], (size_t)(na < nb ? na : nb));
    return c ? c : (na > nb) - (na < nb);
}

static int compare_prefix(const Vocab *v, int32_t a, int32_t b) {
    const uint8_t *pa, *pb;
    Py_ssize_t na, nb;
    prefix_of(v, a, &pa, &na), prefix_of(v, b, &pb, &nb);
    const int c = memcmp(pa, pb, (size_t)(na < nb ? na : nb));
    return c ? c : (na > nb) - (na < nb);
}

/* Merge sort of token ids, by the bytes before their quote (`whole`: by all their bytes). */
static void sort_by_prefix(const Vocab *v, int32_t *a, int32_t *tmp, Py_ssize_t n, int whole) {
    if (n < 2) return;
    const Py_ssize_t half = n / 2;
    sort_by_prefix(v, a, tmp, half, whole);
    sort_by_prefix(v, a + half, tmp, n - half, whole);
    Py_ssize_t i = 0, k = half, out = 0;
    while (i < half && k < n)
        tmp[out++] = (whole ? compare_tokens(v, a[i], a[k]) : compare_prefix(v, a[i], a[k])) <= 0 ? a[i++] : a[k++];
    while (i < half) tmp[out++] = a[i++];
    while (k < n) tmp[out++] = a[k++];
    memcpy(a, tmp, sizeof(int32_t) * (size_t)n);
}

static void vocab_dealloc(Vocab *v) {
    PyMem_RawFree(v->flat), PyMem_RawFree(v->offsets), PyMem_RawFree(v->flags);
    PyMem_RawFree(v->shape), PyMem_RawFree(v->quote_at), PyMem_RawFree(v->by_prefix), PyMem_RawFree(v->look_between);
    PyMem_RawFree(v->rank);
    for (int m = 0; m < NUM_MASKS; m++) PyMem_RawFree(v->maps[m]), PyMem_RawFree(v->lists[m].ids);
    for (int k = 0; k < 24; k++) PyMem_RawFree(v->quotes[k / 8][k / 2 % 4][k % 2].ids);
    Py_TYPE(v)->tp_free((PyObject *)v);
}

static int build(Vocab *v) {
    const Py_ssize_t n = v->num_tokens, words = v->words;
    v->shape = PyMem_RawCalloc((size_t)n + 1, sizeof(uint16_t));
    v->quote_at = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n + 1));
    v->by_prefix = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n + 1));
    int32_t *tmp = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n + 1));
    for (int m = 1; m < NUM_MASKS; m++) v->maps[m] = PyMem_RawCalloc((size_t)words + 1, sizeof(uint32_t));
    v->look_between = PyMem_RawCalloc((size_t)words + 1, sizeof(uint32_t));
    int ok = v->shape && v->quote_at && v->by_prefix && tmp && v->look_between;
    for (int m = 1; m < NUM_MASKS; m++) ok = ok && v->maps[m];
    if (!ok) {
        PyMem_RawFree(tmp);
        return -1;
    }
    for (Py_ssize_t t = 0; t < n; t++) {
        const uint8_t *d = v->flat + v->offsets[t];
        const Py_ssize_t len = (Py_ssize_t)(v->offsets[t + 1] - v->offsets[t]);
        const uint8_t *q = len ? memchr(d, '"', (size_t)len) : NULL;
        const int32_t quote = q ? (int32_t)(q - d) : -1;
        const int backslash = len && memchr(d, '\\', (size_t)len) != NULL;
        const int backslash_before = quote > 0 && memchr(d, '\\', (size_t)quote) != NULL;
        uint16_t shape = backslash ? SH_BACKSLASH : 0;
        if (quote >= 0 && !backslash_before && !(v->flags[t] & C_AFTER_QUOTE)) shape |= SH_SIMPLE_OPEN;
        if (quote == len - 1 && !backslash) shape |= SH_SIMPLE_LANG;
        if (len && harmless_between(d, len)) shape |= SH_HARMLESS_NONE;
        if (quote < 0) shape |= SH_NO_QUOTE;
        if (quote >= 0 && !backslash_before) {
            shape |= (uint16_t)tail_shape(d, len, quote);
            if (clean(d, quote)) shape |= SH_PREFIX_CLEAN;
            if (quote > v->longest_prefix) v->longest_prefix = quote;
        }
        v->shape[t] = shape, v->quote_at[t] = quote;
        if (quote >= 0 && !backslash_before) v->by_prefix[v->n_by_prefix++] = (int32_t)t;
        for (int m = 1; m < NUM_MASKS; m++)
            if (v->flags[t] & m) v->maps[m][t >> 5] |= 1u << (t & 31);
        if ((v->flags[t] & C_STRUCTURAL) && !(shape & SH_HARMLESS_NONE)) v->look_between[t >> 5] |= 1u << (t & 31);
    }
    sort_by_prefix(v, v->by_prefix, tmp, v->n_by_prefix, 0);
    v->rank = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n + 1));
    int32_t *order = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)n + 1));
    if (v->rank == NULL || order == NULL) {
        PyMem_RawFree(tmp), PyMem_RawFree(order);
        return -1;
    }
    for (Py_ssize_t t = 0; t < n; t++) order[t] = (int32_t)t;
    sort_by_prefix(v, order, tmp, n, 1);
    for (Py_ssize_t k = 0; k < n; k++) v->rank[order[k]] = (int32_t)k;
    PyMem_RawFree(order);
    PyMem_RawFree(tmp);
    Py_ssize_t at = 0; /* buckets by first byte (0: the empty prefix, sorted first; b + 1: byte b) */
    for (int c = 0; c < 258; c++) {
        while (at < v->n_by_prefix) {
            const int32_t t = v->by_prefix[at];
            if ((v->quote_at[t] ? v->flat[v->offsets[t]] + 1 : 0) >= c) break;
            at++;
        }
        v->by_first[c] = (int32_t)at;
    }
    for (int m = 1; m < NUM_MASKS; m++) {
        Py_ssize_t count = 0;
        for (Py_ssize_t w = 0; w < words; w++) count += __builtin_popcount(v->maps[m][w]);
        if (count > LIST_MAX) continue;
        v->lists[m].ids = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)count + 1));
        if (v->lists[m].ids == NULL) return -1;
        for (Py_ssize_t w = 0; w < words; w++)
            for (uint32_t bits = v->maps[m][w]; bits; bits &= bits - 1)
                v->lists[m].ids[v->lists[m].n++] = (int32_t)(w * 32 + __builtin_ctz(bits));
    }
    static const int masks[4] = {C_QUOTE, C_QUOTE | C_CLOSE, C_AFTER_QUOTE, C_AFTER_QUOTE | C_CLOSE};
    static const int simples[3] = {SH_SIMPLE_OPEN, SH_SIMPLE_LANG, 0};
    static const int tails[3] = {SH_TAIL_OPEN | SH_TAIL_CLOSE, SH_TAIL_OPEN | SH_TAIL_CLOSE, SH_TAIL_OPEN | SH_TAIL_ITEM | SH_TAIL_ITEM_CLOSE};
    for (int kind = 0; kind < 3; kind++)
        for (int m = 0; m < 4; m++)
            for (int tail = 0; tail < 2; tail++) {
                const IdList *all = &v->lists[masks[m]];
                IdList *out = &v->quotes[kind][m][tail];
                if (all->ids == NULL || (out->ids = PyMem_RawMalloc(sizeof(int32_t) * ((size_t)all->n + 1))) == NULL)
                    return -1;
                for (Py_ssize_t k = 0; k < all->n; k++) {
                    const uint16_t shape = v->shape[all->ids[k]];
                    if (!(shape & (simples[kind] | SH_NO_QUOTE)) && !(shape & tails[kind]) == !tail)
                        out->ids[out->n++] = all->ids[k];
                }
            }
    return 0;
}

static PyObject *vocab_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    const char *flat, *offsets, *flags;
    Py_ssize_t flat_size, offsets_size, flags_size;
    static char *names[] = {"flat", "offsets", "flags", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y#y#y#", names, &flat, &flat_size, &offsets, &offsets_size, &flags,
                                     &flags_size))
        return NULL;
    const Py_ssize_t n = flags_size;
    if (offsets_size != (Py_ssize_t)sizeof(int64_t) * (n + 1) || n >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "offsets must be int64[len(flags) + 1]");
        return NULL;
    }
    Vocab *v = (Vocab *)type->tp_alloc(type, 0);
    if (v == NULL) return NULL;
    v->num_tokens = n, v->words = (n + 31) / 32;
    v->flat = PyMem_RawMalloc((size_t)flat_size + 1);
    v->offsets = PyMem_RawMalloc((size_t)offsets_size);
    v->flags = PyMem_RawMalloc((size_t)n + 1);
    if (v->flat == NULL || v->offsets == NULL || v->flags == NULL) goto nomem;
    memcpy(v->flat, flat, (size_t)flat_size), memcpy(v->offsets, offsets, (size_t)offsets_size);
    memcpy(v->flags, flags, (size_t)n);
    for (Py_ssize_t t = 0; t < n; t++)
        if (v->offsets[t] < 0 || v->offsets[t] > v->offsets[t + 1] || v->offsets[t + 1] > flat_size) {
            Py_DECREF(v);
            PyErr_SetString(PyExc_ValueError, "offsets must rise within flat");
            return NULL;
        }
    if (build(v) == 0) return (PyObject *)v;
nomem:
    Py_DECREF(v);
    return PyErr_NoMemory();
}

PyTypeObject VocabType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fd_guided.unique._native.Vocab",
    .tp_basicsize = sizeof(Vocab),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Vocab(flat, offsets, flags): one tokenizer's tokens as the C guard reads them.",
    .tp_new = vocab_new,
    .tp_dealloc = (destructor)vocab_dealloc,
};
