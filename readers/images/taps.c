/* The resize's taps (taps.h). */
#include "taps.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void free_taps(Taps *t) {
    free(t->first);
    free(t->size);
    free(t->weights);
    free(t->pairs);
    free(t->group_base);
    free(t->group_lanes);
    *t = (Taps){0}; /* freed once: make_taps frees what it made when it fails, and so may place */
}

static double triangle(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}


int make_taps(Taps *t, Span span, int out) {
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
int make_groups(Taps *t, int out) {
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

