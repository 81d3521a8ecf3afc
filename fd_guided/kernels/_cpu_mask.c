/*
 * Fast CPU token-bitmask kernel for fd_guided.kernels.cpu.
 *
 * Plain CPython C API: the caller passes raw data pointers (Python ints), row strides in
 * elements and the logits dtype name; no numpy or torch headers are needed. The GIL is
 * released while the rows are processed.
 *
 * Masks are sparse in practice (a JSON state allows a handful of tokens, a free-text state
 * allows nearly all), so whole runs of bitmask words are classified first: all-ones runs are
 * skipped without touching the logits, all-zero runs become a tight store loop of the -inf bit
 * pattern, and only mixed words do per-bit work, as a branch-free select the compiler vectorises.
 * (Writing only the zero bits of nearly-all-allowed words was tried, via ctz and via AVX-512/AVX2
 * masked stores: it touches fewer cache lines, ~20% faster once logits exceed the cache, but 1.5-3x
 * slower on cache-resident logits, the common CPU-serving case, so the select stays.)
 * Values are written as integer bit patterns in the logits' own dtype: no float round trip.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The row loops are memory bound only once they are vectorised wider than SSE2 (the x86-64
 * baseline that -O3 targets): on GCC/x86-64/glibc, compile them also for AVX2 and AVX-512 and
 * let the loader pick one (glibc ifunc), so one wheel runs everywhere. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
#define SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define SIMD_CLONES
#endif
/* Helpers must be inlined into each clone to be compiled for the clone's ISA. */
#if defined(__GNUC__)
#define HELPER static inline __attribute__((always_inline))
#else
#define HELPER static inline
#endif

#define ALL_ALLOWED 0xFFFFFFFFu
#define RUN_WORDS 8 /* words classified together: 256 tokens */

/* -inf bit patterns. */
#define NEG_INF_F32 0xFF800000u
#define NEG_INF_F16 ((uint16_t)0xFC00u)
#define NEG_INF_BF16 ((uint16_t)0xFF80u)

/* One bit per lane, so the mixed-word select is a vector AND + compare (SSE2 has no per-lane
 * variable shift; a table of constants needs none). The 16-bit path loops over the same 32 lanes:
 * written as two 16-lane halves, GCC fully unrolls it into branches instead of vectorising. */
static const uint32_t BIT32[32] = {
    1u << 0,  1u << 1,  1u << 2,  1u << 3,  1u << 4,  1u << 5,  1u << 6,  1u << 7,
    1u << 8,  1u << 9,  1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15,
    1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23,
    1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

/* ---- 32-bit elements (float32) ---------------------------------------------------------- */

HELPER void fill_u32(uint32_t *restrict dst, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) dst[i] = NEG_INF_F32;
}

HELPER void mixed_word_u32(uint32_t *restrict dst, uint32_t word) {
    for (int j = 0; j < 32; j++) dst[j] = (word & BIT32[j]) ? dst[j] : NEG_INF_F32;
}

HELPER void word_u32(uint32_t *restrict dst, uint32_t word) {
    if (word == ALL_ALLOWED) return;
    if (word == 0) {
        fill_u32(dst, 32);
        return;
    }
    mixed_word_u32(dst, word);
}

SIMD_CLONES
static void row_u32(uint32_t *restrict dst, const uint32_t *restrict bits, Py_ssize_t vocab) {
    const Py_ssize_t full_words = vocab / 32;
    Py_ssize_t w = 0;
    for (; w + RUN_WORDS <= full_words; w += RUN_WORDS) {
        const uint32_t *b = bits + w;
        uint32_t all = b[0] & b[1] & b[2] & b[3] & b[4] & b[5] & b[6] & b[7];
        if (all == ALL_ALLOWED) continue;
        uint32_t any = b[0] | b[1] | b[2] | b[3] | b[4] | b[5] | b[6] | b[7];
        if (any == 0) {
            fill_u32(dst + w * 32, RUN_WORDS * 32);
            continue;
        }
        for (int k = 0; k < RUN_WORDS; k++) word_u32(dst + (w + k) * 32, b[k]);
    }
    for (; w < full_words; w++) word_u32(dst + w * 32, bits[w]);
    const int tail = (int)(vocab - full_words * 32);
    for (int j = 0; j < tail; j++)
        if (!(bits[full_words] & BIT32[j])) dst[full_words * 32 + j] = NEG_INF_F32;
}

/* ---- 16-bit elements (float16, bfloat16) ------------------------------------------------ */

HELPER void fill_u16(uint16_t *restrict dst, Py_ssize_t n, uint16_t neg) {
    for (Py_ssize_t i = 0; i < n; i++) dst[i] = neg;
}

HELPER void mixed_word_u16(uint16_t *restrict dst, uint32_t word, uint16_t neg) {
    for (int j = 0; j < 32; j++) dst[j] = (word & BIT32[j]) ? dst[j] : neg;
}

HELPER void word_u16(uint16_t *restrict dst, uint32_t word, uint16_t neg) {
    if (word == ALL_ALLOWED) return;
    if (word == 0) {
        fill_u16(dst, 32, neg);
        return;
    }
    mixed_word_u16(dst, word, neg);
}

