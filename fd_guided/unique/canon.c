/*
 * Canonical keys of a JSON value's text: two byte strings per value, equal for two values
 * exactly when `items.item_keys` gives them equal keys (jsonschema's equality, `json_key` of
 * `json.loads`: 1 == 1.0, true != 1, objects ignore key order, the last of a repeated key wins;
 * and exact decimals: a long integer and its float spelling). Where Python's keys could be of
 * another kind ("raw" keys of text `json.loads` refuses, its limits, NaN, a surrogate passed
 * through, a guessed UTF-16 encoding) the answer is CANON_FAIL and the caller asks Python.
 *
 * A key is self-delimiting: 't' 'f' 'n'; 'S' len bytes (a string, UTF-8); 'I' len digits (an
 * integer, judged: an int, or a float that is one); 'D' 8 bytes (a float that is not one); 'F'
 * sign (an infinite float); 'X' len text (an exact decimal, normalised); 'A' keys ']'; 'O' pairs
 * (a key's 'S' and its value's key) sorted and unique by key, '}'.
 */
#include "native.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <locale.h>
#endif

#define MAX_DEPTH 64        /* deeper: json.loads or json_key may hit Python's recursion limit */
#define MAX_INT_DIGITS 640  /* the lowest int_max_str_digits Python allows: past it int() may refuse */
#define TRY(x) do { int r_ = (x); if (r_ != CANON_OK) return r_; } while (0)
#define PUT(x) do { if ((x) < 0) return CANON_NOMEM; } while (0)

static int put_byte(Buf *b, uint8_t c) { return buf_put(b, &c, 1); }

static int put_varint(Buf *b, uint64_t v) {
    uint8_t tmp[10];
    int k = 0;
    do {
        uint8_t c = v & 0x7f;
        v >>= 7;
        tmp[k++] = (uint8_t)(c | (v ? 0x80 : 0));
    } while (v);
    return buf_put(b, tmp, k);
}

/* 'S' len bytes into both keys (a string's judged and exact keys are one). */
static int put_string(Buf *j, Buf *e, const uint8_t *p, Py_ssize_t n) {
    PUT(put_byte(j, 'S')); PUT(put_varint(j, (uint64_t)n)); PUT(buf_put(j, p, n));
    PUT(put_byte(e, 'S')); PUT(put_varint(e, (uint64_t)n)); PUT(buf_put(e, p, n));
    return CANON_OK;
}

static void put_code_point(uint8_t *out, int *k, uint32_t u) {
    /* surrogates come out as three bytes, as "surrogatepass" encodes them */
    if (u < 0x80) out[(*k)++] = (uint8_t)u;
    else if (u < 0x800) { out[(*k)++] = (uint8_t)(0xC0 | u >> 6); out[(*k)++] = (uint8_t)(0x80 | (u & 0x3F)); }
    else if (u < 0x10000) {
        out[(*k)++] = (uint8_t)(0xE0 | u >> 12);
        out[(*k)++] = (uint8_t)(0x80 | ((u >> 6) & 0x3F));
        out[(*k)++] = (uint8_t)(0x80 | (u & 0x3F));
    } else {
        out[(*k)++] = (uint8_t)(0xF0 | u >> 18);
        out[(*k)++] = (uint8_t)(0x80 | ((u >> 12) & 0x3F));
        out[(*k)++] = (uint8_t)(0x80 | ((u >> 6) & 0x3F));
        out[(*k)++] = (uint8_t)(0x80 | (u & 0x3F));
    }
}

typedef struct {
    const uint8_t *p, *end;
    int depth;
} Parser;

