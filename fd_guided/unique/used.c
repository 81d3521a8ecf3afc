/*
 * `Used`: one guarded array's finished items as the C guard reads them, a mirror of
 * `items.Items` (its entries' canonical keys, hashed, and its string values, sorted).
 *
 * `sync(entries, count)` makes it hold exactly the log's first `count` entries: entries are
 * named by serial numbers, and an entry still in the log has the same entries before it as when
 * it was added (the log only drops from its end), so the longest common prefix is found from
 * the end; the rest is dropped and the log's entries past it are keyed here (`canon.c`). It
 * returns how many of them C could not key: the plan then leaves the row to Python.
 */
#include "native.h"

static void free_entry(Entry *x) {
    PyMem_RawFree(x->judged);
    PyMem_RawFree(x->exact);
    memset(x, 0, sizeof *x);
}

static void put_slot(int32_t *slots, Py_ssize_t mask, uint64_t hash, int32_t index) {
    Py_ssize_t i = (Py_ssize_t)(hash & (uint64_t)mask);
    while (slots[i]) i = (i + 1) & mask;
    slots[i] = index + 1;
}

/* Both tables rebuilt for entries [0, n), at least twice as many slots as entries. */
static int rehash(Used *u, Py_ssize_t want) {
    Py_ssize_t slots = 16;
    while (slots < 2 * want) slots *= 2;
    int32_t *j = PyMem_RawCalloc((size_t)slots, sizeof(int32_t)), *e = PyMem_RawCalloc((size_t)slots, sizeof(int32_t));
    if (j == NULL || e == NULL) {
        PyMem_RawFree(j), PyMem_RawFree(e);
        return -1;
    }
    PyMem_RawFree(u->judged_slots), PyMem_RawFree(u->exact_slots);
    u->judged_slots = j, u->exact_slots = e, u->slots = slots;
    for (Py_ssize_t k = 0; k < u->n; k++) {
        if (u->entries[k].judged == NULL) continue;
        put_slot(j, slots - 1, u->entries[k].judged_hash, (int32_t)k);
        put_slot(e, slots - 1, u->entries[k].exact_hash, (int32_t)k);
    }
    return 0;
}

static int find(const Used *u, const int32_t *slots, Py_ssize_t count, const uint8_t *key, Py_ssize_t n, int exact) {
    if (!u->slots) return 0;
    const uint64_t hash = canon_hash(key, n);
    const Py_ssize_t mask = u->slots - 1;
    for (Py_ssize_t i = (Py_ssize_t)(hash & (uint64_t)mask); slots[i]; i = (i + 1) & mask) {
        const Py_ssize_t k = slots[i] - 1;
        const Entry *x = &u->entries[k];
        const uint8_t *have = exact ? x->exact : x->judged;
        const Py_ssize_t size = exact ? x->exact_size : x->judged_size;
        if (k < count && (exact ? x->exact_hash : x->judged_hash) == hash && size == n && !memcmp(have, key, (size_t)n))
            return 1;
    }
    return 0;
}

int used_holds(const Used *u, Py_ssize_t count, const uint8_t *judged, Py_ssize_t jn, const uint8_t *exact,
               Py_ssize_t en) {
    return find(u, u->judged_slots, count, judged, jn, 0) || find(u, u->exact_slots, count, exact, en, 1);
}

/* Compare the first len(a + b) bytes of x's string with a + b (a shorter string that agrees
 * sorts first): < 0, 0 (x begins with a + b), > 0. With `whole`, x must equal a + b for 0. */
static int compare_string(const Entry *x, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb, int whole) {
    const Py_ssize_t have = x->string_size;
    Py_ssize_t common = have < na ? have : na;
    int c = memcmp(x->string, a, (size_t)common);
    if (c) return c;
    if (have <= na) return have < na + nb ? -1 : 0;
    common = have - na < nb ? have - na : nb;
    c = memcmp(x->string + na, b, (size_t)common);
    if (c) return c;
    if (have - na < nb) return -1;
    return whole && have > na + nb ? 1 : 0;
}

