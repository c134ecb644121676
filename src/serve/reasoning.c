/*
 * reasoning.c - thoughts apart from the answer (see reasoning.h).
 */
#include "serve/reasoning.h"

#include <string.h>

#include "base/textscan.h"
#include "model/markers.h"

/* The pairs of tags, by rs->tag: each opening is closed by its own
 * closing tag only. */
static const struct {
    const char *open, *close;
    size_t open_len, close_len;
} TAGS[] = {
    {LMS_MARK_THINK_OPEN, LMS_MARK_THINK_CLOSE, LIT_LEN(LMS_MARK_THINK_OPEN),
     LIT_LEN(LMS_MARK_THINK_CLOSE)},
    {LMS_MARK_COHERE_THINK_OPEN, LMS_MARK_COHERE_THINK_CLOSE,
     LIT_LEN(LMS_MARK_COHERE_THINK_OPEN), LIT_LEN(LMS_MARK_COHERE_THINK_CLOSE)},
};
#define N_TAGS (sizeof TAGS / sizeof TAGS[0])


int reasoning_format_parse(const char *name)
{
    if (!name)
        return -1;
    if (!strcmp(name, "none"))
        return REASONING_NONE;
    if (!strcmp(name, "auto") || !strcmp(name, "deepseek"))
        return REASONING_DEEPSEEK;
    if (!strcmp(name, "deepseek-legacy"))
        return REASONING_LEGACY;
    return -1;
}

bool reasoning_prompt_open(const char *prompt, size_t len)
{
    const size_t k = TAGS[0].open_len;
    while (len > 0 && text_is_space(prompt[len - 1]))
        len--;
    return len >= k && !memcmp(prompt + len - k, TAGS[0].open, k);
}

void reasoning_init(reasoning *rs, bool open)
{
    memset(rs, 0, sizeof *rs);
    rs->lead = true;
    if (open)
        rs->phase = 1;
}

/* The longest k < lit_len whose last k bytes of s[from, n) are lit's first k:
 * a tag that may still be being written. */
static size_t partial_tail(const char *s, size_t from, size_t n, const char *lit, size_t lit_len)
{
    for (size_t k = lit_len - 1; k > 0; k--)
        if (n - from >= k && !memcmp(s + n - k, lit, k))
            return k;
    return 0;
}

/* Phase 0: does the reply open with one of the tags? Returns false while
 * unknown. */
static bool decide_start(reasoning *rs, const char *t, size_t n, bool final)
{
    const size_t i = text_skip_space(t, 0, n), m = n - i;
    bool may = m == 0; /* the text so far may still become an opening tag */
    for (int g = 0; g < (int)N_TAGS; g++) {
        const size_t k = TAGS[g].open_len;
        if (m >= k && !memcmp(t + i, TAGS[g].open, k)) {
            rs->phase = 1, rs->tag = g;
            rs->r0 = rs->r1 = rs->scan = i + k;
            return true;
        }
        may = may || (m < k && !memcmp(t + i, TAGS[g].open, m));
    }
    if (!final && may)
        return false;
    rs->phase = 2, rs->c0 = 0, rs->lead = false; /* all answer, as written */
    return true;
}

static void in_thoughts(reasoning *rs, const char *t, size_t n, bool final)
{
    if (rs->lead) {
        rs->r0 = rs->r1 = text_skip_space(t, rs->r0, n);
        if (rs->scan < rs->r0)
            rs->scan = rs->r0;
        rs->lead = rs->r0 == n;
    }
    const char *close = TAGS[rs->tag].close;
    const size_t close_len = TAGS[rs->tag].close_len;
    const char *p = memmem(t + rs->scan, n - rs->scan, close, close_len);
    size_t end = p       ? (size_t)(p - t)
                 : final ? n
                         : n - partial_tail(t, rs->scan, n, close, close_len);
    size_t r1 = end;
    while (r1 > rs->r0 && text_is_space(t[r1 - 1]))
        r1--;
    if (r1 > rs->r1)
        rs->r1 = r1;
    if (!p) {
        rs->scan = end;
        return;
    }
    rs->phase = 2, rs->lead = true;
    rs->c0 = end + close_len;
}

void reasoning_feed(reasoning *rs, const char *text, size_t len, bool final)
{
    if (rs->phase == 0 && !decide_start(rs, text, len, final))
        return;
    if (rs->phase == 1)
        in_thoughts(rs, text, len, final);
    if (rs->phase == 2 && rs->lead) {
        rs->c0 = text_skip_space(text, rs->c0, len);
        rs->lead = rs->c0 == len;
    }
}

size_t reasoning_answer(const reasoning *rs, size_t len)
{
    return rs->phase == 2 && rs->c0 < len ? rs->c0 : len;
}
