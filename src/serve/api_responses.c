/*
 * api_responses.c - POST /v1/responses: OpenAI's Responses API, for text.
 *
 * Request: model, input (a string, or a list of messages: {role, content}
 * with role user, assistant, system or developer, content a string or
 * input_text / output_text parts; {"type": "message"} items alike),
 * instructions (a system message before the input), max_output_tokens,
 * the sampling fields (temperature, top_p, seed, ... as the other
 * endpoints read them), text.format ({"type": "text"}, "json_object", or
 * "json_schema" with its schema: JSON mode as for response_format), stream.
 * tools: function tools ({"type": "function", name, description,
 * parameters}) rendered with the chat template as chat completions does;
 * the calls the reply writes become function_call output items
 * ({call_id, name, arguments}) after the message (its text before the
 * calls), and a follow-up's input may carry function_call and
 * function_call_output items (the calls and their results), and reasoning
 * items (their text becomes the next assistant turn's reasoning_content).
 * chat_template_kwargs as for chat completions. tool_choice "auto",
 * "none", "required" or {"type": "function", "name"} (the reply held to a
 * call, as chat completions holds it). Refused, naming the field: other
 * tool types, parts other than text.
 *
 * Stored responses: unless store is false, a finished response is kept
 * with its conversation (the input less the instructions, then the reply
 * as the assistant's turn with its thoughts and calls), the last 128 in
 * memory: GET /v1/responses/{id} returns it, DELETE /v1/responses/{id}
 * drops it, and previous_response_id continues its conversation (the new
 * input after it; the instructions, as OpenAI has it, are not carried
 * over).
 *
 * Reply: a response object (id resp_..., status completed, or incomplete
 * with incomplete_details.reason max_output_tokens) whose output is the
 * thoughts as a reasoning item (reasoning.h; unless the server's
 * --reasoning-format is none), one assistant message of one output_text,
 * then the calls; and usage (input_tokens with
 * cached_tokens, output_tokens, total_tokens). Streamed: server-sent events
 * with their type as the event name and a sequence_number:
 * response.created, response.in_progress; the reasoning item's
 * output_item.added, content_part.added, reasoning_text.delta per piece,
 * reasoning_text.done, content_part.done, output_item.done when the reply
 * thinks; then the message's response.output_item.added,
 * response.content_part.added, response.output_text.delta per piece,
 * response.output_text.done, response.content_part.done,
 * response.output_item.done, then response.completed (or
 * response.incomplete); a failure mid-way sends an error event. With tools
 * the text streams as far as it cannot be a call yet (toolcall_safe_len),
 * and each call follows as its own output item (added, its arguments as
 * one delta and done, done). A remote expert gets the conversation as chat
 * messages (its stream opening with the first piece), the calls as
 * assistant tool_calls and their outputs as tool messages, with the tools,
 * tool_choice in chat's form and text.format as response_format; the calls
 * its reply makes come apart from the text (route/remote.h) and go out as
 * function_call items as a local model's do.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timeutil.h"
#include "engine/jsonschema.h"
#include "serve/reply.h"
#include "serve/serve_int.h"

typedef struct resp_job {
    bool stream;
    bool store;               /* kept for previous_response_id when finished */
    bool begun;               /* streamed: the 200 and the first events went out */
    json_t *conv;             /* the conversation (without the instructions) to store */
    char id[40], msg_id[40], rs_id[40];
    int64_t created;
    int seq;                  /* the next event's sequence_number */
    sbuf text;
    reply_cut cut;            /* thoughts, content and calls of the reply */
    char **fn_names;          /* local with tools: their names (toolcall_names); owned */
    toolcalls calls;          /* a remote expert's calls (chatfmt_remote_call) */
    bool calls_lost;           /* one of them could not be kept (out of memory): the reply fails */
    int rs_index, msg_index;  /* streamed: output index of the reasoning item and of the
                               * message once added, else -1 */
    bool rs_done;             /* streamed: the reasoning item is done */
    int n_items;              /* streamed: output items added */
    const lms_expert *x;
    json_t *echo;             /* the request's fields the response repeats */
} resp_job;

/* Sends one event: "event: TYPE" and the object (steals o) with its type
 * and sequence number. */
static void send_event(conn *c, resp_job *j, const char *type, json_t *o)
{
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(j->seq++));
    http_sse_event(c, type, o);
}

