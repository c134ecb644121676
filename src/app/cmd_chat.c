/*
 * cmd_chat.c - `lmserv chat`: a multi-turn conversation in the terminal
 * through the model's chat template, streamed as it is generated.
 *
 * Commands: /reset (forget the conversation), /system TEXT (set the system
 * prompt and reset), /quit (or end of input). Ctrl-C stops the reply being
 * written and returns to the prompt; at the prompt it leaves.
 *
 * Each turn renders the whole conversation; the session keeps the K/V of
 * the tokens it has seen, so only the new part of the prompt is computed.
 *
 * Thinking models (<think> ... </think>, serve/reasoning.h): the thoughts
 * go to stderr (dimmed on a terminal) and the answer to stdout, so a
 * redirected stdout holds only answers; the history keeps them apart
 * (content and reasoning_content), as the server's chat API gives them
 * back to the template. --reasoning-format none prints the reply as
 * written; --reasoning on|off and --chat-template-kwargs set the
 * template's switches.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "app/args.h"
#include "app/cli.h"
#include "app/common.h"
#include "app/prompt.h"
#include "engine/generate.h"
#include "app/thoughts.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static bool on_piece(void *ud, const char *text, size_t n, int32_t token, float prob)
{
    (void)token, (void)prob;
    return app_reply_add(ud, text, n);
}

/* A chat session's settings beyond sampling. */
typedef struct chat_opts {
    const char *tpl;
    json_t *kwargs;     /* template switches, or NULL */
    bool thoughts;      /* thoughts taken apart (not --reasoning-format none) */
} chat_opts;

static json_t *new_history(const char *system)
{
    json_t *h = json_array();
    if (system)
        json_array_append_new(h, json_pack("{s:s, s:s}", "role", "system", "content", system));
    return h;
}

/* Renders the history; while it leaves less than a quarter of the context
 * for the reply, forgets the oldest exchange (the system prompt stays). */
static int render_fitting(const lms_model *m, lms_session *s, const chat_opts *o, json_t *hist,
                          int32_t **toks, int32_t *n, bool *open, char *err, size_t errsz)
{
    const int32_t n_ctx = lms_ctx_params_of(s->ctx)->n_ctx;
    for (;;) {
        int rc = app_chat_tokens(m, o->tpl, hist, o->kwargs, toks, n, open, err, errsz);
        if (rc < 0 || *n <= n_ctx - n_ctx / 4)
            return rc;
        size_t first = json_array_size(hist) > 0 &&
                               !strcmp(json_string_value(json_object_get(json_array_get(hist, 0), "role")),
                                       "system")
                           ? 1
                           : 0;
        if (json_array_size(hist) <= first + 1)
            return 0; /* only the new message is left: let generation report it */
        free(*toks);
        json_array_remove(hist, first); /* the oldest user message ... */
        if (json_array_size(hist) > first + 1)
            json_array_remove(hist, first); /* ... and its answer */
        fprintf(stderr, "(the conversation is longer than the context: dropped the oldest turn)\n");
    }
}

/* One user turn: render, generate, append the reply to the history. */
static void turn(const lms_model *m, lms_session *s, const chat_opts *o, json_t *hist,
                 const lms_gen_params *gp, const char *line)
{
    json_t *msg = json_pack("{s:s, s:s}", "role", "user", "content", line);
    if (!msg) {
        fprintf(stderr, "(the message is not valid UTF-8)\n");
        return;
    }
    json_array_append_new(hist, msg);
    int32_t *toks;
    int32_t n;
    char err[512];
    bool open = false;
    if (render_fitting(m, s, o, hist, &toks, &n, &open, err, sizeof err) < 0) {
        fprintf(stderr, "error: %s\n", err);
        json_array_remove(hist, json_array_size(hist) - 1);
        return;
    }
    app_reply r;
    app_reply_init(&r, o->thoughts, open);
    lms_gen_stats st;
    interrupted = 0;
    int rc = lms_session_generate(s, toks, n, gp, on_piece, &r, &st, err, sizeof err);
    free(toks);
    if (rc < 0) {
        fprintf(stderr, "\nerror: %s\n", err);
        json_array_remove(hist, json_array_size(hist) - 1);
    } else {
        reply_part w;
        app_reply_end(&r, &w);
        printf("\n");
        fflush(stdout);
        fprintf(stderr, "[%d prompt tokens (%d reused), %d generated, %.1f t/s%s]\n", st.n_prompt,
                st.n_cached, st.n_gen, st.gen_tps, interrupted ? ", interrupted" : "");
        const char *t = r.text.p ? r.text.p : "";
        json_t *said = json_pack("{s:s, s:s%}", "role", "assistant", "content", t + w.c_from,
                                 w.c_n);
        if (said && w.r_n)
            json_object_set_new(said, "reasoning_content", json_stringn(t + w.r_from, w.r_n));
        json_array_append_new(hist, said);
    }
    app_reply_free(&r);
}

