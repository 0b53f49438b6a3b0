/* The compiled crop kernel of readers.images.kernel: JPEG headers of a batch, then each
 * decode thread's slice decoded box-only, resized and mirrored straight into its batch rows;
 * and the converter's JPEG encoder.
 *
 * Three entry points, all run with the GIL released:
 *   headers(values, out)  one row of HEADER_FIELDS int64 per value, from the markers alone
 *                         (the walk of readers.images.jpeg.jpeg_header, plus the frame's
 *                         type, precision and components, and whether the kernel takes it);
 *   crop(values, rows, boxes, sizes, out, status, out_h, out_w[, dct[, verified[, planar[, next]]]])
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
 *                         whatever each box costs.
 *   encode(pixels, height, width, quality, restart)
 *                         RGB rows as TurboJPEG's baseline 4:2:0 JPEG, with a restart
 *                         marker every `restart` MCUs.
 * A libjpeg error or warning is a status, never an abort: the caller's fallback judges the
 * file. Unless the caller says the bytes are `verified` (they passed the CRC-32 recorded
 * when they were known to decode cleanly), the rest of the entropy-coded data is still read
 * after the box (without IDCT), so the kernel refuses exactly the files a full decode warns
 * about; verified, the decode stops after the box's last row, and where restart markers cut
 * every MCU row into intervals (what encode() writes), it decodes only the intervals around
 * the box (restart_part), not every row above it, and its Huffman codes go through the
 * kernel's own decoder (huffman.c), which keeps a fast path across restart markers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "huffman.h"

enum { HEADER_FIELDS = 9 };
/* Columns of headers(): whether the markers parse, then what they say, then whether crop()
 * takes the JPEG (takes()). */
enum { H_PARSED, H_WIDTH, H_HEIGHT, H_ORIENTATION, H_FRAME, H_PRECISION, H_COMPONENTS, H_COMPLETE, H_TAKES };

enum {
    CROP_OK = 0,
    CROP_LIBJPEG = 1,     /* libjpeg failed or warned: the fallback judges the file */
    CROP_UNSUPPORTED = 2, /* not what the kernel decodes (CMYK, another size than probed) */
    CROP_MEMORY = 3,
};

enum { SLACK = 16 }; /* bytes readable after any source row: the AVX2 resize reads past it */
enum { MAX_SCANS = 500 }; /* libjpeg-turbo's TJFLAG_LIMITSCANS: bounds a progressive decode */

/* --- markers: readers.images.jpeg.jpeg_header, byte for byte ----------------------------- */

typedef struct {
    const uint8_t *data;
    size_t size;
} Bytes;

static unsigned be16(const uint8_t *p) { return ((unsigned)p[0] << 8) | p[1]; }

static uint32_t tiff32(const uint8_t *p, int big) {
    return big ? ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]
               : ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | p[0];
}

static unsigned tiff16(const uint8_t *p, int big) {
    return big ? ((unsigned)p[0] << 8) | p[1] : ((unsigned)p[1] << 8) | p[0];
}

/* exif_orientation(): the Orientation in IFD0; -1 where Python's is None. */
static int64_t exif_orientation(const uint8_t *tiff, size_t n) {
    int big;
    if (n < 2) return -1;
    if (tiff[0] == 'I' && tiff[1] == 'I') big = 0;
    else if (tiff[0] == 'M' && tiff[1] == 'M') big = 1;
    else return -1;
    if (n < 8) return -1;
    uint64_t ifd = tiff32(tiff + 4, big);
    if (ifd + 2 > n) return -1;
    uint64_t count = tiff16(tiff + ifd, big);
    uint64_t stop = ifd + 2 + 12 * count;
    if (n < 11) return -1;
    if (stop > n - 11) stop = n - 11;
    for (uint64_t entry = ifd + 2; entry < stop; entry += 12) {
        unsigned tag = tiff16(tiff + entry, big), kind = tiff16(tiff + entry + 2, big);
        uint32_t values = tiff32(tiff + entry + 4, big);
        if (tag == 0x0112) {
            if (values != 1 || (kind != 3 && kind != 4)) return 0;
            return kind == 3 ? (int64_t)tiff16(tiff + entry + 8, big)
                             : (int64_t)tiff32(tiff + entry + 8, big);
        }
    }
    return -1;
}

/* xmp_orientation(): rb'tiff:Orientation(?:="|>)([0-9])', else 1. */
static int64_t xmp_orientation(const uint8_t *xmp, size_t n) {
    static const char key[] = "tiff:Orientation";
    const size_t k = sizeof key - 1;
    for (size_t i = 0; i + k < n; i++) {
        if (memcmp(xmp + i, key, k) != 0) continue;
        const uint8_t *p = xmp + i + k;
        size_t left = n - i - k;
        if (left >= 3 && p[0] == '=' && p[1] == '"' && p[2] >= '0' && p[2] <= '9') return p[2] - '0';
        if (left >= 2 && p[0] == '>' && p[1] >= '0' && p[1] <= '9') return p[1] - '0';
    }
    return 1;
}

