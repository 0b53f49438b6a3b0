/* A baseline Huffman decoder in libjpeg's place, for every baseline scan the kernel decodes.
 *
 * libjpeg-turbo decodes Huffman codes on its fast path only in scans without restart
 * markers (jdhuff.c, decode_mcu); the kernel's stored JPEGs have a marker every few MCUs so
 * that a crop decodes only the intervals around its box, and so paid the slow path for
 * every code. This decoder keeps a fast path across markers: 64 bits of input at a time,
 * eight bytes at once where none is 0xFF, and a LUT_BITS lookahead table that gives the code
 * and, where its extra bits fit too, the coefficient (stb_image's idea) in one lookup. On
 * files without markers (the converter's sources) it beats libjpeg-turbo's fast path too.
 *
 * It takes libjpeg's place through the entropy decoder's hook (cinfo->entropy->decode_mcu,
 * its state in cinfo->client_data), so libjpeg still does everything else: markers, IDCT,
 * upsampling, colour, cropped columns, skipped rows. It writes the coefficients libjpeg's
 * decoder writes (the tests compare the pixels of both), and it decodes only well-formed
 * data: a code that is not in the table, a coefficient past the 64th, a missing or
 * misnumbered restart marker, bytes left before one or after the last MCU, or reading past
 * the data fails through error_exit, where libjpeg would warn, or go on silently. The
 * kernel then lets its fallback judge the file, as it does for any libjpeg error or
 * warning: so the kernel still decodes only what a full decode takes without a warning. */
#include "huffman.h"

#if IMGPACK_OWN_HUFFMAN

#include <string.h>

#include <jerror.h>

/* The zigzag order's natural positions (jutils.c's jpeg_natural_order). */
static const uint8_t natural[DCTSIZE2] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48,
    41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23,
    30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
};

static __attribute__((noreturn)) void fail(Huffman *h) {
    j_common_ptr common = (j_common_ptr)h->cinfo;
    common->err->msg_code = JWRN_HIT_MARKER; /* any code: the caller judges the file again */
    (*common->err->error_exit)(common); /* the kernel's longjmps (errors.h) */
    __builtin_unreachable();
}

/* The value of `s` extra bits `v` (JPEG F.12). */
static inline int32_t extend(uint32_t v, int s) {
    return v < (1u << (s - 1)) ? (int32_t)v - (int32_t)(1u << s) + 1 : (int32_t)v;
}

/* The lookup entry of a code of `len` bits and value `rs`, the next LUT_BITS bits being
 * `look`: WHOLE where the size's extra bits fit in the lookahead too. */
static int32_t lut_entry(int look, int len, int rs, int dc) {
    int s = dc ? rs : rs & 15;
    if (s == 0 || len + s > LUT_BITS) return (int32_t)(rs << 8 | len); /* EOB, ZRL, or long */
    uint32_t v = ((uint32_t)look >> (LUT_BITS - len - s)) & ((1u << s) - 1);
    return (int32_t)((uint32_t)extend(v, s) << 16) | rs << 8 | LUT_WHOLE | (len + s);
}

/* Derive `t` from libjpeg's table (the checks of jpeg_make_d_derived_tbl). 0: not a table
 * this decoder takes. */
static int derive(HuffTable *t, const JHUFF_TBL *from, int dc) {
    int total = 0;
    for (int len = 1; len <= 16; len++) total += from->bits[len];
    if (total > 256) return 0;
    if (t->built && memcmp(t->bits, from->bits, sizeof t->bits) == 0 &&
        memcmp(t->huffval, from->huffval, (size_t)total) == 0)
        return 1;
    t->built = 0;
    memcpy(t->bits, from->bits, sizeof t->bits);
    memcpy(t->huffval, from->huffval, (size_t)total);
    memset(t->lut, 0, sizeof t->lut);
    int32_t code = 0;
    int k = 0;
    for (int len = 1; len <= 16; len++) {
        int n = from->bits[len];
        t->offset[len] = k - code;
        t->maxcode[len] = n ? code + n - 1 : -1;
        if (code + n > 1 << len) return 0; /* more codes than the length has */
        for (int i = 0; i < n; i++, k++, code++) {
            if (dc && t->huffval[k] > 15) return 0;
            if (len > LUT_BITS) continue;
            int shift = LUT_BITS - len, first = code << shift;
            for (int j = 0; j < 1 << shift; j++)
                t->lut[first + j] = lut_entry(first + j, len, t->huffval[k], dc);
        }
        code <<= 1;
    }
    t->built = 1;
    return 1;
}

