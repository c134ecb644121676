/*
 * tokenizer_detok.c - streaming detokenizer: token ids in, valid UTF-8 out.
 *
 * A model emits characters split over tokens (an emoji as four byte
 * tokens, or a BPE token ending inside a character), and may emit bytes
 * that never form a character. Each push appends the token's piece to the
 * bytes held back so far and classifies the result (tok_utf8_check):
 *
 *   complete valid characters        -> written as they are
 *   a maximal invalid subpart        -> written as U+FFFD (EF BF BD)
 *   a valid but unfinished character -> held back (at most 3 bytes) until
 *      at the very end                  the next push or the flush
 *
 * Called by the engine, one lms_detok per generated sequence.
 */
#include <string.h>

#include "base/err.h"
#include "model/tokenizer_int.h"

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

void lms_detok_init(lms_detok *d, const lms_tokenizer *t, bool strip_leading_space_once)
{
    memset(d, 0, sizeof *d);
    d->t = t;
    d->strip_space = strip_leading_space_once;
}

size_t lms_detok_max_out(const lms_tokenizer *t)
{
    return 3 * (lms_tokenizer_max_piece(t) + sizeof((lms_detok *)0)->pend);
}

/* Scans buf[0..n): the bytes before a held-back tail (*ready), the length
 * they will have once invalid parts are replaced (*out_len); returns true
 * when some part is invalid. */
static bool detok_scan(const char *buf, size_t n, size_t *ready, size_t *out_len)
{
    const unsigned char *u = (const unsigned char *)buf;
    size_t i = 0, len = 0;
    bool invalid = false;
    while (i < n) {
        int c = tok_utf8_check(u + i, n - i);
        if (c == 0)
            break;
        i += (size_t)(c > 0 ? c : -c);
        len += c > 0 ? (size_t)c : sizeof replacement;
        invalid |= c < 0;
    }
    *ready = i;
    *out_len = len;
    return invalid;
}

/* Rewrites buf[0..n) with each invalid subpart replaced, into buf itself
 * (out_len <= cap). The input is first moved to the end of the buffer;
 * since no part gets shorter, the write position never passes the read
 * position. */
static void detok_replace(char *buf, size_t n, size_t cap)
{
    size_t r = cap - n, w = 0;
    memmove(buf + r, buf, n);
    while (r < cap) {
        int c = tok_utf8_check((const unsigned char *)buf + r, cap - r);
        if (c > 0) {
            memmove(buf + w, buf + r, (size_t)c);
            w += (size_t)c;
            r += (size_t)c;
        } else { /* invalid; c == 0 is a bad part cut short by the held tail */
            memcpy(buf + w, replacement, sizeof replacement);
            w += sizeof replacement;
            r += c < 0 ? (size_t)-c : cap - r;
        }
    }
}

int lms_detok_push(lms_detok *d, int32_t id, char *out, size_t cap)
{
    size_t np = d->n_pend;
    if (cap < np)
        return LMS_ERR_LIMIT;
    memcpy(out, d->pend, np);
    int k = lms_token_to_piece(d->t, id, d->special, out + np, cap - np);
    if (k < 0)
        return k;
    bool strip = d->strip_space && k > 0;
    if (strip && out[np] == ' ')
        memmove(out + np, out + np + 1, (size_t)--k);
    size_t total = np + (size_t)k, ready, out_len;
    bool invalid = detok_scan(out, total, &ready, &out_len);
    if (out_len > cap)
        return LMS_ERR_LIMIT;
    /* commit: nothing below fails */
    d->n_pend = (uint8_t)(total - ready);
    memcpy(d->pend, out + ready, d->n_pend);
    if (strip)
        d->strip_space = false;
    if (invalid)
        detok_replace(out, ready, cap);
    return (int)out_len;
}

int lms_detok_flush(lms_detok *d, char *out, size_t cap)
{
    if (d->n_pend == 0)
        return 0;
    if (cap < sizeof replacement)
        return LMS_ERR_LIMIT;
    memcpy(out, replacement, sizeof replacement);
    d->n_pend = 0;
    return (int)sizeof replacement;
}
