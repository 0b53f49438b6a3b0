/* libjpeg's errors as jumps (errors.h). */
#include "errors.h"

#include <stdlib.h>

static void jump(j_common_ptr cinfo) {
    jmp_buf *target = ((Errors *)cinfo->err)->jump;
    if (target == NULL) abort(); /* a libjpeg call outside any frame that set one: a bug */
    longjmp(*target, 1);
}

static void on_error(j_common_ptr cinfo) { jump(cinfo); }

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) jump(cinfo); /* a warning: as an error */
}

static void on_progress(j_common_ptr cinfo) {
    if (cinfo->is_decompressor && ((j_decompress_ptr)cinfo)->input_scan_number > MAX_SCANS)
        jump(cinfo);
}

struct jpeg_error_mgr *errors_init(Errors *errors, struct jpeg_progress_mgr *progress) {
    struct jpeg_error_mgr *err = jpeg_std_error(&errors->pub);
    err->error_exit = on_error;
    err->emit_message = on_message;
    errors->jump = NULL;
    if (progress != NULL) progress->progress_monitor = on_progress;
    return err;
}
