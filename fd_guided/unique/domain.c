/*
 * `Domain`: a finite item domain's spellings (sorted, as `Unique.domain`), made once per domain and
 * shared read-mostly by every row of every request whose guarded array takes its items from it.
 *
 * Inside an item, the reference tries every allowed token: one without a backslash whose quote,
 * if any, is its last byte is kept exactly when an unused spelling begins with the item's bytes
 * `w` and then the token's. That splits in two: which spellings of the whole domain begin with
 * w + token (a range of them: the same for every row with that `w`), and whether one of that range
 * is unused (the row's: `Plan.counts`, the unused spellings before each index). So the first
 * part is cached per (w, token) here, found on the first row that needs it: a row's allowed token
 * then costs one probe and two reads, not a search among the unused spellings, and no row reads
 * the spellings' bytes objects. Other tokens (a backslash, a quote before the end) are marked for
 * the machine. The cache is bounded (`MAX_ENTRIES`: past it, it starts again) and locked while a
 * row uses it (rows run without the GIL, in any thread).
 */
#include "native.h"

#define MAX_ENTRIES (1 << 20) /* cached (w, token) pairs per domain, ~16 MB at most */

static void prefix_free(Prefix *x) {
    PyMem_RawFree(x->w), PyMem_RawFree(x->slots);
    x->w = NULL, x->slots = NULL;
}

static void clear_cache(Domain *d) {
    for (Py_ssize_t k = 0; k < d->cap_prefixes; k++)
        if (d->prefixes[k].slots != NULL) prefix_free(&d->prefixes[k]);
    PyMem_RawFree(d->prefixes);
    d->prefixes = NULL, d->cap_prefixes = d->n_prefixes = 0, d->entries = 0;
}

/* [*lo, *hi) within [lo, hi): the spellings beginning with a[0:n] (those in range begin alike up to `skip`). */
static void spelling_range(const Domain *d, Py_ssize_t skip, const uint8_t *a, Py_ssize_t n, int32_t *lo, int32_t *hi) {
    for (int upper = 0; upper < 2; upper++) {
        Py_ssize_t l = *lo, h = *hi;
        while (l < h) {
            const Py_ssize_t mid = (l + h) / 2;
            const Py_ssize_t size = (Py_ssize_t)(d->at[mid + 1] - d->at[mid]) - skip;
            int c = n && size > 0 ? memcmp(d->flat + d->at[mid] + skip, a, (size_t)(size < n ? size : n)) : 0;
            if (!c) c = size < n ? -1 : 0;
            if (c < 0 || (upper && !c)) l = mid + 1; else h = mid;
        }
        if (upper) *hi = (int32_t)l; else *lo = (int32_t)l;
    }
}

void domain_range(const Domain *d, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb, int32_t *lo,
                  int32_t *hi) {
    *lo = 0, *hi = (int32_t)d->n;
    spelling_range(d, 0, a, na, lo, hi);
    if (nb) spelling_range(d, na, b, nb, lo, hi);
}

static int grow_prefixes(Domain *d) {
    const Py_ssize_t cap = d->cap_prefixes ? 2 * d->cap_prefixes : 16;
    Prefix *table = PyMem_RawCalloc((size_t)cap, sizeof(Prefix));
    if (table == NULL) return -1;
    for (Py_ssize_t k = 0; k < d->cap_prefixes; k++) {
        const Prefix *x = &d->prefixes[k];
        if (x->slots == NULL) continue;
        Py_ssize_t at = (Py_ssize_t)(x->hash & (uint64_t)(cap - 1));
        while (table[at].slots != NULL) at = (at + 1) & (cap - 1);
        table[at] = *x;
    }
    PyMem_RawFree(d->prefixes);
    d->prefixes = table, d->cap_prefixes = cap;
    return 0;
}

Prefix *domain_prefix(Domain *d, const uint8_t *w, Py_ssize_t wn) {
    if (d->entries > MAX_ENTRIES) clear_cache(d);
    const uint64_t hash = canon_hash(w, wn);
    if (d->cap_prefixes) {
        for (Py_ssize_t at = (Py_ssize_t)(hash & (uint64_t)(d->cap_prefixes - 1));; at = (at + 1) & (d->cap_prefixes - 1)) {
            Prefix *x = &d->prefixes[at];
            if (x->slots == NULL) break;
            if (x->hash == hash && x->wn == wn && !memcmp(x->w, w, (size_t)wn)) return x;
        }
    }
    if (2 * (d->n_prefixes + 1) > d->cap_prefixes && grow_prefixes(d) < 0) return NULL;
    Prefix made = {0};
    made.w = PyMem_RawMalloc((size_t)wn + 1);
    made.cap = 16;
    made.slots = PyMem_RawMalloc(sizeof(Reach) * (size_t)made.cap);
    if (made.w == NULL || made.slots == NULL) {
        prefix_free(&made);
        return NULL;
    }
    memcpy(made.w, w, (size_t)wn);
    made.wn = wn, made.hash = hash, made.lo = 0, made.hi = (int32_t)d->n;
    for (Py_ssize_t k = 0; k < made.cap; k++) made.slots[k].token = -1;
    spelling_range(d, 0, w, wn, &made.lo, &made.hi);
    Py_ssize_t at = (Py_ssize_t)(hash & (uint64_t)(d->cap_prefixes - 1));
    while (d->prefixes[at].slots != NULL) at = (at + 1) & (d->cap_prefixes - 1);
    d->prefixes[at] = made;
    d->n_prefixes++;
    return &d->prefixes[at];
}