static json_t *text_part(const char *type, const char *text, size_t n)
{
    json_t *o = json_pack("{s:s, s:o}", "type", type, "text", json_stringn(text, n));
    if (!strcmp(type, "output_text"))
        json_object_set_new(o, "annotations", json_array());
    return o;
}

/* The output message with text t[0, n) (done: completed; t NULL: no part yet). */
static json_t *message_item(const resp_job *j, bool done, const char *t, size_t n)
{
    json_t *content = json_array();
    if (t)
        json_array_append_new(content, text_part("output_text", t, n));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", j->msg_id, "type", "message", "status",
                     done ? "completed" : "in_progress", "role", "assistant", "content", content);
}

/* The reasoning item with thoughts t[0, n) (t NULL: no part yet). */
static json_t *reasoning_item(const resp_job *j, bool done, const char *t, size_t n)
{
    json_t *content = json_array();
    if (t)
        json_array_append_new(content, text_part("reasoning_text", t, n));
    return json_pack("{s:s, s:s, s:s, s:[], s:o}", "id", j->rs_id, "type", "reasoning", "status",
                     done ? "completed" : "in_progress", "summary", "content", content);
}

/* A call's output item. */
static json_t *call_item(const resp_job *j, int i, const toolcall *tc, bool done)
{
    char id[48], call_id[48];
    snprintf(id, sizeof id, "fc_%s_%d", j->id + 5, i);
    snprintf(call_id, sizeof call_id, "call_%s_%d", j->id + 5, i);
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o}", "type", "function_call", "id", id, "status",
                     done ? "completed" : "in_progress", "call_id", call_id, "name",
                     json_string_lossy(tc->name, strlen(tc->name)), "arguments",
                     done ? json_string_lossy(tc->arguments, strlen(tc->arguments)) : json_string(""));
}

/* Whether the generation stopped at its limit (max_output_tokens, the
 * deadline): the response is then incomplete. */
static bool cut_short(const lms_req_stats *st)
{
    return st->finish && (!strcmp(st->finish, "length") || !strcmp(st->finish, "deadline"));
}

/* The response object; st NULL: still in progress (no output, no usage),
 * else finished: the reply's parts w (reply_cut_whole) and calls tc. */
static json_t *response_obj(const resp_job *j, const lms_req_stats *st, const reply_part *w,
                            const toolcalls *tc)
{
    json_t *o = json_deep_copy(j->echo);
    const bool cut = st && cut_short(st);
    json_object_set_new(o, "id", json_string(j->id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer(j->created));
    json_object_set_new(o, "status", json_string(!st ? "in_progress" : cut ? "incomplete" : "completed"));
    json_object_set_new(o, "model", xid_json(j->x));
    json_t *output = json_array();
    if (st) {
        const char *t = j->text.p ? j->text.p : "";
        if (w->r_n)
            json_array_append_new(output, reasoning_item(j, true, t + w->r_from, w->r_n));
        json_array_append_new(output, message_item(j, true, t + w->c_from, w->c_n));
        for (int i = 0; i < tc->n; i++)
            json_array_append_new(output, call_item(j, i, &tc->v[i], true));
    }
    json_object_set_new(o, "output", output);
    json_object_set_new(o, "error", json_null());
    json_object_set_new(o, "incomplete_details",
                        cut ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
    json_object_set_new(o, "store", json_boolean(j->store));
    if (!json_object_get(o, "tools") || json_is_null(json_object_get(o, "tools")))
        json_object_set_new(o, "tools", json_array());
    if (!json_object_get(o, "tool_choice") || json_is_null(json_object_get(o, "tool_choice")))
        json_object_set_new(o, "tool_choice", json_string("auto"));
    json_object_set_new(o, "parallel_tool_calls", json_false());
    if (st)
        json_object_set_new(
            o, "usage",
            json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)st->n_prompt,
                      "input_tokens_details", "cached_tokens", (json_int_t)st->n_cached,
                      "output_tokens", (json_int_t)st->n_gen, "output_tokens_details",
                      "reasoning_tokens", (json_int_t)st->n_think, "total_tokens", (json_int_t)(st->n_prompt + st->n_gen)));
    else
        json_object_set_new(o, "usage", json_null());
    return o;
}

/* The events before the first piece. */
static void stream_begin(conn *c, resp_job *j)
{
    j->begun = true;
    http_stream_begin(c, 200, "text/event-stream");
    send_event(c, j, "response.created",
               json_pack("{s:o}", "response", response_obj(j, NULL, NULL, NULL)));
    send_event(c, j, "response.in_progress",
               json_pack("{s:o}", "response", response_obj(j, NULL, NULL, NULL)));
}

