/*
 * One row: which allowed tokens to put through `decide` (machine.c), found the cheap way. The
 * candidates are the token classes `JsonTracker.finishing_classes` names for the state (every
 * allowed token in a finite domain), walked as a list where the class is short, else as the row
 * ANDed with the class's bitmap; a token whose shape decides it (`vocab.c`) needs no walk through
 * the machine; an open string item finds its repeats by lookup (`string_item`).
 */
#include "native.h"

static void try_token(Row *row, int64_t t) {
    uint32_t *word = &row->words[t >> 5];
    const uint32_t bit = 1u << (t & 31);
    switch (decide(row, t)) {
    case DUPLICATE: *word &= ~bit; break;
    case UNDECIDED:
        if (row->n_undecided == row->cap_undecided) {
            const Py_ssize_t cap = row->cap_undecided ? 2 * row->cap_undecided : 64;
            int64_t *grown = PyMem_RawRealloc(row->undecided, sizeof(int64_t) * (size_t)cap);
            if (grown == NULL) { row->failed = 1; return; }
            row->undecided = grown, row->cap_undecided = cap;
        }
        row->undecided[row->n_undecided++] = t;
        break;
    default: break;
    }
}

typedef uint64_t Lanes __attribute__((vector_size(16))); /* SSE2 on any x86-64; GCC and Clang */

static inline Lanes load4(const uint32_t *p) {
    Lanes x;
    memcpy(&x, p, sizeof x); /* rows need not be aligned */
    return x;
}

static void walk_words(Row *row, const uint32_t *map, Py_ssize_t from, Py_ssize_t to, int skip) {
    uint32_t block[16];
    unsigned nonzero = 0;
    for (Py_ssize_t k = from; k < to; k++) {
        block[k - from] = row->words[k] & (map ? map[k] : 0xFFFFFFFFu);
        nonzero |= (unsigned)(block[k - from] != 0) << (k - from);
    }
    for (; nonzero; nonzero &= nonzero - 1) {
        const int at = __builtin_ctz(nonzero);
        for (uint32_t bits = block[at]; bits; bits &= bits - 1) {
            const int64_t t = (int64_t)(from + at) * 32 + __builtin_ctz(bits);
            if (t >= row->limit) return;
            if (!(row->vocab->shape[t] & skip)) try_token(row, t);
        }
    }
}

static void walk_list(Row *row, const IdList *list, int skip) {
    for (Py_ssize_t k = 0; k < list->n && !row->failed; k++) {
        const int32_t t = list->ids[k];
        if (t >= row->limit) break;
        if ((row->words[t >> 5] >> (t & 31) & 1) && !(row->vocab->shape[t] & skip)) try_token(row, t);
    }
}

/* The allowed tokens of `map` (every allowed token for NULL), but those of a shape in `skip`
 * (decided as kept without a look), each through `decide`. */
static void walk_map(Row *row, const uint32_t *map, int skip) {
    const uint32_t *words = row->words;
    const Py_ssize_t n = (row->limit + 31) / 32;
    Py_ssize_t w = 0;
    /* the row ANDed with the class, 16 words at a time (a block without a bit costs a few cycles) */
    for (; w + 16 <= n; w += 16) {
        Lanes any = {0, 0};
        if (map != NULL)
            for (int k = 0; k < 16; k += 4) any |= load4(words + w + k) & load4(map + w + k);
        else
            for (int k = 0; k < 16; k += 4) any |= load4(words + w + k);
        if (!(any[0] | any[1])) continue;
        walk_words(row, map, w, w + 16, skip);
        if (row->failed) return;
    }
    if (w < n && !row->failed) walk_words(row, map, w, n, skip);
}

/* The allowed tokens holding a class of `mask` (every allowed token for mask 0), but those of a
 * shape in `skip`, each through `decide`: a short class by its list, in order. */
static void walk(Row *row, int mask, int skip) {
    const IdList *list = &row->vocab->lists[mask];
    if (mask && list->ids != NULL) walk_list(row, list, skip);
    else walk_map(row, mask ? row->vocab->maps[mask] : NULL, skip);
}

static int compare_to_prefix(const Vocab *v, int32_t t, const uint8_t *r, Py_ssize_t n) {
    const Py_ssize_t have = v->quote_at[t];
    const int c = memcmp(v->flat + v->offsets[t], r, (size_t)(have < n ? have : n));
    return c ? c : (have > n) - (have < n);
}

