/*
 * The uniqueItems guard in C (fd_guided.unique.native): declarations shared by its files.
 *
 *   text.c     byte buffers, strict UTF-8, hashing
 *   canon.c    canonical keys of a JSON value's text: equal exactly when `items.item_keys` says so
 *   used.c     `Used`: one guarded array's finished items (a mirror of `items.Items`), hashed
 *   vocab.c    `Vocab`: one tokenizer's token bytes, classes, shapes and candidate lists
 *   domain.c   `Domain`: a finite item domain's spellings, and which each token can reach per item prefix
 *   machine.c  the tracker's byte machine over one token, from a row's `Plan`
 *   rows.c     one row's candidates, walked the cheap way, each through the machine
 *   push.c     the tracker's commonest step (plain bytes inside a string) and its plan, without Python code
 *   _native.c  the module: `Plan` (a tracker's state, made when a token is accepted) and `restrict`
 *
 * Nothing here runs Python code or touches Python objects' reference counts once the GIL is
 * released; the objects read there are held by the caller for the whole call.
 */
#ifndef FD_GUIDED_UNIQUE_NATIVE_H
#define FD_GUIDED_UNIQUE_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* Token classes: `tracker.py`'s QUOTE ... LITERAL_START (native.py checks they agree). */
enum { C_QUOTE = 1, C_NUMBER_END = 2, C_LITERAL_END = 4, C_CLOSE = 8, C_AFTER_QUOTE = 16, C_LITERAL_START = 32 };
#define C_STRUCTURAL (C_QUOTE | C_NUMBER_END | C_LITERAL_END | C_CLOSE | C_LITERAL_START)
#define NUM_MASKS 64

/* Token shapes (vocab.c): what a token can do, read from its bytes alone. */
enum {
    SH_HARMLESS_NONE = 1, /* between values: only whitespace, commas, and the start of one value that stays open */
    SH_SIMPLE_OPEN = 2,   /* a quote, no backslash before it, no ",]}" after it: the reference's plain lookup */
    SH_SIMPLE_LANG = 4,   /* its one quote last, no backslash at all: the same for a string language */
    SH_BACKSLASH = 8,     /* holds a backslash */
    SH_NO_QUOTE = 16,     /* holds no quote: inside a string it only extends it */
    /* a quote with no backslash before it, then only: */
    SH_TAIL_OPEN = 32,    /* whitespace, at most one comma, at most one string begun (no quote or backslash after) */
    SH_TAIL_CLOSE = 64,   /* whitespace, then a bracket, then only whitespace, commas and brackets */
    SH_PREFIX_CLEAN = 128, /* the bytes before its first quote are whole UTF-8 characters, none a control */
    SH_TAIL_ITEM = 256,   /* whitespace, "}", then at most a comma and an object begun ('{' and a key begun) */
    SH_TAIL_ITEM_CLOSE = 512, /* whitespace, "}", whitespace, "]", then only whitespace, commas and brackets */
    SH_TAIL_WS = 1024,    /* only whitespace (or nothing) */
};
#define SH_TAILS (SH_TAIL_OPEN | SH_TAIL_CLOSE | SH_TAIL_ITEM | SH_TAIL_ITEM_CLOSE)

/* A growable byte buffer (PyMem_Raw: usable without the GIL). */
typedef struct {
    uint8_t *data;
    Py_ssize_t size, cap;
} Buf;

int buf_reserve(Buf *b, Py_ssize_t extra);
int buf_put(Buf *b, const void *p, Py_ssize_t n);
void buf_free(Buf *b);

/* ---- canon.c ---- */
enum { CANON_FAIL = 0, CANON_OK = 1, CANON_NOMEM = -1 };
/* Canonical judged and exact keys of text[0:n] (a whole JSON value) appended to `judged` and
 * `exact`: byte-equal exactly when `item_keys` gives equal keys. CANON_FAIL where Python's keys
 * could differ in kind (invalid JSON, "raw" keys, limits): the caller then leaves it to Python. */
