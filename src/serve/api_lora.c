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
 * idle expert), adapters loaded at run time with it.
 *
 * Run-time loads: the path is checked on the loop thread, the file is read
 * on a thread of its own (a lora_job), and its end comes back as the
 * scheduler's events do (tasks.c): the job is marked done under s->mu, the
 * loop woken with lws_cancel_service, and api_lora_poll answers the
 * request there; so only the loop thread touches the table. A load counts
 * as a waiting user of its expert (n_waiting): the model stays loaded under
 * it. A connection that goes first leaves the job without one (c NULL): its
 * adapter is released. Shutdown joins the threads still loading.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

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

/* The real path of a run-time adapter into real: it must lie inside
 * --lora-dir and be a file or a folder. */
static int resolve(const lms_server *s, const char *path, char *real, reqerr *e)
{
    if (!s->lora_dir)
        return reqerr_set(e, 403, "path", "loading adapters at run time is off: start the "
                          "server with --lora-dir DIR");
    if (!path || !path[0] || strlen(path) >= PATH_MAX / 2)
        return reqerr_set(e, 400, "path", "the adapter path must be a non-empty string");
    char joined[PATH_MAX];
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
    return 0;
}

struct lora_job {
    lms_server *s;
    conn *c;                  /* NULL once the connection has gone */
    lms_expert *x;            /* counted in x->n_waiting until the job ends */
    const lms_model *model;   /* x's, for the worker (which reads no field of x) */
    json_t *msg;              /* the request (a reference), for fn */
    lora_done_fn fn;
    char path[PATH_MAX];      /* resolved */
    pthread_t th;
    bool done;                /* s->mu; the fields below are the worker's until it is set */
    int rc;
    lms_lora *lora;
    char err[512];
    lora_job *next;           /* s->lora_jobs, loop thread */
};

/* Tests: LMSERV_DEBUG_LORA_DELAY_MS holds every run-time load that long, to
 * observe the server while one runs. */
static void debug_delay(void)
{
    const char *d = getenv("LMSERV_DEBUG_LORA_DELAY_MS");
    long ms = d ? atol(d) : 0;
    if (ms > 0 && ms < 600000)
        nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL);
}

