/*
 * api_anthropic.c - POST /v1/messages and /v1/messages/count_tokens:
 * Anthropic's Messages API, for the clients and SDKs that speak it (the
 * key may come as x-api-key, as they send it).
 *
 * Request: model, max_tokens (required), system (a string or text
 * blocks), messages (role user or assistant; content a string or blocks:
 * text, tool_use {id, name, input} in the assistant's turns, tool_result
 * {tool_use_id, content} in the user's, thinking {thinking} given back),
 * stop_sequences, temperature, top_p, top_k, stream, tools ({name,
 * description, input_schema}; custom tools only: Anthropic's own, named by
 * their type, are refused), tool_choice ({"type": "auto" | "any" |
 * "tool" (with name) | "none"}: any and tool hold the reply to a call, as
 * chat completions does), thinking ({"type": "enabled", "budget_tokens"}
 * switches the template's thinking on and bounds it (the scheduler's
 * reasoning budget), {"type": "disabled"} switches it off). The messages
 * become chat messages for the model's template (tool_use as tool_calls,
 * tool_result as tool messages, thinking as reasoning_content), so the
 * prompt is the one chat completions renders for the same conversation.
 *
 * Reply: {id msg_..., type message, role assistant, model, content:
 * [thinking block (the reply's thoughts, reasoning.h), text block, tool_use
 * blocks (the calls toolcall.h finds)], stop_reason end_turn | max_tokens |
 * stop_sequence (stop_sequence: which) | tool_use, usage {input_tokens,
 * output_tokens, cache_read_input_tokens}}. Streamed: server-sent events
 * named by their type: message_start, ping, then per block
 * content_block_start, content_block_delta (thinking_delta, text_delta;
 * a call's input as one input_json_delta), content_block_stop; then
 * message_delta (stop_reason, usage) and message_stop. Errors:
 * {"type": "error", "error": {"type", "message"}} with the HTTP status, or
 * as an error event once the stream has begun.
 *
 * count_tokens: the same system, messages and tools; {"input_tokens"}.
 * A remote expert (route/remote.h) gets the conversation as chat messages
 * (tool_use as tool_calls, tool_result as tool messages) with the sampling
 * fields, the tools and tool_choice in chat's form (its stream opens with
 * the first piece, so a refusal upstream stays an HTTP error); the calls
 * its reply makes come apart from the text and go out as tool_use blocks
 * as a local model's do. count_tokens stays local-only. Image and
 * document blocks are refused naming them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jsonschema.h"
#include "serve/reply.h"
#include "serve/serve_int.h"

enum { BLK_NONE, BLK_THINKING, BLK_TEXT };

typedef struct anth_job {
    bool stream;
    char id[40];
    const lms_expert *x;
    sbuf text;                 /* the reply */
    reply_cut cut;             /* its thoughts, text and calls */
    char **fn_names;           /* local with tools: their names (toolcall_names); owned */
    toolcalls calls;           /* a remote expert's calls (chatfmt_remote_call) */
    bool calls_lost;           /* one of them could not be kept (out of memory): the reply fails */
    char *stops[LMS_MAX_STOP]; /* the stop sequences, to name the one that ended it */
    int n_stop;
    int32_t n_prompt;          /* prompt tokens (message_start's usage) */
    bool begun;                /* streamed: the 200 and message_start went out */
    int n_blocks;              /* streamed: content blocks started */
    int open;                  /* streamed: BLK_* of the block open now */
} anth_job;

/* ---- errors ------------------------------------------------------------------------ */

static const char *error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

json_t *api_anthropic_error(const reqerr *e)
{
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                     error_type(e->status), "message", e->msg);
}

bool api_anthropic_path(const char *path)
{
    static const char prefix[] = "/v1/messages";
    return strncmp(path, prefix, sizeof prefix - 1) == 0 &&
           (path[sizeof prefix - 1] == '\0' || path[sizeof prefix - 1] == '/' ||
            path[sizeof prefix - 1] == '?');
}

