/* A baseline Huffman decoder that takes libjpeg's place in the kernel (huffman.c). */
#ifndef IMGPACK_HUFFMAN_H
#define IMGPACK_HUFFMAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jpeglib.h>

/* Whether the kernel has its own decoder: it reaches into libjpeg's internal entropy-decoder
 * struct (below), which libjpeg does not promise to keep, so only with the libjpeg-turbo it
 * was written against (2.0 to 3.0: Debian's 2.1.5, the release wheels' 3.0.4); any other
 * libjpeg, or -DIMGPACK_NO_OWN_HUFFMAN, decodes through libjpeg's decoder (the module's
 * OWN_HUFFMAN says which). */
#if !defined(IMGPACK_NO_OWN_HUFFMAN) && defined(LIBJPEG_TURBO_VERSION_NUMBER) && \
    LIBJPEG_TURBO_VERSION_NUMBER >= 2000000 && LIBJPEG_TURBO_VERSION_NUMBER < 3001000
#define IMGPACK_OWN_HUFFMAN 1
#else
#define IMGPACK_OWN_HUFFMAN 0
#endif

#if IMGPACK_OWN_HUFFMAN
/* The first members of jpegint.h's entropy-decoder interface, which libjpeg does not
 * install: the same two from libjpeg 6b to libjpeg-turbo 3 (which adds members after them).
 * Only `decode_mcu` of libjpeg's own is replaced. */
struct jpeg_entropy_decoder {
    void (*start_pass)(j_decompress_ptr cinfo);
    boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
};

enum { LUT_BITS = 11 };

/* A lookup entry (HuffTable.lut): bits 0-4 the bits to drop, bit 5 WHOLE, bits 8-15 the
 * code's value (AC: run << 4 | size), bits 16-31 the coefficient (AC) or the DC difference
 * when WHOLE; 0 where the code is longer than LUT_BITS. */
enum { LUT_WHOLE = 1 << 5 };

/* One Huffman table, derived for decoding. */
typedef struct {
    /* Indexed by the next LUT_BITS bits: the code they start with and, where its extra bits
     * fit too (WHOLE), the value they give, so most coefficients take one lookup. */
    int32_t lut[1 << LUT_BITS];
    int32_t maxcode[17]; /* the largest code of each length, -1 where none */
    int32_t offset[17];  /* a code's value is huffval[code + offset[length]] */
    /* libjpeg's table (code counts by length, values), kept to derive again only when it
     * changes. */
    uint8_t bits[17];
    uint8_t huffval[256];
    int built;
} HuffTable;

typedef struct Huffman { /* cinfo->client_data points here while it decodes */
    j_decompress_ptr cinfo;
    const uint8_t *next, *end; /* the entropy-coded bytes not yet in `bits` */
    uint64_t bits;             /* the next `count` bits, most significant first */
    int count;
    int zeros;  /* zero bits appended at a marker or the end: reading them is an error */
    int marker; /* the bytes stopped at a marker */
    unsigned interval, to_go, restarts; /* MCUs per restart interval, left, markers passed */
    int blocks;
    int component[D_MAX_BLOCKS_IN_MCU];
    const HuffTable *dc[D_MAX_BLOCKS_IN_MCU], *ac[D_MAX_BLOCKS_IN_MCU];
    int32_t last_dc[MAX_COMPS_IN_SCAN];
    JCOEF discard[DCTSIZE2]; /* where a skipped MCU's coefficients go */
    HuffTable tables[2][NUM_HUFF_TBLS]; /* DC, AC */
} Huffman;

/* After jpeg_start_decompress (and before the first row is read), make `h` decode the
 * scan's Huffman codes in libjpeg's place. 1: it does; 0: the scan is not one it decodes
 * (progressive, arithmetic-coded, not 8-bit, not one interleaved scan), libjpeg keeps it.
 * Damaged data fails through cinfo->err->error_exit, as libjpeg's own errors do. */
int huffman_install(j_decompress_ptr cinfo, Huffman *h);

/* After the scan's last MCU, before jpeg_finish_decompress: libjpeg's source resumes where
 * `h` stopped, so that it reads the markers after the scan as after its own decoder (and
 * warns as it would about bytes before them). Whole bytes left unread in `h` fail through
 * error_exit. */
void huffman_finish(j_decompress_ptr cinfo, Huffman *h);
#endif

#endif
