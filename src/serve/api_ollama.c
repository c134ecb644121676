/*
 * api_ollama.c - the Ollama API, for the tools that speak it (editor
 * plugins, chat front ends): GET /api/version, /api/tags, /api/ps,
 * POST /api/show, /api/chat and /api/generate.
 *
 * Chat and generate stream by default, as Ollama does: one JSON object per
 * line (application/x-ndjson), each with a piece of the reply and
 * "done": false, then a last object with "done": true, "done_reason" and
 * the counters and durations (nanoseconds). With "stream": false one
 * object holds the whole reply. Sampling options come in "options" under
 * the names Ollama uses (num_predict, temperature, top_k, top_p, min_p,
 * seed, stop, repeat_penalty, repeat_last_n, presence/frequency_penalty).
 * Errors are {"error": "message"} with the HTTP status, or that object as
 * the last line of a stream that had started.
 *
 * For a remote expert (route/remote.h) the request is put in OpenAI's
 * words (remote_body) and forwarded: chat and generate as chat
 * completions, generate with "raw" as a completion; options become
 * max_tokens, temperature, ... (top_k, min_p and repeat_penalty as the
 * llama.cpp-style servers name them); format as response_format; tools
 * as they are, and the conversation's calls with the ids OpenAI wants
 * (upstream_ids). Its stream starts with the first piece, so an upstream
 * refusal is an HTTP error naming the expert. The calls of its reply come
 * apart from the text (route/remote.h) and go out as a local model's do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "engine/jsonschema.h"
#include "serve/reply.h"
#include "serve/serve_int.h"

typedef struct oll_job {
    bool chat, stream;
    bool tools;  /* chat with tools: the reply is searched for calls (toolcall.h) */
    int think;   /* "think": -1 not given (thoughts stay in the content), 0 false (thinking
                  * off, thoughts dropped), 1 true (thoughts in "thinking") */
    sbuf text;   /* the reply (not streamed; streamed with tools or think) */
    reply_cut cut; /* thoughts, content and calls of the reply */
    char **fn_names; /* with tools: their names (toolcall_names); owned */
    toolcalls calls; /* a remote expert's calls (chatfmt_remote_call) */
    bool calls_lost; /* one of them could not be kept (out of memory): the reply fails */
    double t0;   /* arrival, ms (lms_now_ms) */
    const lms_expert *x; /* the expert answering */
    bool begun;  /* streamed: the 200 went out */
} oll_job;

/* ---- shapes --------------------------------------------------------------------- */

static json_t *created_at(void)
{
    struct timespec ts;
    struct tm tm;
    char buf[64];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%06ldZ", ts.tv_nsec / 1000);
    return json_string(buf);
}

static json_t *reply_obj(const oll_job *j, const char *text, size_t n, bool done)
{
    json_t *o = json_object();
    json_object_set_new(o, "model", xid_json(j->x));
    json_object_set_new(o, "created_at", created_at());
    if (j->chat) {
        json_t *msg = json_object();
        json_object_set_new(msg, "role", json_string("assistant"));
        json_object_set_new(msg, "content", json_string_lossy(text, n));
        json_object_set_new(o, "message", msg);
    } else {
        json_object_set_new(o, "response", json_string_lossy(text, n));
    }
    json_object_set_new(o, "done", json_boolean(done));
    return o;
}

/* Ollama's message.tool_calls: [{"function": {"name", "arguments": {...}}}]
 * (the arguments an object, as Ollama gives them) */
static json_t *tool_calls_json(const toolcalls *tc)
{
    json_t *a = json_array();
    for (int i = 0; i < tc->n; i++) {
        json_t *args = json_loads(tc->v[i].arguments, JSON_DECODE_ANY, NULL);
        if (!json_is_object(args)) {
            json_decref(args);
            args = json_object();
        }
        json_t *fn = json_object();
        json_object_set_new(fn, "name", json_string_lossy(tc->v[i].name, strlen(tc->v[i].name)));
        json_object_set_new(fn, "arguments", args);
        json_array_append_new(a, json_pack("{s:o}", "function", fn));
    }
    return a;
}

static json_int_t ns(double ms)
{
    return (json_int_t)(ms * 1e6);
}

