/* The resize's AVX2 passes (resize_avx2.h). */
#include "resize_avx2.h"

#ifdef HAVE_AVX2
#include <immintrin.h>
#include <string.h>

#include "resize_scalar.h"

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
__attribute__((target("avx2"))) void resize_rows_avx2(const uint8_t *src, size_t stride,
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
__attribute__((target("avx2"))) void resize_rows_grouped(const uint8_t *src, size_t stride,
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
__attribute__((target("avx2"))) void resize_columns_avx2(const uint8_t *src, size_t stride,
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
