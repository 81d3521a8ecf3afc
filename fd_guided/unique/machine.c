/*
 * One row's decisions: the allowed tokens `JsonTracker` would try in the row's state, each
 * decided as `JsonTracker.finishes_duplicate` decides it (its shortcuts first, then its byte
 * machine from the planned state), with the GIL released.
 *
 * The machine follows the frames from the innermost guarded array up (`Plan.frames`): an item of
 * that array ending is keyed (`canon.c`) and looked up among the finished ones (`used.c`) and any
 * the token finished before; a member of an object item ending asks whether closing the object
 * there would repeat an item (the tracker's `closing`; if so at the token's end, Python asks the
 * engine); a literal begun is looked up at once; in a finite domain every byte of an item must
 * leave it a prefix of an unused spelling, and a comma needs one left. What it cannot judge it
 * hands back undecided (`UNDECIDED`), and the guard asks the Python tracker: a second item
 * finished in one token, an item C cannot key, an array opened here that may be guarded, closing
 * the guarded array inside another, a byte after the guarded array closed that is not a comma,
 * bracket or whitespace.
 */
#include "native.h"

typedef struct {
    int mode, escape, is_key, literal_left;
    int depth;                    /* as Plan.depth */
    int top_closed, top_commas, needed_commas; /* when Plan.child still speaks of an array opened now */
    int closed, closing, finished;
    int closing_known;            /* `closing` was just computed for a member's end: a "}" now ends the item as it */
    int done_unknown;             /* the item finished in this token was judged without its keys */
    Py_ssize_t value_tok;         /* the string value of the planned member began at d[value_tok] (-1: before, or none) */
    Py_ssize_t item_buf, item_tok; /* the guarded array's item began at buf[item_buf] or d[item_tok] (-1: not) */
    Py_ssize_t removed;           /* a finite domain: the spelling an item finished in this token used */
    Frame f[MAX_FRAMES];
} Machine;

