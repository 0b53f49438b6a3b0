/* The resize's taps: torch's uint8 antialiased bilinear weights
 * (aten/src/ATen/native/cpu/UpSampleKernel.cpp), and the grouped AVX2 pass's tables. The
 * ground floor, beside scratch.h. */
#ifndef IMGPACK_TAPS_H
#define IMGPACK_TAPS_H

#include <stdint.h>

#include "kernel_types.h"

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

/* Two int16 weights in one int32, the first in the low half. */
static inline int32_t pair(int16_t a, int16_t b) {
    return (int32_t)((uint32_t)(uint16_t)a | ((uint32_t)(uint16_t)b << 16));
}

/* Whether the span is the output itself (no resize). */
static inline int is_copy(Span s, int out) {
    return s.in == out && s.offset == 0.0 && s.extent == out;
}

/* HelperInterpBase::_compute_indices_int16_weights_aa with align_corners=False, no scale
 * given, bilinear, antialias=True: the same doubles in the same order, so the same weights
 * for a whole span (offset 0, extent in). A fractional span shifts and scales the centres.
 * 0: out of memory (nothing left allocated). */
int make_taps(Taps *t, Span span, int out);

/* The grouped horizontal pass's tables for `t` (of `out` outputs), where it takes them
 * (t->groups stays 0 otherwise); 0: out of memory. */
int make_groups(Taps *t, int out);

/* Free what make_taps and make_groups made; freed once, the Taps zeroed. */
void free_taps(Taps *t);

#endif
