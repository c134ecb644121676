/*
 * serve_int.h - what the files of src/serve/ share: the server object, a
 * connection, a task (one scheduler request seen from the loop), request
 * errors, and each file's entry points.
 *
 * Everything here lives on the event-loop thread, except the fields of
 * lms_server marked "mu" (the hand-off from other threads).
 *
 *   scheduler thread                       event-loop thread
 *   ----------------                       -----------------
 *   cb(srv, ev) --lock--> evq (vector) --> EVENT_WAIT_CANCELLED: drain
 *               lws_cancel_service()         task_dispatch(ev)
 *                                              task = tasks[ev->id] or drop
 *                                              task->ops->on_event -> conn out
 *                                              lws_callback_on_writable
 *
 * A task belongs to one connection. When the connection closes, its tasks
 * are aborted in the scheduler and removed from the table at once; their
 * later events find no task and are freed unread. Nothing keeps a pointer
 * to a closed connection.
 */
#ifndef LMS_SERVE_INT_H
#define LMS_SERVE_INT_H

#include <jansson.h>
#include <libwebsockets.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sched.h"
#include "model/lora.h"
#include "model/model.h"
#include "base/sbuf.h"
#include "model/template.h"
#include "ops/gpumon.h"
#include "serve/server.h"
#include "ops/supervisor.h"
#include "route/registry.h"
#include "route/router.h"

typedef struct conn conn;
typedef struct task task;
typedef struct parked parked;
typedef struct lora_job lora_job;

/* ---- growable byte buffer (base/sbuf.h; UTF-8 helpers in sbuf.c) -------- */

/* Appends s[0..n) to b with ill-formed UTF-8 replaced by U+FFFD. */
int sbuf_add_utf8(sbuf *b, const char *s, size_t n);
/* jansson string from arbitrary bytes (ill-formed UTF-8 -> U+FFFD). */
json_t *json_string_lossy(const char *s, size_t n);
/* json_real that maps NaN/inf to a finite number (jansson refuses them). */
json_t *json_real_safe(double v);
/* Compact JSON text of j (malloc'd) or NULL. */
char *json_dump_compact(const json_t *j, size_t *n_out);

/* ---- request errors (reqparse.c) -------------------------------------------
 * One failed request: HTTP status, OpenAI error type/code, the offending
 * parameter, and a message meant for the client. */
typedef struct reqerr {
    int status;        /* 400, 401, 404, 413, 422, 429, 500, 503 */
    const char *type;  /* "invalid_request_error", ... (static) */
    const char *code;  /* static or NULL */
    char param[64];    /* "" = null */
    char msg[512];
} reqerr;

/* Fills e (type chosen from status) and returns -1. param may be NULL. */
int reqerr_set(reqerr *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A JSON array of token ids (each an integer in [0, 2^31)) into a malloc'd
 * array; an element that is not one is refused as "field[i]". The caller
 * checks the length. */
int reqparse_token_ids(const json_t *a, const char *field, int32_t **out, int32_t *n_out,
                       reqerr *e);
/* Maps an lms_sched_submit error code to a status (429 busy, 400 ...). */
int reqerr_from_submit(reqerr *e, int rc, const char *msg);
/* {"error":{"message","type","param","code"}} */
json_t *reqerr_json(const reqerr *e);

/* Parses a request body; must be a JSON object. Errors name the line and
 * column ("invalid JSON at line 1, column 12: ..."). */
int reqparse_body(const char *p, size_t n, json_t **out, reqerr *e);

/* Typed optional fields: return 1 when present, 0 when absent or null,
 * -1 (e filled, naming the field) when of the wrong type or out of range. */
int reqparse_bool(const json_t *o, const char *key, bool *out, reqerr *e);
int reqparse_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out,
                 reqerr *e);
int reqparse_num(const json_t *o, const char *key, double lo, double hi, double *out, reqerr *e);
int reqparse_str(const json_t *o, const char *key, const char **out, reqerr *e);
int reqparse_obj(const json_t *o, const char *key, const json_t **out, reqerr *e);

/* tool_choice "required" or naming one of tools (chat completions' form):
 * *out the schema of a bare call object the reply is held to (JSON mode),
 * else NULL (auto, none, absent). -1 with e filled (400). api_openai.c. */
int api_forced_call(const json_t *tools, const json_t *choice, struct lms_jschema **out,
                    reqerr *e);
/* The stored responses of /v1/responses (previous_response_id); frees
 * them. api_responses.c. */
