/*
 * api_props.c - two llama-server utility endpoints that its web UI and
 * clients read:
 *
 *   GET  /props           the default model's settings: context per
 *                         sequence, slots (parallel sequences), sampling
 *                         defaults, chat template, BOS/EOS text, model path
 *   GET  /slots           the model's parallel sequences: id, n_ctx,
 *                         is_processing and id_task, n_prompt_tokens and
 *                         next_token [{has_next_token, n_decoded, n_remain}],
 *                         filled by its client requests in flight oldest
 *                         first (those past n_parallel wait in the queue);
 *                         [] while not loaded
 *   POST /apply-template  {"messages": [...], "tools": [...]?,
 *                         "add_generation_prompt": true?, "model": id?}
 *                         -> {"prompt": the rendered text}, no generation
 *
 * /props and /slots take ?model=ID (else the default model) and never load
 * a model: one not loaded yet says so ("loaded": false) with what the
 * configuration knows. /apply-template loads the model it
 * names (or the default) like a chat request.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sched.h"
#include "model/tokenizer.h"
#include "serve/serve_int.h"

/* A float setting as its shortest decimal (0.8, not 0.800000012). */
static json_t *num(float v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", (double)v);
    return json_real_safe(strtod(buf, NULL));
}

static json_t *sampling_json(void)
{
    const lms_sampler_params d = lms_sampler_defaults();
    const struct {
        const char *key;
        float v; /* integers are exact in a float */
        bool integer;
    } f[] = {
        {"temperature", d.temperature, false},
        {"top_k", (float)d.top_k, true},
        {"top_p", d.top_p, false},
        {"min_p", d.min_p, false},
        {"typical_p", d.typical_p, false},
        {"mirostat", (float)d.mirostat, true},
        {"mirostat_tau", d.mirostat_tau, false},
        {"mirostat_eta", d.mirostat_eta, false},
        {"repeat_penalty", d.repeat_penalty, false},
        {"repeat_last_n", (float)d.penalty_last_n, true},
        {"presence_penalty", d.presence_penalty, false},
        {"frequency_penalty", d.frequency_penalty, false},
        {"n_predict", -1.0f, true}, /* until the context is full */
    };
    json_t *p = json_object();
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        json_object_set_new(p, f[i].key,
                            f[i].integer ? json_integer((json_int_t)f[i].v) : num(f[i].v));
    return p;
}

static json_t *token_text(const lms_model *m, int32_t id)
{
    const char *t = id >= 0 ? lms_token_text(m->tok, id) : NULL;
    return t ? json_string_lossy(t, strlen(t)) : json_null();
}

/* The expert of a GET: ?model=ID, else the default; NULL with the reply
 * sent (*rc) when there is none. */
static lms_expert *get_expert(conn *c, int *rc)
{
    lms_server *s = c->srv;
    reqerr e;
    char buf[LMS_EXPERT_ID_MAX + 16];
    const char *id = lws_get_urlarg_by_name(c->wsi, "model=", buf, sizeof buf);
    lms_expert *x = id && id[0] ? lms_registry_find(s->reg, id) : server_default_expert(s);
    if (x)
        return x;
    if (id && id[0])
        pick_not_found(s, id, &e);
    else
        reqerr_set(&e, 503, NULL, "no model is configured");
    *rc = http_reply_err(c, &e);
    return NULL;
}

int api_props(conn *c)
{
    int rc = 0;
    lms_expert *x = get_expert(c, &rc);
    if (!x)
        return rc;
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(x->cfg->id));
    if (x->cfg->path)
        json_object_set_new(o, "model_path", json_string_lossy(x->cfg->path, strlen(x->cfg->path)));
    json_object_set_new(o, "build_info", json_string("lmserv 0.1.0"));
    json_object_set_new(o, "modalities", json_pack("{s:b,s:b}", "vision", 0, "audio", 0));
    const bool ready = x->state == LMS_EXPERT_READY && x->model && x->sched;
    json_object_set_new(o, "loaded", json_boolean(ready));
    json_t *gen = json_object();
    json_object_set_new(gen, "params", sampling_json());
    if (ready) {
        const lms_sched_params *sp = lms_sched_params_of(x->sched);
        const lms_model *m = x->model;
        json_object_set_new(gen, "n_ctx", json_integer(sp->n_ctx));
        json_object_set_new(o, "total_slots", json_integer(sp->n_parallel));
        json_object_set_new(o, "n_ctx_train", json_integer(m->hp.n_ctx_train));
        json_object_set_new(o, "bos_token", token_text(m, lms_tokenizer_bos(m->tok)));
        json_object_set_new(o, "eos_token", token_text(m, lms_tokenizer_eos(m->tok)));
        const char *tpl = xfmt(x)->src ? xfmt(x)->src : chatfmt_source(m);
        json_object_set_new(o, "chat_template", tpl ? json_string_lossy(tpl, strlen(tpl))
                                                    : json_null());
    }
    json_object_set_new(o, "default_generation_settings", gen);
    return http_reply_json(c, 200, o);
}