int canon_item(const uint8_t *text, Py_ssize_t n, Buf *judged, Buf *exact);
/* used.c: the end of the one canonical key at p (NULL if it is not one within end). */
const uint8_t *canon_skip(const uint8_t *p, const uint8_t *end);
uint64_t canon_hash(const uint8_t *p, Py_ssize_t n);
int valid_utf8(const uint8_t *p, Py_ssize_t n); /* text.c: strict, as Python decodes */
int utf8_char(const uint8_t *p, const uint8_t *end); /* the length of the character at p, 0 if none */
/* text.c: the bytes object x against a + b over their common length (memcmp's sign; 0: one begins as the other) */
int compare_with_concat(PyObject *x, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb);

/* ---- used.c ---- */
typedef struct {
    uint64_t serial;                /* items.Items' serial of the entry */
    uint8_t *judged, *exact;        /* canonical keys (NULL: C cannot key it) */
    Py_ssize_t judged_size, exact_size;
    uint64_t judged_hash, exact_hash;
    const uint8_t *string;          /* a string item's value (inside `exact`), or NULL */
    Py_ssize_t string_size;
    int string_whole;               /* that value is strict UTF-8 (not a surrogate passed through) */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *entries;
    Py_ssize_t n, cap;
    Py_ssize_t opaque;              /* entries C could not key */
    int32_t *judged_slots, *exact_slots; /* open addressing: entry index + 1, 0 empty */
    Py_ssize_t slots;                /* a power of two */
    int32_t *sorted;                 /* string entries by value, bytewise */
    Py_ssize_t n_sorted;
} Used;

extern PyTypeObject UsedType;
/* Is an item with canonical keys (judged, exact) among the first `count` entries? */
int used_holds(const Used *u, Py_ssize_t count, const uint8_t *judged, Py_ssize_t jn, const uint8_t *exact,
               Py_ssize_t en);
/* [*lo, *hi): the sorted positions of the string values beginning with a + b. */
void used_prefix_range(const Used *u, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb,
                       Py_ssize_t *lo, Py_ssize_t *hi);
int used_has_string(const Used *u, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb);

/* ---- vocab.c ---- */
typedef struct {
    int32_t *ids;
    Py_ssize_t n;
} IdList;

typedef struct {
    PyObject_HEAD
    Py_ssize_t num_tokens, words; /* words: bitmap words (32 tokens each) */
    uint8_t *flat;
    int64_t *offsets;             /* token t: flat[offsets[t]:offsets[t + 1]] */
    uint8_t *flags;               /* classes */
    uint16_t *shape;
    int32_t *quote_at;            /* first quote's index, -1 without one */
    int32_t *rank;                /* each token's place in the tokens sorted by their bytes */
    uint32_t *maps[NUM_MASKS];    /* per class mask: the tokens holding one of its classes */
    uint32_t *look_between;       /* the structural class but the SH_HARMLESS_NONE tokens */
    IdList lists[NUM_MASKS];      /* the same as a list where short (else ids NULL) */
    int32_t *by_prefix;           /* quote tokens with no backslash before the quote, by the bytes before it */
    Py_ssize_t n_by_prefix;
    int32_t by_first[258];        /* by_prefix[by_first[k]:by_first[k + 1]]: prefix bucket k (0: empty, b + 1: begins with b) */
    Py_ssize_t longest_prefix;
    /* [kind: open, language, member][mask: QUOTE, QUOTE|CLOSE, AFTER_QUOTE, AFTER_QUOTE|CLOSE][tail]:
     * the tokens of the mask an open string puts through the machine, but the kind's plain ones
     * (decided by lookup); with `tail`, those of a simple tail for the kind (decided by lookup too).
     * `member` (a member's string value in an object item): its tails are TAIL_OPEN and TAIL_ITEM* */
    IdList quotes[3][4][2];
} Vocab;

extern PyTypeObject VocabType;
#define LIST_MAX 4096