static inline Py_ssize_t slot_of(int32_t token, Py_ssize_t cap) {
    return (Py_ssize_t)(((uint32_t)token * 2654435769u) & (uint32_t)(cap - 1));
}

static int grow_slots(Prefix *x) {
    const Py_ssize_t cap = 2 * x->cap;
    Reach *slots = PyMem_RawMalloc(sizeof(Reach) * (size_t)cap);
    if (slots == NULL) return -1;
    for (Py_ssize_t k = 0; k < cap; k++) slots[k].token = -1;
    for (Py_ssize_t k = 0; k < x->cap; k++) {
        if (x->slots[k].token < 0) continue;
        Py_ssize_t at = slot_of(x->slots[k].token, cap);
        while (slots[at].token >= 0) at = (at + 1) & (cap - 1);
        slots[at] = x->slots[k];
    }
    PyMem_RawFree(x->slots);
    x->slots = slots, x->cap = cap;
    return 0;
}

const Reach *domain_reach(Domain *d, Prefix *x, const Vocab *v, int32_t t) {
    Py_ssize_t at = slot_of(t, x->cap);
    for (; x->slots[at].token >= 0; at = (at + 1) & (x->cap - 1))
        if (x->slots[at].token == t) return &x->slots[at];
    if (2 * (x->n + 1) > x->cap) {
        if (grow_slots(x) < 0) return NULL;
        for (at = slot_of(t, x->cap); x->slots[at].token >= 0; at = (at + 1) & (x->cap - 1)) {}
    }
    Reach r = {t, -1, -1};
    const uint8_t *bytes = v->flat + v->offsets[t];
    const Py_ssize_t n = (Py_ssize_t)(v->offsets[t + 1] - v->offsets[t]);
    const int32_t q = v->quote_at[t];
    if (!(v->shape[t] & SH_BACKSLASH) && (q < 0 || q == n - 1)) { /* `decide`'s finite shortcut: kept iff live */
        r.lo = x->lo, r.hi = x->hi;
        spelling_range(d, x->wn, bytes, n, &r.lo, &r.hi);
    }
    x->slots[at] = r;
    x->n++, d->entries++;
    return &x->slots[at];
}

int domain_counts(const Domain *d, PyObject *unused, int32_t *counts) {
    const Py_ssize_t nu = PyTuple_GET_SIZE(unused);
    Py_ssize_t j = 0;
    counts[0] = 0;
    for (Py_ssize_t i = 0; i < d->n; i++) {
        int match = 0;
        if (j < nu) {
            PyObject *x = PyTuple_GET_ITEM(unused, j);
            match = x == d->objects[i]; /* (the same objects: `Unique.adding` filters the domain's tuple) */
            if (!match && PyBytes_Check(x)) {
                const Py_ssize_t size = PyBytes_GET_SIZE(x);
                match = size == d->at[i + 1] - d->at[i] && !memcmp(PyBytes_AS_STRING(x), d->flat + d->at[i], (size_t)size);
            }
        }
        j += match;
        counts[i + 1] = counts[i] + match;
    }
    return j == nu ? 0 : -1; /* an unused spelling outside the domain: not this domain's */
}

PyObject *domain_counts_of(Domain *d, PyObject *unused) {
    for (int k = 0; k < COUNTS_KEPT; k++)
        if (d->kept_unused[k] == unused) return Py_NewRef(d->kept_counts[k]); /* (held: the id is its own) */
    PyObject *counts = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(int32_t) * (d->n + 1));
    if (counts == NULL) return NULL;
    if (domain_counts(d, unused, (int32_t *)PyBytes_AS_STRING(counts)) < 0) {
        Py_DECREF(counts);
        Py_RETURN_NONE; /* not its domain */
    }
    const int k = d->kept_next;
    d->kept_next = (k + 1) % COUNTS_KEPT;
    Py_XSETREF(d->kept_unused[k], Py_NewRef(unused));
    Py_XSETREF(d->kept_counts[k], Py_NewRef(counts));
    return counts;
}

int memo_reuse(RowMemo *m, const Domain *d, const PyObject *counts, const uint8_t *w, Py_ssize_t wn,
               Py_ssize_t limit, uint32_t *words) {
    if (m == NULL || !m->valid || m->domain != d || m->counts != counts || m->limit != limit || m->wn != wn ||
        memcmp(m->w, w, (size_t)wn))
        return 0;
    for (Py_ssize_t k = 0; k < m->n_cleared; k++) /* the kept row allowed them: so must this one */
        if (!(words[m->cleared[k] >> 5] >> (m->cleared[k] & 31) & 1)) return 0;
    for (Py_ssize_t k = 0; k < m->n_cleared; k++) words[m->cleared[k] >> 5] &= ~(1u << (m->cleared[k] & 31));
    if (!memcmp(words, m->result, sizeof(uint32_t) * (size_t)m->words)) return 1; /* the same allowed tokens */
    for (Py_ssize_t k = 0; k < m->n_cleared; k++) words[m->cleared[k] >> 5] |= 1u << (m->cleared[k] & 31);
    return 0;
}

