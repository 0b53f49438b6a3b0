/* Buffers one decode thread reuses across its samples and calls (grown, never shrunk while
 * a call runs): the ground floor of the kernel, beside the resize taps. */
#ifndef IMGPACK_SCRATCH_H
#define IMGPACK_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

#include "kernel_types.h"

struct Huffman; /* huffman.h's decoder state; only freed here */

typedef struct Scratch {
    uint8_t *pixels; /* the decoded rows of the box's columns */
    size_t pixels_n;
    uint8_t *box; /* a padded box, or the horizontally resized rows */
    size_t box_n;
    int32_t *acc;
    size_t acc_n;
    uint8_t *rows; /* the resized HWC rows, before they are split into planes */
    size_t rows_n;
    uint8_t *part; /* restart_part()'s smaller JPEG */
    size_t part_n;
    size_t *ends; /* where each restart interval's data ends */
    size_t ends_n;
    struct Huffman *huffman; /* verified bytes' entropy decoder, made on first use */
} Scratch;

/* Each thread's Scratch outlives its calls, so that a thread decoding one image a call
 * (the converter, verified full decodes) neither maps fresh buffers nor derives the Huffman
 * tables again each time. Buffers over KEEP_BYTES are freed when a call ends, so a thread
 * holds at most a few megabytes after a large image. */
enum { KEEP_BYTES = 4 << 20 };

/* Once, at import: the thread-local key. 0 when it could not be made (thread_scratch then
 * gives NULL). */
int scratch_init(void);

/* This thread's Scratch; NULL when out of memory. */
Scratch *thread_scratch(void);

/* Free the buffers over `over` bytes. */
void free_buffers(Scratch *s, size_t over);

/* `*buffer` holds at least `need` + SLACK bytes; 0 when out of memory (it is left as it was). */
int grow(void **buffer, size_t *have, size_t need);

#endif