/* An open string item (`written`, no escape). Its candidates are the quote tokens (only those
 * that end it and go on when no used string begins as it does: `fresh`). A token's first quote
 * ends the item as `written` + the bytes before it (P): a repeat exactly when a used string is
 * that (the kind's plain tokens: the reference's own lookup; others when the string is whole
 * UTF-8, as the reference keys it). So the tokens whose P completes a used string are found by
 * lookup, per used string; a token with a simple tail (SH_TAIL_*) then judges nothing more, so
 * it is kept otherwise; the few others go through the machine. Past as many used strings as
 * quote tokens, every candidate goes through `decide`. */
static void string_item(Row *row, int close) {
    const Plan *p = row->plan;
    const Vocab *v = row->vocab;
    const uint8_t *w = row->buf + p->written_start;
    const Py_ssize_t wn = p->buffer_size - p->written_start;
    Py_ssize_t lo, hi;
    used_prefix_range(p->used, w, wn, NULL, 0, &lo, &hi);
    row->fresh = lo == hi;
    if (hi - lo > v->n_by_prefix) {
        walk(row, C_QUOTE | close, SH_NO_QUOTE);
        return;
    }
    const int kind = p->kind == KIND_LANGUAGE, mask = (row->fresh ? 2 : 0) + (close != 0);
    walk_list(row, &v->quotes[kind][mask][0], 0);
    const IdList *tails = &v->quotes[kind][mask][1];
    for (Py_ssize_t k = 0; k < tails->n && !row->failed; k++) {
        const int32_t t = tails->ids[k];
        if (t >= row->limit) break;
        if (!(row->words[t >> 5] >> (t & 31) & 1)) continue;
        const uint8_t shape = v->shape[t];
        if (row->written_whole && (shape & SH_PREFIX_UTF8) && !((shape & SH_TAIL_CLOSE) && p->guarded_ancestor))
            continue; /* kept, unless its P completes a used string (below) */
        try_token(row, t);
    }
    const int simple = kind ? SH_SIMPLE_LANG : SH_SIMPLE_OPEN;
    for (Py_ssize_t k = lo; k < hi; k++) {
        const Entry *x = &p->used->entries[p->used->sorted[k]];
        const uint8_t *rest = x->string + wn;
        const Py_ssize_t rn = x->string_size - wn;
        if (rn > v->longest_prefix) continue;
        const int bucket = rn ? rest[0] + 1 : 0;
        Py_ssize_t a = v->by_first[bucket], b = v->by_first[bucket + 1];
        while (a < b) { /* the first quote token whose P is >= rest */
            const Py_ssize_t mid = (a + b) / 2;
            if (compare_to_prefix(v, v->by_prefix[mid], rest, rn) < 0) a = mid + 1; else b = mid;
        }
        for (; a < v->by_first[bucket + 1] && !compare_to_prefix(v, v->by_prefix[a], rest, rn); a++) {
            const int32_t t = v->by_prefix[a];
            if (t < row->limit && ((v->shape[t] & simple) || x->string_whole)) row->words[t >> 5] &= ~(1u << (t & 31));
        }
    }
}

void run_row(Row *row) {
    const Plan *p = row->plan;
    row->memo[0] = row->memo[1] = -2;
    row->n_undecided = 0, row->failed = 0, row->fresh = 0;
    if (p->kind == KIND_FINITE) { /* any token may lead into a dead end: every allowed one */
        walk(row, 0, 0);
        return;
    }
    const int close = p->depth > 0 || p->guarded_ancestor ? C_CLOSE : 0;
    if (p->written_start >= 0) {
        row->written_whole = valid_utf8(row->buf + p->written_start, p->buffer_size - p->written_start);
        string_item(row, close);
        return;
    }
    if (p->mode == MODE_NONE) { /* between values: the structural class but the harmless tokens */
        walk_map(row, row->vocab->look_between, 0);
        return;
    }
    static const int mode_class[4] = {C_STRUCTURAL, C_QUOTE, C_NUMBER_END, C_LITERAL_END};
    walk(row, mode_class[p->mode] | close, p->mode == MODE_STRING ? SH_NO_QUOTE : 0);
}

void row_free(Row *row) {
    buf_free(&row->scratch), buf_free(&row->judged), buf_free(&row->exact);
    buf_free(&row->done_judged), buf_free(&row->done_exact);
    PyMem_RawFree(row->undecided);
    row->undecided = NULL;
}