static void skip_ws(Parser *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

static int hex4(const uint8_t *p, const uint8_t *end, uint32_t *out) {
    if (end - p < 4) return 0;
    uint32_t u = 0;
    for (int k = 0; k < 4; k++) {
        const uint8_t c = p[k];
        u <<= 4;
        if (c >= '0' && c <= '9') u |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') u |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') u |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    *out = u;
    return 1;
}

/* A string as json.loads decodes it (strict: no control characters; \uXXXX pairs joined as its
 * scanner joins them), s->p at its opening quote; its UTF-8 into `out`. */
static int string_value(Parser *s, Buf *out) {
    s->p++;
    for (;;) {
        if (s->p >= s->end) return CANON_FAIL;
        const uint8_t c = *s->p;
        if (c == '"') { s->p++; return CANON_OK; }
        if (c < 0x20) return CANON_FAIL;
        if (c != '\\') {
            const int len = utf8_char(s->p, s->end);
            if (!len) return CANON_FAIL;
            PUT(buf_put(out, s->p, len));
            s->p += len;
            continue;
        }
        if (s->end - s->p < 2) return CANON_FAIL;
        const uint8_t x = s->p[1];
        s->p += 2;
        static const char simple[] = "\"\\/bfnrt", decoded[] = "\"\\/\b\f\n\r\t";
        const char *at = x ? strchr(simple, x) : NULL;
        if (at != NULL) { PUT(put_byte(out, (uint8_t)decoded[at - simple])); continue; }
        if (x != 'u') return CANON_FAIL;
        uint32_t u, low;
        if (!hex4(s->p, s->end, &u)) return CANON_FAIL;
        s->p += 4;
        /* a high surrogate and "\u": Python reads four hex digits (refusing bad ones) and joins
         * a low surrogate; another escape stays for the next round */
        if (u >= 0xD800 && u <= 0xDBFF && s->end - s->p > 6 && s->p[0] == '\\' && s->p[1] == 'u') {
            if (!hex4(s->p + 2, s->end, &low)) return CANON_FAIL;
            if (low >= 0xDC00 && low <= 0xDFFF) { u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00); s->p += 6; }
        }
        uint8_t tmp[4];
        int k = 0;
        put_code_point(tmp, &k, u);
        PUT(buf_put(out, tmp, k));
    }
}

/* The exact decimal digits of an integral double (|d| >= 2^63) into `out`. */
static int big_integer(double d, Buf *out) {
    int exp;
    const double f = frexp(fabs(d), &exp);
    uint64_t m = (uint64_t)ldexp(f, 53);
    int shift = exp - 53;
    uint32_t limbs[40] = {0}; /* base 1e9, little end first: up to 2^1024 */
    int n = 0;
    while (m) { limbs[n++] = (uint32_t)(m % 1000000000u); m /= 1000000000u; }
    while (shift > 0) {
        const int step = shift > 29 ? 29 : shift;
        uint64_t carry = 0;
        for (int k = 0; k < n; k++) {
            const uint64_t x = ((uint64_t)limbs[k] << step) + carry;
            limbs[k] = (uint32_t)(x % 1000000000u);
            carry = x / 1000000000u;
        }
        while (carry) { limbs[n++] = (uint32_t)(carry % 1000000000u); carry /= 1000000000u; }
        shift -= step;
    }
    char tmp[16];
    if (d < 0) PUT(put_byte(out, '-'));
    int len = snprintf(tmp, sizeof tmp, "%u", limbs[n - 1]);
    PUT(buf_put(out, tmp, len));
    for (int k = n - 2; k >= 0; k--) { len = snprintf(tmp, sizeof tmp, "%09u", limbs[k]); PUT(buf_put(out, tmp, len)); }
    return CANON_OK;
}

#if defined(__GLIBC__)
static locale_t c_locale;
#endif

/* float(text) as Python reads it (correctly rounded, whatever the process's locale). */
static double read_double(const uint8_t *p, Py_ssize_t n, Buf *tmp) {
    tmp->size = 0;
    if (buf_put(tmp, p, n) < 0 || buf_put(tmp, "", 1) < 0) return NAN;
#if defined(__GLIBC__)
    if (c_locale) return strtod_l((const char *)tmp->data, NULL, c_locale);
#endif
    return strtod((const char *)tmp->data, NULL);
}

