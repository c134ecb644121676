/*
 * config.h - the multi-model configuration (`lmserv serve --config FILE`):
 * which expert models exist, how they are loaded and unloaded, and how a
 * request without a model name is routed. DESIGN.md ("Configuration")
 * shows the file:
 *
 *   {"experts": [{"expert_id", "model_path", "domain", "priority", "examples"}
 *                 or {"expert_id", "endpoint", "api_key" | "api_key_env",
 *                     "remote_model", "timeout_s", "domain", "priority", "examples"}],
 *    "lazy_loading": {"enabled", "warmup_pool_size", "max_loaded_experts",
 *                     "memory_threshold", "auto_unload_after_s"},
 *    "router": {"default", "embedding_model", "threshold"},
 *      embedding_model: null (lexical router), an expert_id, or a GGUF path
 *    "model_dirs": ["/models", ...]}
 *
 * The file is untrusted input: every field is checked, and an error names
 * the file and the field ("experts[1].priority: must be an integer"), or the
 * line and column of a JSON syntax error. A relative model_path is relative
 * to the directory of the config file and must stay inside it; with
 * "model_dirs" every model must lie (after resolving links) under one of
 * those directories.
 *
 * An expert with "endpoint" (an OpenAI-compatible base URL, "http://host:8080/v1")
 * instead of "model_path" is served elsewhere (route/remote.h): nothing loads,
 * requests are forwarded. Its api_key (or the environment variable named by
 * api_key_env, read when the file is) is secret: no message, log or listing
 * ever shows it.
 *
 * `serve -m FILE` builds a one-expert configuration (lms_route_cfg_single)
 * so that the server has one code path.
 */
#ifndef LMS_ROUTE_CONFIG_H
#define LMS_ROUTE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#define LMS_EXPERT_ID_MAX 128

typedef struct lms_expert_cfg {
    char *id;           /* expert_id: [A-Za-z0-9._:-], 1..LMS_EXPERT_ID_MAX bytes */
    char *path;         /* model_path, resolved (absolute unless from -m); NULL when remote */
    char *endpoint;     /* remote: base URL without a trailing '/', else NULL */
    char *api_key;      /* remote: sent as "Authorization: Bearer"; NULL = none. Secret */
    char *remote_model; /* remote: the model name sent upstream (default: id) */
    double timeout_s;   /* remote: the longest one upstream request may take */
    char *domain;       /* free text used by the router; NULL when absent */
    int priority;       /* higher wins ties and the warm-up order; default 0 */
    char **examples;    /* [n_examples] texts this expert should answer */
    int n_examples;
    char *draft;        /* "draft": the draft model of speculative decoding, resolved as
                         * model_path; NULL = none (local experts only) */
    char *chat_template; /* "chat_template": the text of the template rendering its chats in
                          * place of the model's (read from a built-in name or a file), or
                          * NULL */
    char **lora_paths;  /* [n_loras] LoRA adapters loaded with the model ("lora"), resolved */
    float *lora_scales; /* their scales for requests that name no adapters (0: loaded only) */
    int n_loras;
} lms_expert_cfg;

/* Adapters one expert may be started with (each sequence uses at most
 * LMS_LORA_MAX of them at once). */
#define LMS_EXPERT_LORAS 16

typedef struct lms_route_cfg {
    lms_expert_cfg *experts;  /* [n_experts], config order */
    int n_experts;
    bool lazy;                /* lazy_loading.enabled: load on first use */
    int warmup;               /* lazy: experts loaded at start, highest priority first */
    int max_loaded;           /* experts loaded at once; 0 = no limit */
    double mem_threshold;     /* fraction of MemTotal for weights + KV; 0 = no limit */
    double unload_after_s;    /* idle time before an unload; 0 = never */
    char *default_id;         /* router.default (an expert id) or NULL */
    char *embedding_model;    /* router.embedding_model as written, or NULL (lexical router) */
    int embed_expert;         /* it names this expert (its model embeds), or -1 */
    lms_expert_cfg embedder;  /* it names a GGUF file: a model loaded for the router only
                               * (id "router-embedding", path resolved; id NULL otherwise) */
    double threshold;         /* router.threshold: lower scores go to the default */
    bool single;              /* built by lms_route_cfg_single (serve -m) */
} lms_route_cfg;

/* Reads and checks a config file. On failure returns < 0 with a message
 * naming the file and the field; *out is then untouched. */
int lms_route_cfg_load(const char *path, lms_route_cfg *out, char *err, size_t errsz);
/* The same from text; base_dir resolves relative model paths (NULL: the
 * current directory) and name is used in messages. */
int lms_route_cfg_parse(const char *text, size_t n, const char *name, const char *base_dir,
                        lms_route_cfg *out, char *err, size_t errsz);
/* One eagerly loaded expert serving model_path under id (serve -m). */
int lms_route_cfg_single(const char *model_path, const char *id, lms_route_cfg *out);
/* Adds an adapter to expert e (serve -m --lora): path as given, scale. */
int lms_expert_cfg_add_lora(lms_expert_cfg *e, const char *path, float scale);
void lms_route_cfg_free(lms_route_cfg *c);
/* The index of the expert named id, or -1. */
int lms_route_cfg_find(const lms_route_cfg *c, const char *id);

#endif