static void add_stats(json_t *o, const oll_job *j, const lms_req_stats *st)
{
    const char *f = st->finish;
    json_object_set_new(o, "done_reason",
                        json_string(f && (!strcmp(f, "length") || !strcmp(f, "deadline"))
                                        ? "length" : "stop"));
    json_object_set_new(o, "total_duration", json_integer(ns(lms_now_ms() - j->t0)));
    json_object_set_new(o, "load_duration", json_integer(0));
    json_object_set_new(o, "prompt_eval_count", json_integer(st->n_prompt));
    json_object_set_new(o, "prompt_eval_duration", json_integer(ns(st->ttft_ms - st->queue_ms)));
    json_object_set_new(o, "eval_count", json_integer(st->n_gen));
    json_object_set_new(o, "eval_duration", json_integer(ns(st->total_ms - st->ttft_ms)));
}

static json_t *err_obj(const char *msg)
{
    json_t *o = json_object();
    json_object_set_new(o, "error", json_string_lossy(msg, strlen(msg)));
    return o;
}

static int reply_err(conn *c, const reqerr *e)
{
    return http_reply_json(c, e->status, err_obj(e->msg));
}

/* One NDJSON line; steals o. */
static void send_line(conn *c, json_t *o)
{
    size_t n;
    char *s = json_dump_compact(o, &n);
    json_decref(o);
    if (!s)
        return;
    http_stream_write(c, s, n);
    http_stream_write(c, "\n", 1);
    free(s);
}

/* A reply object with the part p of the reply (and the calls in tc): the
 * thoughts as "thinking" when asked for. */
static json_t *part_obj(const oll_job *j, const reply_part *p, const toolcalls *tc, bool done)
{
    const char *t = j->text.p ? j->text.p : "";
    json_t *o = reply_obj(j, t + p->c_from, p->c_n, done);
    json_t *where = j->chat ? json_object_get(o, "message") : o;
    if (p->r_n && j->think > 0)
        json_object_set_new(where, "thinking", json_string_lossy(t + p->r_from, p->r_n));
    if (tc && tc->n)
        json_object_set_new(where, "tool_calls", tool_calls_json(tc));
    return o;
}

/* Streamed with tools or think: sends what of the reply can go out (end:
 * all of it, the calls in a line of their own). */
static void send_part(conn *c, oll_job *j, const lms_event *end)
{
    toolcalls tc = {0};
    reply_part p;
    reply_cut_next(&j->cut, j->text.p, j->text.n, &p, end ? &tc : NULL);
    if (end)
        chatfmt_take_calls(&tc, &j->calls);
    if (p.c_n || (p.r_n && j->think > 0))
        send_line(c, part_obj(j, &p, NULL, false));
    if (tc.n) {
        reply_part none = {0};
        send_line(c, part_obj(j, &none, &tc, false));
    }
    toolcalls_free(&tc);
}

/* ---- events --------------------------------------------------------------------- */

static void oll_on_event(task *t, const lms_event *ev, double t_ms)
{
    oll_job *j = t->state;
    conn *c = t->c;
    (void)t_ms;
    const char *f = ev->stats.finish;
    bool failed = ev->type == LMS_EV_ERROR || (f && !strcmp(f, "abort")) ||
                  (ev->type == LMS_EV_END && j->calls_lost);
    if (j->stream && !j->begun && (ev->type == LMS_EV_TOKEN || (ev->type == LMS_EV_END && !failed))) {
        http_stream_begin(c, 200, "application/x-ndjson");
        j->begun = true;
    }
    if (chatfmt_remote_call(&j->calls, &j->calls_lost, ev))
        return;
    if (ev->type == LMS_EV_TOKEN) {
        const bool cut = j->tools || j->think >= 0;
        if (!j->stream || cut)
            sbuf_add(&j->text, ev->text, ev->text_len);
        if (j->stream && cut) /* what may still turn into a call or a tag waits */
            send_part(c, j, NULL);
        else if (j->stream && ev->text_len > 0)
            send_line(c, reply_obj(j, ev->text, ev->text_len, false));
        return;
    }
    if (ev->type != LMS_EV_END && ev->type != LMS_EV_ERROR)
        return;
    const char *why = ev->type == LMS_EV_ERROR ? ev->message
                      : j->calls_lost              ? "out of memory for the upstream's tool calls"
                                                   : "the generation was aborted";
    if (j->stream && j->begun) {
        if (!failed && (j->tools || j->think >= 0 || j->calls.n))
            send_part(c, j, ev); /* what was held back, then the calls */
        json_t *o = failed ? err_obj(why) : reply_obj(j, "", 0, true);
        if (!failed)
            add_stats(o, j, &ev->stats);
        send_line(c, o);
        http_stream_end(c);
    } else if (failed) {
        reqerr e;
        reqerr_set(&e, ev->type == LMS_EV_ERROR ? task_error_status(t, ev) : 503, NULL, "%s", why);
        reply_err(c, &e);
    } else {
        toolcalls tc;
        reply_part p;
        reply_cut_next(&j->cut, j->text.p, j->text.n, &p, &tc);
        chatfmt_take_calls(&tc, &j->calls);
        json_t *o = part_obj(j, &p, &tc, true);
        toolcalls_free(&tc);
        add_stats(o, j, &ev->stats);
        http_reply_json(c, 200, o);
    }
}