/* ---- domain.c ---- */
typedef struct {
    int32_t token;
    int32_t lo, hi;               /* the spellings beginning with the prefix and then the token; -1: the machine decides */
} Reach;

typedef struct {
    uint8_t *w;                   /* an item's bytes so far (NULL: an empty slot) */
    Py_ssize_t wn;
    uint64_t hash;
    int32_t lo, hi;               /* the spellings beginning with w */
    Reach *slots;                 /* open addressing by token (-1: empty) */
    Py_ssize_t cap, n;
} Prefix;

typedef struct {
    PyObject_HEAD
    PyObject *spellings;          /* the sorted tuple of bytes it was made from */
    Py_ssize_t n;
    uint8_t *flat;
    int64_t *at;                  /* spelling i: flat[at[i]:at[i + 1]] */
    PyObject **objects;           /* spelling i's bytes object (held by `spellings`) */
    Prefix *prefixes;             /* the cache: open addressing by hash of w */
    Py_ssize_t n_prefixes, cap_prefixes, entries;
    pthread_mutex_t lock;         /* held by a row while it reads or fills the cache */
    /* the last `COUNTS_KEPT` unused tuples planned and their counts (`domain_counts_of`: the
     * rows of a batch share one unused tuple per used set, `items._unused_after`) */
    PyObject *kept_unused[4], *kept_counts[4];
    int kept_next;
} Domain;
#define COUNTS_KEPT 4

extern PyTypeObject DomainType;
/* counts[i]: how many of the first i spellings are in `unused` (a sorted tuple of bytes, a subset);
 * -1 if one of them is not a spelling of the domain. */
int domain_counts(const Domain *d, PyObject *unused, int32_t *counts);
/* The counts of `unused` as an int32 bytes object (a new reference; shared read-only by every plan
 * of that tuple), Py_None if `unused` is not of this domain, NULL on error (GIL held). */
PyObject *domain_counts_of(Domain *d, PyObject *unused);
/* [*lo, *hi): the spellings beginning with a + b */
void domain_range(const Domain *d, const uint8_t *a, Py_ssize_t na, const uint8_t *b, Py_ssize_t nb, int32_t *lo, int32_t *hi);
int domain_lock(Domain *d);       /* 1 if locked now (never waits), 0 if another row holds it */
void domain_unlock(Domain *d);
Prefix *domain_prefix(Domain *d, const uint8_t *w, Py_ssize_t wn); /* found or made (NULL: no memory) */
const Reach *domain_reach(Domain *d, Prefix *x, const Vocab *v, int32_t t); /* found or made (NULL: no memory) */

/* A finite item's row decided by its shortcut alone (every allowed token plain or a quote last,
 * at least `MEMO_MIN` of them), kept for the next rows of the same `restrict` call in the same
 * state (`Domain`, item bytes, counts object, width): the rows of a batch in lockstep are mostly
 * equal, and such a row is then a comparison, not hundreds of probes (domain.c). */
typedef struct {
    const Domain *domain;
    const PyObject *counts;
    const uint8_t *w;             /* the item's bytes (the kept row's buffer, held for the call) */
    Py_ssize_t wn, limit, words;
    uint32_t *result;             /* the kept row, decided */
    int32_t *cleared;             /* the tokens its decision cleared */
    Py_ssize_t n_cleared, cap_cleared;
    int valid;
} RowMemo;
#define MEMO_MIN 64
/* 1 if `row` (a finite item's, the domain locked) is the kept row before its decision: it is then
 * decided (the kept result copied); 0 otherwise, the row as it was. */
int memo_reuse(RowMemo *m, const Domain *d, const PyObject *counts, const uint8_t *w, Py_ssize_t wn,
               Py_ssize_t limit, uint32_t *words);
int memo_note(RowMemo *m, int32_t t); /* a token the row being recorded cleared (-1: no memory) */
void memo_keep(RowMemo *m, const Domain *d, const PyObject *counts, const uint8_t *w, Py_ssize_t wn,
               Py_ssize_t limit, const uint32_t *words); /* that row decided: kept (valid) if it can be */