static Py_ssize_t lower_bound(const Used *u, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb,
                              int above) {
    Py_ssize_t lo = 0, hi = u->n_sorted;
    while (lo < hi) {
        const Py_ssize_t mid = (lo + hi) / 2;
        const int c = compare_string(&u->entries[u->sorted[mid]], a, na, b, nb, 0);
        if (c < 0 || (above && c == 0)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

void used_prefix_range(const Used *u, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb,
                       Py_ssize_t *lo, Py_ssize_t *hi) {
    *lo = lower_bound(u, a, na, b, nb, 0);
    *hi = lower_bound(u, a, na, b, nb, 1);
}

int used_has_string(const Used *u, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb) {
    Py_ssize_t lo = 0, hi = u->n_sorted;
    while (lo < hi) {
        const Py_ssize_t mid = (lo + hi) / 2;
        const int c = compare_string(&u->entries[u->sorted[mid]], a, na, b, nb, 1);
        if (!c) return 1;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return 0;
}

static void truncate_to(Used *u, Py_ssize_t count) {
    if (count >= u->n) return;
    for (Py_ssize_t k = count; k < u->n; k++) {
        u->opaque -= u->entries[k].judged == NULL;
        free_entry(&u->entries[k]);
    }
    u->n = count;
    Py_ssize_t kept = 0;
    for (Py_ssize_t k = 0; k < u->n_sorted; k++)
        if (u->sorted[k] < count) u->sorted[kept++] = u->sorted[k];
    u->n_sorted = kept;
    if (rehash(u, count) < 0) { /* no memory to shrink into: keep the larger tables */
        memset(u->judged_slots, 0, sizeof(int32_t) * (size_t)u->slots);
        memset(u->exact_slots, 0, sizeof(int32_t) * (size_t)u->slots);
        for (Py_ssize_t k = 0; k < u->n; k++) {
            if (u->entries[k].judged == NULL) continue;
            put_slot(u->judged_slots, u->slots - 1, u->entries[k].judged_hash, (int32_t)k);
            put_slot(u->exact_slots, u->slots - 1, u->entries[k].exact_hash, (int32_t)k);
        }
    }
}

static uint64_t read_varint(const uint8_t *p, int *len) {
    uint64_t v = 0;
    int shift = 0;
    *len = 0;
    do { v |= (uint64_t)(p[*len] & 0x7f) << shift; shift += 7; } while (p[(*len)++] & 0x80);
    return v;
}

/* Key `text` and append it as an entry with `serial`. */
static int append(Used *u, const uint8_t *text, Py_ssize_t n, uint64_t serial) {
    if (u->n == u->cap) {
        const Py_ssize_t cap = u->cap ? 2 * u->cap : 16;
        Entry *entries = PyMem_RawRealloc(u->entries, sizeof(Entry) * (size_t)cap);
        int32_t *sorted = PyMem_RawRealloc(u->sorted, sizeof(int32_t) * (size_t)cap);
        if (entries != NULL) u->entries = entries;
        if (sorted != NULL) u->sorted = sorted;
        if (entries == NULL || sorted == NULL) return -1;
        u->cap = cap;
    }
    if (2 * (u->n + 1) > u->slots && rehash(u, u->n + 1) < 0) return -1;
    Entry *x = &u->entries[u->n];
    memset(x, 0, sizeof *x);
    x->serial = serial;
    Buf j = {0}, e = {0};
    const int r = canon_item(text, n, &j, &e);
    if (r == CANON_NOMEM) {
        buf_free(&j), buf_free(&e);
        return -1;
    }
    if (r == CANON_FAIL) {
        buf_free(&j), buf_free(&e);
        u->opaque++;
        u->n++;
        return 0;
    }
    x->judged = j.data, x->judged_size = j.size, x->judged_hash = canon_hash(j.data, j.size);
    x->exact = e.data, x->exact_size = e.size, x->exact_hash = canon_hash(e.data, e.size);
    const Py_ssize_t index = u->n++;
    put_slot(u->judged_slots, u->slots - 1, x->judged_hash, (int32_t)index);
    put_slot(u->exact_slots, u->slots - 1, x->exact_hash, (int32_t)index);
    if (x->exact[0] == 'S') {
        int len;
        x->string_size = (Py_ssize_t)read_varint(x->exact + 1, &len);
        x->string = x->exact + 1 + len;
        x->string_whole = valid_utf8(x->string, x->string_size);
        const Py_ssize_t at = lower_bound(u, x->string, x->string_size, NULL, 0, 0);
        memmove(u->sorted + at + 1, u->sorted + at, sizeof(int32_t) * (size_t)(u->n_sorted - at));
        u->sorted[at] = (int32_t)index;
        u->n_sorted++;
    }
    return 0;
}

static PyObject *used_sync(Used *u, PyObject *args) {
    PyObject *entries;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &entries, &count)) return NULL;
    if (count < 0 || count > PyList_GET_SIZE(entries)) {
        PyErr_SetString(PyExc_ValueError, "count outside the log");
        return NULL;
    }
    Py_ssize_t k = count < u->n ? count : u->n;
    for (; k > 0; k--) {
        PyObject *entry = PyList_GET_ITEM(entries, k - 1);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 5) goto bad_entry;
        const unsigned long long serial = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(entry, 4));
        if (PyErr_Occurred()) return NULL;
        if (serial == u->entries[k - 1].serial) break;
    }
    truncate_to(u, k);
    for (; k < count; k++) {
        PyObject *entry = PyList_GET_ITEM(entries, k);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 5 || !PyBytes_Check(PyTuple_GET_ITEM(entry, 3))) goto bad_entry;
        PyObject *text = PyTuple_GET_ITEM(entry, 3);
        const unsigned long long serial = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(entry, 4));
        if (PyErr_Occurred()) return NULL;
        if (append(u, (const uint8_t *)PyBytes_AS_STRING(text), PyBytes_GET_SIZE(text), serial) < 0)
            return PyErr_NoMemory();
    }
    return PyLong_FromSsize_t(u->opaque);
