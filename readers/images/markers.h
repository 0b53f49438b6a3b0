/* JPEG markers: readers.images.jpeg.jpeg_header's walk, byte for byte, for headers(); and
 * the marker tests restarts.c shares. */
#ifndef IMGPACK_MARKERS_H
#define IMGPACK_MARKERS_H

#include <stdint.h>

#include "kernel_types.h"

enum { HEADER_FIELDS = 9 };
/* Columns of headers(): whether the markers parse, then what they say, then whether crop()
 * takes the JPEG (takes()). */
enum { H_PARSED, H_WIDTH, H_HEIGHT, H_ORIENTATION, H_FRAME, H_PRECISION, H_COMPONENTS, H_COMPLETE, H_TAKES };

static inline unsigned be16(const uint8_t *p) { return ((unsigned)p[0] << 8) | p[1]; }

/* A start-of-frame marker (SOF0-SOF15 but DHT, JPG and DAC). */
static inline int is_frame(unsigned marker) {
    return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

/* A marker without a length field (TEM, RSTn, SOI, EOI, fill). */
static inline int has_no_length(unsigned marker) {
    return marker == 0x01 || (marker >= 0xD0 && marker <= 0xD9) || marker == 0xFF;
}

/* One value's row of headers() (HEADER_FIELDS int64): zeros where the markers do not
 * parse. 0: out of memory (EXIF spread over segments). */
int read_header(Bytes b, int64_t *out);

#endif