static int is_frame(unsigned marker) {
    return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

static int has_no_length(unsigned marker) {
    return marker == 0x01 || (marker >= 0xD0 && marker <= 0xD9) || marker == 0xFF;
}

static int starts_with(const uint8_t *data, size_t n, size_t at, const char *prefix, size_t k) {
    return at <= n && n - at >= k && memcmp(data + at, prefix, k) == 0;
}

/* Whether crop() takes a JPEG of these parsed markers (before the caller's pixel limit):
 * complete, upright, 8-bit Huffman-coded baseline, extended or progressive (SOF0-SOF2), of one
 * or three components. Everything else goes to the caller's decoder, which judges it. */
static int64_t takes(const int64_t *h) {
    int64_t frame = h[H_FRAME], components = h[H_COMPONENTS], orientation = h[H_ORIENTATION];
    return h[H_COMPLETE] == 1 && h[H_PRECISION] == 8 && frame >= 0xC0 && frame <= 0xC2 &&
           (components == 1 || components == 3) && (orientation < 2 || orientation > 8) &&
           h[H_WIDTH] > 0 && h[H_HEIGHT] > 0;
}

/* One value's row of headers(); returns 0 when out of memory (EXIF spread over segments). */
static int read_header(Bytes b, int64_t *out) {
    static const char exif_header[] = "Exif\0\0";
    static const char xmp_header[] = "http://ns.adobe.com/xap/1.0/";
    const size_t exif_k = 6, xmp_k = sizeof xmp_header; /* the XMP header ends with its NUL */
    const uint8_t *d = b.data;
    size_t n = b.size, i = 2;
    int found_size = 0, found_sos = 0;
    uint8_t *exif = NULL;
    size_t exif_n = 0;
    const uint8_t *xmp = NULL;
    size_t xmp_n = 0;
    memset(out, 0, HEADER_FIELDS * sizeof *out);
    if (n < 3 || d[0] != 0xFF || d[1] != 0xD8 || d[2] != 0xFF) return 1;
    while (i + 4 <= n && d[i] == 0xFF) {
        unsigned marker = d[i + 1];
        if (marker == 0xDA) {
            found_sos = 1;
            break;
        }
        if (has_no_length(marker)) {
            i += marker == 0xFF ? 1 : 2;
            continue;
        }
        size_t length = be16(d + i + 2);
        if (length < 2) break;
        size_t start = i + 4, end = i + 2 + length, stop = end < n ? end : n;
        if (is_frame(marker) && !found_size && length >= 7 && start + 5 <= n) {
            found_size = 1;
            out[H_FRAME] = marker;
            out[H_PRECISION] = d[start];
            out[H_HEIGHT] = be16(d + start + 1);
            out[H_WIDTH] = be16(d + start + 3);
            out[H_COMPONENTS] = start + 5 < n ? d[start + 5] : 0;
        } else if (marker == 0xE1 && starts_with(d, n, start, exif_header, exif_k)) {
            size_t from = start + exif_k;
            if (from < stop) {
                uint8_t *grown = realloc(exif, exif_n + (stop - from));
                if (grown == NULL) {
                    free(exif);
                    return 0;
                }
                exif = grown;
                memcpy(exif + exif_n, d + from, stop - from);
                exif_n += stop - from;
            }
        } else if (marker == 0xE1 && starts_with(d, n, start, xmp_header, xmp_k)) {
            size_t from = start + xmp_k;
            xmp = d + from;
            xmp_n = from < stop ? stop - from : 0;
        }
        i = end;
    }
    if (found_sos && found_size) {
        int64_t orientation = exif_orientation(exif, exif_n);
        out[H_PARSED] = 1;
        out[H_ORIENTATION] = orientation >= 0 ? orientation : xmp_orientation(xmp, xmp_n);
        out[H_COMPLETE] = n >= 2 && d[n - 2] == 0xFF && d[n - 1] == 0xD9;
        out[H_TAKES] = takes(out);
    } else {
        memset(out, 0, HEADER_FIELDS * sizeof *out);
    }
    free(exif);
    return 1;
}

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

/* --- torch's uint8 antialiased bilinear (aten/src/ATen/native/cpu/UpSampleKernel.cpp) ------ */

/* The taps of one resized dimension: output i reads `size[i]` inputs from `first[i]` with the
 * int16 weights `weights[i * taps ...]`, rounded at `precision` bits. */
typedef struct {
    int *first, *size;
    int16_t *weights;
    int32_t *pairs; /* output i's weights two by two, as _mm_madd_epi16 pairs them: (taps + 1) / 2 */
    int taps, precision;
    /* The horizontal pass by groups of GROUP outputs (make_groups), where every output has
     * at most 2 * group_pairs taps: per group, its three registers' first input byte in
     * `group_base` and, per register and pair of taps, a byte shuffle then the int16
     * weights, each 32 bytes (the same in both 128-bit lanes) in `group_lanes`. */
    int groups, group_pairs;
    int32_t *group_base;
    uint8_t *group_lanes;
} Taps;

enum {
    GROUP = 4,       /* outputs a group: 12 bytes, three registers of four int32 channels */
    GROUP_PAIRS = 3, /* at most this many pairs of taps an output */
    LANE = 32,       /* bytes of one shuffle or of one register's weights */
};

static void free_taps(Taps *t) {
    free(t->first);
    free(t->size);
    free(t->weights);
    free(t->pairs);
    free(t->group_base);
    free(t->group_lanes);
    *t = (Taps){0}; /* freed once: make_taps frees what it made when it fails, and so may place */
}

/* Two int16 weights in one int32, the first in the low half. */
static int32_t pair(int16_t a, int16_t b) { return (int32_t)((uint32_t)(uint16_t)a | ((uint32_t)(uint16_t)b << 16)); }

static double triangle(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* One dimension of a box: `in` source pixels, of which the box spans `extent` from
 * `offset` (fractional in a DCT-scaled decode; 0 and `in` otherwise). */
typedef struct {
    int in;
    double offset, extent;
} Span;

static int is_copy(Span s, int out) { return s.in == out && s.offset == 0.0 && s.extent == out; }

/* HelperInterpBase::_compute_indices_int16_weights_aa with align_corners=False, no scale
 * given, bilinear, antialias=True: the same doubles in the same order, so the same weights
 * for a whole span (offset 0, extent in). A fractional span shifts and scales the centres. */
static int make_taps(Taps *t, Span span, int out) {
    const int in = span.in;
    double scale = span.extent / (double)out;
    double support = scale >= 1.0 ? 1.0 * scale : 1.0;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int taps = (int)ceil(support) * 2 + 1;
    double *w = malloc((size_t)out * taps * sizeof *w);
    t->first = malloc((size_t)out * sizeof *t->first);
    t->size = malloc((size_t)out * sizeof *t->size);
    t->weights = malloc((size_t)out * taps * sizeof *t->weights);
    t->pairs = malloc((size_t)out * ((taps + 1) / 2) * sizeof *t->pairs);
    t->taps = taps;
    if (w == NULL || t->first == NULL || t->size == NULL || t->weights == NULL || t->pairs == NULL) {
        free(w);
        free_taps(t);
        return 0;
    }
    for (int i = 0; i < out; i++) {
        double center = span.offset + scale * (i + 0.5), total = 0.0;
        int64_t xmin = (int64_t)(center - support + 0.5), xmax = (int64_t)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in) xmax = in;
        int64_t xsize = xmax - xmin, j;
        double *wi = w + (size_t)i * taps;
        for (j = 0; j < xsize; j++) {
            wi[j] = triangle(((double)(j + xmin) - center + 0.5) * invscale);
            total += wi[j];
        }
        for (j = 0; j < xsize; j++)
            if (total != 0.0) wi[j] /= total;
        for (; j < taps; j++) wi[j] = 0.0;
        t->first[i] = (int)xmin;
        t->size[i] = (int)xsize;
    }
    double w_max = w[0];
    for (size_t k = 0; k < (size_t)out * taps; k++)
        if (w_max < w[k]) w_max = w[k];
    int precision;
    for (precision = 0; precision < 22; precision++)
        if ((int)(0.5 + w_max * (1 << (precision + 1))) >= (1 << 15)) break;
    t->precision = precision;
    for (size_t k = 0; k < (size_t)out * taps; k++)
        t->weights[k] = (int16_t)(w[k] < 0 ? (int)(-0.5 + w[k] * (1 << precision))
                                           : (int)(0.5 + w[k] * (1 << precision)));
    const int halves = (taps + 1) / 2;
    for (int i = 0; i < out; i++) {
        const int16_t *k = t->weights + (size_t)i * taps;
        for (int j = 0; j < halves; j++)
            t->pairs[(size_t)i * halves + j] = pair(k[2 * j], 2 * j + 1 < taps ? k[2 * j + 1] : 0);
    }
    free(w);
    return 1;
}

/* The grouped horizontal pass's tables for `t` (of `out` outputs), if it can take them:
 * output channel c of a group (0-11, RGB of its four pixels) is int32 lane c % 4 of register
 * c / 4, which reads the 16 bytes from its group_base; each of its pairs of taps is a byte
 * shuffle of those 16 (two uint8 widened to int16, 0x80 for a tap the output has not) and a
 * _mm_madd_epi16 by the two weights (0 for none). The same integers as resize_rows, so the
 * same pixels. Without tables (an output with over 2 * GROUP_PAIRS taps, or a register whose
 * bytes span over 16: downscales beyond about 1.8x), groups stays 0. 0: out of memory. */
static int make_groups(Taps *t, int out) {
    int most = 0;
    for (int x = 0; x < out; x++)
        if (most < t->size[x]) most = t->size[x];
    const int pairs = (most + 1) / 2, groups = out / GROUP;
    if (pairs < 1 || pairs > GROUP_PAIRS || groups == 0) return 1;
    t->group_base = malloc((size_t)groups * 3 * sizeof *t->group_base);
    t->group_lanes = calloc((size_t)groups * 3 * pairs * 2, LANE);
    if (t->group_base == NULL || t->group_lanes == NULL) return 0;
    for (int g = 0; g < groups; g++)
        for (int r = 0; r < 3; r++) {
            int lo = INT_MAX, hi = -1;
            for (int lane = 0; lane < 4; lane++) {
                int c = 4 * r + lane, x = g * GROUP + c / 3;
                if (t->size[x] == 0) continue;
                int first = t->first[x] * 3 + c % 3, last = first + (t->size[x] - 1) * 3;
                if (lo > first) lo = first;
                if (hi < last) hi = last;
            }
            if (hi < 0) lo = hi = 0;
            if (hi - lo >= 16) { /* not in one load: no groups at all */
                free(t->group_base);
                free(t->group_lanes);
                t->group_base = NULL;
                t->group_lanes = NULL;
                return 1;
            }
            t->group_base[g * 3 + r] = lo;
            for (int q = 0; q < pairs; q++) {
                uint8_t *shuffle = t->group_lanes + ((size_t)(g * 3 + r) * pairs + q) * 2 * LANE;
                int16_t weights[LANE / 2];
                memset(shuffle, 0x80, LANE);
                for (int lane = 0; lane < 4; lane++) {
                    int c = 4 * r + lane, x = g * GROUP + c / 3;
                    for (int half = 0; half < 2; half++) {
                        int j = 2 * q + half, have = j < t->size[x];
                        int16_t w = have ? t->weights[(size_t)x * t->taps + j] : 0;
                        if (have) shuffle[4 * lane + 2 * half] = (uint8_t)((t->first[x] + j) * 3 + c % 3 - lo);
                        weights[2 * lane + half] = w;
                    }
                }
                memcpy(shuffle + LANE / 2, shuffle, LANE / 2);
                memcpy(weights + LANE / 4, weights, LANE / 2);
                memcpy(shuffle + LANE, weights, LANE);
            }
        }
    t->groups = groups;
    t->group_pairs = pairs;
    return 1;
}

static uint8_t clamp8(int32_t v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v; }

/* Rows of `src` (`stride` bytes apart, `width` RGB pixels) resized horizontally into `dst`
 * (out_w pixels a row, packed). */
static void resize_rows(const uint8_t *src, size_t stride, int rows, const Taps *t, int out_w,
                        uint8_t *dst, size_t dst_stride) {
    const int32_t bias = t->precision > 0 ? 1 << (t->precision - 1) : 0;
    for (int y = 0; y < rows; y++) {
        const uint8_t *line = src + (size_t)y * stride;
        uint8_t *o = dst + (size_t)y * dst_stride;
        for (int x = 0; x < out_w; x++) {
            const int16_t *k = t->weights + (size_t)x * t->taps;
            const uint8_t *p = line + (size_t)t->first[x] * 3;
            int32_t r = bias, g = bias, b = bias;
            for (int j = 0; j < t->size[x]; j++, p += 3) {
                r += p[0] * k[j];
                g += p[1] * k[j];
                b += p[2] * k[j];
            }
            uint8_t *q = o + (size_t)x * 3;
            q[0] = clamp8(r >> t->precision);
            q[1] = clamp8(g >> t->precision);
            q[2] = clamp8(b >> t->precision);
        }
    }
}

/* Columns resized: output row y of `dst` from rows t->first[y]... of `src` (`n` bytes a row,
 * `stride` apart); `acc` holds n int32. */
static void resize_columns(const uint8_t *src, size_t stride, size_t n, const Taps *t, int out_h,
                           uint8_t *dst, size_t dst_stride, int32_t *acc) {
    const int32_t bias = t->precision > 0 ? 1 << (t->precision - 1) : 0;
    for (int y = 0; y < out_h; y++) {
        const int16_t *k = t->weights + (size_t)y * t->taps;
        for (size_t i = 0; i < n; i++) acc[i] = bias;
        for (int j = 0; j < t->size[y]; j++) {
            const uint8_t *line = src + (size_t)(t->first[y] + j) * stride;
            const int32_t kj = k[j];
            for (size_t i = 0; i < n; i++) acc[i] += line[i] * kj;
        }
        uint8_t *o = dst + (size_t)y * dst_stride;
        for (size_t i = 0; i < n; i++) o[i] = clamp8(acc[i] >> t->precision);
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_AVX2 1

/* One output pixel of two rows (one in each 128-bit lane): taps four, then two, then one at
 * a time over the pixels from p0 and p1, the weight pairs of `pairs`; RGB in the low three
 * int32 lanes of each half, before the shift. Reads up to 4 bytes past the last pixel. */
__attribute__((target("avx2"))) static inline __m256i taps_of_two_rows(const uint8_t *p0,
                                                                       const uint8_t *p1,
                                                                       const int32_t *pairs,
                                                                       int size, __m256i acc) {
    const __m256i two = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    const __m256i two_hi = _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1,
                                             6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
    const __m256i one = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, -1, -1, -1, -1,
                                          0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, -1, -1, -1, -1);
    int j = 0;
    for (; j + 3 < size; j += 4) {
        __m256i px = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + j * 3))),
            _mm_loadu_si128((const __m128i *)(p1 + j * 3)), 1);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(px, two),
                                                      _mm256_set1_epi32(pairs[j / 2])));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(px, two_hi),
                                                      _mm256_set1_epi32(pairs[j / 2 + 1])));
    }
    if (j + 1 < size) {
        __m256i px = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(p0 + j * 3))),
            _mm_loadl_epi64((const __m128i *)(p1 + j * 3)), 1);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(px, two),
                                                      _mm256_set1_epi32(pairs[j / 2])));
        j += 2;
    }
    if (j < size) { /* the pair's second weight is 0 here, or `one` drops its pixel */
        int32_t v0, v1;
        memcpy(&v0, p0 + j * 3, 4);
        memcpy(&v1, p1 + j * 3, 4);
        __m256i px = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_cvtsi32_si128(v0)),
                                             _mm_cvtsi32_si128(v1), 1);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_shuffle_epi8(px, one),
                                                      _mm256_set1_epi32(pairs[j / 2])));
    }
    return acc;
}

