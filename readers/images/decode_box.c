/* One decode thread's share of a crop() call: each row's box decoded with libjpeg
 * (jpeg_crop_scanline for its columns, jpeg_skip_scanlines to an iMCU row above it, the IDCT
 * scaled by the row's denominator, the box then kept at its fractional position), resized,
 * mirrored and stored (place.c); verified bytes cut by restart markers decode only the
 * intervals around the box (restarts.c), their Huffman codes through huffman.c. */
#include "decode_box.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "errors.h"
#include "huffman.h"
#include "place.h"
#include "restarts.h"
#include "scratch.h"

/* libjpeg 7+'s API (libjpeg-turbo built for it, as Ubuntu's libjpeg-turbo8) scales each axis
 * on its own; libjpeg 6b's, which Debian's libjpeg62-turbo keeps, has one size for both. */
#if JPEG_LIB_VERSION >= 70
#define MIN_DCT_COLUMNS(cinfo) ((cinfo)->min_DCT_h_scaled_size)
#define MIN_DCT_ROWS(cinfo) ((cinfo)->min_DCT_v_scaled_size)
#else
#define MIN_DCT_COLUMNS(cinfo) ((cinfo)->min_DCT_scaled_size)
#define MIN_DCT_ROWS(cinfo) ((cinfo)->min_DCT_scaled_size)
#endif

/* crop_bytes() without its jump target: every return leaves `cinfo` ready for reuse; a
 * libjpeg error or warning longjmps to crop_bytes, whose frame is live all the while. */
static __attribute__((noinline)) int decode_box(j_decompress_ptr cinfo, Bytes b, Box box,
                                                uint8_t *out, int out_h, int out_w,
                                                int64_t want_h, int64_t want_w, int dct,
                                                const Options *o, Scratch *s) {
    jpeg_mem_src(cinfo, b.data, (unsigned long)b.size);
    jpeg_read_header(cinfo, TRUE);
    if ((int64_t)cinfo->image_width != want_w || (int64_t)cinfo->image_height != want_h ||
        (cinfo->num_components != 1 && cinfo->num_components != 3) ||
        cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
        jpeg_abort_decompress(cinfo);
        return CROP_UNSUPPORTED;
    }
    int64_t img_h = cinfo->image_height, img_w = cinfo->image_width;
    int inside = box.top >= 0 && box.left >= 0 && box.top + box.height <= img_h &&
                 box.left + box.width <= img_w;
    int d = inside ? dct : 1; /* a box reaching outside the image is padded at full size */
    cinfo->out_color_space = JCS_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned)d;
    jpeg_start_decompress(cinfo);
    cinfo->client_data = NULL; /* huffman.c's state while it decodes this scan */
#if IMGPACK_OWN_HUFFMAN
    if (o->huffman) { /* out of memory, or a scan it does not take: libjpeg's */
        if (s->huffman == NULL) s->huffman = calloc(1, sizeof *s->huffman);
        if (s->huffman != NULL) huffman_install(cinfo, s->huffman);
    }