/* ---- request ------------------------------------------------------------------------ */

/* The text of a string or of text blocks (joined by newlines); NULL with e
 * (naming field) for anything else. */
static json_t *text_of(const json_t *v, const char *field, reqerr *e)
{
    if (json_is_string(v))
        return json_incref((json_t *)v);
    if (!json_is_array(v)) {
        reqerr_set(e, 400, field, "%s must be a string or a list of text blocks", field);
        return NULL;
    }
    sbuf b = {0};
    size_t i;
    const json_t *blk;
    json_array_foreach(v, i, blk)
    {
        const char *type = json_string_value(json_object_get(blk, "type"));
        const json_t *t = json_object_get(blk, "text");
        if (!type || strcmp(type, "text") || !json_is_string(t)) {
            sbuf_free(&b);
            reqerr_set(e, 400, field, "%s[%zu] must be a text block", field, i);
            return NULL;
        }
        if (i > 0)
            sbuf_add(&b, "\n", 1);
        sbuf_add(&b, json_string_value(t), json_string_length(t));
    }
    json_t *s = json_stringn(b.p ? b.p : "", b.n);
    sbuf_free(&b);
    return s;
}

/* One message's blocks into chat messages appended to out. */
static int add_blocks(json_t *out, const char *role, const json_t *blocks, size_t k, reqerr *e)
{
    const bool assistant = !strcmp(role, "assistant");
    sbuf text = {0}, thoughts = {0};
    json_t *calls = json_array();
    size_t i;
    const json_t *blk;
    int rc = 0;
    json_array_foreach(blocks, i, blk)
    {
        const char *type = json_string_value(json_object_get(blk, "type"));
        const json_t *t = json_object_get(blk, "text");
        if (type && !strcmp(type, "text") && json_is_string(t)) {
            if (text.n)
                sbuf_add(&text, "\n", 1);
            sbuf_add(&text, json_string_value(t), json_string_length(t));
        } else if (assistant && type && !strcmp(type, "thinking")) {
            const json_t *th = json_object_get(blk, "thinking");
            if (json_is_string(th))
                sbuf_add(&thoughts, json_string_value(th), json_string_length(th));
        } else if (assistant && type && !strcmp(type, "redacted_thinking")) {
            continue;
        } else if (assistant && type && !strcmp(type, "tool_use")) {
            const json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
            const json_t *input = json_object_get(blk, "input");
            if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
                rc = reqerr_set(e, 400, "messages", "messages[%zu].content[%zu]: tool_use needs "
                                "string 'id' and 'name' and an object 'input'", k, i);
                break;
            }
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type",
                                                   "function", "function", "name", name,
                                                   "arguments", input ? input : json_object()));
        } else if (!assistant && type && !strcmp(type, "tool_result")) {
            const json_t *id = json_object_get(blk, "tool_use_id"), *cv = json_object_get(blk, "content");
            json_t *res = cv ? text_of(cv, "messages", e) : json_string("");
            if (!json_is_string(id) || !res) {
                json_decref(res);
                rc = reqerr_set(e, 400, "messages", "messages[%zu].content[%zu]: tool_result needs "
                                "a string 'tool_use_id' and text content", k, i);
                break;
            }
            json_array_append_new(out, json_pack("{s:s, s:O, s:o}", "role", "tool",
                                                 "tool_call_id", id, "content", res));
        } else {
            rc = reqerr_set(e, 400, "messages", "messages[%zu].content[%zu]: blocks of type "
                            "'%.40s' are not supported here", k, i, type ? type : "?");
            break;
        }
    }
    if (rc == 0 && (text.n || !assistant || json_array_size(calls) || thoughts.n)) {
        json_t *m = json_pack("{s:s, s:s%}", "role", role, "content", text.p ? text.p : "", text.n);
        if (thoughts.n)
            json_object_set_new(m, "reasoning_content", json_stringn(thoughts.p, thoughts.n));
        if (json_array_size(calls))
            json_object_set(m, "tool_calls", calls);
        /* a user turn of tool results alone adds no empty user message */
        if (assistant || text.n || json_array_size(blocks) == 0)
            json_array_append_new(out, m);
        else
            json_decref(m);
    }
    json_decref(calls);
    sbuf_free(&text);
    sbuf_free(&thoughts);
    return rc;
}