static void oll_destroy(task *t)
{
    oll_job *j = t->state;
    sbuf_free(&j->text);
    toolcalls_free(&j->calls);
    free(j->fn_names);
    free(j);
}

static const task_ops oll_ops = {oll_on_event, oll_destroy};

/* ---- requests ------------------------------------------------------------------- */

/* Chat messages for /api/generate: the system text and the prompt. */
static json_t *generate_messages(const char *system, const char *prompt)
{
    json_t *m = json_array();
    if (system && system[0])
        json_array_append_new(m, json_pack("{s:s, s:s}", "role", "system", "content", system));
    json_array_append_new(m, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
    return m;
}

/* "think": -1 absent, else whether to think ("high", "medium", "low": yes). */
static int parse_think(const json_t *body, int *think, reqerr *e)
{
    const json_t *v = json_object_get(body, "think");
    *think = -1;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_boolean(v))
        *think = json_is_true(v);
    else if (json_is_string(v) && (!strcmp(json_string_value(v), "high") ||
                                   !strcmp(json_string_value(v), "medium") ||
                                   !strcmp(json_string_value(v), "low")))
        *think = 1;
    else
        return reqerr_set(e, 400, "think", "'think' must be true, false, \"high\", \"medium\" "
                          "or \"low\"");
    return 0;
}

/* think: parse_think's value (the template's enable_thinking when >= 0). */
static int prompt_tokens(conn *c, const json_t *body, bool chat, int think, int32_t max_tokens,
                         int32_t **toks, int32_t *n, bool *open, reqerr *e)
{
    const lms_expert *x = c->x;
    const json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return reqerr_set(e, 400, "tools", "'tools' must be an array");
    json_t *msgs;
    if (chat) {
        msgs = chatfmt_messages(json_object_get(body, "messages"), "messages", e);
    } else {
        const char *prompt = NULL, *system = NULL;
        bool raw = false;
        if (reqparse_str(body, "prompt", &prompt, e) < 0 ||
            reqparse_str(body, "system", &system, e) < 0 || reqparse_bool(body, "raw", &raw, e) < 0)
            return -1;
        const char *suffix = NULL;
        if (reqparse_str(body, "suffix", &suffix, e) < 0)
            return -1;
        if (suffix && suffix[0]) /* fill in the middle: the prompt is the text before */
            return api_fim_prompt(x, prompt ? prompt : "", suffix, max_tokens, toks, n, e);
        if (!prompt || !prompt[0])
            return reqerr_set(e, 400, "prompt", "'prompt' must be a non-empty string");
        if (raw)
            return chatfmt_text_tokens(x->model, prompt, strlen(prompt), true, toks, n, e);
        msgs = generate_messages(system, prompt);
    }
    if (!msgs)
        return -1;
    json_t *kw = NULL;
    int rc = chatfmt_kwargs(c->srv, body, &kw, e);
    if (rc == 0 && think >= 0) { /* the templates' switch (Qwen3, SmolLM3, ...) */
        if (!kw)
            kw = json_object();
        json_object_set_new(kw, "enable_thinking", json_boolean(think));
    }
    chat_in in = {msgs, json_is_array(tools) ? tools : NULL, kw};
    if (rc == 0)
        rc = chatfmt_tokens(xfmt(x), x->model, &in, toks, n, open, e);
    json_decref(msgs);
    json_decref(kw);
    return rc;
}

