/* The driver of the resize (as Pillow-SIMD's Resample.c beside its SIMD passes): a box's
 * pixels resized, mirrored and stored into its batch row, by the instructions a call asks. */
#ifndef IMGPACK_PLACE_H
#define IMGPACK_PLACE_H

#include <stddef.h>
#include <stdint.h>

#include "kernel_types.h"
#include "scratch.h"

/* The best resize level this CPU has (Options.simd): 2 with AVX2, else 0. */
int best_simd(void);

/* The box's pixels `src` (`down.in` x `across.in` pixels, rows `stride` apart) resized
 * (where a span is not a plain copy) at level `simd` and mirrored (if asked) into `out`:
 * HWC rows, or with `planar` the three planes of a CHW row. 0: out of memory. */
int place(const uint8_t *src, size_t stride, Span down, Span across, int flip, int planar,
          int simd, uint8_t *out, int out_h, int out_w, Scratch *s);

/* Decoded pixels that are not a JPEG's box (a PNG, a dataset's raw pixels): the packed HWC
 * rows `pixels` (`height` x `width`), of which the top-left `extent_h` x `extent_w` is the
 * image (the whole, or a DCT-scaled decode's partial last row and column), resized into
 * `out` (`out_h` x `out_w` HWC rows) at level `simd`, by way of this thread's scratch (a
 * copy with the SLACK the AVX2 passes read past). 0: out of memory. */
int resize_image(const uint8_t *pixels, int height, int width, double extent_h,
                 double extent_w, int simd, uint8_t *out, int out_h, int out_w);

#endif