#endif
    int64_t H = cinfo->output_height, W = cinfo->output_width;
    int64_t top = box.top, left = box.left, bh = box.height, bw = box.width;
    Span down = {(int)bh, 0.0, (double)bh}, across = {(int)bw, 0.0, (double)bw};
    if (d > 1) { /* the scaled pixels the box touches, and where in them its edges lie */
        int64_t bottom = ceil_div(box.top + box.height, d), right = ceil_div(box.left + box.width, d);
        top = box.top / d;
        left = box.left / d;
        if (bottom > H) bottom = H;
        if (right > W) right = W;
        bh = bottom - top;
        bw = right - left;
        down = (Span){(int)bh, (double)box.top / d - (double)top, (double)box.height / d};
        across = (Span){(int)bw, (double)box.left / d - (double)left, (double)box.width / d};
    }
    /* The part of the box inside the image: rows [y0, y1), columns [x0, x1). */
    int64_t y0 = top > 0 ? top : 0, y1 = top + bh < H ? top + bh : H;
    int64_t x0 = left > 0 ? left : 0, x1 = left + bw < W ? left + bw : W;
    int any = y1 > y0 && x1 > x0;
    /* Decode one pixel more on each side, so fancy upsampling sees the full decode's, and
     * at least two iMCU columns (16 pixels): libjpeg upsamples a component of 2 columns or
     * fewer without its fancy filter, which would change the whole crop. */
    JDIMENSION xoff = 0, xwidth = (JDIMENSION)W;
    if (any) {
        int64_t from = x0 > 0 ? x0 - 1 : 0, to = x1 < W ? x1 + 1 : W;
        int64_t least = 2 * (int64_t)cinfo->max_h_samp_factor * MIN_DCT_COLUMNS(cinfo);
        if (least < 16) least = 16;
        if (to - from < least) to = from + least < W ? from + least : W;
        if (to - from < least) from = to - least > 0 ? to - least : 0;
        xoff = (JDIMENSION)from;
        xwidth = (JDIMENSION)(to - from);
        if (xwidth < (JDIMENSION)W) jpeg_crop_scanline(cinfo, &xoff, &xwidth);
        else xoff = 0, xwidth = (JDIMENSION)W;
    }
    size_t line = (size_t)xwidth * 3;
    int64_t imcu = (int64_t)cinfo->max_v_samp_factor * MIN_DCT_ROWS(cinfo);
    int64_t first = any ? ((y0 > 0 ? y0 - 1 : 0) / imcu) * imcu : 0; /* an iMCU row's start */
    int64_t last = any ? y1 : 0;
    if (!grow((void **)&s->pixels, &s->pixels_n, (size_t)(last - first > 0 ? last - first : 1) * line)) {
        jpeg_abort_decompress(cinfo);
        return CROP_MEMORY;
    }
    if (first > 0) jpeg_skip_scanlines(cinfo, (JDIMENSION)first);
    while ((int64_t)cinfo->output_scanline < last) {
        JSAMPROW row = s->pixels + (size_t)((int64_t)cinfo->output_scanline - first) * line;
        jpeg_read_scanlines(cinfo, &row, 1);
    }
    if (o->verified) { /* bytes known to decode cleanly: nothing after the box is needed */
        jpeg_abort_decompress(cinfo);
    } else { /* the rest of the entropy-coded data, without IDCT: the full decode's warnings */
        int64_t left_rows = H - (int64_t)cinfo->output_scanline;
        if (left_rows > 1) jpeg_skip_scanlines(cinfo, (JDIMENSION)(left_rows - 1));
        if ((int64_t)cinfo->output_scanline < H) {
            if (!grow((void **)&s->box, &s->box_n, line)) {
                jpeg_abort_decompress(cinfo);
                return CROP_MEMORY;
            }
            JSAMPROW row = s->box;
            jpeg_read_scanlines(cinfo, &row, 1);
        }
#if IMGPACK_OWN_HUFFMAN
        if (cinfo->client_data != NULL) huffman_finish(cinfo, cinfo->client_data);
#endif
        jpeg_finish_decompress(cinfo);
    }
    /* Now the pixels: the box straight from the decoded rows, or zero-padded first. */
    const uint8_t *src;
    size_t stride;
    if (any && y0 == top && y1 == top + bh && x0 == left && x1 == left + bw) {
        src = s->pixels + (size_t)(top - first) * line + (size_t)(left - (int64_t)xoff) * 3;
        stride = line;
        if (!place(src, stride, down, across, (int)box.flip, o->planar, o->simd, out, out_h, out_w, s))
            return CROP_MEMORY;
        return CROP_OK;
    }
    size_t padded_line = (size_t)bw * 3, padded_n = (size_t)bh * padded_line;
    uint8_t *padded = malloc(padded_n + SLACK);
    if (padded == NULL) return CROP_MEMORY;
    memset(padded, 0, padded_n);
    for (int64_t y = y0; any && y < y1; y++)
        memcpy(padded + (size_t)(y - top) * padded_line + (size_t)(x0 - left) * 3,
               s->pixels + (size_t)(y - first) * line + (size_t)(x0 - (int64_t)xoff) * 3,
               (size_t)(x1 - x0) * 3);
    int ok = place(padded, padded_line, down, across, (int)box.flip, o->planar, o->simd, out, out_h, out_w, s);
    free(padded);
    return ok ? CROP_OK : CROP_MEMORY;
}


