/*
 * llama_args.c - llama-server's command line for `lmserv serve`, so that a
 * launch command written for llama-server starts lmserv unchanged.
 *
 * Its flags are rewritten into lmserv's before `serve` parses them:
 *   - the same setting under another name (-ngl / --n-gpu-layers, --ctx-size,
 *     -ctk / -ctv / --cache-type-k|v, -a, -md / --model-draft, -ngld /
 *     --n-gpu-layers-draft, -v / --verbose, --log-disable);
 *   - llama-server's default sampling for requests that set none (--temp,
 *     --top-k, --top-p, --min-p, --repeat-penalty, --presence-penalty,
 *     --frequency-penalty, -n / --n-predict, --seed) become one
 *     --sampling-defaults JSON object, read like a request's fields;
 *   - switches for what lmserv always does, or does its own way, are taken
 *     and dropped (flash attention, Jinja templates, continuous batching,
 *     metrics and slots endpoints, memory mapping, micro-batch and thread
 *     counts of batches, multi-GPU splits, ...), each named once on stderr.
 * Anything else is left for `serve`, which refuses what it does not know.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "app/cli.h"

typedef struct alias {
    const char *from, *to, *value; /* value: the flag's value as well (NULL: the next argument) */
} alias;

static const alias aliases[] = {
    {"-ngl", "--gpu-layers", NULL},        {"--n-gpu-layers", "--gpu-layers", NULL},
    {"--ctx-size", "-c", NULL},
    {"-ctk", "--kv-type", NULL},           {"--cache-type-k", "--kv-type", NULL},
    {"-ctv", "--kv-type", NULL},           {"--cache-type-v", "--kv-type", NULL},
    {"-a", "--alias", NULL},               {"-md", "--draft", NULL},
    {"--model-draft", "--draft", NULL},    {"-v", "--log-level", "debug"},
    {"-ngld", "--gpu-layers-draft", NULL}, {"--n-gpu-layers-draft", "--gpu-layers-draft", NULL},
    {"--verbose", "--log-level", "debug"}, {"--log-disable", "--log-level", "error"},
};

/* Sampling defaults: the flag and the request field it sets. */
static const struct { const char *flag, *field; bool integer; } samplers[] = {
    {"--temp", "temperature", false},        {"--top-k", "top_k", true},
    {"--top-p", "top_p", false},             {"--min-p", "min_p", false},
    {"--repeat-penalty", "repeat_penalty", false},
    {"--presence-penalty", "presence_penalty", false},
    {"--frequency-penalty", "frequency_penalty", false},
    {"-n", "max_tokens", true},              {"--n-predict", "max_tokens", true},
    {"--predict", "max_tokens", true},       {"--seed", "seed", true},
    {"-s", "seed", true},
};

/* Switches taken and dropped, and why. */
static const struct { const char *flag; int value; const char *why; } ignored[] = {
    /* value: 0 none, 1 always one, 2 an optional on/off/auto */
    {"-fa", 2, "attention is always fused"},
    {"--flash-attn", 2, "attention is always fused"},
    {"--jinja", 0, "chat templates always run as Jinja"},
    {"--no-jinja", 0, "chat templates always run as Jinja"},
    {"-cb", 0, "batching is always continuous"},
    {"--cont-batching", 0, "batching is always continuous"},
    {"-nocb", 0, "batching is always continuous"},
    {"--no-cont-batching", 0, "batching is always continuous"},
    {"--metrics", 0, "/metrics is always served"},
    {"--slots", 0, "/slots is always served"},
    {"--no-slots", 0, "/slots is always served"},
    {"--embedding", 0, "an embedding model answers /v1/embeddings as loaded"},
    {"--embeddings", 0, "an embedding model answers /v1/embeddings as loaded"},
    {"--reranking", 0, "a reranker answers /v1/rerank as loaded"},
    {"--rerank", 0, "a reranker answers /v1/rerank as loaded"},
    {"--mlock", 0, "memory handling is lmserv's own"},
    {"--no-mmap", 0, "memory handling is lmserv's own"},
    {"--mmap", 0, "memory handling is lmserv's own"},
    {"--swa-full", 0, "the KV cache is paged"},
    {"--kv-unified", 0, "the KV cache is paged and shared"},
    {"-kvu", 0, "the KV cache is paged and shared"},
    {"--no-warmup", 0, "there is no warm-up run"},
    {"--no-webui", 0, NULL}, /* handled: --no-web */
    {"-tb", 1, "batches use the -t threads"},
    {"--threads-batch", 1, "batches use the -t threads"},
    {"-ub", 1, "steps take --batch-tokens"},
    {"--ubatch-size", 1, "steps take --batch-tokens"},
    {"--keep", 1, "a full context is refused, not shifted"},
    {"--cache-reuse", 1, "prefix reuse is by KV blocks"},
    {"--threads-http", 1, "HTTP runs on one event-loop thread"},
    {"-sm", 1, "one GPU, split with the CPU by --gpu-layers"},
    {"--split-mode", 1, "one GPU, split with the CPU by --gpu-layers"},
    {"-ts", 1, "one GPU, split with the CPU by --gpu-layers"},
    {"--tensor-split", 1, "one GPU, split with the CPU by --gpu-layers"},
    {"-mg", 1, "one GPU, split with the CPU by --gpu-layers"},
    {"--main-gpu", 1, "one GPU, split with the CPU by --gpu-layers"},
    {"-dev", 1, "the GPU is found by itself"},
    {"--device", 1, "the GPU is found by itself"},
    {"-dt", 1, "the KV cache is paged (no defragmentation)"},
    {"--defrag-thold", 1, "the KV cache is paged (no defragmentation)"},
};

