/*
 * thoughts.h - a chat reply printed as it streams, with a thinking model's
 * thoughts (<think> ... </think>, serve/reasoning.h) apart from its answer:
 * the thoughts to stderr (dimmed on a terminal), the answer to stdout, so
 * a redirected stdout holds only answers. `lmserv chat` and `lmserv run
 * --chat` print their replies with it.
 */
#ifndef LMS_APP_THOUGHTS_H
#define LMS_APP_THOUGHTS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/sbuf.h"
#include "serve/reply.h"

/* The template switches and the thoughts' treatment, from the command line. */
typedef struct app_think_opts {
    const char *kwargs_json; /* --chat-template-kwargs JSON */
    const char *reasoning;   /* --reasoning on|off|auto */
    const char *format;      /* --reasoning-format none|auto|deepseek */
} app_think_opts;

#define APP_THINK_USAGE \
    "[--reasoning on|off|auto] [--chat-template-kwargs JSON] [--reasoning-format none|auto|deepseek]"

/* argv[*i] if it is one of the options above: 1 taken (its value too), 0
 * not one, -1 its value missing. */
int app_think_arg(int argc, char **argv, int *i, app_think_opts *o);
/* The template variables (*kwargs, NULL for none; json_decref it) and
 * whether thoughts are taken apart (*split: not --reasoning-format none).
 * Returns -1 with a message on stderr naming the bad value. */
int app_think_setup(const app_think_opts *o, const char *cmd, json_t **kwargs, bool *split);

/* A reply being printed. */
typedef struct app_reply {
    sbuf text; /* the reply so far */
    reply_cut cut;
    bool dim;         /* thoughts dimmed (stderr is a terminal) */
    bool in_thoughts; /* thoughts written, their line not ended yet */
} app_reply;

/* split: thoughts apart; open: the prompt opened <think> (app_chat_tokens). */
void app_reply_init(app_reply *r, bool split, bool open);
/* Appends a piece and prints what of the reply is now certain; false when
 * out of memory. */
bool app_reply_add(app_reply *r, const char *piece, size_t n);
/* The reply is complete: prints the rest; *w (when not NULL) gets its
 * thoughts and answer (offsets into r->text.p). */
void app_reply_end(app_reply *r, reply_part *w);
void app_reply_free(app_reply *r);

#endif
