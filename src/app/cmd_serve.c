/*
 * cmd_serve.c - `lmserv serve`: the HTTP / WebSocket server on one model
 * (-m) or on the expert models of a configuration file (--config).
 *
 *   lmserv serve -m MODEL.gguf | --config FILE.json  [--host 127.0.0.1] [--port 8080] [-t N]
 *                [--parallel 4] [-c CTX] [--api-key KEY] [--max-body BYTES]
 *                [--queue N] [--batch N] [--max-conns N] [--grace SECONDS]
 *                [--alias NAME] [--log-file PATH] [--log-max-mb N] [--log-keep N]
 *                [--log-level debug|info|warn|error] [--log-prompts]
 *                [--thermal-limit C] [--stall-ms MS] [--min-tps T]
 *                [--gpu-layers auto|N|all] [--vram-margin-mb N] [--vram-budget-mb N]
 *                [--kv-type f16|q8_0|q4_0] [--kv-budget MIB] [--batch-tokens N] [--timeout S]
 *                [--lora FILE] [--lora-scaled FILE SCALE] [--lora-init-without-apply]
 *                [--lora-dir DIR]
 *                [--draft MODEL | --spec ngram [--spec-ngram N]] [--draft-max N]
 *                [--draft-min N] [--draft-p-min P] [--gpu-layers-draft auto|N|all]
 *                [--chat-template NAME|FILE] [--chat-template-file FILE]
 *                [--chat-template-kwargs JSON] [--reasoning on|off|auto]
 *                [--reasoning-format none|auto|deepseek|deepseek-legacy]
 *                [--pooling mean|cls|last|rank]
 *                [--reasoning-budget N]
 *   and llama-server's own flags (-ngl, --ctx-size, -ctk/-ctv, --temp, -fa, --jinja, ...:
 *   llama_args.c)
 *
 * Environment (flags win): INFERENCE_MODEL_NAME (model path),
 * INFERENCE_HOST, INFERENCE_PORT, LMSERV_API_KEY.
 *
 * With no model at all, a small random-weight model is written once to
 * $XDG_CACHE_HOME/lmserv (or ~/.cache/lmserv) by `synth` and served, so
 * that the server works out of the box (it talks nonsense).
 *
 * Operations: JSON-lines logs (stderr, or a file rotated by size; SIGHUP
 * reopens it), the GPU monitor feeding thermal protection (slow above
 * --thermal-limit, pause 10 degrees higher, resume 5 below), a watchdog
 * that restarts the engine when a step stalls for --stall-ms, and a
 * supervisor that restarts it when decode speed stays under --min-tps.
 *
 * --config (route/config.h): experts, lazy loading, idle unloading and the
 * semantic router; a bad file is refused before anything starts, with the
 * field named. The scheduler flags (-t, --parallel, -c, --kv-type, ...)
 * apply to every model.
 *
 * LoRA adapters: --lora / --lora-scaled load adapters with the -m model
 * (the config lists them per expert), applied to every request that names
 * none (--lora-init-without-apply: to none of them, until a request or
 * POST /lora-adapters gives them a scale); --lora-dir lets clients load
 * more at run time from that folder (serve/api_lora.c).
 *
 * Threads: the main thread runs the server's event loop; the model
 * registry's loader thread (route/registry.h) reads models and starts
 * their schedulers, so /health answers 503 "loading" from the first
 * moment; a signal thread turns SIGINT/SIGTERM into lms_server_stop (a
 * second signal stops at once). Every other thread has those signals
 * blocked.
 */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <sys/stat.h>

#include "app/args.h"
#include "app/cli.h"
#include "app/common.h"
#include "app/prompt.h"
#include "base/err.h"
#include "kernels/kernels.h"
#include "model/synth.h"
#include "model/template.h"
#include "ops/log.h"
#include "ops/thermal.h"
#include "ops/watchdog.h"
#include "serve/server.h"

