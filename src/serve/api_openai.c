/*
 * api_openai.c - POST /v1/chat/completions and /v1/completions, streamed
 * (Server-Sent Events) and not. Shapes follow docs/OPENAI.md; the official
 * client libraries must work unchanged.
 *
 * A request becomes one scheduler task whose state is a `gen_job`. The
 * stream starts as soon as the scheduler accepts the request (chat sends
 * the assistant role chunk at once); each token event becomes one chunk;
 * the end event brings the finish reason and usage:
 *
 *   data: {chunk: delta role}          chat only
 *   data: {chunk: delta content}...    one per token event with text
 *   data: {chunk: delta {}, finish_reason}
 *   data: {chunk: choices [], usage}   with stream_options.include_usage
 *   data: [DONE]
 *
 * Without stream the text and logprobs accumulate and one response goes
 * out at the end.
 *
 * `n` > 1 (and, for completions, several prompts) makes one response of
 * several choices: each choice is its own scheduler task (`gen_job`, its
 * index prompt * n + i) sharing a `gen_resp`, all submitted at once; the
 * scheduler holds a prompt's other choices until its first has prefilled
 * the prompt, so they compute only its last partial block. Streamed,
 * each choice's chunks carry its index and end with its own finish chunk;
 * the usage chunk and [DONE] follow the last. Not streamed, the reply goes
 * out when every choice has ended. The prompt is counted once per prompt in
 * the usage; choice i samples with seed + i. One choice failing fails the
 * response: the error goes out and the other choices are aborted.
 *
 * response_format json_object / json_schema, and tool_choice naming a
 * function (or "required", api_forced_call), turn on the scheduler's JSON mode
 * (engine/jsonschema.h) for every choice. Completions with echo and
 * logprobs also ask the scheduler for the prompt's log-probabilities.
 *
 * A chat request with `tools` (and tool_choice other than "none") has its
 * reply searched for function calls (toolcall.h): they become
 * `message.tool_calls` (streamed: one delta with every call, just before
 * the final chunk) and finish_reason "tool_calls"; text before the calls
 * stays content. While streaming, text that may still turn into a call is
 * held back until it is known. An error after the stream started is sent as
 * `data: {"error":{...}}` followed by [DONE].
 *
 * A remote expert (route/remote.h) answers the same way: the client's
 * body, less what is ours (model, n, stream, lora, timeout), goes upstream
 * untokenized, one upstream request per choice (each prompt of a
 * completion, seed + i for choice i), and its events feed the same
 * gen_job. Its stream opens with the first piece rather than at once, so
 * that an upstream refusal is still an HTTP error (502, 504, or the
 * upstream's own 4xx) naming the expert. tools, tool_choice,
 * parallel_tool_calls, response_format and the conversation's tool_calls
 * and tool messages go upstream as written (tool_choice "none" sends no
 * tools); the calls of its reply come
 * apart from the text (route/remote.h, LMS_REMOTE_CALL) and go out as a
 * local model's do (a malformed one fails the reply: 502, or an error
 * event once streaming). Log-probabilities, echo and token-id prompts stay
 * local-only (400).
 */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "model/tokenizer.h"
#include "engine/jsonschema.h"
#include "serve/reply.h"
#include "serve/serve_int.h"

enum { JOB_CHAT, JOB_COMPL };

/* Most choices in one response (n times the prompts). */
#define MAX_CHOICES 64

typedef struct gen_job gen_job;

/* One prompt of a request: its tokens and, to echo, its text. */
typedef struct gen_prompt {
    int32_t *toks;
    int32_t n;
    char *echo;
} gen_prompt;

/* One response: what its choices share. */
typedef struct gen_resp {
    int kind;
    bool stream, include_usage;
    int logprobs;              /* -1 none, else alternatives per token (0..20) */
    char id[48];
    int64_t created;
    bool tools;                /* chat with tools: replies are searched for calls */
    char **fn_names;           /* with tools: their names (toolcall_names), or NULL; owned */
    int rfmt;                  /* chat: enum reasoning_format ("reasoning_format") */
    bool think_open;           /* chat: the prompt opened <think> (reasoning.h) */
    bool json;                 /* response_format json_object: JSON mode */
    lms_jschema *schema;       /* response_format json_schema: its schema, compiled */
    bool prompt_lp;            /* completions with echo and logprobs: the prompt's too */
    int n;                     /* choices per prompt */
    int n_choices;             /* choices in all */
    int n_live;                /* choices not yet ended */
    int refs;                  /* tasks submitted and not yet destroyed: r goes with the last */
    bool failed;               /* an error went out; the other choices were aborted */
    genparams gp;              /* sampling */
    int n_prompts;
    gen_prompt pr[MAX_CHOICES];
    gen_job *jobs[MAX_CHOICES];
    const lms_expert *x;       /* the expert answering (its id is the response's model) */
    bool begun;                /* streamed: the 200 and the first chunks went out */
    json_t *up;                /* remote: the upstream body (prompt set per choice) */
    json_t *prompts;           /* remote completions: several prompts (an array), or NULL */
} gen_resp;

/* One choice: one scheduler task. */
struct gen_job {
    gen_resp *r;
    int index;
    task *t;                   /* NULL once ended or destroyed */
    sbuf text;                 /* non-streamed answer */
    json_t *lp;                /* non-streamed logprobs (chat: content array; legacy object) */
    size_t text_off;           /* legacy logprobs text_offset */
    const char *echo;          /* completions: its prompt's text to echo, or NULL */
    size_t echo_len;
    reply_cut cut;             /* chat: thoughts, content and calls of the reply */
    toolcalls calls;           /* chat, remote: the upstream's calls (chatfmt_remote_call) */
    bool calls_lost;           /* one of them could not be kept (out of memory) */
    size_t plp_off;            /* prompt log-probabilities: text offset of the next token */
    const char *finish;        /* after a normal end: the finish reason */
    lms_req_stats stats;       /* after a normal end */
};

/* ---- logprobs ------------------------------------------------------------------- */