/* The two rows' pixel of `acc`, shifted and clamped, stored at o0 and o1. */
__attribute__((target("avx2"))) static inline void store_two(__m256i acc, __m128i shift,
                                                             uint8_t *o0, uint8_t *o1) {
    acc = _mm256_sra_epi32(acc, shift);
    acc = _mm256_packus_epi16(_mm256_packs_epi32(acc, acc), acc);
    int32_t rgb0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(acc));
    int32_t rgb1 = _mm_cvtsi128_si32(_mm256_extracti128_si256(acc, 1));
    memcpy(o0, &rgb0, 3);
    memcpy(o1, &rgb1, 3);
}

/* resize_rows with AVX2 and the same integers: Pillow-SIMD's pairing of taps (as torch's
 * AVX2 kernel), four rows at a time (two in each of two registers, one in each 128-bit
 * lane), sharing each output pixel's taps. Reads up to 4 bytes past a row's last pixel
 * (SLACK). */
__attribute__((target("avx2"))) static void resize_rows_avx2(const uint8_t *src, size_t stride,
                                                            int rows, const Taps *t, int out_w,
                                                            uint8_t *dst, size_t dst_stride) {
    const __m256i bias = _mm256_set1_epi32(t->precision > 0 ? 1 << (t->precision - 1) : 0);
    const __m128i shift = _mm_cvtsi32_si128(t->precision);
    const int halves = (t->taps + 1) / 2;
    int y = 0;
    for (; y + 3 < rows; y += 4) {
        const uint8_t *line = src + (size_t)y * stride;
        uint8_t *o = dst + (size_t)y * dst_stride;
        for (int x = 0; x < out_w; x++) {
            const int32_t *pairs = t->pairs + (size_t)x * halves;
            const uint8_t *p = line + (size_t)t->first[x] * 3;
            const int size = t->size[x];
            __m256i a01 = taps_of_two_rows(p, p + stride, pairs, size, bias);
            __m256i a23 = taps_of_two_rows(p + 2 * stride, p + 3 * stride, pairs, size, bias);
            uint8_t *q = o + (size_t)x * 3;
            store_two(a01, shift, q, q + dst_stride);
            store_two(a23, shift, q + 2 * dst_stride, q + 3 * dst_stride);
        }
    }
    for (; y + 1 < rows; y += 2) {
        const uint8_t *line = src + (size_t)y * stride;
        uint8_t *o = dst + (size_t)y * dst_stride;
        for (int x = 0; x < out_w; x++) {
            const uint8_t *p = line + (size_t)t->first[x] * 3;
            __m256i acc = taps_of_two_rows(p, p + stride, t->pairs + (size_t)x * halves, t->size[x], bias);
            store_two(acc, shift, o + (size_t)x * 3, o + dst_stride + (size_t)x * 3);
        }
    }
    if (y < rows) resize_rows(src + (size_t)y * stride, stride, rows - y, t, out_w, dst + (size_t)y * dst_stride, dst_stride);
}