typedef struct serve_opts {
    const char *env_model;     /* INFERENCE_MODEL_NAME: a default -m that --config overrides */
    const char *model, *config, *host, *api_key, *alias, *log_file, *log_level, *kv_type;
    int64_t port, threads, parallel, n_ctx, max_body, queue, batch, max_conns;
    int64_t log_max_mb, log_keep, stall_ms, kv_budget_mb;
    app_gpu_opts gpu;
    app_lora_opts lora;
    bool lora_no_apply;        /* --lora-init-without-apply */
    const char *lora_dir;
    const char *chat_template, *tpl_kwargs, *reasoning, *reasoning_format, *pooling;
    const char *sampling;      /* llama-server's --temp, --top-k, ... (llama_args.c) */
    bool no_web;
    int32_t reasoning_budget;  /* --reasoning-budget N > 0, else -1 */
    double grace_s, thermal_limit, min_tps, timeout_s;
    bool log_prompts;
    char default_model[1024];
    args_spec_opts spec;       /* speculative decoding */
} serve_opts;

/* ---- options ------------------------------------------------------------------------ */

static void defaults(serve_opts *o)
{
    memset(o, 0, sizeof *o);
    o->model = o->env_model = getenv("INFERENCE_MODEL_NAME");
    o->host = getenv("INFERENCE_HOST") ? getenv("INFERENCE_HOST") : "127.0.0.1";
    o->api_key = getenv("LMSERV_API_KEY");
    o->port = 8080;
    o->parallel = 4;
    o->queue = 64;
    o->batch = 512;
    o->max_body = 1 << 20;
    o->max_conns = 512;
    o->grace_s = 10;
    o->log_max_mb = 64;
    o->log_keep = 5;
    o->log_level = "info";
    o->thermal_limit = 80;
    o->stall_ms = 120000;
    o->reasoning_budget = -1;
}

static bool int_flag(int argc, char **argv, int *i, serve_opts *o, bool *ok)
{
    static const struct { const char *flag, *alt; size_t off; int64_t lo, hi; } tab[] = {
        {"--port", NULL, offsetof(serve_opts, port), 0, 65535},
        {"-t", "--threads", offsetof(serve_opts, threads), 0, 1024},
        {"--parallel", "-np", offsetof(serve_opts, parallel), 1, 1024},
        {"-c", "--ctx", offsetof(serve_opts, n_ctx), 0, 1 << 24},
        {"--max-body", NULL, offsetof(serve_opts, max_body), 1024, (int64_t)1 << 32},
        {"--queue", NULL, offsetof(serve_opts, queue), 0, 1 << 20},
        {"--batch", "-b", offsetof(serve_opts, batch), 1, 1 << 20},
        {"--max-conns", NULL, offsetof(serve_opts, max_conns), 1, 60000},
        {"--log-max-mb", NULL, offsetof(serve_opts, log_max_mb), 1, 1 << 20},
        {"--log-keep", NULL, offsetof(serve_opts, log_keep), 0, 1000},
        {"--stall-ms", NULL, offsetof(serve_opts, stall_ms), 100, 86400000},
        {"--kv-budget", NULL, offsetof(serve_opts, kv_budget_mb), 1, 1 << 24},
        {"--batch-tokens", NULL, offsetof(serve_opts, batch), 1, 1 << 20},

    };
    const char *a = argv[*i];
    for (size_t k = 0; k < sizeof tab / sizeof tab[0]; k++) {
        if (strcmp(a, tab[k].flag) && !(tab[k].alt && !strcmp(a, tab[k].alt)))
            continue;
        const char *v = args_value(argc, argv, i);
        *ok = v && args_int(a, v, tab[k].lo, tab[k].hi, (int64_t *)((char *)o + tab[k].off));
        return true;
    }
    return false;
}