static int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* A number: json's grammar exactly (a '.' or an exponent without digits is an error there too). */
static int number_value(Parser *s, Buf *j, Buf *e) {
    const uint8_t *p = s->p, *end = s->end, *start = s->p;
    const int negative = p < end && *p == '-';
    p += negative;
    const uint8_t *int_start = p;
    if (p < end && *p == '0') p++;
    else if (p < end && *p >= '1' && *p <= '9') while (p < end && is_digit(*p)) p++;
    else return CANON_FAIL;
    const uint8_t *int_end = p, *frac_start = p, *frac_end = p;
    int is_float = 0;
    if (p < end && *p == '.') {
        if (p + 1 >= end || !is_digit(p[1])) return CANON_FAIL;
        frac_start = ++p;
        while (p < end && is_digit(*p)) p++;
        frac_end = p, is_float = 1;
    }
    int64_t exponent = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        const int minus = p < end && *p == '-';
        if (p < end && (*p == '-' || *p == '+')) p++;
        if (p >= end || !is_digit(*p)) return CANON_FAIL;
        while (p < end && *p == '0') p++;
        int digits = 0;
        while (p < end && is_digit(*p)) {
            if (++digits > 15) return CANON_FAIL;
            exponent = exponent * 10 + (*p++ - '0');
        }
        exponent = minus ? -exponent : exponent;
        is_float = 1;
    }
    s->p = p;
    /* judged: an int, or the double (an integral one as its integer) */
    Buf digits = {0};
    int r = CANON_OK;
    if (!is_float) {
        const Py_ssize_t nd = int_end - int_start;
        if (nd > MAX_INT_DIGITS) return CANON_FAIL;
        const int sign = negative && !(nd == 1 && *int_start == '0');
        if (put_byte(j, 'I') < 0 || put_varint(j, (uint64_t)(nd + sign)) < 0 || (sign && put_byte(j, '-') < 0) ||
            buf_put(j, int_start, nd) < 0)
            return CANON_NOMEM;
    } else {
        const double d = read_double(start, p - start, &digits);
        if (isnan(d)) r = CANON_NOMEM;
        else if (isinf(d)) r = put_byte(j, 'F') < 0 || put_byte(j, d > 0 ? '+' : '-') < 0 ? CANON_NOMEM : CANON_OK;
        else if (d == trunc(d)) {
            digits.size = 0;
            if (fabs(d) < 9.2e18) {
                char tmp[32];
                const int len = snprintf(tmp, sizeof tmp, "%lld", (long long)d); /* -0.0 -> "0" */
                r = buf_put(&digits, tmp, len) < 0 ? CANON_NOMEM : CANON_OK;
            } else r = big_integer(d, &digits);
            if (r == CANON_OK && (put_byte(j, 'I') < 0 || put_varint(j, (uint64_t)digits.size) < 0 ||
                                  buf_put(j, digits.data, digits.size) < 0))
                r = CANON_NOMEM;
        } else if (put_byte(j, 'D') < 0 || buf_put(j, &d, sizeof d) < 0) r = CANON_NOMEM;
    }
    /* exact: the decimal's digits without leading or trailing zeros, and its exponent */
    digits.size = 0;
    if (r == CANON_OK && (buf_put(&digits, int_start, int_end - int_start) < 0 ||
                          buf_put(&digits, frac_start, frac_end - frac_start) < 0))
        r = CANON_NOMEM;
    if (r == CANON_OK) {
        Py_ssize_t lo = 0, hi = digits.size;
        while (lo < hi && digits.data[lo] == '0') lo++;
        exponent -= frac_end - frac_start;
        while (hi > lo && digits.data[hi - 1] == '0') hi--, exponent++;
        char tail[32];
        const int tail_len = lo == hi ? 0 : snprintf(tail, sizeof tail, "e%lld", (long long)exponent);
        const int sign = negative && lo < hi;
        const Py_ssize_t len = lo == hi ? 1 : sign + (hi - lo) + tail_len;
        if (put_byte(e, 'X') < 0 || put_varint(e, (uint64_t)len) < 0 || (sign && put_byte(e, '-') < 0) ||
            (lo == hi ? put_byte(e, '0') : buf_put(e, digits.data + lo, hi - lo)) < 0 ||
            buf_put(e, tail, tail_len) < 0)
            r = CANON_NOMEM;
    }
    buf_free(&digits);
    return r;
}

