/*
 * The uniqueItems guard in C (fd_guided.unique.native); the files are named in native.h.
 *
 * A guard's accepted token leaves its tracker a fill plan (`native.make_plan`): a `Plan` here,
 * the tracker's state from the innermost guarded array up, made once per token. A batched fill
 * then calls `restrict` once for all its rows: it reads each guard's plan (two attribute reads a
 * row, no Python code), releases the GIL, and decides every row (`machine.c`); it hands back
 * only the rows Python must finish: those with no current plan, and the tokens it left undecided.
 */
#include "native.h"

/* ---- Plan ------------------------------------------------------------------------------- */

static void plan_dealloc(Plan *p) {
    Py_XDECREF(p->vocab), Py_XDECREF(p->used), Py_XDECREF(p->buffer), Py_XDECREF(p->unused), Py_XDECREF(p->values);
    Py_XDECREF(p->domain), Py_XDECREF(p->counts);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

enum { F_COUNT, F_ITEM_START, F_WRITTEN_START, F_KIND, F_MODE, F_ESCAPE, F_IS_KEY, F_LITERAL_LEFT, F_ANCESTOR,
       F_CHILD, F_DEPTH, NUM_FIELDS };

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *vocab, *used, *buffer, *unused, *fields, *values = Py_None, *domain = Py_None;
    const char *frames;
    Py_ssize_t frames_size, f[NUM_FIELDS];
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Plan takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!O!OO!y#|OO", &VocabType, &vocab, &UsedType, &used, &PyByteArray_Type, &buffer,
                          &unused, &PyTuple_Type, &fields, &frames, &frames_size, &values, &domain))
        return NULL;
    if (PyTuple_GET_SIZE(fields) != NUM_FIELDS) goto bad;
    for (int k = 0; k < NUM_FIELDS; k++) {
        f[k] = PyNumber_AsSsize_t(PyTuple_GET_ITEM(fields, k), PyExc_OverflowError);
        if (f[k] == -1 && PyErr_Occurred()) return NULL;
    }
    const Py_ssize_t size = PyByteArray_GET_SIZE(buffer), depth = f[F_DEPTH];
    const Used *u = (const Used *)used;
    if (depth < 0 || depth >= MAX_FRAMES || frames_size != 2 * (depth + 1) || frames[0] != 'a' ||
        f[F_COUNT] != u->n || f[F_KIND] < KIND_OPEN || f[F_KIND] > KIND_FINITE || f[F_MODE] < MODE_NONE ||
        f[F_MODE] > MODE_LITERAL || f[F_ESCAPE] < 0 || f[F_ESCAPE] > 5 || f[F_ITEM_START] < -1 || f[F_ITEM_START] > size ||
        f[F_WRITTEN_START] < -1 || f[F_WRITTEN_START] > size || f[F_LITERAL_LEFT] < 0 || f[F_LITERAL_LEFT] > 5 ||
        (f[F_MODE] == MODE_LITERAL && f[F_LITERAL_LEFT] < 1) ||
        (f[F_WRITTEN_START] >= 0 && (f[F_MODE] != MODE_STRING || f[F_ITEM_START] < 0 || f[F_IS_KEY] || depth > 1 ||
                                     (depth == 1 && (frames[2] != 'o' || !PyTuple_Check(values))))))
        goto bad;
    if (values != Py_None && !PyTuple_Check(values)) goto bad;
    if (domain != Py_None && !PyObject_TypeCheck(domain, &DomainType)) goto bad;
    for (Py_ssize_t k = 0; values != Py_None && k < PyTuple_GET_SIZE(values); k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(values, k))) goto bad;
    for (Py_ssize_t k = 0; k <= depth; k++) {
        const char kind = frames[2 * k], phase = frames[2 * k + 1];
        if ((kind != 'o' && kind != 'a') || phase < PH_KEY || phase > PH_COMMA || (kind == 'a' && phase < PH_VALUE)) goto bad;
    }
    if (f[F_KIND] == KIND_FINITE) {
        if (depth || !PyTuple_Check(unused)) goto bad;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(unused); k++)
            if (!PyBytes_Check(PyTuple_GET_ITEM(unused, k))) goto bad;
    }
    PyObject *counts = NULL;
    if (f[F_KIND] == KIND_FINITE && domain != Py_None) { /* which of the domain's spellings are unused */
        counts = domain_counts_of((Domain *)domain, unused);
        if (counts == NULL) return NULL;
        if (counts == Py_None) Py_CLEAR(counts); /* not its domain */
    }
    Plan *p = (Plan *)type->tp_alloc(type, 0);
    if (p == NULL) { Py_XDECREF(counts); return NULL; }
    if (counts != NULL) Py_INCREF(domain), p->domain = (Domain *)domain, p->counts = counts;
    Py_INCREF(vocab), Py_INCREF(used), Py_INCREF(buffer), Py_INCREF(unused), Py_INCREF(values);
    p->vocab = (Vocab *)vocab, p->used = (Used *)used, p->buffer = buffer, p->unused = unused, p->values = values;
    p->count = f[F_COUNT], p->serial = f[F_COUNT] ? u->entries[f[F_COUNT] - 1].serial : 0, p->buffer_size = size;
    p->item_start = f[F_ITEM_START], p->written_start = f[F_WRITTEN_START];
    p->kind = (int)f[F_KIND], p->mode = (int)f[F_MODE], p->escape = (int)f[F_ESCAPE], p->is_key = f[F_IS_KEY] != 0;
    p->literal_left = (int)f[F_LITERAL_LEFT], p->guarded_ancestor = f[F_ANCESTOR] != 0, p->child = f[F_CHILD] != 0;
    p->depth = (int)depth;
    for (Py_ssize_t k = 0; k <= depth; k++) p->frames[k] = (Frame){(uint8_t)frames[2 * k], (uint8_t)frames[2 * k + 1], 0};
    return (PyObject *)p;