/* One group's three registers for two rows (one in each 128-bit lane), `pairs` pairs of
 * taps, shifted; channels 0-11 in bytes 0-11 of each lane. */
__attribute__((target("avx2"))) static inline __m256i group_of_two_rows(
    const uint8_t *row0, const uint8_t *row1, const int32_t *base, const uint8_t *lanes,
    const int pairs, __m256i bias, __m128i shift) {
    __m256i acc[3];
    for (int r = 0; r < 3; r++) {
        __m256i px = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row0 + base[r]))),
            _mm_loadu_si128((const __m128i *)(row1 + base[r])), 1);
        __m256i a = bias;
        for (int q = 0; q < pairs; q++, lanes += 2 * LANE) {
            __m256i taps = _mm256_shuffle_epi8(px, _mm256_loadu_si256((const __m256i *)lanes));
            a = _mm256_add_epi32(a, _mm256_madd_epi16(taps, _mm256_loadu_si256((const __m256i *)(lanes + LANE))));
        }
        acc[r] = _mm256_sra_epi32(a, shift);
    }
    return _mm256_packus_epi16(_mm256_packs_epi32(acc[0], acc[1]), _mm256_packs_epi32(acc[2], acc[2]));
}

/* resize_rows_avx2 by groups of four outputs (make_groups' tables), two rows at a time, for
 * `t->groups` groups with `pairs` pairs of taps; each group's 12 bytes are stored as 16 (the
 * next group's first four, overwritten after), the last one's as 12. */
__attribute__((target("avx2"))) static inline void resize_groups(const uint8_t *src, size_t stride,
                                                                int rows, const Taps *t, const int pairs,
                                                                uint8_t *dst, size_t dst_stride) {
    const __m256i bias = _mm256_set1_epi32(t->precision > 0 ? 1 << (t->precision - 1) : 0);
    const __m128i shift = _mm_cvtsi32_si128(t->precision);
    const size_t lanes_a_group = (size_t)3 * pairs * 2 * LANE;
    for (int y = 0; y + 1 < rows; y += 2) {
        const uint8_t *row0 = src + (size_t)y * stride, *row1 = row0 + stride;
        uint8_t *o0 = dst + (size_t)y * dst_stride, *o1 = o0 + dst_stride;
        int g = 0;
        for (; g + 1 < t->groups; g++) {
            __m256i v = group_of_two_rows(row0, row1, t->group_base + 3 * g,
                                          t->group_lanes + g * lanes_a_group, pairs, bias, shift);
            _mm_storeu_si128((__m128i *)(o0 + 12 * g), _mm256_castsi256_si128(v));
            _mm_storeu_si128((__m128i *)(o1 + 12 * g), _mm256_extracti128_si256(v, 1));
        }
        __m256i v = group_of_two_rows(row0, row1, t->group_base + 3 * g,
                                      t->group_lanes + g * lanes_a_group, pairs, bias, shift);
        uint8_t last[32];
        _mm256_storeu_si256((__m256i *)last, v);
        memcpy(o0 + 12 * g, last, 12);
        memcpy(o1 + 12 * g, last + 16, 12);
    }
}

/* The grouped horizontal pass: the groups' outputs, then the last out_w % GROUP outputs and
 * an odd last row by resize_rows_avx2. */
__attribute__((target("avx2"))) static void resize_rows_grouped(const uint8_t *src, size_t stride,
                                                               int rows, const Taps *t, int out_w,
                                                               uint8_t *dst, size_t dst_stride) {
    switch (t->group_pairs) { /* a constant count of pairs, so that the loop unrolls */
    case 1: resize_groups(src, stride, rows, t, 1, dst, dst_stride); break;
    case 2: resize_groups(src, stride, rows, t, 2, dst, dst_stride); break;
    default: resize_groups(src, stride, rows, t, 3, dst, dst_stride); break;
    }
    const int done = t->groups * GROUP, halves = (t->taps + 1) / 2;
    if (done < out_w) {
        Taps rest = *t;
        rest.first += done;
        rest.size += done;
        rest.pairs += (size_t)done * halves;
        rest.weights += (size_t)done * t->taps;
        resize_rows_avx2(src, stride, rows & ~1, &rest, out_w - done, dst + (size_t)done * 3, dst_stride);
    }
    if (rows & 1)
        resize_rows_avx2(src + (size_t)(rows - 1) * stride, stride, 1, t, out_w,
                         dst + (size_t)(rows - 1) * dst_stride, dst_stride);
}

/* resize_columns with AVX2: 32 bytes of a row at a time, two taps per _mm256_madd_epi16 (the
 * unpacks and packs stay within each 128-bit lane, so the bytes come out in order). */
__attribute__((target("avx2"))) static void resize_columns_avx2(const uint8_t *src, size_t stride,
                                                               size_t n, const Taps *t, int out_h,
                                                               uint8_t *dst, size_t dst_stride,
                                                               int32_t *acc) {
    const __m256i bias = _mm256_set1_epi32(t->precision > 0 ? 1 << (t->precision - 1) : 0);
    const __m256i zero = _mm256_setzero_si256();
    const __m128i shift = _mm_cvtsi32_si128(t->precision);
    const size_t wide = n / 32 * 32;
    for (int y = 0; y < out_h; y++) {
        const int16_t *k = t->weights + (size_t)y * t->taps;
        const uint8_t *rows = src + (size_t)t->first[y] * stride;
        const int size = t->size[y];
        uint8_t *o = dst + (size_t)y * dst_stride;
        for (size_t i = 0; i < wide; i += 32) {
            __m256i s0 = bias, s1 = bias, s2 = bias, s3 = bias;
            for (int j = 0; j < size; j += 2) {
                __m256i a = _mm256_loadu_si256((const __m256i *)(rows + (size_t)j * stride + i));
                __m256i b = j + 1 < size
                                ? _mm256_loadu_si256((const __m256i *)(rows + (size_t)(j + 1) * stride + i))
                                : zero;
                __m256i kk = _mm256_set1_epi32(pair(k[j], j + 1 < size ? k[j + 1] : 0));
                __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
                s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), kk));
                s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), kk));
                s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), kk));
                s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), kk));
            }
            s0 = _mm256_sra_epi32(s0, shift);
            s1 = _mm256_sra_epi32(s1, shift);
            s2 = _mm256_sra_epi32(s2, shift);
            s3 = _mm256_sra_epi32(s3, shift);
            __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
            _mm256_storeu_si256((__m256i *)(o + i), packed);
        }
        if (wide < n) { /* the last bytes of the row, in plain C */
            Taps one_row = *t;
            one_row.first = t->first + y;
            one_row.size = t->size + y;
            one_row.weights = t->weights + (size_t)y * t->taps;
            resize_columns(src + wide, stride, n - wide, &one_row, 1, o + wide, dst_stride, acc);
        }
    }
}
#endif

/* The resize's instructions: 0 plain C, 1 AVX2 an output pixel at a time, 2 AVX2 by groups
 * of four outputs where make_groups takes the taps; the best the CPU has, at import. */
static int use_simd = 0;

static int best_simd(void) {
#ifdef HAVE_AVX2
    if (__builtin_cpu_supports("avx2")) return 2;
#endif
    return 0;
}

