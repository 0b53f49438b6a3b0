/* The resize in plain C (resize_scalar.h). */
#include "resize_scalar.h"

static uint8_t clamp8(int32_t v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v; }

/* Rows of `src` (`stride` bytes apart, `width` RGB pixels) resized horizontally into `dst`
 * (out_w pixels a row, packed). */
void resize_rows(const uint8_t *src, size_t stride, int rows, const Taps *t, int out_w,
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
void resize_columns(const uint8_t *src, size_t stride, size_t n, const Taps *t, int out_h,
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

