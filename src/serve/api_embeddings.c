/*
 * api_embeddings.c - POST /v1/embeddings, and Ollama's POST /api/embed
 * and (older) /api/embeddings: one scheduler task per input (embedding =
 * true, mean pooling, unit length), one response when all are in.
 *
 * Ollama's shapes: /api/embed takes `input` (a string or an array of
 * strings) and answers {"model", "embeddings": [[...]], "total_duration",
 * "load_duration", "prompt_eval_count"}; /api/embeddings takes `prompt`
 * and answers {"embedding": [...]}; errors are {"error": "..."}.
 *
 * `input` is a string, an array of strings, an array of token ids or an
 * array of such arrays. `encoding_format` "float" (default) or "base64"
 * (little-endian float32, what the official clients ask for by default).
 * An embedding model (bert) is encoded whole by its scheduler (encoder.c,
 * the file's pooling_type); inputs longer than its context are refused
 * here, naming the limit.
 * An input that fails fails the whole request; the other tasks are left to
 * finish (their results are dropped) rather than tracked for abort.
 */
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "serve/serve_int.h"

#define MAX_INPUTS 256

enum { EMBD_OPENAI, EMBD_OLLAMA, EMBD_OLLAMA_LEGACY };

typedef struct embd_job {
    int shape;                 /* EMBD_*: the request's API */
    double t0;                 /* submitted (ms) */
    int refs;                  /* live tasks + the submitting code */
    int n_in, n_done;
    bool base64, replied;
    bool failed;
    reqerr err;
    uint64_t *ids;             /* [n_in] task ids */
    float **vec;               /* [n_in][n_embd] */
    int32_t n_embd;
    int32_t *n_tok;            /* [n_in] prompt tokens */
    const lms_expert *x;       /* the expert computing them */
} embd_job;

static void job_unref(embd_job *j)
{
    if (--j->refs > 0)
        return;
    for (int i = 0; i < j->n_in; i++)
        free(j->vec[i]);
    free(j->vec);
    free(j->ids);
    free(j->n_tok);
    free(j);
}

static void b64(sbuf *out, const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16;
        if (i + 1 < n)
            v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        char q[4] = {tab[(v >> 18) & 63], tab[(v >> 12) & 63],
                     i + 1 < n ? tab[(v >> 6) & 63] : '=', i + 2 < n ? tab[v & 63] : '='};
        sbuf_add(out, q, 4);
    }
}

static json_t *vector_json(const embd_job *j, const float *v)
{
    if (j->base64) {
        sbuf b = {0};
        b64(&b, (const unsigned char *)v, (size_t)j->n_embd * sizeof *v); /* x86/arm: LE */
        json_t *s = json_stringn(b.p ? b.p : "", b.n);
        sbuf_free(&b);
        return s;
    }
    json_t *a = json_array();
    for (int32_t k = 0; k < j->n_embd; k++)
        json_array_append_new(a, json_real_safe(v[k]));
    return a;
}

static int reply_err(conn *c, int shape, const reqerr *e)
{
    if (shape == EMBD_OPENAI)
        return http_reply_err(c, e);
    return http_reply_json(c, e->status, json_pack("{s:s}", "error", e->msg));
}

static void reply_ollama(conn *c, embd_job *j)
{
    json_t *o = json_object();
    if (j->shape == EMBD_OLLAMA_LEGACY) {
        json_object_set_new(o, "embedding", vector_json(j, j->vec[0]));
        http_reply_json(c, 200, o);
        return;
    }
    json_t *all = json_array();
    int64_t n_tok = 0;
    for (int i = 0; i < j->n_in; i++) {
        json_array_append_new(all, vector_json(j, j->vec[i]));
        n_tok += j->n_tok[i];
    }
    json_object_set_new(o, "model", xid_json(j->x));
    json_object_set_new(o, "embeddings", all);
    json_object_set_new(o, "total_duration",
                        json_integer((json_int_t)((lms_now_ms() - j->t0) * 1e6)));
    json_object_set_new(o, "load_duration", json_integer(0));
    json_object_set_new(o, "prompt_eval_count", json_integer(n_tok));
    http_reply_json(c, 200, o);
}

static void reply(conn *c, embd_job *j)
{
    j->replied = true;
    if (j->failed) {
        reply_err(c, j->shape, &j->err);
        return;
    }
    if (j->shape != EMBD_OPENAI) {
        reply_ollama(c, j);
        return;
    }
    json_t *data = json_array();
    int64_t n_tok = 0;
    for (int i = 0; i < j->n_in; i++) {
        json_t *d = json_object();
        json_object_set_new(d, "object", json_string("embedding"));
        json_object_set_new(d, "index", json_integer(i));
        json_object_set_new(d, "embedding", vector_json(j, j->vec[i]));
        json_array_append_new(data, d);
        n_tok += j->n_tok[i];
    }
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    json_object_set_new(o, "model", xid_json(j->x));
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(n_tok));
    json_object_set_new(u, "total_tokens", json_integer(n_tok));
    json_object_set_new(o, "usage", u);
    http_reply_json(c, 200, o);
}

