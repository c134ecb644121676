/*
 * api_lora.c - LoRA adapters over HTTP and WebSocket.
 *
 * Each loaded model keeps a table of adapters (sattach.ad): those its
 * expert was started with (serve --lora, or "lora" in the config, loaded
 * with the model on the loader thread) and those loaded at run time from
 * the server's --lora-dir folder. An adapter has an id and a scale; a
 * request that names no adapters gets every adapter whose scale is not 0
 * (llama-server's global scales), a request with "lora": [{"id", "scale"}]
 * exactly those (the others at 0). The scheduler takes its own reference
 * per sequence, so unloading an adapter never disturbs a running request.
 *
 *   GET  /lora-adapters          [{"id", "name", "path", "scale", "rank", "alpha"}]
 *   POST /lora-adapters          [{"id", "scale"}]: new global scales
 *   POST /lora-adapters/load     {"path", "scale"?, "model"?}: the new entry
 *   POST /lora-adapters/unload   {"id", "model"?}
 *
 * The table belongs to the model: it goes when the model is unloaded (an
 * idle expert), adapters loaded at run time with it. Run-time loads read
 * a small file on the event-loop thread.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/err.h"
#include "ops/log.h"
#include "serve/serve_int.h"

#define MAX_SCALE 100.0

static sattach *table_of(const lms_expert *x)
{
    return x && x->state == LMS_EXPERT_READY ? (sattach *)x->attach : NULL;
}

static sadapter *find_id(sattach *a, int64_t id)
{
    for (int i = 0; i < a->n_ad; i++)
        if (a->ad[i].id == id)
            return &a->ad[i];
    return NULL;
}

static int add_entry(sattach *a, lms_lora *l, float scale)
{
    if (a->n_ad >= SRV_MAX_ADAPTERS)
        return -1;
    a->ad[a->n_ad++] = (sadapter){a->next_ad_id++, l, scale};
    return a->ad[a->n_ad - 1].id;
}

/* ---- loading ---------------------------------------------------------------------- */

int api_lora_prepare(sattach *a, const lms_expert *x, const lms_model *m, char *err,
                     size_t errsz)
{
    for (int i = 0; i < x->cfg->n_loras; i++) {
        lms_lora *l;
        int rc = lms_lora_load(x->cfg->lora_paths[i], m, &l, err, errsz);
        if (rc < 0) {
            api_lora_free(a);
            return rc;
        }
        add_entry(a, l, x->cfg->lora_scales[i]);
    }
    return 0;
}

void api_lora_free(sattach *a)
{
    for (int i = 0; i < a->n_ad; i++)
        lms_lora_release(a->ad[i].lora);
    a->n_ad = 0;
}

int api_lora_open(lms_server *s, const lms_expert *x, const char *path, lms_lora **out,
                  reqerr *e)
{
    if (!s->lora_dir)
        return reqerr_set(e, 403, "path", "loading adapters at run time is off: start the "
                          "server with --lora-dir DIR");
    if (!path || !path[0] || strlen(path) >= PATH_MAX / 2)
        return reqerr_set(e, 400, "path", "the adapter path must be a non-empty string");
    char joined[PATH_MAX], real[PATH_MAX];
    snprintf(joined, sizeof joined, "%s/%s", s->lora_dir, path);
    const char *want = path[0] == '/' ? path : joined;
    /* the resolved file (links and .. followed) must lie inside the folder */
    if (!realpath(want, real))
        return reqerr_set(e, errno == ENOENT ? 404 : 403, "path",
                          "adapter '%.200s' does not exist in the adapter folder", path);
    const size_t n = strlen(s->lora_dir);
    if (strncmp(real, s->lora_dir, n) != 0 || (real[n] != '/' && s->lora_dir[n - 1] != '/'))
        return reqerr_set(e, 403, "path", "adapter '%.200s' is outside the adapter folder", path);
    struct stat st;
    if (stat(real, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)))
        return reqerr_set(e, 400, "path", "adapter '%.200s' is not a file or a PEFT folder", path);
    char err[512];
    if (lms_lora_load(real, x->model, out, err, sizeof err) < 0)
        return reqerr_set(e, 400, "path", "%s", err);
    return 0;
}