/* system and messages as chat messages (normalized); NULL with e. */
static json_t *chat_messages(const json_t *body, reqerr *e)
{
    const json_t *sys = json_object_get(body, "system"), *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        reqerr_set(e, 400, "messages", "'messages' must be a non-empty list of messages");
        return NULL;
    }
    json_t *out = json_array();
    if (sys && !json_is_null(sys)) {
        json_t *s = text_of(sys, "system", e);
        if (!s) {
            json_decref(out);
            return NULL;
        }
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", "system", "content", s));
    }
    size_t k;
    const json_t *m;
    json_array_foreach(msgs, k, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *content = json_object_get(m, "content");
        int rc = 0;
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant")))
            rc = reqerr_set(e, 400, "messages", "messages[%zu].role must be \"user\" or "
                            "\"assistant\"", k);
        else if (json_is_string(content))
            json_array_append_new(out, json_pack("{s:s, s:O}", "role", role, "content", content));
        else if (json_is_array(content))
            rc = add_blocks(out, role, content, k, e);
        else
            rc = reqerr_set(e, 400, "messages", "messages[%zu].content must be a string or a "
                            "list of blocks", k);
        if (rc < 0) {
            json_decref(out);
            return NULL;
        }
    }
    json_t *norm = chatfmt_messages(out, "messages", e);
    json_decref(out);
    return norm;
}

/* tools in chat completions' form (NULL: none) and tool_choice as chat's
 * (*forced: "required" or a named function, else NULL). */
static int chat_tools(const json_t *body, json_t **out, json_t **forced, reqerr *e)
{
    *out = *forced = NULL;
    const json_t *tools = json_object_get(body, "tools"), *tc = json_object_get(body, "tool_choice");
    const char *ct = json_string_value(json_object_get(tc, "type"));
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return reqerr_set(e, 400, "tools", "'tools' must be a list of tools");
    if (tc && !json_is_null(tc) &&
        (!ct || (strcmp(ct, "auto") && strcmp(ct, "any") && strcmp(ct, "tool") && strcmp(ct, "none"))))
        return reqerr_set(e, 400, "tool_choice", "tool_choice.type must be auto, any, tool or none");
    if (json_array_size(tools) == 0 || (ct && !strcmp(ct, "none")))
        return 0;
    json_t *a = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t)
    {
        const json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
        const char *type = json_string_value(json_object_get(t, "type"));
        if (type && strcmp(type, "custom")) { /* Anthropic's own (bash, web search, ...) */
            json_decref(a);
            return reqerr_set(e, 400, "tools", "tools[%zu]: tools of type '%.40s' are not "
                              "supported (only custom tools)", i, type);
        }
        if (!json_is_string(name) || (schema && !json_is_object(schema))) {
            json_decref(a);
            return reqerr_set(e, 400, "tools", "tools[%zu] needs a string 'name' and an object "
                              "'input_schema' (only custom tools are supported)", i);
        }
        json_array_append_new(a, chatfmt_tool(name, json_object_get(t, "description"), schema));
    }
    *out = a;
    const json_t *name = json_object_get(tc, "name");
    if (ct && !strcmp(ct, "any"))
        *forced = json_string("required");
    else if (ct && !strcmp(ct, "tool") && json_is_string(name))
        *forced = json_pack("{s:{s:O}}", "function", "name", name);
    else if (ct && !strcmp(ct, "tool"))
        return reqerr_set(e, 400, "tool_choice", "tool_choice of type tool needs a 'name'");
    return 0;
}

