/* The converter's JPEG encoder: tjCompress2's settings, plus restart markers. */
#ifndef IMGPACK_ENCODER_H
#define IMGPACK_ENCODER_H

#include <stdint.h>

/* RGB rows as a baseline 4:2:0 JPEG in `*jpeg` (malloc'd by jpeg_mem_dest, the caller frees
 * it, also on failure), with a restart marker every `restart` MCUs (0: none). tjCompress2's
 * settings, so that without restarts the bytes are TurboJPEG's: its fast forward DCT below
 * quality 96. 0: libjpeg failed (out of memory). */
int compress(const uint8_t *pixels, int height, int width, int quality, int restart,
             unsigned char **jpeg, unsigned long *size);

#endif