static void flip_rows(uint8_t *dst, size_t dst_stride, int rows, int width) {
    for (int y = 0; y < rows; y++) {
        uint8_t *a = dst + (size_t)y * dst_stride, *b = a + (size_t)(width - 1) * 3;
        for (; a < b; a += 3, b -= 3)
            for (int c = 0; c < 3; c++) {
                uint8_t v = a[c];
                a[c] = b[c];
                b[c] = v;
            }
    }
}

/* HWC rows (`stride` bytes apart) into the three planes of a CHW output, mirrored if asked. */
static void to_planes(const uint8_t *src, size_t stride, int rows, int width, int flip,
                      uint8_t *out) {
    size_t plane = (size_t)rows * width;
    for (int y = 0; y < rows; y++) {
        const uint8_t *line = src + (size_t)y * stride;
        uint8_t *r = out + (size_t)y * width, *g = r + plane, *b = g + plane;
        if (flip) {
            for (int x = 0; x < width; x++) {
                const uint8_t *px = line + (size_t)(width - 1 - x) * 3;
                r[x] = px[0], g[x] = px[1], b[x] = px[2];
            }
        } else {
            for (int x = 0; x < width; x++) {
                const uint8_t *px = line + (size_t)x * 3;
                r[x] = px[0], g[x] = px[1], b[x] = px[2];
            }
        }
    }
}

static void resize_across(const uint8_t *src, size_t stride, int rows, const Taps *t, int out_w,
                          uint8_t *dst, size_t dst_stride) {
#ifdef HAVE_AVX2
    if (use_simd >= 2 && t->groups) {
        resize_rows_grouped(src, stride, rows, t, out_w, dst, dst_stride);
        return;
    }
    if (use_simd) {
        resize_rows_avx2(src, stride, rows, t, out_w, dst, dst_stride);
        return;
    }
#endif
    resize_rows(src, stride, rows, t, out_w, dst, dst_stride);
}

static void resize_down(const uint8_t *src, size_t stride, size_t n, const Taps *t, int out_h,
                        uint8_t *dst, size_t dst_stride, int32_t *acc) {
#ifdef HAVE_AVX2
    if (use_simd) {
        resize_columns_avx2(src, stride, n, t, out_h, dst, dst_stride, acc);
        return;
    }
#endif
    resize_columns(src, stride, n, t, out_h, dst, dst_stride, acc);
}

/* --- one thread's slice ------------------------------------------------------------------ */

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} Errors;

static void on_error(j_common_ptr cinfo) { longjmp(((Errors *)cinfo->err)->jump, 1); }

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) longjmp(((Errors *)cinfo->err)->jump, 1); /* a warning: as an error */
}

static void on_progress(j_common_ptr cinfo) {
    if (cinfo->is_decompressor && ((j_decompress_ptr)cinfo)->input_scan_number > MAX_SCANS)
        longjmp(((Errors *)cinfo->err)->jump, 1);
}

/* Whether baseline scans decode through huffman.c instead of libjpeg's Huffman decoder. */
static int use_huffman = 1;

/* Buffers one thread reuses across its samples (grown, never shrunk). */
typedef struct {
    uint8_t *pixels; /* the decoded rows of the box's columns */
    size_t pixels_n;
    uint8_t *box; /* a padded box, or the horizontally resized rows */
    size_t box_n;
    int32_t *acc;
    size_t acc_n;
    uint8_t *rows; /* the resized HWC rows, before they are split into planes */
    size_t rows_n;
    uint8_t *part; /* restart_part()'s smaller JPEG */
    size_t part_n;
    size_t *ends; /* where each restart interval's data ends */
    size_t ends_n;
    Huffman *huffman; /* verified bytes' entropy decoder, made on first use */
} Scratch;

/* Each thread's Scratch outlives its calls, so that a thread decoding one image a call
 * (the converter, verified full decodes) neither maps fresh buffers nor derives the Huffman
 * tables again each time. Buffers over KEEP_BYTES are freed when a call ends, so a thread
 * holds at most a few megabytes after a large image. */
enum { KEEP_BYTES = 4 << 20 };

static pthread_key_t scratch_key;
static int scratch_key_ok;

static void free_buffers(Scratch *s, size_t over) {
    void **buffers[] = {(void **)&s->pixels, (void **)&s->box, (void **)&s->acc,
                        (void **)&s->rows,   (void **)&s->part, (void **)&s->ends};
    size_t *sizes[] = {&s->pixels_n, &s->box_n, &s->acc_n, &s->rows_n, &s->part_n, &s->ends_n};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (*sizes[i] > over) {
            free(*buffers[i]);
            *buffers[i] = NULL;
            *sizes[i] = 0;
        }
}

static void free_scratch(void *p) {
    Scratch *s = p;
    free_buffers(s, 0);
    free(s->huffman);
    free(s);
}

/* This thread's Scratch; NULL when out of memory. Not inlined: a call before setjmp. */
static __attribute__((noinline)) Scratch *thread_scratch(void) {
    if (!scratch_key_ok) return NULL;
    Scratch *s = pthread_getspecific(scratch_key);
    if (s == NULL && (s = calloc(1, sizeof *s)) != NULL && pthread_setspecific(scratch_key, s) != 0) {
        free(s);
        s = NULL;
    }
    return s;
}

static int grow(void **buffer, size_t *have, size_t need) {
    need += SLACK;
    if (*have >= need) return 1;
    void *grown = realloc(*buffer, need);
    if (grown == NULL) return 0;
    *buffer = grown;
    *have = need;
    return 1;
}

typedef struct {
    int64_t top, left, height, width, flip;
} Box;

static int64_t ceil_div(int64_t v, int d) { return (v + d - 1) / d; }

/* --- restart intervals: the part of a JPEG that a box needs ----------------------------- */

/* A sequential JPEG's one interleaved scan, cut by restart markers every `interval` MCUs. */
typedef struct {
    size_t frame;   /* the SOF marker's offset */
    size_t entropy; /* the first byte of the entropy-coded data */
    int64_t width, height;
    int mcu_w, mcu_h;      /* an MCU's pixels */
    int64_t columns, rows; /* MCUs per row, MCU rows */
    int64_t interval;
} Restarts;

/* Whether `b` is an 8-bit baseline or extended sequential JPEG of one scan with a restart
 * interval that divides its MCU rows (each row then starts an interval), and where. */
static int read_restarts(Bytes b, Restarts *r) {
    const uint8_t *d = b.data;
    size_t n = b.size, i = 2;
    int components = 0, h_max = 1, v_max = 1, found_frame = 0;
    memset(r, 0, sizeof *r);
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    while (i + 4 <= n && d[i] == 0xFF) {
        unsigned marker = d[i + 1];
        if (marker == 0xFF) {
            i++;
            continue;
        }
        if (has_no_length(marker)) return 0;
        size_t length = be16(d + i + 2);
        if (length < 2 || length > n - i - 2) return 0;
        const uint8_t *p = d + i + 4;
        size_t k = length - 2;
        if (is_frame(marker)) {
            if (found_frame || (marker != 0xC0 && marker != 0xC1) || k < 6 || p[0] != 8) return 0;
            components = p[5];
            if ((components != 1 && components != 3) || k < 6 + 3 * (size_t)components) return 0;
            r->height = be16(p + 1);
            r->width = be16(p + 3);
            for (int c = 0; c < components; c++) {
                int h = p[7 + 3 * c] >> 4, v = p[7 + 3 * c] & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4) return 0;
                if (h > h_max) h_max = h;
                if (v > v_max) v_max = v;
            }
            r->frame = i;
            found_frame = 1;
        } else if (marker == 0xDD) {
            if (k < 2) return 0;
            r->interval = be16(p);
        } else if (marker == 0xDA) {
            if (!found_frame || k < 1 || p[0] != components || r->interval == 0 || r->width == 0 ||
                r->height == 0)
                return 0;
            r->entropy = i + 2 + length;
            r->mcu_w = components == 1 ? 8 : 8 * h_max; /* one component: an MCU is a block */
            r->mcu_h = components == 1 ? 8 : 8 * v_max;
            r->columns = ceil_div(r->width, r->mcu_w);
            r->rows = ceil_div(r->height, r->mcu_h);
            return r->columns % r->interval == 0;
        }
        i += 2 + length;
    }
    return 0;
}

