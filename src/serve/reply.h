/*
 * reply.h - the parts of a chat reply: thoughts (reasoning.h), content and
 * function calls (toolcall.h), and, while it streams, how much of each can
 * go out. Every chat dialect (OpenAI chat, Responses, Ollama) cuts its
 * replies with this, so they agree on what is thought, said and called.
 *
 * Pure functions over text: no I/O; only toolcall_parse allocates.
 */
#ifndef LMS_SERVE_REPLY_H
#define LMS_SERVE_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include "serve/reasoning.h"
#include "serve/toolcall.h"

typedef struct reply_cut {
    bool thoughts;     /* thoughts are taken apart from the content */
    bool tools;        /* the content is searched for calls */
    const char *const *names; /* the request's function names (toolcall.h), or NULL; borrowed */
    reasoning rs;
    size_t r_sent;     /* streamed: text up to here went out as thoughts */
    size_t c_sent;     /* streamed: text up to here went out as content (or was thoughts) */
    size_t c_skip;     /* bytes of the answer before its content (toolcall.h's wrappers) */
} reply_cut;

/* What can go out now: thoughts text[r_from, r_from + r_n), content
 * text[c_from, c_from + c_n). */
typedef struct reply_part {
    size_t r_from, r_n;
    size_t c_from, c_n;
} reply_part;

/* open: the prompt opened <think> (reasoning_prompt_open). names: the
 * request's function names, NULL-terminated (toolcall_names), or NULL
 * where not known; borrowed, kept until the last reply_cut_next. */
void reply_cut_init(reply_cut *rc, bool thoughts, bool open, bool tools,
                    const char *const *names);
/* The reply so far is text[0, n) (longer than last time); returns what of
 * it has not gone out yet and now can, and counts it as sent. tc: the
 * reply is complete; everything goes out but the calls, which are read
 * into *tc (n = 0: none; free with toolcalls_free). A reply cut afresh
 * and given the whole text with tc gives the whole reply's parts. */
void reply_cut_next(reply_cut *rc, const char *text, size_t n, reply_part *out, toolcalls *tc);

/* After the last reply_cut_next (with tc): the whole reply's thoughts and
 * content (less the calls), n the text's length. */
void reply_cut_whole(const reply_cut *rc, size_t n, reply_part *out);

#endif
