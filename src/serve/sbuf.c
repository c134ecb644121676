/*
 * sbuf.c - a growable byte buffer for response bodies, frames and
 * Prometheus text, and a UTF-8 scrubber for bytes that must become JSON
 * strings (token pieces may hold half a character).
 *
 * A failed append marks the buffer `oom` and keeps what it had, so a
 * builder can append freely and check once at the end.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_int.h"

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

/* Length of the well-formed UTF-8 sequence at s (Unicode table 3-7), or 0. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

int sbuf_add_utf8(sbuf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        size_t k = utf8_seq(u + i, n - i);
        if (k) {
            i += k;
            continue;
        }
        if (sbuf_add(b, s + run, i - run) < 0 || sbuf_add(b, "\xEF\xBF\xBD", 3) < 0)
            return -1;
        run = ++i;
    }
    return sbuf_add(b, s + run, n - run);
}
