/*
 * api_embeddings.c - POST /v1/embeddings, and Ollama's POST /api/embed
 * and (older) /api/embeddings: one scheduler task per input (embedding =
 * true, mean pooling, unit length), one response when all are in. And
 * reranking (POST /v1/rerank and its aliases, api_rerank below): a task per
 * document on a reranker model, the documents ordered by score.
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "model/tokenizer.h"
#include "serve/serve_int.h"

#define MAX_INPUTS 256

/* EMBD_NATIVE: llama-server's own form (POST /embedding, or "content" for
 * "input"): [{"index", "embedding": [vector]}] */
enum { EMBD_OPENAI, EMBD_OLLAMA, EMBD_OLLAMA_LEGACY, EMBD_RERANK, EMBD_TEI, EMBD_NATIVE };

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
    /* rerank: the documents (for return_documents), results kept, with text */
    json_t *docs;
    int top_n;
    bool with_text;
    int32_t dims;              /* OpenAI's "dimensions": the first dims values, renormalized; 0 all */
    bool truncate;             /* Ollama's "truncate" (default): long inputs cut to the limit */
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
    json_decref(j->docs);
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

/* The vector as the request wants it: floats or base64; with
 * "dimensions", its first values scaled back to unit length (matryoshka
 * truncation, as OpenAI's text-embedding-3 and nomic-embed-text v1.5
 * models are trained for). v is modified then. */
static json_t *vector_json(const embd_job *j, float *v)
{
    int32_t n = j->n_embd;
    if (j->dims > 0 && j->dims < n) {
        n = j->dims;
        double ss = 0;
        for (int32_t k = 0; k < n; k++)
            ss += (double)v[k] * v[k];
        const float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (int32_t k = 0; k < n; k++)
            v[k] *= inv;
    }
    if (j->base64) {
        sbuf b = {0};
        b64(&b, (const unsigned char *)v, (size_t)n * sizeof *v); /* x86/arm: LE */
        json_t *s = json_stringn(b.p ? b.p : "", b.n);
        sbuf_free(&b);
        return s;
    }
    json_t *a = json_array();
    for (int32_t k = 0; k < n; k++)
        json_array_append_new(a, json_real_safe(v[k]));
    return a;
}

static int reply_err(conn *c, int shape, const reqerr *e)
{
    if (shape == EMBD_OPENAI || shape == EMBD_RERANK || shape == EMBD_TEI || shape == EMBD_NATIVE)
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

/* A document's text: a string, or Cohere's {"text": ...} */
static const char *doc_text(const json_t *d, size_t *n)
{
    const json_t *t = json_is_object(d) ? json_object_get(d, "text") : d;
    *n = json_string_length(t);
    return json_string_value(t);
}

/* Rerank results, best first (the first score of each document: a
 * reranker's head has one output), top_n of them: llama-server's (Jina's,
 * Cohere's) {"results": [{"index", "relevance_score", "document"?}], ...}
 * or TEI's [{"index", "score", "text"?}]. */
static void reply_rerank(conn *c, embd_job *j)
{
    int *order = malloc((size_t)j->n_in * sizeof *order);
    if (!order) {
        reqerr e;
        reqerr_set(&e, 503, NULL, "out of memory");
        http_reply_err(c, &e);
        return;
    }
    int64_t n_tok = 0;
    for (int i = 0; i < j->n_in; i++) {
        int k = i; /* insertion by score, stable: ties keep the documents' order */
        while (k > 0 && j->vec[order[k - 1]][0] < j->vec[i][0]) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = i;
        n_tok += j->n_tok[i];
    }
    const bool tei = j->shape == EMBD_TEI;
    json_t *results = json_array();
    for (int r = 0; r < j->n_in && r < j->top_n; r++) {
        const int i = order[r];
        json_t *o = json_object();
        json_object_set_new(o, "index", json_integer(i));
        json_object_set_new(o, tei ? "score" : "relevance_score", json_real(j->vec[i][0]));
        if (j->with_text) {
            size_t n;
            const char *t = doc_text(json_array_get(j->docs, (size_t)i), &n);
            json_t *text = json_stringn(t, n);
            json_object_set_new(o, tei ? "text" : "document",
                                tei ? text : json_pack("{s:o}", "text", text));
        }
        json_array_append_new(results, o);
    }
    free(order);
    if (tei) {
        http_reply_json(c, 200, results);
        return;
    }
    json_t *o = json_object();
    char id[48];
    snprintf(id, sizeof id, "rerank-%016llx", (unsigned long long)server_rand(c->srv));
    json_object_set_new(o, "id", json_string(id));
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "model", xid_json(j->x));
    json_object_set_new(o, "results", results);
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(n_tok));
    json_object_set_new(u, "total_tokens", json_integer(n_tok));
    json_object_set_new(o, "usage", u);
    http_reply_json(c, 200, o);
}