/* thinking: the template's switch and the reasoning budget. */
static int thinking(const json_t *body, json_t **kw, genparams *gp, reqerr *e)
{
    const json_t *th = json_object_get(body, "thinking");
    if (!th || json_is_null(th))
        return 0;
    const char *type = json_string_value(json_object_get(th, "type"));
    if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled")))
        return reqerr_set(e, 400, "thinking", "thinking.type must be enabled or disabled");
    if (!*kw)
        *kw = json_object();
    json_object_set_new(*kw, "enable_thinking", json_boolean(!strcmp(type, "enabled")));
    int64_t budget = -1;
    if (reqparse_int(th, "budget_tokens", 0, INT32_MAX, &budget, e) < 0)
        return -1;
    if (!strcmp(type, "enabled") && budget >= 0)
        gp->reasoning_budget = (int32_t)budget;
    return 0;
}

/* The body's fields in the names reqparse_gen reads (stop_sequences as
 * stop; seed and grammar as lmserv's other endpoints take them). */
static json_t *gen_fields(const json_t *body)
{
    static const char *const same[] = {"temperature", "top_p", "top_k", "max_tokens", "seed",
                                       "grammar", NULL};
    json_t *o = json_object();
    for (int k = 0; same[k]; k++)
        if (json_object_get(body, same[k]))
            json_object_set(o, same[k], json_object_get(body, same[k]));
    if (json_object_get(body, "stop_sequences"))
        json_object_set(o, "stop", json_object_get(body, "stop_sequences"));
    return o;
}

/* ---- reply --------------------------------------------------------------------------- */

/* A call's tool_use block (its input the arguments object). */
static json_t *tool_use_block(const anth_job *j, int i, const toolcall *tc, bool with_input)
{
    char id[48];
    snprintf(id, sizeof id, "toolu_%s_%d", j->id + 4, i);
    json_t *input = with_input ? json_loads(tc->arguments, 0, NULL) : NULL;
    return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name", tc->name,
                     "input", json_is_object(input) ? input : (json_decref(input), json_object()));
}

static const char *stop_reason(const anth_job *j, const lms_req_stats *st, const toolcalls *tc)
{
    if (tc->n)
        return "tool_use";
    if (st->finish && (!strcmp(st->finish, "length") || !strcmp(st->finish, "deadline")))
        return "max_tokens";
    if (st->stop_word && st->stop_index >= 0 && st->stop_index < j->n_stop)
        return "stop_sequence";
    return "end_turn";
}

static json_t *stop_sequence(const anth_job *j, const lms_req_stats *st, const toolcalls *tc)
{
    return !tc->n && !strcmp(stop_reason(j, st, tc), "stop_sequence")
               ? json_string(j->stops[st->stop_index])
               : json_null();
}

static json_t *usage(const lms_req_stats *st, int32_t n_prompt)
{
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens",
                     (json_int_t)(st ? st->n_prompt - st->n_cached : n_prompt),
                     "cache_read_input_tokens", (json_int_t)(st ? st->n_cached : 0),
                     "cache_creation_input_tokens", (json_int_t)0, "output_tokens",
                     (json_int_t)(st ? st->n_gen : 0));
}

static json_t *message_obj(const anth_job *j, json_t *content)
{
    return json_pack("{s:s, s:s, s:s, s:o, s:o, s:n, s:n}", "id", j->id, "type", "message", "role",
                     "assistant", "model", xid_json(j->x), "content", content, "stop_reason",
                     "stop_sequence");
}

