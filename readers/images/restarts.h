/* Restart intervals: the part of a verified JPEG that a box needs, as a smaller JPEG. */
#ifndef IMGPACK_RESTARTS_H
#define IMGPACK_RESTARTS_H

#include <stddef.h>
#include <stdint.h>

#include "kernel_types.h"
#include "scratch.h"

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
int read_restarts(Bytes b, Restarts *r);

/* The restart intervals around `box` as a smaller JPEG in `part` (in s->part); `box`,
 * `height` and `width` become the part's. 1: done; 0: no smaller part (decode the file);
 * -1: out of memory. */
int restart_part(Bytes b, const Restarts *r, Box *box, int64_t *height, int64_t *width,
                 Scratch *s, Bytes *part);

#endif