/* Decode, crop, resize and store one sample; a CROP_* status. `cinfo` is ready for reuse
 * afterwards whatever happened (jpeg_abort_decompress). libjpeg's errors jump here, to a
 * frame that is live while decode_box runs; the caller's target is put back before any
 * return, so an error after it (jpeg_destroy_decompress) lands in the caller's frame. */
static int crop_bytes(j_decompress_ptr cinfo, Errors *errors, Bytes b, Box box, uint8_t *out,
                      int out_h, int out_w, int64_t want_h, int64_t want_w, int dct,
                      const Options *o, Scratch *s) {
    jmp_buf here;
    jmp_buf *const outer = errors->jump;
    errors->jump = &here;
    if (setjmp(here) == 0) {
        int status = decode_box(cinfo, b, box, out, out_h, out_w, want_h, want_w, dct, o, s);
        errors->jump = outer;
        return status;
    }
    errors->jump = outer; /* an error in the abort itself goes to the caller's frame */
    jpeg_abort_decompress(cinfo);
    return CROP_LIBJPEG;
}

/* crop_bytes(), of only the restart intervals around the box where the bytes are verified
 * and cut by restart markers. */
static int crop_one(j_decompress_ptr cinfo, Errors *errors, Bytes b, Box box, uint8_t *out,
                    int out_h, int out_w, int64_t want_h, int64_t want_w, int dct,
                    const Options *o, Scratch *s) {
    Restarts restarts = {0};
    Bytes part;
    if (o->verified && box.top >= 0 && box.left >= 0 && box.top + box.height <= want_h &&
        box.left + box.width <= want_w && read_restarts(b, &restarts) && restarts.width == want_w &&
        restarts.height == want_h) {
        int cut = restart_part(b, &restarts, &box, &want_h, &want_w, s, &part);
        if (cut < 0) return CROP_MEMORY;
        if (cut) b = part;
    }
    return crop_bytes(cinfo, errors, b, box, out, out_h, out_w, want_h, want_w, dct, o, s);
}


void crop_all(const Batch *batch, const Options *o) {
    struct jpeg_decompress_struct cinfo;
    struct jpeg_progress_mgr progress;
    Errors errors;
    jmp_buf here;
    volatile int created = 0; /* read after a longjmp */
    Scratch *const scratch = thread_scratch();
    const size_t row_bytes = (size_t)batch->out_h * batch->out_w * 3;
    cinfo.err = errors_init(&errors, &progress);
    errors.jump = &here; /* this frame's: live until crop_all returns */
    if (scratch != NULL && setjmp(here) == 0) {
        jpeg_create_decompress(&cinfo);
        created = 1;
        cinfo.progress = &progress;
        for (;;) { /* calls sharing `next` take the rows one at a time, in order */
            int64_t k = (int64_t)__atomic_fetch_add(batch->next, 1, __ATOMIC_RELAXED);
            if (k >= batch->m) break;
            int64_t row = batch->rows[k];
            const int64_t *bx = batch->boxes + row * 5;
            Box box = {bx[0], bx[1], bx[2], bx[3], bx[4]};
            batch->status[row] =
                box.height > 0 && box.width > 0
                    ? crop_one(&cinfo, &errors, batch->bytes[k], box, batch->out + row * row_bytes,
                               batch->out_h, batch->out_w, batch->sizes[row * 2],
                               batch->sizes[row * 2 + 1],
                               batch->dcts != NULL ? (int)batch->dcts[row] : 1, o, scratch)
                    : CROP_UNSUPPORTED;
        }
        created = 0;
        jpeg_destroy_decompress(&cinfo);
    } else { /* no scratch, or libjpeg failed outside a sample: the rows left, not decoded */
        if (created) { /* an error inside jpeg_destroy_decompress comes back with created 0 */
            created = 0;
            jpeg_destroy_decompress(&cinfo);
        }
        for (int64_t k; (k = (int64_t)__atomic_fetch_add(batch->next, 1, __ATOMIC_RELAXED)) < batch->m;)
            batch->status[batch->rows[k]] = CROP_MEMORY;
    }
    errors.jump = NULL;
    if (scratch != NULL) free_buffers(scratch, KEEP_BYTES);
}