static json_t *piece_bytes(const char *p, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* Text of one token (bytes; may be part of a character). */
static int token_piece(const lms_model *m, int32_t id, char *buf, size_t cap)
{
    int n = lms_token_to_piece(m->tok, id, false, buf, cap);
    return n < 0 ? 0 : n;
}

static json_t *chat_lp_item(const lms_model *m, int32_t id, float lp, bool with_top, bool with_id)
{
    char piece[512];
    int n = token_piece(m, id, piece, sizeof piece);
    json_t *o = json_object();
    if (with_id)
        json_object_set_new(o, "id", json_integer(id));
    json_object_set_new(o, "token", json_string_lossy(piece, (size_t)n));
    json_object_set_new(o, "logprob", json_real_safe(lp));
    json_object_set_new(o, "bytes", piece_bytes(piece, n));
    if (with_top)
        json_object_set_new(o, "top_logprobs", json_array());
    return o;
}

json_t *api_lp_entry(const lms_model *m, const lms_event *ev, bool with_id)
{
    json_t *o = chat_lp_item(m, ev->token, ev->logprob, true, with_id);
    json_t *top = json_object_get(o, "top_logprobs");
    for (int i = 0; i < ev->n_top && i < LMS_MAX_LOGPROBS; i++)
        json_array_append_new(top,
                              chat_lp_item(m, ev->top[i].id, ev->top[i].logprob, false, with_id));
    return o;
}

static json_t *chat_lp_entry(const lms_model *m, const lms_event *ev)
{
    return api_lp_entry(m, ev, false);
}

/* Legacy completions logprobs: parallel arrays, appended token by token. */
static void legacy_lp_add(json_t *lp, const lms_model *m, const lms_event *ev, size_t offset)
{
    char piece[512];
    int n = token_piece(m, ev->token, piece, sizeof piece);
    json_array_append_new(json_object_get(lp, "tokens"), json_string_lossy(piece, (size_t)n));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real_safe(ev->logprob));
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
    json_t *top = json_object();
    for (int i = 0; i < ev->n_top && i < LMS_MAX_LOGPROBS; i++) {
        n = token_piece(m, ev->top[i].id, piece, sizeof piece - 1);
        sbuf key = {0};
        sbuf_add_utf8(&key, piece, (size_t)n);
        json_object_set_new(top, key.p ? key.p : "", json_real_safe(ev->top[i].logprob));
        sbuf_free(&key);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
}

static json_t *legacy_lp_new(void)
{
    json_t *o = json_object();
    json_object_set_new(o, "tokens", json_array());
    json_object_set_new(o, "token_logprobs", json_array());
    json_object_set_new(o, "top_logprobs", json_array());
    json_object_set_new(o, "text_offset", json_array());
    return o;
}

/* The bytes a prompt token's piece (n bytes) spans in the echoed text from
 * j->plp_off: all of them where the text has them; one fewer for a
 * leading space the detokenizer dropped (SentencePiece's first word);
 * none for a control token (its piece is empty); never past the end. So
 * text_offset points into the text the response returns. */
static size_t echo_span(const gen_job *j, const char *p, size_t n)
{
    const size_t at = j->plp_off, left = j->echo_len - at;
    if (n <= left && !memcmp(j->echo + at, p, n))
        return n;
    if (n > 0 && p[0] == ' ' && n - 1 <= left && !memcmp(j->echo + at, p + 1, n - 1))
        return n - 1;
    return n < left ? n : left;
}

/* Legacy logprobs of echoed prompts: the first token with null entries
 * (nothing comes before it), then one entry per LMS_EV_PROMPT. */
static void prompt_lp_first(const lms_model *m, gen_job *j, int32_t tok)
{
    char piece[512];
    int n = token_piece(m, tok, piece, sizeof piece);
    json_array_append_new(json_object_get(j->lp, "tokens"), json_string_lossy(piece, (size_t)n));
    json_array_append_new(json_object_get(j->lp, "token_logprobs"), json_null());
    json_array_append_new(json_object_get(j->lp, "top_logprobs"), json_null());
    json_array_append_new(json_object_get(j->lp, "text_offset"), json_integer(0));
    j->plp_off = echo_span(j, piece, (size_t)n);
}

static void prompt_lp_add(const lms_model *m, gen_job *j, const lms_event *ev)
{
    char piece[512];
    legacy_lp_add(j->lp, m, ev, j->plp_off);
    const int n = token_piece(m, ev->token, piece, sizeof piece);
    j->plp_off += echo_span(j, piece, (size_t)n);
}

/* ---- chunks -------------------------------------------------------------------------- */

static json_t *chunk_new(const gen_resp *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id));
    const char *object = r->kind == JOB_CHAT ? "chat.completion.chunk" : "text_completion";
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(r->created));
    json_object_set_new(o, "model", xid_json(r->x));
    if (r->include_usage)
        json_object_set_new(o, "usage", json_null());
    return o;
}

/* One choice of a chunk; text may be NULL (final chunk). Steals lp. */
static json_t *chunk_choice(const gen_job *j, const char *text, size_t n, const char *role,
                            const char *finish, json_t *lp)
{
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(j->index));
    if (j->r->kind == JOB_CHAT) {
        json_t *delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string(role));
        if (text)
            json_object_set_new(delta, "content", json_string_lossy(text, n));
        json_object_set_new(ch, "delta", delta);
    } else {
        json_object_set_new(ch, "text", json_string_lossy(text ? text : "", text ? n : 0));
    }
    json_object_set_new(ch, "logprobs", lp ? lp : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    return ch;
}

static int sse_choice(conn *c, const gen_job *j, json_t *choice)
{
    json_t *o = chunk_new(j->r);
    json_t *arr = json_array();
    json_array_append_new(arr, choice);
    json_object_set_new(o, "choices", arr);
    return http_sse_json(c, o);
}

/* The response's usage: every choice's generated tokens, each prompt's
 * tokens once (from its first choice). */