bad_entry:
    PyErr_SetString(PyExc_TypeError, "a log entry must be (judged, exact, string, text: bytes, serial: int)");
    return NULL;
}

/* canon.c's key format, read back: one key's end (each is self-delimiting). */
static uint64_t read_length(const uint8_t **p, const uint8_t *end) {
    uint64_t v = 0;
    for (int shift = 0; *p < end && shift < 63; shift += 7) {
        const uint8_t c = *(*p)++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return v;
    }
    *p = end + 1; /* malformed */
    return 0;
}

const uint8_t *canon_skip(const uint8_t *p, const uint8_t *end) {
    if (p >= end) return NULL;
    switch (*p++) {
    case 't': case 'f': case 'n': return p;
    case 'F': return p + 1 <= end ? p + 1 : NULL;
    case 'D': return p + 8 <= end ? p + 8 : NULL;
    case 'S': case 'I': case 'X': {
        const uint64_t n = read_length(&p, end);
        return p <= end && (uint64_t)(end - p) >= n ? p + n : NULL;
    }
    case 'A': case 'O': {
        const uint8_t close = p[-1] == 'A' ? ']' : '}';
        while (p != NULL && p < end && *p != close) p = canon_skip(p, end);
        return p != NULL && p < end ? p + 1 : NULL;
    }
    default: return NULL;
    }
}

/* A pair of canonical object keys (judged, exact) split around the pair of key `key`. */
typedef struct {
    const uint8_t *key;     /* the pair's key ('S' len bytes) */
    Py_ssize_t before, key_size, after; /* the object's bytes before the pair, the key's, after the pair */
} Split;

static int split_at_key(const Buf *object, const uint8_t *key, Py_ssize_t key_size, Split *out) {
    const uint8_t *p = object->data + 1, *end = object->data + object->size;
    if (object->size < 2 || object->data[0] != 'O') return 0;
    while (p != NULL && p < end && *p != '}') {
        const uint8_t *pair = p, *value = canon_skip(p, end);
        if (value == NULL) return 0;
        p = canon_skip(value, end);
        if (p == NULL) return 0;
        const uint8_t *name = pair + 1;
        int len = 0;
        const Py_ssize_t size = (Py_ssize_t)read_varint(name, &len);
        if (size == key_size && !memcmp(name + len, key, (size_t)key_size)) {
            *out = (Split){pair, pair - object->data, value - pair, end - p};
            return 1;
        }
    }
    return 0;
}

static int matches(const uint8_t *x, Py_ssize_t n, const Buf *object, const Split *at, const uint8_t **value, Py_ssize_t *size) {
    const Py_ssize_t fixed = at->before + at->key_size + at->after;
    if (x == NULL || n <= fixed || memcmp(x, object->data, (size_t)(at->before + at->key_size)) ||
        memcmp(x + n - at->after, object->data + object->size - at->after, (size_t)at->after))
        return 0;
    const uint8_t *middle = x + at->before + at->key_size, *end = x + n - at->after;
    if (*middle != 'S' || canon_skip(middle, end) != end) return 0;
    int len = 0;
    *size = (Py_ssize_t)read_varint(middle + 1, &len);
    *value = middle + 1 + len;
    return 1;
}

