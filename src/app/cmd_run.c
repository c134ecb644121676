/*
 * cmd_run.c - `lmserv run`: generate a continuation of a prompt, streamed
 * to stdout, with one stats line on stderr.
 *
 * With --chat the prompt is one user turn rendered through the model's
 * chat template, and a thinking model's thoughts go to stderr, its answer
 * to stdout (app/thoughts.h).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/args.h"
#include "app/cli.h"
#include "app/common.h"
#include "app/prompt.h"
#include "app/thoughts.h"
#include "base/err.h"
#include "engine/generate.h"
#include "model/tokenizer.h"

typedef struct run_opts {
    const char *model, *prompt, *system, *tpl; /* tpl: --template, for --chat */
    const char *stop[LMS_MAX_STOP];
    int n_stop;
    int64_t n_predict, n_ctx, threads;
    bool chat, no_bos, ignore_eos;
    lms_sampler_params sp;
    app_gpu_opts gpu;
    app_lora_opts lora;
    args_spec_opts spec;
    app_shape_opts shape;
    app_think_opts think;
} run_opts;

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static bool parse_sampling(int argc, char **argv, int *i, lms_sampler_params *sp, bool *ok)
{
    const char *a = argv[*i];
    double d;
    int64_t v;
    *ok = true;
    if (*i + 1 >= argc)
        return false;
    if (!strcmp(a, "--temp") && (*ok = args_float(a, argv[++*i], 0, 100, &d)))
        sp->temperature = (float)d;
    else if (!strcmp(a, "--top-k") && (*ok = args_int(a, argv[++*i], 0, 1 << 24, &v)))
        sp->top_k = (int32_t)v;
    else if (!strcmp(a, "--top-p") && (*ok = args_float(a, argv[++*i], 0, 1, &d)))
        sp->top_p = (float)d;
    else if (!strcmp(a, "--min-p") && (*ok = args_float(a, argv[++*i], 0, 1, &d)))
        sp->min_p = (float)d;
    else if (!strcmp(a, "--repeat-penalty") && (*ok = args_float(a, argv[++*i], 0.01, 10, &d)))
        sp->repeat_penalty = (float)d;
    else if (!strcmp(a, "--repeat-last-n") && (*ok = args_int(a, argv[++*i], 0, 1 << 20, &v)))
        sp->penalty_last_n = (int32_t)v;
    else if (!strcmp(a, "--frequency-penalty") && (*ok = args_float(a, argv[++*i], -2, 2, &d)))
        sp->frequency_penalty = (float)d;
    else if (!strcmp(a, "--presence-penalty") && (*ok = args_float(a, argv[++*i], -2, 2, &d)))
        sp->presence_penalty = (float)d;
    else if (!strcmp(a, "--seed") && (*ok = args_int(a, argv[++*i], 0, INT64_MAX, &v)))
        sp->seed = (uint64_t)v;
    else if (!strcmp(a, "--typical") && (*ok = args_float(a, argv[++*i], 0.001, 1, &d)))
        sp->typical_p = (float)d;
    else if (!strcmp(a, "--mirostat") && (*ok = args_int(a, argv[++*i], 0, 2, &v)))
        sp->mirostat = (int32_t)v;
    else if (!strcmp(a, "--mirostat-ent") && (*ok = args_float(a, argv[++*i], 0, 100, &d)))
        sp->mirostat_tau = (float)d;
    else if (!strcmp(a, "--mirostat-lr") && (*ok = args_float(a, argv[++*i], 0, 10, &d)))
        sp->mirostat_eta = (float)d;
    else
        return *ok == false;
    return true;
}

static int parse(int argc, char **argv, run_opts *o)
{
    o->sp = lms_sampler_defaults();
    o->n_predict = 128;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool ok;
        int g = app_gpu_arg(argc, argv, &i, &o->gpu);
        if (g == 0)
            g = app_lora_arg(argc, argv, &i, &o->lora);
        if (g == 0)
            g = args_spec(argc, argv, &i, &o->spec);
        if (g == 0)
            g = app_shape_arg(argc, argv, &i, &o->shape);
        if (g == 0)
            g = app_think_arg(argc, argv, &i, &o->think);
        if (g != 0) {
            if (g < 0)
                return -1;
        } else if (parse_sampling(argc, argv, &i, &o->sp, &ok)) {
            if (!ok)
                return -1;
        } else if (!strcmp(a, "-m")) {
            if (!(o->model = args_value(argc, argv, &i)))
                return -1;
        } else if (!strcmp(a, "-p")) {
            if (!(o->prompt = args_value(argc, argv, &i)))
                return -1;
        } else if (!strcmp(a, "--system")) {
            if (!(o->system = args_value(argc, argv, &i)))
                return -1;
        } else if (!strcmp(a, "--template") || !strcmp(a, "--chat-template")) {
            if (!(o->tpl = args_value(argc, argv, &i)))
                return -1;
        } else if (!strcmp(a, "--stop") && o->n_stop < LMS_MAX_STOP) {
            if (!(o->stop[o->n_stop++] = args_value(argc, argv, &i)))
                return -1;
        } else if (!strcmp(a, "-n") && i + 1 < argc) {
            if (!args_int(a, argv[++i], -1, 1 << 24, &o->n_predict))
                return -1;
        } else if (!strcmp(a, "-c") && i + 1 < argc) {
            if (!args_int(a, argv[++i], 1, 1 << 22, &o->n_ctx))
                return -1;
        } else if (!strcmp(a, "-t") && i + 1 < argc) {
            if (!args_int(a, argv[++i], 0, 1024, &o->threads))
                return -1;
        } else if (!strcmp(a, "--chat")) {
            o->chat = true;
        } else if (!strcmp(a, "--no-bos")) {
            o->no_bos = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = true;
        } else {
            fprintf(stderr, "lmserv run: bad option '%s'\n", a);
            return -1;
        }
    }
    if (!o->model || !o->prompt) {
        fprintf(stderr, "usage: lmserv run -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] "
                        "[--top-p P] [--min-p P] [--typical P] [--mirostat 0|1|2] [--mirostat-ent TAU] "
                        "[--mirostat-lr ETA] [--seed S] [--repeat-penalty R] [--chat] "
                        "[--template NAME|FILE] " APP_THINK_USAGE " " APP_GPU_USAGE " " APP_LORA_USAGE " " ARGS_SPEC_USAGE " " APP_SHAPE_USAGE "\n");
        return -1;
    }
    if (o->tpl && !o->chat) {
        fprintf(stderr, "lmserv run: --template applies to --chat prompts: add --chat\n");
        return -1;
    }
    return args_spec_finish(&o->spec, "run");
}