static void fail(embd_job *j, int status, const char *msg)
{
    if (!j->failed)
        reqerr_set(&j->err, status, "input", "%s", msg);
    j->failed = true;
}

static void embd_on_event(task *t, const lms_event *ev, double t_ms)
{
    embd_job *j = t->state;
    (void)t_ms;
    int i = 0;
    while (i < j->n_in && j->ids[i] != ev->id)
        i++;
    if (i == j->n_in)
        return;
    if (ev->type == LMS_EV_EMBD && ev->embd && ev->n_embd == j->n_embd && !j->vec[i]) {
        j->vec[i] = malloc((size_t)j->n_embd * sizeof(float));
        if (j->vec[i])
            memcpy(j->vec[i], ev->embd, (size_t)j->n_embd * sizeof(float));
        j->n_tok[i] = ev->stats.n_prompt;
        return;
    }
    if (ev->type == LMS_EV_ERROR)
        fail(j, 500, ev->message);
    else if (ev->type == LMS_EV_END) {
        j->n_tok[i] = ev->stats.n_prompt;
        if (!j->vec[i])
            fail(j, 503, "the embedding was not computed (aborted or out of memory)");
    } else
        return;
    if (++j->n_done == j->n_in && !j->replied)
        reply(t->c, j);
}

static void embd_destroy(task *t)
{
    job_unref(t->state);
}

static const task_ops embd_ops = {embd_on_event, embd_destroy};

/* ---- input -------------------------------------------------------------------------- */

static int ids_of(const json_t *a, size_t idx, int32_t **out, int32_t *n_out, reqerr *e)
{
    size_t n = json_array_size(a);
    if (n == 0 || n > (1u << 24))
        return reqerr_set(e, 400, "input", "input[%zu] must hold 1 to 16777216 token ids", idx);
    return reqparse_token_ids(a, "input", out, n_out, e);
}

/* An encoder (bert) takes at most its context's tokens, and the server's
 * context (-c) must hold them too (tasks.c's check: fewer than n_ctx). */
static int check_encoder_len(conn *c, size_t k, int32_t n, reqerr *e)
{
    const lms_model *m = c->x->model;
    int32_t max = m->hp.n_ctx_train, n_ctx = lms_sched_params_of(c->x->sched)->n_ctx;
    if (n_ctx - 1 < max)
        max = n_ctx - 1;
    if (n <= max)
        return 0;
    reqerr_set(e, 400, "input", "input[%zu] has %d tokens; model '%s' takes at most %d",
               k, n, m->name, max);
    e->code = "context_length_exceeded";
    return -1;
}

/* Tokens of input item k (a string or an array of ids). */
static int item_tokens(conn *c, const json_t *x, size_t k, int32_t **out, int32_t *n, reqerr *e)
{
    int rc;
    if (json_is_string(x)) {
        if (json_string_length(x) == 0)
            return reqerr_set(e, 400, "input", "input[%zu] is an empty string", k);
        rc = chatfmt_text_tokens(c->x->model, json_string_value(x), json_string_length(x), true,
                                 out, n, e);
    } else if (json_is_array(x)) {
        rc = ids_of(x, k, out, n, e);
    } else {
        return reqerr_set(e, 400, "input", "input[%zu] must be a string or an array of token ids",
                          k);
    }
    if (rc >= 0 && c->x->model->hp.is_encoder && c->x->sched &&
        check_encoder_len(c, k, *n, e) < 0) {
        free(*out);
        *out = NULL;
        return -1;
    }
    return rc;
}

/* The input (field key) as a list of items: a lone string or id array
 * becomes one. */
static json_t *input_items(const json_t *body, const char *key, reqerr *e)
{
    const json_t *in = json_object_get(body, key);
    if (json_is_string(in) || (json_is_array(in) && json_is_integer(json_array_get(in, 0)))) {
        json_t *a = json_array();
        json_array_append(a, (json_t *)in);
        return a;
    }
    if (!json_is_array(in) || json_array_size(in) == 0) {
        reqerr_set(e, 400, key, "'%s' must be a string, an array of strings or token ids", key);
        return NULL;
    }
    if (json_array_size(in) > MAX_INPUTS) {
        reqerr_set(e, 400, key, "at most %d inputs per request", MAX_INPUTS);
        return NULL;
    }
    return json_incref((json_t *)in);
}