static int value(Parser *s, Buf *j, Buf *e);

static int array_value(Parser *s, Buf *j, Buf *e) {
    s->p++;
    PUT(put_byte(j, 'A')); PUT(put_byte(e, 'A'));
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') { s->p++; goto close; }
    for (;;) {
        skip_ws(s);
        TRY(value(s, j, e));
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') { s->p++; continue; }
        if (s->p < s->end && *s->p == ']') { s->p++; break; }
        return CANON_FAIL;
    }
close:
    PUT(put_byte(j, ']')); PUT(put_byte(e, ']'));
    return CANON_OK;
}

/* An object's members in one key form: each pair's span in `pairs` and its key's span. */
typedef struct {
    Py_ssize_t at, size, key_size, order;
} Pair;

typedef struct {
    const uint8_t *base;
    const Pair *pairs;
    int by_key;
} PairOrder;

static int compare_pairs(const PairOrder *o, int32_t x, int32_t y) {
    const Pair *a = &o->pairs[x], *b = &o->pairs[y];
    const Py_ssize_t na = o->by_key ? a->key_size : a->size, nb = o->by_key ? b->key_size : b->size;
    int c = memcmp(o->base + a->at, o->base + b->at, (size_t)(na < nb ? na : nb));
    if (c) return c;
    if (na != nb) return na < nb ? -1 : 1;
    return o->by_key ? (a->order > b->order ? -1 : a->order < b->order) : 0; /* the last of a key first */
}

static void merge_sort(int32_t *a, int32_t *tmp, Py_ssize_t n, const PairOrder *o) {
    if (n < 2) return;
    const Py_ssize_t half = n / 2;
    merge_sort(a, tmp, half, o);
    merge_sort(a + half, tmp, n - half, o);
    Py_ssize_t i = 0, k = half, out = 0;
    while (i < half && k < n) tmp[out++] = compare_pairs(o, a[i], a[k]) <= 0 ? a[i++] : a[k++];
    while (i < half) tmp[out++] = a[i++];
    while (k < n) tmp[out++] = a[k++];
    memcpy(a, tmp, sizeof(int32_t) * (size_t)n);
}

/* The pairs as json_key's frozenset sees them: the last value of each key, in a fixed order. */
static int emit_pairs(Buf *out, const Buf *pairs_buf, const Pair *pairs, Py_ssize_t n) {
    int32_t *order = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(2 * n + 1));
    if (order == NULL) return CANON_NOMEM;
    for (Py_ssize_t k = 0; k < n; k++) order[k] = (int32_t)k;
    PairOrder o = {pairs_buf->data, pairs, 1};
    merge_sort(order, order + n, n, &o);
    Py_ssize_t kept = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        const Pair *a = &pairs[order[k]], *prev = kept ? &pairs[order[kept - 1]] : NULL;
        if (prev && prev->key_size == a->key_size &&
            !memcmp(pairs_buf->data + prev->at, pairs_buf->data + a->at, (size_t)a->key_size))
            continue; /* an earlier value of a key already kept */
        order[kept++] = order[k];
    }
    o.by_key = 0;
    merge_sort(order, order + n, kept, &o);
    int r = put_byte(out, 'O') < 0 ? CANON_NOMEM : CANON_OK;
    for (Py_ssize_t k = 0; r == CANON_OK && k < kept; k++)
        if (buf_put(out, pairs_buf->data + pairs[order[k]].at, pairs[order[k]].size) < 0) r = CANON_NOMEM;
    if (r == CANON_OK && put_byte(out, '}') < 0) r = CANON_NOMEM;
    PyMem_RawFree(order);
    return r;
}