static void *load_main(void *arg)
{
    lora_job *j = arg;
    lms_server *s = j->s;
    debug_delay();
    j->rc = lms_lora_load(j->path, j->model, &j->lora, j->err, sizeof j->err);
    pthread_mutex_lock(&s->mu);
    j->done = true;
    s->pend_lora = true;
    if (s->ctx_alive)
        lws_cancel_service(s->ctx);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int api_lora_begin(conn *c, const char *path, json_t *msg, lora_done_fn fn, reqerr *e)
{
    lms_server *s = c->srv;
    char real[PATH_MAX];
    if (resolve(s, path, real, e) < 0)
        return -1;
    if (s->n_lora_jobs >= SRV_MAX_ADAPTERS)
        return reqerr_set(e, 503, NULL, "%d adapter loads are running: retry when one ends",
                          s->n_lora_jobs);
    lora_job *j = malloc(sizeof *j);
    if (!j)
        return reqerr_set(e, 503, NULL, "out of memory");
    *j = (lora_job){.s = s, .c = c, .x = c->x, .model = c->x->model, .msg = json_incref(msg),
                    .fn = fn, .next = s->lora_jobs};
    memcpy(j->path, real, sizeof real);
    if (pthread_create(&j->th, NULL, load_main, j) != 0) {
        json_decref(msg);
        free(j);
        return reqerr_set(e, 503, NULL, "cannot start a thread to load the adapter");
    }
    s->lora_jobs = j;
    s->n_lora_jobs++;
    c->x->n_waiting++;
    lms_log(LMS_LOG_INFO, "lora_load_begin", "model", LMS_LOG_STR(c->x->cfg->id), "path",
            LMS_LOG_STR(real));
    return 0;
}

/* Joins j's thread and frees it; its adapter goes to its connection's fn,
 * or is released when the connection has gone. */
static void job_end(lora_job *j)
{
    pthread_join(j->th, NULL);
    if (j->x->n_waiting > 0)
        j->x->n_waiting--;
    if (j->c) {
        reqerr e = {0};
        if (j->rc < 0)
            reqerr_set(&e, 400, "path", "%s", j->err);
        j->c->x = j->x;
        j->fn(j->c, j->msg, j->rc < 0 ? NULL : j->lora, &e);
    } else {
        lms_log(LMS_LOG_INFO, "lora_load_dropped", "path", LMS_LOG_STR(j->path)); /* no client */
        lms_lora_release(j->lora);
    }
    json_decref(j->msg);
    free(j);
}

void api_lora_poll(lms_server *s)
{
    lora_job *ended = NULL;
    pthread_mutex_lock(&s->mu);
    for (lora_job **pp = &s->lora_jobs; *pp;) {
        lora_job *j = *pp;
        if (!j->done) {
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        j->next = ended;
        ended = j;
        s->n_lora_jobs--;
    }
    pthread_mutex_unlock(&s->mu);
    while (ended) {
        lora_job *j = ended;
        ended = j->next;
        job_end(j);
    }
}

void api_lora_drop_conn(conn *c)
{
    for (lora_job *j = c->srv->lora_jobs; j; j = j->next)
        if (j->c == c)
            j->c = NULL;
}

void api_lora_join(lms_server *s)
{
    while (s->lora_jobs) {
        lora_job *j = s->lora_jobs;
        s->lora_jobs = j->next;
        j->c = NULL; /* every connection is gone */
        job_end(j);
    }
    s->n_lora_jobs = 0;
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

/* x's table, or NULL with e filled when x is not loaded. */
static sattach *loaded_table(const lms_expert *x, reqerr *e)
{
    sattach *a = table_of(x);
    if (!a)
        reqerr_set(e, 503, "model", "model '%.128s' is not loaded: send it a request first",
                   x ? x->cfg->id : "");
    return a;
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
    sattach *a = loaded_table(x, e);
    if (a)
        c->x = x;
    return a;
}

/* x's table when it has room for one more adapter; else NULL with e filled. */
static sattach *room_in(const lms_expert *x, reqerr *e)
{
    sattach *a = loaded_table(x, e);
    if (a && a->n_ad >= SRV_MAX_ADAPTERS) {
        reqerr_set(e, 400, NULL, "model '%.128s' has %d adapters already: unload one first",
                   x->cfg->id, SRV_MAX_ADAPTERS);
        return NULL;
    }
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

/* POST /lora-adapters/load's file is read: the new entry. */
static void load_done(conn *c, json_t *body, lms_lora *l, const reqerr *le)
{
    reqerr e;
    sattach *a = NULL;
    if (!l)
        e = *le;
    else if (!(a = room_in(c->x, &e))) /* loads that ran side by side may have filled it */
        lms_lora_release(l);
    if (!a) {
        http_reply_err(c, &e);
        return;
    }
    double scale = 0.0;
    reqparse_num(body, "scale", -MAX_SCALE, MAX_SCALE, &scale, &e); /* checked at the start */
    int id = add_entry(a, l, (float)scale);
    lms_log(LMS_LOG_INFO, "lora_load", "model", LMS_LOG_STR(c->x->cfg->id), "adapter",
            LMS_LOG_STR(lms_lora_name(l)), "id", LMS_LOG_I64(id), NULL);
    http_reply_json(c, 200, entry_json(find_id(a, id)));
}

int api_lora_load(conn *c, json_t *body)
{
    reqerr e;
    const char *path = NULL;
    double scale = 0.0;
    if (!target(c, body, &e) || reqparse_str(body, "path", &path, &e) < 0 ||
        reqparse_num(body, "scale", -MAX_SCALE, MAX_SCALE, &scale, &e) < 0 || !room_in(c->x, &e) ||
        api_lora_begin(c, path, body, load_done, &e) < 0)
        return http_reply_err(c, &e);
    return 0; /* load_done answers */
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