/* The call of calls (an assistant message's) that tool message m answers:
 * the one its tool_call_id names, else the first not yet answered (used:
 * a bit per call), the first of those named m's tool_name when it names
 * one; marked used. NULL when none is left. */
static const json_t *answered_call(const json_t *m, const json_t *calls, uint64_t *used)
{
    const char *id = json_string_value(json_object_get(m, "tool_call_id"));
    const char *want = json_string_value(json_object_get(m, "tool_name"));
    for (int pass = id ? 0 : want ? 1 : 2; pass < 3; pass++) {
        size_t k;
        const json_t *call;
        json_array_foreach(calls, k, call)
        {
            const json_t *fn = json_object_get(call, "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            const char *cid = json_string_value(json_object_get(call, "id"));
            bool fits = pass == 0   ? cid && !strcmp(cid, id)
                        : pass == 1 ? name && !strcmp(name, want)
                                    : true;
            if (k < 64 && fits && (pass == 0 || !(*used >> k & 1))) {
                *used |= 1ull << k;
                return call;
            }
        }
        if (pass == 0)
            return NULL;
    }
    return NULL;
}

/* Ollama's calls carry no ids, and its tool messages name no call (at most
 * the tool, tool_name); OpenAI wants both. In msgs (normalized, ours) a
 * call without an id gets "call_<message>_<k>" (and type "function"), and
 * a tool message without tool_call_id the id of the call it answers
 * (answered_call) in the assistant message before it, in place of its
 * tool_name. */
static void upstream_ids(json_t *msgs)
{
    const json_t *calls = NULL; /* the last assistant message's calls */
    uint64_t used = 0;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && !strcmp(role, "tool")) {
            const json_t *call = answered_call(m, calls, &used);
            json_t *id = json_object_get(call, "id");
            if (!json_object_get(m, "tool_call_id") && json_is_string(id))
                json_object_set(m, "tool_call_id", id);
            json_object_del(m, "tool_name"); /* Ollama's; said by tool_call_id now */
            continue;
        }
        if (!json_is_array(json_object_get(m, "tool_calls")))
            continue;
        calls = json_object_get(m, "tool_calls");
        used = 0;
        size_t k;
        json_t *call;
        json_array_foreach(calls, k, call)
        {
            char id[64];
            snprintf(id, sizeof id, "call_%zu_%zu", i, k);
            if (json_is_object(call) && !json_is_string(json_object_get(call, "id")))
                json_object_set_new(call, "id", json_string(id));
            if (json_is_object(call) && !json_object_get(call, "type"))
                json_object_set_new(call, "type", json_string("function"));
        }
    }
}

/* The OpenAI body of an Ollama request for a remote expert, less a chat's
 * messages, which go to *msgs_out (with upstream_ids; NULL for a raw
 * generate, a completion). NULL with e filled. */
static json_t *remote_body(const json_t *body, const json_t *opts, bool chat, json_t **msgs_out,
                           reqerr *e)
{
    static const char *const same[] = {"temperature", "top_p", "top_k", "min_p", "seed", "stop",
                                       "presence_penalty", "frequency_penalty", "repeat_penalty",
                                       NULL};
    const json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        reqerr_set(e, 400, "tools", "'tools' must be an array");
        return NULL;
    }
    const char *prompt = NULL, *system = NULL;
    bool raw = false;
    json_t *msgs = NULL;
    if (chat) {
        msgs = chatfmt_messages(json_object_get(body, "messages"), "messages", e);
    } else if (reqparse_str(body, "prompt", &prompt, e) < 0 ||
               reqparse_str(body, "system", &system, e) < 0 ||
               reqparse_bool(body, "raw", &raw, e) < 0) {
        return NULL;
    } else if (!prompt || !prompt[0]) {
        reqerr_set(e, 400, "prompt", "'prompt' must be a non-empty string");
        return NULL;
    } else if (!raw) {
        msgs = generate_messages(system, prompt);
    }
    if (!msgs && !raw)
        return NULL;
    json_t *o = json_object();
    if (raw)
        json_object_set_new(o, "prompt", json_string(prompt));
    else
        upstream_ids(msgs);
    *msgs_out = msgs;
    if (chat && json_array_size(tools) > 0)
        json_object_set(o, "tools", (json_t *)tools);
    for (int k = 0; opts && same[k]; k++) {
        json_t *v = json_object_get(opts, same[k]);
        if (v && !json_is_null(v))
            json_object_set(o, same[k], v);
    }
    json_t *np = json_object_get(opts, "num_predict");
    if (json_is_integer(np) && json_integer_value(np) >= 0)
        json_object_set(o, "max_tokens", np);
    const json_t *fmt = json_object_get(body, "format");
    if (json_is_string(fmt) && !strcmp(json_string_value(fmt), "json"))
        json_object_set_new(o, "response_format", json_pack("{s:s}", "type", "json_object"));
    else if (json_is_object(fmt))
        json_object_set_new(o, "response_format",
                            json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema",
                                      "name", "format", "schema", fmt));
    return o;
}