/* The restart intervals the box needs, as a smaller JPEG in `part`: the header with its frame
 * resized, then the intervals of the MCU rows and columns around the box, renumbered. Every
 * interval restarts the DC predictions, so the part decodes to the file's own pixels except
 * within a pixel of its cut edges, where fancy upsampling lacks the neighbours; the box keeps
 * 2 pixels from them. The entropy decode, the most of a small JPEG's decode, then covers the
 * box's neighbourhood instead of every row above the box's end. `box`, `height` and `width`
 * become the part's. 1: done; 0: no smaller part (or the markers do not sit where the
 * interval says: decode the file); -1: out of memory. */
static int restart_part(Bytes b, const Restarts *r, Box *box, int64_t *height, int64_t *width,
                        Scratch *s, Bytes *part) {
    const int64_t margin = 2, every = r->interval;
    int64_t right = box->left + box->width + margin, bottom = box->top + box->height + margin;
    int64_t c0 = (box->left > margin ? box->left - margin : 0) / r->mcu_w / every * every;
    int64_t c1 = ceil_div(ceil_div(right < r->width ? right : r->width, r->mcu_w), (int)every) * every;
    int64_t r0 = (box->top > margin ? box->top - margin : 0) / r->mcu_h;
    int64_t r1 = ceil_div(bottom < r->height ? bottom : r->height, r->mcu_h);
    if (c1 > r->columns) c1 = r->columns;
    /* Two MCUs at least each way: libjpeg upsamples a component of 2 samples or fewer (a
     * partial last MCU) without its fancy filter. */
    while (c1 - c0 < 2 && c1 < r->columns) c1 += every;
    while (c1 - c0 < 2 && c0 > 0) c0 -= every;
    while (r1 - r0 < 2 && r1 < r->rows) r1++;
    while (r1 - r0 < 2 && r0 > 0) r0--;
    if (c0 == 0 && c1 == r->columns && r0 == 0) return 0;
    /* Interval k holds MCUs [k * every, (k + 1) * every) in raster order. */
    int64_t total = r->rows * r->columns / every, last = ((r1 - 1) * r->columns + c1) / every - 1;
    if (!grow((void **)&s->ends, &s->ends_n, (size_t)(last + 1) * sizeof(size_t))) return -1;
    const uint8_t *d = b.data;
    size_t n = b.size, i = r->entropy;
    for (int64_t k = 0; k <= last;) {
        const uint8_t *ff = i < n ? memchr(d + i, 0xFF, n - i) : NULL;
        if (ff == NULL || (size_t)(ff - d) + 1 >= n) return 0;
        size_t at = (size_t)(ff - d);
        unsigned next = d[at + 1];
        if (next == 0x00 || next == 0xFF) { /* a stuffed 0xFF, or fill before a marker */
            i = at + (next == 0x00 ? 2 : 1);
            continue;
        }
        int restart = next >= 0xD0 && next <= 0xD7 && (int64_t)(next - 0xD0) == (k & 7);
        if (!restart && !(next == 0xD9 && k == total - 1)) return 0;
        s->ends[k++] = at;
        i = at + 2;
    }
    int64_t per_row = (c1 - c0) / every, part_rows = r1 - r0;
    size_t need = r->entropy + 2;
    for (int64_t y = r0; y < r1; y++) {
        int64_t from = (y * r->columns + c0) / every;
        size_t start = from == 0 ? r->entropy : s->ends[from - 1] + 2;
        need += s->ends[from + per_row - 1] - start + 2 * (size_t)per_row;
    }
    if (!grow((void **)&s->part, &s->part_n, need)) return -1;
    uint8_t *o = s->part;
    memcpy(o, d, r->entropy);
    int64_t part_h = (r1 * r->mcu_h < r->height ? r1 * r->mcu_h : r->height) - r0 * r->mcu_h;
    int64_t part_w = (c1 * r->mcu_w < r->width ? c1 * r->mcu_w : r->width) - c0 * r->mcu_w;
    uint8_t *size = o + r->frame + 5; /* the frame's height, then width */
    size[0] = (uint8_t)(part_h >> 8), size[1] = (uint8_t)part_h;
    size[2] = (uint8_t)(part_w >> 8), size[3] = (uint8_t)part_w;
    o += r->entropy;
    int64_t written = 0;
    for (int64_t y = r0; y < r1; y++) {
        for (int64_t k = (y * r->columns + c0) / every, end = k + per_row; k < end; k++) {
            size_t start = k == 0 ? r->entropy : s->ends[k - 1] + 2;
            memcpy(o, d + start, s->ends[k] - start);
            o += s->ends[k] - start;
            if (++written < per_row * part_rows) *o++ = 0xFF, *o++ = (uint8_t)(0xD0 + ((written - 1) & 7));
        }
    }
    *o++ = 0xFF, *o++ = 0xD9;
    part->data = s->part;
    part->size = (size_t)(o - s->part);
    box->top -= r0 * r->mcu_h;
    box->left -= c0 * r->mcu_w;
    *height = part_h;
    *width = part_w;
    return 1;
}

/* Resize (or copy) the box in `src` (`down.in` x `across.in` pixels, rows `stride` apart)
 * into the row `out`. */
/* The box's pixels `src` resized (where a span is not a plain copy) and mirrored (if asked)
 * into `out`: HWC rows, or with `planar` the three planes of a CHW row. */
static int place(const uint8_t *src, size_t stride, Span down_span, Span across_span, int flip,
                 int planar, uint8_t *out, int out_h, int out_w, Scratch *s) {
    size_t out_stride = (size_t)out_w * 3;
    int bh = down_span.in, bw = across_span.in;
    int across_n = !is_copy(across_span, out_w), down_n = !is_copy(down_span, out_h);
    if (!across_n && !down_n) {
        if (planar) {
            to_planes(src, stride, bh, bw, flip, out);
            return 1;
        }
        for (int y = 0; y < bh; y++) {
            const uint8_t *line = src + (size_t)y * stride;
            uint8_t *o = out + (size_t)y * out_stride;
            if (!flip) memcpy(o, line, out_stride);
            else
                for (int x = 0; x < bw; x++) memcpy(o + (size_t)(bw - 1 - x) * 3, line + (size_t)x * 3, 3);
        }
        return 1;
    }
    uint8_t *dst = out; /* the resized HWC rows */
    if (planar) {
        if (!grow((void **)&s->rows, &s->rows_n, (size_t)out_h * out_stride + SLACK)) return 0;
        dst = s->rows;
    }
    Taps across = {0}, down = {0};
    int ok = 1;
    if (across_n) ok = make_taps(&across, across_span, out_w) && (use_simd < 2 || make_groups(&across, out_w));
    if (ok && down_n) ok = make_taps(&down, down_span, out_h);
    if (ok && across_n && down_n) {
        ok = grow((void **)&s->box, &s->box_n, (size_t)bh * out_stride) &&
             grow((void **)&s->acc, &s->acc_n, out_stride * sizeof(int32_t));
        if (ok) {
            resize_across(src, stride, bh, &across, out_w, s->box, out_stride);
            resize_down(s->box, out_stride, out_stride, &down, out_h, dst, out_stride, s->acc);
        }
    } else if (ok && across_n) {
        resize_across(src, stride, bh, &across, out_w, dst, out_stride);
    } else if (ok) {
        ok = grow((void **)&s->acc, &s->acc_n, out_stride * sizeof(int32_t));
        if (ok) resize_down(src, stride, out_stride, &down, out_h, dst, out_stride, s->acc);
    }
    if (ok && planar) to_planes(dst, out_stride, out_h, out_w, flip, out);
    else if (ok && flip) flip_rows(out, out_stride, out_h, out_w);
    if (across_n) free_taps(&across);
    if (down_n) free_taps(&down);
    return ok;
}