int memo_note(RowMemo *m, int32_t t) {
    if (m->n_cleared == m->cap_cleared) {
        const Py_ssize_t cap = m->cap_cleared ? 2 * m->cap_cleared : 256;
        int32_t *grown = PyMem_RawRealloc(m->cleared, sizeof(int32_t) * (size_t)cap);
        if (grown == NULL) return -1;
        m->cleared = grown, m->cap_cleared = cap;
    }
    m->cleared[m->n_cleared++] = t;
    return 0;
}

void memo_keep(RowMemo *m, const Domain *d, const PyObject *counts, const uint8_t *w, Py_ssize_t wn,
               Py_ssize_t limit, const uint32_t *words) {
    const Py_ssize_t n = (limit + 31) / 32;
    if (m->result == NULL || m->words != n) {
        PyMem_RawFree(m->result);
        m->result = PyMem_RawMalloc(sizeof(uint32_t) * (size_t)n);
        if (m->result == NULL) { m->valid = 0; return; }
    }
    memcpy(m->result, words, sizeof(uint32_t) * (size_t)n);
    m->domain = d, m->counts = counts, m->w = w, m->wn = wn, m->limit = limit, m->words = n, m->valid = 1;
}

void memo_free(RowMemo *m) {
    PyMem_RawFree(m->result), PyMem_RawFree(m->cleared);
    m->result = NULL, m->cleared = NULL;
}

int domain_lock(Domain *d) { return pthread_mutex_trylock(&d->lock) == 0; }
void domain_unlock(Domain *d) { pthread_mutex_unlock(&d->lock); }

static void domain_dealloc(Domain *d) {
    clear_cache(d);
    for (int k = 0; k < COUNTS_KEPT; k++) {
        Py_CLEAR(d->kept_unused[k]);
        Py_CLEAR(d->kept_counts[k]);
    }
    pthread_mutex_destroy(&d->lock);
    PyMem_RawFree(d->flat), PyMem_RawFree(d->at), PyMem_RawFree(d->objects);
    Py_XDECREF(d->spellings);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyObject *domain_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *spellings;
    static char *names[] = {"spellings", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", names, &PyTuple_Type, &spellings)) return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(spellings);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(spellings, i);
        if (!PyBytes_Check(x)) {
            PyErr_SetString(PyExc_TypeError, "Domain: spellings must be bytes");
            return NULL;
        }
        if (i) { /* Python's order: bytewise, a prefix first */
            PyObject *prev = PyTuple_GET_ITEM(spellings, i - 1);
            const int c = compare_with_concat(prev, (const uint8_t *)PyBytes_AS_STRING(x), PyBytes_GET_SIZE(x), NULL, 0);
            if (c > 0 || (!c && PyBytes_GET_SIZE(prev) >= PyBytes_GET_SIZE(x))) {
                PyErr_SetString(PyExc_ValueError, "Domain: spellings must be sorted and distinct");
                return NULL;
            }
        }
        total += PyBytes_GET_SIZE(x);
    }
    if (n >= INT32_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "Domain: too many spellings");
        return NULL;
    }
    Domain *d = (Domain *)type->tp_alloc(type, 0);
    if (d == NULL) return NULL;
    pthread_mutex_init(&d->lock, NULL);
    d->n = n;
    d->flat = PyMem_RawMalloc((size_t)total + 1);
    d->at = PyMem_RawMalloc(sizeof(int64_t) * ((size_t)n + 1));
    d->objects = PyMem_RawMalloc(sizeof(PyObject *) * ((size_t)n + 1));
    if (d->flat == NULL || d->at == NULL || d->objects == NULL) {
        Py_DECREF(d);
        return PyErr_NoMemory();
    }
    Py_INCREF(spellings);
    d->spellings = spellings;
    d->at[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(spellings, i);
        memcpy(d->flat + d->at[i], PyBytes_AS_STRING(x), (size_t)PyBytes_GET_SIZE(x));
        d->at[i + 1] = d->at[i] + PyBytes_GET_SIZE(x);
        d->objects[i] = x;
    }
    return (PyObject *)d;
}

static PyObject *domain_cached(Domain *d, PyObject *unused) {
    return Py_BuildValue("(nn)", d->n_prefixes, d->entries);
}

static PyMethodDef domain_methods[] = {
    {"cached", (PyCFunction)domain_cached, METH_NOARGS, "cached() -> (prefixes, entries): the cache's size (tests)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject DomainType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fd_guided.unique._native.Domain",
    .tp_basicsize = sizeof(Domain),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Domain(spellings): a finite item domain's sorted spellings (bytes), with the guard's cache per item prefix.",
    .tp_new = domain_new,
    .tp_dealloc = (destructor)domain_dealloc,
    .tp_methods = domain_methods,
};
