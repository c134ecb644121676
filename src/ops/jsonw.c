/*
 * jsonw.c - bounded text buffer and JSON string escaper; see jsonw.h.
 *
 * UTF-8 validation follows the well-formed byte sequences table of the
 * Unicode standard (ch. 3, table 3-7); each ill-formed byte becomes one
 * U+FFFD, which keeps the decoder simple and never skips a valid character.
 */
#include "ops/jsonw.h"

#include "base/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void lms_jsonw_init(lms_jsonw *w, char *buf, size_t cap, size_t limit)
{
    w->p = buf;
    w->len = 0;
    w->cap = cap;
    w->limit = limit > cap ? limit : cap;
    w->heap = false;
    w->overflow = false;
    buf[0] = '\0';
}

void lms_jsonw_deinit(lms_jsonw *w)
{
    if (w->heap)
        free(w->p);
    w->p = NULL;
    w->heap = false;
    w->len = w->cap = 0;
}

/* Makes room for `extra` more bytes plus the NUL; false if over the limit. */
static bool reserve(lms_jsonw *w, size_t extra)
{
    size_t need = w->len + extra + 1;
    if (need < w->len || need > w->limit)
        return false;
    if (need <= w->cap)
        return true;
    size_t ncap = w->cap * 2 > need ? w->cap * 2 : need;
    if (ncap > w->limit)
        ncap = w->limit;
    char *np = w->heap ? realloc(w->p, ncap) : malloc(ncap);
    if (!np)
        return false;
    if (!w->heap)
        memcpy(np, w->p, w->len + 1);
    w->p = np;
    w->cap = ncap;
    w->heap = true;
    return true;
}

bool lms_jsonw_raw(lms_jsonw *w, const char *s, size_t n)
{
    if (!reserve(w, n)) {
        w->overflow = true;
        return false;
    }
    memcpy(w->p + w->len, s, n);
    w->len += n;
    w->p[w->len] = '\0';
    return true;
}

bool lms_jsonw_cstr(lms_jsonw *w, const char *s)
{
    return lms_jsonw_raw(w, s, strlen(s));
}

bool lms_jsonw_printf(lms_jsonw *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(w->p + w->len, w->cap - w->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        w->p[w->len] = '\0';
        w->overflow = true;
        return false;
    }
    if ((size_t)n < w->cap - w->len) {
        w->len += (size_t)n;
        return true;
    }
    w->p[w->len] = '\0'; /* drop the partial text */
    if (!reserve(w, (size_t)n)) {
        w->overflow = true;
        return false;
    }
    va_start(ap, fmt);
    vsnprintf(w->p + w->len, w->cap - w->len, fmt, ap);
    va_end(ap);
    w->len += (size_t)n;
    return true;
}

int lms_jsonw_result(lms_jsonw *w)
{
    if (w->overflow || w->len > (size_t)INT32_MAX) {
        w->len = 0;
        w->p[0] = '\0';
        return LMS_ERR_LIMIT;
    }
    return (int)w->len;
}

bool lms_jsonw_f64(lms_jsonw *w, double v)
{
    if (!isfinite(v))
        return lms_jsonw_raw(w, "null", 4);
    return lms_jsonw_printf(w, "%.15g", v);
}

size_t lms_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned char c = s[0];
    size_t len;
    uint32_t v;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the 2nd byte */

    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0; /* overlong */
        if (c == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07;
        if (c == 0xF0)
            lo = 0x90; /* overlong */
        if (c == 0xF4)
            hi = 0x8F; /* above U+10FFFF */
    } else {
        *cp = 0xFFFD;
        return 1;
    }
    if (n < len || s[1] < lo || s[1] > hi) {
        *cp = 0xFFFD;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if (i > 1 && (s[i] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* Escaped form of one character into out[8]; returns its length. Valid
 * multi-byte characters are copied as they are (src, n bytes). */
static size_t escape_char(uint32_t cp, const unsigned char *src, size_t n, char *out)
{
    static const char hex[] = "0123456789abcdef";
    switch (cp) {
    case '"': memcpy(out, "\\\"", 2); return 2;
    case '\\': memcpy(out, "\\\\", 2); return 2;
    case '\n': memcpy(out, "\\n", 2); return 2;
    case '\r': memcpy(out, "\\r", 2); return 2;
    case '\t': memcpy(out, "\\t", 2); return 2;
    case '\b': memcpy(out, "\\b", 2); return 2;
    case '\f': memcpy(out, "\\f", 2); return 2;
    }
    /* C0 controls, DEL, and the two JavaScript line terminators. */
    if (cp < 0x20 || cp == 0x7F || cp == 0x2028 || cp == 0x2029) {
        memcpy(out, "\\u", 2);
        out[2] = hex[(cp >> 12) & 0xF];
        out[3] = hex[(cp >> 8) & 0xF];
        out[4] = hex[(cp >> 4) & 0xF];
        out[5] = hex[cp & 0xF];
        return 6;
    }
    if (cp == 0xFFFD && n == 1) { /* replacement for an ill-formed byte */
        memcpy(out, "\xEF\xBF\xBD", 3);
        return 3;
    }
    memcpy(out, src, n);
    return n;
}

/* Length of the run of bytes at s that need no escaping. */
static size_t plain_run(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n && s[i] >= 0x20 && s[i] < 0x7F && s[i] != '"' && s[i] != '\\')
        i++;
    return i;
}

bool lms_jsonw_str(lms_jsonw *w, const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    if (!reserve(w, 2)) {
        w->overflow = true;
        return false;
    }
    w->p[w->len++] = '"';
    size_t i = 0;
    bool cut = false;
    while (i < n && !cut) {
        size_t run = plain_run(s + i, n - i);
        if (run) {
            /* Take as much of the run as fits, keeping a byte for the quote. */
            size_t room = w->limit - w->len - 2;
            size_t take = run < room ? run : room;
            if (!reserve(w, take + 1))
                take = 0; /* allocation failed */
            memcpy(w->p + w->len, s + i, take);
            w->len += take;
            i += take;
            cut = take < run;
            continue;
        }
        uint32_t cp;
        size_t used = lms_utf8_decode(s + i, n - i, &cp);
        char esc[8];
        size_t elen = escape_char(cp, s + i, used, esc);
        if (!reserve(w, elen + 1)) {
            cut = true;
            break;
        }
        memcpy(w->p + w->len, esc, elen);
        w->len += elen;
        i += used;
    }
    w->p[w->len++] = '"';
    w->p[w->len] = '\0';
    if (cut)
        w->overflow = true;
    return !cut;
}