/* ---- stored responses ------------------------------------------------------------ */

/* Responses kept for previous_response_id and GET /v1/responses/{id}:
 * the last RESP_STORE_MAX stored, the oldest dropped first. */
#define RESP_STORE_MAX 128

typedef struct stored_resp {
    char id[40];
    json_t *response;          /* the response object as returned */
    json_t *conv;              /* its conversation, its reply included (normalized messages) */
} stored_resp;

struct resp_store {
    stored_resp v[RESP_STORE_MAX];
    int next;                  /* the slot the next one takes */
};

static stored_resp *store_find(lms_server *s, const char *id)
{
    for (int i = 0; s->rstore && i < RESP_STORE_MAX; i++)
        if (s->rstore->v[i].response && !strcmp(s->rstore->v[i].id, id))
            return &s->rstore->v[i];
    return NULL;
}

static void store_drop(stored_resp *r)
{
    json_decref(r->response);
    json_decref(r->conv);
    memset(r, 0, sizeof *r);
}

void api_responses_free_store(lms_server *s)
{
    for (int i = 0; s->rstore && i < RESP_STORE_MAX; i++)
        store_drop(&s->rstore->v[i]);
    free(s->rstore);
    s->rstore = NULL;
}

/* The reply as the assistant turn that follows the conversation: its text,
 * thoughts and calls (their call_ids as the function_call items carry
 * them, so that the outputs sent back find them). */
static json_t *reply_message(const resp_job *j, const reply_part *w, const toolcalls *tc)
{
    const char *t = j->text.p ? j->text.p : "";
    json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content", t + w->c_from, w->c_n);
    if (w->r_n)
        json_object_set_new(m, "reasoning_content", json_stringn(t + w->r_from, w->r_n));
    if (tc->n) {
        json_t *calls = json_array();
        for (int i = 0; i < tc->n; i++) {
            json_t *item = call_item(j, i, &tc->v[i], true);
            json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id",
                                                   json_object_get(item, "call_id"), "type",
                                                   "function", "function", "name",
                                                   json_object_get(item, "name"), "arguments",
                                                   json_object_get(item, "arguments")));
            json_decref(item);
        }
        json_object_set_new(m, "tool_calls", calls);
    }
    return m;
}

/* Keeps a finished response (store: true) with its conversation. */
static void store_put(lms_server *s, resp_job *j, const json_t *response, const reply_part *w,
                      const toolcalls *tc)
{
    if (!j->store || !j->conv || (!s->rstore && !(s->rstore = calloc(1, sizeof *s->rstore))))
        return;
    stored_resp *r = &s->rstore->v[s->rstore->next];
    s->rstore->next = (s->rstore->next + 1) % RESP_STORE_MAX;
    store_drop(r);
    snprintf(r->id, sizeof r->id, "%s", j->id);
    r->response = json_deep_copy(response);
    r->conv = j->conv;
    j->conv = NULL;
    json_array_append_new(r->conv, reply_message(j, w, tc));
}

/* GET /v1/responses/{id} and DELETE /v1/responses/{id}. */
int api_responses_get(conn *c, const char *id, bool del)
{
    reqerr e;
    stored_resp *r = store_find(c->srv, id);
    if (!r) {
        reqerr_set(&e, 404, NULL, "no stored response '%.64s'", id);
        return http_reply_err(c, &e);
    }
    if (!del)
        return http_reply_json(c, 200, json_incref(r->response));
    json_t *o = json_pack("{s:s, s:s, s:b}", "id", r->id, "object", "response", "deleted", 1);
    store_drop(r);
    return http_reply_json(c, 200, o);
}

/* The conversation previous_response_id continues (borrowed), NULL when
 * none is asked; -1 with e when it is not stored. */
static int previous_conv(lms_server *s, const json_t *body, const json_t **conv, reqerr *e)
{
    const char *prev = NULL;
    *conv = NULL;
    if (reqparse_str(body, "previous_response_id", &prev, e) < 0)
        return -1;
    if (!prev)
        return 0;
    const stored_resp *r = store_find(s, prev);
    if (!r)
        return reqerr_set(e, 400, "previous_response_id", "no stored response '%.64s' (the "
                          "server keeps the last %d with store: true)", prev, RESP_STORE_MAX);
    *conv = r->conv;
    return 0;
}