bad:
    PyErr_SetString(PyExc_ValueError, "Plan(vocab, used, buffer, unused, fields, frames): fields or frames out of range");
    return NULL;
}

/* The same plan with the tracker's bytes grown to `size` inside the same string (no other change). */
PyObject *plan_at(Plan *p, PyObject *arg) {
    const Py_ssize_t size = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (size == -1 && PyErr_Occurred()) return NULL;
    if (p->mode != MODE_STRING || size < p->buffer_size || size != PyByteArray_GET_SIZE(p->buffer)) {
        PyErr_SetString(PyExc_ValueError, "Plan.at: only a string grown to the buffer's size");
        return NULL;
    }
    Plan *q = (Plan *)PlanType.tp_alloc(&PlanType, 0);
    if (q == NULL) return NULL;
    memcpy((char *)q + sizeof(PyObject), (char *)p + sizeof(PyObject), sizeof(Plan) - sizeof(PyObject));
    Py_INCREF(q->vocab), Py_INCREF(q->used), Py_INCREF(q->buffer), Py_INCREF(q->unused), Py_INCREF(q->values);
    Py_XINCREF(q->domain), Py_XINCREF(q->counts);
    q->buffer_size = size;
    return (PyObject *)q;
}

static PyMethodDef plan_methods[] = {
    {"at", (PyCFunction)plan_at, METH_O,
     "at(size) -> Plan: this plan for the tracker's bytes grown to `size` within the same string."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fd_guided.unique._native.Plan",
    .tp_basicsize = sizeof(Plan),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Plan(vocab, used, buffer, unused, fields, frames[, values[, domain]]): a tracker's state as the C guard "
              "reads it (made by fd_guided.unique.native.make_plan).",
    .tp_new = plan_new,
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_methods = plan_methods,
};

/* Still the tracker's state? (Its bytes and items as when planned.) */
static int plan_current(const Plan *p) {
    const Used *u = p->used;
    return u->n == p->count && (!p->count || u->entries[p->count - 1].serial == p->serial) &&
           PyByteArray_GET_SIZE(p->buffer) == p->buffer_size;
}

/* ---- restrict --------------------------------------------------------------------------- */

static PyObject *str_tracker, *str_fill_plan;

typedef struct {
    Plan *plan;
    Py_ssize_t index, row;
    Py_buffer bytes;
    int have_bytes;
} Job;

static int append_left(PyObject *left, Py_ssize_t index, PyObject *undecided) {
    PyObject *item = Py_BuildValue("(nO)", index, undecided);
    const int r = item == NULL ? -1 : PyList_Append(left, item);
    Py_XDECREF(item);
    return r;
}

static PyObject *restrict_rows(PyObject *self, PyObject *args) {
    PyObject *getter, *bitmask, *grammar_seq, *row_seq, *guard_type;
    if (!PyArg_ParseTuple(args, "OOOOO", &getter, &bitmask, &grammar_seq, &row_seq, &guard_type)) return NULL;
    PyObject *grammars = PySequence_Fast(grammar_seq, "grammars must be a sequence");
    PyObject *rows = grammars ? PySequence_Fast(row_seq, "rows must be a sequence") : NULL;
    PyObject *left = rows ? PyList_New(0) : NULL, *words = NULL, *result = NULL;
    Job *jobs = NULL;
    Row *work = NULL;
    Py_buffer view = {0};
    Py_ssize_t n_jobs = 0;
    if (left == NULL) goto done;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(grammars);
    if (PySequence_Fast_GET_SIZE(rows) != n) {
        PyErr_SetString(PyExc_ValueError, "one row per grammar");
        goto done;
    }
    jobs = PyMem_Calloc((size_t)n + 1, sizeof(Job));
    if (jobs == NULL) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *grammar = PySequence_Fast_GET_ITEM(grammars, i);
        if ((PyObject *)Py_TYPE(grammar) != guard_type) continue;
        PyObject *tracker = PyObject_GetAttr(grammar, str_tracker);
        PyObject *plan = tracker ? PyObject_GetAttr(tracker, str_fill_plan) : NULL;
        Py_XDECREF(tracker);
        if (plan == NULL) goto done;
        if (plan == Py_False) { Py_DECREF(plan); continue; } /* outside every guarded array */
        if (!PyObject_TypeCheck(plan, &PlanType) || !plan_current((Plan *)plan)) {
            Py_DECREF(plan);
            if (append_left(left, i, Py_None) < 0) goto done;
            continue;
        }
        jobs[n_jobs].plan = (Plan *)plan, jobs[n_jobs].index = i;
        jobs[n_jobs].row = PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(rows, i), PyExc_IndexError);
        n_jobs++;
        if (jobs[n_jobs - 1].row == -1 && PyErr_Occurred()) goto done;
    }
    if (!n_jobs) { result = left, left = NULL; goto done; }
    if ((words = PyObject_CallOneArg(getter, bitmask)) == NULL) goto done;
    if (PyObject_GetBuffer(words, &view, PyBUF_STRIDES | PyBUF_WRITABLE) < 0) goto done;
    if (view.ndim != 2 || view.itemsize != 4 || view.strides[1] != 4) {
        PyErr_SetString(PyExc_ValueError, "the bitmask must be 2-D 32-bit words, rows of contiguous words");
        goto done;
    }
    work = PyMem_Calloc((size_t)n_jobs, sizeof(Row));
    if (work == NULL) { PyErr_NoMemory(); goto done; }
    RowMemo memo = {0}; /* the rows of a batch in the same finite item's state share its decision */
    for (Py_ssize_t k = 0; k < n_jobs; k++) {
        Job *job = &jobs[k];
        if (job->row < 0 || job->row >= view.shape[0]) {
            PyErr_SetString(PyExc_IndexError, "row outside the bitmask");
            goto done;
        }
        if (PyObject_GetBuffer(job->plan->buffer, &job->bytes, PyBUF_SIMPLE) < 0) goto done; /* no resize meanwhile */
        job->have_bytes = 1;
        Row *row = &work[k];
        row->plan = job->plan, row->vocab = job->plan->vocab, row->buf = job->bytes.buf, row->shared = &memo;
        row->words = (uint32_t *)((char *)view.buf + job->row * view.strides[0]);
        const Py_ssize_t width = view.shape[1] * 32;
        row->limit = width < row->vocab->num_tokens ? width : row->vocab->num_tokens;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n_jobs; k++) run_row(&work[k]);
    memo_free(&memo);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n_jobs; k++) {
        const Row *row = &work[k];
        if (!row->failed && !row->n_undecided) continue;
        PyObject *undecided = row->failed ? (Py_INCREF(Py_None), Py_None) : PyList_New(row->n_undecided);
        if (undecided == NULL) goto done;
        for (Py_ssize_t i = 0; !row->failed && i < row->n_undecided; i++) {
            PyObject *token = PyLong_FromLongLong(row->undecided[i]);
            if (token == NULL) { Py_DECREF(undecided); goto done; }
            PyList_SET_ITEM(undecided, i, token);
        }
        const int r = append_left(left, jobs[k].index, undecided);
        Py_DECREF(undecided);
        if (r < 0) goto done;
    }
    result = left, left = NULL;