/* The whole reply (not streamed). */
static json_t *full_reply(const anth_job *j, const reply_part *w, const toolcalls *tc,
                          const lms_req_stats *st)
{
    const char *t = j->text.p ? j->text.p : "";
    json_t *content = json_array();
    if (w->r_n)
        json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking",
                                                 t + w->r_from, w->r_n, "signature", ""));
    if (w->c_n || (!w->r_n && !tc->n))
        json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text",
                                                 t + w->c_from, w->c_n));
    for (int i = 0; i < tc->n; i++)
        json_array_append_new(content, tool_use_block(j, i, &tc->v[i], true));
    json_t *o = message_obj(j, content);
    json_object_set_new(o, "stop_reason", json_string(stop_reason(j, st, tc)));
    json_object_set_new(o, "stop_sequence", stop_sequence(j, st, tc));
    json_object_set_new(o, "usage", usage(st, 0));
    return o;
}

/* ---- streaming --------------------------------------------------------------------- */

static void send_event(conn *c, const char *type, json_t *o)
{
    json_object_set_new(o, "type", json_string(type));
    http_sse_event(c, type, o);
}

static void block_stop(conn *c, anth_job *j)
{
    if (j->open == BLK_NONE)
        return;
    send_event(c, "content_block_stop", json_pack("{s:i}", "index", j->n_blocks - 1));
    j->open = BLK_NONE;
}

/* Streamed: a thinking or text block begins (the one open ends). */
static void block_start(conn *c, anth_job *j, int kind)
{
    const char *field = kind == BLK_THINKING ? "thinking" : "text";
    block_stop(c, j);
    send_event(c, "content_block_start",
               json_pack("{s:i, s:{s:s, s:s}}", "index", j->n_blocks++, "content_block", "type",
                         field, field, ""));
    j->open = kind;
}

/* Streamed: a thinking or text piece, in a block of its kind. */
static void block_piece(conn *c, anth_job *j, int kind, const char *p, size_t n)
{
    if (n == 0)
        return;
    if (j->open != kind)
        block_start(c, j, kind);
    send_event(c, "content_block_delta",
               json_pack("{s:i, s:{s:s, s:s%}}", "index", j->n_blocks - 1, "delta", "type",
                         kind == BLK_THINKING ? "thinking_delta" : "text_delta",
                         kind == BLK_THINKING ? "thinking" : "text", p, n));
}

static void stream_begin(conn *c, anth_job *j)
{
    j->begun = true;
    http_stream_begin(c, 200, "text/event-stream");
    json_t *m = message_obj(j, json_array());
    json_object_set_new(m, "usage", usage(NULL, j->n_prompt));
    send_event(c, "message_start", json_pack("{s:o}", "message", m));
    send_event(c, "ping", json_object());
}

/* Streamed: what of the reply can go out (tc set: the end, calls read). */
static void stream_part(conn *c, anth_job *j, toolcalls *tc)
{
    reply_part p;
    reply_cut_next(&j->cut, j->text.p, j->text.n, &p, tc);
    block_piece(c, j, BLK_THINKING, j->text.p + p.r_from, p.r_n);
    block_piece(c, j, BLK_TEXT, j->text.p + p.c_from, p.c_n);
}

static void stream_end(conn *c, anth_job *j, const lms_req_stats *st)
{
    toolcalls tc;
    stream_part(c, j, &tc);
    chatfmt_take_calls(&tc, &j->calls);
    if (j->n_blocks == 0 && tc.n == 0) /* an empty reply still has its text block */
        block_start(c, j, BLK_TEXT);
    block_stop(c, j);
    for (int i = 0; i < tc.n; i++) {
        json_t *blk = tool_use_block(j, i, &tc.v[i], false);
        const int index = j->n_blocks++;
        send_event(c, "content_block_start", json_pack("{s:i, s:o}", "index", index,
                                                       "content_block", blk));
        send_event(c, "content_block_delta",
                   json_pack("{s:i, s:{s:s, s:s}}", "index", index, "delta", "type",
                             "input_json_delta", "partial_json", tc.v[i].arguments));
        send_event(c, "content_block_stop", json_pack("{s:i}", "index", index));
    }
    json_t *u = usage(st, 0);
    send_event(c, "message_delta",
               json_pack("{s:{s:s, s:o}, s:o}", "delta", "stop_reason", stop_reason(j, st, &tc),
                         "stop_sequence", stop_sequence(j, st, &tc), "usage", u));
    send_event(c, "message_stop", json_object());
    toolcalls_free(&tc);
    http_stream_end(c);
}