/* Streamed: an item and its one content part begin (reasoning: the
 * reasoning item, else the message). */
static int item_open(conn *c, resp_job *j, bool thoughts)
{
    const int index = j->n_items++;
    const char *id = thoughts ? j->rs_id : j->msg_id;
    send_event(c, j, "response.output_item.added",
               json_pack("{s:i, s:o}", "output_index", index, "item",
                         thoughts ? reasoning_item(j, false, NULL, 0)
                                   : message_item(j, false, NULL, 0)));
    send_event(c, j, "response.content_part.added",
               json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", index,
                         "content_index", 0,
                         "part", text_part(thoughts ? "reasoning_text" : "output_text", "", 0)));
    return index;
}

/* Streamed: the item's text t[0, n) is complete. */
static void item_close(conn *c, resp_job *j, bool thoughts, const char *t, size_t n)
{
    const int index = thoughts ? j->rs_index : j->msg_index;
    const char *id = thoughts ? j->rs_id : j->msg_id;
    send_event(c, j, thoughts ? "response.reasoning_text.done" : "response.output_text.done",
               json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", index,
                         "content_index", 0, "text", json_stringn(t, n)));
    send_event(c, j, "response.content_part.done",
               json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", index,
                         "content_index", 0,
                         "part", text_part(thoughts ? "reasoning_text" : "output_text", t, n)));
    send_event(c, j, "response.output_item.done",
               json_pack("{s:i, s:o}", "output_index", index, "item",
                         thoughts ? reasoning_item(j, true, t, n) : message_item(j, true, t, n)));
}

/* Streamed: sends what of the reply can go out (end: tc set, all of it
 * but the calls, read into *tc), opening and closing the reasoning item
 * and the message as the thoughts and the content come. */
static void stream_part(conn *c, resp_job *j, toolcalls *tc)
{
    reply_part p, w;
    reply_cut_next(&j->cut, j->text.p, j->text.n, &p, tc);
    reply_cut_whole(&j->cut, j->text.n, &w);
    const char *t = j->text.p;
    if (p.r_n) {
        if (j->rs_index < 0)
            j->rs_index = item_open(c, j, true);
        send_event(c, j, "response.reasoning_text.delta",
                   json_pack("{s:s, s:i, s:i, s:o}", "item_id", j->rs_id, "output_index",
                             j->rs_index, "content_index", 0, "delta",
                             json_stringn(t + p.r_from, p.r_n)));
    }
    if (j->rs_index >= 0 && !j->rs_done && (p.c_n || tc)) { /* the thoughts are over */
        item_close(c, j, true, t + w.r_from, w.r_n);
        j->rs_done = true;
    }
    if ((p.c_n || tc) && j->msg_index < 0)
        j->msg_index = item_open(c, j, false);
    if (p.c_n)
        send_event(c, j, "response.output_text.delta",
                   json_pack("{s:s, s:i, s:i, s:o}", "item_id", j->msg_id, "output_index",
                             j->msg_index, "content_index", 0, "delta",
                             json_stringn(t + p.c_from, p.c_n)));
}

static void resp_on_event(task *t, const lms_event *ev, double t_ms)
{
    resp_job *j = t->state;
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
            send_event(c, j, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", e.msg));
            http_stream_end(c);
        }
        return;
    }
    if (k != CHAT_EV_END)
        return;
    toolcalls tc;
    reply_part w;
    if (!j->stream) {
        chatfmt_reply_end(&j->cut, j->text.p, j->text.n, &j->calls, &w, &tc);
        json_t *o = response_obj(j, &ev->stats, &w, &tc);
        store_put(c->srv, j, o, &w, &tc);
        http_reply_json(c, 200, o);
        toolcalls_free(&tc);
        return;
    }
    stream_part(c, j, &tc);
    reply_cut_whole(&j->cut, j->text.n, &w);
    chatfmt_take_calls(&tc, &j->calls);
    const char *text = j->text.p ? j->text.p : "";
    item_close(c, j, false, text + w.c_from, w.c_n);
    for (int i = 0; i < tc.n; i++) {
        const int index = j->n_items++;
        json_t *item = call_item(j, i, &tc.v[i], true);
        const char *item_id = json_string_value(json_object_get(item, "id"));
        send_event(c, j, "response.output_item.added",
                   json_pack("{s:i, s:o}", "output_index", index, "item", call_item(j, i, &tc.v[i], false)));
        send_event(c, j, "response.function_call_arguments.delta",
                   json_pack("{s:s, s:i, s:O}", "item_id", item_id, "output_index", index, "delta",
                             json_object_get(item, "arguments")));
        send_event(c, j, "response.function_call_arguments.done",
                   json_pack("{s:s, s:i, s:O}", "item_id", item_id, "output_index", index,
                             "arguments", json_object_get(item, "arguments")));
        send_event(c, j, "response.output_item.done",
                   json_pack("{s:i, s:o}", "output_index", index, "item", item));
    }
    json_t *o = response_obj(j, &ev->stats, &w, &tc);
    store_put(c->srv, j, o, &w, &tc);
    send_event(c, j, cut_short(&ev->stats) ? "response.incomplete" : "response.completed",
               json_pack("{s:o}", "response", o));
    toolcalls_free(&tc);
    http_stream_end(c);
}

