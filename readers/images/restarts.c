/* Restart intervals (restarts.h). */
#include "restarts.h"

#include <string.h>

#include "markers.h"

/* Whether `b` is an 8-bit baseline or extended sequential JPEG of one scan with a restart
 * interval that divides its MCU rows (each row then starts an interval), and where. */
int read_restarts(Bytes b, Restarts *r) {
    const uint8_t *d = b.data;
    size_t n = b.size, i = 2;
    int components = 0, h_max = 1, v_max = 1, found_frame = 0;
    memset(r, 0, sizeof *r);
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    while (i + 4 <= n && d[i] == 0xFF) {
        unsigned marker = d[i + 1];
        if (marker == 0xFF) {
            i++;
            continue;
        }
        if (has_no_length(marker)) return 0;
        size_t length = be16(d + i + 2);
        if (length < 2 || length > n - i - 2) return 0;
        const uint8_t *p = d + i + 4;
        size_t k = length - 2;
        if (is_frame(marker)) {
            if (found_frame || (marker != 0xC0 && marker != 0xC1) || k < 6 || p[0] != 8) return 0;
            components = p[5];
            if ((components != 1 && components != 3) || k < 6 + 3 * (size_t)components) return 0;
            r->height = be16(p + 1);
            r->width = be16(p + 3);
            for (int c = 0; c < components; c++) {
                int h = p[7 + 3 * c] >> 4, v = p[7 + 3 * c] & 15;
                if (h < 1 || h > 4 || v < 1 || v > 4) return 0;
                if (h > h_max) h_max = h;
                if (v > v_max) v_max = v;
            }
            r->frame = i;
            found_frame = 1;
        } else if (marker == 0xDD) {
            if (k < 2) return 0;
            r->interval = be16(p);
        } else if (marker == 0xDA) {
            if (!found_frame || k < 1 || p[0] != components || r->interval == 0 || r->width == 0 ||
                r->height == 0)
                return 0;
            r->entropy = i + 2 + length;
            r->mcu_w = components == 1 ? 8 : 8 * h_max; /* one component: an MCU is a block */
            r->mcu_h = components == 1 ? 8 : 8 * v_max;
            r->columns = ceil_div(r->width, r->mcu_w);
            r->rows = ceil_div(r->height, r->mcu_h);
            return r->columns % r->interval == 0;
        }
        i += 2 + length;
    }
    return 0;
}

/* The restart intervals the box needs, as a smaller JPEG in `part`: the header with its frame
 * resized, then the intervals of the MCU rows and columns around the box, renumbered. Every
 * interval restarts the DC predictions, so the part decodes to the file's own pixels except
 * within a pixel of its cut edges, where fancy upsampling lacks the neighbours; the box keeps
 * 2 pixels from them. The entropy decode, the most of a small JPEG's decode, then covers the
 * box's neighbourhood instead of every row above the box's end. `box`, `height` and `width`
 * become the part's. 1: done; 0: no smaller part (or the markers do not sit where the
 * interval says: decode the file); -1: out of memory. */
int restart_part(Bytes b, const Restarts *r, Box *box, int64_t *height, int64_t *width,
                 Scratch *s, Bytes *part) {
    const int64_t margin = 2, every = r->interval;
    int64_t right = box->left + box->width + margin, bottom = box->top + box->height + margin;
    int64_t c0 = (box->left > margin ? box->left - margin : 0) / r->mcu_w / every * every;
    int64_t c1 = ceil_div(ceil_div(right < r->width ? right : r->width, r->mcu_w), (int)every) * every;
    int64_t r0 = (box->top > margin ? box->top - margin : 0) / r->mcu_h;
    int64_t r1 = ceil_div(bottom < r->height ? bottom : r->height, r->mcu_h);
    if (c1 > r->columns) c1 = r->columns;
    /* Two MCUs at least each way: libjpeg upsamples a component of 2 samples or fewer (a
     * partial last MCU) without its fancy filter. */
    while (c1 - c0 < 2 && c1 < r->columns) c1 += every;
    while (c1 - c0 < 2 && c0 > 0) c0 -= every;
    while (r1 - r0 < 2 && r1 < r->rows) r1++;
    while (r1 - r0 < 2 && r0 > 0) r0--;
    if (c0 == 0 && c1 == r->columns && r0 == 0) return 0;
    /* Interval k holds MCUs [k * every, (k + 1) * every) in raster order. */
    int64_t total = r->rows * r->columns / every, last = ((r1 - 1) * r->columns + c1) / every - 1;
    if (!grow((void **)&s->ends, &s->ends_n, (size_t)(last + 1) * sizeof(size_t))) return -1;
    const uint8_t *d = b.data;
    size_t n = b.size, i = r->entropy;
    for (int64_t k = 0; k <= last;) {
        const uint8_t *ff = i < n ? memchr(d + i, 0xFF, n - i) : NULL;
        if (ff == NULL || (size_t)(ff - d) + 1 >= n) return 0;
        size_t at = (size_t)(ff - d);
        unsigned next = d[at + 1];
        if (next == 0x00 || next == 0xFF) { /* a stuffed 0xFF, or fill before a marker */
            i = at + (next == 0x00 ? 2 : 1);
            continue;
        }
        int restart = next >= 0xD0 && next <= 0xD7 && (int64_t)(next - 0xD0) == (k & 7);
        if (!restart && !(next == 0xD9 && k == total - 1)) return 0;
        s->ends[k++] = at;
        i = at + 2;
    }
    int64_t per_row = (c1 - c0) / every, part_rows = r1 - r0;
    size_t need = r->entropy + 2;
    for (int64_t y = r0; y < r1; y++) {
        int64_t from = (y * r->columns + c0) / every;
        size_t start = from == 0 ? r->entropy : s->ends[from - 1] + 2;
        need += s->ends[from + per_row - 1] - start + 2 * (size_t)per_row;
    }
    if (!grow((void **)&s->part, &s->part_n, need)) return -1;
    uint8_t *o = s->part;
    memcpy(o, d, r->entropy);
    int64_t part_h = (r1 * r->mcu_h < r->height ? r1 * r->mcu_h : r->height) - r0 * r->mcu_h;
    int64_t part_w = (c1 * r->mcu_w < r->width ? c1 * r->mcu_w : r->width) - c0 * r->mcu_w;
    uint8_t *size = o + r->frame + 5; /* the frame's height, then width */
    size[0] = (uint8_t)(part_h >> 8), size[1] = (uint8_t)part_h;
    size[2] = (uint8_t)(part_w >> 8), size[3] = (uint8_t)part_w;
    o += r->entropy;
    int64_t written = 0;
    for (int64_t y = r0; y < r1; y++) {
        for (int64_t k = (y * r->columns + c0) / every, end = k + per_row; k < end; k++) {
            size_t start = k == 0 ? r->entropy : s->ends[k - 1] + 2;
            memcpy(o, d + start, s->ends[k] - start);
            o += s->ends[k] - start;
            if (++written < per_row * part_rows) *o++ = 0xFF, *o++ = (uint8_t)(0xD0 + ((written - 1) & 7));
        }
    }
    *o++ = 0xFF, *o++ = 0xD9;
    part->data = s->part;
    part->size = (size_t)(o - s->part);
    box->top -= r0 * r->mcu_h;
    box->left -= c0 * r->mcu_w;
    *height = part_h;
    *width = part_w;
    return 1;
}