static void reply(conn *c, embd_job *j)
{
    j->replied = true;
    if (j->failed) {
        reply_err(c, j->shape, &j->err);
        return;
    }
    if (j->shape == EMBD_RERANK || j->shape == EMBD_TEI) {
        reply_rerank(c, j);
        return;
    }
    if (j->shape == EMBD_NATIVE) { /* one pooled vector per input, in a list */
        json_t *all = json_array();
        for (int i = 0; i < j->n_in; i++) {
            json_t *one = json_array();
            json_array_append_new(one, vector_json(j, j->vec[i]));
            json_array_append_new(all, json_pack("{s:i, s:o}", "index", i, "embedding", one));
        }
        http_reply_json(c, 200, all);
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

/* The most tokens an input may have: fewer than the server's context (-c;
 * tasks.c's check), and an encoder (bert) at most its own context. */
static int32_t max_input(const conn *c)
{
    const lms_model *m = c->x->model;
    int32_t max = lms_sched_params_of(c->x->sched)->n_ctx - 1;
    if (m->hp.is_encoder && m->hp.n_ctx_train < max)
        max = m->hp.n_ctx_train;
    return max;
}

/* An encoder (bert) takes at most its context's tokens, and the server's
 * context (-c) must hold them too (tasks.c's check: fewer than n_ctx). */
static int check_encoder_len(conn *c, size_t k, int32_t n, reqerr *e)
{
    const lms_model *m = c->x->model;
    const int32_t max = max_input(c);
    if (n <= max)
        return 0;
    reqerr_set(e, 400, "input", "input[%zu] has %d tokens; model '%s' takes at most %d",
               k, n, m->name, max);
    e->code = "context_length_exceeded";
    return -1;
}

/* Ollama's truncate: an input longer than the model takes keeps its first
 * tokens, its closing token (BERT's [SEP], where the vocabulary adds one)
 * put back last. */
static void truncate_input(const conn *c, int32_t *toks, int32_t *n)
{
    if (!c->x->sched || *n <= max_input(c))
        return;
    const lms_tokenizer *t = c->x->model->tok;
    const int32_t last = toks[*n - 1], max = max_input(c);
    *n = max;
    if (lms_tokenizer_add_eos(t) && last == lms_tokenizer_eos(t))
        toks[max - 1] = last;
}

/* Tokens of input item k (a string or an array of ids); too long: cut to
 * the model's limit when truncate, else refused. */
static int item_tokens(conn *c, const json_t *x, size_t k, bool truncate, int32_t **out,
                       int32_t *n, reqerr *e)
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
    if (rc >= 0 && truncate)
        truncate_input(c, *out, n);
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

/* How a decoder's request pools (enum lms_pooling) for a pooling_type:
 * last and cls as named, anything else by the mean. */
static int request_pooling(int pooling_type)
{
    return pooling_type == LMS_POOLING_LAST  ? LMS_POOL_LAST
           : pooling_type == LMS_POOLING_CLS ? LMS_POOL_FIRST
                                             : LMS_POOL_MEAN;
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
    const int type = lms_pooling_parse(pool);
    if (pool && (!type || type == LMS_POOLING_RANK))
        return reqerr_set(e, 400, "pooling", "'pooling' must be \"mean\", \"last\" or \"cls\"");
    if (pool && m->hp.is_encoder) /* trained with one pooling: the file's */
        return reqerr_set(e, 400, "pooling",
                          "'pooling' cannot be chosen for model '%s': an embedding model pools "
                          "as its file says (%s)", m->name, lms_pooling_name(m->hp.pooling));
    if (pool)
        *pooling = request_pooling(type);
    int64_t dims = 0;
    if (reqparse_int(body, "dimensions", 1, m->hp.n_embd, &dims, e) < 0)
        return -1;
    j->dims = (int32_t)dims;
    return 0;
}

/* (Re)sizes j's per-input arrays for n inputs (none submitted yet). */
static int job_size(embd_job *j, int n)
{
    free(j->ids), free(j->vec), free(j->n_tok);
    j->n_in = n;
    j->ids = calloc((size_t)(n ? n : 1), sizeof *j->ids);
    j->vec = calloc((size_t)(n ? n : 1), sizeof *j->vec);
    j->n_tok = calloc((size_t)(n ? n : 1), sizeof *j->n_tok);
    return j->ids && j->vec && j->n_tok ? 0 : -1;
}

static embd_job *job_new(int n, int32_t n_embd)
{
    embd_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->refs = 1;
    j->n_embd = n_embd;
    if (job_size(j, n) < 0) {
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
        if (item_tokens(c, x, k, j->truncate, &toks, &n, e) < 0)
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
    /* llama-server answers "content" (not OpenAI's field) in its own form */
    if ((shape == EMBD_OPENAI || shape == EMBD_NATIVE) && !json_object_get(body, "input") &&
        json_object_get(body, "content")) {
        shape = EMBD_NATIVE;
        key = "content";
    }
    pick_fn again = shape == EMBD_OPENAI   ? api_embeddings
                    : shape == EMBD_NATIVE ? api_embedding_native
                    : shape == EMBD_OLLAMA ? api_ollama_embed
                                           : api_ollama_embeddings;
    int picked = pick_expert(c, body, again, &e);
    if (picked <= 0)
        return picked < 0 ? reply_err(c, shape, &e) : 0;
    if (c->x->model && c->x->model->hp.pooling == LMS_POOLING_RANK) {
        reqerr_set(&e, 400, "model", "model '%s' is a reranker: its scores come from /v1/rerank",
                   c->x->model->name);
        return reply_err(c, shape, &e);
    }
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
    /* a decoder pools as --pooling, else its file says (Qwen3-Embedding:
     * last), else by the mean */
    int pooling = request_pooling(c->srv->pooling && c->srv->pooling != LMS_POOLING_RANK
                                      ? c->srv->pooling
                                      : c->x->model->hp.pooling);
    int rc = j ? 0 : reqerr_set(&e, 503, NULL, "out of memory");
    if (rc == 0) {
        j->shape = shape;
        j->x = c->x;
        j->t0 = lms_now_ms();
        if (shape == EMBD_OPENAI || shape == EMBD_NATIVE)
            rc = parse_format(body, c->x->model, j, &pooling, &e);
        else if (c->x->sched) { /* Ollama truncates by default */
            j->truncate = true;
            rc = reqparse_bool(body, "truncate", &j->truncate, &e) < 0 ? -1 : 0;
        }
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

int api_embedding_native(conn *c, json_t *body)
{
    return embed(c, body, EMBD_NATIVE, "input");
}

int api_ollama_embed(conn *c, json_t *body)
{
    return embed(c, body, EMBD_OLLAMA, "input");
}

int api_ollama_embeddings(conn *c, json_t *body)
{
    return embed(c, body, EMBD_OLLAMA_LEGACY, "prompt");
}

/* ---- rerank ------------------------------------------------------------------------ */

/* Tokens of (query, document) as llama-server lays them out for a
 * reranker: [BOS] query [EOS or SEP] document [EOS]; BERT's vocabulary
 * (BOS = [CLS], EOS = [SEP], which llama.cpp adds as its separator) gives
 * [CLS] query [SEP] document, the others their BOS and EOS where the
 * vocabulary adds them. */
static int pair_tokens(const lms_model *m, const char *q, size_t qn, const char *d, size_t dn,
                       int32_t **out, int32_t *n_out, reqerr *e)
{
    int32_t *qt = NULL, *dt = NULL, nq = 0, nd = 0;
    if (chatfmt_text_tokens(m, q, qn, false, &qt, &nq, e) < 0)
        return -1;
    if (chatfmt_text_tokens(m, d, dn, false, &dt, &nd, e) < 0) {
        free(qt);
        return -1;
    }
    const lms_tokenizer *t = m->tok;
    const bool wpm = !strcmp(lms_tokenizer_model(t), "bert");
    const int32_t bos = lms_tokenizer_add_bos(t) ? lms_tokenizer_bos(t) : -1;
    const int32_t eos = lms_tokenizer_add_eos(t) ? lms_tokenizer_eos(t) : -1;
    int32_t *v = malloc(((size_t)nq + (size_t)nd + 3) * sizeof *v);
    int32_t n = 0;
    if (v) {
        if (bos >= 0)
            v[n++] = bos;
        memcpy(v + n, qt, (size_t)nq * sizeof *v);
        n += nq;
        if (eos >= 0)
            v[n++] = eos;
        memcpy(v + n, dt, (size_t)nd * sizeof *v);
        n += nd;
        if (eos >= 0 && !wpm)
            v[n++] = eos;
    }
    free(qt);
    free(dt);
    if (!v)
        return reqerr_set(e, 503, NULL, "out of memory");
    *out = v;
    *n_out = n;
    return 0;
}

/* s with every pat replaced by rep (rn bytes), into b. */
static int replace_all(sbuf *b, const char *s, const char *pat, const char *rep, size_t rn)
{
    const size_t pn = strlen(pat);
    int rc = 0;
    for (const char *p; rc == 0 && (p = strstr(s, pat)); s = p + pn)
        rc = sbuf_add(b, s, (size_t)(p - s)) < 0 || sbuf_add(b, rep, rn) < 0 ? -1 : 0;
    return rc == 0 && sbuf_adds(b, s) == 0 ? 0 : -1;
}

/* A decoder reranker's prompt (Qwen3-Reranker): its "rerank" template
 * (tokenizer.chat_template.rerank) with every {query} replaced by the
 * query, then every {document} by the document, as llama-server fills it,
 * tokenized with the template's special tokens and nothing added. A
 * reranker without that template: pair_tokens. */
static int rerank_tokens(const lms_model *m, const char *q, size_t qn, const char *d, size_t dn,
                         int32_t **out, int32_t *n_out, reqerr *e)
{
    const char *tpl = NULL;
    if (m->hp.is_encoder || gguf_get_str(m->gguf, "tokenizer.chat_template.rerank", &tpl) < 0 ||
        !tpl || !tpl[0])
        return pair_tokens(m, q, qn, d, dn, out, n_out, e);
    sbuf a = {0}, b = {0};
    int rc = replace_all(&a, tpl, "{query}", q, qn);
    if (rc == 0)
        rc = replace_all(&b, a.p ? a.p : "", "{document}", d, dn);
    rc = rc < 0 ? reqerr_set(e, 503, NULL, "out of memory")
                : chatfmt_special_tokens(m, b.p ? b.p : "", b.n, out, n_out, e);
    sbuf_free(&a);
    sbuf_free(&b);
    return rc;
}

/* Reads query, documents (or TEI's texts), top_n and return_documents (TEI:
 * return_text) into j; the documents' array in *docs. */
static int rerank_args(const json_t *body, embd_job *j, const char **q, size_t *qn, reqerr *e)
{
    const json_t *query = json_object_get(body, "query");
    if (!json_is_string(query) || json_string_length(query) == 0)
        return reqerr_set(e, 400, "query", "'query' must be a non-empty string");
    *q = json_string_value(query);
    *qn = json_string_length(query);
    const char *key = j->shape == EMBD_TEI ? "texts" : "documents";
    const json_t *docs = json_object_get(body, key);
    if (!json_is_array(docs) || json_array_size(docs) == 0)
        return reqerr_set(e, 400, key, "'%s' must be a non-empty array of strings", key);
    if (json_array_size(docs) > MAX_INPUTS)
        return reqerr_set(e, 400, key, "at most %d documents per request", MAX_INPUTS);
    size_t k;
    const json_t *d;
    json_array_foreach(docs, k, d)
    {
        size_t n;
        if (!doc_text(d, &n))
            return reqerr_set(e, 400, key, "%s[%zu] must be a string%s", key, k,
                              j->shape == EMBD_TEI ? "" : " or an object with a \"text\" string");
    }
    j->docs = json_incref((json_t *)docs);
    int64_t top = json_array_size(docs);
    if (reqparse_int(body, "top_n", 1, INT32_MAX, &top, e) < 0)
        return -1;
    j->top_n = (int)(top < (int64_t)json_array_size(docs) ? top : (int64_t)json_array_size(docs));
    return reqparse_bool(body, j->shape == EMBD_TEI ? "return_text" : "return_documents",
                         &j->with_text, e) < 0 ? -1 : 0;
}

/* POST /v1/rerank, /rerank, /v1/reranking, /reranking: a reranker model
 * (pooling_type rank) scores each document against the query, one
 * scheduler task per document. */
int api_rerank(conn *c, json_t *body)
{
    reqerr e;
    const int shape = json_object_get(body, "texts") && !json_object_get(body, "documents")
                          ? EMBD_TEI
                          : EMBD_RERANK;
    int picked = pick_expert(c, body, api_rerank, &e);
    if (picked <= 0)
        return picked < 0 ? reply_err(c, shape, &e) : 0;
    const lms_model *m = c->x->model;
    if (c->x->remote || !m || m->hp.pooling != LMS_POOLING_RANK) {
        reqerr_set(&e, 400, "model", "model '%s' is not a reranker (a model whose "
                   "pooling_type is rank, with its classification head)", c->x->cfg->id);
        return reply_err(c, shape, &e);
    }
    embd_job *j = job_new(0, m->hp.n_cls_out);
    if (!j) {
        reqerr_set(&e, 503, NULL, "out of memory");
        return reply_err(c, shape, &e);
    }
    j->shape = shape;
    j->x = c->x;
    j->t0 = lms_now_ms();
    const char *q = NULL;
    size_t qn = 0;
    int rc = rerank_args(body, j, &q, &qn, &e);
    const int n = rc == 0 ? (int)json_array_size(j->docs) : 0;
    if (rc == 0 && job_size(j, n) < 0)
        rc = reqerr_set(&e, 503, NULL, "out of memory");
    task *first = c->tasks;
    for (int k = 0; k < n && rc == 0; k++) {
        size_t dn;
        const char *d = doc_text(json_array_get(j->docs, (size_t)k), &dn);
        int32_t *toks = NULL, nt = 0;
        if (rerank_tokens(m, q, qn, d, dn, &toks, &nt, &e) < 0 ||
            (c->x->sched && check_encoder_len(c, (size_t)k, nt, &e) < 0)) {
            free(toks);
            rc = -1;
            break;
        }
        lms_request r = {.tokens = toks, .n_tokens = nt, .sp = lms_sampler_defaults(),
                         .embedding = true, .pooling = LMS_POOL_RANK};
        j->refs++;
        task *t = task_submit(c, &r, &embd_ops, j, &e);
        free(toks);
        if (!t) {
            j->refs--;
            rc = -1;
            break;
        }
        j->ids[k] = t->id;
    }
    if (rc < 0)
        while (c->tasks && c->tasks != first)
            task_cancel(c->tasks);
    job_unref(j);
    return rc < 0 ? reply_err(c, shape, &e) : 0;
}