static json_t *usage_json(const gen_resp *r)
{
    int64_t n_prompt = 0, n_cached = 0, n_gen = 0, n_think = 0;
    for (int i = 0; i < r->n_choices; i++) {
        const gen_job *j = r->jobs[i];
        n_gen += j->stats.n_gen;
        n_think += j->stats.n_think;
        if (i % r->n == 0) {
            n_prompt += j->stats.n_prompt;
            n_cached += j->stats.n_cached;
        }
    }
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(n_gen));
    json_object_set_new(u, "total_tokens", json_integer(n_prompt + n_gen));
    json_t *det = json_object();
    json_object_set_new(det, "cached_tokens", json_integer(n_cached));
    json_object_set_new(u, "prompt_tokens_details", det);
    if (r->kind == JOB_CHAT)
        json_object_set_new(u, "completion_tokens_details",
                            json_pack("{s:I}", "reasoning_tokens", (json_int_t)n_think));
    return u;
}

static const char *finish_reason(const char *f)
{
    if (!f || !strcmp(f, "stop"))
        return "stop";
    if (!strcmp(f, "length") || !strcmp(f, "deadline"))
        return "length";
    return NULL; /* aborted: not a normal end */
}

/* ---- events ------------------------------------------------------------------------ */

/* Whether a chat's thoughts go out apart from its content. */
static bool split_thoughts(const gen_resp *r)
{
    return r->kind == JOB_CHAT && r->rfmt == REASONING_DEEPSEEK;
}

/* Streamed with tools or thoughts: sends what of the reply so far can go
 * out as one chunk with reasoning_content and / or content; lp (stolen)
 * rides along. At the end (tc set) all of it but the calls, read into *tc. */
static void stream_release(conn *c, gen_job *j, json_t *lp, toolcalls *tc)
{
    reply_part p;
    reply_cut_next(&j->cut, j->text.p, j->text.n, &p, tc);
    if (p.c_n == 0 && p.r_n == 0 && !lp)
        return;
    json_t *ch = chunk_choice(j, p.c_n ? j->text.p + p.c_from : NULL, p.c_n, NULL, NULL, lp);
    if (p.r_n)
        json_object_set_new(json_object_get(ch, "delta"), "reasoning_content",
                            json_string_lossy(j->text.p + p.r_from, p.r_n));
    sse_choice(c, j, ch);
}

static void on_token(task *t, gen_job *j, const lms_event *ev)
{
    const lms_model *m = t->x->model;
    const gen_resp *r = j->r;
    bool lp = r->logprobs >= 0 && ev->token >= 0;
    if (r->stream) {
        if (ev->text_len == 0 && !lp)
            return;
        json_t *l = NULL;
        if (lp && r->kind == JOB_CHAT) {
            l = json_object();
            json_t *content = json_array();
            json_array_append_new(content, chat_lp_entry(m, ev));
            json_object_set_new(l, "content", content);
        } else if (lp) {
            l = legacy_lp_new();
            legacy_lp_add(l, m, ev, j->text_off);
        }
        j->text_off += ev->text_len;
        if (r->tools || split_thoughts(r)) { /* what may still turn into a call or a tag waits */
            sbuf_add(&j->text, ev->text, ev->text_len);
            stream_release(t->c, j, l, NULL);
            return;
        }
        sse_choice(t->c, j, chunk_choice(j, ev->text, ev->text_len, NULL, NULL, l));
        return;
    }
    if (lp && r->kind == JOB_CHAT)
        json_array_append_new(j->lp, chat_lp_entry(m, ev));
    else if (lp)
        legacy_lp_add(j->lp, m, ev, j->text.n);
    sbuf_add(&j->text, ev->text, ev->text_len);
}

/* An end that is not a normal finish: an engine error, an abort (only
 * the server aborts a request whose client is still there), or a remote
 * expert's call that could not be kept. */
static void end_error(const conn *c, const task *t, const lms_event *ev, reqerr *e)
{
    const gen_job *j = t->state;
    if (ev->type != LMS_EV_ERROR && j->calls_lost) {
        reqerr_set(e, 503, NULL, "out of memory for the upstream's tool calls");
        return;
    }
    if (ev->type == LMS_EV_ERROR) {
        reqerr_set(e, task_error_status(t, ev), NULL, "%s", ev->message);
        if (t->x->remote)
            e->code = "upstream_error";
    }
    else
        reqerr_set(e, 503, NULL, "%s", c->srv->state == SRV_DRAINING
                                           ? "the server is shutting down"
                                           : "the generation was aborted");
}

/* OpenAI's tool_calls array; streamed deltas also carry each call's index. */
static json_t *tool_calls_json(lms_server *s, const toolcalls *tc, bool with_index)
{
    json_t *a = json_array();
    for (int i = 0; i < tc->n; i++) {
        char id[32];
        snprintf(id, sizeof id, "call_%016llx", (unsigned long long)server_rand(s));
        json_t *fn = json_object();
        json_object_set_new(fn, "name", json_string_lossy(tc->v[i].name, strlen(tc->v[i].name)));
        json_object_set_new(fn, "arguments",
                            json_string_lossy(tc->v[i].arguments, strlen(tc->v[i].arguments)));
        json_t *call = json_object();
        if (with_index)
            json_object_set_new(call, "index", json_integer(i));
        json_object_set_new(call, "id", json_string(id));
        json_object_set_new(call, "type", json_string("function"));
        json_object_set_new(call, "function", fn);
        json_array_append_new(a, call);
    }
    return a;
}

/* Streamed with tools, thoughts or a remote expert's calls, at a normal
 * end: sends what was held back, then the calls in one delta; returns the
 * finish reason. */
static const char *stream_flush(conn *c, gen_job *j, const char *finish)
{
    if (!j->r->tools && !split_thoughts(j->r) && j->calls.n == 0)
        return finish;
    toolcalls tc = {0};
    stream_release(c, j, NULL, &tc);
    chatfmt_take_calls(&tc, &j->calls);
    if (tc.n) {
        json_t *ch = chunk_choice(j, NULL, 0, NULL, NULL, NULL);
        json_object_set_new(json_object_get(ch, "delta"), "tool_calls",
                            tool_calls_json(c->srv, &tc, true));
        sse_choice(c, j, ch);
        finish = "tool_calls";
    }
    toolcalls_free(&tc);
    return finish;
}

