/*
 * sbuf.c - the server's use of the growable byte buffer (base/sbuf.h): a
 * UTF-8 scrubber for bytes that must become JSON strings (token pieces may
 * hold half a character).
 */
#include <stdlib.h>
#include <string.h>

#include "serve/serve_int.h"

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
