/* The resize's driver (place.h). */
#include "place.h"

#include <string.h>

#include "resize_avx2.h"
#include "resize_scalar.h"
#include "taps.h"

int best_simd(void) {
#ifdef HAVE_AVX2
    __builtin_cpu_init();
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
                          uint8_t *dst, size_t dst_stride, int simd) {
    (void)simd; /* without AVX2: plain C whatever is asked */
#ifdef HAVE_AVX2
    if (simd >= 2 && t->groups) {
        resize_rows_grouped(src, stride, rows, t, out_w, dst, dst_stride);
        return;
    }
    if (simd) {
        resize_rows_avx2(src, stride, rows, t, out_w, dst, dst_stride);
        return;
    }
#endif
    resize_rows(src, stride, rows, t, out_w, dst, dst_stride);
}

static void resize_down(const uint8_t *src, size_t stride, size_t n, const Taps *t, int out_h,
                        uint8_t *dst, size_t dst_stride, int32_t *acc, int simd) {
    (void)simd;
#ifdef HAVE_AVX2
    if (simd) {
        resize_columns_avx2(src, stride, n, t, out_h, dst, dst_stride, acc);
        return;
    }
#endif
    resize_columns(src, stride, n, t, out_h, dst, dst_stride, acc);
}

int place(const uint8_t *src, size_t stride, Span down_span, Span across_span, int flip,
          int planar, int simd, uint8_t *out, int out_h, int out_w, Scratch *s) {
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
    if (across_n) ok = make_taps(&across, across_span, out_w) && (simd < 2 || make_groups(&across, out_w));
    if (ok && down_n) ok = make_taps(&down, down_span, out_h);
    if (ok && across_n && down_n) {
        ok = grow((void **)&s->box, &s->box_n, (size_t)bh * out_stride) &&
             grow((void **)&s->acc, &s->acc_n, out_stride * sizeof(int32_t));
        if (ok) {
            resize_across(src, stride, bh, &across, out_w, s->box, out_stride, simd);
            resize_down(s->box, out_stride, out_stride, &down, out_h, dst, out_stride, s->acc, simd);
        }
    } else if (ok && across_n) {
        resize_across(src, stride, bh, &across, out_w, dst, out_stride, simd);
    } else if (ok) {
        ok = grow((void **)&s->acc, &s->acc_n, out_stride * sizeof(int32_t));
        if (ok) resize_down(src, stride, out_stride, &down, out_h, dst, out_stride, s->acc, simd);
    }
    if (ok && planar) to_planes(dst, out_stride, out_h, out_w, flip, out);
    else if (ok && flip) flip_rows(out, out_stride, out_h, out_w);
    if (across_n) free_taps(&across);
    if (down_n) free_taps(&down);
    return ok;
}


int resize_image(const uint8_t *pixels, int height, int width, double extent_h,
                 double extent_w, int simd, uint8_t *out, int out_h, int out_w) {
    Scratch *s = thread_scratch();
    size_t stride = (size_t)width * 3;
    if (s == NULL || !grow((void **)&s->pixels, &s->pixels_n, (size_t)height * stride)) return 0;
    memcpy(s->pixels, pixels, (size_t)height * stride);
    const Span down = {height, 0.0, extent_h}, across = {width, 0.0, extent_w};
    int ok = place(s->pixels, stride, down, across, 0, 0, simd, out, out_h, out_w, s);
    free_buffers(s, KEEP_BYTES);
    return ok;
}