static void resp_destroy(task *t)
{
    resp_job *j = t->state;
    sbuf_free(&j->text);
    toolcalls_free(&j->calls);
    free(j->fn_names);
    json_decref(j->echo);
    json_decref(j->conv);
    free(j);
}

static const task_ops resp_ops = {resp_on_event, resp_destroy};

/* ---- the request ----------------------------------------------------------------- */

/* A content as chat messages take it: a string, or its text parts
 * (input_text, output_text) as "text" parts, which chatfmt_messages joins;
 * NULL with e. */
static json_t *content_parts(const json_t *content, size_t k, reqerr *e)
{
    if (json_is_string(content))
        return json_incref((json_t *)content);
    if (!json_is_array(content)) {
        reqerr_set(e, 400, "input", "input[%zu].content must be a string or a list of parts", k);
        return NULL;
    }
    json_t *parts = json_array();
    size_t i;
    const json_t *p;
    json_array_foreach(content, i, p)
    {
        const char *type = json_string_value(json_object_get(p, "type"));
        const json_t *text = json_object_get(p, "text");
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text")) ||
            !json_is_string(text)) {
            json_decref(parts);
            reqerr_set(e, 400, "input", "input[%zu].content[%zu]: only text parts (input_text, "
                       "output_text) are supported", k, i);
            return NULL;
        }
        json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
    }
    return parts;
}

/* A function_call input item as an assistant message's tool call (joined
 * to the previous message when that is one of such calls), or a
 * function_call_output as the tool's message. */
static int call_message(json_t *msgs, const json_t *item, const char *type, size_t k, reqerr *e)
{
    const json_t *call_id = json_object_get(item, "call_id");
    if (!json_is_string(call_id))
        return reqerr_set(e, 400, "input", "input[%zu] (%s) needs a string 'call_id'", k, type);
    if (!strcmp(type, "function_call_output")) {
        const json_t *out = json_object_get(item, "output");
        if (!json_is_string(out))
            return reqerr_set(e, 400, "input", "input[%zu].output must be a string", k);
        json_array_append_new(msgs, json_pack("{s:s, s:O, s:O}", "role", "tool", "tool_call_id",
                                              call_id, "content", out));
        return 0;
    }
    const json_t *name = json_object_get(item, "name"), *args = json_object_get(item, "arguments");
    if (!json_is_string(name) || !json_is_string(args))
        return reqerr_set(e, 400, "input", "input[%zu] (function_call) needs string 'name' and "
                          "'arguments'", k);
    json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", call_id, "type", "function",
                             "function", "name", name, "arguments", args);
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    json_t *calls = json_object_get(last, "tool_calls");
    if (json_is_array(calls) && !strcmp(json_string_value(json_object_get(last, "role")), "assistant")) {
        json_array_append_new(calls, call);
        return 0;
    }
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:[o]}", "role", "assistant", "content", "",
                                          "tool_calls", call));
    return 0;
}

/* The request's function tools in chat completions' form (NULL: none);
 * -1 with e on a tool lmserv cannot take. */
