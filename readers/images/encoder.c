/* The converter's JPEG encoder (encoder.h). */
#include "encoder.h"

#include <stddef.h>

#include "errors.h"

int compress(const uint8_t *pixels, int height, int width, int quality, int restart,
             unsigned char **jpeg, unsigned long *size) {
    struct jpeg_compress_struct cinfo;
    Errors errors;
    jmp_buf here;
    volatile int created = 0; /* read after a longjmp */
    cinfo.err = errors_init(&errors, NULL);
    errors.jump = &here; /* this frame's, until it returns */
    if (setjmp(here)) {
        if (created) { /* an error inside jpeg_destroy_compress lands here with created 0 */
            created = 0;
            jpeg_destroy_compress(&cinfo);
        }
        return 0;
    }
    jpeg_create_compress(&cinfo);
    created = 1;
    jpeg_mem_dest(&cinfo, jpeg, size);
    cinfo.image_width = (JDIMENSION)width;
    cinfo.image_height = (JDIMENSION)height;
    cinfo.input_components = 3;
    cinfo.in_color_space = JCS_RGB;
    jpeg_set_defaults(&cinfo); /* YCbCr, luma sampled 2x2: 4:2:0 */
    jpeg_set_quality(&cinfo, quality, TRUE);
    cinfo.dct_method = quality >= 96 ? JDCT_ISLOW : JDCT_FASTEST;
    cinfo.restart_interval = (unsigned)restart;
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)cinfo.next_scanline * (size_t)width * 3);
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    created = 0;
    jpeg_destroy_compress(&cinfo);
    return 1;
}
