/*
 * sbuf.c - the growable byte buffer (sbuf.h).
 */
#include "base/sbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sbuf_free(sbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    b->oom = false;
}

static int reserve(sbuf *b, size_t extra)
{
    if (b->oom)
        return -1;
    size_t need = b->n + extra + 1;
    if (need < b->n) {
        b->oom = true;
        return -1;
    }
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return -1;
        }
        cap *= 2;
    }
    char *np = realloc(b->p, cap);
    if (!np) {
        b->oom = true;
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

int sbuf_add(sbuf *b, const void *p, size_t n)
{
    if (reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int sbuf_adds(sbuf *b, const char *s)
{
    return sbuf_add(b, s, strlen(s));
}

int sbuf_addf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || reserve(b, (size_t)n) < 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
    return 0;
}
