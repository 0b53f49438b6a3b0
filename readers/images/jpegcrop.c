/* The compiled crop kernel of readers.images.kernel: JPEG headers of a batch, then each
 * decode thread's slice decoded box-only, resized and mirrored straight into its batch rows;
 * and the converter's JPEG encoder and resize of pixels that are no JPEG.
 *
 * Four entry points, all run with the GIL released:
 *   headers(values, out)  one row of HEADER_FIELDS int64 per value, from the markers alone
 *                         (the walk of readers.images.jpeg.jpeg_header, plus the frame's
 *                         type, precision and components, and whether the kernel takes it);
 *   crop(values, rows, boxes, sizes, out, status, out_h, out_w[, dct[, verified[, planar[, next]]]],
 *        *, simd, huffman)
 *                         for each row in `rows`: decode the box `boxes[row]` of the JPEG
 *                         `values[row]` (of the size `sizes[row]`) with libjpeg
 *                         (jpeg_crop_scanline for its columns, jpeg_skip_scanlines to an iMCU
 *                         row above it, the IDCT scaled by the denominator `dct[row]` (1,
 *                         2, 4, 8, chosen by the caller: readers.images.jpeg's reducing-gap
 *                         rule; none given: 1), the box then kept at its fractional
 *                         position), resize it
 *                         with torch's uint8 antialiased bilinear (bit-exact; AVX2 where the
 *                         CPU has it), mirror it if asked, and store it into `out[row]`
 *                         (uint8 [n, out_h, out_w, 3], or with `planar` [n, 3, out_h,
 *                         out_w]); `status[row]` is 0, or the reason the caller must
 *                         decode that sample its own way. Calls on several threads given
 *                         the same `next` (int64 [1], from 0) share `rows`: each takes the
 *                         next one by an atomic increment, so they finish together
 *                         whatever each box costs. `simd` (the resize's instructions,
 *                         at most the CPU's) and `huffman` (huffman.c or libjpeg's
 *                         decoder) hold for the call: no process-wide switch.
 *   encode(pixels, height, width, quality, restart)
 *                         RGB rows as TurboJPEG's baseline 4:2:0 JPEG, with a restart
 *                         marker every `restart` MCUs.
 *   resize(pixels, height, width, out, out_h, out_w, extent_h, extent_w, *, simd)
 *                         decoded pixels that are no JPEG box (a PNG, a dataset's raw
 *                         pixels) resized as crop() resizes a box: the converter's resize
 *                         without torch.
 * A libjpeg error or warning is a status, never an abort: the caller's fallback judges the
 * file. Unless the caller says the bytes are `verified` (they passed the CRC-32 recorded
 * when they were known to decode cleanly), the rest of the entropy-coded data is still read
 * after the box (without IDCT), so the kernel refuses exactly the files a full decode warns
 * about; verified, the decode stops after the box's last row, and where restart markers cut
 * every MCU row into intervals (what encode() writes), it decodes only the intervals around
 * the box (restart_part), not every row above it, and its Huffman codes go through the
 * kernel's own decoder (huffman.c), which keeps a fast path across restart markers.
 *
 * This file is the binding only: Python's arguments checked and turned into a Batch, the
 * GIL released around the units below it. The units, each with its header, no include
 * circle (tests/test_layout.py checks), from the top down: decode_box (one thread's rows),
 * restarts (the intervals around a box), place (the resize's driver), resize_avx2 and
 * resize_scalar (its passes), markers (headers()), encoder, errors (libjpeg's errors as
 * jumps to a live frame), huffman (the own Huffman decoder), and on the ground floor
 * scratch (a thread's buffers), taps (the resize weights) and kernel_types.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "decode_box.h"
#include "encoder.h"
#include "huffman.h"
#include "kernel_types.h"
#include "markers.h"
#include "place.h"
#include "scratch.h"

/* Fixed at import: the CPU's best resize level, and the Huffman decoder crop() uses when a
 * call does not say (IMGPACK_KERNEL_HUFFMAN=0: libjpeg's), so that a caller that cannot
 * pass it (the fused crop path in a benchmark) still chooses without a switch. */
static int cpu_simd = 0, default_huffman = 0;

/* --- Python buffers ---------------------------------------------------------------------- */

