/*
 * ws_type.c - the `type` WebSocket dialect (inference-worker clients), see
 * docs/DESIGN.md:
 *
 *   client                                       server
 *   ------                                       ------
 *   {"type":"generate","messages":[...],
 *    "session_id":"s1","system_prompt":"...",
 *    "max_tokens":512,"temperature":0.7,
 *    "top_k":50,"top_p":0.9}
 *                                                {"type":"token","content":"..",
 *                                                 "session_id":"s1"} ...
 *                                                {"type":"done","content":"<full text>",
 *                                                 "session_id":"s1","finish_reason":"stop",
 *                                                 "stats":{...}}
 *   {"type":"abort","session_id":"s1"}           (the generation ends: "done" with
 *                                                 the text so far, "finish_reason":"abort")
 *   {"type":"ping"}                              {"type":"pong"}
 *   {"type":"load_adapter","adapter_path":"x.gguf",
 *    "scale":1,"model":...}                      {"type":"adapter_loaded",...} once
 *                                                 read (other messages are handled
 *                                                 meanwhile): the connection's
 *                                                 generations use it from then on
 *   {"type":"load_adapter","adapter_path":null}
 *   or {"type":"unload_adapter"}                 {"type":"adapter_unloaded"}
 *   anything wrong                               {"type":"error","message":..,"session_id":..}
 *
 * A connection runs one generation at a time per session_id (a missing
 * session_id is the session "default"), and at most MAX_SESSIONS at once.
 * abort without a session_id stops all of the connection's generations.
 * Adapters come from the server's --lora-dir folder (api_lora.c); a
 * generate with its own "lora" list uses that instead.
 *
 * Thinking models: a generate with "reasoning_format":"deepseek" (or
 * "auto") gets the thoughts apart (serve/reply.h): {"type":"reasoning",
 * "content":..} messages for them, "token" messages for the answer alone,
 * and "done" with the answer as "content" and the thoughts as
 * "reasoning_content". Without it ("none", the default) replies stream as
 * written, as the dialect always did.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "serve/reply.h"
#include "serve/serve_int.h"

#define MAX_SESSIONS 16

typedef struct type_job {
    char *sid;
    sbuf text;   /* everything streamed, for "done" */
    bool split;  /* thoughts apart ("reasoning_format") */
    reply_cut cut;
} type_job;

static json_t *msg_new(const char *type, const type_job *j)
{
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "session_id", json_string_lossy(j->sid, strlen(j->sid)));
    return o;
}

static json_t *stats_json(const lms_req_stats *st)
{
    json_t *o = json_object();
    json_object_set_new(o, "ttft_ms", json_real_safe(round(st->ttft_ms * 10) / 10));
    json_object_set_new(o, "total_ms", json_real_safe(round(st->total_ms * 10) / 10));
    json_object_set_new(o, "tokens", json_integer(st->n_gen));
    json_object_set_new(o, "tps", json_real_safe(round(st->tps * 10) / 10));
    json_object_set_new(o, "prompt_tokens", json_integer(st->n_prompt));
    return o;
}

/* A "reasoning" or "token" message with text[from, from + n), if any. */
static void send_part(task *t, const char *type, const char *text, size_t from, size_t n)
{
    if (n == 0)
        return;
    json_t *o = msg_new(type, t->state);
    json_object_set_new(o, "content", json_string_lossy(text + from, n));
    conn_out_ws_json(t->c, o);
}

/* Split replies: the parts of the text so far that are now certain (end:
 * all of them). */
static void send_parts(task *t, bool end)
{
    type_job *j = t->state;
    const char *text = j->text.p ? j->text.p : "";
    reply_part p;
    toolcalls tc = {0};
    reply_cut_next(&j->cut, text, j->text.n, &p, end ? &tc : NULL);
    toolcalls_free(&tc);
    send_part(t, "reasoning", text, p.r_from, p.r_n);
    send_part(t, "token", text, p.c_from, p.c_n);
}

static void type_on_event(task *t, const lms_event *ev, double t_ms)
{
    type_job *j = t->state;
    json_t *o;
    (void)t_ms;
    if (ev->type == LMS_EV_TOKEN) {
        if (ev->text_len == 0)
            return;
        sbuf_add(&j->text, ev->text, ev->text_len);
        if (j->split) {
            send_parts(t, false);
            return;
        }
        o = msg_new("token", j);
        json_object_set_new(o, "content", json_string_lossy(ev->text, ev->text_len));
    } else if (ev->type == LMS_EV_END) {
        const char *text = j->text.p ? j->text.p : "";
        reply_part w = {0, 0, 0, j->text.n};
        if (j->split) {
            send_parts(t, true);
            reply_cut_whole(&j->cut, j->text.n, &w);
        }
        o = msg_new("done", j);
        json_object_set_new(o, "content", json_string_lossy(text + w.c_from, w.c_n));
        if (w.r_n)
            json_object_set_new(o, "reasoning_content", json_string_lossy(text + w.r_from, w.r_n));
        json_object_set_new(o, "finish_reason",
                            json_string(ev->stats.finish ? ev->stats.finish : "stop"));
        json_object_set_new(o, "stats", stats_json(&ev->stats));
    } else if (ev->type == LMS_EV_ERROR) {
        o = msg_new("error", j);
        json_object_set_new(o, "message", json_string_lossy(ev->message, strlen(ev->message)));
    } else {
        return;
    }
    conn_out_ws_json(t->c, o);
}