static inline uint64_t load_be64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return __builtin_bswap64(v);
}

/* The bit reader lives in decode_mcu's locals, `bits` (the next `count` bits, most
 * significant first) and `count`, so that the compiler keeps them in registers: Python
 * builds with -fno-strict-aliasing, under which every coefficient stored would otherwise
 * reload them from `h`. */

/* At least 57 bits in `*bits`: whole bytes, 0xFF 0x00 as 0xFF, zeros from a marker on. */
static inline __attribute__((always_inline)) void refill(Huffman *h, uint64_t *bits, int *count) {
    if (h->end - h->next >= 8 && !h->marker) {
        /* the whole bytes that fit, up to the first 0xFF among the next eight */
        const uint64_t low7 = 0x7F7F7F7F7F7F7F7Full;
        uint64_t w = load_be64(h->next), inverted = ~w;
        uint64_t ff = ~(((inverted & low7) + low7) | inverted | low7); /* 0x80 in each 0xFF */
        int n = (64 - *count) >> 3;
        if (ff != 0 && __builtin_clzll(ff) >> 3 < n) n = __builtin_clzll(ff) >> 3;
        if (n > 0) {
            *bits |= (w & (~0ull << (64 - 8 * n))) >> *count;
            *count += 8 * n;
            h->next += n;
        }
    }
    while (*count <= 56) {
        uint64_t byte = 0;
        if (!h->marker && h->next < h->end && h->next[0] != 0xFF) {
            byte = *h->next++;
        } else if (!h->marker && h->end - h->next >= 2 && h->next[1] == 0x00) {
            byte = 0xFF;
            h->next += 2;
        } else { /* a marker, or the end: the data is over */
            h->marker = 1;
            h->zeros += 8;
        }
        *bits |= byte << (56 - *count);
        *count += 8;
    }
}

#define DROP(n) (bits <<= (n), count -= (n))
/* The next `s` (1-16) bits as a number. */
#define TAKE(s) (value = (uint32_t)(bits >> (64 - (s))), DROP(s), value)

/* The value of the next code, longer than LUT_BITS, or -1 if no code of 16 bits or fewer
 * matches; at least 16 bits must be in `bits`. */
static int decode_long(const HuffTable *t, uint64_t *bits, int *count) {
    for (int len = LUT_BITS + 1; len <= 16; len++) {
        int32_t code = (int32_t)(*bits >> (64 - len));
        if (code <= t->maxcode[len]) {
            int32_t at = code + t->offset[len];
            if (at < 0 || at > 255) return -1;
            *bits <<= len;
            *count -= len;
            return t->huffval[at];
        }
    }
    return -1;
}

/* The value of the next code whose entry `e` did not hold the whole answer (its extra
 * bits are still to take), or -1 for no code. */
static inline __attribute__((always_inline)) int code_value(int32_t e, const HuffTable *t,
                                                            uint64_t *bits, int *count) {
    if (e == 0) return decode_long(t, bits, count);
    *bits <<= e & 31;
    *count -= e & 31;
    return (e >> 8) & 0xFF;
}

/* The restart marker that must come next (`left` bits unread before it), passed; the DC
 * predictions reset. */
static void restart(Huffman *h, int left) {
    if (left - h->zeros >= 8) fail(h); /* whole bytes left before the marker */
    const uint8_t *p = h->next;
    while (p < h->end && *p == 0xFF) p++; /* a marker's 0xFF and any fill before it */
    if (p == h->next || p >= h->end || *p != 0xD0 + (h->restarts & 7)) fail(h);
    h->next = p + 1;
    h->zeros = h->marker = 0;
    memset(h->last_dc, 0, sizeof h->last_dc);
    h->to_go = h->interval;
    h->restarts++;
}