/* The bytes of a stored value (bytes, bytearray, memoryview); NULL data for anything else. */
static int get_bytes(PyObject *value, Py_buffer *view, Bytes *b) {
    b->data = NULL;
    b->size = 0;
    view->obj = NULL;
    if (!PyBytes_Check(value) && !PyByteArray_Check(value) && !PyMemoryView_Check(value)) return 0;
    if (PyObject_GetBuffer(value, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    b->data = view->buf;
    b->size = (size_t)view->len;
    return 0;
}

static void release_all(Py_buffer *views, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++)
        if (views[k].obj != NULL) PyBuffer_Release(&views[k]);
}

static int get_array(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize,
                     Py_ssize_t items, const char *what) {
    if (PyObject_GetBuffer(obj, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len != itemsize * items) {
        PyErr_Format(PyExc_ValueError, "%s has %zd bytes, not %zd", what, view->len, itemsize * items);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *headers(PyObject *self, PyObject *args) {
    PyObject *values, *out_obj;
    Py_buffer out_view;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &values, &out_obj)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (get_array(out_obj, &out_view, 1, HEADER_FIELDS * sizeof(int64_t), n, "out") < 0) return NULL;
    Py_buffer *views = PyMem_Calloc(n ? n : 1, sizeof *views);
    Bytes *bytes = PyMem_Calloc(n ? n : 1, sizeof *bytes);
    int ok = views != NULL && bytes != NULL;
    if (!ok) PyErr_NoMemory();
    for (Py_ssize_t k = 0; ok && k < n; k++)
        ok = get_bytes(PyList_GET_ITEM(values, k), &views[k], &bytes[k]) == 0;
    if (ok) {
        int64_t *out = out_view.buf;
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t k = 0; ok && k < n; k++) {
            if (bytes[k].data == NULL) memset(out + k * HEADER_FIELDS, 0, HEADER_FIELDS * sizeof *out);
            else ok = read_header(bytes[k], out + k * HEADER_FIELDS);
        }
        Py_END_ALLOW_THREADS;
        if (!ok) PyErr_NoMemory();
    }
    if (views != NULL) release_all(views, n);
    PyMem_Free(views);
    PyMem_Free(bytes);
    PyBuffer_Release(&out_view);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* crop(): the arrays checked against the batch, then crop_all without the GIL. */
static PyObject *crop(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"values", "rows",    "boxes",   "sizes", "out",  "status",  "out_h",
                            "out_w",  "dct",     "verified", "planar", "next", "simd", "huffman",
                            NULL};
    PyObject *values, *rows_obj, *boxes_obj, *out_obj, *status_obj, *sizes_obj, *next_obj = Py_None;
    PyObject *dct_obj = Py_None;
    int out_h, out_w, verified = 0, planar = 0, simd = -1, huffman = default_huffman;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOOii|OppO$ip", names, &PyList_Type,
                                     &values, &rows_obj, &boxes_obj, &sizes_obj, &out_obj,
                                     &status_obj, &out_h, &out_w, &dct_obj, &verified, &planar,
                                     &next_obj, &simd, &huffman))
        return NULL;
    /* -1 (the default): the CPU's best; more than it has: what it has */
    const Options options = {simd < 0 || simd > cpu_simd ? cpu_simd : simd,
                             huffman && IMGPACK_OWN_HUFFMAN, verified, planar};
    if (out_h <= 0 || out_w <= 0) {
        PyErr_SetString(PyExc_ValueError, "the output size must be positive");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    Py_buffer rows_v, boxes_v, sizes_v, out_v, status_v, next_v = {0}, dct_v = {0};
    int64_t own_next = 0, *next = &own_next; /* the index in `rows` of the next row to take */
    if (dct_obj != Py_None && get_array(dct_obj, &dct_v, 0, sizeof(int64_t), n, "dct") < 0)
        return NULL;
    if (next_obj != Py_None) {
        if (get_array(next_obj, &next_v, 1, sizeof(int64_t), 1, "next") < 0) {
            if (dct_v.obj != NULL) PyBuffer_Release(&dct_v);
            return NULL;
        }
        next = next_v.buf;
    }
    if (PyObject_GetBuffer(rows_obj, &rows_v, PyBUF_C_CONTIGUOUS) < 0) {
        if (next_v.obj != NULL) PyBuffer_Release(&next_v);
        if (dct_v.obj != NULL) PyBuffer_Release(&dct_v);
        return NULL;
    }
    const int64_t *dcts = dct_v.buf; /* NULL: every row at full scale */
    Py_ssize_t m = rows_v.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *rows = rows_v.buf;
    int got = 0;
    if (get_array(boxes_obj, &boxes_v, 0, 5 * sizeof(int64_t), n, "boxes") == 0) got++;
    if (got == 1 && get_array(sizes_obj, &sizes_v, 0, 2 * sizeof(int64_t), n, "sizes") == 0) got++;
    if (got == 2 && get_array(out_obj, &out_v, 1, (Py_ssize_t)out_h * out_w * 3, n, "out") == 0) got++;
    if (got == 3 && get_array(status_obj, &status_v, 1, sizeof(int32_t), n, "status") == 0) got++;
    Py_buffer *views = NULL;
    Bytes *bytes = NULL;
    int ok = got == 4;
    for (Py_ssize_t k = 0; ok && k < m; k++)
        if (rows[k] < 0 || rows[k] >= n) {
            PyErr_Format(PyExc_IndexError, "row %lld of a batch of %zd", (long long)rows[k], n);
            ok = 0;
        } else if (dcts != NULL && dcts[rows[k]] != 1 && dcts[rows[k]] != 2 &&
                   dcts[rows[k]] != 4 && dcts[rows[k]] != 8) {
            PyErr_Format(PyExc_ValueError, "dct[%lld] is %lld, not 1, 2, 4 or 8",
                         (long long)rows[k], (long long)dcts[rows[k]]);
            ok = 0;
        }
    if (ok) {
        views = PyMem_Calloc(m ? m : 1, sizeof *views);
        bytes = PyMem_Calloc(m ? m : 1, sizeof *bytes);
        if (views == NULL || bytes == NULL) ok = 0, PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; ok && k < m; k++) {
        ok = get_bytes(PyList_GET_ITEM(values, rows[k]), &views[k], &bytes[k]) == 0;
        if (ok && bytes[k].data == NULL) {
            PyErr_SetString(PyExc_TypeError, "crop() decodes bytes-like values only");
            ok = 0;
        }
    }
    if (ok) {
        const Batch batch = {bytes, rows, m, boxes_v.buf, sizes_v.buf, dcts,
                             out_v.buf, status_v.buf, out_h, out_w, next};
        Py_BEGIN_ALLOW_THREADS;
        crop_all(&batch, &options);
        Py_END_ALLOW_THREADS;
    }
    if (views != NULL) release_all(views, m);
    PyMem_Free(views);
    PyMem_Free(bytes);
    if (got > 3) PyBuffer_Release(&status_v);
    if (got > 2) PyBuffer_Release(&out_v);
    if (got > 1) PyBuffer_Release(&sizes_v);
    if (got > 0) PyBuffer_Release(&boxes_v);
    PyBuffer_Release(&rows_v);
    if (next_v.obj != NULL) PyBuffer_Release(&next_v);
    if (dct_v.obj != NULL) PyBuffer_Release(&dct_v);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *encode(PyObject *self, PyObject *args) {
    Py_buffer pixels;
    int height, width, quality, restart;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiii", &pixels, &height, &width, &quality, &restart)) return NULL;
    const char *wrong = NULL;
    if (height < 1 || width < 1 || height > 65500 || width > 65500) wrong = "the size must be 1 to 65500 pixels a side";
    else if (pixels.len != (Py_ssize_t)height * width * 3) wrong = "pixels must hold height x width x 3 bytes";
    else if (quality < 1 || quality > 100) wrong = "quality must be 1 to 100";
    else if (restart < 0 || restart > 65535) wrong = "restart must be 0 to 65535 MCUs";
    if (wrong != NULL) {
        PyBuffer_Release(&pixels);
        PyErr_SetString(PyExc_ValueError, wrong);
        return NULL;
    }
    unsigned char *jpeg = NULL;
    unsigned long size = 0;
    int ok;
    Py_BEGIN_ALLOW_THREADS;
    ok = compress(pixels.buf, height, width, quality, restart, &jpeg, &size);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&pixels);
    PyObject *out = ok ? PyBytes_FromStringAndSize((const char *)jpeg, (Py_ssize_t)size) : NULL;
    free(jpeg);
    if (!ok) PyErr_SetString(PyExc_MemoryError, "libjpeg could not encode the image");
    return out;
}

enum { MAX_SIDE = 1 << 20 }; /* resize()'s sides: the sizes stay ints, the byte counts exact */

static PyObject *resize(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"pixels", "height", "width", "out", "out_h", "out_w",
                            "extent_h", "extent_w", "simd", NULL};
    Py_buffer pixels, out;
    int height, width, out_h, out_w, simd = -1;
    double extent_h, extent_w;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*iiw*iidd|$i", names, &pixels, &height,
                                     &width, &out, &out_h, &out_w, &extent_h, &extent_w, &simd))
        return NULL;
    const char *wrong = NULL;
    if (height < 1 || width < 1 || out_h < 1 || out_w < 1 || height > MAX_SIDE ||
        width > MAX_SIDE || out_h > MAX_SIDE || out_w > MAX_SIDE)
        wrong = "every side must be 1 to 1048576 pixels";
    else if (pixels.len != (Py_ssize_t)height * width * 3)
        wrong = "pixels must hold height x width x 3 bytes";
    else if (out.len != (Py_ssize_t)out_h * out_w * 3)
        wrong = "out must hold out_h x out_w x 3 bytes";
    else if (!(extent_h > 0.0 && extent_h <= height && extent_w > 0.0 && extent_w <= width))
        wrong = "the extent must lie inside the pixels";
    int ok = 0;
    if (wrong == NULL) {
        const int level = simd < 0 || simd > cpu_simd ? cpu_simd : simd;
        Py_BEGIN_ALLOW_THREADS;
        ok = resize_image(pixels.buf, height, width, extent_h, extent_w, level, out.buf, out_h,
                          out_w);
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&pixels);
    PyBuffer_Release(&out);
    if (wrong != NULL) PyErr_SetString(PyExc_ValueError, wrong);
    else if (!ok) PyErr_NoMemory();
    if (wrong != NULL || !ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"headers", headers, METH_VARARGS,
     "headers(values, out): int64 [n, 9] (parsed, width, height, orientation, frame marker, "
     "precision, components, complete, taken) from each value's JPEG markers; zeros for a value "
     "that is not bytes-like or whose markers do not parse."},
    {"crop", (PyCFunction)(void (*)(void))crop, METH_VARARGS | METH_KEYWORDS,
     "crop(values, rows, boxes, sizes, out, status, out_h, out_w[, dct[, verified[, planar[, next]]]], "
     "*, simd=-1, huffman=HUFFMAN): "
     "decode, crop, resize and mirror values[row] into out[row] for each row, the GIL "
     "released; status[row] 0 or the reason to decode it another way. dct: int64 [n], each "
     "row's IDCT scale denominator (1, 2, 4, 8) for a box inside the image; None (default): "
     "1. verified: stop decoding after the box. planar: "
     "out is [n, 3, out_h, out_w] instead of [n, out_h, out_w, 3]. next: an int64 [1] "
     "(from 0) that calls on other threads share, each taking the next of rows by an "
     "atomic increment. simd: the resize's instructions for this call, 0 plain C, 1 AVX2, 2 "
     "AVX2 by groups of four outputs (-1, the default: SIMD, the CPU's best; more is capped "
     "at it). huffman: verified and other baseline scans decode their Huffman codes through "
     "the kernel's own decoder (where OWN_HUFFMAN) or libjpeg's (False). Every level and "
     "both decoders give the same pixels (the tests check)."},
    {"encode", encode, METH_VARARGS,
     "encode(pixels, height, width, quality, restart) -> bytes: uint8 RGB rows as a baseline "
     "4:2:0 JPEG, the GIL released, with TurboJPEG's settings (so that restart=0 gives "
     "tjCompress2's bytes) and a restart marker every `restart` MCUs."},
    {"resize", (PyCFunction)(void (*)(void))resize, METH_VARARGS | METH_KEYWORDS,
     "resize(pixels, height, width, out, out_h, out_w, extent_h, extent_w, *, simd=-1): "
     "uint8 HWC rows (height x width x 3) resized into out (out_h x out_w x 3) with torch's "
     "uint8 antialiased bilinear, the GIL released; the top-left extent_h x extent_w of the "
     "pixels is the image (height and width for all of it: then bit-exact with "
     "F.interpolate(size=...)). simd as for crop()."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m) {
    cpu_simd = best_simd();
    const char *huffman = getenv("IMGPACK_KERNEL_HUFFMAN");
    default_huffman = IMGPACK_OWN_HUFFMAN && !(huffman != NULL && strcmp(huffman, "0") == 0);
    scratch_init(); /* without the key, crop() marks every row CROP_MEMORY */
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    const long turbo = LIBJPEG_TURBO_VERSION_NUMBER;
#else
    const long turbo = 0;
#endif
    if (PyModule_AddIntConstant(m, "HEADER_FIELDS", HEADER_FIELDS) < 0 ||
        PyModule_AddIntConstant(m, "SIMD", cpu_simd) < 0 ||
        PyModule_AddIntConstant(m, "OWN_HUFFMAN", IMGPACK_OWN_HUFFMAN) < 0 ||
        PyModule_AddIntConstant(m, "HUFFMAN", default_huffman) < 0 ||
        PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", turbo) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
#ifdef Py_mod_gil /* 3.13: every call releases or never needs the GIL; no module state */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "jpegcrop", "The compiled JPEG crop kernel (see readers.images.kernel).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_jpegcrop(void) { return PyModuleDef_Init(&module); }
