/*
 * The tracker's commonest step in C (`push_plain`): a token of plain bytes inside a string.
 *
 * Inside a string with no escape, a token holding no quote and no backslash only extends it. The
 * Python path for it (`UniqueItemsGrammar.accept_token`: `JsonTracker.push`, then
 * `native.make_plan`'s reuse of the string's plan) appends the bytes, checks in a finite domain's
 * item that an unused spelling still begins as the item now does (`JsonReader._item_live`),
 * records the snapshot, and grows the plan to the new size. Here that is one call, no Python code
 * and ~25 objects touched instead of a few hundred bytecodes: it is most of the tokens of a
 * guarded output, and the Python path's footprint between two fills slowed the engine's next
 * batch fill by more than the guard's own restrict cost (docs/benchmarks.md, 2026-11-29, guard3).
 * It takes the step only where `make_plan` would reuse the plan (the same stack, the same string,
 * no backslash since the plan); anywhere else it says None and the Python path runs. The state it
 * leaves is the Python path's, field for field (tests/unique/test_native.py).
 */
#include "native.h"

static PyObject *s_mode, *s_escape, *s_is_key, *s_start, *s_stack, *s_buffer, *s_plan_frames, *s_history,
    *s_fill_plan, *s_closing, *s_duplicate, *s_unused;

int push_init(void) {
    s_mode = PyUnicode_InternFromString("mode"), s_escape = PyUnicode_InternFromString("escape");
    s_is_key = PyUnicode_InternFromString("is_key"), s_start = PyUnicode_InternFromString("start");
    s_stack = PyUnicode_InternFromString("stack"), s_buffer = PyUnicode_InternFromString("buffer");
    s_plan_frames = PyUnicode_InternFromString("plan_frames"), s_history = PyUnicode_InternFromString("_history");
    s_fill_plan = PyUnicode_InternFromString("fill_plan"), s_closing = PyUnicode_InternFromString("closing");
    s_duplicate = PyUnicode_InternFromString("duplicate"), s_unused = PyUnicode_InternFromString("unused");
    return s_mode && s_escape && s_is_key && s_start && s_stack && s_buffer && s_plan_frames && s_history &&
                   s_fill_plan && s_closing && s_duplicate && s_unused
               ? 0
               : -1;
}

/* An exact int's value, or `otherwise` (anything else, or out of range). */
static Py_ssize_t small_int(PyObject *x, Py_ssize_t otherwise) {
    if (x == NULL || !PyLong_CheckExact(x)) return otherwise;
    const Py_ssize_t v = PyLong_AsSsize_t(x);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return otherwise;
    }
    return v;
}

/* `Unique.live` for a finite domain: does a spelling of the sorted tuple `unused` begin with a + b?
 * (bisect_left for a + b, then startswith, as Python does.) -1 if one it reads is not bytes. */
static int some_begins_with(PyObject *unused, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb) {
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(unused);
    while (lo < hi) {
        const Py_ssize_t mid = (lo + hi) / 2;
        PyObject *x = PyTuple_GET_ITEM(unused, mid);
        if (!PyBytes_CheckExact(x)) return -1;
        int c = compare_with_concat(x, a, na, b, nb);
        if (!c) c = PyBytes_GET_SIZE(x) < na + nb ? -1 : 0;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    if (lo == PyTuple_GET_SIZE(unused)) return 0;
    PyObject *x = PyTuple_GET_ITEM(unused, lo);
    if (!PyBytes_CheckExact(x)) return -1;
    return PyBytes_GET_SIZE(x) >= na + nb && !compare_with_concat(x, a, na, b, nb);
}

/* The finite domain's item the step extends, when the plan's guarded array is the top frame and its
 * item has begun: its `Unique` (borrowed from the stack), else NULL (the item is then live). */
static PyObject *finite_item_of(const Plan *plan, PyObject *stack) {
    if (plan->kind != KIND_FINITE || plan->depth || !PyTuple_Check(stack) || !PyTuple_GET_SIZE(stack)) return NULL;
    PyObject *top = PyTuple_GET_ITEM(stack, PyTuple_GET_SIZE(stack) - 1);
    if (!PyTuple_Check(top) || PyTuple_GET_SIZE(top) < 5 || !PyUnicode_Check(PyTuple_GET_ITEM(top, 0)) ||
        PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(top, 0), "a"))
        return NULL; /* (`_unique_of`: an object frame holds none) */
    return PyTuple_GET_ITEM(top, 4);
}

typedef struct {
    PyObject *mode, *escape, *start, *stack, *buffer, *frames, *is_key, *history;
} Fields;

static void fields_clear(Fields *f) {
    Py_XDECREF(f->mode), Py_XDECREF(f->escape), Py_XDECREF(f->start), Py_XDECREF(f->stack);
    Py_XDECREF(f->buffer), Py_XDECREF(f->frames), Py_XDECREF(f->is_key), Py_XDECREF(f->history);
}