/* Decode, crop, resize and store one sample; a CROP_* status. `cinfo` is ready for reuse
 * afterwards whatever happened (jpeg_abort_decompress). */
static int crop_bytes(j_decompress_ptr cinfo, Errors *errors, Bytes b, Box box, uint8_t *out,
                    int out_h, int out_w, int64_t want_h, int64_t want_w, int dct, int verified,
                    int planar, Scratch *s) {
    /* Everything changed after setjmp and read after a longjmp lives in `s` or is volatile. */
    volatile int status = CROP_LIBJPEG;
    if (setjmp(errors->jump)) {
        jpeg_abort_decompress(cinfo);
        return status;
    }
    jpeg_mem_src(cinfo, b.data, (unsigned long)b.size);
    jpeg_read_header(cinfo, TRUE);
    if ((int64_t)cinfo->image_width != want_w || (int64_t)cinfo->image_height != want_h ||
        (cinfo->num_components != 1 && cinfo->num_components != 3) ||
        cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
        jpeg_abort_decompress(cinfo);
        return CROP_UNSUPPORTED;
    }
    int64_t img_h = cinfo->image_height, img_w = cinfo->image_width;
    int inside = box.top >= 0 && box.left >= 0 && box.top + box.height <= img_h &&
                 box.left + box.width <= img_w;
    int d = inside ? dct : 1; /* a box reaching outside the image is padded at full size */
    cinfo->out_color_space = JCS_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned)d;
    jpeg_start_decompress(cinfo);
    cinfo->client_data = NULL; /* huffman.c's state while it decodes this scan */
    if (use_huffman) { /* out of memory, or a scan it does not take: libjpeg's */
        if (s->huffman == NULL) s->huffman = calloc(1, sizeof *s->huffman);
        if (s->huffman != NULL) huffman_install(cinfo, s->huffman);
    }
    int64_t H = cinfo->output_height, W = cinfo->output_width;
    int64_t top = box.top, left = box.left, bh = box.height, bw = box.width;
    Span down = {(int)bh, 0.0, (double)bh}, across = {(int)bw, 0.0, (double)bw};
    if (d > 1) { /* the scaled pixels the box touches, and where in them its edges lie */
        int64_t bottom = ceil_div(box.top + box.height, d), right = ceil_div(box.left + box.width, d);
        top = box.top / d;
        left = box.left / d;
        if (bottom > H) bottom = H;
        if (right > W) right = W;
        bh = bottom - top;
        bw = right - left;
        down = (Span){(int)bh, (double)box.top / d - (double)top, (double)box.height / d};
        across = (Span){(int)bw, (double)box.left / d - (double)left, (double)box.width / d};
    }
    /* The part of the box inside the image: rows [y0, y1), columns [x0, x1). */
    int64_t y0 = top > 0 ? top : 0, y1 = top + bh < H ? top + bh : H;
    int64_t x0 = left > 0 ? left : 0, x1 = left + bw < W ? left + bw : W;
    int any = y1 > y0 && x1 > x0;
    /* Decode one pixel more on each side, so fancy upsampling sees the full decode's, and
     * at least two iMCU columns (16 pixels): libjpeg upsamples a component of 2 columns or
     * fewer without its fancy filter, which would change the whole crop. */
    JDIMENSION xoff = 0, xwidth = (JDIMENSION)W;
    if (any) {
        int64_t from = x0 > 0 ? x0 - 1 : 0, to = x1 < W ? x1 + 1 : W;
        int64_t least = 2 * (int64_t)cinfo->max_h_samp_factor * cinfo->min_DCT_scaled_size;
        if (least < 16) least = 16;
        if (to - from < least) to = from + least < W ? from + least : W;
        if (to - from < least) from = to - least > 0 ? to - least : 0;
        xoff = (JDIMENSION)from;
        xwidth = (JDIMENSION)(to - from);
        if (xwidth < (JDIMENSION)W) jpeg_crop_scanline(cinfo, &xoff, &xwidth);
        else xoff = 0, xwidth = (JDIMENSION)W;
    }
    size_t line = (size_t)xwidth * 3;
    int64_t imcu = (int64_t)cinfo->max_v_samp_factor * cinfo->min_DCT_scaled_size;
    int64_t first = any ? ((y0 > 0 ? y0 - 1 : 0) / imcu) * imcu : 0; /* an iMCU row's start */
    int64_t last = any ? y1 : 0;
    if (!grow((void **)&s->pixels, &s->pixels_n, (size_t)(last - first > 0 ? last - first : 1) * line)) {
        status = CROP_MEMORY;
        longjmp(errors->jump, 1);
    }
    if (first > 0) jpeg_skip_scanlines(cinfo, (JDIMENSION)first);
    while ((int64_t)cinfo->output_scanline < last) {
        JSAMPROW row = s->pixels + (size_t)((int64_t)cinfo->output_scanline - first) * line;
        jpeg_read_scanlines(cinfo, &row, 1);
    }
    if (verified) { /* bytes known to decode cleanly: nothing after the box is needed */
        jpeg_abort_decompress(cinfo);
    } else { /* the rest of the entropy-coded data, without IDCT: the full decode's warnings */
        int64_t left_rows = H - (int64_t)cinfo->output_scanline;
        if (left_rows > 1) jpeg_skip_scanlines(cinfo, (JDIMENSION)(left_rows - 1));
        if ((int64_t)cinfo->output_scanline < H) {
            if (!grow((void **)&s->box, &s->box_n, line)) {
                status = CROP_MEMORY;
                longjmp(errors->jump, 1);
            }
            JSAMPROW row = s->box;
            jpeg_read_scanlines(cinfo, &row, 1);
        }
        if (cinfo->client_data != NULL) huffman_finish(cinfo, cinfo->client_data);
        jpeg_finish_decompress(cinfo);
    }
    /* Now the pixels: the box straight from the decoded rows, or zero-padded first. */
    status = CROP_MEMORY;
    const uint8_t *src;
    size_t stride;
    if (any && y0 == top && y1 == top + bh && x0 == left && x1 == left + bw) {
        src = s->pixels + (size_t)(top - first) * line + (size_t)(left - (int64_t)xoff) * 3;
        stride = line;
        if (!place(src, stride, down, across, (int)box.flip, planar, out, out_h, out_w, s))
            return CROP_MEMORY;
        return CROP_OK;
    }
    size_t padded_line = (size_t)bw * 3, padded_n = (size_t)bh * padded_line;
    uint8_t *padded = malloc(padded_n + SLACK);
    if (padded == NULL) return CROP_MEMORY;
    memset(padded, 0, padded_n);
    for (int64_t y = y0; any && y < y1; y++)
        memcpy(padded + (size_t)(y - top) * padded_line + (size_t)(x0 - left) * 3,
               s->pixels + (size_t)(y - first) * line + (size_t)(x0 - (int64_t)xoff) * 3,
               (size_t)(x1 - x0) * 3);
    int ok = place(padded, padded_line, down, across, (int)box.flip, planar, out, out_h, out_w, s);
    free(padded);
    return ok ? CROP_OK : CROP_MEMORY;
}

/* crop_bytes(), of only the restart intervals around the box where the bytes are verified
 * and cut by restart markers. */
