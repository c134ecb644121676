/*
 * api_native.c - POST /completion, llama-server's own completion endpoint
 * (scripts and older clients call it):
 *
 *   {"prompt": "text" | [token ids and texts], "n_predict": 64,
 *    "stream": false, "temperature": ..., "stop": [...], "seed": ...,
 *    "json_schema": {...}, "lora": [...]}
 *
 * The prompt is raw text (BOS added where the vocabulary wants it; no chat
 * template), or an array mixing token ids and texts. The answer is one
 * object: content, stop, model, tokens_predicted, tokens_evaluated,
 * tokens_cached, stop_type ("eos", "word", "limit"), stopping_word (the
 * request's stop string when it had one), truncated and timings (prompt_n,
 * prompt_ms, predicted_n, predicted_ms and their per-token and per-second
 * rates). With "stream": true, server-sent events: each piece as
 * {"content", "stop": false, "tokens": [id]}, then that object with
 * "stop": true (no [DONE] line, as llama-server). Sampling fields are read
 * as by the other endpoints (reqparse_gen); "grammar" is refused (JSON
 * schemas are the structured-output form here). Local models only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "engine/jsonschema.h"
#include "model/tokenizer.h"
#include "serve/serve_int.h"

typedef struct nat_job {
    bool stream;
    sbuf text;              /* the reply (not streamed) */
    const lms_expert *x;
    const char *stop_word;  /* the request's only stop string, or NULL */
    char *stop_buf;
} nat_job;

static int sse_obj(conn *c, json_t *o)
{
    size_t n;
    char *s = json_dump_compact(o, &n);
    json_decref(o);
    if (!s)
        return -1;
    int rc = http_stream_write(c, "data: ", 6);
    rc |= http_stream_write(c, s, n);
    rc |= http_stream_write(c, "\n\n", 2);
    free(s);
    return rc;
}

static json_t *rate(double n, double ms)
{
    return json_real_safe(n > 0 && ms > 0 ? n * 1000.0 / ms : 0.0);
}

/* The closing object's counters, reasons and timings. */
static void add_final(json_t *o, const nat_job *j, const lms_req_stats *st)
{
    const char *f = st->finish ? st->finish : "stop";
    const bool limit = !strcmp(f, "length") || !strcmp(f, "deadline");
    json_object_set_new(o, "model", json_string(j->x->cfg->id));
    json_object_set_new(o, "tokens_predicted", json_integer(st->n_gen));
    json_object_set_new(o, "tokens_evaluated", json_integer(st->n_prompt));
    json_object_set_new(o, "tokens_cached", json_integer(st->n_cached));
    json_object_set_new(o, "truncated", json_false());
    json_object_set_new(o, "stop_type",
                        json_string(limit ? "limit" : st->stop_word ? "word" : "eos"));
    json_object_set_new(o, "stopping_word",
                        json_string(st->stop_word && j->stop_word ? j->stop_word : ""));
    const double p_n = st->n_prompt - st->n_cached, p_ms = st->ttft_ms - st->queue_ms;
    const double g_n = st->n_gen, g_ms = st->total_ms - st->ttft_ms;
    json_t *t = json_object();
    json_object_set_new(t, "prompt_n", json_integer((json_int_t)p_n));
    json_object_set_new(t, "prompt_ms", json_real_safe(p_ms));
    json_object_set_new(t, "prompt_per_token_ms", json_real_safe(p_n > 0 ? p_ms / p_n : 0.0));
    json_object_set_new(t, "prompt_per_second", rate(p_n, p_ms));
    json_object_set_new(t, "predicted_n", json_integer((json_int_t)g_n));
    json_object_set_new(t, "predicted_ms", json_real_safe(g_ms));
    json_object_set_new(t, "predicted_per_token_ms", json_real_safe(g_n > 0 ? g_ms / g_n : 0.0));
    json_object_set_new(t, "predicted_per_second", rate(g_n, g_ms));
    json_object_set_new(o, "timings", t);
}

static json_t *piece_obj(const char *text, size_t n, bool stop)
{
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(0));
    json_object_set_new(o, "content", json_stringn(text, n));
    json_object_set_new(o, "id_slot", json_integer(-1));
    json_object_set_new(o, "stop", json_boolean(stop));
    return o;
}

static void nat_on_event(task *t, const lms_event *ev, double t_ms)
{
    nat_job *j = t->state;
    conn *c = t->c;
    (void)t_ms;
    if (ev->type == LMS_EV_TOKEN) {
        if (!j->stream) {
            sbuf_add(&j->text, ev->text, ev->text_len);
        } else if (ev->text_len > 0) {
            json_t *o = piece_obj(ev->text, ev->text_len, false);
            json_object_set_new(o, "tokens", json_pack("[i]", (json_int_t)ev->token));
            sse_obj(c, o);
        }
        return;
    }
    if (ev->type != LMS_EV_END && ev->type != LMS_EV_ERROR)
        return;
    const char *f = ev->stats.finish;
    const bool failed = ev->type == LMS_EV_ERROR || (f && !strcmp(f, "abort"));
    const char *why = ev->type == LMS_EV_ERROR ? ev->message : "the generation was aborted";
    reqerr e;
    if (failed)
        reqerr_set(&e, ev->type == LMS_EV_ERROR ? task_error_status(t, ev) : 503, NULL, "%s", why);
    if (j->stream) {
        json_t *o = failed ? reqerr_json(&e) : piece_obj("", 0, true);
        if (!failed)
            add_final(o, j, &ev->stats);
        sse_obj(c, o);
        http_stream_end(c);
    } else if (failed) {
        http_reply_err(c, &e);
    } else {
        json_t *o = piece_obj(j->text.p ? j->text.p : "", j->text.n, true);
        add_final(o, j, &ev->stats);
        http_reply_json(c, 200, o);
    }
}