/* A raw generate for a remote expert: o as a completion's body. */
static task *submit_completion(conn *c, const json_t *o, const genparams *gp, oll_job *j,
                               reqerr *e)
{
    size_t n = 0;
    char *text = json_dump_compact(o, &n);
    if (!text) {
        reqerr_set(e, 503, NULL, "out of memory");
        return NULL;
    }
    lms_remote_request r = {.chat = false, .body = text, .n_body = n,
                            .timeout_ms = gp->timeout_ms};
    task *t = task_submit_remote(c, &r, &oll_ops, j, e);
    free(text);
    return t;
}

/* Forwards the request to c->x (remote); the stream starts with the first piece. */
static int generate_remote(conn *c, const json_t *body, const json_t *opts, const genparams *gp,
                           bool chat, bool stream)
{
    reqerr e;
    json_t *msgs = NULL;
    json_t *o = remote_body(body, opts, chat, &msgs, &e);
    oll_job *j = o ? calloc(1, sizeof *j) : NULL;
    if (o && !j)
        reqerr_set(&e, 503, NULL, "out of memory");
    task *t = NULL;
    if (j) {
        *j = (oll_job){.chat = chat, .stream = stream, .t0 = lms_now_ms(), .x = c->x};
        /* a chat: the messages with the rest of o as its fields; raw: a completion */
        t = msgs ? chatfmt_submit_remote(c, msgs, NULL, o, gp, &oll_ops, j, &e)
                 : submit_completion(c, o, gp, j, &e);
        if (!t)
            oll_destroy(&(task){.state = j});
    }
    json_decref(msgs);
    json_decref(o);
    return t ? 0 : reply_err(c, &e);
}

/* Whether the request asks for nothing to be generated: no prompt (and no
 * suffix), or no messages; Ollama's way to load a model, or with
 * keep_alive 0 to unload it. */
static bool empty_request(const json_t *body, bool chat)
{
    if (chat) {
        const json_t *m = json_object_get(body, "messages");
        return !m || json_is_null(m) || (json_is_array(m) && json_array_size(m) == 0);
    }
    const json_t *p = json_object_get(body, "prompt"), *sfx = json_object_get(body, "suffix");
    return (!p || (json_is_string(p) && json_string_length(p) == 0)) &&
           !(json_is_string(sfx) && json_string_length(sfx) > 0);
}

/* A Go duration ("5m", "1h30m", "1.5h", "300ms", "-1m") or a bare number
 * of seconds, in milliseconds. */
static bool parse_duration(const char *s, double *ms)
{
    static const struct { const char *unit; double ms; } units[] = {
        {"ns", 1e-6}, {"us", 1e-3}, {"\xc2\xb5s", 1e-3}, {"ms", 1.0}, {"s", 1e3}, {"m", 6e4},
        {"h", 3.6e6}};
    double sign = 1.0, total = 0.0;
    if (*s == '-' || *s == '+')
        sign = *s++ == '-' ? -1.0 : 1.0;
    if (!((*s >= '0' && *s <= '9') || *s == '.'))
        return false;
    char *end;
    double v = strtod(s, &end);
    if (!*end) { /* a number alone: seconds */
        *ms = sign * v * 1e3;
        return true;
    }
    while (end != s) {
        size_t k = 0, best = 0;
        for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
            const size_t n = strlen(units[u].unit);
            if (!strncmp(end, units[u].unit, n) && n > best)
                best = n, k = u;
        }
        if (!best)
            return false;
        total += v * units[k].ms;
        s = end + best;
        if (!*s) {
            *ms = sign * total;
            return true;
        }
        if (!((*s >= '0' && *s <= '9') || *s == '.'))
            return false;
        v = strtod(s, &end);
    }
    return false;
}