/* One choice as the non-streamed response has it. */
static json_t *choice_json(lms_server *s, gen_job *j)
{
    const gen_resp *r = j->r;
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(j->index));
    const char *finish = j->finish;
    const char *t = j->text.p ? j->text.p : "";
    toolcalls tc;
    reply_part p;
    reply_cut_next(&j->cut, t, j->text.n, &p, &tc);
    chatfmt_take_calls(&tc, &j->calls);
    json_t *text = json_string_lossy(t + p.c_from, p.c_n);
    if (r->kind == JOB_CHAT) {
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        json_object_set_new(msg, "content", tc.n && p.c_n == 0 ? json_null() : json_incref(text));
        json_decref(text);
        if (r->rfmt == REASONING_LEGACY) { /* the thoughts too, the content as written */
            reasoning rs;
            reasoning_init(&rs, r->think_open);
            reasoning_feed(&rs, t, j->text.n, true);
            p.r_from = rs.r0, p.r_n = rs.r1 - rs.r0;
        }
        if (p.r_n)
            json_object_set_new(msg, "reasoning_content", json_string_lossy(t + p.r_from, p.r_n));
        if (tc.n) {
            json_object_set_new(msg, "tool_calls", tool_calls_json(s, &tc, false));
            finish = "tool_calls";
        }
        toolcalls_free(&tc);
        json_object_set_new(ch, "message", msg);
    } else {
        json_object_set_new(ch, "text", text);
    }
    json_t *lp = json_null();
    if (r->logprobs >= 0 && r->kind == JOB_CHAT) {
        lp = json_object();
        json_object_set(lp, "content", j->lp);
    } else if (r->logprobs >= 0) {
        lp = json_incref(j->lp);
    }
    json_object_set_new(ch, "logprobs", lp);
    json_object_set_new(ch, "finish_reason", json_string(finish));
    return ch;
}

static json_t *full_response(conn *c, const gen_resp *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "object",
                        json_string(r->kind == JOB_CHAT ? "chat.completion" : "text_completion"));
    json_object_set_new(o, "created", json_integer(r->created));
    json_object_set_new(o, "model", xid_json(r->x));
    json_t *arr = json_array();
    for (int i = 0; i < r->n_choices; i++)
        json_array_append_new(arr, choice_json(c->srv, r->jobs[i]));
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", usage_json(r));
    return o;
}

/* Streamed: the 200, then the role chunk of each choice (chat) or its echo. */
static void stream_open(conn *c, gen_resp *r)
{
    r->begun = true;
    http_stream_begin(c, 200, "text/event-stream");
    for (int i = 0; i < r->n_choices; i++) {
        const gen_job *j = r->jobs[i];
        if (r->kind == JOB_CHAT)
            sse_choice(c, j, chunk_choice(j, "", 0, "assistant", NULL, NULL));
        else if (j->echo)
            sse_choice(c, j, chunk_choice(j, j->echo, strlen(j->echo), NULL, NULL, NULL));
    }
}

/* The response fails (choice j ended abnormally): the error goes out (in
 * the stream, followed by [DONE]) and the other choices are aborted. */
static void resp_fail(conn *c, gen_job *j, const reqerr *e)
{
    gen_resp *r = j->r;
    r->failed = true;
    if (r->stream && r->begun) {
        http_sse_json(c, reqerr_json(e));
        http_stream_write(c, "data: [DONE]\n\n", 14);
        http_stream_end(c);
    } else {
        http_reply_err(c, e);
    }
    for (int i = 0; i < r->n_choices; i++)
        if (r->jobs[i] != j && r->jobs[i]->t)
            task_cancel(r->jobs[i]->t); /* its destroy may not free r: j holds it */
}

static void gen_on_event(task *t, const lms_event *ev, double t_ms)
{
    gen_job *j = t->state;
    gen_resp *r = j->r;
    (void)t_ms;
    if (r->failed)
        return;
    if (r->stream && !r->begun &&
        (ev->type == LMS_EV_TOKEN || (ev->type == LMS_EV_END && finish_reason(ev->stats.finish))))
        stream_open(t->c, r);
    if (chatfmt_remote_call(&j->calls, &j->calls_lost, ev))
        return;
    if (ev->type == LMS_EV_TOKEN) {
        on_token(t, j, ev);
        return;
    }
    if (ev->type == LMS_EV_PROMPT) {
        if (j->lp)
            prompt_lp_add(t->x->model, j, ev);
        return;
    }
    if (ev->type != LMS_EV_END && ev->type != LMS_EV_ERROR)
        return;
    j->t = NULL; /* removed after this event */
    if (ev->type == LMS_EV_ERROR || !finish_reason(ev->stats.finish) || j->calls_lost) {
        reqerr e;
        end_error(t->c, t, ev, &e);
        resp_fail(t->c, j, &e);
        return;
    }
    j->finish = finish_reason(ev->stats.finish);
    j->stats = ev->stats;
    r->n_live--;
    if (r->stream) {
        const char *finish = j->finish;
        finish = stream_flush(t->c, j, finish);
        sse_choice(t->c, j, chunk_choice(j, r->kind == JOB_CHAT ? NULL : "", 0, NULL, finish, NULL));
        if (r->n_live > 0)
            return;
        if (r->include_usage) {
            json_t *o = chunk_new(r);
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(r));
            http_sse_json(t->c, o);
        }
        http_stream_write(t->c, "data: [DONE]\n\n", 14);
        http_stream_end(t->c);
    } else if (r->n_live == 0) {
        http_reply_json(t->c, 200, full_response(t->c, r));
    }
}

static void resp_free(gen_resp *r)
{
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->pr[i].toks);
        free(r->pr[i].echo);
    }
    genparams_deinit(&r->gp);
    free(r->schema);
    json_decref(r->up);
    free(r->fn_names);
    json_decref(r->prompts);
    for (int i = 0; i < r->n_choices; i++) {
        gen_job *j = r->jobs[i];
        if (!j)
            continue;
        sbuf_free(&j->text);
        json_decref(j->lp);
        toolcalls_free(&j->calls);
        free(j);
    }
    free(r);
}