void api_responses_free_store(lms_server *s);

/* Generation settings common to every dialect. */
typedef struct genparams {
    lms_sampler_params sp;
    int32_t max_tokens;          /* -1 = until the context is full */
    char *stop[LMS_MAX_STOP];    /* owned */
    int n_stop;
    bool ignore_eos;
    bool has_seed;
    bool zero_max_ok;            /* set before parsing: max_tokens 0 is allowed (echo with
                                  * prompt log-probabilities, nothing generated) */
    double timeout_ms;           /* the request's own deadline ("timeout", seconds); 0 = none */
    lms_lora_use loras[LMS_LORA_MAX]; /* adapters (api_lora_pick; borrowed from the expert's
                                  * table or the connection, retained by submit) */
    int n_loras;
    int32_t spec_n_max, spec_n_min; /* "speculative.n_max" / "n_min" / "p_min", as lms_request */
    float spec_p_min;
    struct lms_gbnf *grammar;    /* "grammar" (GBNF text), compiled; owned */
    int32_t reasoning_budget;    /* "reasoning_budget": tokens of thoughts (-1 unlimited, -2
                                  * not given: the server's --reasoning-budget) */
    int32_t *think_close;        /* api_think_budget: the tokens closing thoughts; owned */
    int32_t n_think_close;
    bool think_open;             /* the prompt opened the thoughts */
} genparams;

/* Reads temperature (or `temp`), top_k, top_p, min_p, typical_p, mirostat
 * (with mirostat_tau, mirostat_eta), repeat_penalty,
 * repeat_last_n, presence_penalty, frequency_penalty, seed, max_tokens (or
 * max_completion_tokens, n_predict), stop, ignore_eos, logit_bias,
 * grammar (llama-server's GBNF text, at most API_GRAMMAR_BYTES; "" none) and
 * timeout (seconds, the request's deadline) from o. Unknown
 * fields are ignored. gp must be initialized with genparams_init. */
#define API_GRAMMAR_BYTES (64 * 1024)
int reqparse_gen(const json_t *o, genparams *gp, reqerr *e);
void genparams_init(genparams *gp, uint64_t seed);
/* The generation fields of o (as reqparse_gen reads them, already checked)
 * under OpenAI's names, for an upstream server: temperature (or temp),
 * top_p, top_k, min_p, repeat_penalty, presence/frequency_penalty, seed,
 * stop, ignore_eos, logit_bias, max_tokens (or max_completion_tokens,
 * n_predict). A new object; fields o lacks stay the upstream's default. */
json_t *reqparse_upstream(const json_t *o);
void genparams_deinit(genparams *gp);
/* The scheduler request for a prompt under these parameters (borrows gp's
 * stop strings and toks until submitted). */
lms_request genparams_request(const genparams *gp, const int32_t *toks, int32_t n);
/* genparams_init with a fresh seed and the server's sampling defaults. */
void server_genparams(lms_server *s, genparams *gp);
/* A chat whose prompt opened its thoughts (open) or whose reply may: the
 * reasoning budget of the request (else the server's) as gp's closing
 * tokens ("\n</think>\n\n"); nothing when unlimited. -1 with e filled.
 * chatfmt.c. */
int api_think_budget(conn *c, genparams *gp, bool open, reqerr *e);

/* ---- chat template (chatfmt.c) ---------------------------------------------- */

typedef struct chatfmt {
    lms_template *tpl;   /* parsed once */
    bool model_has_own;  /* the GGUF file ships tokenizer.chat_template */
    char *src;           /* the template text when given in place of the model's, else NULL */
    char *bos, *eos;     /* special token texts or NULL */
} chatfmt;

/* Parses the model's template, or `override` (template text) when set. */
int chatfmt_init(chatfmt *cf, const lms_model *m, const char *override, char *err,
                 size_t errsz);
void chatfmt_deinit(chatfmt *cf);
/* Checks and normalizes OpenAI messages (content parts joined into text).
 * Returns a new array or NULL with e filled (400). */
json_t *chatfmt_messages(const json_t *messages, const char *field, reqerr *e);

/* What a chat prompt is rendered from. */
typedef struct chat_in {
    const json_t *messages;    /* normalized (chatfmt_messages) */
    const json_t *tools;       /* an array, or NULL */
    const json_t *kwargs;      /* more template variables (chat_template_kwargs: enable_thinking,
                                * ...; chatfmt_kwargs), or NULL */
} chat_in;