/* ud: NULL (plain text, as it comes) or the chat reply (app_reply) */
static bool print_piece(void *ud, const char *text, size_t n, int32_t token, float prob)
{
    (void)token, (void)prob;
    if (ud)
        return app_reply_add(ud, text, n);
    fwrite(text, 1, n, stdout);
    fflush(stdout);
    return true;
}

int cmd_run(int argc, char **argv)
{
    run_opts o = {0};
    json_t *kwargs = NULL;
    bool split = false, open = false;
    if (parse(argc, argv, &o) < 0 || app_think_setup(&o.think, "run", &kwargs, &split) < 0)
        return 2;
    lms_gen_params shape = {0}; /* its json, schema, grammar */
    if (app_shape_compile(&o.shape, &shape) < 0) {
        app_shape_free(&o.shape);
        json_decref(kwargs);
        return 2;
    }
    lms_model *m;
    lms_ctx *c;
    if (app_load_gpu(o.model, (int32_t)o.n_ctx, 512, (int32_t)o.threads, &o.gpu, &m, &c) < 0) {
        app_shape_free(&o.shape);
        json_decref(kwargs);
        return 1;
    }
    int32_t *toks = NULL, n = 0;
    char err[512] = "";
    lms_lora_set lora;
    int rc = app_lora_load(&o.lora, m, c, &lora);
    if (rc < 0) {
        app_shape_free(&o.shape);
        json_decref(kwargs);
        lms_ctx_destroy(c);
        lms_model_free(m);
        return 1;
    }
    lms_drafter *drafter = NULL;
    lms_draft_seq ds = {0};
    if (o.spec.spec.mode == LMS_SPEC_DRAFT) { /* placed as the target unless told */
        const lms_draft_place dp = {o.spec.draft_gpu_set ? o.spec.draft_gpu : o.gpu.gpu_layers,
                                    o.gpu.vram_margin_mb, o.gpu.vram_budget_mb, c};
        rc = lms_drafter_create(m, o.spec.draft, lms_ctx_params_of(c)->n_ctx, 512, 1, 0,
                                (int32_t)o.threads, &dp, &drafter, err, sizeof err);
    }
    if (rc >= 0)
        rc = app_prompt_tokens(m, o.prompt, o.system, o.chat, !o.no_bos, o.tpl, kwargs, &toks, &n,
                               &open, err, sizeof err);
    if (rc >= 0) {
        lms_session s;
        lms_session_init(&s, c);
        lms_session_set_lora(&s, &lora);
        lms_gen_params gp = {.sp = o.sp, .n_predict = (int32_t)o.n_predict, .stop = o.stop,
                             .n_stop = o.n_stop, .ignore_eos = o.ignore_eos, .cancel = &interrupted,
                             .spec = o.spec.spec, .drafter = drafter, .draft_seq = &ds,
                             .json = shape.json, .schema = shape.schema, .grammar = shape.grammar};
        lms_gen_stats st;
        app_reply r;
        app_reply_init(&r, split, open);
        signal(SIGINT, on_sigint);
        rc = lms_session_generate(&s, toks, n, &gp, print_piece, o.chat ? &r : NULL, &st, err,
                                  sizeof err);
        signal(SIGINT, SIG_DFL);
        if (rc >= 0 && o.chat)
            app_reply_end(&r, NULL);
        app_reply_free(&r);
        if (rc >= 0 && o.spec.spec.mode != LMS_SPEC_NONE)
            fprintf(stderr, "\n[speculative %s: drafted %d, accepted %d (%.1f%%)]",
                    o.spec.spec.mode == LMS_SPEC_DRAFT ? "draft" : "ngram", st.n_drafted,
                    st.n_accepted, st.n_drafted ? 100.0 * st.n_accepted / st.n_drafted : 0.0);
        if (rc >= 0)
            fprintf(stderr,
                    "\n[prompt %d tokens, %.1f ms (%.1f t/s) | generated %d tokens | ttft %.1f ms | "
                    "%.2f t/s | finish %s]\n",
                    st.n_prompt, st.prompt_ms,
                    st.prompt_ms > 0 ? st.n_prompt * 1000.0 / st.prompt_ms : 0.0, st.n_gen,
                    st.ttft_ms, st.gen_tps, st.finish);
        lms_session_deinit(&s);
    }
    if (rc < 0)
        fprintf(stderr, "lmserv run: %s\n", err);
    free(toks);
    lms_draft_seq_release(drafter, &ds);
    lms_drafter_destroy(drafter);
    app_lora_release(&o.lora);
    app_shape_free(&o.shape);
    json_decref(kwargs);
    lms_ctx_destroy(c);
    lms_model_free(m);
    return rc < 0 ? 1 : 0;
}