static void nat_destroy(task *t)
{
    nat_job *j = t->state;
    sbuf_free(&j->text);
    free(j->stop_buf);
    free(j);
}

static const task_ops nat_ops = {nat_on_event, nat_destroy};

/* "prompt": a text, or an array of token ids and texts, in that order. */
static int prompt_ids(const lms_model *m, const json_t *p, int32_t **out, int32_t *n_out,
                      reqerr *e)
{
    if (json_is_string(p))
        return chatfmt_text_tokens(m, json_string_value(p), json_string_length(p), true, out,
                                   n_out, e);
    if (!json_is_array(p) || json_array_size(p) == 0)
        return reqerr_set(e, 400, "prompt",
                          "'prompt' must be a string or a non-empty array of token ids and texts");
    const int32_t n_vocab = lms_tokenizer_n_vocab(m->tok);
    int32_t *ids = NULL, n = 0, cap = 0;
    size_t i;
    const json_t *v;
    json_array_foreach(p, i, v)
    {
        int32_t *part = NULL, k = 0;
        int32_t one;
        if (json_is_integer(v)) {
            json_int_t id = json_integer_value(v);
            if (id < 0 || id >= n_vocab) {
                free(ids);
                return reqerr_set(e, 400, "prompt", "prompt[%zu] = %lld is not in the vocabulary "
                                  "(0..%d)", i, (long long)id, n_vocab - 1);
            }
            one = (int32_t)id;
            part = &one;
            k = 1;
        } else if (json_is_string(v)) {
            /* BOS only before a leading text, as one string prompt would get */
            if (chatfmt_text_tokens(m, json_string_value(v), json_string_length(v), i == 0, &part,
                                    &k, e) < 0) {
                free(ids);
                return -1;
            }
        } else {
            free(ids);
            return reqerr_set(e, 400, "prompt", "prompt[%zu] must be a token id or a text", i);
        }
        if (n + k > cap) {
            int32_t nc = (n + k) * 2;
            int32_t *g = realloc(ids, (size_t)nc * sizeof *g);
            if (!g) {
                if (part != &one)
                    free(part);
                free(ids);
                return reqerr_set(e, 503, NULL, "out of memory");
            }
            ids = g, cap = nc;
        }
        memcpy(ids + n, part, (size_t)k * sizeof *ids);
        n += k;
        if (part != &one)
            free(part);
    }
    *out = ids;
    *n_out = n;
    return 0;
}

int api_native_completion(conn *c, json_t *body)
{
    reqerr e;
    int picked = pick_expert(c, body, api_native_completion, &e);
    if (picked <= 0)
        return picked < 0 ? http_reply_err(c, &e) : 0;
    int rc = 0;
    bool stream = false;
    genparams gp;
    genparams_init(&gp, server_rand(c->srv));
    const json_t *schema_j = json_object_get(body, "json_schema");
    lms_jschema *schema = NULL;
    int32_t *toks = NULL, n = 0;
    if (reqparse_bool(body, "stream", &stream, &e) < 0 || reqparse_gen(body, &gp, &e) < 0 ||
        api_lora_pick(c, body, &gp, &e) < 0)
        rc = -1;
    if (rc == 0 && json_object_get(body, "grammar") &&
        !json_is_null(json_object_get(body, "grammar")))
        rc = reqerr_set(&e, 400, "grammar", "GBNF grammars are not supported: give the output's "
                        "shape as 'json_schema'");
    if (rc == 0 && schema_j && !json_is_null(schema_j) &&
        !(schema = api_compile_schema(schema_j, "json_schema", &e)))
        rc = -1;
    if (rc == 0) {
        const json_t *p = json_object_get(body, "prompt");
        if (!p || json_is_null(p))
            rc = reqerr_set(&e, 400, "prompt", "'prompt' is required");
        else
            rc = prompt_ids(c->x->model, p, &toks, &n, &e);
    }
    nat_job *j = rc == 0 ? calloc(1, sizeof *j) : NULL;
    if (rc == 0 && !j)
        rc = reqerr_set(&e, 503, NULL, "out of memory");
    task *t = NULL;
    if (rc == 0) {
        j->stream = stream;
        j->x = c->x;
        if (gp.n_stop == 1 && (j->stop_buf = strdup(gp.stop[0])))
            j->stop_word = j->stop_buf;
        lms_request r = genparams_request(&gp, toks, n);
        r.schema = schema;
        t = task_submit(c, &r, &nat_ops, j, &e);
        if (!t)
            nat_destroy(&(task){.state = j});
    }
    free(toks);
    free(schema); /* the scheduler made its copy */
    genparams_deinit(&gp);
    if (!t)
        return http_reply_err(c, &e);
    if (stream) {
        http_stream_begin(c, 200, "text/event-stream");
    }
    return 0;
}
