/*
 * The uniqueness guard's per-row candidate loop in C (fd_guided.unique.native).
 *
 * `UniqueItemsGrammar.restrict` tries, after the engine filled a row, every allowed token that
 * could finish an item, each through `JsonTracker.finishes_duplicate` (Python: ~10-30 us a token,
 * tens to hundreds of tokens a row). Here the same decision is taken for the common state, a
 * guarded array of string items whose domain never runs out (`native.row_plan` says when a row is
 * in it), over many rows at once with the GIL released. The decision follows the Python
 * reference branch by branch:
 *   - inside a string item with no escape written: a token that does not go on past its quote
 *     (no `,]}` after it) and holds no backslash before its quote finishes a duplicate exactly
 *     when the item's bytes up to the quote are a used string (open items: any quote; items of a
 *     language that never runs out: only a quote that ends the token, one holding none is live);
 *   - otherwise the token's bytes are fed through a small copy of the tracker's byte machine:
 *     the item may close (checked against the used strings; its bytes must be valid UTF-8, else
 *     the tracker would key it differently), whitespace, a comma, a new string item that stays
 *     open, and, where no enclosing array is guarded, the array's and its parents' closing
 *     brackets; escapes keep an item open (one that then closes is keyed by its decoded value).
 *     Any other byte (numbers, literals, containers, an item with an escape or a second item
 *     closing) leaves the token undecided.
 * Undecided tokens are handed back; the guard asks the Python tracker about them, so every
 * decision is the reference's (tests/unique/test_native.py compares both over every candidate).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { KEEP = 0, DUPLICATE = 1, UNDECIDED = 2 };
enum { KIND_OPEN = 0, KIND_LANGUAGE = 1 }; /* language: a string language that never runs out */

typedef struct {
    const char *data;
    Py_ssize_t size;
} Text;

typedef struct {
    const int64_t *ids; /* the tokens of some classes, ascending (TokenClasses.ids) */
    Py_ssize_t size;
    int classes;
    /* the same tokens' bytes and flags packed in list order (TokenClasses.id_pointer): walking
     * the list reads memory in order, where the whole table's bytes, offsets and flags (~2 MB)
     * cost a cache miss or three per token (~30 ns each, 10 us a row for 334 tokens) */
    const char *flat;
    const int64_t *offsets; /* size + 1 */
    const uint8_t *flags;
} Candidates;

typedef struct {
    /* per row, read with the GIL held */
    uint32_t *words;
    Candidates between, after_quote; /* the tracker's finishing classes, as it picks them */
    const char *written; /* the open string item's bytes after its quote, or NULL (between items) */
    Py_ssize_t written_size;
    int phase_comma; /* between items: 1 after an item (a comma or a close next), 0 before one */
    int kind;
    int no_guarded_ancestor;
    Text *used; /* the used strings, sorted bytewise */
    Py_ssize_t num_used;
    /* out */
    int64_t *undecided;
    Py_ssize_t num_undecided;
} Row;

typedef struct {
    Py_ssize_t row_words; /* bitmask words in a row */
    const char *flat;       /* every token's bytes, one after another */
    const int64_t *offsets; /* token t: flat[offsets[t]:offsets[t + 1]] */
    Py_ssize_t num_tokens;
    const uint8_t *flags; /* TokenClasses.flags */
    uint8_t after_quote;  /* the AFTER_QUOTE flag bit */
} Table;

/* Compare the two-piece key a + b with stored text t, bytewise (memcmp order). */
static int compare2(const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb, const Text *t) {
    Py_ssize_t common = na < t->size ? na : t->size;
    int c = memcmp(a, t->data, (size_t)common);
    if (c) return c;
    if (na > t->size) return 1;
    Py_ssize_t rest = t->size - na;
    common = nb < rest ? nb : rest;
    c = memcmp(b, t->data + na, (size_t)common);
    if (c) return c;
    return (na + nb > t->size) - (na + nb < t->size);
}

static int is_used(const Row *row, const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb) {
    Py_ssize_t lo = 0, hi = row->num_used;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        int c = compare2(a, na, b, nb, &row->used[mid]);
        if (c == 0) return 1;
        if (c < 0) hi = mid; else lo = mid + 1;
    }
    return 0;
}

/* Strict UTF-8 (as Python decodes it: no surrogates, no overlongs, <= U+10FFFF) of a + b. */
static int valid_utf8(const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb) {
    const Py_ssize_t n = na + nb;
#define AT(i) ((unsigned char)((i) < na ? a[(i)] : b[(i) - na]))
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = AT(i);
        if (c < 0x80) { i++; continue; }
        int len; unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return 0;
        if (i + len > n) return 0;
        if (AT(i + 1) < lo || AT(i + 1) > hi) return 0;
        for (int k = 2; k < len; k++) if (AT(i + k) < 0x80 || AT(i + k) > 0xBF) return 0;
        i += len;
    }
