/* The resize in plain C: torch's integer arithmetic, the reference every SIMD pass equals. */
#ifndef IMGPACK_RESIZE_SCALAR_H
#define IMGPACK_RESIZE_SCALAR_H

#include <stddef.h>
#include <stdint.h>

#include "taps.h"

/* Rows of `src` (`stride` bytes apart, RGB pixels) resized horizontally into `dst` (out_w
 * pixels a row, rows `dst_stride` apart). */
void resize_rows(const uint8_t *src, size_t stride, int rows, const Taps *t, int out_w,
                 uint8_t *dst, size_t dst_stride);

/* Columns resized: output row y of `dst` from rows t->first[y]... of `src` (`n` bytes a row,
 * `stride` apart); `acc` holds n int32. */
void resize_columns(const uint8_t *src, size_t stride, size_t n, const Taps *t, int out_h,
                    uint8_t *dst, size_t dst_stride, int32_t *acc);

#endif