/* The template variables of a request: the server's (--chat-template-kwargs,
 * --reasoning) under the body's "chat_template_kwargs" (an object); NULL
 * body: the server's alone. *out: a new object, or NULL when there are none.
 * Returns 0, or -1 with e filled (400 naming the field). */
int chatfmt_kwargs(const lms_server *s, const json_t *body, json_t **out, reqerr *e);
/* Renders in into *text (malloc'd, *len bytes). */
int chatfmt_render(const chatfmt *cf, const chat_in *in, bool add_generation_prompt,
                   char **text, size_t *len, reqerr *e);
/* One function tool in chat completions' form, which the templates render:
 * {"type": "function", "function": {name, description (a string, else left
 * out), parameters (an object, else {})}}. For the APIs that name tools
 * their own way (Responses, Anthropic). */
json_t *chatfmt_tool(const json_t *name, const json_t *description, const json_t *parameters);

struct task_ops;
struct toolcalls;
struct reply_cut;
struct reply_part;

/* For a remote expert: the chat fields of an API's tools (chat form, as
 * chatfmt_tool makes them; NULL: none) and forced call ("required" or
 * {"function": {"name"}}, as api_forced_call takes it; NULL: auto):
 * {"tools", "tool_choice"} as chat completions has them, or NULL. */
json_t *chatfmt_upstream_tools(const json_t *tools, const json_t *forced);
/* A chat for a remote expert c->x (task_submit_upstream): msgs
 * (normalized; sent with their calls' arguments as JSON text, as OpenAI
 * takes them), the generation fields of params (reqparse_upstream), then
 * fields as they are (tools, tool_choice, response_format; may be NULL),
 * with gp's deadline. The live task, or NULL with e (then state is not
 * taken). */
task *chatfmt_submit_remote(conn *c, const json_t *msgs, const json_t *params,
                            const json_t *fields, const genparams *gp, const struct task_ops *ops,
                            void *state, reqerr *e);
/* Whether ev is a remote expert's call event (LMS_EV_TOKEN with token
 * LMS_REMOTE_CALL); if so its call is added to calls, or *lost set when
 * it cannot be kept (out of memory: the end event then fails the reply).
 * Every chat dialect's event handler reads its call events with this. */
bool chatfmt_remote_call(struct toolcalls *calls, bool *lost, const lms_event *ev);
/* What an event of a chat reply is to its dialect's handler. */
typedef enum chat_ev {
    CHAT_EV_NONE,   /* nothing of the reply (a prompt event) */
    CHAT_EV_CALL,   /* a remote expert's call, kept (chatfmt_remote_call) */
    CHAT_EV_TEXT,   /* a token: its text was added to the reply's */
    CHAT_EV_END,    /* a normal end */
    CHAT_EV_FAILED, /* a terminal event that fails the reply: e says why */
} chat_ev;
/* The first steps of a chat dialect's event handler (Anthropic's
 * messages, Responses), kept in one place so that they agree on what
 * fails a reply: an event ev of task t is read into the reply's text and
 * the remote expert's calls (chatfmt_remote_call; *calls_lost when one
 * could not be kept). A terminal event fails as task_end_failed says, or
 * with a 503 when a call was lost; e is set only then. */
chat_ev chatfmt_event(const task *t, const lms_event *ev, sbuf *text, struct toolcalls *calls,
                      bool *calls_lost, reqerr *e);
/* At the end of a reply whose own calls tc holds (reply_cut_next): the
 * remote expert's calls (from, by chatfmt_remote_call), when it made any,
 * take their place; from is left empty. */
void chatfmt_take_calls(struct toolcalls *tc, struct toolcalls *from);

/* A chat reply's end, not streamed (Anthropic's messages, Responses):
 * the whole reply's thoughts and content w (reply_cut_whole) and its
 * calls tc (free with toolcalls_free): those read from text[0, n), or a
 * remote expert's (calls, chatfmt_take_calls) in their place. */
void chatfmt_reply_end(struct reply_cut *cut, const char *text, size_t n,
                       struct toolcalls *calls, struct reply_part *w, struct toolcalls *tc);

/* The template text a model is rendered with: its own, or the default. */
const char *chatfmt_source(const lms_model *m);
/* Renders in and tokenizes the text. think_open (may be NULL): whether the
 * prompt ends inside an opened <think>, the reply starting with thoughts
 * (reasoning.h). */
int chatfmt_tokens(const chatfmt *cf, const lms_model *m, const chat_in *in, int32_t **out,
                   int32_t *n_out, bool *think_open, reqerr *e);
