/* CRC-32 of a batch of stored samples in one call, the GIL released: the check every read
 * applies (readers.formats.checks), for a decode thread's whole part of a batch without
 * taking the GIL back between samples (per sample, zlib.crc32 releases and retakes it, and
 * two decode threads then hand it back and forth once a sample).
 *
 *   crcs(values, out)  out[k] = zlib.crc32(values[k]) (uint32 [n]) for bytes-like values.
 *   crc(value[, start]) zlib.crc32(value, start) of one (the converter's writers).
 *
 * zlib's CRC (reflected polynomial 0xEDB88320). With PCLMULQDQ (x86-64 since 2010): four
 * 128-bit lanes folded by carry-less multiplication, then a Barrett reduction (Intel's "Fast
 * CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction", with the constants
 * of that paper for this polynomial), several times zlib's speed; the bytes after
 * the last 16-byte block, and short values, by a table. Without PCLMULQDQ (CLMUL is 0) the
 * table alone is slower than zlib, so readers.formats.checks then keeps zlib.crc32.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t table[256];

static void make_table(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        table[b] = c;
    }
}

/* `state` is the CRC register (the CRC inverted). */
static uint32_t crc_bytes(uint32_t state, const uint8_t *p, size_t n) {
    while (n--) state = (state >> 8) ^ table[(state ^ *p++) & 0xFF];
    return state;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
#include <immintrin.h>
#define HAVE_CLMUL 1

/* One 128-bit lane folded 512 (k = k1k2) or 128 (k3k4) bits forward, xor the next block. */
__attribute__((target("pclmul,sse4.1"))) static __m128i fold(__m128i x, __m128i k, __m128i next) {
    __m128i lo = _mm_clmulepi64_si128(x, k, 0x00), hi = _mm_clmulepi64_si128(x, k, 0x11);
    return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

/* At least 64 bytes: the multiple of 16 folded, the rest byte by byte. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_clmul(uint32_t state, const uint8_t *p,
                                                                    size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
    const __m128i poly_mu = _mm_set_epi64x(0x1f7011641, 0x1db710641);
    const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)state));
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    for (p += 64, n -= 64; n >= 64; p += 64, n -= 64) {
        x0 = fold(x0, k1k2, _mm_loadu_si128((const __m128i *)p));
        x1 = fold(x1, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = fold(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = fold(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    x0 = fold(fold(fold(x0, k3k4, x1), k3k4, x2), k3k4, x3);
    for (; n >= 16; p += 16, n -= 16) x0 = fold(x0, k3k4, _mm_loadu_si128((const __m128i *)p));
    /* 128 -> 64 bits (appending 32 zero bits), then 64 -> 32 by Barrett reduction. */
    x0 = _mm_xor_si128(_mm_clmulepi64_si128(x0, k3k4, 0x10), _mm_srli_si128(x0, 8));
    x0 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x0, low32), k5, 0x00), _mm_srli_si128(x0, 4));
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x0, low32), poly_mu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly_mu, 0x00);
    state = (uint32_t)_mm_extract_epi32(_mm_xor_si128(x0, t), 1);
    return crc_bytes(state, p, n);
}
#endif

static int use_clmul = 0; /* whether the CPU has it, at import */

/* zlib.crc32(p[:n], start): `start` the CRC of the bytes before these (0 for none). */
static uint32_t crc32_of(const uint8_t *p, size_t n, uint32_t start) {
    uint32_t state = ~start;
#ifdef HAVE_CLMUL
    if (use_clmul && n >= 64) return ~crc_clmul(state, p, n);
#endif
    return ~crc_bytes(state, p, n);
}

static PyObject *crcs(PyObject *self, PyObject *args) {
    PyObject *values;
    Py_buffer out;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!w*", &PyList_Type, &values, &out)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (out.len != n * (Py_ssize_t)sizeof(uint32_t)) {
        PyErr_Format(PyExc_ValueError, "out has %zd bytes, not %zd", out.len, n * (Py_ssize_t)sizeof(uint32_t));
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof *views);
    if (views == NULL) {
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    Py_ssize_t got = 0;
    for (; got < n; got++)
        if (PyObject_GetBuffer(PyList_GET_ITEM(values, got), &views[got], PyBUF_C_CONTIGUOUS) < 0) break;
    if (got == n) {
        uint32_t *crc = out.buf;
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t k = 0; k < n; k++) crc[k] = crc32_of(views[k].buf, (size_t)views[k].len, 0);
        Py_END_ALLOW_THREADS;
    }
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyBuffer_Release(&out);
    if (got != n) return NULL;
    Py_RETURN_NONE;
}

static PyObject *crc(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int start = 0;
    uint32_t out;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &start)) return NULL;
    Py_BEGIN_ALLOW_THREADS;
    out = crc32_of(view.buf, (size_t)view.len, (uint32_t)start);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

static int best_clmul(void) {
#ifdef HAVE_CLMUL
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#else
    return 0;
#endif
}

static PyMethodDef methods[] = {
    {"crc", crc, METH_VARARGS,
     "crc(value[, start]) -> int: zlib.crc32(value, start) of one bytes-like value, the GIL "
     "released."},
    {"crcs", crcs, METH_VARARGS,
     "crcs(values, out): out[k] = zlib.crc32(values[k]) for a list of bytes-like values, into "
     "a uint32 buffer of len(values), the GIL released."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m) {
    make_table();
#ifdef HAVE_CLMUL
    __builtin_cpu_init();
#endif
    use_clmul = best_clmul();
    return PyModule_AddIntConstant(m, "CLMUL", use_clmul);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
#ifdef Py_mod_gil /* 3.13: the CRCs need no GIL, and the module keeps no state */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "crc32", "CRC-32 of a batch of samples (see readers.formats.checks).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_crc32(void) { return PyModuleDef_Init(&module); }
