/* The decode of a batch's rows on one thread: what crop() runs with the GIL released. */
#ifndef IMGPACK_DECODE_BOX_H
#define IMGPACK_DECODE_BOX_H

#include <stdint.h>

#include "kernel_types.h"

/* One crop() call's arrays, checked by the binding: for k < m, bytes[k] is the JPEG of the
 * batch row rows[k], whose box is boxes[row * 5...] (top, left, height, width, flip), its
 * upright size sizes[row * 2...] (height, width), its IDCT denominator dcts[row] (NULL: 1),
 * its pixels out[row] (out_h * out_w * 3 bytes) and its CROP_* status status[row]. Calls
 * on several threads given the same `next` share the rows. */
typedef struct {
    const Bytes *bytes;
    const int64_t *rows;
    int64_t m;
    const int64_t *boxes, *sizes, *dcts;
    uint8_t *out;
    int32_t *status;
    int out_h, out_w;
    int64_t *next; /* the index in `rows` of the next row to take, by an atomic increment */
} Batch;

/* Take the rows of `batch` one by one until none is left, as `o` says; every row taken gets
 * its status (CROP_MEMORY where this thread could not start). */
void crop_all(const Batch *batch, const Options *o);

#endif
