/*
 * server.h - `lmserv serve`: one port, one event-loop thread, three ways in.
 *
 *   HTTP/1.1 (keep-alive, chunked)  OpenAI API, /health, /stats, /metrics
 *   Server-Sent Events              streamed completions
 *   WebSocket at /ws                the `op` and `type` dialects (DESIGN.md)
 *
 * Models: the server serves the experts of a route configuration
 * (route/config.h; `serve -m` is a configuration of one) through the model
 * registry (route/registry.h), whose loader thread loads them. The server
 * comes up before the models: lms_server_run serves /health (503
 * "loading") at once while the models loaded at start load, then 200.
 * With lazy loading it is ready at once and models load on first use.
 * A model that fails to load at start (without lazy loading) ends
 * lms_server_run with exit status 1.
 *
 * Threads: lms_server_run is the event loop and the only thread that
 * touches a socket. lms_server_engine_stalled and lms_server_stop may be
 * called from any thread (not from a signal handler); they post to the
 * loop and wake it.
 */
#ifndef LMS_SERVER_H
#define LMS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sched.h"
#include "ops/thermal.h"
#include "model/model.h"
#include "route/config.h"

typedef struct lms_server_params {
    const char *host;         /* address to bind; NULL or "" = all */
    int port;                 /* 0 = any free port (see lms_server_port) */
    const char *api_key;      /* NULL or "" = no authentication */
    size_t max_body_bytes;    /* HTTP request body; 0 = 1 MiB */
    size_t max_frame_bytes;   /* one WebSocket message; 0 = max_body_bytes */
    int max_conns;            /* open connections; 0 = 512 */
    double grace_ms;          /* shutdown: how long running streams may finish; 0 = 10 s */
    lms_route_cfg *route;     /* the experts (taken by lms_server_create, even on failure) */
    lms_sched_params sched;   /* scheduler parameters of every model (n_ctx 0: the model's
                               * training context, at most 4096) */
    lms_thermal *thermal;     /* borrowed: fed the hottest GPU's temperature every second and
                               * shown by /health, /stats, /metrics (NULL: off) */
    double min_tps;           /* supervisor: restart the engine when the decode speed of the
                               * last requests stays under this (0: off) */
    bool log_prompts;         /* request logs carry the prompt text */
    double request_timeout_ms; /* deadline of a request from its arrival (0: none); a request
                                * past it ends with finish_reason "deadline" */
    const char *lora_dir;     /* LoRA adapters may be loaded at run time from this folder
                               * (POST /lora-adapters/load, the type dialect's load_adapter);
                               * NULL: only those an expert was started with */
    const char *chat_template_kwargs; /* a JSON object of template variables every chat
                               * request gets under its own chat_template_kwargs (NULL: none) */
    const char *reasoning;    /* "on" / "off": enable_thinking true / false for every chat
                               * (over chat_template_kwargs); NULL or "auto": the template's */
    int32_t reasoning_budget; /* tokens of thoughts a chat reply may write before they are
                               * closed ("\n</think>\n\n" forced); <= 0: no limit (no
                               * thoughts at all is --reasoning off, set through
                               * `reasoning`); a request's "reasoning_budget" wins */
    const char *sampling_defaults; /* a JSON object of request fields (temperature, top_k,
                               * max_tokens, seed, ...) every generation starts from, its own
                               * fields over them (llama-server's --temp, --top-k, ...); NULL */
    bool no_web;              /* GET / serves no page (llama-server's --no-webui) */
    const char *reasoning_format; /* thoughts (<think>...</think>) in chat replies: "none",
                               * "deepseek", "deepseek-legacy"; NULL or "auto": deepseek */
    const char *pooling;      /* llama-server's --pooling: "mean", "cls" or "last", how a
                               * decoder pools /v1/embeddings by default (over its file's
                               * pooling_type); "rank": /v1/rerank only, which needs a
                               * reranker's file anyway; NULL: the file's. Encoders pool as
                               * their file says. */
} lms_server_params;

typedef struct lms_server lms_server;

/* Creates the server and binds the port; starts the model loader thread
 * (nothing loads before lms_server_run). On failure
 * returns < 0 with a message. Strings in p are copied. */
int lms_server_create(const lms_server_params *p, lms_server **out, char *err, size_t errsz);
/* The port actually bound. */
int lms_server_port(const lms_server *s);

/* A scheduler stalled (watchdog) or crawls: any thread may call this; the
 * loop thread then abandons that scheduler (its requests end with an
 * error), starts a new one for the same model with the same parameters
 * and serves on. sched NULL: every expert's. */
void lms_server_engine_stalled(lms_server *s, lms_sched *sched);
/* Graceful stop (any thread): stop accepting, let running streams finish
 * for up to grace_ms, then lms_server_run returns 0. A second call stops
 * at once. */
void lms_server_stop(lms_server *s);

/* Starts the loads of the models served at start and runs the event loop
 * on the calling thread until stopped. Returns the process exit status: 0
 * after a stop, 1 when loading failed. */
int lms_server_run(lms_server *s);

/* Closes every connection, frees the models and their schedulers, frees
 * the server. NULL is a no-op. */
void lms_server_destroy(lms_server *s);

#endif