static int parse_format(const json_t *body, const lms_model *m, embd_job *j, int *pooling,
                        reqerr *e)
{
    const char *fmt = NULL, *pool = NULL;
    if (reqparse_str(body, "encoding_format", &fmt, e) < 0 ||
        reqparse_str(body, "pooling", &pool, e) < 0)
        return -1;
    if (fmt && strcmp(fmt, "float") && strcmp(fmt, "base64"))
        return reqerr_set(e, 400, "encoding_format", "'encoding_format' must be \"float\" or "
                          "\"base64\"");
    j->base64 = fmt && !strcmp(fmt, "base64");
    if (pool && strcmp(pool, "mean") && strcmp(pool, "last"))
        return reqerr_set(e, 400, "pooling", "'pooling' must be \"mean\" or \"last\"");
    if (pool && m->hp.is_encoder) /* trained with one pooling: the file's */
        return reqerr_set(e, 400, "pooling",
                          "'pooling' cannot be chosen for model '%s': an embedding model pools "
                          "as its file says (%s)", m->name,
                          m->hp.pooling == LMS_POOLING_CLS    ? "cls"
                          : m->hp.pooling == LMS_POOLING_LAST ? "last"
                                                              : "mean");
    *pooling = pool && !strcmp(pool, "last") ? LMS_POOL_LAST : LMS_POOL_MEAN;
    return 0;
}

static embd_job *job_new(int n, int32_t n_embd)
{
    embd_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->refs = 1;
    j->n_in = n;
    j->n_embd = n_embd;
    j->ids = calloc((size_t)n, sizeof *j->ids);
    j->vec = calloc((size_t)n, sizeof *j->vec);
    j->n_tok = calloc((size_t)n, sizeof *j->n_tok);
    if (!j->ids || !j->vec || !j->n_tok) {
        job_unref(j);
        return NULL;
    }
    return j;
}

/* Submits every item; on failure cancels those already submitted. */
static int submit_all(conn *c, const json_t *items, embd_job *j, int pooling, reqerr *e)
{
    task *first = c->tasks; /* tasks are pushed in front: ours come before this */
    size_t k;
    const json_t *x;
    json_array_foreach(items, k, x)
    {
        int32_t *toks = NULL, n = 0;
        if (item_tokens(c, x, k, &toks, &n, e) < 0)
            goto fail;
        lms_request r = {.tokens = toks, .n_tokens = n, .sp = lms_sampler_defaults(),
                         .embedding = true, .pooling = pooling};
        j->refs++;
        task *t = task_submit(c, &r, &embd_ops, j, e);
        free(toks);
        if (!t) {
            j->refs--;
            goto fail;
        }
        j->ids[k] = t->id;
    }
    return 0;
fail:
    while (c->tasks && c->tasks != first)
        task_cancel(c->tasks);
    return -1;
}

/* A request of any shape: the model checked (Ollama's may be empty), the
 * items of `key` submitted. */
static int embed(conn *c, json_t *body, int shape, const char *key)
{
    reqerr e;
    pick_fn again = shape == EMBD_OPENAI   ? api_embeddings
                    : shape == EMBD_OLLAMA ? api_ollama_embed
                                           : api_ollama_embeddings;
    int picked = pick_expert(c, body, again, &e);
    if (picked <= 0)
        return picked < 0 ? reply_err(c, shape, &e) : 0;
    json_t *items = input_items(body, key, &e);
    if (!items)
        return reply_err(c, shape, &e);
    if (shape == EMBD_OLLAMA_LEGACY && (json_array_size(items) != 1 ||
                                        !json_is_string(json_array_get(items, 0)))) {
        json_decref(items);
        reqerr_set(&e, 400, key, "'prompt' must be a string");
        return reply_err(c, shape, &e);
    }
    embd_job *j = job_new((int)json_array_size(items), c->x->model->hp.n_embd);
    int pooling = LMS_POOL_MEAN;
    int rc = j ? 0 : reqerr_set(&e, 503, NULL, "out of memory");
    if (rc == 0) {
        j->shape = shape;
        j->x = c->x;
        j->t0 = lms_now_ms();
        if (shape == EMBD_OPENAI)
            rc = parse_format(body, c->x->model, j, &pooling, &e);
    }
    if (rc == 0)
        rc = submit_all(c, items, j, pooling, &e);
    json_decref(items);
    if (j)
        job_unref(j);
    return rc < 0 ? reply_err(c, shape, &e) : 0;
}

int api_embeddings(conn *c, json_t *body)
{
    return embed(c, body, EMBD_OPENAI, "input");
}

int api_ollama_embed(conn *c, json_t *body)
{
    return embed(c, body, EMBD_OLLAMA, "input");
}

int api_ollama_embeddings(conn *c, json_t *body)
{
    return embed(c, body, EMBD_OLLAMA_LEGACY, "prompt");
}