/* keep_alive: *set false when absent (the server's idle unload applies),
 * else *ms (< 0: keep the model loaded for good). -1 with e when it is
 * neither a number nor a duration. */
static int keep_alive(const json_t *body, bool *set, double *ms, reqerr *e)
{
    const json_t *k = json_object_get(body, "keep_alive");
    *set = k && !json_is_null(k);
    *ms = 0;
    if (!*set)
        return 0;
    if (json_is_number(k)) {
        *ms = json_number_value(k) * 1e3;
        return 0;
    }
    if (json_is_string(k) && parse_duration(json_string_value(k), ms))
        return 0;
    return reqerr_set(e, 400, "keep_alive", "'keep_alive' must be a number of seconds or a "
                      "duration such as \"5m\", \"1h30m\" or \"-1\" (for good)");
}

/* The answer to a load or unload request: nothing generated, done. */
static int reply_done(conn *c, const lms_expert *x, bool chat, const char *reason)
{
    json_t *o = json_object();
    json_object_set_new(o, "model", xid_json(x));
    json_object_set_new(o, "created_at", created_at());
    if (chat)
        json_object_set_new(o, "message", json_pack("{s:s, s:s}", "role", "assistant", "content", ""));
    else
        json_object_set_new(o, "response", json_string(""));
    json_object_set_new(o, "done", json_true());
    json_object_set_new(o, "done_reason", json_string(reason));
    return http_reply_json(c, 200, o);
}

/* keep_alive 0 and nothing to generate: unload the model (not loading it
 * first); busy or pinned, it stays, with a 409 saying why. */
static int unload_request(conn *c, json_t *body, bool chat)
{
    reqerr e;
    const char *model = NULL;
    if (reqparse_str(body, "model", &model, &e) < 0)
        return reply_err(c, &e);
    lms_expert *x = model && model[0] ? lms_registry_find(c->srv->reg, model)
                                      : server_default_expert(c->srv);
    if (!x) {
        pick_not_found(c->srv, model, &e);
        return reply_err(c, &e);
    }
    if (lms_registry_unload(c->srv->reg, x, "keep_alive 0") == LMS_ERR_BUSY) {
        reqerr_set(&e, 409, NULL, "model '%s' is in use (or pinned after an engine restart): it "
                   "stays loaded", x->cfg->id);
        return reply_err(c, &e);
    }
    return reply_done(c, x, chat, "unload");
}