static int object_value(Parser *s, Buf *j, Buf *e) {
    s->p++;
    Buf pj = {0}, pe = {0}, key = {0};
    Pair *pairs_j = NULL, *pairs_e = NULL;
    Py_ssize_t n = 0, cap = 0;
    int r = CANON_OK;
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') { s->p++; goto emit; }
    for (;;) {
        skip_ws(s);
        if (s->p >= s->end || *s->p != '"') { r = CANON_FAIL; goto done; }
        key.size = 0;
        if ((r = string_value(s, &key)) != CANON_OK) goto done;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') { r = CANON_FAIL; goto done; }
        s->p++;
        skip_ws(s);
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            Pair *grown_j = PyMem_RawRealloc(pairs_j, sizeof(Pair) * (size_t)cap);
            if (grown_j != NULL) pairs_j = grown_j;
            Pair *grown_e = grown_j ? PyMem_RawRealloc(pairs_e, sizeof(Pair) * (size_t)cap) : NULL;
            if (grown_e == NULL) { r = CANON_NOMEM; goto done; }
            pairs_e = grown_e;
        }
        const Py_ssize_t at_j = pj.size, at_e = pe.size;
        if ((r = put_string(&pj, &pe, key.data, key.size)) != CANON_OK) goto done;
        const Py_ssize_t key_size = pj.size - at_j;
        if ((r = value(s, &pj, &pe)) != CANON_OK) goto done;
        pairs_j[n] = (Pair){at_j, pj.size - at_j, key_size, n};
        pairs_e[n] = (Pair){at_e, pe.size - at_e, key_size, n};
        n++;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') { s->p++; continue; }
        if (s->p < s->end && *s->p == '}') { s->p++; break; }
        r = CANON_FAIL;
        goto done;
    }
emit:
    if ((r = emit_pairs(j, &pj, pairs_j, n)) == CANON_OK) r = emit_pairs(e, &pe, pairs_e, n);
done:
    buf_free(&pj), buf_free(&pe), buf_free(&key);
    PyMem_RawFree(pairs_j), PyMem_RawFree(pairs_e);
    return r;
}

static int literal(Parser *s, const char *word, uint8_t code, Buf *j, Buf *e) {
    const size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n)) return CANON_FAIL;
    s->p += n;
    PUT(put_byte(j, code)); PUT(put_byte(e, code));
    return CANON_OK;
}

static int value(Parser *s, Buf *j, Buf *e) {
    if (s->p >= s->end) return CANON_FAIL;
    switch (*s->p) {
    case '"': {
        Buf text = {0};
        int r = string_value(s, &text);
        if (r == CANON_OK) r = put_string(j, e, text.data, text.size);
        buf_free(&text);
        return r;
    }
    case '{': case '[': {
        if (++s->depth > MAX_DEPTH) return CANON_FAIL;
        const int r = *s->p == '{' ? object_value(s, j, e) : array_value(s, j, e);
        s->depth--;
        return r;
    }
    case 't': return literal(s, "true", 't', j, e);
    case 'f': return literal(s, "false", 'f', j, e);
    case 'n': return literal(s, "null", 'n', j, e);
    default: return number_value(s, j, e);
    }
}

int canon_item(const uint8_t *text, Py_ssize_t n, Buf *judged, Buf *exact) {
    if (n >= 1 && text[0] == '"' && !memchr(text, '\\', (size_t)n)) {
        /* item_keys' own path: a string without escapes is its bytes, when they are UTF-8 */
        if (n < 2 || text[n - 1] != '"' || !valid_utf8(text + 1, n - 2)) return CANON_FAIL;
        return put_string(judged, exact, text + 1, n - 2);
    }
    if (n >= 2 && (!text[0] || !text[1])) return CANON_FAIL; /* json.loads would read it as UTF-16/32 */
    Parser s = {text, text + n, 0};
    skip_ws(&s);
    TRY(value(&s, judged, exact));
    skip_ws(&s);
    return s.p == s.end ? CANON_OK : CANON_FAIL;
}

void canon_init(void) {
#if defined(__GLIBC__)
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
#endif
}
