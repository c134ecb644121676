/*
 * sbuf.h - a growable byte buffer, always NUL-terminated after an append.
 *
 * A failed append marks the buffer `oom` and keeps what it had, so a
 * builder can append freely and check once at the end.
 */
#ifndef LMS_BASE_SBUF_H
#define LMS_BASE_SBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct sbuf {
    char *p;     /* NUL-terminated when n > 0 or after sbuf_addf */
    size_t n, cap;
    bool oom;    /* an append failed; contents are truncated */
} sbuf;

void sbuf_free(sbuf *b);
/* Appends p[0, n); < 0 when out of memory (then b->oom). */
int sbuf_add(sbuf *b, const void *p, size_t n);
int sbuf_adds(sbuf *b, const char *s);
int sbuf_addf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