static int chat_tools(const json_t *body, json_t **out, json_t **forced, reqerr *e)
{
    *out = *forced = NULL;
    const json_t *tools = json_object_get(body, "tools");
    const json_t *choice = json_object_get(body, "tool_choice");
    const char *cs = json_string_value(choice);
    const char *ctype = json_string_value(json_object_get(choice, "type"));
    const json_t *cname = json_object_get(choice, "name");
    if (json_is_object(choice) && ctype && !strcmp(ctype, "function") && json_is_string(cname))
        *forced = json_pack("{s:{s:O}}", "function", "name", cname); /* chat's form */
    else if (cs && !strcmp(cs, "required"))
        *forced = json_incref((json_t *)choice);
    else if (choice && !json_is_null(choice) && !(cs && (!strcmp(cs, "auto") || !strcmp(cs, "none"))))
        return reqerr_set(e, 400, "tool_choice", "tool_choice must be \"auto\", \"none\", "
                          "\"required\" or {\"type\": \"function\", \"name\": ...}");
    if (*forced && json_array_size(tools) == 0) {
        json_decref(*forced);
        *forced = NULL;
        return reqerr_set(e, 400, "tool_choice", "tool_choice asks for a call but there are no tools");
    }
    if (json_array_size(tools) == 0 || (cs && !strcmp(cs, "none")))
        return 0;
    json_t *a = json_array();
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *type = json_string_value(json_object_get(t, "type"));
        const json_t *name = json_object_get(t, "name");
        if (!type || strcmp(type, "function") || !json_is_string(name)) {
            json_decref(a);
            return reqerr_set(e, 400, "tools", "tools[%zu]: only function tools with a name are "
                              "supported", i);
        }
        json_array_append_new(a, chatfmt_tool(name, json_object_get(t, "description"),
                                               json_object_get(t, "parameters")));
    }
    *out = a;
    return 0;
}

/* instructions and input as chat messages; NULL with e. */
/* A reasoning input item's text (its reasoning_text parts, else its
 * summary's), or NULL. */
static json_t *reasoning_text(const json_t *item)
{
    sbuf b = {0};
    for (int pass = 0; pass < 2 && b.n == 0; pass++) {
        size_t i;
        const json_t *part;
        json_array_foreach(json_object_get(item, pass ? "summary" : "content"), i, part)
        {
            const json_t *t = json_object_get(part, "text");
            if (json_is_string(t))
                sbuf_add(&b, json_string_value(t), json_string_length(t));
        }
    }
    json_t *s = b.n ? json_stringn(b.p, b.n) : NULL;
    sbuf_free(&b);
    return s;
}

/* The thoughts of a reasoning item go with the assistant turn that follows
 * it (templates render them as reasoning_content: Qwen3, DeepSeek-R1, ...). */
static void give_thoughts(json_t *msgs, json_t **thoughts)
{
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (!*thoughts || !role || strcmp(role, "assistant"))
        return;
    json_object_set_new(last, "reasoning_content", *thoughts);
    *thoughts = NULL;
}

/* The conversation of a request: the stored one of previous_response_id
 * (prev, or NULL), then the input's messages; normalized (chatfmt_messages).
 * The instructions are not in it: they hold for one response only. */
static json_t *input_messages(const json_t *body, const json_t *prev, reqerr *e)
{
    const json_t *in = json_object_get(body, "input");
    json_t *msgs = prev ? json_deep_copy(prev) : json_array();
    if (json_is_string(in)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", in));
        return msgs;
    }
    if (!json_is_array(in) || json_array_size(in) == 0) {
        json_decref(msgs);
        reqerr_set(e, 400, "input", "'input' must be a string or a non-empty list of messages");
        return NULL;
    }
    size_t k;
    const json_t *item;
    json_t *thoughts = NULL; /* a reasoning item's text, for the assistant turn after it */
    json_array_foreach(in, k, item)
    {
        const char *type = json_string_value(json_object_get(item, "type"));
        const char *role = json_string_value(json_object_get(item, "role"));
        if (type && !strcmp(type, "reasoning")) {
            json_decref(thoughts);
            thoughts = reasoning_text(item);
            continue;
        }
        if (type && (!strcmp(type, "function_call") || !strcmp(type, "function_call_output"))) {
            if (call_message(msgs, item, type, k, e) < 0) {
                json_decref(msgs);
                json_decref(thoughts);
                return NULL;
            }
            give_thoughts(msgs, &thoughts);
            continue;
        }
        if ((type && strcmp(type, "message")) || !role ||
            (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
             strcmp(role, "developer"))) {
            json_decref(msgs);
            json_decref(thoughts);
            reqerr_set(e, 400, "input", "input[%zu] must be a message with role user, assistant, "
                       "system or developer (%s items are not supported)", k,
                       type ? type : "role-less");
            return NULL;
        }
        json_t *content = content_parts(json_object_get(item, "content"), k, e);
        if (!content) {
            json_decref(msgs);
            json_decref(thoughts);
            return NULL;
        }
        json_array_append_new(msgs, json_pack("{s:s, s:o}", "role",
                                              strcmp(role, "developer") ? role : "system",
                                              "content", content));
        give_thoughts(msgs, &thoughts);
    }
    json_decref(thoughts);
    json_t *norm = chatfmt_messages(msgs, "input", e);
    json_decref(msgs);
    return norm;
}

