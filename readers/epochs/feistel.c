/* FeistelOrder's network (readers/epochs/order.py) over an array of positions, cycle-walked
 * into [0, N), in one call with the GIL released: a bucketed loader asks for one batch's
 * positions at a time, where numpy's fifty-odd array operations a pass, over a few
 * cycle-walking passes, cost far more than the arithmetic itself.
 *
 *   indices(positions, out, keys, num_samples, shift, left_mask, right_mask)
 *       out[k] = f(positions[k]): int64 buffers of one length, keys a uint64 buffer (one key
 *       a round), the halves as order.py's FeistelOrder._halves gives them.
 *
 * Every argument is checked before any work (a position outside [0, N), halves that do not
 * make a permutation of a range holding [0, N), or one over twice as large): a ValueError,
 * never a loop without end or a long one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

/* The round function: `half` and the key through splitmix64's finaliser, to the mask. */
static inline uint64_t mix(uint64_t half, uint64_t key, uint64_t mask) {
    uint64_t z = half ^ key;
    z *= 0x9E3779B97F4A7C15ULL;
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z & mask;
}

typedef struct {
    const uint64_t *keys;
    Py_ssize_t rounds;
    unsigned shift;
    uint64_t left_mask, right_mask, num_samples;
} Network;

/* One pass: a permutation of [0, 2**b); rounds alternate, the left half first. */
static uint64_t pass(const Network *net, uint64_t x) {
    uint64_t left = x >> net->shift, right = x & net->right_mask;
    for (Py_ssize_t i = 0; i < net->rounds; i++) {
        if (i % 2)
            right ^= mix(left, net->keys[i], net->right_mask);
        else
            left ^= mix(right, net->keys[i], net->left_mask);
    }
    return left << net->shift | right;
}

/* f(x) for x in [0, N): passes until the value lands inside (the same cycle comes back to x
 * at the latest, so this ends). */
static uint64_t walk(const Network *net, uint64_t x) {
    do x = pass(net, x);
    while (x >= net->num_samples);
    return x;
}

/* The halves must make a permutation domain that holds [0, N) and is under twice as large
 * (so a walk is short): a right half of 1-32 bits (FeistelOrder's widths, up to 64 bits in
 * all) and a left half no wider. */
static int check_halves(const Network *net) {
    if (net->shift < 1 || net->shift > 32 || net->right_mask != (1ULL << net->shift) - 1 ||
        (net->left_mask & (net->left_mask + 1)) != 0 || net->left_mask >> net->shift != 0) {
        PyErr_SetString(PyExc_ValueError,
                        "the halves must be a right half of 1-32 bits and a left half no wider");
        return 0;
    }
    uint64_t largest = net->left_mask << net->shift | net->right_mask;
    if (net->num_samples < 1 || net->num_samples - 1 > largest || largest >> 1 >= net->num_samples) {
        PyErr_Format(PyExc_ValueError, "the halves' values [0, %llu] must hold %llu samples, and "
                     "be at most twice as many (cycle-walking takes under two passes then)",
                     (unsigned long long)largest, (unsigned long long)net->num_samples);
        return 0;
    }
    return 1;
}

static PyObject *indices(PyObject *self, PyObject *args) {
    Py_buffer positions, out, keys;
    unsigned long long num_samples, left_mask, right_mask;
    unsigned int shift;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*y*KIKK", &positions, &out, &keys, &num_samples, &shift,
                          &left_mask, &right_mask))
        return NULL;
    Network net = {keys.buf, keys.len / 8, shift, left_mask, right_mask, num_samples};
    Py_ssize_t n = positions.len / 8;
    int ok = check_halves(&net);
    if (ok && (positions.len % 8 || keys.len % 8 || out.len != positions.len)) {
        PyErr_Format(PyExc_ValueError, "positions (%zd bytes), out (%zd) and keys (%zd) must be "
                     "whole 8-byte words, out as long as positions", positions.len, out.len, keys.len);
        ok = 0;
    }
    for (Py_ssize_t k = 0; ok && k < n; k++) {
        uint64_t x;
        memcpy(&x, (const char *)positions.buf + 8 * k, 8); /* any alignment */
        if (x >= num_samples) {
            PyErr_Format(PyExc_ValueError, "position %lld outside [0, %llu)", (long long)x,
                         num_samples);
            ok = 0;
        }
    }
    if (ok) {
        uint64_t *key_words = PyMem_Malloc(keys.len ? (size_t)keys.len : 1);
        if (key_words == NULL) {
            PyErr_NoMemory();
            ok = 0;
        } else {
            memcpy(key_words, keys.buf, (size_t)keys.len);
            net.keys = key_words;
            Py_BEGIN_ALLOW_THREADS;
            for (Py_ssize_t k = 0; k < n; k++) {
                uint64_t x;
                memcpy(&x, (const char *)positions.buf + 8 * k, 8);
                x = walk(&net, x);
                memcpy((char *)out.buf + 8 * k, &x, 8);
            }
            Py_END_ALLOW_THREADS;
            PyMem_Free(key_words);
        }
    }
    PyBuffer_Release(&positions);
    PyBuffer_Release(&out);
    PyBuffer_Release(&keys);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"indices", indices, METH_VARARGS,
     "indices(positions, out, keys, num_samples, shift, left_mask, right_mask): out[k] = the "
     "Feistel network's f(positions[k]), cycle-walked into [0, num_samples) (int64 buffers; "
     "keys uint64, one a round), the GIL released."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
#ifdef Py_mod_gil /* 3.13: no state, no Python objects touched without the GIL */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "feistel", "FeistelOrder's network (see readers.epochs.order).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_feistel(void) { return PyModuleDef_Init(&module); }