/* The step's last plan (borrowed from `plan_frames`) where `make_plan` would reuse it, else NULL. */
static Plan *reusable_plan(PyObject *tracker, Fields *f, Py_ssize_t *planned_size) {
    f->mode = PyObject_GetAttr(tracker, s_mode), f->escape = PyObject_GetAttr(tracker, s_escape);
    if (small_int(f->mode, -1) != MODE_STRING || small_int(f->escape, -1) != 0) return NULL;
    f->frames = PyObject_GetAttr(tracker, s_plan_frames), f->stack = PyObject_GetAttr(tracker, s_stack);
    f->start = PyObject_GetAttr(tracker, s_start), f->buffer = PyObject_GetAttr(tracker, s_buffer);
    if (f->frames == NULL || !PyList_CheckExact(f->frames) || PyList_GET_SIZE(f->frames) != 4 ||
        PyList_GET_ITEM(f->frames, 0) != f->stack || f->buffer == NULL || !PyByteArray_CheckExact(f->buffer))
        return NULL;
    PyObject *last = PyList_GET_ITEM(f->frames, 3);
    if (!PyTuple_CheckExact(last) || PyTuple_GET_SIZE(last) != 3 || !PyObject_TypeCheck(PyTuple_GET_ITEM(last, 1), &PlanType))
        return NULL;
    const Py_ssize_t start = small_int(f->start, -2);
    if (start == -2 || small_int(PyTuple_GET_ITEM(last, 0), -3) != start) return NULL;
    Plan *plan = (Plan *)PyTuple_GET_ITEM(last, 1);
    *planned_size = small_int(PyTuple_GET_ITEM(last, 2), -1);
    if (*planned_size < 0 || plan->buffer != f->buffer || plan->mode != MODE_STRING) return NULL;
    return plan;
}

/* push_plain(tracker, data) -> None | bool: module docstring; True pushed (its plan made), False
 * refused (a dead end: the state as it was), None not taken here. */
PyObject *push_plain(PyObject *self, PyObject *args) {
    PyObject *tracker, *result = NULL;
    const char *data;
    Py_ssize_t n, planned_size = -1;
    if (!PyArg_ParseTuple(args, "Oy#", &tracker, &data, &n)) return NULL;
    if (!n || memchr(data, '"', (size_t)n) || memchr(data, '\\', (size_t)n)) Py_RETURN_NONE;
    Fields f = {0};
    Plan *plan = reusable_plan(tracker, &f, &planned_size);
    if (plan == NULL) {
        if (PyErr_Occurred()) PyErr_Clear(); /* (a missing attribute: not a tracker this path knows) */
        fields_clear(&f);
        Py_RETURN_NONE;
    }
    const Py_ssize_t size = PyByteArray_GET_SIZE(f.buffer);
    const uint8_t *bytes = (const uint8_t *)PyByteArray_AS_STRING(f.buffer);
    if (planned_size < size && memchr(bytes + planned_size, '\\', (size_t)(size - planned_size))) {
        fields_clear(&f); /* a backslash since the plan: `make_plan` plans afresh */
        Py_RETURN_NONE;
    }
    int live = 1;
    PyObject *unique = finite_item_of(plan, f.stack);
    if (unique != NULL && unique != Py_None) {
        PyObject *item_start = PyObject_GetAttr(unique, s_start), *unused = PyObject_GetAttr(unique, s_unused);
        const Py_ssize_t at = small_int(item_start, -2);
        if (unused == NULL || !PyTuple_CheckExact(unused) || at == -2 || at > size) live = -1;
        else if (at >= 0) live = some_begins_with(unused, bytes + at, size - at, (const uint8_t *)data, n);
        Py_XDECREF(item_start), Py_XDECREF(unused);
        if (live < 0) {
            PyErr_Clear();
            fields_clear(&f);
            Py_RETURN_NONE;
        }
    }
    if (!live) { /* `push`: feed refused, the snapshot restored (nothing was kept) */
        if (PyObject_SetAttr(tracker, s_duplicate, Py_False) < 0 || PyObject_SetAttr(tracker, s_closing, Py_False) < 0 ||
            PyObject_SetAttr(tracker, s_fill_plan, Py_None) < 0)
            goto done;
        result = Py_False, Py_INCREF(result);
        goto done;
    }
    f.is_key = PyObject_GetAttr(tracker, s_is_key), f.history = PyObject_GetAttr(tracker, s_history);
    if (f.is_key == NULL || f.history == NULL) goto done;
    if (!PyList_CheckExact(f.history)) {
        PyErr_SetString(PyExc_TypeError, "push_plain: the tracker's _history is not a list");
        goto done;
    }
    PyObject *snapshot = Py_BuildValue("(nOOOOO)", size, f.stack, f.mode, f.escape, f.is_key, f.start);
    if (snapshot == NULL) goto done;
    if (PyByteArray_Resize(f.buffer, size + n) < 0) { Py_DECREF(snapshot); goto done; }
    memcpy(PyByteArray_AS_STRING(f.buffer) + size, data, (size_t)n);
    const int appended = PyList_Append(f.history, snapshot);
    Py_DECREF(snapshot);
    if (appended < 0) goto done;
    if (PyObject_SetAttr(tracker, s_closing, Py_False) < 0) goto done;
    PyObject *size_now = PyLong_FromSsize_t(size + n);
    PyObject *grown = size_now ? plan_at(plan, size_now) : NULL;
    PyObject *last = grown ? PyTuple_Pack(3, f.start, grown, size_now) : NULL;
    Py_XDECREF(size_now);
    if (last == NULL || PyList_SetItem(f.frames, 3, last) < 0 || PyObject_SetAttr(tracker, s_fill_plan, grown) < 0) {
        Py_XDECREF(grown);
        goto done;
    }
    Py_DECREF(grown);
    result = Py_True, Py_INCREF(result);
done:
    fields_clear(&f);
    return result;
}