/* A choice's task is gone; the response goes with the last. */
static void gen_destroy(task *t)
{
    gen_job *j = t->state;
    j->t = NULL;
    if (--j->r->refs == 0)
        resp_free(j->r);
}

static const task_ops gen_ops = {gen_on_event, gen_destroy};

/* ---- requests ------------------------------------------------------------------------ */

/* Chat: reasoning_format, else the server's (--reasoning-format). */
static int parse_rfmt(conn *c, const json_t *body, gen_resp *r, reqerr *e)
{
    const char *rfn = NULL;
    if (r->kind != JOB_CHAT || reqparse_str(body, "reasoning_format", &rfn, e) < 0)
        return r->kind != JOB_CHAT ? 0 : -1;
    r->rfmt = rfn ? reasoning_format_parse(rfn) : c->srv->rfmt;
    if (r->rfmt < 0)
        return reqerr_set(e, 400, "reasoning_format", "reasoning_format '%.40s' is not one of "
                          "none, auto, deepseek, deepseek-legacy", rfn);
    return 0;
}

/* Fields shared by chat and completions. */
static int parse_common(conn *c, const json_t *body, gen_resp *r, genparams *gp, reqerr *e)
{
    int64_t n = 1, best_of = 0;
    const json_t *so = NULL;
    if (reqparse_bool(body, "stream", &r->stream, e) < 0 ||
        reqparse_obj(body, "stream_options", &so, e) < 0 ||
        (so && reqparse_bool(so, "include_usage", &r->include_usage, e) < 0) ||
        reqparse_int(body, "n", 1, MAX_CHOICES, &n, e) < 0 ||
        reqparse_int(body, "best_of", 1, MAX_CHOICES, &best_of, e) < 0)
        return -1;
    if (best_of && best_of != n)
        return reqerr_set(e, 400, "best_of", "'best_of' must equal 'n' (%lld) here: choices are "
                          "not ranked", (long long)n);
    r->n = (int)n;
    if (!r->stream)
        r->include_usage = false;
    /* completions with echo and logprobs may generate nothing: the prompt's
     * log-probabilities are the answer (as evaluation harnesses ask) */
    gp->zero_max_ok = r->kind == JOB_COMPL && json_is_true(json_object_get(body, "echo")) &&
                      json_is_integer(json_object_get(body, "logprobs"));
    if (reqparse_gen(body, gp, e) < 0)
        return -1;
    return api_lora_pick(c, body, gp, e);
}

/* tool_choice "required" or a named function: the reply is held (JSON
 * mode) to a bare call object, {"name": ..., "arguments": {...}}, which the
 * tool-call reader takes as the reply's call. One function: its name and
 * its parameters' schema (any object where that schema asks for more than
 * jsonschema.h follows); several: one of their names, any object. */
int api_forced_call(const json_t *tools, const json_t *choice, lms_jschema **out, reqerr *e)
{
    const char *want = NULL;
    *out = NULL;
    if (json_is_object(choice)) {
        want = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
        if (!want)
            return reqerr_set(e, 400, "tool_choice", "'tool_choice' names no function");
    } else if (!json_is_string(choice) || strcmp(json_string_value(choice), "required")) {
        return 0; /* "auto", "none" or absent: nothing forced */
    }
    json_t *names = json_array(), *seen = json_object(); /* seen: the names as keys */
    const json_t *params = NULL;
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        /* a name listed twice is one choice (and its first parameters) */
        if (!name || (want && strcmp(name, want)) || json_object_get(seen, name))
            continue;
        json_object_set_new(seen, name, json_true());
        json_array_append_new(names, json_string(name));
        params = json_object_get(fn, "parameters");
    }
    json_decref(seen);
    if (json_array_size(names) == 0) {
        json_decref(names);
        return reqerr_set(e, 400, "tool_choice", "'tool_choice' names '%.100s', not one of the "
                          "tools", want ? want : "");
    }
    const bool one = json_array_size(names) == 1;
    lms_jschema *sc = NULL;
    bool built = false; /* a schema was made: a NULL sc is its refusal, not memory */
    char err[256] = "";
    for (int pass = 0; pass < 2 && !sc; pass++) { /* the parameters' schema, else any object */
        json_t *args = pass == 0 && one && json_is_object(params) ? json_incref((json_t *)params)
                                                                  : json_pack("{s:s}", "type", "object");
        json_t *schema = json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s,s]}", "type", "object",
                                   "properties", "name", one ? "const" : "enum",
                                   one ? json_array_get(names, 0) : names, "arguments", args,
                                   "required", "name", "arguments");
        built = built || schema != NULL;
        sc = schema ? lms_jschema_from_json(schema, err, sizeof err) : NULL;
        json_decref(schema);
    }
    size_t n_names = json_array_size(names);
    json_decref(names);
    /* e.g. more functions than a schema's enum may list: 100 tools with
     * "tool_choice": "required" once answered 503 "out of memory" */
    if (!sc && built)
        return reqerr_set(e, 400, "tool_choice", "a call to one of %zu functions cannot be "
                          "enforced: %s", n_names, err);
    if (!sc)
        return reqerr_set(e, 503, NULL, "out of memory");
    *out = sc;
    return 0;
}

/* tools and tool_choice as chat takes them (local or remote); *tools and
 * *choice are borrowed from body, NULL when absent; *none: tool_choice is
 * "none", so the model gets no tools. */
static int parse_tool_fields(const json_t *body, const json_t **tools, const json_t **choice,
                             bool *none, reqerr *e)
{
    *tools = json_object_get(body, "tools");
    *choice = json_object_get(body, "tool_choice");
    if (*tools && !json_is_null(*tools) && !json_is_array(*tools))
        return reqerr_set(e, 400, "tools", "'tools' must be an array");
    if (*choice && !json_is_null(*choice) && !json_is_string(*choice) && !json_is_object(*choice))
        return reqerr_set(e, 400, "tool_choice", "'tool_choice' must be a string or an object");
    *none = json_is_string(*choice) && !strcmp(json_string_value(*choice), "none");
    return 0;
}

