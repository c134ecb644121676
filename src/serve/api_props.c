/*
 * api_props.c - two llama-server utility endpoints that its web UI and
 * clients read:
 *
 *   GET  /props           the default model's settings: context per
 *                         sequence, slots (parallel sequences), sampling
 *                         defaults, chat template, BOS/EOS text, model path
 *   POST /apply-template  {"messages": [...], "tools": [...]?,
 *                         "add_generation_prompt": true?, "model": id?}
 *                         -> {"prompt": the rendered text}, no generation
 *
 * /props never loads a model: one not loaded yet says so ("loaded": false)
 * with what the configuration knows. /apply-template loads the model it
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

int api_props(conn *c)
{
    lms_server *s = c->srv;
    reqerr e;
    lms_expert *x = server_default_expert(s);
    if (!x) {
        reqerr_set(&e, 503, NULL, "no model is configured");
        return http_reply_err(c, &e);
    }
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
        const char *tpl = chatfmt_source(m);
        json_object_set_new(o, "chat_template", tpl ? json_string_lossy(tpl, strlen(tpl))
                                                    : json_null());
    }
    json_object_set_new(o, "default_generation_settings", gen);
    return http_reply_json(c, 200, o);
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
    int rc = chatfmt_render(xfmt(c->x), msgs, json_is_array(tools) ? tools : NULL, add_gen,
                            &text, &len, &e);
    json_decref(msgs);
    if (rc < 0)
        return http_reply_err(c, &e);
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_stringn(text, len));
    free(text);
    return http_reply_json(c, 200, o);
}