SIMD_CLONES
static void row_u16(uint16_t *restrict dst, const uint32_t *restrict bits, Py_ssize_t vocab,
                    uint16_t neg) {
    const Py_ssize_t full_words = vocab / 32;
    Py_ssize_t w = 0;
    for (; w + RUN_WORDS <= full_words; w += RUN_WORDS) {
        const uint32_t *b = bits + w;
        uint32_t all = b[0] & b[1] & b[2] & b[3] & b[4] & b[5] & b[6] & b[7];
        if (all == ALL_ALLOWED) continue;
        uint32_t any = b[0] | b[1] | b[2] | b[3] | b[4] | b[5] | b[6] | b[7];
        if (any == 0) {
            fill_u16(dst + w * 32, RUN_WORDS * 32, neg);
            continue;
        }
        for (int k = 0; k < RUN_WORDS; k++) word_u16(dst + (w + k) * 32, b[k], neg);
    }
    for (; w < full_words; w++) word_u16(dst + w * 32, bits[w], neg);
    const int tail = (int)(vocab - full_words * 32);
    for (int j = 0; j < tail; j++)
        if (!(bits[full_words] & BIT32[j])) dst[full_words * 32 + j] = neg;
}

/* ---- Python entry point ----------------------------------------------------------------- */

typedef struct {
    char *logits;
    Py_ssize_t logits_row_bytes;
    const uint32_t *bitmask;
    Py_ssize_t bitmask_row_stride; /* in int32 words */
    Py_ssize_t vocab_size;
    int element_size;
    uint16_t neg16;
} MaskJob;

static void mask_one_row(const MaskJob *job, Py_ssize_t row) {
    char *dst = job->logits + row * job->logits_row_bytes;
    const uint32_t *bits = job->bitmask + row * job->bitmask_row_stride;
    if (job->element_size == 4)
        row_u32((uint32_t *)dst, bits, job->vocab_size);
    else
        row_u16((uint16_t *)dst, bits, job->vocab_size, job->neg16);
}

/* Fills job's dtype fields; returns -1 with an exception set for an unsupported dtype. */
static int set_dtype(MaskJob *job, const char *dtype) {
    if (strcmp(dtype, "float32") == 0) {
        job->element_size = 4;
    } else if (strcmp(dtype, "float16") == 0) {
        job->element_size = 2;
        job->neg16 = NEG_INF_F16;
    } else if (strcmp(dtype, "bfloat16") == 0) {
        job->element_size = 2;
        job->neg16 = NEG_INF_BF16;
    } else {
        PyErr_Format(PyExc_TypeError,
                     "logits dtype must be float32, float16 or bfloat16, got %s", dtype);
        return -1;
    }
    return 0;
}

/* Copies a sequence of row indices into a new C array (caller frees with PyMem_Free). */
static Py_ssize_t *read_indices(PyObject *indices, Py_ssize_t num_rows, Py_ssize_t *count) {
    PyObject *seq = PySequence_Fast(indices, "indices must be a list or tuple of ints");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t *rows = PyMem_Malloc(sizeof(Py_ssize_t) * (n > 0 ? n : 1));
    if (rows == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t row = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (row == -1 && PyErr_Occurred()) goto fail;
        if (row < 0 || row >= num_rows) {
            PyErr_Format(PyExc_IndexError, "row index %zd out of range [0, %zd)", row, num_rows);
            goto fail;
        }
        rows[i] = row;
    }
    Py_DECREF(seq);
    *count = n;
    return rows;
fail:
    Py_DECREF(seq);
    PyMem_Free(rows);
    return NULL;
}

PyDoc_STRVAR(apply_doc,
    "apply(logits_ptr, logits_row_stride, dtype, bitmask_ptr, bitmask_row_stride, vocab_size,\n"
    "      num_rows, indices=None)\n"
    "--\n\n"
    "Set masked logits to -inf in place. Pointers are addresses as ints, strides are in\n"
    "elements (the last dimension of both arrays must be contiguous), dtype is 'float32',\n"
    "'float16' or 'bfloat16'. Rows 0..num_rows-1 are processed, or only `indices` (each in\n"
    "[0, num_rows)). Bitmask row i applies to logits row i. The GIL is released while looping.");

static PyObject *apply(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"logits_ptr", "logits_row_stride", "dtype", "bitmask_ptr",
                               "bitmask_row_stride", "vocab_size", "num_rows", "indices", NULL};
    unsigned long long logits_ptr, bitmask_ptr;
    Py_ssize_t logits_row_stride, bitmask_row_stride, vocab_size, num_rows;
    const char *dtype;
    PyObject *indices = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KnsKnnn|O", keywords, &logits_ptr,
                                     &logits_row_stride, &dtype, &bitmask_ptr,
                                     &bitmask_row_stride, &vocab_size, &num_rows, &indices))
        return NULL;
    if (vocab_size < 0 || num_rows < 0) {
        PyErr_SetString(PyExc_ValueError, "vocab_size and num_rows must be >= 0");
        return NULL;
    }
    if (num_rows > 0 && vocab_size > 0 && (logits_ptr == 0 || bitmask_ptr == 0)) {
        PyErr_SetString(PyExc_ValueError, "null data pointer");
        return NULL;
    }
    MaskJob job = {(char *)(uintptr_t)logits_ptr, 0, (const uint32_t *)(uintptr_t)bitmask_ptr,
                   bitmask_row_stride, vocab_size, 0, 0};
    if (set_dtype(&job, dtype) < 0) return NULL;
    job.logits_row_bytes = logits_row_stride * job.element_size;

    Py_ssize_t *rows = NULL, count = num_rows;
    if (indices != Py_None) {
        rows = read_indices(indices, num_rows, &count);
        if (rows == NULL) return NULL;
    }
    if (vocab_size > 0) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++) mask_one_row(&job, rows ? rows[i] : i);
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(rows);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"apply", (PyCFunction)(void (*)(void))apply, METH_VARARGS | METH_KEYWORDS, apply_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu_mask",
    "Fast CPU kernel that applies a token bitmask to logits in place (see fd_guided.kernels.cpu).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__cpu_mask(void) { return PyModule_Create(&module); }