static int parse_chat(conn *c, const json_t *body, gen_resp *r, gen_prompt *pr, reqerr *e)
{
    bool lp = false;
    int64_t top = 0;
    if (reqparse_bool(body, "logprobs", &lp, e) < 0 ||
        reqparse_int(body, "top_logprobs", 0, LMS_MAX_LOGPROBS, &top, e) < 0)
        return -1;
    const json_t *tl = json_object_get(body, "top_logprobs");
    if (tl && !json_is_null(tl) && !lp)
        return reqerr_set(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r->logprobs = lp ? (int)top : -1;
    const json_t *tools, *choice;
    bool no_tools;
    if (parse_tool_fields(body, &tools, &choice, &no_tools, e) < 0)
        return -1;
    r->tools = json_array_size(tools) > 0 && !no_tools;
    if (r->tools) /* none when out of memory: a lone call is then read as without a list */
        r->fn_names = toolcall_names(tools);
    const json_t *rf = NULL;
    const char *rft = NULL;
    if (reqparse_obj(body, "response_format", &rf, e) < 0 ||
        (rf && reqparse_str(rf, "type", &rft, e) < 0))
        return -1;
    r->json = rft && (!strcmp(rft, "json_object") || !strcmp(rft, "json_schema"));
    if (rft && strcmp(rft, "text") != 0 && !r->json)
        return reqerr_set(e, 400, "response_format",
                          "response_format '%.40s' is not supported ('text', 'json_object' and "
                          "'json_schema' are)", rft);
    if (rft && !strcmp(rft, "json_schema")) {
        const json_t *js = json_object_get(rf, "json_schema");
        if (!(r->schema = api_compile_schema(json_object_get(js, "schema"), "response_format", e)))
            return -1;
    }
    if (r->tools) { /* tool_choice "required" or a named function */
        lms_jschema *call;
        if (api_forced_call(tools, choice, &call, e) < 0)
            return -1;
        if (call && r->json) {
            free(call);
            return reqerr_set(e, 400, "tool_choice", "a forced tool call and a response_format "
                              "other than text cannot both hold");
        }
        if (call)
            r->json = true, r->schema = call;
    }
    json_t *kw;
    if (chatfmt_kwargs(c->srv, body, &kw, e) < 0)
        return -1;
    json_t *msgs = chatfmt_messages(json_object_get(body, "messages"), "messages", e);
    if (!msgs) {
        json_decref(kw);
        return -1;
    }
    chat_in in = {msgs, json_is_array(tools) ? tools : NULL, kw};
    int rc = chatfmt_tokens(xfmt(c->x), c->x->model, &in, &pr->toks, &pr->n, &r->think_open, e);
    json_decref(msgs);
    json_decref(kw);
    /* a reply held to JSON has no thoughts, whatever the prompt opened (a grammar
     * may write them: it is the user's) */
    if (r->json)
        r->think_open = false;
    else if (rc == 0)
        rc = api_think_budget(c, &r->gp, r->think_open, e);
    return rc;
}

/* One prompt: a string or an array of token ids. With a suffix (not
 * empty), a string is the text before it, filled in between. */
static int parse_one_prompt(conn *c, const json_t *p, bool echo, const char *suffix,
                            int32_t max_tokens, gen_prompt *pr, reqerr *e)
{
    if (json_is_string(p) && suffix && suffix[0]) {
        if (echo)
            return reqerr_set(e, 400, "echo", "'echo' cannot be used with 'suffix'");
        return api_fim_prompt(c->x, json_string_value(p), suffix, max_tokens, &pr->toks, &pr->n, e);
    }
    if (suffix && suffix[0])
        return reqerr_set(e, 400, "suffix", "'suffix' needs a prompt given as text");
    if (json_is_string(p)) {
        if (echo && !(pr->echo = strdup(json_string_value(p))))
            return reqerr_set(e, 503, NULL, "out of memory");
        return chatfmt_text_tokens(c->x->model, json_string_value(p), json_string_length(p),
                                   true, &pr->toks, &pr->n, e);
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return reqerr_set(e, 400, "prompt", "'prompt' must be a string, an array of token ids, "
                          "or an array of those");
    if (json_array_size(p) > (1u << 24))
        return reqerr_set(e, 413, "prompt", "the prompt is too long");
    if (reqparse_token_ids(p, "prompt", &pr->toks, &pr->n, e) < 0)
        return -1;
    if (!echo)
        return 0;
    sbuf t = {0}; /* echo of token ids: their text, as /detokenize gives it */
    int rc = api_detok_text(c->x->model->tok, pr->toks, pr->n, false, "prompt", &t, e);
    if (rc == 0 && !(pr->echo = strndup(t.p ? t.p : "", t.n)))
        rc = reqerr_set(e, 503, NULL, "out of memory");
    sbuf_free(&t);
    return rc;
}

/* prompt: a string, an array of ids, or an array of several of those. */
static int parse_prompts(conn *c, const json_t *body, bool echo, int n, gen_prompt *pr,
                         int *n_pr, int32_t max_tokens, reqerr *e)
{
    const json_t *p = json_object_get(body, "prompt");
    const char *suffix = NULL;
    if (reqparse_str(body, "suffix", &suffix, e) < 0)
        return -1;
    const json_t *first = json_array_get(p, 0); /* NULL unless a non-empty array */
    if (!json_is_string(first) && !json_is_array(first)) {
        *n_pr = 1;
        return parse_one_prompt(c, p, echo, suffix, max_tokens, &pr[0], e);
    }
    size_t k = json_array_size(p);
    if (k * (size_t)n > MAX_CHOICES)
        return reqerr_set(e, 400, "prompt", "%zu prompts times n = %d make over %d choices", k, n,
                          MAX_CHOICES);
    for (size_t i = 0; i < k; i++) {
        *n_pr = (int)i + 1;
        if (parse_one_prompt(c, json_array_get(p, i), echo, suffix, max_tokens, &pr[i], e) < 0)
            return -1;
    }
    return 0;
}

static int parse_completion(conn *c, const json_t *body, gen_resp *r, gen_prompt *pr, int *n_pr,
                            reqerr *e)
{
    int64_t lp = -1;
    bool echo = false;
    if (reqparse_int(body, "logprobs", 0, LMS_MAX_LOGPROBS, &lp, e) < 0 ||
        reqparse_bool(body, "echo", &echo, e) < 0)
        return -1;
    r->logprobs = (int)lp;
    r->prompt_lp = echo && r->logprobs >= 0;
    if (r->prompt_lp && r->stream)
        return reqerr_set(e, 400, "echo", "'echo' with 'logprobs' is not supported when streaming");
    return parse_prompts(c, body, echo, r->n, pr, n_pr, r->gp.max_tokens, e);
}

/* A request for a remote expert: checked here (what only the local engine
 * does is refused), sent upstream as written, but for tool_choice "none":
 * then no tools go (nor tool_choice, parallel_tool_calls), as a local
 * prompt has none and the Responses and Anthropic paths send none, so the
 * upstream cannot call. Its reply is not searched for calls (r->tools
 * stays false): the upstream's come apart. */
static int parse_remote(const json_t *body, gen_resp *r, reqerr *e)
{
    static const char *const ours[] = {"model", "n", "best_of", "stream", "stream_options",
                                       "lora", "timeout", NULL};
    const json_t *lp = json_object_get(body, "logprobs");
    const char *id = r->x->cfg->id;
    bool no_tools = false;
    if (lp && !json_is_null(lp) && !json_is_false(lp))
        return reqerr_set(e, 400, "logprobs", "'logprobs' is not available for remote expert "
                          "'%s'", id);
    if (r->kind == JOB_CHAT) {
        const json_t *tools, *choice;
        if (parse_tool_fields(body, &tools, &choice, &no_tools, e) < 0)
            return -1;
        json_t *msgs = chatfmt_messages(json_object_get(body, "messages"), "messages", e);
        if (!msgs)
            return -1;
        json_decref(msgs);
    } else {
        const json_t *p = json_object_get(body, "prompt");
        if (json_is_true(json_object_get(body, "echo")))
            return reqerr_set(e, 400, "echo", "'echo' is not available for remote expert '%s'", id);
        bool ok = json_is_string(p);
        if (json_is_array(p) && json_array_size(p) > 0) {
            ok = json_array_size(p) * (size_t)r->n <= MAX_CHOICES;
            for (size_t i = 0; ok && i < json_array_size(p); i++)
                ok = json_is_string(json_array_get(p, i));
            if (ok) {
                r->prompts = json_incref((json_t *)p);
                r->n_prompts = (int)json_array_size(p);
            }
        }
        if (!ok)
            return reqerr_set(e, 400, "prompt", "'prompt' must be a string or an array of at most "
                              "%d strings for remote expert '%s'", MAX_CHOICES / r->n, id);
    }
    if (!(r->up = json_deep_copy(body)))
        return reqerr_set(e, 503, NULL, "out of memory");
    for (int k = 0; ours[k]; k++)
        json_object_del(r->up, ours[k]);
    if (no_tools) {
        json_object_del(r->up, "tools");
        json_object_del(r->up, "tool_choice");
        json_object_del(r->up, "parallel_tool_calls");
    }
    return 0;
}

static void resp_ids(lms_server *s, gen_resp *r)
{
    snprintf(r->id, sizeof r->id, "%s-%016llx", r->kind == JOB_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)server_rand(s));
    r->created = lms_wall_s();
}

/* Submits choice i; -1 with e set when the scheduler refuses it. */
static int job_submit_remote(conn *c, gen_resp *r, int i, reqerr *e)
{
    gen_job *j = r->jobs[i];
    json_t *o = json_copy(r->up);
    if (o && r->prompts)
        json_object_set(o, "prompt", json_array_get(r->prompts, (size_t)(i / r->n)));
    if (o && r->gp.has_seed && r->n > 1)
        json_object_set_new(o, "seed",
                            json_integer((json_int_t)(r->gp.sp.seed + (uint64_t)(i % r->n))));
    size_t n = 0;
    char *text = o ? json_dump_compact(o, &n) : NULL;
    json_decref(o);
    if (!text)
        return reqerr_set(e, 503, NULL, "out of memory");
    lms_remote_request rq = {.chat = r->kind == JOB_CHAT, .body = text, .n_body = n,
                             .timeout_ms = r->gp.timeout_ms};
    j->t = task_submit_remote(c, &rq, &gen_ops, j, e);
    free(text);
    if (!j->t)
        return -1;
    r->refs++;
    return 0;
}

static int job_submit(conn *c, gen_resp *r, int i, reqerr *e)
{
    if (r->x->remote)
        return job_submit_remote(c, r, i, e);
    gen_job *j = r->jobs[i];
    const gen_prompt *p = &r->pr[i / r->n];
    lms_request rq = genparams_request(&r->gp, p->toks, p->n);
    rq.n_logprobs = r->logprobs > 0 ? r->logprobs : 0;
    rq.json = r->json;
    rq.schema = r->schema;
    rq.prompt_logprobs = r->prompt_lp;
    rq.sp.seed += (uint64_t)(i % r->n);
    if (!(j->t = task_submit(c, &rq, &gen_ops, j, e)))
        return -1;
    r->refs++;
    return 0;
}

/* The response's choices, prompt by prompt; -1 when out of memory. */
static int make_jobs(const lms_model *m, gen_resp *r)
{
    r->n_choices = r->n_prompts * r->n;
    for (int i = 0; i < r->n_choices; i++) {
        gen_job *j = calloc(1, sizeof *j);
        if (!j)
            return -1;
        r->jobs[i] = j;
        j->r = r;
        j->index = i;
        j->echo = r->pr[i / r->n].echo;
        j->echo_len = j->echo ? strlen(j->echo) : 0;
        reply_cut_init(&j->cut, split_thoughts(r), r->think_open, r->tools,
                       (const char *const *)r->fn_names);
        if (!r->stream && r->logprobs >= 0 &&
            !(j->lp = r->kind == JOB_CHAT ? json_array() : legacy_lp_new()))
            return -1;
        if (r->prompt_lp) /* the prompt's first token has no log-probability */
            prompt_lp_first(m, j, r->pr[i / r->n].toks[0]);
    }
    return 0;
}

/* Submits every choice and starts the response; takes r. On failure the
 * choices submitted are aborted and the error is the reply. */
static int start(conn *c, gen_resp *r)
{
    reqerr e;
    if (make_jobs(c->x->model, r) < 0) {
        resp_free(r);
        reqerr_set(&e, 503, NULL, "out of memory");
        return http_reply_err(c, &e);
    }
    r->n_live = r->n_choices;
    for (int i = 0; i < r->n_choices; i++) {
        if (job_submit(c, r, i, &e) < 0) {
            task *live[MAX_CHOICES];
            int n_live = 0;
            for (int k = 0; k < i; k++)
                live[n_live++] = r->jobs[k]->t;
            if (n_live == 0)
                resp_free(r);
            for (int k = 0; k < n_live; k++)
                task_cancel(live[k]); /* the last frees r */
            return http_reply_err(c, &e);
        }
    }
    if (!r->stream) {
        for (int i = 0; i < r->n_choices; i++)
            if (r->jobs[i]->echo)
                sbuf_adds(&r->jobs[i]->text, r->jobs[i]->echo);
        return 0;
    }
    if (!r->x->remote) /* remote: with the first piece (an upstream refusal stays an HTTP error) */
        stream_open(c, r);
    return 0;
}

static int api_generate(conn *c, json_t *body, int kind)
{
    lms_server *s = c->srv;
    reqerr e;
    int rc = pick_expert(c, body, kind == JOB_CHAT ? api_chat : api_completions, &e);
    if (rc <= 0)
        return rc < 0 ? http_reply_err(c, &e) : 0;
    gen_resp *r = calloc(1, sizeof *r);
    if (!r) {
        reqerr_set(&e, 503, NULL, "out of memory");
        return http_reply_err(c, &e);
    }
    r->kind = kind;
    r->x = c->x;
    r->logprobs = -1;
    r->n_prompts = 1;
    server_genparams(s, &r->gp);
    rc = parse_common(c, body, r, &r->gp, &e);
    if (rc == 0)
        rc = parse_rfmt(c, body, r, &e);
    if (rc == 0 && c->x->remote)
        rc = parse_remote(body, r, &e);
    else if (rc == 0)
        rc = kind == JOB_CHAT ? parse_chat(c, body, r, &r->pr[0], &e)
                              : parse_completion(c, body, r, r->pr, &r->n_prompts, &e);
    if (rc < 0) {
        resp_free(r);
        return http_reply_err(c, &e);
    }
    resp_ids(s, r);
    return start(c, r);
}

int api_chat(conn *c, json_t *body)
{
    return api_generate(c, body, JOB_CHAT);
}

int api_completions(conn *c, json_t *body)
{
    return api_generate(c, body, JOB_COMPL);
}

/* ---- models ------------------------------------------------------------------------- */

static json_t *model_obj(const lms_server *s, const lms_expert *x)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", xid_json(x));
    json_object_set_new(o, "object", json_string("model"));
    json_object_set_new(o, "created", json_integer(s->t_start_wall));
    json_object_set_new(o, "owned_by", json_string("lmserv"));
    /* lmserv's own: where the expert stands (loaded or not) */
    json_t *lm = json_object();
    json_object_set_new(lm, "state", json_string(lms_expert_state_name(x->state)));
    if (x->cfg->domain)
        json_object_set_new(lm, "domain", json_string(x->cfg->domain));
    json_object_set_new(lm, "priority", json_integer(x->cfg->priority));
    json_object_set_new(lm, "default", json_boolean(x == server_default_expert((lms_server *)s)));
    if (x->error[0])
        json_object_set_new(lm, "error", json_string_lossy(x->error, strlen(x->error)));
    if (x->remote) { /* never the api_key */
        json_object_set_new(lm, "endpoint", json_string(x->cfg->endpoint));
        json_object_set_new(lm, "remote_model",
                            json_string_lossy(x->cfg->remote_model, strlen(x->cfg->remote_model)));
    }
    json_object_set_new(o, "lmserv", lm);
    if (x->state == LMS_EXPERT_READY) {
        const lms_model *m = x->model;
        const lms_sched_params *sp = lms_sched_params_of(x->sched);
        json_t *meta = json_object();
        json_object_set_new(meta, "arch", json_string_lossy(m->hp.arch, strlen(m->hp.arch)));
        json_object_set_new(meta, "n_ctx", json_integer(sp->n_ctx));
        json_object_set_new(meta, "n_ctx_train", json_integer(m->hp.n_ctx_train));
        json_object_set_new(meta, "n_embd", json_integer(m->hp.n_embd));
        json_object_set_new(meta, "n_vocab", json_integer(m->hp.n_vocab));
        json_object_set_new(o, "meta", meta);
    }
    return o;
}

/* Every expert, loaded or not ("lmserv.state" tells). A single model
 * still loading at start is a 503, as before there were several. */
int api_models(conn *c, const char *id)
{
    lms_server *s = c->srv;
    reqerr e;
    if (s->state == SRV_LOADING && lms_registry_cfg(s->reg)->single) {
        reqerr_set(&e, 503, NULL, "the model is still loading");
        e.code = "model_loading";
        return http_reply_err(c, &e);
    }
    if (id) {
        lms_expert *x = lms_registry_find(s->reg, id);
        if (x)
            return http_reply_json(c, 200, model_obj(s, x));
        reqerr_set(&e, 404, "model", "the model '%.200s' does not exist", id);
        e.type = "invalid_request_error";
        e.code = "model_not_found";
        return http_reply_err(c, &e);
    }
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_t *data = json_array();
    for (int i = 0; i < lms_registry_count(s->reg); i++)
        json_array_append_new(data, model_obj(s, lms_registry_at(s->reg, i)));
    json_object_set_new(o, "data", data);
    return http_reply_json(c, 200, o);
}
