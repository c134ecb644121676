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
 * Refused, naming the field: tools, previous_response_id (no stored
 * conversations: store is always false), parts other than text.
 *
 * Reply: a response object (id resp_..., status completed, or incomplete
 * with incomplete_details.reason max_output_tokens) whose output is one
 * assistant message of one output_text, and usage (input_tokens with
 * cached_tokens, output_tokens, total_tokens). Streamed: server-sent events
 * with their type as the event name and a sequence_number:
 * response.created, response.in_progress, response.output_item.added,
 * response.content_part.added, response.output_text.delta per piece,
 * response.output_text.done, response.content_part.done,
 * response.output_item.done, then response.completed (or
 * response.incomplete); a failure mid-way sends an error event. Local
 * models only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timeutil.h"
#include "engine/jsonschema.h"
#include "serve/serve_int.h"

typedef struct resp_job {
    bool stream;
    char id[40], msg_id[40];
    int64_t created;
    int seq;                  /* the next event's sequence_number */
    sbuf text;
    const lms_expert *x;
    json_t *echo;             /* the request's fields the response repeats */
} resp_job;

/* Sends one event: "event: TYPE" and the object (steals o) with its type
 * and sequence number. */
static void send_event(conn *c, resp_job *j, const char *type, json_t *o)
{
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(j->seq++));
    char head[96];
    snprintf(head, sizeof head, "event: %s\n", type);
    http_stream_write(c, head, strlen(head));
    http_sse_json(c, o);
}

static json_t *text_part(const char *text, size_t n)
{
    return json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", json_stringn(text, n),
                     "annotations");
}

/* The output message, with its text so far (done: completed). */
static json_t *message_item(const resp_job *j, bool done, bool with_text)
{
    json_t *content = json_array();
    if (with_text)
        json_array_append_new(content, text_part(j->text.p ? j->text.p : "", j->text.n));
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", j->msg_id, "type", "message", "status",
                     done ? "completed" : "in_progress", "role", "assistant", "content", content);
}

/* The response object; st NULL: still in progress (no output, no usage). */
static json_t *response_obj(const resp_job *j, const lms_req_stats *st)
{
    json_t *o = json_deep_copy(j->echo);
    const char *f = st && st->finish ? st->finish : "stop";
    const bool cut = st && (!strcmp(f, "length") || !strcmp(f, "deadline"));
    json_object_set_new(o, "id", json_string(j->id));
    json_object_set_new(o, "object", json_string("response"));
    json_object_set_new(o, "created_at", json_integer(j->created));
    json_object_set_new(o, "status", json_string(!st ? "in_progress" : cut ? "incomplete" : "completed"));
    json_object_set_new(o, "model", xid_json(j->x));
    json_object_set_new(o, "output", st ? json_pack("[o]", message_item(j, true, true)) : json_array());
    json_object_set_new(o, "error", json_null());
    json_object_set_new(o, "incomplete_details",
                        cut ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null());
    json_object_set_new(o, "store", json_false());
    json_object_set_new(o, "previous_response_id", json_null());
    json_object_set_new(o, "tools", json_array());
    json_object_set_new(o, "tool_choice", json_string("auto"));
    json_object_set_new(o, "parallel_tool_calls", json_false());
    if (st)
        json_object_set_new(
            o, "usage",
            json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", (json_int_t)st->n_prompt,
                      "input_tokens_details", "cached_tokens", (json_int_t)st->n_cached,
                      "output_tokens", (json_int_t)st->n_gen, "output_tokens_details",
                      "reasoning_tokens", 0, "total_tokens", (json_int_t)(st->n_prompt + st->n_gen)));
    else
        json_object_set_new(o, "usage", json_null());
    return o;
}

/* The events before the first piece. */
static void stream_begin(conn *c, resp_job *j)
{
    http_stream_begin(c, 200, "text/event-stream");
    send_event(c, j, "response.created", json_pack("{s:o}", "response", response_obj(j, NULL)));
    send_event(c, j, "response.in_progress", json_pack("{s:o}", "response", response_obj(j, NULL)));
    send_event(c, j, "response.output_item.added",
               json_pack("{s:i, s:o}", "output_index", 0, "item", message_item(j, false, false)));
    send_event(c, j, "response.content_part.added",
               json_pack("{s:s, s:i, s:i, s:o}", "item_id", j->msg_id, "output_index", 0,
                         "content_index", 0, "part", text_part("", 0)));
}