#undef AT
    return 1;
}

static int ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The tracker's `feed` over one token, for the states this module takes (see the top). */
static int feed(const Row *row, const unsigned char *d, Py_ssize_t n) {
    int mode_string = row->written != NULL, phase_comma = row->phase_comma, closed = 0, finished = 0;
    int escape = 0, escaped = 0; /* escape: 1 after a backslash, 2..5 inside \uXXXX */
    /* the item being written: prefix (bytes before this token) + d[from:i] */
    const char *prefix = row->written;
    Py_ssize_t prefix_size = row->written_size, from = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char c = d[i];
        if (mode_string) {
            /* escapes as the tracker reads them: \uXXXX takes four more bytes, others one */
            if (escape == 1) { escape = c == 'u' ? 2 : 0; continue; }
            if (escape) { escape = escape == 5 ? 0 : escape + 1; continue; }
            if (c == '\\') { escape = 1, escaped = 1; continue; }
            if (c != '"') continue;
            /* an item holding an escape is keyed by its decoded value; a second item ending in
             * this token is judged against the first too: both left to the tracker */
            if (escaped || finished) return UNDECIDED;
            const char *part = (const char *)d + from;
            if (!valid_utf8(prefix, prefix_size, part, i - from)) return UNDECIDED;
            if (is_used(row, prefix, prefix_size, part, i - from)) return DUPLICATE;
            finished = 1;
            mode_string = 0;
            phase_comma = 1;
            continue;
        }
        if (ws(c)) continue;
        if (closed) {
            if (c == ',' || c == ']' || c == '}') continue; /* the parents' members and brackets */
            return UNDECIDED;
        }
        if (c == ',' && phase_comma) {
            phase_comma = 0;
        } else if (c == '"' && !phase_comma) {
            mode_string = 1; /* a new item: live while it stays open (its domain never runs out) */
            prefix = "", prefix_size = 0, from = i + 1, escaped = 0;
        } else if ((c == ']' || c == '}') && row->no_guarded_ancestor) {
            closed = 1;
        } else {
            return UNDECIDED;
        }
    }
    return KEEP;
}

/* Token bytes d[0:n] with class flags `flags` (see `try_token` for where they are read). */
static int decide(const Row *row, const Table *table, const unsigned char *d, Py_ssize_t n, uint8_t flags) {
    if (row->written != NULL) {
        const unsigned char *q = memchr(d, '"', (size_t)n);
        const Py_ssize_t quote = q ? q - d : -1;
        const int backslash = memchr(d, '\\', (size_t)n) != NULL;
        if (row->kind == KIND_LANGUAGE) {
            if (!backslash && quote < 0) return KEEP;
            if (!backslash && quote == n - 1)
                return is_used(row, row->written, row->written_size, (const char *)d, quote) ? DUPLICATE : KEEP;
        } else if (!(flags & table->after_quote)) {
            if (quote < 0) return KEEP;
            if (!memchr(d, '\\', (size_t)quote))
                return is_used(row, row->written, row->written_size, (const char *)d, quote) ? DUPLICATE : KEEP;
        }
    }
    return feed(row, d, n);
}

/* Does a used string begin with the open item's bytes? (Else no token but one that ends it and
 * goes on can finish a duplicate: `JsonTracker.finishing_classes`.) */
static int prefix_of_used(const Row *row) {
    Py_ssize_t lo = 0, hi = row->num_used;
    while (lo < hi) { /* the first used string >= written */
        Py_ssize_t mid = (lo + hi) / 2;
        if (compare2(row->written, row->written_size, "", 0, &row->used[mid]) > 0) lo = mid + 1; else hi = mid;
    }
    return lo < row->num_used && row->used[lo].size >= row->written_size &&
           memcmp(row->used[lo].data, row->written, (size_t)row->written_size) == 0;
}

static void try_token(Row *row, const Table *table, int64_t token, const unsigned char *d, Py_ssize_t n,
                      uint8_t flags) {
    uint32_t *word = &row->words[token >> 5];
    const uint32_t bit = 1u << (token & 31);
    if (!(*word & bit)) return;
    switch (decide(row, table, d, n, flags)) {
    case DUPLICATE: *word &= ~bit; break;
    case UNDECIDED: row->undecided[row->num_undecided++] = token; break;
    default: break;
    }
}