#define N_OF(a) (sizeof a / sizeof a[0])

static bool is_choice(const char *v)
{
    return v && (!strcmp(v, "on") || !strcmp(v, "off") || !strcmp(v, "auto"));
}

int app_llama_args(int argc, char **argv, app_llama_out *out)
{
    memset(out, 0, sizeof *out);
    out->argv = calloc((size_t)argc * 2 + 3, sizeof *out->argv);
    json_t *defaults = json_object();
    const char *kv = NULL;
    if (!out->argv || !defaults)
        return -1;
    int n = 0;
    out->argv[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool done = false;
        for (size_t k = 0; k < N_OF(aliases) && !done; k++) {
            if (strcmp(a, aliases[k].from))
                continue;
            done = true;
            const char *v = aliases[k].value ? aliases[k].value : i + 1 < argc ? argv[++i] : NULL;
            if (!v) {
                fprintf(stderr, "lmserv serve: %s needs a value\n", a);
                goto fail;
            }
            if (!strcmp(aliases[k].to, "--kv-type")) { /* K and V share one type here */
                if (kv && strcmp(kv, v)) {
                    fprintf(stderr, "lmserv serve: the KV cache has one type for K and V: "
                                    "%s %s differs from %s\n", a, v, kv);
                    goto fail;
                }
                if (kv)
                    continue;
                kv = v;
            }
            out->argv[n++] = (char *)aliases[k].to;
            out->argv[n++] = (char *)v;
        }
        for (size_t k = 0; k < N_OF(samplers) && !done; k++) {
            if (strcmp(a, samplers[k].flag))
                continue;
            done = true;
            char *end = NULL;
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            const double d = v ? strtod(v, &end) : 0;
            if (!v || end == v || *end || (samplers[k].integer && d != (double)(long long)d)) {
                fprintf(stderr, "lmserv serve: %s needs a%s number\n", a,
                        samplers[k].integer ? "n integer" : "");
                goto fail;
            }
            json_object_set_new(defaults, samplers[k].field,
                                samplers[k].integer ? json_integer((json_int_t)d) : json_real(d));
        }
        for (size_t k = 0; k < N_OF(ignored) && !done; k++) {
            if (strcmp(a, ignored[k].flag))
                continue;
            done = true;
            if (ignored[k].value == 1 && ++i >= argc) {
                fprintf(stderr, "lmserv serve: %s needs a value\n", a);
                goto fail;
            }
            if (ignored[k].value == 2 && i + 1 < argc && is_choice(argv[i + 1]))
                i++;
            if (!ignored[k].why)
                out->no_web = true;
            else
                fprintf(stderr, "lmserv serve: %s is taken and has no effect here: %s\n", a,
                        ignored[k].why);
        }
        if (!done)
            out->argv[n++] = argv[i];
    }
    out->argc = n;
    if (json_object_size(defaults))
        out->sampling = json_dumps(defaults, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(defaults);
    return 0;
fail:
    json_decref(defaults);
    free(out->argv);
    out->argv = NULL;
    return -1;
}

void app_llama_args_free(app_llama_out *out)
{
    free(out->argv);
    free(out->sampling);
    memset(out, 0, sizeof *out);
}