int cmd_chat(int argc, char **argv)
{
    const char *model = NULL, *system = NULL, *tpl_name = NULL;
    app_think_opts th = {0};
    int64_t n_ctx = 0, threads = 0, n_predict = 512;
    lms_gen_params gp = {.sp = lms_sampler_defaults(), .cancel = &interrupted};
    app_lora_opts lo = {0};
    app_shape_opts shape = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        double d;
        bool ok = true;
        int g = app_lora_arg(argc, argv, &i, &lo);
        if (g == 0)
            g = app_shape_arg(argc, argv, &i, &shape);
        if (g == 0)
            g = app_think_arg(argc, argv, &i, &th);
        if (g != 0)
            ok = g > 0;
        else if (i + 1 >= argc)
            ok = false;
        else if (!strcmp(a, "-m"))
            model = argv[++i];
        else if (!strcmp(a, "--system"))
            system = argv[++i];
        else if (!strcmp(a, "--template") || !strcmp(a, "--chat-template"))
            tpl_name = argv[++i];
        else if (!strcmp(a, "-c"))
            ok = args_int(a, argv[++i], 16, 1 << 22, &n_ctx);
        else if (!strcmp(a, "-t"))
            ok = args_int(a, argv[++i], 0, 1024, &threads);
        else if (!strcmp(a, "-n"))
            ok = args_int(a, argv[++i], 1, 1 << 20, &n_predict);
        else if (!strcmp(a, "--temp") && (ok = args_float(a, argv[++i], 0, 100, &d)))
            gp.sp.temperature = (float)d;
        else if (!strcmp(a, "--seed") && (ok = args_float(a, argv[++i], 0, 1e18, &d)))
            gp.sp.seed = (uint64_t)d;
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "usage: lmserv chat -m MODEL [--system TEXT] [--template NAME|FILE] "
                            APP_THINK_USAGE " [-c CTX] [-t N] [-n N] [--temp T] [--seed S] " APP_LORA_USAGE " "
                            APP_SHAPE_USAGE "\n");
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "usage: lmserv chat -m MODEL [--system TEXT]\n");
        return 2;
    }
    gp.n_predict = (int32_t)n_predict;
    char err[512];
    chat_opts co = {0};
    if (app_think_setup(&th, "chat", &co.kwargs, &co.thoughts) < 0)
        return 2;
    if (app_shape_compile(&shape, &gp) < 0) { /* each reply held to it */
        app_shape_free(&shape);
        json_decref(co.kwargs);
        return 2;
    }
    lms_model *m;
    lms_ctx *c;
    if (app_load(model, (int32_t)n_ctx, 512, (int32_t)threads, &m, &c) < 0) {
        app_shape_free(&shape);
        json_decref(co.kwargs);
        return 1;
    }
    lms_lora_set lora;
    char *tpl = NULL;
    if (app_lora_load(&lo, m, c, &lora) == 0 &&
        !(tpl = app_chat_template(m, tpl_name, err, sizeof err)))
        fprintf(stderr, "lmserv chat: %s\n", err);
    if (!tpl) { /* (app_lora_load prints its own error) */
        app_shape_free(&shape);
        json_decref(co.kwargs);
        app_lora_release(&lo);
        lms_ctx_destroy(c);
        lms_model_free(m);
        return 1;
    }
    co.tpl = tpl;
    lms_session s;
    lms_session_init(&s, c);
    lms_session_set_lora(&s, &lora);
    char *sys = system ? strdup(system) : NULL;
    json_t *hist = new_history(sys);
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    fprintf(stderr, "lmserv chat with %s: /reset, /system TEXT, /quit; Ctrl-C stops a reply\n", m->name);
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        printf("> ");
        fflush(stdout);
        interrupted = 0;
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0)
            break; /* end of input, or Ctrl-C at the prompt */
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit"))
            break;
        if (!strcmp(line, "/reset") || !strncmp(line, "/system ", 8)) {
            if (line[1] == 's') {
                free(sys);
                sys = strdup(line + 8);
            }
            json_decref(hist);
            hist = new_history(sys);
            lms_session_reset(&s);
            fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (n > 0)
            turn(m, &s, &co, hist, &gp, line);
    }
    printf("\n");
    free(line);
    free(sys);
    json_decref(hist);
    free(tpl);
    json_decref(co.kwargs);
    lms_session_deinit(&s);
    app_lora_release(&lo);
    app_shape_free(&shape);
    lms_ctx_destroy(c);
    lms_model_free(m);
    return 0;
}
