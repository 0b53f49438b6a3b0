/* JPEG markers (markers.h). */
#include "markers.h"

#include <stdlib.h>
#include <string.h>

static uint32_t tiff32(const uint8_t *p, int big) {
    return big ? ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]
               : ((uint32_t)p[3] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[1] << 8) | p[0];
}

static unsigned tiff16(const uint8_t *p, int big) {
    return big ? ((unsigned)p[0] << 8) | p[1] : ((unsigned)p[1] << 8) | p[0];
}

/* exif_orientation(): the Orientation in IFD0; -1 where Python's is None. */
static int64_t exif_orientation(const uint8_t *tiff, size_t n) {
    int big;
    if (n < 2) return -1;
    if (tiff[0] == 'I' && tiff[1] == 'I') big = 0;
    else if (tiff[0] == 'M' && tiff[1] == 'M') big = 1;
    else return -1;
    if (n < 8) return -1;
    uint64_t ifd = tiff32(tiff + 4, big);
    if (ifd + 2 > n) return -1;
    uint64_t count = tiff16(tiff + ifd, big);
    uint64_t stop = ifd + 2 + 12 * count;
    if (n < 11) return -1;
    if (stop > n - 11) stop = n - 11;
    for (uint64_t entry = ifd + 2; entry < stop; entry += 12) {
        unsigned tag = tiff16(tiff + entry, big), kind = tiff16(tiff + entry + 2, big);
        uint32_t values = tiff32(tiff + entry + 4, big);
        if (tag == 0x0112) {
            if (values != 1 || (kind != 3 && kind != 4)) return 0;
            return kind == 3 ? (int64_t)tiff16(tiff + entry + 8, big)
                             : (int64_t)tiff32(tiff + entry + 8, big);
        }
    }
    return -1;
}

/* xmp_orientation(): rb'tiff:Orientation(?:="|>)([0-9])', else 1. */
static int64_t xmp_orientation(const uint8_t *xmp, size_t n) {
    static const char key[] = "tiff:Orientation";
    const size_t k = sizeof key - 1;
    for (size_t i = 0; i + k < n; i++) {
        if (memcmp(xmp + i, key, k) != 0) continue;
        const uint8_t *p = xmp + i + k;
        size_t left = n - i - k;
        if (left >= 3 && p[0] == '=' && p[1] == '"' && p[2] >= '0' && p[2] <= '9') return p[2] - '0';
        if (left >= 2 && p[0] == '>' && p[1] >= '0' && p[1] <= '9') return p[1] - '0';
    }
    return 1;
}

static int starts_with(const uint8_t *data, size_t n, size_t at, const char *prefix, size_t k) {
    return at <= n && n - at >= k && memcmp(data + at, prefix, k) == 0;
}

/* Whether crop() takes a JPEG of these parsed markers (before the caller's pixel limit):
 * complete, upright, 8-bit Huffman-coded baseline, extended or progressive (SOF0-SOF2), of one
 * or three components. Everything else goes to the caller's decoder, which judges it. */
static int64_t takes(const int64_t *h) {
    int64_t frame = h[H_FRAME], components = h[H_COMPONENTS], orientation = h[H_ORIENTATION];
    return h[H_COMPLETE] == 1 && h[H_PRECISION] == 8 && frame >= 0xC0 && frame <= 0xC2 &&
           (components == 1 || components == 3) && (orientation < 2 || orientation > 8) &&
           h[H_WIDTH] > 0 && h[H_HEIGHT] > 0;
}

/* One value's row of headers(); returns 0 when out of memory (EXIF spread over segments). */
int read_header(Bytes b, int64_t *out) {
    static const char exif_header[] = "Exif\0\0";
    static const char xmp_header[] = "http://ns.adobe.com/xap/1.0/";
    const size_t exif_k = 6, xmp_k = sizeof xmp_header; /* the XMP header ends with its NUL */
    const uint8_t *d = b.data;
    size_t n = b.size, i = 2;
    int found_size = 0, found_sos = 0;
    uint8_t *exif = NULL;
    size_t exif_n = 0;
    const uint8_t *xmp = NULL;
    size_t xmp_n = 0;
    memset(out, 0, HEADER_FIELDS * sizeof *out);
    if (n < 3 || d[0] != 0xFF || d[1] != 0xD8 || d[2] != 0xFF) return 1;
    while (i + 4 <= n && d[i] == 0xFF) {
        unsigned marker = d[i + 1];
        if (marker == 0xDA) {
            found_sos = 1;
            break;
        }
        if (has_no_length(marker)) {
            i += marker == 0xFF ? 1 : 2;
            continue;
        }
        size_t length = be16(d + i + 2);
        if (length < 2) break;
        size_t start = i + 4, end = i + 2 + length, stop = end < n ? end : n;
        if (is_frame(marker) && !found_size && length >= 7 && start + 5 <= n) {
            found_size = 1;
            out[H_FRAME] = marker;
            out[H_PRECISION] = d[start];
            out[H_HEIGHT] = be16(d + start + 1);
            out[H_WIDTH] = be16(d + start + 3);
            out[H_COMPONENTS] = start + 5 < n ? d[start + 5] : 0;
        } else if (marker == 0xE1 && starts_with(d, n, start, exif_header, exif_k)) {
            size_t from = start + exif_k;
            if (from < stop) {
                uint8_t *grown = realloc(exif, exif_n + (stop - from));
                if (grown == NULL) {
                    free(exif);
                    return 0;
                }
                exif = grown;
                memcpy(exif + exif_n, d + from, stop - from);
                exif_n += stop - from;
            }
        } else if (marker == 0xE1 && starts_with(d, n, start, xmp_header, xmp_k)) {
            size_t from = start + xmp_k;
            xmp = d + from;
            xmp_n = from < stop ? stop - from : 0;
        }
        i = end;
    }
    if (found_sos && found_size) {
        int64_t orientation = exif_orientation(exif, exif_n);
        out[H_PARSED] = 1;
        out[H_ORIENTATION] = orientation >= 0 ? orientation : xmp_orientation(xmp, xmp_n);
        out[H_COMPLETE] = n >= 2 && d[n - 2] == 0xFF && d[n - 1] == 0xD9;
        out[H_TAKES] = takes(out);
    } else {
        memset(out, 0, HEADER_FIELDS * sizeof *out);
    }
    free(exif);
    return 1;
}
