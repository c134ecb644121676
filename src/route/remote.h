/*
 * remote.h - an expert served elsewhere: another OpenAI-compatible server
 * (lmserv, llama-server, vLLM, Ollama's /v1, OpenAI) behind an expert id.
 *
 * To the serve layer it looks like a scheduler: a request goes in
 * (lms_remote_submit: the upstream path and the JSON body, built by the
 * serve layer from the client's request) and events come out through the
 * request's callback, the same lms_event the scheduler delivers:
 *
 *   LMS_EV_TOKEN   one per text piece of the upstream stream (token 0:
 *                  a piece, no token id; no log-probabilities); token
 *                  LMS_REMOTE_CALL: one function call (below)
 *   LMS_EV_END     stats: prompt / generated tokens from the upstream's
 *                  usage (pieces counted when it sends none), TTFT, total
 *                  ms, finish "stop" | "length" | "abort" | "deadline"
 *   LMS_EV_ERROR   message names the expert and what went wrong; `token`
 *                  holds the upstream's HTTP status (0: no answer came)
 *
 * Every accepted request gets exactly one terminal event, as with the
 * scheduler. Requests always go upstream with "stream": true and
 * stream_options.include_usage; the Server-Sent Events are parsed as they
 * arrive (lms_sse_feed, lms_remote_parse_chunk), so a streamed client
 * gets pieces as the upstream makes them.
 *
 * Threads: one worker thread per remote expert runs a curl multi handle
 * (all its transfers); submit / abort / stats are called from any thread
 * (the event loop) and wake it with curl_multi_wakeup. Callbacks run on
 * the worker thread and must not block. Abort removes the transfer at
 * once: the upstream sees its connection close.
 *
 * Function calls: for a request whose body has "tools", the upstream's
 * message.tool_calls, or the pieces of delta.tool_calls put together by
 * their index (the name, then fragments of the arguments), are passed on
 * once the upstream has finished, after the text, as one LMS_EV_TOKEN per
 * call with token LMS_REMOTE_CALL and text {"name": ..., "arguments":
 * {...}} (JSON). A call without a name, or whose arguments are not a JSON
 * object, fails the request (LMS_EV_ERROR naming the call) rather than
 * reaching the client mangled. Without "tools" calls are ignored.
 *
 * The api_key goes only into the request's Authorization header; no
 * message or log here shows it.
 */
#ifndef LMS_ROUTE_REMOTE_H
#define LMS_ROUTE_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/sched.h"
#include "route/config.h"

typedef struct lms_remote lms_remote;

/* The token of an LMS_EV_TOKEN that carries a function call, not text. */
#define LMS_REMOTE_CALL (-2)

typedef struct lms_remote_request {
    bool chat;                 /* "chat/completions" (deltas) or "completions" (text) */
    const char *body;          /* JSON body, copied by submit; "model" and "stream" are
                                * set by submit */
    size_t n_body;
    double timeout_ms;         /* this request's deadline; 0: the expert's timeout_s */
    lms_event_fn cb;
    void *user;
} lms_remote_request;

typedef struct lms_remote_stats {
    int32_t n_running;
    uint64_t n_requests;       /* finished, by outcome: */
    uint64_t n_aborted, n_failed;
    uint64_t prompt_tokens, gen_tokens;
    double last_tps, last_ttft_ms;
} lms_remote_stats;

/* Starts the worker of expert e (e->endpoint set); e is borrowed and must
 * outlive the object. */
int lms_remote_create(const lms_expert_cfg *e, lms_remote **out, char *err, size_t errsz);
/* Ends every request (finish "abort"), stops the worker. NULL is a no-op. */
void lms_remote_destroy(lms_remote *r);
/* Queues a request: 0 and its id (unique among scheduler and remote
 * requests), or < 0 with a message (LMS_ERR_INVAL: the body is not a JSON
 * object). */
int lms_remote_submit(lms_remote *r, const lms_remote_request *q, uint64_t *id, char *err,
                      size_t errsz);
/* Stops a request now; it ends with finish "abort". Unknown ids are ignored. */
void lms_remote_abort(lms_remote *r, uint64_t id);
void lms_remote_get_stats(lms_remote *r, lms_remote_stats *out);

/* ---- the upstream's stream (pure functions; unit-tested) ---------------------------- */

/* Server-Sent Events reader: bytes in, one call of on_data per event with
 * its data (several data: lines joined by '\n'). Lines end in LF, CRLF or
 * CR; comments and other fields are skipped. An event's data is capped at
 * LMS_SSE_MAX bytes (the rest is dropped and the event flagged). */
#define LMS_SSE_MAX (1u << 20)

typedef struct lms_sse {
    char *line;                /* the line being read */
    size_t n_line, cap_line;
    char *data;                /* the event's data so far */
    size_t n_data, cap_data;
    bool has_data;
    bool cr;                   /* the last byte was CR (a following LF ends nothing) */
    bool overflow;             /* this event went over LMS_SSE_MAX */
    bool line_over;            /* the line being read went over it (its bytes are dropped) */
} lms_sse;

typedef void (*lms_sse_fn)(void *ud, const char *data, size_t n, bool overflow);

void lms_sse_init(lms_sse *p);
void lms_sse_deinit(lms_sse *p);
/* < 0 when out of memory. */
int lms_sse_feed(lms_sse *p, const char *bytes, size_t n, lms_sse_fn on_data, void *ud);

/* A piece of a function call (chat): a streamed call comes in pieces that
 * share its index (OpenAI: the first with the name, then fragments of the
 * arguments' JSON text); a whole message's calls come whole. */
typedef struct lms_remote_call_piece {
    int64_t index;             /* the call's index (the array position when not given) */
    char *name;                /* malloc'd, or NULL when this piece has none */
    char *args;                /* malloc'd piece of the arguments' JSON text, or NULL */
    size_t n_args;
} lms_remote_call_piece;

/* One data payload of an OpenAI stream. */
typedef struct lms_remote_delta {
    bool done;                 /* "[DONE]" */
    char *text;                /* malloc'd text piece (content delta / completion text) or NULL */
    size_t n_text;
    char *thought;             /* malloc'd piece of the reply's thoughts (chat: the delta's or
                                * message's reasoning_content, or vLLM's reasoning) or NULL */
    size_t n_thought;
    const char *finish;        /* static: "stop", "length", ... or NULL */
    int64_t n_prompt, n_gen;   /* usage; -1 when absent */
    char *error;               /* malloc'd error message ({"error": ...} in the stream) or NULL */
    lms_remote_call_piece *calls; /* malloc'd: chat's tool_calls in this payload, or NULL */
    int n_calls;
} lms_remote_delta;

/* Parses one payload; < 0 when it is not JSON (LMS_ERR_FORMAT). */
int lms_remote_parse_chunk(const char *data, size_t n, bool chat, lms_remote_delta *out);
void lms_remote_delta_free(lms_remote_delta *d);
/* The message of an OpenAI error body ({"error": {"message"}} or
 * {"error": "..."}, or {"message"} / {"detail"}); NULL when none (malloc'd). */
char *lms_remote_error_message(const char *body, size_t n);

#endif
