/* The decode threads' reused buffers (scratch.h). */
#include "scratch.h"

#include <pthread.h>
#include <stdlib.h>

static pthread_key_t scratch_key;
static int scratch_key_ok;


void free_buffers(Scratch *s, size_t over) {
    void **buffers[] = {(void **)&s->pixels, (void **)&s->box, (void **)&s->acc,
                        (void **)&s->rows,   (void **)&s->part, (void **)&s->ends};
    size_t *sizes[] = {&s->pixels_n, &s->box_n, &s->acc_n, &s->rows_n, &s->part_n, &s->ends_n};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        if (*sizes[i] > over) {
            free(*buffers[i]);
            *buffers[i] = NULL;
            *sizes[i] = 0;
        }
}

static void free_scratch(void *p) {
    Scratch *s = p;
    free_buffers(s, 0);
    free(s->huffman);
    free(s);
}

Scratch *thread_scratch(void) {
    if (!scratch_key_ok) return NULL;
    Scratch *s = pthread_getspecific(scratch_key);
    if (s == NULL && (s = calloc(1, sizeof *s)) != NULL && pthread_setspecific(scratch_key, s) != 0) {
        free(s);
        s = NULL;
    }
    return s;
}

int grow(void **buffer, size_t *have, size_t need) {
    need += SLACK;
    if (*have >= need) return 1;
    void *grown = realloc(*buffer, need);
    if (grown == NULL) return 0;
    *buffer = grown;
    *have = need;
    return 1;
}

int scratch_init(void) {
    if (!scratch_key_ok) scratch_key_ok = pthread_key_create(&scratch_key, free_scratch) == 0;
    return scratch_key_ok;
}
