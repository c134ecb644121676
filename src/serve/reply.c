/*
 * reply.c - thoughts, content and calls of a chat reply (see reply.h).
 */
#include "serve/reply.h"

#include <string.h>

void reply_cut_init(reply_cut *rc, bool thoughts, bool open, bool tools,
                    const char *const *names)
{
    memset(rc, 0, sizeof *rc);
    rc->thoughts = thoughts;
    rc->tools = tools;
    rc->names = names;
    reasoning_init(&rc->rs, thoughts && open);
}

void reply_cut_next(reply_cut *rc, const char *text, size_t n, reply_part *out, toolcalls *tc)
{
    const bool final = tc != NULL;
    size_t c0 = 0;
    memset(out, 0, sizeof *out);
    if (final)
        *tc = (toolcalls){0};
    if (rc->thoughts) {
        reasoning_feed(&rc->rs, text, n, final);
        out->r_from = rc->r_sent > rc->rs.r0 ? rc->r_sent : rc->rs.r0;
        out->r_n = rc->rs.r1 > out->r_from ? rc->rs.r1 - out->r_from : 0;
        rc->r_sent = out->r_from + out->r_n;
        if (rc->rs.phase == 0) { /* whether it opens with thoughts is not known yet */
            out->c_from = rc->c_sent;
            return;
        }
        c0 = reasoning_answer(&rc->rs, n);
    }
    if (rc->c_sent < c0)
        rc->c_sent = c0;
    size_t upto = n;
    if (rc->tools && final && toolcall_parse(text + c0, n - c0, rc->names, tc) < 0)
        *tc = (toolcalls){.content_from = rc->c_skip, .content_len = n - c0 - rc->c_skip};
    if (rc->tools) {
        if (final) {
            rc->c_skip = tc->content_from;
            upto = c0 + tc->content_from + tc->content_len;
        } else {
            upto = c0 + toolcall_safe_len(text + c0, n - c0, rc->names, &rc->c_skip);
        }
        if (rc->c_sent < c0 + rc->c_skip) /* a wrapper before the content */
            rc->c_sent = c0 + rc->c_skip;
    }
    out->c_from = rc->c_sent;
    out->c_n = upto > rc->c_sent ? upto - rc->c_sent : 0;
    rc->c_sent += out->c_n;
}

void reply_cut_whole(const reply_cut *rc, size_t n, reply_part *out)
{
    memset(out, 0, sizeof *out);
    if (rc->thoughts) {
        out->r_from = rc->rs.r0;
        out->r_n = rc->rs.r1 - rc->rs.r0;
        out->c_from = reasoning_answer(&rc->rs, n);
    }
    out->c_from += rc->c_skip;
    out->c_n = rc->c_sent > out->c_from ? rc->c_sent - out->c_from : 0;
}