void memo_free(RowMemo *m);

/* ---- the plan of one row (_native.c) and the machine (machine.c) ---- */
enum { MODE_NONE = 0, MODE_STRING = 1, MODE_NUMBER = 2, MODE_LITERAL = 3 };
enum { KIND_OPEN = 0, KIND_LANGUAGE = 1, KIND_FINITE = 2 };
/* frame phases: 'o' key, colon, value, comma; 'a' value, comma */
enum { PH_KEY = 0, PH_COLON = 1, PH_VALUE = 2, PH_COMMA = 3 };
#define MAX_FRAMES 24

typedef struct {
    uint8_t kind;   /* 'o' or 'a' */
    uint8_t phase;
    uint8_t opaque; /* an array opened by the token that may be guarded: nothing in it is judged here */
} Frame;

typedef struct {
    PyObject_HEAD
    Vocab *vocab;
    Used *used;
    PyObject *buffer;         /* the tracker's bytearray */
    PyObject *unused;         /* a finite domain's unused spellings (sorted tuple of bytes), or None */
    Domain *domain;           /* a finite domain's `Domain`, or NULL (then `unused` alone is read) */
    PyObject *counts;         /* and the unused spellings before each of its spellings (int32 bytes: `domain_counts`) */
    PyObject *values;         /* a member's string value in an object item: the values after which
                               * closing it would repeat an item (sorted tuple of bytes); or None */
    Py_ssize_t count;         /* the array's finished items */
    uint64_t serial;          /* the last one's serial (0 without) */
    Py_ssize_t buffer_size;   /* the tracker's bytes when planned */
    Py_ssize_t item_start;    /* where the guarded array's current item began, -1 between items */
    Py_ssize_t written_start; /* an open string with no escape, the item (depth 0) or an object item's
                               * member value (depth 1, with `values`): where its value began; else -1 */
    int kind, mode, escape, is_key, literal_left, guarded_ancestor, child;
    int depth;                /* frames above the guarded array: frames[0] is it, frames[depth] the top */
    Frame frames[MAX_FRAMES];
} Plan;

extern PyTypeObject PlanType;
PyObject *plan_at(Plan *p, PyObject *size); /* the plan grown to `size` bytes within the same string */

typedef struct {
    const Plan *plan;
    const Vocab *vocab;
    const uint8_t *buf;       /* the tracker's bytes */
    uint32_t *words;          /* the row */
    Py_ssize_t limit;         /* tokens below it are in the row */
    Buf scratch, judged, exact;
    int8_t memo[2];           /* the item as written (+ "}"): -1 unknown, 0 new, 1 a repeat */
    Buf done_judged, done_exact; /* the keys of an item finished earlier in the token */
    int64_t *undecided;
    Py_ssize_t n_undecided, cap_undecided;
    int failed;               /* out of memory: the whole row goes to Python */
    int fresh;                /* an open string no used string (no value) begins as */
    int written_clean;        /* its bytes so far are whole UTF-8 characters, none a control */
    Py_ssize_t rests_lo, rests_hi; /* a finite domain's open string item: the unused spellings that
                                    * begin with its bytes so far (a range of `Plan.unused`) */
    Buf rests;                /* and those spellings past its bytes, joined (a merge walk), */
    Py_ssize_t *rest_at;      /* their offsets, */
    int64_t *sorted;          /* the candidates by rank (rank << 32 | token) and room to sort them */
    Py_ssize_t cap_sorted;
    RowMemo *shared;          /* kept rows, shared by the call's rows (NULL: none) */
} Row;

enum { KEEP = 0, DUPLICATE = 1, UNDECIDED = 2 };
int decide(Row *row, int64_t t); /* machine.c: one token, as `JsonTracker.finishes_duplicate` */
void run_row(Row *row);          /* rows.c */
void row_free(Row *row);
void canon_init(void);
int push_init(void);                       /* push.c */
PyObject *push_plain(PyObject *self, PyObject *args);

#endif