static int generate(conn *c, json_t *body, bool chat)
{
    lms_server *s = c->srv;
    reqerr e;
    const bool empty = empty_request(body, chat);
    bool keep;
    double keep_ms;
    if (keep_alive(body, &keep, &keep_ms, &e) < 0)
        return reply_err(c, &e);
    if (empty && keep && keep_ms == 0)
        return unload_request(c, body, chat);
    int picked = pick_expert(c, body, chat ? api_ollama_chat : api_ollama_generate, &e);
    if (picked <= 0)
        return picked < 0 ? reply_err(c, &e) : 0;
    if (!c->x->remote) /* how long it stays loaded after this request */
        lms_registry_keep(c->x, keep, keep_ms);
    if (empty) /* loaded (pick_expert waited for it): Ollama's preload */
        return reply_done(c, c->x, chat, "load");
    int rc = 0;
    bool stream = true;
    const json_t *opts = NULL, *fmt = json_object_get(body, "format");
    genparams gp;
    server_genparams(s, &gp);
    int32_t *toks = NULL, n = 0;
    if (rc == 0 && (reqparse_bool(body, "stream", &stream, &e) < 0 ||
                    reqparse_obj(body, "options", &opts, &e) < 0 ||
                    (opts && reqparse_gen(opts, &gp, &e) < 0) ||
                    api_lora_pick(c, body, &gp, &e) < 0))
        rc = -1;
    /* format: "json" holds the output to a JSON object, a JSON schema to
     * the objects it allows (engine/jsonschema.h) */
    bool json = json_is_string(fmt) && !strcmp(json_string_value(fmt), "json");
    lms_jschema *schema = NULL;
    if (rc == 0 && json_is_object(fmt) && !(schema = api_compile_schema(fmt, "format", &e)))
        rc = -1;
    if (rc == 0 && fmt && !json_is_null(fmt) && !json && !schema &&
        !(json_is_string(fmt) && !json_string_length(fmt)))
        rc = reqerr_set(&e, 400, "format", "'format' must be \"json\" or a JSON schema");
    if (rc == 0 && c->x->remote) {
        rc = generate_remote(c, body, opts, &gp, chat, stream);
        free(schema);
        genparams_deinit(&gp);
        return rc;
    }
    bool open = false;
    int think = -1;
    if (rc == 0 && (rc = parse_think(body, &think, &e)) == 0)
        rc = prompt_tokens(c, body, chat, think, gp.max_tokens, &toks, &n, &open, &e);
    if (rc == 0 && !json && !schema)
        rc = api_think_budget(c, &gp, open, &e);
    oll_job *j = rc == 0 ? calloc(1, sizeof *j) : NULL;
    if (rc == 0 && !j)
        rc = reqerr_set(&e, 503, NULL, "out of memory");
    task *t = NULL;
    if (rc == 0) {
        *j = (oll_job){.chat = chat, .stream = stream, .t0 = lms_now_ms(), .x = c->x,
                       .tools = chat && json_array_size(json_object_get(body, "tools")) > 0,
                       .think = think};
        /* held to JSON: no thoughts, whatever the prompt opened */
        j->fn_names = j->tools ? toolcall_names(json_object_get(body, "tools")) : NULL;
        reply_cut_init(&j->cut, think >= 0, open && !json && !schema, j->tools,
                       (const char *const *)j->fn_names);
        lms_request r = genparams_request(&gp, toks, n);
        r.json = json;
        r.schema = schema;
        t = task_submit(c, &r, &oll_ops, j, &e);
        if (!t)
            oll_destroy(&(task){.state = j});
    }
    free(toks);
    free(schema); /* the scheduler made its copy */
    genparams_deinit(&gp);
    if (!t)
        return reply_err(c, &e);
    if (stream) {
        http_stream_begin(c, 200, "application/x-ndjson");
        j->begun = true;
    }
    return 0;
}

int api_ollama_chat(conn *c, json_t *body)
{
    return generate(c, body, true);
}

int api_ollama_generate(conn *c, json_t *body)
{
    return generate(c, body, false);
}

/* ---- model listing -------------------------------------------------------------- */

static json_t *details(const lms_expert *x)
{
    json_t *d = json_object();
    json_object_set_new(d, "format", json_string("gguf"));
    if (x->state == LMS_EXPERT_READY) {
        const lms_model *m = x->model;
        json_object_set_new(d, "family", json_string(m->hp.arch));
        json_t *fam = json_array();
        json_array_append_new(fam, json_string(m->hp.arch));
        json_object_set_new(d, "families", fam);
    }
    return d;
}

static json_t *model_entry(const lms_expert *x)
{
    char name[200];
    snprintf(name, sizeof name, "%s:latest", x->cfg->id);
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string_lossy(name, strlen(name)));
    json_object_set_new(o, "model", json_string_lossy(name, strlen(name)));
    json_object_set_new(o, "modified_at", created_at());
    json_object_set_new(o, "size", json_integer((json_int_t)x->file_bytes));
    json_object_set_new(o, "digest", json_string(""));
    json_object_set_new(o, "details", details(x));
    json_object_set_new(o, "lmserv_state", json_string(lms_expert_state_name(x->state)));
    return o;
}