static int ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int number_byte(uint8_t c) { return (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E'; }

/* ---- sorted tuples of bytes ------------------------------------------------------------- */

/* The index of a + b in a sorted tuple of distinct bytes (Python's order: bytewise, then
 * shorter first), -1 if it is not there. */
static Py_ssize_t find_concat(PyObject *tuple, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb) {
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(tuple);
    while (lo < hi) {
        const Py_ssize_t mid = (lo + hi) / 2;
        PyObject *x = PyTuple_GET_ITEM(tuple, mid);
        const Py_ssize_t n = PyBytes_GET_SIZE(x);
        int c = compare_with_concat(x, a, na, b, nb);
        if (!c) c = (n > na + nb) - (n < na + nb);
        if (!c) return mid;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return -1;
}

/* ---- the item being written -------------------------------------------------------------- */

static int item_text(Row *row, const Machine *m, const uint8_t *d, Py_ssize_t end, int brace) {
    Buf *s = &row->scratch;
    s->size = 0;
    if (m->item_buf >= 0) {
        if (buf_put(s, row->buf + m->item_buf, row->plan->buffer_size - m->item_buf) < 0 || buf_put(s, d, end) < 0)
            return -1;
    } else if (buf_put(s, d + m->item_tok, end - m->item_tok) < 0) return -1;
    return brace && buf_put(s, "}", 1) < 0 ? -1 : 0;
}

static int same(const Buf *a, const Buf *b) { return a->size == b->size && !memcmp(a->data, b->data, (size_t)a->size); }

/* A string item without escapes: its key is its bytes (`item_keys`' own path), so it repeats one
 * exactly when they are a used string's; none can when no used string begins as the item did
 * before the token (`Row.fresh`). 1 yes, 0 no, -1 not known here, -2 not such an item. */
static int string_repeats(Row *row, const Machine *m, const uint8_t *d, Py_ssize_t end) {
    const Plan *p = row->plan;
    const uint8_t *a = NULL, *b;
    Py_ssize_t na = 0, nb;
    if (m->item_buf >= 0) {
        if (m->item_buf != p->item_start || p->written_start < 0 || p->depth) return -2;
        a = row->buf + p->written_start, na = p->buffer_size - p->written_start, b = d, nb = end - 1;
    } else {
        if (d[m->item_tok] != '"') return -2;
        b = d + m->item_tok + 1, nb = end - m->item_tok - 2;
    }
    if (nb < 0 || memchr(b, '\\', (size_t)nb)) return -2;
    if (na && !row->written_clean) { /* a character split across the token boundary (or a control) */
        Buf *s = &row->scratch;
        s->size = 0;
        if (buf_put(s, a, na) < 0 || buf_put(s, b, nb) < 0) { row->failed = 1; return -1; }
        if (!valid_utf8(s->data, s->size)) return -1;
    } else if (!valid_utf8(b, nb)) return -1;
    if (m->item_buf >= 0 && row->fresh) return 0;
    return used_has_string(p->used, a, na, b, nb);
}

/* The planned member's string value ended at d[end] (after its quote): is it one of `Plan.values`,
 * after which closing the object item repeats one? 1 yes, 0 no, -1 not known here, -2 not such
 * a value (another member, a value not a string, an escape). */
static int member_repeats(Row *row, const Machine *m, const uint8_t *d, Py_ssize_t end) {
    const Plan *p = row->plan;
    if (p->values == Py_None || p->depth != 1 || m->depth != 1 || m->top_closed || m->top_commas) return -2;
    const uint8_t *a = NULL, *b;
    Py_ssize_t na = 0, nb;
    if (m->value_tok >= 0) b = d + m->value_tok + 1, nb = end - m->value_tok - 2;
    else if (p->written_start >= 0) a = row->buf + p->written_start, na = p->buffer_size - p->written_start, b = d, nb = end - 1;
    else return -2;
    if (nb < 0 || memchr(b, '\\', (size_t)nb)) return -2;
    if (na && !row->written_clean) return -2;
    for (Py_ssize_t i = 0; i < nb; i++) if (b[i] < 0x20) return -1; /* json.loads refuses it in an object */
    if (!valid_utf8(b, nb)) return -1; /* (`written` is whole characters: the two join cleanly) */
    return find_concat(p->values, a, na, b, nb) >= 0;
}

/* Would the item as written up to d[end] (closed with a "}" when `brace`) repeat an earlier
 * one? 1 yes, 0 no, -1 not known here. Its keys stay in row->judged/exact (not for a string
 * item decided by `string_repeats`). The item as it stood before the token, followed by
 * whitespace and at most one "}", is keyed once per row. */
static int repeats(Row *row, const Machine *m, const uint8_t *d, Py_ssize_t end, int brace) {
    const Plan *p = row->plan;
    if (m->finished && m->done_unknown) return -1;
    if (!brace && p->kind != KIND_FINITE) {
        const int r = string_repeats(row, m, d, end);
        if (r != -2) {
            row->judged.size = row->exact.size = 0; /* a string: equal to no other kind of value */
            return r;
        }
    }
    if (brace) {
        const int r = member_repeats(row, m, d, end);
        if (r != -2) return r;
    }
    int memo = -1;
    if (m->item_buf >= 0 && !m->finished && p->kind != KIND_FINITE && (p->mode == MODE_NONE || p->mode == MODE_NUMBER)) {
        int braces = brace, plain = 1;
        for (Py_ssize_t i = 0; i < end && plain; i++) {
            if (d[i] == '}' && i == end - 1) braces++;
            else if (!ws(d[i])) plain = 0;
        }
        if (plain && braces <= 1) {
            memo = braces;
            if (row->memo[memo] > -2) return row->memo[memo];
        }
    }
    if (item_text(row, m, d, end, brace) < 0) { row->failed = 1; return -1; }
    row->judged.size = row->exact.size = 0;
    const int r = canon_item(row->scratch.data, row->scratch.size, &row->judged, &row->exact);
    if (r == CANON_NOMEM) { row->failed = 1; return -1; }
    int result = -1;
    if (r == CANON_OK)
        result = used_holds(p->used, p->count, row->judged.data, row->judged.size, row->exact.data, row->exact.size) ||
                 (m->finished && (same(&row->judged, &row->done_judged) || same(&row->exact, &row->done_exact)));
    if (memo >= 0) row->memo[memo] = (int8_t)result;
    return result;
}

/* A finite domain: is there an unused spelling (other than `removed`) beginning with a + b? */
static int live(const Row *row, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb, Py_ssize_t removed) {
    const Plan *p = row->plan;
    if (p->domain != NULL) { /* the domain's spellings that begin so, less the used ones (`removed`: a domain index) */
        const int32_t *counts = (const int32_t *)PyBytes_AS_STRING(p->counts);
        int32_t lo, hi;
        domain_range(p->domain, a, na, b, nb, &lo, &hi);
        return counts[hi] - counts[lo] - (removed >= lo && removed < hi) > 0;
    }
    PyObject *unused = p->unused;
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(unused);
    while (lo < hi) { /* the first spelling >= a + b, or beginning with it */
        const Py_ssize_t mid = (lo + hi) / 2;
        PyObject *x = PyTuple_GET_ITEM(unused, mid);
        int c = compare_with_concat(x, a, na, b, nb);
        if (!c) c = PyBytes_GET_SIZE(x) < na + nb ? -1 : 0;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    for (; lo < PyTuple_GET_SIZE(unused); lo++) {
        PyObject *x = PyTuple_GET_ITEM(unused, lo);
        const uint8_t *s = (const uint8_t *)PyBytes_AS_STRING(x);
        const Py_ssize_t n = PyBytes_GET_SIZE(x);
        if (n < na + nb || memcmp(s, a, (size_t)na) || memcmp(s + na, b, (size_t)nb)) return 0;
        if (lo != removed) return 1;
    }
    return 0;
}

static int item_live(Row *row, const Machine *m, const uint8_t *d, Py_ssize_t end) {
    if (m->item_buf >= 0)
        return live(row, row->buf + m->item_buf, row->plan->buffer_size - m->item_buf, d, end, m->removed);
    return live(row, d + m->item_tok, end - m->item_tok, NULL, 0, m->removed);
}

/* A finite domain's open string item, a token d[0:n] (no backslash, its quote last if any): does an
 * unused spelling go on from the item's bytes with it? (`Unique.live`, within `Row.rests_*`.) */
static int rest_live(const Row *row, const uint8_t *d, Py_ssize_t n) {
    PyObject *unused = row->plan->unused;
    const Py_ssize_t skip = row->plan->buffer_size - row->plan->item_start;
    Py_ssize_t lo = row->rests_lo, hi = row->rests_hi;
    while (lo < hi) { /* the first spelling whose rest is >= d */
        const Py_ssize_t mid = (lo + hi) / 2;
        PyObject *x = PyTuple_GET_ITEM(unused, mid);
        const Py_ssize_t size = PyBytes_GET_SIZE(x) - skip;
        int c = memcmp(PyBytes_AS_STRING(x) + skip, d, (size_t)(size < n ? size : n));
        if (!c) c = size < n ? -1 : 0;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    if (lo >= row->rests_hi) return 0;
    PyObject *x = PyTuple_GET_ITEM(unused, lo);
    return PyBytes_GET_SIZE(x) - skip >= n && !memcmp(PyBytes_AS_STRING(x) + skip, d, (size_t)n);
}

/* The unused spelling equal to the item just keyed (in row->scratch), -1 if none: its index in the
 * plan's `Domain` where it has one (as `live` then reads `removed`), else in `Plan.unused`. */
static Py_ssize_t spelling(const Row *row) {
    const Plan *p = row->plan;
    if (p->domain != NULL) {
        const Domain *d = p->domain;
        const int32_t *counts = (const int32_t *)PyBytes_AS_STRING(p->counts);
        int32_t lo, hi;
        domain_range(d, row->scratch.data, row->scratch.size, NULL, 0, &lo, &hi);
        const int exact = lo < hi && d->at[lo + 1] - d->at[lo] == row->scratch.size; /* (a prefix sorts first) */
        return exact && counts[lo + 1] > counts[lo] ? lo : -1;
    }
    return find_concat(p->unused, row->scratch.data, row->scratch.size, NULL, 0);
}

/* ---- the byte machine -------------------------------------------------------------------- */

static int value_start(Machine *m, Py_ssize_t i) {
    if (m->f[m->depth].opaque) return UNDECIDED;
    if (m->depth == 1) m->value_tok = -1;
    if (m->depth == 0) m->item_tok = i, m->item_buf = -1;
    return KEEP;
}

static int value_end(Row *row, Machine *m, const uint8_t *d, Py_ssize_t end) {
    if (m->depth == 0) {
        if (m->finished) return UNDECIDED;
        if (m->closing_known) { /* an object item closed right after a member's end: as closing it was judged */
            if (m->closing) return DUPLICATE;
            m->closing_known = 0;
            m->finished = 1, m->done_unknown = 1, m->f[0].phase = PH_COMMA, m->item_buf = m->item_tok = -1;
            return KEEP;
        }
        const int r = repeats(row, m, d, end, 0);
        if (r) return r < 0 ? UNDECIDED : DUPLICATE;
        if (row->plan->kind == KIND_FINITE && (m->removed = spelling(row)) < 0) return UNDECIDED;
        row->done_judged.size = row->done_exact.size = 0;
        if (buf_put(&row->done_judged, row->judged.data, row->judged.size) < 0 ||
            buf_put(&row->done_exact, row->exact.data, row->exact.size) < 0) {
            row->failed = 1;
            return UNDECIDED;
        }
        m->finished = 1, m->f[0].phase = PH_COMMA, m->item_buf = m->item_tok = -1;
        return KEEP;
    }
    Frame *top = &m->f[m->depth];
    top->phase = PH_COMMA;
    if (top->kind == 'o' && m->depth == 1) { /* a member of an object item ended: would closing it repeat one? */
        const int r = repeats(row, m, d, end, 1);
        if (r < 0) return UNDECIDED;
        m->closing = r, m->closing_known = 1;
    }
    return KEEP;
}

static int structural(Row *row, Machine *m, const uint8_t *d, Py_ssize_t i) {
    const Plan *p = row->plan;
    const uint8_t c = d[i];
    Frame *top = &m->f[m->depth];
    int r;
    if (ws(c)) return KEEP;
    const int known = m->closing_known && c == '}' && m->depth == 1, judged = m->closing;
    m->closing = 0, m->closing_known = 0;
    switch (c) {
    case '"':
        m->is_key = top->kind == 'o' && top->phase == PH_KEY;
        if (!m->is_key && (r = value_start(m, i)) != KEEP) return r;
        if (!m->is_key && m->depth == 1) m->value_tok = i;
        m->mode = MODE_STRING, m->escape = 0;
        return KEEP;
    case 't': case 'f': case 'n':
        if ((r = value_start(m, i)) != KEEP) return r;
        m->mode = MODE_LITERAL, m->literal_left = (c == 'f' ? 5 : 4) - 1;
        if (m->depth == 0 && (used_holds(p->used, p->count, &c, 1, &c, 1) ||
                              (m->finished && row->done_judged.size == 1 && row->done_judged.data[0] == c)))
            return DUPLICATE; /* a literal the array holds cannot become anything else */
        return KEEP;
    case '{': case '[': {
        if ((r = value_start(m, i)) != KEEP) return r;
        if (m->depth + 1 >= MAX_FRAMES) return UNDECIDED;
        const int known = !m->top_closed && m->depth == p->depth && m->top_commas == m->needed_commas && p->child == 0;
        m->depth++;
        m->f[m->depth] = (Frame){c == '{' ? 'o' : 'a', c == '{' ? PH_KEY : PH_VALUE, c == '[' && !known};
        return KEEP;
    }
    case '}': case ']':
        if (m->depth == 0) { /* the guarded array closes */
            if (p->guarded_ancestor) return UNDECIDED;
            m->closed = 1;
            return KEEP;
        }
        if (m->depth == p->depth) m->top_closed = 1;
        m->depth--;
        if (known) m->closing = judged, m->closing_known = 1; /* the item ends as closing it was judged */
        return value_end(row, m, d, i + 1);
    case ',':
        if (m->depth == p->depth && !m->top_closed) m->top_commas++;
        if (top->kind == 'o') { top->phase = PH_KEY; return KEEP; }
        if (top->opaque) return UNDECIDED;
        if (m->depth == 0 && p->kind == KIND_FINITE && PyTuple_GET_SIZE(p->unused) - (m->removed >= 0) == 0)
            return DUPLICATE; /* every value used: another item could only repeat one */
        top->phase = PH_VALUE;
        return KEEP;
    case ':':
        if (top->kind == 'o') top->phase = PH_VALUE;
        return KEEP;
    default:
        if (c == '-' || (c >= '0' && c <= '9')) {
            if ((r = value_start(m, i)) != KEEP) return r;
            m->mode = MODE_NUMBER;
        }
        return KEEP;
    }
}

static int feed(Row *row, const uint8_t *d, Py_ssize_t n) {
    const Plan *p = row->plan;
    Machine m;
    m.mode = p->mode, m.escape = p->escape, m.is_key = p->is_key, m.literal_left = p->literal_left;
    m.depth = p->depth, m.top_closed = m.top_commas = 0;
    m.needed_commas = p->frames[p->depth].kind == 'a' && p->frames[p->depth].phase == PH_COMMA;
    m.closed = m.closing = m.finished = m.closing_known = m.done_unknown = 0;
    m.value_tok = -1;
    m.item_buf = p->item_start, m.item_tok = -1, m.removed = -1;
    memcpy(m.f, p->frames, sizeof(Frame) * (size_t)(p->depth + 1));
    const int finite = p->kind == KIND_FINITE;
    int r;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t c = d[i];
        if (m.closed) {
            if (ws(c) || c == ',' || c == ']' || c == '}') continue; /* the parents' members and brackets */
            return UNDECIDED;
        }
        switch (m.mode) {
        case MODE_STRING:
            if (m.escape == 1) m.escape = c == 'u' ? 2 : 0;
            else if (m.escape) m.escape = m.escape == 5 ? 0 : m.escape + 1;
            else if (c == '\\') m.escape = 1;
            else if (c == '"') {
                m.mode = MODE_NONE;
                if (m.is_key) m.f[m.depth].phase = PH_COLON;
                else if ((r = value_end(row, &m, d, i + 1)) != KEEP) return r;
            } else /* a run of plain bytes: the tracker checks the item once after it */
                while (i + 1 < n && d[i + 1] != '"' && d[i + 1] != '\\') i++;
            break;
        case MODE_NUMBER:
            if (number_byte(c)) break;
            m.mode = MODE_NONE;
            if ((r = value_end(row, &m, d, i)) != KEEP || (r = structural(row, &m, d, i)) != KEEP) return r;
            break;
        case MODE_LITERAL:
            if (--m.literal_left == 0) {
                m.mode = MODE_NONE;
                if ((r = value_end(row, &m, d, i + 1)) != KEEP) return r;
            }
            break;
        default:
            if ((r = structural(row, &m, d, i)) != KEEP) return r;
        }
        if (finite && m.depth == 0 && m.mode != MODE_NONE && (m.item_buf >= 0 || m.item_tok >= 0) &&
            !item_live(row, &m, d, i + 1))
            return DUPLICATE; /* every way on is a value the array holds */
    }
    return m.closing ? UNDECIDED : KEEP; /* closing repeats: Python asks the engine whether it must close */
}

/* ---- one token, one row ------------------------------------------------------------------ */

/* `JsonTracker.finishes_duplicate`: its shortcuts for an open string item, then the machine. */
int decide(Row *row, int64_t t) {
    const Vocab *v = row->vocab;
    const Plan *p = row->plan;
    const uint8_t *d = v->flat + v->offsets[t];
    const Py_ssize_t n = (Py_ssize_t)(v->offsets[t + 1] - v->offsets[t]);
    if (p->written_start >= 0 && !p->depth) { /* `JsonTracker._open_string_item` */
        const int32_t q = v->quote_at[t];
        const int backslash = v->shape[t] & SH_BACKSLASH;
        const uint8_t *w = row->buf + p->written_start;
        const Py_ssize_t wn = p->buffer_size - p->written_start;
        if (p->kind == KIND_FINITE) {
            if (!backslash && (q < 0 || q == n - 1)) return rest_live(row, d, n) ? KEEP : DUPLICATE;
        } else if (p->kind == KIND_LANGUAGE) {
            if (!backslash && q < 0) return KEEP;
            if (!backslash && q == n - 1) return used_has_string(p->used, w, wn, d, q) ? DUPLICATE : KEEP;
        } else if (!(v->flags[t] & C_AFTER_QUOTE)) {
            if (q < 0) return KEEP;
            if (v->shape[t] & SH_SIMPLE_OPEN) return used_has_string(p->used, w, wn, d, q) ? DUPLICATE : KEEP;
        }
    }
    return feed(row, d, n);
}