static void run_row(Row *row, const Table *table) {
    const Candidates *c = row->written != NULL && !prefix_of_used(row) ? &row->after_quote : &row->between;
    row->num_undecided = 0;
    /* Walk whichever is shorter without counting the row's bits first: a popcount over a 129k
     * row (4,040 words, a libgcc call each without -mpopcnt) cost ~7 us a row, more than the
     * engine's own fill inside a string. A short class list (inside a string: the tokens that
     * end it, a few dozen to a few hundred) is walked in order, its bytes packed beside it; a
     * long one (between items: most tokens hold a structural byte) by the row's set bits, which
     * are few there, reading the whole table's bytes. */
    if (c->size > table->row_words / 4) {
        for (Py_ssize_t w = 0; w < table->row_words; w++)
            for (uint32_t bits = row->words[w]; bits; bits &= bits - 1) {
                const int64_t token = (int64_t)w * 32 + __builtin_ctz(bits);
                if (token >= table->num_tokens || !(table->flags[token] & c->classes)) continue;
                const int64_t at = table->offsets[token];
                try_token(row, table, token, (const unsigned char *)table->flat + at,
                          (Py_ssize_t)(table->offsets[token + 1] - at), table->flags[token]);
            }
    } else {
        const Py_ssize_t limit = table->row_words * 32 < table->num_tokens ? table->row_words * 32 : table->num_tokens;
        for (Py_ssize_t k = 0; k < c->size; k++) {
            if (c->ids[k] < 0 || c->ids[k] >= limit) continue;
            const int64_t at = c->offsets[k];
            try_token(row, table, c->ids[k], (const unsigned char *)c->flat + at,
                      (Py_ssize_t)(c->offsets[k + 1] - at), c->flags[k]);
        }
    }
}

/* ---- Python entry point ------------------------------------------------------------------ */

static void free_rows(Row *rows, Py_ssize_t n) {
    for (Py_ssize_t r = 0; r < n; r++) {
        PyMem_RawFree(rows[r].used);
        PyMem_RawFree(rows[r].undecided);
    }
    PyMem_RawFree(rows);
}

/* One candidate list as `TokenClasses.id_pointer` packs it: six little-endian int64 (the ids'
 * address, their count, the classes, and the addresses of their packed bytes, offsets, flags). */
typedef struct {
    int64_t ids, size, classes, flat, offsets, flags;
} PackedCandidates;

static int read_candidates(PyObject *packed, Candidates *out) {
    PackedCandidates p;
    if (!PyBytes_Check(packed) || PyBytes_GET_SIZE(packed) != (Py_ssize_t)sizeof p) {
        PyErr_SetString(PyExc_TypeError, "a candidate list must be 48 packed bytes (TokenClasses.id_pointer)");
        return -1;
    }
    memcpy(&p, PyBytes_AS_STRING(packed), sizeof p);
    *out = (Candidates){(const int64_t *)(uintptr_t)p.ids, (Py_ssize_t)p.size, (int)p.classes,
                        (const char *)(uintptr_t)p.flat, (const int64_t *)(uintptr_t)p.offsets,
                        (const uint8_t *)(uintptr_t)p.flags};
    return 0;
}

/* A row read straight from its 8-tuple (no format string: PyArg_ParseTuple's 19 fields cost
 * ~0.4 us a row, a quarter of llguidance's own fill of one). */
