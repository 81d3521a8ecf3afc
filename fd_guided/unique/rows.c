/*
 * One row: which allowed tokens to put through `decide` (machine.c), found the cheap way. The
 * candidates are the token classes `JsonTracker.finishing_classes` names for the state (every
 * allowed token in a finite domain), walked as a list where the class is short, else as the row
 * ANDed with the class's bitmap; a token whose shape decides it (`vocab.c`) needs no walk through
 * the machine; an open string item finds its repeats by lookup (`string_item`).
 */
#include "native.h"

static void add_undecided(Row *row, int64_t t) {
    if (row->n_undecided == row->cap_undecided) {
        const Py_ssize_t cap = row->cap_undecided ? 2 * row->cap_undecided : 64;
        int64_t *grown = PyMem_RawRealloc(row->undecided, sizeof(int64_t) * (size_t)cap);
        if (grown == NULL) { row->failed = 1; return; }
        row->undecided = grown, row->cap_undecided = cap;
    }
    row->undecided[row->n_undecided++] = t;
}

static void try_token(Row *row, int64_t t) {
    switch (decide(row, t)) {
    case DUPLICATE: row->words[t >> 5] &= ~(1u << (t & 31)); break;
    case UNDECIDED: add_undecided(row, t); break;
    default: break;
    }
}

typedef uint64_t Lanes __attribute__((vector_size(16))); /* SSE2 on any x86-64; GCC and Clang */

static inline Lanes load4(const uint32_t *p) {
    Lanes x;
    memcpy(&x, p, sizeof x); /* rows need not be aligned */
    return x;
}

/* The row loops below skip the row's empty stretches; where the loader can pick (GCC, x86-64,
 * glibc: ifunc), that scan is compiled for AVX2 and AVX-512 too, as the CPU mask kernel's loops. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
#define SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define SIMD_CLONES
#endif

/* The first word of words[from:to] holding a bit (`to` if none), 64 words at a time where it can.
 * Up to the next multiple of 64 it goes 8 words at a time: a row with many allowed tokens (a
 * finite item's digits: ~360 words hold one) calls it once per word, from the word after. */
