/* The resize's AVX2 passes (x86 only: HAVE_AVX2), the same integers as resize_scalar.h, so
 * the same pixels. Called only where the CPU has AVX2 (place.c asks it once, at import). */
#ifndef IMGPACK_RESIZE_AVX2_H
#define IMGPACK_RESIZE_AVX2_H

#include <stddef.h>
#include <stdint.h>

#include "taps.h"

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_AVX2 1

/* resize_rows with Pillow-SIMD's pairing of taps (as torch's AVX2 kernel), four rows at a
 * time. Reads up to 4 bytes past a row's last pixel (SLACK). */
void resize_rows_avx2(const uint8_t *src, size_t stride, int rows, const Taps *t, int out_w,
                      uint8_t *dst, size_t dst_stride);

/* resize_rows by groups of four outputs (make_groups' tables, t->groups > 0), the group
 * tail and an odd last row by resize_rows_avx2. */
void resize_rows_grouped(const uint8_t *src, size_t stride, int rows, const Taps *t,
                         int out_w, uint8_t *dst, size_t dst_stride);

/* resize_columns, 32 bytes of a row at a time. */
void resize_columns_avx2(const uint8_t *src, size_t stride, size_t n, const Taps *t,
                         int out_h, uint8_t *dst, size_t dst_stride, int32_t *acc);
#endif

#endif