static int read_row(PyObject *item, Row *row, char *base, Py_ssize_t row_stride, Py_ssize_t num_rows) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 8) {
        PyErr_SetString(PyExc_TypeError, "a row must be (row, written, phase_comma, kind, no_guarded_ancestor, "
                                         "used, between, after_quote)");
        return -1;
    }
    const Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
    const long phase_comma = PyLong_AsLong(PyTuple_GET_ITEM(item, 2));
    const long kind = PyLong_AsLong(PyTuple_GET_ITEM(item, 3));
    const long no_guarded_ancestor = PyLong_AsLong(PyTuple_GET_ITEM(item, 4));
    if (PyErr_Occurred()) return -1;
    if (index < 0 || index >= num_rows) {
        PyErr_SetString(PyExc_IndexError, "row index outside the bitmask");
        return -1;
    }
    PyObject *written = PyTuple_GET_ITEM(item, 1), *used = PyTuple_GET_ITEM(item, 5);
    if (written != Py_None && !PyBytes_Check(written)) {
        PyErr_SetString(PyExc_TypeError, "written must be bytes or None");
        return -1;
    }
    if (!PyTuple_Check(used)) {
        PyErr_SetString(PyExc_TypeError, "used must be a tuple of bytes");
        return -1;
    }
    if (read_candidates(PyTuple_GET_ITEM(item, 6), &row->between) < 0 ||
        read_candidates(PyTuple_GET_ITEM(item, 7), &row->after_quote) < 0)
        return -1;
    row->words = (uint32_t *)(base + index * row_stride);
    row->written = written == Py_None ? NULL : PyBytes_AS_STRING(written);
    row->written_size = written == Py_None ? 0 : PyBytes_GET_SIZE(written);
    row->phase_comma = (int)phase_comma, row->kind = (int)kind, row->no_guarded_ancestor = (int)no_guarded_ancestor;
    row->num_used = PyTuple_GET_SIZE(used);
    row->used = PyMem_RawMalloc(sizeof(Text) * (size_t)(row->num_used + 1));
    /* a token is tried only if it is in the chosen class list (walked, or smaller than the row's
     * allowed tokens when the bits are walked): at most the larger list's size */
    const Py_ssize_t n_between = row->between.size, n_after = row->after_quote.size;
    const Py_ssize_t most = n_between > n_after ? n_between : n_after;
    row->undecided = PyMem_RawMalloc(sizeof(int64_t) * (size_t)((most > 0 ? most : 0) + 1));
    if (row->used == NULL || row->undecided == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < row->num_used; k++) {
        PyObject *text = PyTuple_GET_ITEM(used, k);
        if (!PyBytes_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "used strings must be bytes");
            return -1;
        }
        row->used[k].data = PyBytes_AS_STRING(text);
        row->used[k].size = PyBytes_GET_SIZE(text);
    }
    return 0;
}

PyDoc_STRVAR(restrict_doc,
    "restrict(flat, offsets_ptr, num_tokens, flags_ptr, after_quote, words_ptr, row_stride, row_words,\n"
    "         num_rows, rows) -> list[list[int]]\n"
    "--\n\n"
    "Clear, in each row of the bitmask (uint32 words at words_ptr, row_stride words apart, row_words\n"
    "each), the allowed candidate tokens that finish a duplicate item; return per row the candidates\n"
    "it could not decide (the caller asks the Python tracker). flat: every token's bytes joined;\n"
    "offsets_ptr: int64[num_tokens + 1]; flags_ptr: uint8 token classes; rows: (row, written,\n"
    "phase_comma, kind, no_guarded_ancestor, used, between, after_quote) with `used` the used strings\n"
    "sorted and each candidate list six packed int64 (ids_ptr, n, classes, flat_ptr, offsets_ptr,\n"
    "flags_ptr): the ids and their bytes and flags in list order. Pointers must stay valid (the caller holds\n"
    "the arrays). The GIL is released over the rows.");

static PyObject *restrict_rows(PyObject *self, PyObject *args) {
    const char *flat;
    Py_ssize_t flat_size, num_tokens;
    unsigned long long offsets, flags;
    unsigned long long words;
    Py_ssize_t row_stride, row_words, num_rows;
    int after_quote;
    PyObject *items;
    if (!PyArg_ParseTuple(args, "y#KnKiKnnnO!", &flat, &flat_size, &offsets, &num_tokens, &flags, &after_quote,
                          &words, &row_stride, &row_words, &num_rows, &PyList_Type, &items))
        return NULL;
    const Table table = {row_words, flat, (const int64_t *)(uintptr_t)offsets, num_tokens,
                         (const uint8_t *)(uintptr_t)flags, (uint8_t)after_quote};
    const Py_ssize_t n = PyList_GET_SIZE(items);
    Row *rows = PyMem_RawCalloc((size_t)(n + 1), sizeof(Row));
    if (rows == NULL) return PyErr_NoMemory();
    for (Py_ssize_t r = 0; r < n; r++) {
        if (read_row(PyList_GET_ITEM(items, r), &rows[r], (char *)(uintptr_t)words, row_stride * 4, num_rows) < 0) {
            free_rows(rows, n);
            return NULL;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < n; r++) run_row(&rows[r], &table);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New(n);
    for (Py_ssize_t r = 0; out != NULL && r < n; r++) {
        PyObject *left = PyList_New(rows[r].num_undecided);
        if (left == NULL) {
            Py_CLEAR(out);
            break;
        }
        for (Py_ssize_t k = 0; k < rows[r].num_undecided; k++)
            PyList_SET_ITEM(left, k, PyLong_FromLongLong(rows[r].undecided[k]));
        PyList_SET_ITEM(out, r, left);
    }
    free_rows(rows, n);
    return out;
}

static PyMethodDef methods[] = {
    {"restrict", restrict_rows, METH_VARARGS, restrict_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "The uniqueness guard's candidate loop in C (see fd_guided.unique.native).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
