/*
 * thoughts.c - a streamed chat reply's thoughts and answer printed apart
 * (thoughts.h), cut by the server's reply cutter (serve/reply.h).
 */
#include "app/thoughts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/args.h"
#include "model/template.h"
#include "serve/reasoning.h"

int app_think_arg(int argc, char **argv, int *i, app_think_opts *o)
{
    const char *a = argv[*i];
    const char **slot = !strcmp(a, "--chat-template-kwargs") ? &o->kwargs_json
                        : !strcmp(a, "--reasoning")          ? &o->reasoning
                        : !strcmp(a, "--reasoning-format")   ? &o->format
                                                             : NULL;
    if (!slot)
        return 0;
    return (*slot = args_value(argc, argv, i)) ? 1 : -1;
}

int app_think_setup(const app_think_opts *o, const char *cmd, json_t **kwargs, bool *split)
{
    *kwargs = NULL;
    const int rf = o->format ? reasoning_format_parse(o->format) : REASONING_DEEPSEEK;
    if (rf < 0 || rf == REASONING_LEGACY) {
        fprintf(stderr, "lmserv %s: reasoning format '%s': use none, auto or deepseek\n", cmd,
                o->format);
        return -1;
    }
    *split = rf != REASONING_NONE;
    char err[256];
    if (lms_template_switches(o->kwargs_json, o->reasoning, kwargs, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv %s: %s\n", cmd, err);
        return -1;
    }
    return 0;
}

void app_reply_init(app_reply *r, bool split, bool open)
{
    *r = (app_reply){.dim = isatty(STDERR_FILENO)};
    reply_cut_init(&r->cut, split, open, false, NULL);
}

/* Writes what of the reply can go out now: thoughts to stderr, the answer
 * to stdout. */
static void show(app_reply *r, bool final)
{
    reply_part p;
    toolcalls tc = {0};
    const char *t = r->text.p ? r->text.p : "";
    reply_cut_next(&r->cut, t, r->text.n, &p, final ? &tc : NULL);
    toolcalls_free(&tc);
    if (p.r_n) {
        if (r->dim && !r->in_thoughts)
            fputs("\x1b[2m", stderr);
        r->in_thoughts = true;
        fwrite(t + p.r_from, 1, p.r_n, stderr);
        fflush(stderr);
    }
    if ((p.c_n || final) && r->in_thoughts) { /* the thoughts end on a line of their own */
        fputs(r->dim ? "\x1b[0m\n" : "\n", stderr);
        r->in_thoughts = false;
    }
    if (p.c_n) {
        fwrite(t + p.c_from, 1, p.c_n, stdout);
        fflush(stdout);
    }
}

bool app_reply_add(app_reply *r, const char *piece, size_t n)
{
    if (sbuf_add(&r->text, piece, n) < 0)
        return false;
    show(r, false);
    return true;
}

void app_reply_end(app_reply *r, reply_part *w)
{
    show(r, true);
    if (w)
        reply_cut_whole(&r->cut, r->text.n, w);
}

void app_reply_free(app_reply *r)
{
    sbuf_free(&r->text);
}