static void anth_on_event(task *t, const lms_event *ev, double t_ms)
{
    anth_job *j = t->state;
    conn *c = t->c;
    (void)t_ms;
    reqerr e;
    const chat_ev k = chatfmt_event(t, ev, &j->text, &j->calls, &j->calls_lost, &e);
    /* a remote expert's stream opens with its first piece: a refusal stays an HTTP error */
    if (j->stream && !j->begun && k != CHAT_EV_NONE && k != CHAT_EV_FAILED)
        stream_begin(c, j);
    if (k == CHAT_EV_TEXT && j->stream)
        stream_part(c, j, NULL);
    if (k == CHAT_EV_FAILED) {
        if (!j->begun)
            http_reply_err(c, &e);
        else {
            send_event(c, "error", api_anthropic_error(&e));
            http_stream_end(c);
        }
        return;
    }
    if (k != CHAT_EV_END)
        return;
    if (j->stream) {
        stream_end(c, j, &ev->stats);
        return;
    }
    toolcalls tc;
    reply_part w;
    chatfmt_reply_end(&j->cut, j->text.p, j->text.n, &j->calls, &w, &tc);
    http_reply_json(c, 200, full_reply(j, &w, &tc, &ev->stats));
    toolcalls_free(&tc);
}

static void anth_destroy(task *t)
{
    anth_job *j = t->state;
    sbuf_free(&j->text);
    toolcalls_free(&j->calls);
    free(j->fn_names);
    for (int i = 0; i < j->n_stop; i++)
        free(j->stops[i]);
    free(j);
}

static const task_ops anth_ops = {anth_on_event, anth_destroy};

/* ---- endpoints ------------------------------------------------------------------------ */

/* The prompt of a request: its messages and tools through the template. */
static int prompt(conn *c, const json_t *body, json_t *kw, const json_t *tools, int32_t **toks,
                  int32_t *n, bool *open, reqerr *e)
{
    json_t *msgs = chat_messages(body, e);
    if (!msgs)
        return -1;
    chat_in in = {msgs, tools, kw};
    int rc = chatfmt_tokens(xfmt(c->x), c->x->model, &in, toks, n, open, e);
    json_decref(msgs);
    return rc;
}

/* A remote expert: the conversation goes upstream as chat messages with
 * the generation fields (gen), the tools and the forced call (chat_tools). */
static task *submit_remote(conn *c, const json_t *body, const json_t *gen, const json_t *tools,
                           const json_t *forced, const genparams *gp, anth_job *j, reqerr *e)
{
    json_t *msgs = chat_messages(body, e);
    json_t *fields = chatfmt_upstream_tools(tools, forced);
    task *t = msgs ? chatfmt_submit_remote(c, msgs, gen, fields, gp, &anth_ops, j, e) : NULL;
    json_decref(fields);
    json_decref(msgs);
    return t;
}

int api_anthropic_count(conn *c, json_t *body)
{
    reqerr e;
    int picked = pick_expert(c, body, api_anthropic_count, &e); /* refuses remote experts */
    if (picked <= 0)
        return picked < 0 ? http_reply_err(c, &e) : 0;
    json_t *tools = NULL, *forced = NULL, *kw = NULL;
    genparams gp;
    genparams_init(&gp, 0);
    int32_t *toks = NULL, n = 0;
    int rc = chat_tools(body, &tools, &forced, &e);
    if (rc == 0)
        rc = chatfmt_kwargs(c->srv, NULL, &kw, &e);
    if (rc == 0)
        rc = thinking(body, &kw, &gp, &e);
    if (rc == 0)
        rc = prompt(c, body, kw, tools, &toks, &n, NULL, &e);
    json_decref(tools);
    json_decref(forced);
    json_decref(kw);
    genparams_deinit(&gp);
    free(toks);
    if (rc < 0)
        return http_reply_err(c, &e);
    return http_reply_json(c, 200, json_pack("{s:I}", "input_tokens", (json_int_t)n));
}