static void type_destroy(task *t)
{
    type_job *j = t->state;
    free(j->sid);
    sbuf_free(&j->text);
    free(j);
}

static const task_ops type_ops = {type_on_event, type_destroy};

/* ---- sessions -------------------------------------------------------------------------- */

static task *session_task(conn *c, const char *sid, int *n_sessions)
{
    task *found = NULL;
    *n_sessions = 0;
    for (task *t = c->tasks; t; t = t->c_next) {
        if (t->ops != &type_ops)
            continue;
        (*n_sessions)++;
        if (!strcmp(((type_job *)t->state)->sid, sid))
            found = t;
    }
    return found;
}

/* messages (or a lone `prompt`), with system_prompt in front unless the
 * conversation already starts with a system turn. */
static json_t *conversation(const json_t *msg, reqerr *e)
{
    const char *system = NULL, *prompt = NULL;
    if (reqparse_str(msg, "system_prompt", &system, e) < 0 ||
        reqparse_str(msg, "prompt", &prompt, e) < 0)
        return NULL;
    json_t *msgs;
    if (!json_object_get(msg, "messages") && prompt) {
        msgs = json_array();
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
    } else {
        msgs = chatfmt_messages(json_object_get(msg, "messages"), "messages", e);
        if (!msgs)
            return NULL;
    }
    const char *first = json_string_value(json_object_get(json_array_get(msgs, 0), "role"));
    if (system && !(first && !strcmp(first, "system")))
        json_array_insert_new(msgs, 0,
                              json_pack("{s:s, s:s}", "role", "system", "content", system));
    return msgs;
}

static int start(conn *c, const json_t *msg, const char *sid, reqerr *e)
{
    lms_server *s = c->srv;
    genparams gp;
    server_genparams(s, &gp);
    int32_t *toks = NULL, n = 0;
    json_t *msgs = NULL;
    type_job *j = NULL;
    const char *rfs = NULL;
    bool open = false;
    int rc = reqparse_gen(msg, &gp, e);
    if (rc == 0 && reqparse_str(msg, "reasoning_format", &rfs, e) < 0)
        rc = -1;
    const int rf = rfs ? reasoning_format_parse(rfs) : REASONING_NONE;
    if (rc == 0 && (rf < 0 || rf == REASONING_LEGACY))
        rc = reqerr_set(e, 400, "reasoning_format",
                        "'reasoning_format' must be \"none\", \"auto\" or \"deepseek\"");
    /* the session's adapter (load_adapter) unless the message lists its own */
    if (rc == 0 && c->lora && !json_object_get(msg, "lora")) {
        if (c->lora_x != c->x)
            rc = reqerr_set(e, 400, "model", "this session's adapter belongs to model '%.128s': "
                            "name it in 'model', or unload the adapter", c->lora_x->cfg->id);
        else if (c->lora_scale != 0.0f)
            gp.loras[gp.n_loras++] = (lms_lora_use){c->lora, c->lora_scale};
    } else if (rc == 0) {
        rc = api_lora_pick(c, msg, &gp, e);
    }
    if (rc == 0 && !(msgs = conversation(msg, e)))
        rc = -1;
    if (rc == 0 && !c->x->remote) {
        json_t *kw;
        rc = chatfmt_kwargs(c->srv, msg, &kw, e);
        chat_in in = {msgs, NULL, kw};
        if (rc == 0)
            rc = chatfmt_tokens(xfmt(c->x), c->x->model, &in, &toks, &n, &open, e);
        json_decref(kw);
    }
    if (rc == 0 && (!(j = calloc(1, sizeof *j)) || !(j->sid = strdup(sid))))
        rc = reqerr_set(e, 503, NULL, "out of memory");
    if (rc == 0) {
        j->split = rf == REASONING_DEEPSEEK;
        reply_cut_init(&j->cut, j->split, open, false, NULL);
    }
    if (rc == 0 && c->x->remote) { /* forwarded as chat messages */
        rc = task_submit_upstream(c, msgs, msg, &gp, &type_ops, j, e) ? 0 : -1;
        msgs = NULL; /* taken */
    } else if (rc == 0) {
        lms_request r = genparams_request(&gp, toks, n);
        rc = task_submit(c, &r, &type_ops, j, e) ? 0 : -1;
    }
    if (rc < 0 && j) {
        free(j->sid);
        free(j);
    }
    json_decref(msgs);
    free(toks);
    genparams_deinit(&gp);
    return rc;
}


