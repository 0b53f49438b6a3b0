/* The values every unit of the crop kernel passes around (jpegcrop.c is the binding; the
 * units below it never include Python.h). */
#ifndef IMGPACK_KERNEL_TYPES_H
#define IMGPACK_KERNEL_TYPES_H

#include <stddef.h>
#include <stdint.h>

enum {
    CROP_OK = 0,
    CROP_LIBJPEG = 1,     /* libjpeg failed or warned: the fallback judges the file */
    CROP_UNSUPPORTED = 2, /* not what the kernel decodes (CMYK, another size than probed) */
    CROP_MEMORY = 3,
};

enum { SLACK = 16 }; /* bytes readable after any source row: the AVX2 resize reads past it */
enum { MAX_SCANS = 500 }; /* libjpeg-turbo's TJFLAG_LIMITSCANS: bounds a progressive decode */

/* A stored value's bytes. */
typedef struct {
    const uint8_t *data;
    size_t size;
} Bytes;

/* A crop box in the upright image's pixels, and whether to mirror it. */
typedef struct {
    int64_t top, left, height, width, flip;
} Box;

/* One dimension of a box: `in` source pixels, of which the box spans `extent` from
 * `offset` (fractional in a DCT-scaled decode; 0 and `in` otherwise). */
typedef struct {
    int in;
    double offset, extent;
} Span;

/* How one crop() call decodes, fixed for the call (no process-wide switch): the resize's
 * instructions (0 plain C, 1 AVX2 an output pixel at a time, 2 AVX2 by groups of four
 * outputs), whether baseline scans go through huffman.c, whether the bytes are verified,
 * and whether the output rows are CHW planes. */
typedef struct {
    int simd, huffman, verified, planar;
} Options;

static inline int64_t ceil_div(int64_t v, int d) { return (v + d - 1) / d; }

#endif