done:
    for (Py_ssize_t k = 0; k < n_jobs; k++) {
        if (work != NULL) row_free(&work[k]);
        if (jobs[k].have_bytes) PyBuffer_Release(&jobs[k].bytes);
        Py_DECREF(jobs[k].plan);
    }
    if (view.obj != NULL) PyBuffer_Release(&view);
    PyMem_Free(work), PyMem_Free(jobs);
    Py_XDECREF(words), Py_XDECREF(left), Py_XDECREF(rows), Py_XDECREF(grammars);
    return result;
}

static PyObject *canon(PyObject *self, PyObject *arg) {
    char *text;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &text, &n) < 0) return NULL;
    Buf j = {0}, e = {0};
    const int r = canon_item((const uint8_t *)text, n, &j, &e);
    PyObject *out = r == CANON_NOMEM ? PyErr_NoMemory()
                    : r == CANON_FAIL ? (Py_INCREF(Py_None), Py_None)
                                      : Py_BuildValue("(y#y#)", j.data, j.size, e.data, e.size);
    buf_free(&j), buf_free(&e);
    return out;
}

static PyMethodDef methods[] = {
    {"restrict", restrict_rows, METH_VARARGS,
     "restrict(words_of, bitmask, grammars, rows, guard_type) -> [(i, undecided | None)]\n--\n\n"
     "Restrict the rows of the guards (instances of guard_type) among grammars whose tracker holds a current\n"
     "Plan: clear each allowed token that would finish a repeated item. words_of(bitmask) gives the bitmask as a\n"
     "2-D array of 32-bit words (read only if a row needs it). Returns, for the guards Python must finish, their\n"
     "position in grammars and the token ids left undecided, or None for a row without a current plan (or out\n"
     "of memory). The GIL is released while the rows are decided."},
    {"push_plain", push_plain, METH_VARARGS,
     "push_plain(tracker, data) -> True | False | None: a token of plain bytes inside a string, pushed into the\n"
     "JsonTracker and its plan grown as `accept_token` would (push.c); False: refused (a dead end, the state as it\n"
     "was); None: not this step (the caller takes the Python path)."},
    {"canon", canon, METH_O,
     "canon(text) -> (judged, exact) | None: the canonical keys of one JSON value (None: Python must key it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The uniqueItems guard in C (see fd_guided.unique.native).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&VocabType) < 0 || PyType_Ready(&UsedType) < 0 || PyType_Ready(&PlanType) < 0 ||
        PyType_Ready(&DomainType) < 0)
        return NULL;
    str_tracker = PyUnicode_InternFromString("tracker");
    str_fill_plan = PyUnicode_InternFromString("fill_plan");
    if (str_tracker == NULL || str_fill_plan == NULL) return NULL;
    canon_init();
    if (push_init() < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    const int classes[] = {C_QUOTE, C_NUMBER_END, C_LITERAL_END, C_CLOSE, C_AFTER_QUOTE, C_LITERAL_START};
    PyObject *tuple = Py_BuildValue("(iiiiii)", classes[0], classes[1], classes[2], classes[3], classes[4], classes[5]);
    if (tuple == NULL || PyModule_AddObject(m, "CLASSES", tuple) < 0 || PyModule_AddIntConstant(m, "MAX_FRAMES", MAX_FRAMES) < 0)
        goto fail;
    Py_INCREF(&VocabType), Py_INCREF(&UsedType), Py_INCREF(&PlanType), Py_INCREF(&DomainType);
    if (PyModule_AddObject(m, "Vocab", (PyObject *)&VocabType) < 0 || PyModule_AddObject(m, "Used", (PyObject *)&UsedType) < 0 ||
        PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0 || PyModule_AddObject(m, "Domain", (PyObject *)&DomainType) < 0)
        goto fail;
    return m;
fail:
    Py_XDECREF(tuple);
    Py_DECREF(m);
    return NULL;
}