static int parse(int argc, char **argv, serve_opts *o)
{
    const char *env_port = getenv("INFERENCE_PORT");
    if (env_port && !args_int("INFERENCE_PORT", env_port, 0, 65535, &o->port))
        return -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        int gpu;
        const char **str = !strcmp(a, "-m") || !strcmp(a, "--model") ? &o->model
                           : !strcmp(a, "--config")                  ? &o->config
                           : !strcmp(a, "--host")                    ? &o->host
                           : !strcmp(a, "--api-key")                 ? &o->api_key
                           : !strcmp(a, "--alias")                   ? &o->alias
                           : !strcmp(a, "--log-file")                ? &o->log_file
                           : !strcmp(a, "--log-level")               ? &o->log_level
                           : !strcmp(a, "--kv-type")                 ? &o->kv_type
                           : !strcmp(a, "--lora-dir")                ? &o->lora_dir
                           : !strcmp(a, "--chat-template")           ? &o->chat_template
                           : !strcmp(a, "--chat-template-file")      ? &o->chat_template
                           : !strcmp(a, "--chat-template-kwargs")    ? &o->tpl_kwargs
                           : !strcmp(a, "--reasoning") || !strcmp(a, "-rea") ? &o->reasoning
                           : !strcmp(a, "--reasoning-format")        ? &o->reasoning_format
                           : !strcmp(a, "--pooling")                 ? &o->pooling
                                                                     : NULL;
        if (str)
            ok = (*str = args_value(argc, argv, &i)) != NULL;
        else if (!strcmp(a, "--grace"))
            ok = i + 1 < argc && args_float(a, argv[++i], 0.1, 3600, &o->grace_s);
        else if (!strcmp(a, "--thermal-limit"))
            ok = i + 1 < argc && args_float(a, argv[++i], 30, 120, &o->thermal_limit);
        else if (!strcmp(a, "--timeout"))
            ok = i + 1 < argc && args_float(a, argv[++i], 0, 86400 * 7, &o->timeout_s);
        else if (!strcmp(a, "--min-tps"))
            ok = i + 1 < argc && args_float(a, argv[++i], 0, 1e6, &o->min_tps);
        else if (!strcmp(a, "--reasoning-budget")) {
            int64_t b;
            ok = i + 1 < argc && args_int(a, argv[++i], -1, INT32_MAX, &b);
            if (ok && b == 0)
                o->reasoning = "off"; /* no thoughts at all: thinking switched off */
            else if (ok)
                o->reasoning_budget = (int32_t)b;
        } else if (!strcmp(a, "--log-prompts"))
            o->log_prompts = true;
        else if (!strcmp(a, "--lora-init-without-apply"))
            o->lora_no_apply = true;
        else if ((gpu = app_lora_arg(argc, argv, &i, &o->lora)) != 0)
            ok = gpu > 0;
        else if ((gpu = app_gpu_arg(argc, argv, &i, &o->gpu)) != 0)
            ok = gpu > 0; /* errors are printed by app_gpu_arg */
        else if ((gpu = args_spec(argc, argv, &i, &o->spec)) != 0)
            ok = gpu > 0;
        else if (!int_flag(argc, argv, &i, o, &ok)) {
            fprintf(stderr, "lmserv serve: unknown option '%s'\n", a);
            return -1;
        }
        if (!ok)
            return -1;
    }
    if (o->config && o->model && o->model != o->env_model) {
        fprintf(stderr, "lmserv serve: -m and --config exclude each other\n");
        return -1;
    }
    if (o->config && o->lora.n) {
        fprintf(stderr, "lmserv serve: --lora goes with -m; list a config's adapters in its "
                        "experts' \"lora\"\n");
        return -1;
    }
    if (args_spec_finish(&o->spec, "serve") < 0)
        return -1;
    if (o->config && o->chat_template) {
        fprintf(stderr, "lmserv serve: --chat-template goes with -m; give a config's experts "
                        "their own \"chat_template\"\n");
        return -1;
    }
    if (o->config && o->spec.draft) {
        fprintf(stderr, "lmserv serve: --draft goes with -m (one target model); give a "
                        "config's experts their own \"draft\"\n");
        return -1;
    }
    if (o->kv_type && app_kv_type(o->kv_type) < 0) {
        fprintf(stderr, "lmserv serve: --kv-type '%s': use " APP_KV_TYPES "\n", o->kv_type);
        return -1;
    }
    return 0;
}

/* The out-of-the-box model: written by synth on first use. */
static int default_model(serve_opts *o)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[900];
    if (xdg && xdg[0])
        snprintf(dir, sizeof dir, "%s/lmserv", xdg);
    else
        snprintf(dir, sizeof dir, "%s/.cache/lmserv", home && home[0] ? home : "/tmp");
    snprintf(o->default_model, sizeof o->default_model, "%s/default-tiny.gguf", dir);
    o->model = o->default_model;
    struct stat st;
    if (stat(o->model, &st) == 0)
        return 0;
    char parent[900];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        mkdir(parent, 0755);
    }
    mkdir(dir, 0755);
    char err[512], tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->model);
    fprintf(stderr, "lmserv serve: no model given; writing a small random-weight model to %s "
                    "(it talks nonsense; serve a real one with -m FILE.gguf)\n", o->model);
    if (lms_synth_write(lms_synth_find("tiny"), "Q8_0", 1234, tmp, err, sizeof err) < 0 ||
        rename(tmp, o->model) != 0) {
        fprintf(stderr, "lmserv serve: cannot write the default model: %s\n", err);
        return -1;
    }
    return 0;
}