/* ---- a request's adapters ---------------------------------------------------------- */

static int add_use(genparams *gp, lms_lora *l, float scale, const char *field, reqerr *e)
{
    if (scale == 0.0f)
        return 0;
    if (gp->n_loras >= LMS_LORA_MAX)
        return reqerr_set(e, 400, field, "at most %d adapters may apply to one request",
                          LMS_LORA_MAX);
    gp->loras[gp->n_loras++] = (lms_lora_use){l, scale};
    return 0;
}

int api_lora_pick(conn *c, const json_t *o, genparams *gp, reqerr *e)
{
    gp->n_loras = 0;
    sattach *a = table_of(c->x);
    const json_t *list = o ? json_object_get(o, "lora") : NULL;
    if (!list || json_is_null(list)) {
        for (int i = 0; a && i < a->n_ad; i++)
            if (add_use(gp, a->ad[i].lora, a->ad[i].scale, "lora", e) < 0)
                return -1;
        return 0;
    }
    if (!json_is_array(list))
        return reqerr_set(e, 400, "lora", "'lora' must be an array of {\"id\", \"scale\"}");
    size_t i;
    const json_t *u;
    json_array_foreach(list, i, u)
    {
        char field[48];
        snprintf(field, sizeof field, "lora[%zu]", i);
        const json_t *id = json_object_get(u, "id"), *sc = json_object_get(u, "scale");
        if (!json_is_object(u) || !json_is_integer(id))
            return reqerr_set(e, 400, field, "'%s' must be an object with an integer 'id'", field);
        sadapter *d = a ? find_id(a, json_integer_value(id)) : NULL;
        if (!d)
            return reqerr_set(e, 400, field, "no adapter with id %lld on model '%.128s' (GET "
                              "/lora-adapters lists them)", (long long)json_integer_value(id),
                              c->x->cfg->id);
        double scale = 1.0;
        if (sc && !json_is_null(sc)) {
            if (!json_is_number(sc) || !(fabs(json_number_value(sc)) <= MAX_SCALE))
                return reqerr_set(e, 400, field, "'scale' must be a number in [-100, 100]");
            scale = json_number_value(sc);
        }
        for (int k = 0; k < gp->n_loras; k++)
            if (gp->loras[k].lora == d->lora)
                return reqerr_set(e, 400, field, "adapter %d is listed twice", d->id);
        if (add_use(gp, d->lora, (float)scale, field, e) < 0)
            return -1;
    }
    return 0;
}

/* ---- HTTP ------------------------------------------------------------------------------ */

static json_t *entry_json(const sadapter *d)
{
    const char *name = lms_lora_name(d->lora), *path = lms_lora_path(d->lora);
    return json_pack("{s:i, s:o, s:o, s:f, s:i, s:f, s:i}", "id", d->id, "name",
                     json_string_lossy(name, strlen(name)), "path",
                     json_string_lossy(path, strlen(path)), "scale", (double)d->scale, "rank",
                     (int)lms_lora_rank(d->lora), "alpha", (double)lms_lora_alpha(d->lora),
                     "n_tensors", (int)lms_lora_n_tensors(d->lora));
}

static json_t *list_json(const sattach *a)
{
    json_t *arr = json_array();
    for (int i = 0; a && i < a->n_ad; i++)
        json_array_append_new(arr, entry_json(&a->ad[i]));
    return arr;
}

/* The expert an adapter request is about: "model" when given, else the
 * default one; it must be loaded. */
static sattach *target(conn *c, const json_t *body, reqerr *e)
{
    lms_server *s = c->srv;
    const char *name = body ? json_string_value(json_object_get(body, "model")) : NULL;
    lms_expert *x = NULL;
    if (name) {
        x = lms_registry_find(s->reg, name);
        if (!x) {
            reqerr_set(e, 404, "model", "model '%.128s' does not exist", name);
            e->code = "model_not_found";
            return NULL;
        }
    } else {
        x = server_default_expert(s);
    }
    sattach *a = table_of(x);
    if (!a) {
        reqerr_set(e, 503, "model", "model '%.128s' is not loaded: send it a request first",
                   x ? x->cfg->id : "");
        return NULL;
    }
    c->x = x;
    return a;
}