/* Plain text to tokens (BOS where the vocab wants it). */
int chatfmt_text_tokens(const lms_model *m, const char *text, size_t len, bool add_special,
                        int32_t **out, int32_t *n_out, reqerr *e);
/* Text whose special tokens are tokens (a filled-in template), nothing
 * added: no BOS. */
int chatfmt_special_tokens(const lms_model *m, const char *text, size_t len, int32_t **out,
                           int32_t *n_out, reqerr *e);

/* ---- metrics (metrics.c) ------------------------------------------------------ */

#define METRICS_N_BUCKETS 14

typedef struct histo {
    uint64_t counts[METRICS_N_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} histo;

typedef struct metrics {
    uint64_t by_finish[6];       /* stop, length, abort, deadline, error, rejected */
    uint64_t http_by_code[600];  /* responses by status */
    uint64_t ws_messages_in, ws_messages_out;
    histo ttft, itl, e2e, queue;
    uint64_t total_gen_tokens;   /* tokens streamed to clients */
} metrics;

enum { FIN_STOP, FIN_LENGTH, FIN_ABORT, FIN_DEADLINE, FIN_ERROR, FIN_REJECTED };

void metrics_observe(histo *h, double seconds);
/* Records a terminal event (stats, finish reason). */
void metrics_on_terminal(metrics *m, const lms_event *ev);
void metrics_render_prom(lms_server *s, sbuf *out);
json_t *metrics_stats_json(lms_server *s);
/* The scheduler statistics of every ready expert added up (last_tps and
 * last_ttft_ms: the most recently used one's); returns how many are ready. */
int metrics_sched_sum(lms_server *s, lms_sched_stats *st);
/* The GPU monitor's latest snapshot as JSON ({"available":false,...} without NVML). */
json_t *metrics_gpu_json(lms_server *s);

/* ---- server (server.c) ----------------------------------------------------------- */

enum srv_state {
    SRV_LOADING = 0,
    SRV_READY,
    SRV_DRAINING,
    SRV_FAILED,
};

typedef struct evnode {
    lms_event *ev;
    double t_ms; /* when the scheduler produced it */
} evnode;

/* Serve-side state of one expert (registry entry of the same index). */
typedef struct sexpert {
    lms_supervisor *sup;       /* decode-speed floor (NULL: off) */
    bool restart;              /* restart its engine at the next wake-up */
} sexpert;

#define SRV_MAX_STALLED 16

struct lms_server {
    /* configuration (copied strings) */
    lms_server_params p;
    char *host, *api_key;
    char *lora_dir;            /* resolved (realpath), or NULL: no run-time adapter loads */
    json_t *tpl_kwargs;        /* template variables of every chat (chatfmt_kwargs), or NULL */
    json_t *gen_defaults;      /* sampling_defaults parsed (server_genparams), or NULL */
    struct resp_store *rstore; /* /v1/responses kept for previous_response_id (api_responses.c) */
    int rfmt;                  /* enum reasoning_format: the default of chat replies */
    int pooling;               /* --pooling: enum lms_pooling_type for decoders' embeddings,
                                * 0: their file's */
    struct lws_context *ctx;
    struct lws_vhost *vh;
    int port;

    /* mu: hand-off from other threads */
    pthread_mutex_t mu;
    evnode *q;                 /* pending events */
    size_t n_q, cap_q;
    bool wake_pending;         /* a lws_cancel_service is in flight */
    bool ctx_alive;            /* ctx may be woken */
    bool pend_poll;            /* the registry's loader finished a job */
    bool pend_lora;            /* an adapter load finished (api_lora_poll) */
    int stop_requests;
    lms_sched *pend_stalled[SRV_MAX_STALLED]; /* schedulers the watchdog saw stall */
    int n_stalled;
    bool stalled_all;          /* more than fit above: check every expert */

    /* event-loop thread only */
    int state;                 /* enum srv_state */
    bool done;                 /* lms_server_run returns */
    bool io_closing;           /* lws_context_destroy runs: ignore wake-ups */
    bool aborting;             /* draining: grace over, every request aborted */
    int exit_code;
    int stops_seen;
    lms_registry *reg;         /* the expert models (route/registry.h) */
    lms_router *router;        /* requests without a model */
    sexpert *xs;               /* [n_xs], one per expert */
    int n_xs;
    parked *park_head, *park_tail; /* requests waiting for a model to load */
    lora_job *lora_jobs;       /* adapter loads in flight (api_lora.c) */
    int n_lora_jobs;
    conn *conns;               /* every open connection */
    int n_conns, n_ws;
    task **tab;                /* live tasks by scheduler id */
    size_t tab_cap;
    size_t n_tasks;
    metrics met;
    lms_gpumon *gpu;           /* NVML through dlopen; polled by the tick */
    uint64_t n_restarts;       /* engine restarts after a stall */
    lws_sorted_usec_list_t sul_tick;
    double t_start_ms, t_last_broadcast, drain_deadline;
    int64_t t_start_wall;      /* seconds since the epoch */
    uint64_t next_cid;
    uint64_t n_pass;           /* lws_service calls so far (http_on_body_done) */
    uint64_t rng;              /* seeds and ids */
};

/* A LoRA adapter of a loaded model (api_lora.c). */
typedef struct sadapter {
    int id;                    /* stable while the model stays loaded */
    lms_lora *lora;            /* the table's reference */
    float scale;               /* for requests that name no adapters (llama-server's global
                                * scale); 0: only for requests that ask for it */
} sadapter;

#define SRV_MAX_ADAPTERS 16

/* What the server keeps with each loaded model (the registry's attach). */
typedef struct sattach {
    chatfmt fmt;               /* its chat template */
    sadapter ad[SRV_MAX_ADAPTERS];
    int n_ad, next_ad_id;
    float *docs;               /* the router's embedding model: every router document
                                * embedded, [n_docs][n_embd] unit length; else NULL */
    int n_docs;
    int32_t n_embd;
} sattach;

/* The chat template of a ready expert. */
static inline chatfmt *xfmt(const lms_expert *x)
{
    return &((sattach *)x->attach)->fmt;
}

/* x's id as a JSON string (a -m file name may hold any bytes). */
static inline json_t *xid_json(const lms_expert *x)
{
    return json_string_lossy(x->cfg->id, strlen(x->cfg->id));
}

/* The expert a request without a model goes to when nothing matches, and
 * the one named by /health and the op dialect's hello. */
lms_expert *server_default_expert(lms_server *s);
/* Restarts x's engine at the next wake-up (loop thread: the supervisor). */
void server_request_restart(lms_server *s, lms_expert *x);

/* Sends a JSON message to every WebSocket connection subscribed (op
 * dialect) or to all when all is true. */
void server_broadcast_ws(lms_server *s, json_t *msg, bool all);
/* A fresh pseudo-random 64-bit value (seeds, ids). */
uint64_t server_rand(lms_server *s);
/* Whether an Authorization / api_key value is valid (constant time). */
bool server_key_ok(const lms_server *s, const char *presented, size_t n);

/* ---- tasks (tasks.c) -------------------------------------------------------------- */

typedef struct task_ops {
    /* One event of this task; the event stays owned by the caller. t_ms:
     * when the scheduler produced it. The task is removed after its
     * terminal event (END or ERROR) returns. */
    void (*on_event)(task *t, const lms_event *ev, double t_ms);
    /* Frees state; called exactly once (after the terminal event, or when
     * the task is canceled). */
    void (*destroy)(task *t);
} task_ops;

struct task {
    uint64_t id;               /* scheduler request id */
    conn *c;                   /* owner; valid while the task is live */
    lms_expert *x;             /* the expert whose scheduler runs it */
    const task_ops *ops;
    void *state;
    double t_last_tok;         /* inter-token latency */
    int32_t n_prompt;          /* prompt tokens (local requests) */
    int32_t n_decoded;         /* tokens generated so far */
    int32_t max_tokens;        /* the request's limit (< 0: the context) */
    char peer[64];             /* client address, for the request log */
    task *c_next, *c_prev;     /* the connection's tasks */
    task *h_next;              /* hash chain */
    bool internal;             /* the server's own (a routing embedding): not counted as a
                                * client request in metrics and logs */
};

int tasks_init(lms_server *s);
void tasks_deinit(lms_server *s);
/* Fills the callback fields of r and submits it to the scheduler of c->x
 * (the expert pick_expert chose). Returns the live task, or NULL with e
 * filled (then state is not taken). */
task *task_submit(conn *c, lms_request *r, const task_ops *ops, void *state, reqerr *e);
/* The same for an expert served elsewhere (c->x->remote): the request's
 * text goes upstream as it is (route/remote.h). */
task *task_submit_remote(conn *c, lms_remote_request *r, const task_ops *ops, void *state,
                         reqerr *e);
/* Whether a terminal event ended t abnormally (an engine error, or an
 * abort): then e holds the error to answer with (task_error_status, or
 * 503 "the generation was aborted"). */
bool task_end_failed(const task *t, const lms_event *ev, reqerr *e);
/* The HTTP status of an LMS_EV_ERROR of t: 500 (the engine failed), or
 * for a remote expert the upstream's own 4xx, 504 (too slow) or 502. */
int task_error_status(const task *t, const lms_event *ev);
/* A WebSocket generation for a remote expert c->x: what (steals it; an
 * array of chat messages, a chat's fields as an object, else a prompt
 * string for a completion) with the generation fields of params
 * (reqparse_upstream; may be NULL) and gp's deadline. */
task *task_submit_upstream(conn *c, json_t *what, const json_t *params, const genparams *gp,
                           const task_ops *ops, void *state, reqerr *e);
/* Asks the task's engine (scheduler or remote) to stop it; its terminal
 * event follows. */
void task_abort(task *t);
/* Aborts the request in its engine and frees the task now. */
void task_cancel(task *t);
/* Routes one event (frees it). */
void task_dispatch(lms_server *s, lms_event *ev, double t_ms);
/* The scheduler callback (scheduler thread): queue + wake. */
void task_sched_cb(void *user, lms_event *ev);

/* ---- model choice and parked requests (pick.c) ------------------------------------- */

/* A request handler that can run again on the same body (HTTP routes, the
 * WebSocket dialects). */
typedef int (*pick_fn)(conn *c, json_t *body);

/* Chooses the expert of a request: body's "model" (an expert id, a model
 * file's base name, "NAME:latest"), or with no model or "auto" the router
 * on the request's text. Returns 1 when that expert is ready (c->x is
 * set); 0 when it is loading: the request is parked and fn(c, body) runs
 * again once it is ready, or the request gets an error if the load fails;
 * -1 with e filled (404 unknown model, 503 loading at start or refused). */
int pick_expert(conn *c, json_t *body, pick_fn fn, reqerr *e);
/* Loop thread: x changed state; re-dispatches or fails its parked requests. */
void pick_on_change(lms_server *s, lms_expert *x);
/* The connection is going: forget its parked requests. */
void pick_drop_conn(conn *c);
/* Shutdown: answers every parked request with a 503. */
void pick_fail_all(lms_server *s, const char *msg);
/* "the model 'X' does not exist ..." (404 model_not_found). */
int pick_not_found(lms_server *s, const char *model, reqerr *e);

/* ---- connections (conn.c) ------------------------------------------------------ */

enum conn_role { CONN_HTTP = 0, CONN_WS = 1 };
enum { DIALECT_NONE = 0, DIALECT_OP, DIALECT_TYPE };

enum txn_state {
    TXN_IDLE = 0, /* waiting for a request */
    TXN_BODY,     /* reading the request body */
    TXN_RUNNING,  /* a job works on it; nothing sent yet */
    TXN_STREAM,   /* headers sent, chunks flowing */
    TXN_DONE,     /* the whole response is queued */
};

typedef struct http_txn {
    int state;
    int method;                /* LWSHUMETH_* */
    char path[256];
    int route;                 /* index in the route table or -1 */
    sbuf body;
    bool discard;              /* error already queued; ignore the body */
    bool close_after;
    bool http10;               /* HTTP/1.0 client: no chunked encoding */
    bool chunked;
    int status;
    uint64_t done_pass;        /* lws_service pass of the last repeated body end */
    int done_repeats;          /* and how many came in it (http_on_body_done) */
} http_txn;

typedef struct wsmsg {
    struct wsmsg *next;
    size_t n;
    unsigned char data[];      /* LWS_PRE headroom, then n bytes */
} wsmsg;

struct conn {
    char peer[64];             /* client address, for the request log */
    lms_server *srv;
    struct lws *wsi;
    uint64_t cid;
    unsigned n_done;           /* HTTP transactions completed (http_on_request) */
    int role;                  /* enum conn_role */
    bool closed;               /* lws closed it; write nothing */
    bool kill;                 /* close at the next writable */
    task *tasks;
    conn *next, *prev;         /* server list */
    /* output */
    sbuf out;                  /* HTTP bytes not yet written */
    size_t out_off;
    wsmsg *wq_head, *wq_tail;  /* WebSocket messages not yet written */
    size_t out_bytes;          /* both, for back-pressure */
    /* HTTP */
    http_txn txn;
    /* WebSocket */
    sbuf rx;                   /* message being reassembled */
    bool rx_active, rx_binary, rx_too_big;
    int close_code;            /* close with this code once the output is flushed */
    int dialect;
    lms_lora *lora;            /* type dialect: the session's adapter (load_adapter), owned */
    lms_expert *lora_x;        /* the expert it was loaded for */
    float lora_scale;
    lms_expert *x;             /* the expert of the request being handled (pick_expert) */
    lms_expert *again;         /* set while a parked request runs again: the expert it
                                * waited for (not routed a second time) */
    bool op_subscribed;        /* op: 1-second metrics */
    task *op_task;             /* op: the connection's generation */
};

conn *conn_create(lms_server *s, struct lws *wsi);
/* The socket is gone: abort tasks, free everything. */
void conn_destroy(conn *c);
/* Aborts and frees every task of c (socket closing). */
void conn_cancel_tasks(conn *c);
/* Queues raw HTTP bytes / one WebSocket text message; -1 when over the
 * back-pressure limit (the connection is then killed). */
int conn_out_raw(conn *c, const void *p, size_t n);
int conn_out_ws(conn *c, const char *p, size_t n);
/* Serializes j and queues it as a WebSocket message; steals j. */
int conn_out_ws_json(conn *c, json_t *j);
void conn_want_write(conn *c);
/* Writes what the socket takes; returns -1 to close the connection. */
int conn_flush(conn *c);
bool conn_idle_out(const conn *c);

/* ---- HTTP (http.c) ----------------------------------------------------------------- */

int http_on_request(conn *c, const char *uri);
int http_on_body(conn *c, const void *p, size_t n);
int http_on_body_done(conn *c);
int http_on_writable(conn *c);

/* Responses (one per transaction). Headers are written by the server. */
int http_reply(conn *c, int status, const char *ctype, const char *body, size_t n);
int http_reply_json(conn *c, int status, json_t *j);  /* steals j */
int http_reply_err(conn *c, const reqerr *e);
int http_stream_begin(conn *c, int status, const char *ctype);
int http_stream_write(conn *c, const char *p, size_t n);
int http_sse_json(conn *c, json_t *j); /* one "data: JSON" event of a stream; steals j */
int http_sse_event(conn *c, const char *type, json_t *o); /* "event: TYPE" then o; steals o */
int http_stream_end(conn *c);

/* ---- endpoints ------------------------------------------------------------------------ */

/* api_openai.c */
int api_chat(conn *c, json_t *body);
int api_completions(conn *c, json_t *body);
int api_models(conn *c, const char *id);
/* api_native.c: the fill-in-the-middle prompt of (prefix, suffix) with the
 * model's FIM tokens, laid out as /infill lays it (for Ollama's and
 * OpenAI's `suffix`); a 400 for a model without them. */
int api_fim_prompt(const lms_expert *x, const char *prefix, const char *suffix,
                   int32_t n_predict, int32_t **toks, int32_t *n, reqerr *e);
/* api_responses.c */
int api_responses(conn *c, json_t *body);
/* api_anthropic.c: POST /v1/messages and /v1/messages/count_tokens */
int api_anthropic_messages(conn *c, json_t *body);
int api_anthropic_count(conn *c, json_t *body);
/* Anthropic's error object for e ({"type": "error", "error": {type, message}}) */
json_t *api_anthropic_error(const reqerr *e);
/* whether path is one of Anthropic's endpoints (its errors take that shape) */
bool api_anthropic_path(const char *path);
/* GET (del false) or DELETE /v1/responses/{id}: a stored response. */
int api_responses_get(conn *c, const char *id, bool del);
/* api_embeddings.c */
int api_embeddings(conn *c, json_t *body);
/* POST /embedding: llama-server's own form ("input" or "content"), [{index, embedding: [v]}] */
int api_embedding_native(conn *c, json_t *body);
int api_rerank(conn *c, json_t *body);
/* api_ollama.c */
int api_ollama_chat(conn *c, json_t *body);
int api_ollama_generate(conn *c, json_t *body);
int api_ollama_show(conn *c, json_t *body);
int api_ollama_tags(conn *c);
int api_ollama_ps(conn *c);
int api_ollama_version(conn *c);
int api_ollama_pull(conn *c, json_t *body);
int api_ollama_unsupported(conn *c, json_t *body); /* /api/push, /api/create, /api/copy */
/* reqparse.c: a request's JSON schema compiled for JSON mode, or NULL with
 * a 400 naming param */
struct lms_jschema *api_compile_schema(const json_t *schema, const char *param, reqerr *e);
/* api_embeddings.c: Ollama's /api/embed and /api/embeddings */
int api_ollama_embed(conn *c, json_t *body);
int api_ollama_embeddings(conn *c, json_t *body);
/* api_openai.c: a generated token's log-probability entry as chat
 * completions give it ({token, logprob, bytes, top_logprobs: [...]}),
 * each with the token's "id" too when with_id. */
json_t *api_lp_entry(const lms_model *m, const lms_event *ev, bool with_id);
/* api_native.c: llama-server's POST /completion and POST /infill */
int api_native_completion(conn *c, json_t *body);
int api_native_infill(conn *c, json_t *body);
/* api_props.c: llama-server's GET /props, GET /slots and POST /apply-template */
int api_props(conn *c);
int api_slots(conn *c);
int api_apply_template(conn *c, json_t *body);
/* api_tokens.c */
int api_tokenize(conn *c, json_t *body);
int api_detokenize(conn *c, json_t *body);
/* The text of token ids n (special: control tokens shown), appended to
 * out, as /detokenize gives it; an id outside the vocabulary is a 400
 * naming field[i]. */
int api_detok_text(const lms_tokenizer *tok, const int32_t *ids, int32_t n, bool special,
                   const char *field, sbuf *out, reqerr *e);
/* api_lora.c: LoRA adapters. The adapters of a request on c->x: its "lora"
 * list ([{"id", "scale"}], as llama-server; ids not listed get 0) or, with
 * none, every adapter of the expert whose scale is not 0; into gp. 400
 * naming the field on a bad list. */
int api_lora_pick(conn *c, const json_t *o, genparams *gp, reqerr *e);
/* GET / POST /lora-adapters (list; set scales), POST /lora-adapters/load
 * and /lora-adapters/unload. */
int api_lora_list(conn *c);
int api_lora_scales(conn *c, json_t *body);
int api_lora_load(conn *c, json_t *body);
int api_lora_unload(conn *c, json_t *body);
/* The end of an adapter load (loop thread): c->x is the expert it was
 * loaded for; l is a new reference that fn owns, or NULL with e filled (400
 * not an adapter of that model). */
typedef void (*lora_done_fn)(conn *c, json_t *msg, lms_lora *l, const reqerr *e);
/* Starts loading the adapter at path (inside the server's lora_dir) for
 * c->x's model on a worker thread; the path is checked here first: < 0
 * with e filled (403 outside the folder or no folder, 404 missing, 503 too
 * many loads at once). fn(c, msg, ...) runs when the load ends, unless c
 * has gone by then (the adapter is released); msg is kept until then. */
int api_lora_begin(conn *c, const char *path, json_t *msg, lora_done_fn fn, reqerr *e);
/* Loop thread (pend_lora): finishes the loads that ended. */
void api_lora_poll(lms_server *s);
/* The connection is going: its loads end unanswered. */
void api_lora_drop_conn(conn *c);
/* Shutdown: waits for the loads in flight and frees them. */
void api_lora_join(lms_server *s);
/* Loader thread: the adapters expert x was started with, into a; < 0 with
 * a message (the load fails). hook_release frees them (api_lora_free). */
int api_lora_prepare(sattach *a, const lms_expert *x, const lms_model *m, char *err,
                     size_t errsz);
void api_lora_free(sattach *a);
/* api_ops.c */
int api_health(conn *c);
int api_stats(conn *c);
int api_metrics(conn *c);

/* ---- WebSocket (ws.c, ws_op.c, ws_type.c) --------------------------------------------- */

/* LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION: path, auth, state; nonzero refuses
 * (an HTTP error has then been written). */
int ws_filter(conn *c);
int ws_on_open(conn *c);
int ws_on_receive(conn *c, const void *in, size_t len);
int ws_on_writable(conn *c);
/* Sends an error in the connection's dialect (both keys if unknown). */
void ws_send_error(conn *c, const char *session_id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void ws_op_hello(conn *c);
void ws_op_handle(conn *c, json_t *msg);
json_t *ws_op_metrics_msg(lms_server *s);
void ws_type_handle(conn *c, json_t *msg);
/* The dialects' generation handlers as pick_expert re-runs them (pick.c
 * lets these reach a remote expert). */
int ws_op_infer_again(conn *c, json_t *msg);
int ws_type_again(conn *c, json_t *msg);

/* Prompt tokens and request for a WS generation (shared by both dialects). */
bool ws_check_ready(conn *c, const char *session_id);

#endif