/* /api/ps's expires_at: when the model would be unloaded for idleness. */
static void add_expiry(json_t *o, const lms_server *s, const lms_expert *x)
{
    const double now = lms_now_ms(), at = lms_registry_expiry(s->reg, x, now);
    if (at < 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const time_t t = ts.tv_sec + (time_t)((at - now) / 1e3);
    struct tm tm;
    char buf[64];
    gmtime_r(&t, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_object_set_new(o, "expires_at", json_string(buf));
    json_object_set_new(o, "size_vram", json_integer(0));
}

/* /api/tags: every expert; /api/ps: the loaded ones. */
static int list_models(conn *c, bool running)
{
    lms_server *s = c->srv;
    json_t *arr = json_array();
    for (int i = 0; i < lms_registry_count(s->reg); i++) {
        const lms_expert *x = lms_registry_at(s->reg, i);
        if (running && x->state == LMS_EXPERT_READY) {
            json_t *o = model_entry(x);
            add_expiry(o, s, x);
            json_array_append_new(arr, o);
        } else if (!running) {
            json_array_append_new(arr, model_entry(x));
        }
    }
    json_t *o = json_object();
    json_object_set_new(o, "models", arr);
    return http_reply_json(c, 200, o);
}

int api_ollama_tags(conn *c)
{
    return list_models(c, false);
}

int api_ollama_ps(conn *c)
{
    return list_models(c, true);
}

int api_ollama_version(conn *c)
{
    return http_reply_json(c, 200, json_pack("{s:s}", "version", "0.1.0-lmserv"));
}

/* The named expert (or the default) as Ollama describes a model; no load. */
int api_ollama_show(conn *c, json_t *body)
{
    reqerr e;
    lms_server *s = c->srv;
    const char *model = NULL;
    if (reqparse_str(body, "model", &model, &e) < 0)
        return reply_err(c, &e);
    if (!model || !model[0])
        reqparse_str(body, "name", &model, &e); /* older clients */
    lms_expert *x = model && model[0] ? lms_registry_find(s->reg, model)
                                      : server_default_expert(s);
    if (!x) {
        pick_not_found(s, model, &e);
        return reply_err(c, &e);
    }
    json_t *o = json_object();
    json_object_set_new(o, "details", details(x));
    json_object_set_new(o, "modelfile", json_string(""));
    json_object_set_new(o, "parameters", json_string(""));
    json_t *info = json_object();
    if (x->state == LMS_EXPERT_READY) {
        const lms_model *m = x->model;
        json_object_set_new(info, "general.architecture", json_string(m->hp.arch));
        json_object_set_new(info, "general.name", json_string_lossy(m->name, strlen(m->name)));
        char key[64];
        snprintf(key, sizeof key, "%s.context_length", m->hp.arch);
        json_object_set_new(info, key, json_integer(m->hp.n_ctx_train));
        snprintf(key, sizeof key, "%s.embedding_length", m->hp.arch);
        json_object_set_new(info, key, json_integer(m->hp.n_embd));
    }
    json_object_set_new(o, "model_info", info);
    return http_reply_json(c, 200, o);
}

/* ---- model management ---------------------------------------------------------------
 * lmserv serves the models of its command line or --config; it neither
 * downloads nor writes model files. /api/pull of a model it serves answers
 * as Ollama does for one already present ({"status": "success"}, one NDJSON
 * line when streamed), so clients that pull before use go on; of another
 * model a 404 saying where models come from. /api/push, /api/create and
 * /api/copy get a 501 saying so. */

int api_ollama_pull(conn *c, json_t *body)
{
    reqerr e;
    const char *model = NULL;
    bool stream = true;
    if (reqparse_str(body, "model", &model, &e) < 0 || reqparse_bool(body, "stream", &stream, &e) < 0)
        return reply_err(c, &e);
    if (!model || !model[0])
        reqparse_str(body, "name", &model, &e); /* older clients */
    if (!model || !model[0]) {
        reqerr_set(&e, 400, "model", "'model' is required");
        return reply_err(c, &e);
    }
    if (!lms_registry_find(c->srv->reg, model)) {
        reqerr_set(&e, 404, "model",
                   "model '%.200s' is not served here, and lmserv does not download models: it "
                   "serves the files of its command line (-m) or --config", model);
        return reply_err(c, &e);
    }
    json_t *ok = json_pack("{s:s}", "status", "success");
    if (!stream)
        return http_reply_json(c, 200, ok);
    http_stream_begin(c, 200, "application/x-ndjson");
    send_line(c, ok);
    return http_stream_end(c);
}

int api_ollama_unsupported(conn *c, json_t *body)
{
    (void)body;
    reqerr e;
    reqerr_set(&e, 501, NULL, "%s is not supported: lmserv serves the model files of its "
               "command line (-m) or --config and does not create, copy or upload models",
               c->txn.path);
    return reply_err(c, &e);
}