static void generate(conn *c, const json_t *msg, const char *sid)
{
    if (!ws_check_ready(c, sid))
        return;
    int n_sessions;
    if (session_task(c, sid, &n_sessions)) {
        ws_send_error(c, sid, "session '%.64s' already has a generation running "
                      "(send {\"type\":\"abort\"} first)", sid);
        return;
    }
    if (n_sessions >= MAX_SESSIONS) {
        ws_send_error(c, sid, "at most %d generations at once per connection", MAX_SESSIONS);
        return;
    }
    reqerr e;
    int picked = pick_expert(c, (json_t *)msg, ws_type_again, &e);
    if (picked > 0 && start(c, msg, sid, &e) < 0)
        picked = -1;
    if (picked < 0)
        ws_send_error(c, sid, "%s", e.msg);
}

/* A generate parked while its model loaded, handled again. */
int ws_type_again(conn *c, json_t *msg)
{
    ws_type_handle(c, msg);
    return 0;
}

static int adapter_again(conn *c, json_t *msg);
static void adapter_loaded(conn *c, json_t *msg, lms_lora *l, const reqerr *e);

/* load_adapter: the connection's adapter for its generations (one at a
 * time, loaded from the server's adapter folder for the message's model);
 * adapter_path null (or unload_adapter) drops it. */
static void adapter(conn *c, json_t *msg, const char *sid, bool unload)
{
    const json_t *p = json_object_get(msg, "adapter_path");
    if (unload || !p || json_is_null(p)) {
        lms_lora_release(c->lora); /* a running generation keeps its own reference */
        c->lora = NULL;
        c->lora_x = NULL;
        json_t *o = json_pack("{s:s}", "type", "adapter_unloaded");
        if (sid)
            json_object_set_new(o, "session_id", json_string(sid));
        conn_out_ws_json(c, o);
        return;
    }
    if (!json_is_string(p)) {
        ws_send_error(c, sid, "'adapter_path' must be a string (or null to unload)");
        return;
    }
    const json_t *sc = json_object_get(msg, "scale");
    if (sc && (!json_is_number(sc) || !(fabs(json_number_value(sc)) <= 100.0))) {
        ws_send_error(c, sid, "'scale' must be a number in [-100, 100]");
        return;
    }
    reqerr e;
    int picked = pick_expert(c, msg, adapter_again, &e);
    if (picked > 0 && api_lora_begin(c, json_string_value(p), msg, adapter_loaded, &e) < 0)
        picked = -1;
    if (picked < 0)
        ws_send_error(c, sid, "%s", e.msg);
}

/* load_adapter's file is read (api_lora_begin): the connection's adapter
 * from now on. */
static void adapter_loaded(conn *c, json_t *msg, lms_lora *l, const reqerr *e)
{
    const char *sid = json_string_value(json_object_get(msg, "session_id"));
    if (!l) {
        ws_send_error(c, sid, "%s", e->msg);
        return;
    }
    const json_t *sc = json_object_get(msg, "scale");
    lms_lora_release(c->lora);
    c->lora = l;
    c->lora_x = c->x;
    c->lora_scale = sc ? (float)json_number_value(sc) : 1.0f;
    json_t *o = json_pack("{s:s, s:O, s:s, s:s, s:f}", "type", "adapter_loaded", "adapter_path",
                          json_object_get(msg, "adapter_path"), "name", lms_lora_name(l), "model",
                          c->x->cfg->id, "scale", (double)c->lora_scale);
    if (sid)
        json_object_set_new(o, "session_id", json_string(sid));
    conn_out_ws_json(c, o);
}

/* A load_adapter parked while its model loaded, handled again. */
static int adapter_again(conn *c, json_t *msg)
{
    ws_type_handle(c, msg);
    return 0;
}

static void abort_sessions(conn *c, const char *sid)
{
    for (task *t = c->tasks; t; t = t->c_next)
        if (t->ops == &type_ops && (!sid || !strcmp(((type_job *)t->state)->sid, sid)))
            task_abort(t); /* "done" follows */
}

static void pong(conn *c, const json_t *msg)
{
    json_t *o = json_pack("{s:s}", "type", "pong");
    static const char *const echo[] = {"id", "timestamp", "session_id"};
    for (size_t i = 0; i < sizeof echo / sizeof echo[0]; i++) {
        json_t *v = json_object_get(msg, echo[i]);
        if (v)
            json_object_set(o, echo[i], v);
    }
    conn_out_ws_json(c, o);
}

void ws_type_handle(conn *c, json_t *msg)
{
    const char *type = json_string_value(json_object_get(msg, "type"));
    const json_t *sidv = json_object_get(msg, "session_id");
    const char *sid = json_string_value(sidv);
    if (!type) {
        ws_send_error(c, sid, "'type' must be a string");
    } else if (sidv && !json_is_null(sidv) && !sid) {
        ws_send_error(c, NULL, "'session_id' must be a string");
    } else if (!strcmp(type, "generate")) {
        generate(c, msg, sid ? sid : "default");
    } else if (!strcmp(type, "abort")) {
        abort_sessions(c, sid);
    } else if (!strcmp(type, "ping")) {
        pong(c, msg);
    } else if (!strcmp(type, "load_adapter") || !strcmp(type, "unload_adapter")) {
        adapter(c, msg, sid, !strcmp(type, "unload_adapter"));
    } else {
        ws_send_error(c, sid, "unknown type '%.64s' (generate, abort, ping, load_adapter, "
                      "unload_adapter)", type);
    }
}