int api_anthropic_messages(conn *c, json_t *body)
{
    reqerr e;
    int picked = pick_expert(c, body, api_anthropic_messages, &e);
    if (picked <= 0)
        return picked < 0 ? http_reply_err(c, &e) : 0;
    const bool remote = c->x->remote != NULL;
    genparams gp;
    server_genparams(c->srv, &gp);
    bool stream = false, open = false;
    int64_t max_tokens = 0;
    json_t *tools = NULL, *forced = NULL, *kw = NULL, *gen = gen_fields(body);
    lms_jschema *call = NULL;
    int32_t *toks = NULL, n = 0;
    int rc = reqparse_int(body, "max_tokens", 1, INT32_MAX, &max_tokens, &e);
    if (rc == 0)
        rc = reqerr_set(&e, 400, "max_tokens", "'max_tokens' is required");
    else if (rc > 0)
        rc = 0;
    if (rc == 0 && (reqparse_bool(body, "stream", &stream, &e) < 0 || reqparse_gen(gen, &gp, &e) < 0 ||
                    api_lora_pick(c, body, &gp, &e) < 0 || chat_tools(body, &tools, &forced, &e) < 0 ||
                    chatfmt_kwargs(c->srv, NULL, &kw, &e) < 0 || thinking(body, &kw, &gp, &e) < 0))
        rc = -1;
    if (rc == 0 && !remote && forced && api_forced_call(tools, forced, &call, &e) < 0)
        rc = -1;
    if (rc == 0 && !remote)
        rc = prompt(c, body, kw, tools, &toks, &n, &open, &e);
    if (rc == 0 && !remote && !call)
        rc = api_think_budget(c, &gp, open, &e);
    anth_job *j = rc == 0 ? calloc(1, sizeof *j) : NULL;
    if (rc == 0 && !j)
        rc = reqerr_set(&e, 503, NULL, "out of memory");
    task *t = NULL;
    if (rc == 0) {
        j->stream = stream;
        j->x = c->x;
        j->n_prompt = n;
        snprintf(j->id, sizeof j->id, "msg_%016llx", (unsigned long long)server_rand(c->srv));
        for (int i = 0; i < gp.n_stop; i++)
            if ((j->stops[j->n_stop] = strdup(gp.stop[i])))
                j->n_stop++;
        /* held to a call: no thoughts, whatever the prompt opened */
        const bool find_calls = tools != NULL && !remote; /* remote: its calls come apart */
        j->fn_names = find_calls ? toolcall_names(tools) : NULL;
        reply_cut_init(&j->cut, c->srv->rfmt != REASONING_NONE, open && !call, find_calls,
                       (const char *const *)j->fn_names);
        lms_request r = genparams_request(&gp, toks, n);
        r.json = call != NULL;
        r.schema = call;
        t = remote ? submit_remote(c, body, gen, tools, forced, &gp, j, &e)
                   : task_submit(c, &r, &anth_ops, j, &e);
        if (!t)
            anth_destroy(&(task){.state = j});
    }
    free(toks);
    free(call);
    json_decref(tools);
    json_decref(forced);
    json_decref(kw);
    json_decref(gen);
    genparams_deinit(&gp);
    if (!t)
        return http_reply_err(c, &e);
    if (stream && !remote) /* remote: with the first piece */
        stream_begin(c, j);
    return 0;
}