/* Engine-wide operations objects, shared by the loader and the server. */
typedef struct ops_objs {
    lms_thermal *thermal;
    lms_watchdog *watchdog;
    lms_server *srv;
} ops_objs;

static ops_objs g_ops;

static void on_stall(void *ud, lms_sched *s)
{
    lms_server_engine_stalled(((ops_objs *)ud)->srv, s);
}

static void on_thermal(void *ud, lms_thermal_state from, lms_thermal_state to, double temp_c)
{
    (void)ud;
    lms_log(to == LMS_THERMAL_NORMAL ? LMS_LOG_INFO : LMS_LOG_WARN, "thermal_state", "from",
            LMS_LOG_STR(lms_thermal_state_name(from)), "to", LMS_LOG_STR(lms_thermal_state_name(to)),
            "temp_c", LMS_LOG_F64(temp_c));
}

static int open_logs(const serve_opts *o)
{
    lms_log_level level;
    if (lms_log_level_parse(o->log_level, &level) < 0) {
        fprintf(stderr, "lmserv serve: --log-level '%s': use debug, info, warn or error\n", o->log_level);
        return -1;
    }
    lms_log_config lc = {.level = level, .path = o->log_file,
                         .max_bytes = (uint64_t)o->log_max_mb << 20, .keep = (int)o->log_keep};
    if (lms_log_open(&lc) < 0) {
        fprintf(stderr, "lmserv serve: cannot open log file '%s'\n", o->log_file);
        return -1;
    }
    return 0;
}

/* ---- models ------------------------------------------------------------------------ */

/* The scheduler parameters every model gets. */
static lms_sched_params sched_params(const serve_opts *o)
{
    return (lms_sched_params){
        .n_ctx = (int32_t)o->n_ctx, .n_parallel = (int32_t)o->parallel,
        .n_batch = (int32_t)o->batch, .max_queue = (int32_t)o->queue,
        .n_threads = (int32_t)o->threads, .thermal = g_ops.thermal, .watchdog = g_ops.watchdog,
        .stall_ms = (int)o->stall_ms, .on_stall = on_stall, .stall_ud = &g_ops,
        .gpu_layers = o->gpu.gpu_layers, .kv_type = o->kv_type ? app_kv_type(o->kv_type) : 0,
        .kv_budget_bytes = o->kv_budget_mb << 20, .vram_margin_mb = o->gpu.vram_margin_mb,
        .vram_budget_mb = o->gpu.vram_budget_mb, .spec = o->spec.spec,
        .draft_model = o->spec.draft, .draft_gpu_layers = o->spec.draft_gpu,
        .draft_gpu_set = o->spec.draft_gpu_set};
}

/* -m: one expert named by --alias, else the file's base name. */
static int single_model(const serve_opts *o, lms_route_cfg *cfg)
{
    char id[160];
    const char *b = strrchr(o->model, '/');
    snprintf(id, sizeof id, "%s", o->alias && o->alias[0] ? o->alias : b ? b + 1 : o->model);
    size_t n = strlen(id);
    if (!(o->alias && o->alias[0]) && n > 5 && !strcmp(id + n - 5, ".gguf"))
        id[n - 5] = '\0';
    if (lms_route_cfg_single(o->model, id, cfg) < 0) {
        fprintf(stderr, "lmserv serve: out of memory\n");
        return -1;
    }
    if (o->chat_template) {
        char err[512];
        char *tpl = app_chat_template(NULL, o->chat_template, err, sizeof err);
        lms_template *t = NULL;
        if (tpl && lms_template_parse(tpl, strlen(tpl), &t, err, sizeof err) < 0) {
            free(tpl);
            tpl = NULL;
        }
        lms_template_destroy(t);
        if (!tpl) {
            fprintf(stderr, "lmserv serve: --chat-template: %s\n", err);
            lms_route_cfg_free(cfg);
            return -1;
        }
        cfg->experts[0].chat_template = tpl;
    }
    for (int k = 0; k < o->lora.n; k++)
        if (lms_expert_cfg_add_lora(&cfg->experts[0], o->lora.path[k],
                                    o->lora_no_apply ? 0.0f : o->lora.scale[k]) < 0) {
            fprintf(stderr, "lmserv serve: out of memory\n");
            lms_route_cfg_free(cfg);
            return -1;
        }
    return 0;
}