int api_lora_list(conn *c)
{
    reqerr e;
    sattach *a = target(c, NULL, &e);
    return a ? http_reply_json(c, 200, list_json(a)) : http_reply_err(c, &e);
}

/* llama-server's form: the listed adapters get these scales, the others 0. */
int api_lora_scales(conn *c, json_t *body)
{
    reqerr e;
    const json_t *list = json_is_array(body) ? body : json_object_get(body, "lora");
    sattach *a = target(c, json_is_object(body) ? body : NULL, &e);
    if (!a)
        return http_reply_err(c, &e);
    genparams gp = {0};
    if (!json_is_array(list)) {
        reqerr_set(&e, 400, "lora", "send [{\"id\", \"scale\"}, ...]");
        return http_reply_err(c, &e);
    }
    json_t *wrap = json_pack("{s:O}", "lora", list);
    int rc = api_lora_pick(c, wrap, &gp, &e);
    json_decref(wrap);
    if (rc < 0)
        return http_reply_err(c, &e);
    for (int i = 0; i < a->n_ad; i++) {
        a->ad[i].scale = 0.0f;
        for (int k = 0; k < gp.n_loras; k++)
            if (gp.loras[k].lora == a->ad[i].lora)
                a->ad[i].scale = gp.loras[k].scale;
    }
    return http_reply_json(c, 200, list_json(a));
}

int api_lora_load(conn *c, json_t *body)
{
    reqerr e;
    sattach *a = target(c, body, &e);
    if (!a)
        return http_reply_err(c, &e);
    const char *path = NULL;
    double scale = 0.0;
    if (reqparse_str(body, "path", &path, &e) < 0 ||
        reqparse_num(body, "scale", -MAX_SCALE, MAX_SCALE, &scale, &e) < 0)
        return http_reply_err(c, &e);
    if (a->n_ad >= SRV_MAX_ADAPTERS) {
        reqerr_set(&e, 400, NULL, "model '%.128s' has %d adapters already: unload one first",
                   c->x->cfg->id, SRV_MAX_ADAPTERS);
        return http_reply_err(c, &e);
    }
    lms_lora *l;
    if (api_lora_open(c->srv, c->x, path, &l, &e) < 0)
        return http_reply_err(c, &e);
    int id = add_entry(a, l, (float)scale);
    lms_log(LMS_LOG_INFO, "lora_load", "model", LMS_LOG_STR(c->x->cfg->id), "adapter",
            LMS_LOG_STR(lms_lora_name(l)), "id", LMS_LOG_I64(id), NULL);
    return http_reply_json(c, 200, entry_json(find_id(a, id)));
}

int api_lora_unload(conn *c, json_t *body)
{
    reqerr e;
    sattach *a = target(c, body, &e);
    if (!a)
        return http_reply_err(c, &e);
    int64_t id = -1;
    if (reqparse_int(body, "id", 0, INT_MAX, &id, &e) < 0)
        return http_reply_err(c, &e);
    sadapter *d = id >= 0 ? find_id(a, id) : NULL;
    if (!d) {
        reqerr_set(&e, 404, "id", "no adapter with id %lld", (long long)id);
        return http_reply_err(c, &e);
    }
    json_t *gone = entry_json(d);
    lms_lora_release(d->lora); /* running requests hold their own references */
    const int at = (int)(d - a->ad);
    memmove(&a->ad[at], &a->ad[at + 1], (size_t)(a->n_ad - at - 1) * sizeof a->ad[0]);
    a->n_ad--;
    lms_log(LMS_LOG_INFO, "lora_unload", "model", LMS_LOG_STR(c->x->cfg->id), "id",
            LMS_LOG_I64(id), NULL);
    return http_reply_json(c, 200, json_pack("{s:o, s:b}", "adapter", gone, "unloaded", 1));
}