static PyObject *used_values_for(Used *u, PyObject *args) {
    const char *prefix, *key;
    Py_ssize_t prefix_size, key_size, count;
    if (!PyArg_ParseTuple(args, "y#y#n", &prefix, &prefix_size, &key, &key_size, &count)) return NULL;
    if (count < 0 || count > u->n) {
        PyErr_SetString(PyExc_ValueError, "count past the entries held");
        return NULL;
    }
    Buf text = {0}, j = {0}, e = {0};
    PyObject *values = NULL, *out = NULL;
    int r = buf_put(&text, prefix, prefix_size) < 0 || buf_put(&text, "\"\"}", 3) < 0 ? CANON_NOMEM
            : canon_item(text.data, text.size, &j, &e);
    Split sj, se;
    if (r == CANON_NOMEM) { PyErr_NoMemory(); goto done; }
    if (r == CANON_FAIL || !split_at_key(&j, (const uint8_t *)key, key_size, &sj) ||
        !split_at_key(&e, (const uint8_t *)key, key_size, &se)) {
        out = Py_None, Py_INCREF(out);
        goto done;
    }
    if ((values = PySet_New(NULL)) == NULL) goto done;
    for (Py_ssize_t k = 0; k < count; k++) {
        const Entry *x = &u->entries[k];
        const uint8_t *value;
        Py_ssize_t size;
        for (int form = 0; form < 2; form++) {
            if (!(form ? matches(x->exact, x->exact_size, &e, &se, &value, &size) : matches(x->judged, x->judged_size, &j, &sj, &value, &size)))
                continue;
            PyObject *item = PyBytes_FromStringAndSize((const char *)value, size);
            if (item == NULL || PySet_Add(values, item) < 0) { Py_XDECREF(item); goto done; }
            Py_DECREF(item);
        }
    }
    PyObject *listed = PySequence_List(values);
    if (listed == NULL || PyList_Sort(listed) < 0) { Py_XDECREF(listed); goto done; }
    out = PyList_AsTuple(listed);
    Py_DECREF(listed);
done:
    buf_free(&text), buf_free(&j), buf_free(&e);
    Py_XDECREF(values);
    return out;
}

static PyObject *used_serial(Used *u, PyObject *arg) {
    const Py_ssize_t k = PyLong_AsSsize_t(arg);
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (k < 0 || k >= u->n) return PyLong_FromLong(0);
    return PyLong_FromUnsignedLongLong(u->entries[k].serial);
}

static PyObject *used_len(Used *u, PyObject *Py_UNUSED(arg)) { return PyLong_FromSsize_t(u->n); }

static void used_dealloc(Used *u) {
    for (Py_ssize_t k = 0; k < u->n; k++) free_entry(&u->entries[k]);
    PyMem_RawFree(u->entries), PyMem_RawFree(u->sorted);
    PyMem_RawFree(u->judged_slots), PyMem_RawFree(u->exact_slots);
    Py_TYPE(u)->tp_free((PyObject *)u);
}

static PyMethodDef used_methods[] = {
    {"sync", (PyCFunction)used_sync, METH_VARARGS,
     "sync(entries, count) -> int: hold the log's first `count` entries; how many C cannot key."},
    {"serial", (PyCFunction)used_serial, METH_O, "serial(k) -> int: entry k's serial (0 if none)."},
    {"values_for", (PyCFunction)used_values_for, METH_VARARGS,
     "values_for(prefix, key, count) -> tuple[bytes] | None: an object item written up to the value of member\n"
     "`key` (UTF-8): the string values after which closing it would equal one of the first `count` items,\n"
     "sorted (None where C cannot key the item)."},
    {"size", (PyCFunction)used_len, METH_NOARGS, "size() -> int: the entries held."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject UsedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fd_guided.unique._native.Used",
    .tp_basicsize = sizeof(Used),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One guarded array's finished items as the C guard reads them (a mirror of items.Items).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)used_dealloc,
    .tp_methods = used_methods,
};