static int route_config(const serve_opts *o, lms_route_cfg *cfg)
{
    if (!o->config)
        return single_model(o, cfg);
    char err[1024];
    if (lms_route_cfg_load(o->config, cfg, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv serve: %s\n", err);
        return -1;
    }
    return 0;
}

/* ---- signals ------------------------------------------------------------------------ */

/* The signals the signal thread takes (all other threads block them). */
static void serve_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGUSR1); /* main is done */
    sigaddset(set, SIGHUP);  /* reopen the log file */
}

static void *signal_main(void *arg)
{
    lms_server *srv = arg;
    sigset_t set;
    serve_signals(&set);
    for (;;) {
        int sig;
        if (sigwait(&set, &sig) != 0 || sig == SIGUSR1)
            return NULL; /* SIGUSR1: main is done */
        if (sig == SIGHUP)
            lms_log_reopen(); /* logrotate moved the file */
        else
            lms_server_stop(srv);
    }
}

static void block_signals(void)
{
    sigset_t set;
    serve_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* ---- command ------------------------------------------------------------------------ */

static int start_server(const serve_opts *o, lms_route_cfg *route, lms_server **srv)
{
    lms_server_params p = {
        .host = o->host, .port = (int)o->port, .api_key = o->api_key,
        .max_body_bytes = (size_t)o->max_body, .max_conns = (int)o->max_conns,
        .grace_ms = o->grace_s * 1000.0, .route = route, .sched = sched_params(o),
        .thermal = g_ops.thermal, .min_tps = o->min_tps, .log_prompts = o->log_prompts,
        .request_timeout_ms = o->timeout_s * 1000.0, .lora_dir = o->lora_dir,
        .chat_template_kwargs = o->tpl_kwargs, .reasoning = o->reasoning,
        .reasoning_budget = o->reasoning_budget, .sampling_defaults = o->sampling,
        .no_web = o->no_web,
        .reasoning_format = o->reasoning_format, .pooling = o->pooling,
    };
    char err[256];
    if (lms_server_create(&p, srv, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv serve: %s\n", err);
        return -1;
    }
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    serve_opts o;
    defaults(&o);
    app_llama_out ll; /* llama-server's flags, in lmserv's words */
    if (app_llama_args(argc, argv, &ll) < 0)
        return 2;
    o.sampling = ll.sampling;
    o.no_web = ll.no_web;
    int prc = parse(ll.argc, ll.argv, &o);
    if (prc < 0) {
        app_llama_args_free(&ll);
        return 2;
    }
    if (o.config)
        o.model = NULL; /* INFERENCE_MODEL_NAME gives way to --config */
    block_signals(); /* before any thread starts: only the signal thread takes them */
    lms_route_cfg route;
    if (open_logs(&o) < 0 || (!o.config && (!o.model || !o.model[0]) && default_model(&o) < 0) ||
        route_config(&o, &route) < 0)
        return 1;
    lms_thermal_params tp;
    lms_thermal_params_default(&tp, o.thermal_limit);
    g_ops.thermal = lms_thermal_create(&tp, on_thermal, NULL);
    g_ops.watchdog = lms_watchdog_create(0);
    lms_server *srv;
    if (start_server(&o, &route, &srv) < 0)
        return 1;
    g_ops.srv = srv;
    pthread_t st;
    if (pthread_create(&st, NULL, signal_main, srv) != 0) {
        fprintf(stderr, "lmserv serve: cannot start threads\n");
        return 1; /* process exit reclaims the rest */
    }
    int rc = lms_server_run(srv);
    pthread_kill(st, SIGUSR1);
    pthread_join(st, NULL);
    lms_server_destroy(srv);
    lms_watchdog_destroy(g_ops.watchdog);
    lms_thermal_destroy(g_ops.thermal);
    lms_log(LMS_LOG_INFO, "server_stopped", "exit", LMS_LOG_I64(rc));
    lms_log_close();
    app_llama_args_free(&ll);
    return rc;
}
