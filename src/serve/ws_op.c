/*
 * ws_op.c - the `op` WebSocket dialect (InferenceCore clients), see
 * docs/DESIGN.md:
 *
 *   client                                    server
 *   ------                                    ------
 *                                             {"op":"hello","status":"ready","model":...}
 *   {"op":"infer","prompt":"...",
 *    "params":{"temp":0.7,"max_tokens":500}}
 *                                             {"op":"token","content":" La","prob":0.98} ...
 *                                             {"op":"end","stats":{ttft_ms,total_ms,tokens,tps}}
 *   {"op":"abort"}                            (the running generation ends: "end" with
 *                                              "finish_reason":"abort")
 *   {"op":"metrics"}                          {"op":"metrics",...} now and every second
 *   {"op":"metrics","subscribe":false}        (stops the broadcast)
 *   {"op":"ping"}                             {"op":"pong"}
 *   anything wrong                            {"op":"error","message":"..."}
 *
 * One generation at a time per connection. The prompt goes through the
 * model's own chat template as one user turn when the model ships one
 * (params.raw = true sends it as plain text), else as plain text.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/timeutil.h"
#include "serve/serve_int.h"

static double round1(double v)
{
    return isfinite(v) ? round(v * 10.0) / 10.0 : 0.0;
}

void ws_op_hello(conn *c)
{
    lms_server *s = c->srv;
    json_t *o = json_object();
    json_object_set_new(o, "op", json_string("hello"));
    bool ready = s->state == SRV_READY;
    json_object_set_new(o, "status", json_string(ready ? "ready" : "loading"));
    json_object_set_new(o, "model", ready ? xid_json(server_default_expert(s)) : json_null());
    conn_out_ws_json(c, o);
}

bool ws_check_ready(conn *c, const char *session_id)
{
    if (c->srv->state == SRV_DRAINING) {
        ws_send_error(c, session_id, "the server is shutting down");
        return false;
    }
    if (c->srv->state != SRV_READY) {
        ws_send_error(c, session_id, "the model is still loading");
        return false;
    }
    return true;
}

/* ---- events ------------------------------------------------------------------------ */

static json_t *stats_json(const lms_req_stats *st)
{
    json_t *o = json_object();
    json_object_set_new(o, "ttft_ms", json_real_safe(round1(st->ttft_ms)));
    json_object_set_new(o, "total_ms", json_real_safe(round1(st->total_ms)));
    json_object_set_new(o, "tokens", json_integer(st->n_gen));
    json_object_set_new(o, "tps", json_real_safe(round1(st->tps)));
    json_object_set_new(o, "prompt_tokens", json_integer(st->n_prompt));
    json_object_set_new(o, "cached_tokens", json_integer(st->n_cached));
    if (st->n_drafted > 0) { /* speculative decoding */
        json_object_set_new(o, "draft_tokens", json_integer(st->n_drafted));
        json_object_set_new(o, "draft_accepted", json_integer(st->n_accepted));
    }
    return o;
}

static void op_on_event(task *t, const lms_event *ev, double t_ms)
{
    conn *c = t->c;
    json_t *o = json_object();
    (void)t_ms;
    if (ev->type == LMS_EV_TOKEN) {
        if (ev->text_len == 0) {
            json_decref(o);
            return;
        }
        json_object_set_new(o, "op", json_string("token"));
        json_object_set_new(o, "content", json_string_lossy(ev->text, ev->text_len));
        if (ev->token >= 0)
            json_object_set_new(o, "prob", json_real_safe(ev->prob));
    } else if (ev->type == LMS_EV_END) {
        json_object_set_new(o, "op", json_string("end"));
        json_object_set_new(o, "stats", stats_json(&ev->stats));
        json_object_set_new(o, "finish_reason",
                            json_string(ev->stats.finish ? ev->stats.finish : "stop"));
    } else if (ev->type == LMS_EV_ERROR) {
        json_object_set_new(o, "op", json_string("error"));
        json_object_set_new(o, "message", json_string_lossy(ev->message, strlen(ev->message)));
    } else {
        json_decref(o);
        return;
    }
    conn_out_ws_json(c, o);
}

static void op_destroy(task *t)
{
    (void)t;
}

static const task_ops op_ops = {op_on_event, op_destroy};

/* ---- requests ------------------------------------------------------------------------- */

static int prompt_tokens(conn *c, const char *prompt, const char *system, bool raw,
                         int32_t **toks, int32_t *n, reqerr *e)
{
    const lms_expert *x = c->x;
    if (raw || !xfmt(x)->model_has_own)
        return chatfmt_text_tokens(x->model, prompt, strlen(prompt), true, toks, n, e);
    json_t *msgs = json_array();
    if (system)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
    json_t *kw;
    int rc = chatfmt_kwargs(c->srv, NULL, &kw, e);
    chat_in in = {msgs, NULL, kw};
    if (rc == 0)
        rc = chatfmt_tokens(xfmt(x), x->model, &in, toks, n, NULL, e);
    json_decref(msgs);
    json_decref(kw);
    return rc;
}

