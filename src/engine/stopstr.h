/*
 * stopstr.h - finds stop strings in streamed text without ever emitting a
 * part of one.
 *
 * Text pieces go in; what may be shown comes out. The matcher holds back
 * the longest tail of the text that is still a prefix of some stop string,
 * and reports a hit as soon as a whole stop string has been seen (the stop
 * string itself and anything after it are dropped).
 *
 * Owner: one sequence.
 */
#ifndef LMS_STOPSTR_H
#define LMS_STOPSTR_H

#include <stdbool.h>
#include <stddef.h>

#define LMS_MAX_STOP 8

typedef struct lms_stopstr {
    char *stop[LMS_MAX_STOP]; /* owned copies */
    int n_stop;
    size_t max_len;
    char *held;               /* text not yet released */
    size_t n_held, cap_held;
    size_t shift;             /* bytes at the front of held already emitted */
    bool hit;
    int hit_index;            /* after a hit: which stop string, by its index in the
                               * list given to init */
    signed char index[LMS_MAX_STOP]; /* stop[i] was given at index[i] */
} lms_stopstr;

/* Copies the stop strings (empty ones are ignored). < 0 on bad input. */
int lms_stopstr_init(lms_stopstr *m, const char *const *stop, int n_stop);
void lms_stopstr_deinit(lms_stopstr *m);

/* Feeds text; *out and *n_out receive the bytes that may be emitted now (a
 * view into the matcher, valid until the next call). Returns true when a
 * stop string completed (generation should end). */
bool lms_stopstr_feed(lms_stopstr *m, const char *text, size_t n, const char **out, size_t *n_out);
/* Releases held text at the end of generation (none after a hit). */
void lms_stopstr_flush(lms_stopstr *m, const char **out, size_t *n_out);
/* End of a stream: the last bytes (tail, e.g. what the detokenizer still
 * held) go through the matcher, then everything still held is released.
 * Returns a malloc'd NUL-terminated string of *n bytes (possibly empty), or
 * NULL when out of memory. */
char *lms_stopstr_finish(lms_stopstr *m, const char *tail, size_t n_tail, size_t *n);

#endif