SIMD_CLONES Py_ssize_t unique_next_word(const uint32_t *words, Py_ssize_t from, Py_ssize_t to) {
    for (; from < to && (from & 7); from++)
        if (words[from]) return from;
    for (; from + 8 <= to && (from & 63); from += 8) {
        uint32_t any = 0;
        for (int k = 0; k < 8; k++) any |= words[from + k];
        if (any) break;
    }
    for (; from < to && (from & 63); from++)
        if (words[from]) return from;
    for (; from + 64 <= to; from += 64) {
        uint32_t any = 0;
        for (int k = 0; k < 64; k++) any |= words[from + k];
        if (any) break;
    }
    for (; from < to; from++)
        if (words[from]) return from;
    return to;
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

/* [lo, hi): the sorted tuple's strings beginning with a[0:n]. */
static void tuple_range(PyObject *tuple, const uint8_t *a, Py_ssize_t n, Py_ssize_t *lo, Py_ssize_t *hi) {
    for (int upper = 0; upper < 2; upper++) {
        Py_ssize_t l = 0, h = PyTuple_GET_SIZE(tuple);
        while (l < h) {
            const Py_ssize_t mid = (l + h) / 2;
            PyObject *x = PyTuple_GET_ITEM(tuple, mid);
            const Py_ssize_t size = PyBytes_GET_SIZE(x);
            int c = memcmp(PyBytes_AS_STRING(x), a, (size_t)(size < n ? size : n));
            if (!c) c = size < n ? -1 : 0; /* 0: begins with a */
            if (c < 0 || (upper && !c)) l = mid + 1; else h = mid;
        }
        *(upper ? hi : lo) = l;
    }
}

/* The k-th string of the open string's set: used strings (an item) or `values` (a member). */
static const uint8_t *nth_string(const Plan *p, Py_ssize_t k, Py_ssize_t *n, int *whole) {
    if (p->depth) {
        PyObject *x = PyTuple_GET_ITEM(p->values, k);
        *n = PyBytes_GET_SIZE(x), *whole = 1; /* (values are keys C made: whole, and compared clean below) */
        return (const uint8_t *)PyBytes_AS_STRING(x);
    }
    const Entry *x = &p->used->entries[p->used->sorted[k]];
    *n = x->string_size, *whole = x->string_whole;
    return x->string;
}

/* An open string with no escape: the guarded array's item (depth 0), or the value of a member of
 * an object item (depth 1). A token's first quote ends it as `written` + the bytes before the
 * quote (P): the item repeats a used string, or closing the object there would repeat an item,
 * exactly when that is one of a sorted set of strings (used strings; `Plan.values`). So the
 * tokens whose P completes one are found by lookup per string in the quote tokens sorted by P;
 * a token with a simple tail (SH_TAIL_*: nothing more to judge after its first quote) is decided
 * by that alone; the few others go through the machine. For an item, the kind's plain tokens
 * are decided by the reference's own lookup, and only tokens that end it and go on are
 * candidates when no used string begins as it does (`fresh`). Past as many strings in range as
 * quote tokens, every candidate goes through `decide`. */
static void string_item(Row *row, int close) {
    const Plan *p = row->plan;
    const Vocab *v = row->vocab;
    const uint8_t *w = row->buf + p->written_start;
    const Py_ssize_t wn = p->buffer_size - p->written_start;
    const int member = p->depth != 0;
    Py_ssize_t lo, hi;
    if (member) tuple_range(p->values, w, wn, &lo, &hi);
    else used_prefix_range(p->used, w, wn, NULL, 0, &lo, &hi);
    row->fresh = lo == hi;
    if (hi - lo > v->n_by_prefix) {
        walk(row, C_QUOTE | close, SH_NO_QUOTE);
        return;
    }
    const int kind = member ? 2 : p->kind == KIND_LANGUAGE;
    const int mask = member ? 1 : (row->fresh ? 2 : 0) + (close != 0);
    const int closes_array = SH_TAIL_CLOSE | (member ? SH_TAIL_ITEM_CLOSE : 0);
    walk_list(row, &v->quotes[kind][mask][0], 0);
    const IdList *tails = &v->quotes[kind][mask][1];
    for (Py_ssize_t k = 0; k < tails->n && !row->failed; k++) {
        const int32_t t = tails->ids[k];
        if (t >= row->limit) break;
        if (!(row->words[t >> 5] >> (t & 31) & 1)) continue;
        const uint16_t shape = v->shape[t];
        if (row->written_clean && (shape & SH_PREFIX_CLEAN) && !((shape & closes_array) && p->guarded_ancestor))
            continue; /* its first quote ends nothing repeated (unless found below), and nothing follows to judge */
        try_token(row, t);
    }
    const int simple = member ? 0 : kind ? SH_SIMPLE_LANG : SH_SIMPLE_OPEN;
    for (Py_ssize_t k = lo; k < hi && !row->failed; k++) {
        Py_ssize_t size;
        int whole;
        const uint8_t *rest = nth_string(p, k, &size, &whole) + wn;
        const Py_ssize_t rn = size - wn;
        if (rn > v->longest_prefix) continue;
        const int bucket = rn ? rest[0] + 1 : 0;
        Py_ssize_t a = v->by_first[bucket], b = v->by_first[bucket + 1];
        while (a < b) { /* the first quote token whose P is >= rest */
            const Py_ssize_t mid = (a + b) / 2;
            if (compare_to_prefix(v, v->by_prefix[mid], rest, rn) < 0) a = mid + 1; else b = mid;
        }
        for (; a < v->by_first[bucket + 1] && !compare_to_prefix(v, v->by_prefix[a], rest, rn); a++) {
            const int32_t t = v->by_prefix[a];
            const uint16_t shape = v->shape[t];
            if (t >= row->limit || !(row->words[t >> 5] >> (t & 31) & 1)) continue;
            if (!member) {
                if ((shape & simple) || whole) row->words[t >> 5] &= ~(1u << (t & 31));
                continue;
            }
            /* a member's value ended as one after which closing repeats an item */
            if (!(shape & (SH_TAIL_OPEN | SH_TAIL_ITEM | SH_TAIL_ITEM_CLOSE)) || !row->written_clean || !(shape & SH_PREFIX_CLEAN))
                continue; /* went through the machine */
            if (shape & (SH_TAIL_ITEM | SH_TAIL_ITEM_CLOSE)) row->words[t >> 5] &= ~(1u << (t & 31)); /* closed: a repeat */
            else if (shape & SH_TAIL_WS) add_undecided(row, t); /* the close may be forced: Python asks the engine */
        }
    }
}

/* A finite domain's open string item with its `Domain` (domain.c): every allowed token is tried,
 * each found in the domain's cache for the item's bytes (made there on first need), so a token
 * the shortcut decides costs a probe and two reads of `Plan.counts`. 0 if the cache is busy (another
 * thread's row holds it): the caller then goes the way without it. */
static int finite_item_cached(Row *row) {
    const Plan *p = row->plan;
    const Vocab *v = row->vocab;
    Domain *d = p->domain;
    if (!domain_lock(d)) return 0;
    const uint8_t *item = row->buf + p->item_start;
    const Py_ssize_t item_size = p->buffer_size - p->item_start;
    RowMemo *memo = row->shared;
    if (memo_reuse(memo, d, p->counts, item, item_size, row->limit, row->words)) { /* as the row before */
        domain_unlock(d);
        return 1;
    }
    int record = memo != NULL; /* (only a row its shortcut decides alone is kept) */
    if (record) memo->valid = 0, memo->n_cleared = 0;
    Py_ssize_t allowed = 0;
    const int32_t *counts = (const int32_t *)PyBytes_AS_STRING(p->counts);
    Prefix *prefix = domain_prefix(d, item, item_size);
    const Py_ssize_t words = (row->limit + 31) / 32;
    for (Py_ssize_t w = unique_next_word(row->words, 0, words); w < words && prefix != NULL && !row->failed;
         w = unique_next_word(row->words, w + 1, words)) {
        for (uint32_t bits = row->words[w]; bits; bits &= bits - 1) {
            const int64_t t = (int64_t)w * 32 + __builtin_ctz(bits);
            if (t >= row->limit) break;
            allowed++;
            const Reach *r = domain_reach(d, prefix, v, (int32_t)t);
            if (r == NULL) { row->failed = 1; break; }
            if (r->hi < 0) { /* a backslash, or a quote before the end: the machine (this row's items) */
                record = 0;
                try_token(row, t);
            } else if (counts[r->hi] == counts[r->lo]) { /* no unused spelling goes on so */
                row->words[w] &= ~(1u << (t & 31));
                if (record && memo_note(memo, (int32_t)t) < 0) record = 0;
            }
        }
    }
    if (prefix == NULL) row->failed = 1; /* out of memory: Python decides the row */
    if (record && !row->failed && !row->n_undecided && allowed >= MEMO_MIN)
        memo_keep(memo, d, p->counts, item, item_size, row->limit, row->words);
    domain_unlock(d);
    return 1;
}

/* A finite domain's open string item: every allowed token is tried (`_restrict_words`). Those
 * its shortcut decides (no backslash, a quote only last) are live exactly when an unused
 * spelling goes on from the item's bytes with them; with many, they are sorted by their bytes
 * (ranks, radix sorted) and merged with those spellings past the item's bytes, so each is one
 * comparison or two, not a search. The others go through the machine. */
static void finite_item(Row *row) {
    const Plan *p = row->plan;
    const Vocab *v = row->vocab;
    if (p->domain != NULL && finite_item_cached(row)) return;
    const Py_ssize_t skip = p->buffer_size - p->item_start;
    tuple_range(p->unused, row->buf + p->item_start, skip, &row->rests_lo, &row->rests_hi);
    Py_ssize_t n = 0;
    const Py_ssize_t words = (row->limit + 31) / 32;
    for (Py_ssize_t w = 0; w < words && !row->failed; w++) {
        if (!(w & 15) && w + 16 <= words) { /* a block of 16 words without a bit costs a few cycles */
            Lanes any = {0, 0};
            for (int k = 0; k < 16; k += 4) any |= load4(row->words + w + k);
            if (!(any[0] | any[1])) {
                w += 15;
                continue;
            }
        }
        for (uint32_t bits = row->words[w]; bits; bits &= bits - 1) {
            const int64_t t = (int64_t)w * 32 + __builtin_ctz(bits);
            if (t >= row->limit) break;
            const int32_t q = v->quote_at[t];
            const Py_ssize_t len = (Py_ssize_t)(v->offsets[t + 1] - v->offsets[t]);
            if ((v->shape[t] & SH_BACKSLASH) || (q >= 0 && q != len - 1)) { try_token(row, t); continue; }
            if (n == row->cap_sorted) {
                const Py_ssize_t cap = n ? 2 * n : 256;
                int64_t *grown = PyMem_RawRealloc(row->sorted, sizeof(int64_t) * (size_t)(2 * cap));
                if (grown == NULL) { row->failed = 1; return; }
                row->sorted = grown, row->cap_sorted = cap;
            }
            row->sorted[n++] = (int64_t)v->rank[t] << 32 | t;
        }
    }
    if (row->failed) return;
    if (n <= 32) { /* few: one search each */
        for (Py_ssize_t k = 0; k < n; k++) try_token(row, row->sorted[k] & 0xFFFFFFFF);
        return;
    }
    int64_t *a = row->sorted, *b = row->sorted + row->cap_sorted;
    for (int shift = 32; shift < 64; shift += 8) { /* a radix sort of the ranks, a byte a pass */
        Py_ssize_t count[257] = {0};
        for (Py_ssize_t k = 0; k < n; k++) count[((uint64_t)a[k] >> shift & 0xFF) + 1]++;
        for (int c = 0; c < 256; c++) count[c + 1] += count[c];
        for (Py_ssize_t k = 0; k < n; k++) b[count[(uint64_t)a[k] >> shift & 0xFF]++] = a[k];
        int64_t *swap = a; a = b, b = swap;
    }
    const Py_ssize_t nr = row->rests_hi - row->rests_lo;
    Py_ssize_t *at = PyMem_RawRealloc(row->rest_at, sizeof(Py_ssize_t) * (size_t)(nr + 1));
    if (at == NULL) { row->failed = 1; return; }
    row->rest_at = at, row->rests.size = 0, at[0] = 0;
    for (Py_ssize_t k = 0; k < nr; k++) {
        PyObject *x = PyTuple_GET_ITEM(p->unused, row->rests_lo + k);
        if (buf_put(&row->rests, PyBytes_AS_STRING(x) + skip, PyBytes_GET_SIZE(x) - skip) < 0) { row->failed = 1; return; }
        at[k + 1] = row->rests.size;
    }
    Py_ssize_t j = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const int64_t t = a[k] & 0xFFFFFFFF;
        const uint8_t *d = v->flat + v->offsets[t];
        const Py_ssize_t len = (Py_ssize_t)(v->offsets[t + 1] - v->offsets[t]);
        int c = -1;
        for (; j < nr; j++) { /* the first spelling's rest >= the token (tokens come in rising order) */
            const Py_ssize_t size = at[j + 1] - at[j];
            c = memcmp(row->rests.data + at[j], d, (size_t)(size < len ? size : len));
            if (!c) c = size < len ? -1 : 0;
            if (c >= 0) break;
        }
        const int live = j < nr && at[j + 1] - at[j] >= len && !memcmp(row->rests.data + at[j], d, (size_t)len);
        if (!live) row->words[t >> 5] &= ~(1u << (t & 31)); /* every way on is a value the array holds */
    }
}

void run_row(Row *row) {
    const Plan *p = row->plan;
    row->memo[0] = row->memo[1] = -2;
    row->n_undecided = 0, row->failed = 0, row->fresh = 0, row->written_clean = 0;
    if (p->kind == KIND_FINITE) { /* any token may lead into a dead end: every allowed one */
        if (p->written_start >= 0) finite_item(row);
        else walk(row, 0, 0);
        return;
    }
    const int close = p->depth > 0 || p->guarded_ancestor ? C_CLOSE : 0;
    if (p->written_start >= 0) {
        const uint8_t *w = row->buf + p->written_start;
        const Py_ssize_t wn = p->buffer_size - p->written_start;
        row->written_clean = valid_utf8(w, wn);
        for (Py_ssize_t i = 0; i < wn && row->written_clean; i++) row->written_clean = w[i] >= 0x20;
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
    buf_free(&row->done_judged), buf_free(&row->done_exact), buf_free(&row->rests);
    PyMem_RawFree(row->undecided), PyMem_RawFree(row->rest_at), PyMem_RawFree(row->sorted);
    row->undecided = NULL, row->rest_at = NULL, row->sorted = NULL;
}