static int parse_infer(const json_t *msg, genparams *gp, const char **prompt,
                       const char **system, bool *raw, reqerr *e)
{
    const json_t *params = NULL;
    if (reqparse_str(msg, "prompt", prompt, e) < 0 || reqparse_obj(msg, "params", &params, e) < 0)
        return -1;
    if (!*prompt)
        return reqerr_set(e, 400, "prompt", "'prompt' (a string) is required");
    if (params && (reqparse_gen(params, gp, e) < 0 || reqparse_bool(params, "raw", raw, e) < 0 ||
                   reqparse_str(params, "system", system, e) < 0))
        return -1;
    return 0;
}


static void op_infer(conn *c, json_t *msg)
{
    if (!ws_check_ready(c, NULL))
        return;
    if (c->op_task) {
        ws_send_error(c, NULL, "a generation is already running on this connection "
                      "(send {\"op\":\"abort\"} first)");
        return;
    }
    reqerr e;
    int picked = pick_expert(c, msg, ws_op_infer_again, &e);
    if (picked <= 0) {
        if (picked < 0)
            ws_send_error(c, NULL, "%s", e.msg);
        return; /* or parked: ws_op_infer_again runs once the model is loaded */
    }
    const char *prompt = NULL, *system = NULL;
    bool raw = false;
    genparams gp;
    server_genparams(c->srv, &gp);
    int32_t *toks = NULL, n = 0;
    int rc = parse_infer(msg, &gp, &prompt, &system, &raw, &e);
    if (rc == 0)
        rc = api_lora_pick(c, json_object_get(msg, "params"), &gp, &e);
    if (rc == 0 && c->x->remote) { /* forwarded: messages, or the prompt as it is when raw */
        json_t *what = json_string(prompt);
        if (!raw) {
            json_decref(what);
            what = json_array();
            if (system)
                json_array_append_new(what, json_pack("{s:s, s:s}", "role", "system", "content",
                                                      system));
            json_array_append_new(what, json_pack("{s:s, s:s}", "role", "user", "content", prompt));
        }
        c->op_task = task_submit_upstream(c, what, json_object_get(msg, "params"), &gp, &op_ops,
                                          NULL, &e);
        rc = c->op_task ? 0 : -1;
    } else if (rc == 0)
        rc = prompt_tokens(c, prompt, system, raw, &toks, &n, &e);
    if (rc == 0 && !c->op_task) {
        lms_request r = genparams_request(&gp, toks, n);
        c->op_task = task_submit(c, &r, &op_ops, NULL, &e);
        rc = c->op_task ? 0 : -1;
    }
    if (rc < 0)
        ws_send_error(c, NULL, "%s", e.msg);
    free(toks);
    genparams_deinit(&gp);
}

int ws_op_infer_again(conn *c, json_t *msg)
{
    op_infer(c, msg);
    return 0;
}

static void op_metrics(conn *c, json_t *msg)
{
    bool on = true;
    reqerr e;
    if (reqparse_bool(msg, "subscribe", &on, &e) < 0) {
        ws_send_error(c, NULL, "%s", e.msg);
        return;
    }
    c->op_subscribed = on;
    if (on)
        conn_out_ws_json(c, ws_op_metrics_msg(c->srv));
}

void ws_op_handle(conn *c, json_t *msg)
{
    const char *op = json_string_value(json_object_get(msg, "op"));
    if (!op) {
        ws_send_error(c, NULL, "'op' must be a string");
    } else if (!strcmp(op, "infer")) {
        op_infer(c, msg);
    } else if (!strcmp(op, "abort")) {
        if (c->op_task)
            task_abort(c->op_task); /* "end" follows */
    } else if (!strcmp(op, "metrics")) {
        op_metrics(c, msg);
    } else if (!strcmp(op, "ping")) {
        conn_out_ws_json(c, json_pack("{s:s}", "op", "pong"));
    } else {
        ws_send_error(c, NULL, "unknown op '%.64s' (infer, abort, metrics, ping)", op);
    }
}

/* ---- metrics broadcast ------------------------------------------------------------------ */

json_t *ws_op_metrics_msg(lms_server *s)
{
    lms_sched_stats st;
    metrics_sched_sum(s, &st);
    const char *state = s->state == SRV_LOADING ? "loading"
                        : st.n_running + st.n_queued > 0 ? "generating"
                                                         : "idle";
    json_t *inf = json_object();
    json_object_set_new(inf, "state", json_string(state));
    json_object_set_new(inf, "last_tps", json_real_safe(round1(st.last_tps)));
    json_object_set_new(inf, "last_ttft_ms", json_real_safe(round1(st.last_ttft_ms)));
    json_object_set_new(inf, "total_tokens", json_integer((json_int_t)st.gen_tokens));
    json_object_set_new(inf, "running", json_integer(st.n_running));
    json_object_set_new(inf, "queued", json_integer(st.n_queued));
    json_object_set_new(inf, "kv_blocks_used", json_integer(st.kv_blocks_used));
    json_object_set_new(inf, "kv_blocks_total", json_integer(st.kv_blocks_total));
    json_t *o = json_object();
    json_object_set_new(o, "op", json_string("metrics"));
    json_object_set_new(o, "gpu", metrics_gpu_json(s));
    json_object_set_new(o, "inference", inf);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    json_int_t ms = (json_int_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    json_object_set_new(o, "ts_ms", json_integer(ms));
    return o;
}
