/* libjpeg's errors and warnings as a jump to the innermost live frame that asked for them.
 *
 * libjpeg's error exit must not return, so it longjmps; the target is a pointer that each
 * frame calling libjpeg sets to its own jmp_buf and puts back before it returns (the
 * pattern of decode_box.c's crop_bytes and crop_all, and encoder.c), so it never points at
 * a returned frame: an error in jpeg_destroy_decompress lands in the frame that called it.
 * Out of memory in the kernel's own buffers is a returned status, never a jump. */
#ifndef IMGPACK_ERRORS_H
#define IMGPACK_ERRORS_H

#include <setjmp.h>
#include <stdio.h>

#include <jpeglib.h>

#include "kernel_types.h"

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf *jump; /* the live frame to return to; set before the first libjpeg call */
} Errors;

/* libjpeg's standard manager with every error, every warning and a progressive scan past
 * MAX_SCANS (the progress monitor, when given) longjmping to *errors->jump; for cinfo->err. */
struct jpeg_error_mgr *errors_init(Errors *errors, struct jpeg_progress_mgr *progress);

#endif