static int crop_one(j_decompress_ptr cinfo, Errors *errors, Bytes b, Box box, uint8_t *out,
                    int out_h, int out_w, int64_t want_h, int64_t want_w, int dct, int verified,
                    int planar, Scratch *s) {
    Restarts restarts = {0};
    Bytes part;
    if (verified && box.top >= 0 && box.left >= 0 && box.top + box.height <= want_h &&
        box.left + box.width <= want_w && read_restarts(b, &restarts) && restarts.width == want_w &&
        restarts.height == want_h) {
        int cut = restart_part(b, &restarts, &box, &want_h, &want_w, s, &part);
        if (cut < 0) return CROP_MEMORY;
        if (cut) b = part;
    }
    return crop_bytes(cinfo, errors, b, box, out, out_h, out_w, want_h, want_w, dct, verified,
                      planar, s);
}

static PyObject *crop(PyObject *self, PyObject *args) {
    PyObject *values, *rows_obj, *boxes_obj, *out_obj, *status_obj, *sizes_obj, *next_obj = Py_None;
    PyObject *dct_obj = Py_None;
    int out_h, out_w, verified = 0, planar = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!OOOOOii|OppO", &PyList_Type, &values, &rows_obj, &boxes_obj,
                          &sizes_obj, &out_obj, &status_obj, &out_h, &out_w, &dct_obj, &verified,
                          &planar, &next_obj))
        return NULL;
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
        const int64_t *boxes = boxes_v.buf, *sizes = sizes_v.buf;
        uint8_t *out = out_v.buf;
        int32_t *status = status_v.buf;
        size_t row_bytes = (size_t)out_h * out_w * 3;
        Py_BEGIN_ALLOW_THREADS;
        struct jpeg_decompress_struct cinfo;
        struct jpeg_progress_mgr progress;
        Errors errors;
        Scratch *const scratch = thread_scratch();
        cinfo.err = jpeg_std_error(&errors.pub);
        errors.pub.error_exit = on_error;
        errors.pub.emit_message = on_message;
        progress.progress_monitor = on_progress;
        if (scratch != NULL && setjmp(errors.jump) == 0) {
            jpeg_create_decompress(&cinfo);
            cinfo.progress = &progress;
            for (;;) { /* calls sharing `next` take the rows one at a time, in order */
                Py_ssize_t k = (Py_ssize_t)__atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
                if (k >= m) break;
                int64_t row = rows[k];
                const int64_t *bx = boxes + row * 5;
                Box box = {bx[0], bx[1], bx[2], bx[3], bx[4]};
                status[row] = box.height > 0 && box.width > 0
                                  ? crop_one(&cinfo, &errors, bytes[k], box, out + row * row_bytes, out_h,
                                             out_w, sizes[row * 2], sizes[row * 2 + 1],
                                             dcts != NULL ? (int)dcts[row] : 1,
                                             verified, planar, scratch)
                                  : CROP_UNSUPPORTED;
            }
            jpeg_destroy_decompress(&cinfo);
        } else { /* no scratch, or jpeg_create_decompress failed: the rows left, not decoded */
            for (Py_ssize_t k; (k = (Py_ssize_t)__atomic_fetch_add(next, 1, __ATOMIC_RELAXED)) < m;)
                status[rows[k]] = CROP_MEMORY;
        }
        if (scratch != NULL) free_buffers(scratch, KEEP_BYTES);
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

/* --- the converter's encoder ---------------------------------------------------------- */

/* RGB rows as a baseline 4:2:0 JPEG in `*jpeg` (malloc'd by jpeg_mem_dest, the caller frees
 * it), with a restart marker every `restart` MCUs (0: none). tjCompress2's settings, so
 * that without restarts the bytes are TurboJPEG's: its fast forward DCT below quality 96. */
static int compress(const uint8_t *pixels, int height, int width, int quality, int restart,
                    unsigned char **jpeg, unsigned long *size) {
    struct jpeg_compress_struct cinfo;
    Errors errors;
    cinfo.err = jpeg_std_error(&errors.pub);
    errors.pub.error_exit = on_error;
    errors.pub.emit_message = on_message;
    if (setjmp(errors.jump)) {
        jpeg_destroy_compress(&cinfo);
        return 0;
    }
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, jpeg, size);
    cinfo.image_width = (JDIMENSION)width;
    cinfo.image_height = (JDIMENSION)height;
    cinfo.input_components = 3;
    cinfo.in_color_space = JCS_RGB;
    jpeg_set_defaults(&cinfo); /* YCbCr, luma sampled 2x2: 4:2:0 */
    jpeg_set_quality(&cinfo, quality, TRUE);
    cinfo.dct_method = quality >= 96 ? JDCT_ISLOW : JDCT_FASTEST;
    cinfo.restart_interval = (unsigned)restart;
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)cinfo.next_scanline * (size_t)width * 3);
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    return 1;
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

/* For the tests: a resize with fewer instructions than the CPU has (all give the same pixels). */
static PyObject *set_simd(PyObject *self, PyObject *arg) {
    (void)self;
    long want = PyLong_AsLong(arg);
    if (want == -1 && PyErr_Occurred()) return NULL;
    int before = use_simd, best = best_simd();
    use_simd = want < 0 ? 0 : want > best ? best : (int)want;
    return PyLong_FromLong(before);
}

/* For the tests and benchmarks: libjpeg's own Huffman decoder for verified bytes too. */
static PyObject *set_huffman(PyObject *self, PyObject *arg) {
    (void)self;
    int want = PyObject_IsTrue(arg);
    if (want < 0) return NULL;
    int before = use_huffman;
    use_huffman = want;
    return PyBool_FromLong(before);
}

static PyMethodDef methods[] = {
    {"set_huffman", set_huffman, METH_O,
     "set_huffman(on) -> bool: whether verified bytes decode their Huffman codes through "
     "the kernel's own decoder (huffman.c, the default) or libjpeg's; returns the previous "
     "setting. Both give the same pixels (the tests check)."},
    {"set_simd", set_simd, METH_O,
     "set_simd(level) -> int: the resize's instructions from now on, 0 plain C, 1 AVX2, 2 AVX2 "
     "by groups of four outputs (at most what the CPU has); returns the previous level. All "
     "give the same pixels (the tests check)."},
    {"headers", headers, METH_VARARGS,
     "headers(values, out): int64 [n, 9] (parsed, width, height, orientation, frame marker, "
     "precision, components, complete, taken) from each value's JPEG markers; zeros for a value "
     "that is not bytes-like or whose markers do not parse."},
    {"crop", crop, METH_VARARGS,
     "crop(values, rows, boxes, sizes, out, status, out_h, out_w[, dct[, verified[, planar[, next]]]]): "
     "decode, crop, resize and mirror values[row] into out[row] for each row, the GIL "
     "released; status[row] 0 or the reason to decode it another way. dct: int64 [n], each "
     "row's IDCT scale denominator (1, 2, 4, 8) for a box inside the image; None (default): "
     "1. verified: stop decoding after the box. planar: "
     "out is [n, 3, out_h, out_w] instead of [n, out_h, out_w, 3]. next: an int64 [1] "
     "(from 0) that calls on other threads share, each taking the next of rows by an "
     "atomic increment."},
    {"encode", encode, METH_VARARGS,
     "encode(pixels, height, width, quality, restart) -> bytes: uint8 RGB rows as a baseline "
     "4:2:0 JPEG, the GIL released, with TurboJPEG's settings (so that restart=0 gives "
     "tjCompress2's bytes) and a restart marker every `restart` MCUs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "jpegcrop", "The compiled JPEG crop kernel (see readers.images.kernel).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_jpegcrop(void) {
#ifdef HAVE_AVX2
    __builtin_cpu_init();
#endif
    use_simd = best_simd();
    if (!scratch_key_ok) scratch_key_ok = pthread_key_create(&scratch_key, free_scratch) == 0;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "HEADER_FIELDS", HEADER_FIELDS) < 0 ||
        PyModule_AddIntConstant(m, "SIMD", use_simd) < 0 ||
        PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