/* text.format in chat's words for a remote expert: response_format
 * {"type": "json_object"} or {"type": "json_schema", "json_schema": {name,
 * schema, strict, description}}, into *fields; NULL with e. */
static int upstream_format(const json_t *fmt, bool schema, json_t *fields, reqerr *e)
{
    if (!schema) {
        json_object_set_new(fields, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    const json_t *sch = json_object_get(fmt, "schema"), *name = json_object_get(fmt, "name");
    if (!json_is_object(sch))
        return reqerr_set(e, 400, "text.format", "text.format.schema must be an object");
    json_t *js = json_pack("{s:s, s:O}", "name", json_is_string(name) ? json_string_value(name)
                                                                       : "response",
                           "schema", sch);
    static const char *const more[] = {"strict", "description", NULL};
    for (int k = 0; more[k]; k++)
        if (json_object_get(fmt, more[k]))
            json_object_set(js, more[k], json_object_get(fmt, more[k]));
    json_object_set_new(fields, "response_format",
                        json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
    return 0;
}

/* text.format: JSON mode and its schema, as response_format gives them;
 * fields (a remote expert's, else NULL): the upstream's response_format. */
static int text_format(const json_t *body, json_t *fields, bool *json, lms_jschema **schema,
                       reqerr *e)
{
    const json_t *fmt = json_object_get(json_object_get(body, "text"), "format");
    const char *type = json_string_value(json_object_get(fmt, "type"));
    if (!fmt || json_is_null(fmt) || (type && !strcmp(type, "text")))
        return 0;
    const bool is_schema = type && !strcmp(type, "json_schema");
    if (fields && (is_schema || (type && !strcmp(type, "json_object")))) {
        *json = true;
        return upstream_format(fmt, is_schema, fields, e);
    }
    if (type && !strcmp(type, "json_object")) {
        *json = true;
        return 0;
    }
    if (is_schema) {
        *json = true;
        return (*schema = api_compile_schema(json_object_get(fmt, "schema"), "text.format", e))
                   ? 0
                   : -1;
    }
    return reqerr_set(e, 400, "text.format", "text.format type '%.40s' is not supported (text, "
                      "json_object, json_schema)", type ? type : "?");
}

/* The messages rendered: the instructions (a system message) and conv. */
static json_t *with_instructions(const json_t *body, const json_t *conv, reqerr *e)
{
    const json_t *ins = json_object_get(body, "instructions");
    if (ins && !json_is_null(ins) && !json_is_string(ins)) {
        reqerr_set(e, 400, "instructions", "'instructions' must be a string");
        return NULL;
    }
    json_t *msgs = json_array();
    if (json_is_string(ins) && json_string_length(ins) > 0)
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    json_array_extend(msgs, (json_t *)conv);
    return msgs;
}

int api_responses(conn *c, json_t *body)
{
    reqerr e;
    int picked = pick_expert(c, body, api_responses, &e);
    if (picked <= 0)
        return picked < 0 ? http_reply_err(c, &e) : 0;
    const bool remote = c->x->remote != NULL;
    genparams gp;
    server_genparams(c->srv, &gp);
    bool stream = false, json = false;
    lms_jschema *schema = NULL;
    int64_t max_out = -1;
    json_t *msgs = NULL;
    int32_t *toks = NULL, n = 0;
    bool store = true;
    const json_t *prev = NULL;
    json_t *fields = remote ? json_object() : NULL; /* the upstream's chat fields */
    int rc = previous_conv(c->srv, body, &prev, &e) < 0 ||
                     reqparse_bool(body, "store", &store, &e) < 0 || reqparse_gen(body, &gp, &e) < 0 ||
                     reqparse_bool(body, "stream", &stream, &e) < 0 ||
                     reqparse_int(body, "max_output_tokens", 1, INT32_MAX, &max_out, &e) < 0 ||
                     text_format(body, fields, &json, &schema, &e) < 0 ||
                     api_lora_pick(c, body, &gp, &e) < 0
                 ? -1
                 : 0;
    if (rc == 0 && max_out > 0)
        gp.max_tokens = (int32_t)max_out;
    json_t *tools = NULL, *forced = NULL;
    lms_jschema *call = NULL;
    if (rc == 0 && chat_tools(body, &tools, &forced, &e) < 0)
        rc = -1;
    if (rc == 0 && forced && !remote && api_forced_call(tools, forced, &call, &e) < 0)
        rc = -1;
    json_t *up_tools = rc == 0 && remote ? chatfmt_upstream_tools(tools, forced) : NULL;
    if (up_tools)
        json_object_update(fields, up_tools);
    json_decref(up_tools);
    json_decref(forced);
    if (call && json) {
        free(call);
        call = NULL;
        rc = reqerr_set(&e, 400, "tool_choice", "a forced tool call and a text.format other than "
                        "text cannot both hold");
    } else if (call) {
        json = true;
        free(schema);
        schema = call;
    }
    json_t *conv = NULL;
    if (rc == 0 && !(conv = input_messages(body, prev, &e)))
        rc = -1;
    if (rc == 0 && !(msgs = with_instructions(body, conv, &e)))
        rc = -1;
    json_t *kw = NULL;
    bool open = false;
    if (rc == 0 && !remote)
        rc = chatfmt_kwargs(c->srv, body, &kw, &e);
    chat_in in = {msgs, tools, kw};
    if (rc == 0 && !remote)
        rc = chatfmt_tokens(xfmt(c->x), c->x->model, &in, &toks, &n, &open, &e);
    json_decref(kw);
    if (rc == 0 && !json && !remote)
        rc = api_think_budget(c, &gp, open, &e);
    resp_job *j = rc == 0 ? calloc(1, sizeof *j) : NULL;
    if (rc == 0 && !j)
        rc = reqerr_set(&e, 503, NULL, "out of memory");
    task *t = NULL;
    if (rc == 0) {
        j->stream = stream;
        j->store = store;
        j->conv = json_incref(conv);
        j->rs_index = j->msg_index = -1;
        /* function tools given: the reply is searched for calls (remote: its calls come apart) */
        const bool find_calls = tools != NULL && !remote;
        j->fn_names = find_calls ? toolcall_names(tools) : NULL;
        /* held to JSON: no thoughts, whatever the prompt opened */
        reply_cut_init(&j->cut, c->srv->rfmt != REASONING_NONE, open && !json, find_calls,
                       (const char *const *)j->fn_names);
        j->x = c->x;
        j->created = (int64_t)time(NULL);
        const uint64_t r = server_rand(c->srv);
        snprintf(j->id, sizeof j->id, "resp_%016llx", (unsigned long long)r);
        snprintf(j->msg_id, sizeof j->msg_id, "msg_%016llx", (unsigned long long)(r ^ 0x5bd1e995u));
        snprintf(j->rs_id, sizeof j->rs_id, "rs_%016llx", (unsigned long long)(r ^ 0x27d4eb2fu));
        j->echo = json_object();
        static const char *const same[] = {"instructions", "max_output_tokens", "temperature",
                                           "top_p", "metadata", "text", "tools", "tool_choice",
                                           "previous_response_id", NULL};
        for (int k = 0; same[k]; k++) {
            json_t *v = json_object_get(body, same[k]);
            json_object_set(j->echo, same[k], v ? v : json_null());
        }
        if (json_is_null(json_object_get(j->echo, "metadata")))
            json_object_set_new(j->echo, "metadata", json_object());
        if (json_is_null(json_object_get(j->echo, "text")))
            json_object_set_new(j->echo, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
        lms_request r2 = genparams_request(&gp, toks, n);
        r2.json = json;
        r2.schema = schema;
        if (remote) { /* upstream: the messages, with max_output_tokens as max_tokens */
            json_t *params = json_deep_copy(body);
            if (max_out > 0)
                json_object_set_new(params, "max_tokens", json_integer(max_out));
            t = chatfmt_submit_remote(c, msgs, params, fields, &gp, &resp_ops, j, &e);
            json_decref(params);
        } else {
            t = task_submit(c, &r2, &resp_ops, j, &e);
        }
        if (!t)
            resp_destroy(&(task){.state = j});
    }
    json_decref(msgs);
    free(toks);
    free(schema); /* the scheduler made its copy */
    json_decref(tools);
    json_decref(fields);
    json_decref(conv);
    genparams_deinit(&gp);
    if (!t)
        return http_reply_err(c, &e);
    if (stream && !remote) /* remote: with the first piece */
        stream_begin(c, j);
    return 0;
}