static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
    Huffman *h = cinfo->client_data;
    uint64_t bits = h->bits;
    int count = h->count;
    uint32_t value;
    if (h->interval) {
        if (h->to_go == 0) {
            restart(h, count);
            bits = 0;
            count = 0;
        }
        h->to_go--;
    }
    for (int b = 0; b < h->blocks; b++) {
        JCOEF *block = MCU_data ? MCU_data[b][0] : h->discard;
        const HuffTable *ac = h->ac[b];
        /* After a refill at least 57 bits are in `bits`; a code and its extra bits take
         * at most 16 + 15, so one refill below 32 bits serves each coefficient. */
        if (count < 32) refill(h, &bits, &count);
        int32_t e = h->dc[b]->lut[bits >> (64 - LUT_BITS)], diff = 0;
        if (e & LUT_WHOLE) {
            diff = e >> 16;
            DROP(e & 31);
        } else {
            int s = code_value(e, h->dc[b], &bits, &count);
            if (s < 0) fail(h);
            if (s) diff = extend(TAKE(s), s);
        }
        int32_t dc = h->last_dc[h->component[b]] + diff;
        if (dc < -32768 || dc > 32767) fail(h);
        h->last_dc[h->component[b]] = dc;
        block[0] = (JCOEF)dc;
        for (int k = 1; k < DCTSIZE2;) {
            if (count < 32) refill(h, &bits, &count);
            e = ac->lut[bits >> (64 - LUT_BITS)];
            if (e & LUT_WHOLE) {
                k += (e >> 12) & 15;
                if (k >= DCTSIZE2) fail(h);
                DROP(e & 31);
                block[natural[k++]] = (JCOEF)(e >> 16);
                continue;
            }
            int rs = code_value(e, ac, &bits, &count);
            if (rs < 0) fail(h);
            int run = rs >> 4, s = rs & 15;
            if (s == 0) {
                if (run != 15) break; /* end of block */
                k += 16;
                if (k > DCTSIZE2) fail(h);
                continue;
            }
            k += run;
            if (k >= DCTSIZE2) fail(h);
            block[natural[k++]] = (JCOEF)extend(TAKE(s), s);
        }
        if (count < h->zeros) fail(h); /* read past the data */
    }
    h->bits = bits;
    h->count = count;
    return TRUE;
}

int huffman_install(j_decompress_ptr cinfo, Huffman *h) {
    if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
        cinfo->comps_in_scan != cinfo->num_components || cinfo->comps_in_scan > MAX_COMPS_IN_SCAN ||
        cinfo->blocks_in_MCU < 1 || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU || cinfo->Ss != 0 ||
        cinfo->Se != DCTSIZE2 - 1 || cinfo->Ah != 0 || cinfo->Al != 0 || jpeg_input_complete(cinfo))
        return 0;
    for (int b = 0; b < cinfo->blocks_in_MCU; b++) {
        int ci = cinfo->MCU_membership[b];
        if (ci < 0 || ci >= cinfo->comps_in_scan) return 0;
        const jpeg_component_info *comp = cinfo->cur_comp_info[ci];
        int dc = comp->dc_tbl_no, ac = comp->ac_tbl_no;
        if (dc < 0 || dc >= NUM_HUFF_TBLS || ac < 0 || ac >= NUM_HUFF_TBLS ||
            cinfo->dc_huff_tbl_ptrs[dc] == NULL || cinfo->ac_huff_tbl_ptrs[ac] == NULL ||
            !derive(&h->tables[0][dc], cinfo->dc_huff_tbl_ptrs[dc], 1) ||
            !derive(&h->tables[1][ac], cinfo->ac_huff_tbl_ptrs[ac], 0))
            return 0;
        h->component[b] = ci;
        h->dc[b] = &h->tables[0][dc];
        h->ac[b] = &h->tables[1][ac];
    }
    h->cinfo = cinfo;
    h->next = cinfo->src->next_input_byte;
    h->end = h->next + cinfo->src->bytes_in_buffer;
    h->bits = 0;
    h->count = h->zeros = h->marker = 0;
    h->blocks = cinfo->blocks_in_MCU;
    h->interval = h->to_go = cinfo->restart_interval;
    h->restarts = 0;
    memset(h->last_dc, 0, sizeof h->last_dc);
    cinfo->client_data = h;
    cinfo->entropy->decode_mcu = decode_mcu;
    return 1;
}

void huffman_finish(j_decompress_ptr cinfo, Huffman *h) {
    if (h->count - h->zeros >= 8) fail(h); /* whole bytes read past the last MCU's codes */
    cinfo->src->next_input_byte = h->next;
    cinfo->src->bytes_in_buffer = (size_t)(h->end - h->next);
}
#endif