static int cmp_task(const void *a, const void *b)
{
    const task *x = *(task *const *)a, *y = *(task *const *)b;
    return x->id < y->id ? -1 : x->id > y->id;
}

int api_slots(conn *c)
{
    lms_server *s = c->srv;
    int rc = 0;
    lms_expert *x = get_expert(c, &rc);
    if (!x)
        return rc;
    json_t *arr = json_array();
    if (x->state != LMS_EXPERT_READY || !x->sched) /* not loaded: no slots yet */
        return http_reply_json(c, 200, arr);
    const lms_sched_params *sp = lms_sched_params_of(x->sched);
    /* the model's client requests in flight, oldest first, fill the slots */
    task **live = calloc(s->n_tasks ? s->n_tasks : 1, sizeof *live);
    size_t n = 0;
    for (size_t b = 0; live && b < s->tab_cap; b++)
        for (task *t = s->tab[b]; t && n < s->n_tasks; t = t->h_next)
            if (t->x == x && !t->internal)
                live[n++] = t;
    if (n > 1)
        qsort(live, n, sizeof *live, cmp_task);
    for (int32_t i = 0; i < sp->n_parallel; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(i));
        json_object_set_new(o, "n_ctx", json_integer(sp->n_ctx));
        json_object_set_new(o, "speculative", json_boolean(sp->spec.mode != 0));
        json_object_set_new(o, "is_processing", json_boolean((size_t)i < n));
        json_object_set_new(o, "id_task", json_integer((size_t)i < n ? (json_int_t)live[i]->id : -1));
        /* progress, as llama-server's next_token: tokens made, tokens left */
        const task *t = (size_t)i < n ? live[i] : NULL;
        const int32_t limit = !t ? 0 : t->max_tokens >= 0 ? t->max_tokens : sp->n_ctx - t->n_prompt;
        json_object_set_new(o, "n_prompt_tokens", json_integer(t ? t->n_prompt : 0));
        json_object_set_new(o, "next_token",
                            json_pack("[{s:b, s:i, s:i}]", "has_next_token", t != NULL, "n_decoded",
                                      t ? t->n_decoded : 0, "n_remain",
                                      t && limit > t->n_decoded ? limit - t->n_decoded : 0));
        json_array_append_new(arr, o);
    }
    free(live);
    return http_reply_json(c, 200, arr);
}

int api_apply_template(conn *c, json_t *body)
{
    reqerr e;
    int picked = pick_expert(c, body, api_apply_template, &e);
    if (picked <= 0)
        return picked < 0 ? http_reply_err(c, &e) : 0;
    bool add_gen = true;
    const json_t *tools = json_object_get(body, "tools");
    if (reqparse_bool(body, "add_generation_prompt", &add_gen, &e) < 0)
        return http_reply_err(c, &e);
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        reqerr_set(&e, 400, "tools", "'tools' must be an array");
        return http_reply_err(c, &e);
    }
    json_t *msgs = chatfmt_messages(json_object_get(body, "messages"), "messages", &e);
    if (!msgs)
        return http_reply_err(c, &e);
    char *text = NULL;
    size_t len = 0;
    json_t *kw;
    int rc = chatfmt_kwargs(c->srv, body, &kw, &e);
    chat_in in = {msgs, json_is_array(tools) ? tools : NULL, kw};
    if (rc == 0)
        rc = chatfmt_render(xfmt(c->x), &in, add_gen, &text, &len, &e);
    json_decref(msgs);
    json_decref(kw);
    if (rc < 0)
        return http_reply_err(c, &e);
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_stringn(text, len));
    free(text);
    return http_reply_json(c, 200, o);
}