static void resp_on_event(task *t, const lms_event *ev, double t_ms)
{
    resp_job *j = t->state;
    conn *c = t->c;
    (void)t_ms;
    if (ev->type == LMS_EV_TOKEN) {
        sbuf_add(&j->text, ev->text, ev->text_len);
        if (j->stream && ev->text_len > 0)
            send_event(c, j, "response.output_text.delta",
                       json_pack("{s:s, s:i, s:i, s:o}", "item_id", j->msg_id, "output_index", 0,
                                 "content_index", 0, "delta", json_stringn(ev->text, ev->text_len)));
        return;
    }
    if (ev->type != LMS_EV_END && ev->type != LMS_EV_ERROR)
        return;
    const char *f = ev->stats.finish;
    const bool failed = ev->type == LMS_EV_ERROR || (f && !strcmp(f, "abort"));
    reqerr e;
    if (failed)
        reqerr_set(&e, ev->type == LMS_EV_ERROR ? task_error_status(t, ev) : 503, NULL, "%s",
                   ev->type == LMS_EV_ERROR ? ev->message : "the generation was aborted");
    if (!j->stream) {
        if (failed)
            http_reply_err(c, &e);
        else
            http_reply_json(c, 200, response_obj(j, &ev->stats));
        return;
    }
    if (failed) {
        send_event(c, j, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", e.msg));
        http_stream_end(c);
        return;
    }
    const char *text = j->text.p ? j->text.p : "";
    send_event(c, j, "response.output_text.done",
               json_pack("{s:s, s:i, s:i, s:o}", "item_id", j->msg_id, "output_index", 0,
                         "content_index", 0, "text", json_stringn(text, j->text.n)));
    send_event(c, j, "response.content_part.done",
               json_pack("{s:s, s:i, s:i, s:o}", "item_id", j->msg_id, "output_index", 0,
                         "content_index", 0, "part", text_part(text, j->text.n)));
    send_event(c, j, "response.output_item.done",
               json_pack("{s:i, s:o}", "output_index", 0, "item", message_item(j, true, true)));
    json_t *r = response_obj(j, &ev->stats);
    const bool cut = !strcmp(json_string_value(json_object_get(r, "status")), "incomplete");
    send_event(c, j, cut ? "response.incomplete" : "response.completed", json_pack("{s:o}", "response", r));
    http_stream_end(c);
}

static void resp_destroy(task *t)
{
    resp_job *j = t->state;
    sbuf_free(&j->text);
    json_decref(j->echo);
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

/* instructions and input as chat messages; NULL with e. */
static json_t *input_messages(const json_t *body, reqerr *e)
{
    const json_t *ins = json_object_get(body, "instructions"), *in = json_object_get(body, "input");
    if (ins && !json_is_null(ins) && !json_is_string(ins)) {
        reqerr_set(e, 400, "instructions", "'instructions' must be a string");
        return NULL;
    }
    json_t *msgs = json_array();
    if (json_is_string(ins) && json_string_length(ins) > 0)
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
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
    json_array_foreach(in, k, item)
    {
        const char *type = json_string_value(json_object_get(item, "type"));
        const char *role = json_string_value(json_object_get(item, "role"));
        if ((type && strcmp(type, "message")) || !role ||
            (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
             strcmp(role, "developer"))) {
            json_decref(msgs);
            reqerr_set(e, 400, "input", "input[%zu] must be a message with role user, assistant, "
                       "system or developer (%s items are not supported)", k,
                       type ? type : "role-less");
            return NULL;
        }
        json_t *content = content_parts(json_object_get(item, "content"), k, e);
        if (!content) {
            json_decref(msgs);
            return NULL;
        }
        json_array_append_new(msgs, json_pack("{s:s, s:o}", "role",
                                              strcmp(role, "developer") ? role : "system",
                                              "content", content));
    }
    json_t *norm = chatfmt_messages(msgs, "input", e);
    json_decref(msgs);
    return norm;
}

/* text.format: JSON mode and its schema, as response_format gives them. */
static int text_format(const json_t *body, bool *json, lms_jschema **schema, reqerr *e)
{
    const json_t *fmt = json_object_get(json_object_get(body, "text"), "format");
    const char *type = json_string_value(json_object_get(fmt, "type"));
    if (!fmt || json_is_null(fmt) || (type && !strcmp(type, "text")))
        return 0;
    if (type && !strcmp(type, "json_object")) {
        *json = true;
        return 0;
    }
    if (type && !strcmp(type, "json_schema")) {
        *json = true;
        return (*schema = api_compile_schema(json_object_get(fmt, "schema"), "text.format", e))
                   ? 0
                   : -1;
    }
    return reqerr_set(e, 400, "text.format", "text.format type '%.40s' is not supported (text, "
                      "json_object, json_schema)", type ? type : "?");
}

static int refuse_fields(const json_t *body, reqerr *e)
{
    const json_t *tools = json_object_get(body, "tools");
    if (json_array_size(tools) > 0)
        return reqerr_set(e, 400, "tools", "tools are not supported by /v1/responses here: use "
                          "/v1/chat/completions");
    const json_t *prev = json_object_get(body, "previous_response_id");
    if (prev && !json_is_null(prev))
        return reqerr_set(e, 400, "previous_response_id", "responses are not stored: send the "
                          "conversation in 'input'");
    return 0;
}

int api_responses(conn *c, json_t *body)
{
    reqerr e;
    int picked = pick_expert(c, body, api_responses, &e);
    if (picked <= 0)
        return picked < 0 ? http_reply_err(c, &e) : 0;
    if (c->x->remote) {
        reqerr_set(&e, 400, "model", "/v1/responses is for local models; '%s' is a remote expert",
                   c->x->cfg->id);
        return http_reply_err(c, &e);
    }
    genparams gp;
    genparams_init(&gp, server_rand(c->srv));
    bool stream = false, json = false;
    lms_jschema *schema = NULL;
    int64_t max_out = -1;
    json_t *msgs = NULL;
    int32_t *toks = NULL, n = 0;
    int rc = refuse_fields(body, &e) < 0 || reqparse_gen(body, &gp, &e) < 0 ||
                     reqparse_bool(body, "stream", &stream, &e) < 0 ||
                     reqparse_int(body, "max_output_tokens", 1, INT32_MAX, &max_out, &e) < 0 ||
                     text_format(body, &json, &schema, &e) < 0 || api_lora_pick(c, body, &gp, &e) < 0
                 ? -1
                 : 0;
    if (rc == 0 && max_out > 0)
        gp.max_tokens = (int32_t)max_out;
    if (rc == 0 && !(msgs = input_messages(body, &e)))
        rc = -1;
    if (rc == 0)
        rc = chatfmt_tokens(xfmt(c->x), c->x->model, msgs, NULL, &toks, &n, &e);
    json_decref(msgs);
    resp_job *j = rc == 0 ? calloc(1, sizeof *j) : NULL;
    if (rc == 0 && !j)
        rc = reqerr_set(&e, 503, NULL, "out of memory");
    task *t = NULL;
    if (rc == 0) {
        j->stream = stream;
        j->x = c->x;
        j->created = (int64_t)time(NULL);
        const uint64_t r = server_rand(c->srv);
        snprintf(j->id, sizeof j->id, "resp_%016llx", (unsigned long long)r);
        snprintf(j->msg_id, sizeof j->msg_id, "msg_%016llx", (unsigned long long)(r ^ 0x5bd1e995u));
        j->echo = json_object();
        static const char *const same[] = {"instructions", "max_output_tokens", "temperature",
                                           "top_p", "metadata", "text", NULL};
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
        t = task_submit(c, &r2, &resp_ops, j, &e);
        if (!t)
            resp_destroy(&(task){.state = j});
    }
    free(toks);
    free(schema); /* the scheduler made its copy */
    genparams_deinit(&gp);
    if (!t)
        return http_reply_err(c, &e);
    if (stream)
        stream_begin(c, j);
    return 0;
}
