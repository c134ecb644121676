/*
 * sched.c - continuous batching for one model (see sched.h for the
 * lifecycle and the threading contract).
 *
 * One step:
 *   1. apply aborts and deadlines (blocks freed at once);
 *   2. admit queued requests while a sequence slot and KV blocks for their
 *      whole budget (prompt + max_tokens, capped by n_ctx) are free; the
 *      prompt's full blocks already in the prefix cache are mapped, not
 *      computed;
 *   3. batch one decode token of every decoding sequence (and, with
 *      speculative decoding, the proposals after it: propose), then
 *      prompt chunks of prefilling ones, within n_batch tokens;
 *   4. one forward pass; sample, stream, finish; newly full blocks are
 *      registered in the prefix cache (prompt and generated tokens alike,
 *      so the next turn of a chat reuses this one's answer).
 *
 * Reserving the whole budget at admission means a running sequence never
 * meets an exhausted pool; requests wait in the queue instead. Speculative
 * rows stay inside that reservation, and a rejected proposal's K/V are cut
 * off (kv.n_pos = n_past) before sweep registers full blocks, so only
 * blocks of taken tokens enter the prefix cache.
 */
#include "engine/sched.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/err.h"
#include "base/timeutil.h"
#include "engine/constrain.h"
#include "engine/encoder.h"
#include "engine/forward.h"
#include "engine/gbnf.h"
#include "engine/jsonschema.h"
#include "kernels/kernels.h"
#include "model/markers.h"
#include "model/tokenizer.h"
#include "ops/fault.h"
#include "ops/log.h"

enum { ST_QUEUED, ST_PREFILL, ST_DECODE };

typedef struct sreq {
    struct sreq *next;       /* queue link */
    uint64_t id;
    lms_request r;           /* copy; r.tokens and r.stop point into owned memory */
    int32_t *tokens;         /* prompt then generated tokens [cap] */
    int32_t n_tokens, cap;
    int32_t n_prompt;
    int32_t n_total;         /* positions reserved (prompt + output budget) */
    char *stops[LMS_MAX_STOP];
    int state;
    bool abort;
    lms_kv_seq kv;
    lms_lora_set lora;       /* its adapters, one reference held on each */
    int32_t n_past;          /* positions computed */
    int32_t n_cached;
    int32_t n_registered;    /* full blocks registered in the prefix cache */
    uint64_t last_hash;
    lms_sampler *smp;
    lms_detok detok;
    lms_stopstr stop;
    char *piece;             /* detokenizer output buffer */
    size_t piece_cap;
    int32_t n_gen;
    double t_submit, t_sched, t_first;
    float *embd;             /* pooled embedding accumulator [n_embd] */
    int32_t n_embd_rows;
    lms_jschema *schema;     /* JSON mode: the request's schema (a copy), or NULL */
    lms_gbnf *grammar;       /* GBNF mode: the request's grammar (a copy), or NULL */
    lms_constraint *cons;    /* JSON or GBNF mode: the text so far, checked (constrain.h) */
    const char *done;        /* finish reason once decided this step */
    /* speculative decoding (spec.h) */
    int32_t spec_max, spec_min; /* this request's proposals a step (spec_max 0: none) */
    float spec_pmin;
    int32_t *prop;           /* [spec_max] this step's proposals */
    int32_t n_prop;
    bool spec_live;          /* this step: every draw so far took its proposal */
    lms_draft_seq ds;        /* its state in the draft model's context */
    int32_t n_drafted, n_accepted;
    lms_event *final;        /* the terminal event, allocated at submit so
                              * that it can always be sent */
    /* reasoning budget (lms_request.think_close) */
    int think;               /* THINK_*: where the reply is */
    int32_t think_n;         /* tokens drawn in the thoughts */
    char think_text[16];     /* the last bytes of the reply (the tags), NUL-ended */
    int32_t *force;          /* think_close, copied; NULL: no budget */
    int32_t n_force, i_force; /* forcing while i_force < n_force (i_force: the next) */
} sreq;

enum { THINK_START, THINK_IN, THINK_OUT, THINK_FORCING };

#define LMS_MAX_MARKERS 24

struct lms_sched {
    lms_model *m;
    lms_ctx *ctx;
    lms_sched_params p;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_cond_t hang_cv;  /* the test-only hang waits here */
    bool stop;
    bool abandoned;          /* the owner gave up on this scheduler */
    lms_watchdog_comp *wdc;
    lms_encoder *enc;        /* an embedding model's (bert): requests go to encode_next */
    int enc_batch;           /* requests an encoder pass takes at most (ENC_BATCH;
                              * LMS_ENC_BATCH=N for A/B timings) */
    /* protected by mu */
    sreq *q_head, *q_tail;
    int32_t n_queued;
    uint64_t *aborts;
    int32_t n_aborts, cap_aborts;
    lms_sched_stats st;
    /* scheduler thread only */
    sreq **run;              /* [n_parallel] */
    int32_t n_run;
    int32_t *b_tok, *b_pos;  /* batch rows [n_batch] */
    lms_kv_seq **b_seq;
    const lms_lora_set **b_lora; /* each row's adapters (NULL: none) */
    bool *b_lg, *b_embd;
    sreq **b_owner;
    float *logits;           /* [n_parallel][n_vocab] */
    sreq **lg_owner;         /* [n_parallel] the request of each logits row */
    int32_t *lg_tok;         /* [n_parallel] its sampled token */
    float *lg_prob;          /* [n_parallel] and that token's probability */
    bool *lg_plp;            /* [lg_cap] the row is a prompt log-probability, not a draw */
    bool *lg_spec;           /* [lg_cap] the row is a proposal's, drawn in order after the
                              * draws before it */
    int32_t lg_base;         /* logits rows of the draws: n_parallel, times 1 + spec.n_max
                              * with speculation */
    int32_t lg_cap;          /* logits rows: lg_base, + PLP_ROWS once a request has
                              * prompt_logprobs */
    int32_t *b_spec;         /* [n_batch] 0, or j for the row of proposal j - 1 */
    lms_drafter *drafter;    /* the draft model (LMS_SPEC_DRAFT) */
    lms_draft_job *jobs;     /* [n_parallel] a step's draft jobs */
    sreq **job_owner;        /* [n_parallel] */
    int32_t markers[LMS_MAX_MARKERS]; /* control tokens whose text the replies keep (marker_ids) */
    int n_markers;
    lms_toktexts *tt;        /* every token's text, made at the first JSON or grammar
                              * request (constrain.h); scheduler thread */
};

/* ---- events -------------------------------------------------------------- */

void lms_event_free(lms_event *ev)
{
    if (!ev)
        return;
    free(ev->text);
    free(ev->embd);
    free(ev);
}

static lms_event *new_event(const sreq *q, int type)
{
    lms_event *ev = calloc(1, sizeof *ev);
    if (ev) {
        ev->type = type;
        ev->id = q->id;
        ev->user = q->r.user;
        ev->token = -1;
    }
    return ev;
}

static void stats_of(const sreq *q, const char *finish, lms_req_stats *st)
{
    double now = lms_now_ms();
    st->n_prompt = q->n_prompt;
    st->n_cached = q->n_cached;
    st->n_gen = q->n_gen;
    st->queue_ms = q->t_sched > 0 ? q->t_sched - q->t_submit : now - q->t_submit;
    st->ttft_ms = q->t_first > 0 ? q->t_first - q->t_submit : 0;
    st->total_ms = now - q->t_submit;
    st->tps = q->n_gen > 1 && now > q->t_first ? (q->n_gen - 1) * 1000.0 / (now - q->t_first) : 0;
    st->finish = finish;
    st->stop_word = q->stop.hit;
    st->stop_index = q->stop.hit ? q->stop.hit_index : -1;
    st->n_think = q->think_n;
    st->n_drafted = q->n_drafted;
    st->n_accepted = q->n_accepted;
}

/* ---- request memory ------------------------------------------------------ */

static void sreq_free(lms_sched *s, sreq *q)
{
    lms_event_free(q->final);
    lms_draft_seq_release(s->drafter, &q->ds);
    free(q->prop);
    lms_kv_seq_release(lms_ctx_kv(s->ctx), &q->kv);
    for (int32_t i = 0; i < q->lora.n; i++)
        lms_lora_release(q->lora.use[i].lora);
    lms_sampler_destroy(q->smp);
    lms_stopstr_deinit(&q->stop);
    free(q->force);
    for (int i = 0; i < LMS_MAX_STOP; i++)
        free(q->stops[i]);
    free(q->tokens);
    free(q->piece);
    free(q->embd);
    lms_constraint_destroy(q->cons);
    free(q->schema);
    free(q->grammar);
    free(q);
}

/* Sends the terminal event and frees the request. */
static void finish(lms_sched *s, sreq *q, const char *reason, int err, const char *msg)
{
    lms_event *ev = q->final;
    q->final = NULL;
    ev->type = err ? LMS_EV_ERROR : LMS_EV_END;
    ev->id = q->id;
    ev->user = q->r.user;
    ev->token = -1;
    {
        stats_of(q, reason, &ev->stats);
        ev->err = err;
        if (msg)
            snprintf(ev->message, sizeof ev->message, "%s", msg);
    }
    pthread_mutex_lock(&s->mu);
    if (err)
        s->st.n_failed++;
    else if (!strcmp(reason, "abort") || !strcmp(reason, "deadline"))
        s->st.n_aborted++;
    else
        s->st.n_requests++;
    if (!err && q->n_gen > 0) {
        s->st.last_tps = ev->stats.tps;
        s->st.last_ttft_ms = ev->stats.ttft_ms;
    }
    pthread_mutex_unlock(&s->mu);
    lms_event_fn cb = q->r.cb;
    void *user = q->r.user;
    sreq_free(s, q);
    cb(user, ev);
}

/* ---- submit / abort (any thread) -------------------------------------------- */

/* Request ids are unique in the process, across schedulers: a restarted
 * engine never reuses the id of a request that is still being reported. */
static uint64_t g_next_id;

/* ---- embedding models (bert): whole inputs, several a pass, engine/encoder.c ---- */

#define ENC_BATCH 64 /* requests an encoder pass takes at most */

static int check_encoder_request(const lms_sched *s, const lms_request *r, char *err,
                                 size_t errsz)
{
    const int32_t n_max = lms_encoder_max_tokens(s->enc);
    if (!r->embedding)
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                        "model '%s' is an embedding model (%s): it computes embeddings only "
                        "(/v1/embeddings, /api/embed), not text", s->m->name, s->m->hp.arch);
    if (r->n_tokens > n_max)
        return lms_errf(err, errsz, LMS_ERR_LIMIT,
                        "the input has %d tokens; model '%s' takes at most %d (its context)",
                        r->n_tokens, s->m->name, n_max);
    return 0;
}

/* Takes the queued requests (oldest first, up to ENC_BATCH of them and the
 * model's context in tokens) and encodes them in one pass: each its
 * embedding event, then its end. They are in run[] meanwhile, so that an
 * abandon sees them. */
static void encode_next(lms_sched *s)
{
    const int32_t n_max = lms_encoder_max_tokens(s->enc), n_out = lms_encoder_n_out(s->enc);
    sreq *take[ENC_BATCH];
    int n = 0;
    int64_t n_tok = 0;
    pthread_mutex_lock(&s->mu);
    while (s->q_head && n < s->enc_batch && n_tok + s->q_head->n_prompt <= n_max) {
        sreq *q = s->q_head;
        s->q_head = q->next;
        if (!s->q_head)
            s->q_tail = NULL;
        s->n_queued--;
        q->next = NULL;
        n_tok += q->n_prompt;
        take[n++] = q;
    }
    pthread_mutex_unlock(&s->mu);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (take[i]->abort) {
            finish(s, take[i], "abort", 0, NULL);
            continue;
        }
        take[i]->t_sched = lms_now_ms();
        take[m++] = take[i];
    }
    if (m == 0)
        return;
    int32_t *toks = malloc((size_t)n_tok * sizeof *toks), lens[ENC_BATCH];
    float *v = malloc((size_t)m * (size_t)n_out * sizeof *v);
    char msg[256] = "out of memory";
    int rc = toks && v ? 0 : LMS_ERR_NOMEM;
    for (int i = 0, at = 0; i < m && rc == 0; at += lens[i++]) {
        lens[i] = take[i]->n_prompt;
        memcpy(toks + at, take[i]->tokens, (size_t)lens[i] * sizeof *toks);
    }
    for (int i = 0; i < m; i++)
        s->run[s->n_run++] = take[i];
    if (rc == 0)
        rc = lms_encode_batch(s->enc, toks, lens, m, v, msg, sizeof msg);
    free(toks);
    if (s->abandoned) {
        free(v);
        return;
    }
    s->n_run -= m; /* they are the only ones */
    for (int i = 0; i < m; i++) {
        sreq *q = take[i];
        lms_event *ev = rc < 0 ? NULL : new_event(q, LMS_EV_EMBD);
        float *mine = ev ? malloc((size_t)n_out * sizeof *mine) : NULL;
        if (!mine) {
            lms_event_free(ev);
            finish(s, q, "error", rc < 0 ? rc : LMS_ERR_NOMEM, msg);
            continue;
        }
        memcpy(mine, v + (size_t)i * n_out, (size_t)n_out * sizeof *mine);
        q->t_first = lms_now_ms();
        ev->embd = mine;
        ev->n_embd = n_out; /* a reranker's: its scores */
        q->r.cb(q->r.user, ev);
        finish(s, q, "stop", 0, NULL);
    }
    free(v);
}

static int check_request(const lms_sched *s, const lms_request *r, char *err, size_t errsz)
{
    const int32_t n_vocab = s->m->hp.n_vocab;
    if (!r->cb)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "request has no event callback");
    if (r->n_tokens <= 0)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "the prompt is empty");
    if (s->enc)
        return check_encoder_request(s, r, err, errsz);
    if (r->n_tokens >= s->p.n_ctx)
        return lms_errf(err, errsz, LMS_ERR_LIMIT,
                        "the prompt has %d tokens; the context holds %d (prompt + output)",
                        r->n_tokens, s->p.n_ctx);
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= n_vocab)
            return lms_errf(err, errsz, LMS_ERR_RANGE, "token id %d at position %d is not in [0, %d)",
                            r->tokens[i], i, n_vocab);
    if (r->n_stop < 0 || r->n_stop > LMS_MAX_STOP)
        return lms_errf(err, errsz, LMS_ERR_LIMIT, "at most %d stop strings", LMS_MAX_STOP);
    if (r->grammar && (r->json || r->schema))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "a grammar and JSON mode cannot be used together");
    if (r->grammar) {
        lms_gbnf_chk *c = malloc(sizeof *c);
        const bool ok = c && lms_gbnf_init(c, r->grammar);
        free(c);
        if (!ok)
            return lms_errf(err, errsz, LMS_ERR_LIMIT,
                            "the grammar is too ambiguous at its start (more than %d ways "
                            "to read the text, or too much work to find them)",
                            LMS_GBNF_STACKS);
    }
    if (r->n_logprobs < 0 || r->n_logprobs > LMS_MAX_LOGPROBS)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "logprobs must be in [0, %d]", LMS_MAX_LOGPROBS);
    if (r->think_close && (r->n_think_close < 1 || r->n_think_close > 64 || r->think_budget < 0))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "the reasoning budget needs 1 to 64 closing "
                        "tokens and a budget >= 0");
    for (int32_t i = 0; r->think_close && i < r->n_think_close; i++)
        if (r->think_close[i] < 0 || r->think_close[i] >= n_vocab)
            return lms_errf(err, errsz, LMS_ERR_RANGE, "closing token id %d is not in [0, %d)",
                            r->think_close[i], n_vocab);
    if (r->n_loras < 0 || r->n_loras > LMS_LORA_MAX || (r->n_loras > 0 && !r->loras))
        return lms_errf(err, errsz, LMS_ERR_LIMIT, "at most %d LoRA adapters per request",
                        LMS_LORA_MAX);
    for (int i = 0; i < r->n_loras; i++) {
        int rc;
        if (!r->loras[i].lora)
            return lms_errf(err, errsz, LMS_ERR_INVAL, "LoRA adapter %d is NULL", i);
        if ((rc = lms_lora_check(r->loras[i].lora, s->m, err, errsz)) < 0)
            return rc;
    }
    if (r->embedding && (r->pooling < LMS_POOL_MEAN || r->pooling > LMS_POOL_RANK))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "pooling %d is not one of enum lms_pooling",
                        r->pooling);
    if (r->embedding && r->pooling == LMS_POOL_RANK && s->m->hp.pooling != LMS_POOLING_RANK)
        return lms_errf(err, errsz, LMS_ERR_INVAL,
                        "model '%s' is not a reranker: it has no classification head",
                        s->m->name);
    if (r->embedding)
        return 0;
    if (!(r->spec_p_min <= 1))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "speculative p_min %g is more than 1",
                        r->spec_p_min);
    if (r->max_tokens == 0 && !r->prompt_logprobs)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "max_tokens must be at least 1");
    for (int32_t i = 0; i < r->sp.n_bias && i < LMS_MAX_LOGIT_BIAS; i++)
        if (r->sp.bias[i].id >= n_vocab)
            return lms_errf(err, errsz, LMS_ERR_RANGE, "logit_bias names token %d; the vocabulary "
                            "has %d", r->sp.bias[i].id, n_vocab);
    return lms_sampler_params_check(&r->sp, err, errsz);
}

/* set: the request's adapters (lms_lora_set_make); q takes a reference
 * to each once it exists. */
static sreq *sreq_new(const lms_sched *s, const lms_request *r, const lms_lora_set *set)
{
    sreq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->r = *r;
    q->r.loras = NULL; /* the caller's array: q->lora is the copy */
    q->r.n_loras = 0;
    int64_t budget = r->max_tokens < 0 ? s->p.n_ctx : (int64_t)r->n_tokens + r->max_tokens;
    q->n_total = r->embedding ? r->n_tokens : (int32_t)(budget < s->p.n_ctx ? budget : s->p.n_ctx);
    q->n_prompt = r->n_tokens;
    q->cap = q->n_total + 1;
    q->tokens = malloc((size_t)q->cap * sizeof *q->tokens);
    q->final = calloc(1, sizeof *q->final);
    bool ok = q->tokens != NULL && q->final != NULL;
    if (ok && r->schema) {
        const size_t n = lms_jschema_size(r->schema);
        ok = (q->schema = malloc(n)) != NULL;
        if (ok)
            memcpy(q->schema, r->schema, n);
        q->r.json = true;
    }
    q->r.schema = q->schema;
    if (ok && r->grammar && !r->json && !r->schema) {
        const size_t n = lms_gbnf_size(r->grammar);
        ok = (q->grammar = malloc(n)) != NULL;
        if (ok)
            memcpy(q->grammar, r->grammar, n);
    }
    q->r.grammar = q->grammar;
    if (ok && r->think_close && r->n_think_close > 0 && !q->r.json && !q->grammar) {
        ok = (q->force = malloc((size_t)r->n_think_close * sizeof *q->force)) != NULL;
        if (ok)
            memcpy(q->force, r->think_close, (size_t)r->n_think_close * sizeof *q->force);
        q->n_force = r->n_think_close;
    }
    q->think = r->embedding ? THINK_OUT : r->think_open ? THINK_IN : THINK_START;
    if (q->force && q->think == THINK_IN && r->think_budget == 0)
        q->think = THINK_FORCING; /* no thoughts at all: closed at once */
    q->r.think_close = q->force;
    for (int i = 0; i < r->n_stop && ok; i++)
        ok = (q->stops[i] = strdup(r->stop[i])) != NULL;
    if (!ok) {
        for (int i = 0; i < LMS_MAX_STOP; i++)
            free(q->stops[i]);
        free(q->tokens);
        free(q->final);
        free(q->schema);
        free(q->grammar);
        free(q->force);
        free(q);
        return NULL;
    }
    memcpy(q->tokens, r->tokens, (size_t)r->n_tokens * sizeof *q->tokens);
    q->lora = *set;
    for (int32_t i = 0; i < q->lora.n; i++)
        lms_lora_retain(q->lora.use[i].lora);
    q->n_tokens = r->n_tokens;
    q->r.tokens = q->tokens;
    q->r.stop = (const char *const *)q->stops;
    q->t_submit = lms_now_ms();
    return q;
}

int lms_sched_submit(lms_sched *s, const lms_request *r, uint64_t *id, char *err, size_t errsz)
{
    int rc = check_request(s, r, err, errsz);
    if (rc < 0)
        return rc;
    int32_t blocks = (int32_t)((r->n_tokens + (int64_t)(r->max_tokens < 0 ? s->p.n_ctx : r->max_tokens) +
                                LMS_KV_BLOCK - 1) / LMS_KV_BLOCK);
    int32_t ctx_blocks = (s->p.n_ctx + LMS_KV_BLOCK - 1) / LMS_KV_BLOCK;
    if ((blocks < ctx_blocks ? blocks : ctx_blocks) > lms_ctx_kv(s->ctx)->n_blocks)
        return lms_errf(err, errsz, LMS_ERR_LIMIT, "the request needs more KV cache than the pool has");
    lms_lora_set set;
    if ((rc = lms_lora_set_make(&set, r->loras, r->n_loras, err, errsz)) < 0)
        return rc;
    sreq *q = sreq_new(s, r, &set);
    if (!q)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    pthread_mutex_lock(&s->mu);
    if (s->n_queued >= s->p.max_queue || s->stop) {
        pthread_mutex_unlock(&s->mu);
        sreq_free(s, q);
        return lms_errf(err, errsz, LMS_ERR_BUSY, "the server is overloaded: %d requests queued",
                        s->p.max_queue);
    }
    q->id = __atomic_add_fetch(&g_next_id, 1, __ATOMIC_RELAXED);
    if (s->q_tail)
        s->q_tail->next = q;
    else
        s->q_head = q;
    s->q_tail = q;
    s->n_queued++;
    *id = q->id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void lms_sched_abort(lms_sched *s, uint64_t id)
{
    pthread_mutex_lock(&s->mu);
    for (sreq *q = s->q_head; q; q = q->next)
        if (q->id == id)
            q->abort = true;
    if (s->n_aborts == s->cap_aborts) {
        int32_t cap = s->cap_aborts ? s->cap_aborts * 2 : 16;
        uint64_t *na = realloc(s->aborts, (size_t)cap * sizeof *na);
        if (na) {
            s->aborts = na;
            s->cap_aborts = cap;
        }
    }
    if (s->n_aborts < s->cap_aborts)
        s->aborts[s->n_aborts++] = id;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- step pieces (scheduler thread) ------------------------------------------- */

static void remove_running(lms_sched *s, int32_t i)
{
    s->run[i] = s->run[--s->n_run];
}

/* Marks aborted running requests and ends them with expired deadlines. */
static void apply_aborts(lms_sched *s)
{
    pthread_mutex_lock(&s->mu);
    for (int32_t a = 0; a < s->n_aborts; a++)
        for (int32_t i = 0; i < s->n_run; i++)
            if (s->run[i]->id == s->aborts[a])
                s->run[i]->abort = true;
    s->n_aborts = 0;
    pthread_mutex_unlock(&s->mu);
    double now = lms_now_ms();
    for (int32_t i = s->n_run - 1; i >= 0; i--) {
        sreq *q = s->run[i];
        bool late = q->r.timeout_ms > 0 && now - q->t_submit > q->r.timeout_ms;
        if (q->abort || late) {
            remove_running(s, i);
            finish(s, q, q->abort ? "abort" : "deadline", 0, NULL);
        }
    }
}

/* ---- JSON and GBNF modes (constrain.h) --------------------------------------- */

/* Whether the output is held to a JSON object or a grammar. */
static bool constrained(const sreq *q)
{
    return q->r.json || q->grammar;
}

/* The next token of q from its logits row; -1 when its JSON or grammar
 * allows none. */
static int32_t sample_row(sreq *q, const float *logits, float *prob)
{
    if (q->think == THINK_FORCING) { /* the reasoning budget is spent: its closing tokens */
        *prob = 1.0f;
        return q->force[q->i_force];
    }
    return q->cons ? lms_constraint_sample(q->cons, q->smp, logits, prob)
                   : lms_sampler_sample(q->smp, logits, prob);
}

/* ---- prompt log-probabilities ---------------------------------------------- */

/* Rows of prompt log-probabilities a step computes at most (their logits
 * rows come on top of the n_parallel that draws need). */
#define PLP_ROWS 32

static bool is_plp_row(const sreq *q, int32_t pos)
{
    return q->r.prompt_logprobs && pos < q->n_prompt - 1;
}

/* Room for PLP_ROWS more logits rows, made at the first request that asks. */
static int grow_logits(lms_sched *s)
{
    const int32_t cap = s->lg_base + PLP_ROWS;
    if (s->lg_cap >= cap)
        return 0;
    const size_t nv = (size_t)s->m->hp.n_vocab;
    /* page-locked on a GPU context (lms_ctx_host_alloc): no realloc */
    float *lg = lms_ctx_host_alloc(s->ctx, (size_t)cap * nv * sizeof *lg);
    if (lg) {
        memcpy(lg, s->logits, (size_t)s->lg_cap * nv * sizeof *lg);
        lms_host_free(s->logits);
        s->logits = lg;
    }
    sreq **ow = realloc(s->lg_owner, (size_t)cap * sizeof *ow);
    if (ow)
        s->lg_owner = ow;
    int32_t *tk = realloc(s->lg_tok, (size_t)cap * sizeof *tk);
    if (tk)
        s->lg_tok = tk;
    float *pr = realloc(s->lg_prob, (size_t)cap * sizeof *pr);
    if (pr)
        s->lg_prob = pr;
    bool *pl = realloc(s->lg_plp, (size_t)cap * sizeof *pl);
    if (pl)
        s->lg_plp = pl;
    bool *sp = realloc(s->lg_spec, (size_t)cap * sizeof *sp);
    if (sp)
        s->lg_spec = sp;
    if (!lg || !ow || !tk || !pr || !pl || !sp)
        return LMS_ERR_NOMEM;
    s->lg_cap = cap;
    return 0;
}

/* Sends prompt token pos + 1's log-probability from the logits of row pos
 * (log-softmax; the n_logprobs most likely tokens as alternatives). */
static void emit_prompt_logprob(const lms_sched *s, sreq *q, const float *row, int32_t pos)
{
    lms_event *ev = new_event(q, LMS_EV_PROMPT);
    if (!ev)
        return;
    const int32_t nv = s->m->hp.n_vocab, tok = q->tokens[pos + 1];
    float mx = -INFINITY;
    for (int32_t i = 0; i < nv; i++)
        mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < nv; i++)
        sum += exp((double)(row[i] - mx));
    const float lse = mx + (float)log(sum);
    ev->token = tok;
    ev->logprob = row[tok] - lse;
    ev->prob = expf(ev->logprob);
    const int n = q->r.n_logprobs;
    for (int32_t i = 0; i < nv && n > 0; i++) { /* insertion into the sorted top n */
        if (ev->n_top == n && row[i] - lse <= ev->top[n - 1].logprob)
            continue;
        int k = ev->n_top < n ? ev->n_top++ : n - 1;
        while (k > 0 && ev->top[k - 1].logprob < row[i] - lse) {
            ev->top[k] = ev->top[k - 1];
            k--;
        }
        ev->top[k] = (lms_token_prob){i, row[i] - lse};
    }
    q->r.cb(q->r.user, ev);
}

/* ---- admission --------------------------------------------------------------- */

/* Sets up the per-sequence generation state of an admitted request. */
static int start_request(lms_sched *s, sreq *q)
{
    const lms_tokenizer *tok = s->m->tok;
    if (q->r.embedding) {
        q->embd = calloc((size_t)s->m->hp.n_embd, sizeof *q->embd);
        return q->embd ? 0 : LMS_ERR_NOMEM;
    }
    q->smp = lms_sampler_create(&q->r.sp, s->m->hp.n_vocab);
    q->piece_cap = lms_detok_max_out(tok);
    q->piece = malloc(q->piece_cap);
    if (!q->smp || !q->piece)
        return LMS_ERR_NOMEM;
    for (int32_t i = 0; i < q->n_prompt; i++)
        lms_sampler_accept(q->smp, q->tokens[i]);
    if (q->r.prompt_logprobs && grow_logits(s) < 0)
        return LMS_ERR_NOMEM;
    const lms_spec_params *sp = &s->p.spec;
    if (sp->mode != LMS_SPEC_NONE && q->r.spec_n_max >= 0) {
        q->spec_max = q->r.spec_n_max > 0 && q->r.spec_n_max < sp->n_max ? q->r.spec_n_max : sp->n_max;
        q->spec_min = q->r.spec_n_min == 0 ? sp->n_min : q->r.spec_n_min < 0 ? 0 : q->r.spec_n_min;
        q->spec_pmin = q->r.spec_p_min == 0 ? sp->p_min : q->r.spec_p_min < 0 ? 0 : q->r.spec_p_min;
        if (!(q->prop = malloc((size_t)q->spec_max * sizeof *q->prop)))
            return LMS_ERR_NOMEM;
    }
    if (constrained(q)) {
        if (!s->tt && !(s->tt = lms_toktexts_create(s->m->tok)))
            return LMS_ERR_NOMEM;
        if (!(q->cons = lms_constraint_create(s->tt, q->schema, q->grammar)))
            return LMS_ERR_NOMEM;
    }
    lms_detok_init(&q->detok, tok, false);
    return lms_stopstr_init(&q->stop, q->r.stop, q->r.n_stop);
}

/* Maps cached prefix blocks and reserves the rest; LMS_ERR_LIMIT when the
 * pool cannot hold the request now. */
static int place_request(lms_sched *s, sreq *q)
{
    lms_kv_cache *kv = lms_ctx_kv(s->ctx);
    int32_t mapped = 0;
    if (!s->p.no_prefix_cache && !q->r.embedding && !q->r.prompt_logprobs)
        mapped = lms_kv_prefix_map(kv, &q->kv, q->tokens, (q->n_prompt - 1) / LMS_KV_BLOCK,
                                   q->lora.id);
    int rc = lms_kv_seq_reserve(kv, &q->kv, q->n_total);
    if (rc < 0) {
        lms_kv_seq_release(kv, &q->kv);
        return rc;
    }
    q->n_past = q->n_cached = mapped * LMS_KV_BLOCK;
    q->n_registered = mapped;
    q->last_hash = 0;
    for (int32_t i = 0; i < mapped; i++)
        q->last_hash = lms_kv_block_hash(q->last_hash, q->tokens + i * LMS_KV_BLOCK, q->lora.id);
    q->kv.n_pos = q->n_past;
    pthread_mutex_lock(&s->mu);
    s->st.prefix_queries += (uint64_t)q->n_prompt;
    s->st.prefix_hits += (uint64_t)q->n_cached;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Whether queued q shares full prompt blocks with a request still
 * prefilling, beyond the blocks that one has registered so far: then q
 * waits and maps them from the prefix cache once they are, rather than
 * computing them a second time beside it (a burst of requests with one
 * long system prompt costs about one prefill of it). The wait is short:
 * the other request prefills every step. */
static bool waits_for_prefix(const lms_sched *s, const sreq *q)
{
    if (s->p.no_prefix_cache || q->r.embedding || q->r.prompt_logprobs)
        return false;
    const int32_t mappable = (q->n_prompt - 1) / LMS_KV_BLOCK; /* as place_request */
    for (int32_t i = 0; i < s->n_run; i++) {
        const sreq *o = s->run[i];
        if (o->state != ST_PREFILL || o->r.embedding || o->abort || o->lora.id != q->lora.id)
            continue;
        const int32_t nb = o->n_prompt / LMS_KV_BLOCK < mappable ? o->n_prompt / LMS_KV_BLOCK
                                                                  : mappable;
        if (nb <= o->n_registered)
            continue;
        int32_t same = 0; /* full blocks in common */
        while (same < nb && !memcmp(q->tokens + same * LMS_KV_BLOCK, o->tokens + same * LMS_KV_BLOCK,
                                    LMS_KV_BLOCK * sizeof *q->tokens))
            same++;
        if (same > o->n_registered)
            return true;
    }
    return false;
}

static void admit(lms_sched *s)
{
    while (s->n_run < s->p.n_parallel) {
        pthread_mutex_lock(&s->mu);
        sreq *q = s->q_head;
        pthread_mutex_unlock(&s->mu);
        if (!q)
            return;
        if (!q->abort && waits_for_prefix(s, q))
            return; /* keep FIFO order */
        if (!q->abort && place_request(s, q) == LMS_ERR_LIMIT)
            return; /* wait for blocks; keep FIFO order */
        pthread_mutex_lock(&s->mu);
        s->q_head = q->next;
        if (!s->q_head)
            s->q_tail = NULL;
        s->n_queued--;
        pthread_mutex_unlock(&s->mu);
        q->next = NULL;
        if (q->abort) {
            finish(s, q, "abort", 0, NULL);
            continue;
        }
        q->t_sched = lms_now_ms();
        int rc = start_request(s, q);
        if (rc < 0) {
            finish(s, q, "error", rc, "cannot start the request: out of memory");
            continue;
        }
        q->state = ST_PREFILL;
        s->run[s->n_run++] = q;
    }
}

/* ---- speculative decoding ----------------------------------------------------- */

/* Proposals for the decoding sequences, within what the step's budget
 * leaves after one row for each of them; a sequence gets none when the
 * budget or its reserved positions (prompt + max_tokens) are short, or
 * the draft pool has no room for it: speculation backs off, the request
 * goes on. Rows past the sequence's reservation are never written. */
static void propose(lms_sched *s, int32_t budget)
{
    if (s->p.spec.mode == LMS_SPEC_NONE)
        return;
    const lms_spec_params *sp = &s->p.spec;
    int32_t slack = budget;
    for (int32_t i = 0; i < s->n_run; i++)
        slack -= s->run[i]->state == ST_DECODE;
    int nj = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        sreq *q = s->run[i];
        q->n_prop = 0;
        if (q->state != ST_DECODE || q->spec_max == 0 || q->abort)
            continue;
        int32_t k = q->n_total - q->n_tokens - 1; /* rows up to position n_total - 1 */
        k = k < q->spec_max ? k : q->spec_max;
        k = k < slack ? k : slack;
        if (k < 1 || k < q->spec_min)
            continue;
        if (sp->mode == LMS_SPEC_NGRAM) {
            int32_t n = lms_spec_ngram(q->tokens, q->n_tokens, sp->ngram_max, sp->ngram_min, k,
                                       q->prop);
            q->n_prop = n < q->spec_min ? 0 : n;
            slack -= q->n_prop;
        } else {
            /* the draft pool has as many blocks as the target's, but
             * prefix sharing lets the target hold more sequences: one
             * that finds no room is tried again next step */
            if (lms_draft_seq_reserve(s->drafter, &q->ds, q->n_total) < 0)
                continue;
            s->jobs[nj] = (lms_draft_job){.ds = &q->ds, .tokens = q->tokens, .n_tokens = q->n_tokens,
                                          .k = k, .p_min = q->spec_pmin, .out = q->prop};
            s->job_owner[nj++] = q;
            slack -= k;
        }
    }
    if (nj == 0)
        return;
    int rc = lms_drafter_propose(s->drafter, s->jobs, nj);
    if (rc < 0)
        lms_log(LMS_LOG_WARN, "draft_failed", "model", LMS_LOG_STR(s->m->name), "error",
                LMS_LOG_STR(lms_strerror(rc)));
    for (int j = 0; j < nj; j++) {
        sreq *q = s->job_owner[j];
        q->n_prop = rc < 0 || s->jobs[j].n_out < q->spec_min ? 0 : s->jobs[j].n_out;
    }
}

/* Fills the batch with at most `budget` rows (decodes always fit);
 * returns the number of rows. */
static int32_t build_batch(lms_sched *s, int32_t budget, bool *any_lora)
{
    *any_lora = false;
    int32_t n = 0, plp = 0; /* plp: prompt log-probability rows, at most PLP_ROWS */
    for (int pass = 0; pass < 2; pass++) {
        int32_t cap = pass == 0 ? s->p.n_batch : budget;
        for (int32_t i = 0; i < s->n_run && n < cap; i++) {
            sreq *q = s->run[i];
            if ((pass == 0) != (q->state == ST_DECODE))
                continue;
            int32_t want = q->state == ST_DECODE ? 1 + q->n_prop : q->n_prompt - q->n_past;
            int32_t take = want < cap - n ? want : cap - n;
            if (q->state != ST_DECODE && q->r.prompt_logprobs) {
                int32_t rows = q->n_prompt - 1 - q->n_past; /* of them log-probability rows */
                rows = rows < take ? rows : take;
                if (rows > PLP_ROWS - plp)
                    take = rows = PLP_ROWS - plp;
                plp += rows > 0 ? rows : 0;
            }
            for (int32_t j = 0; j < take; j++, n++) {
                int32_t pos = q->n_past + j;
                const bool prop = q->state == ST_DECODE && j > 0;
                s->b_tok[n] = prop ? q->prop[j - 1] : q->tokens[pos];
                s->b_spec[n] = prop ? j : 0;
                s->b_pos[n] = pos;
                s->b_seq[n] = &q->kv;
                s->b_lora[n] = q->lora.n > 0 ? &q->lora : NULL;
                *any_lora |= q->lora.n > 0;
                s->b_owner[n] = q;
                s->b_embd[n] = q->r.embedding;
                s->b_lg[n] = !q->r.embedding &&
                             ((pos == q->n_tokens - 1 && q->r.max_tokens != 0) || is_plp_row(q, pos) ||
                              prop);
            }
        }
    }
    return n;
}

/* Registers the request's newly full blocks in the prefix cache. */
static void register_blocks(lms_sched *s, sreq *q)
{
    if (s->p.no_prefix_cache || q->r.embedding)
        return;
    lms_kv_cache *kv = lms_ctx_kv(s->ctx);
    while ((q->n_registered + 1) * LMS_KV_BLOCK <= q->n_past) {
        q->last_hash = lms_kv_prefix_register(kv, &q->kv, q->n_registered, q->last_hash, q->tokens,
                                              q->lora.id);
        q->n_registered++;
    }
}

/* ---- markers ------------------------------------------------------------------ */

/* Control tokens that mark a reply's structure: the serve layer reads
 * function calls and thoughts by them (serve/toolcall.h, reasoning.h), so
 * their text stays in the reply although control tokens are otherwise not
 * shown (Mistral's [TOOL_CALLS] [ARGS] [CALL_ID], Llama 3's <|python_tag|>,
 * Granite's <|tool_call|>, DeepSeek's <｜tool▁calls▁begin｜> and the rest
 * of its call markers, Cohere's <|START_ACTION|> <|END_ACTION|> and the
 * plan's <|START_THINKING|> <|END_THINKING|> before them, <think> where a
 * vocabulary makes it a control token). Cohere's <|START_RESPONSE|> and
 * <|END_RESPONSE|> stay unshown: they wrap every answer, tools or not,
 * and the answer is what is inside. Matched by text; at most
 * LMS_MAX_MARKERS in all. */
static void marker_ids(lms_sched *s)
{
    static const char *const texts[] = {
        LMS_MARK_MISTRAL_CALLS, LMS_MARK_MISTRAL_ARGS,  LMS_MARK_MISTRAL_CALL_ID,
        LMS_MARK_PYTHON_TAG,    LMS_MARK_GRANITE_CALL,  LMS_MARK_TOOL_OPEN,
        LMS_MARK_TOOL_CLOSE,    LMS_MARK_THINK_OPEN,    LMS_MARK_THINK_CLOSE,
        LMS_MARK_DS_CALLS_BEGIN, LMS_MARK_DS_CALLS_END, LMS_MARK_DS_CALL_BEGIN,
        LMS_MARK_DS_CALL_END,   LMS_MARK_DS_SEP,        LMS_MARK_COHERE_THINK_OPEN,
        LMS_MARK_COHERE_THINK_CLOSE, LMS_MARK_COHERE_ACTION_OPEN, LMS_MARK_COHERE_ACTION_CLOSE};
    _Static_assert(sizeof texts / sizeof texts[0] <= LMS_MAX_MARKERS, "room for each marker");
    const lms_tokenizer *t = s->m->tok;
    for (int32_t id = 0; id < s->m->hp.n_vocab && s->n_markers < LMS_MAX_MARKERS; id++) {
        if (lms_token_type(t, id) != LMS_TOKEN_TYPE_CONTROL)
            continue;
        const char *x = lms_token_text(t, id);
        for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++)
            if (!strcmp(x, texts[k]))
                s->markers[s->n_markers++] = id;
    }
}

static bool is_marker(const lms_sched *s, int32_t tok)
{
    for (int i = 0; i < s->n_markers; i++)
        if (s->markers[i] == tok)
            return true;
    return false;
}

/* ---- reasoning budget -------------------------------------------------------- */

/* Token tok (its text piece[0, n)) was taken: follows the reply in and out
 * of its thoughts (counting their tokens: lms_req_stats.n_think), and with
 * a reasoning budget starts the closing tokens when it is spent. */
static void think_track(sreq *q, int32_t tok, const char *piece, size_t n)
{
    if (q->think == THINK_OUT)
        return;
    if (q->think == THINK_FORCING) {
        if (tok == q->force[q->i_force] && ++q->i_force == q->n_force)
            q->think = THINK_OUT;
        return;
    }
    /* the last 15 bytes of the reply, for the tags */
    size_t len = strlen(q->think_text);
    for (size_t i = 0; i < n; i++) {
        if (len == sizeof q->think_text - 1) {
            memmove(q->think_text, q->think_text + 1, --len);
        }
        q->think_text[len++] = piece[i];
    }
    q->think_text[len] = 0;
    if (q->think == THINK_START) {
        const char *t = q->think_text;
        while (*t == ' ' || *t == '\n' || *t == '\t' || *t == '\r')
            t++;
        static const char open[] = LMS_MARK_THINK_OPEN;
        const size_t k = strlen(t) < sizeof open - 1 ? strlen(t) : sizeof open - 1;
        if (strncmp(t, open, k) != 0 || q->n_gen > 16)
            q->think = THINK_OUT; /* the reply does not think */
        else if (k == sizeof open - 1)
            q->think = THINK_IN, q->think_text[0] = 0;
        else
            return;
        if (q->think == THINK_OUT)
            return;
    } else if (strstr(q->think_text, LMS_MARK_THINK_CLOSE)) {
        q->think = THINK_OUT;
        return;
    } else {
        q->think_n++;
    }
    if (q->force && q->think_n >= q->r.think_budget)
        q->think = THINK_FORCING, q->i_force = 0;
}

/* Streams a generated token (sampled with probability prob); returns a
 * finish reason or NULL to go on. */
static const char *handle_token(lms_sched *s, sreq *q, int32_t tok, float prob)
{
    lms_event *ev = new_event(q, LMS_EV_TOKEN);
    lms_sampler_accept(q->smp, tok);
    if (q->cons) /* allowed, so it feeds */
        lms_constraint_accept(q->cons, tok);
    if (q->n_gen++ == 0)
        q->t_first = lms_now_ms();
    q->tokens[q->n_tokens++] = tok;
    if (!q->r.ignore_eos && lms_token_is_eog(s->m->tok, tok)) {
        lms_event_free(ev);
        return "stop";
    }
    q->detok.special = is_marker(s, tok);
    int n = lms_detok_push(&q->detok, tok, q->piece, q->piece_cap);
    q->detok.special = false;
    think_track(q, tok, q->piece, n > 0 ? (size_t)n : 0);
    const char *out;
    size_t n_out;
    bool hit = lms_stopstr_feed(&q->stop, q->piece, n > 0 ? (size_t)n : 0, &out, &n_out);
    if (ev && (ev->text = malloc(n_out + 1))) {
        memcpy(ev->text, out, n_out);
        ev->text[n_out] = 0;
        ev->text_len = n_out;
        ev->token = tok;
        ev->prob = prob;
        ev->logprob = prob > 0 ? logf(prob) : -INFINITY;
        ev->n_top = lms_sampler_top(q->smp, ev->top, q->r.n_logprobs);
        q->r.cb(q->r.user, ev);
    } else {
        lms_event_free(ev);
    }
    if (hit)
        return "stop";
    if (q->n_tokens >= q->n_total)
        return "length";
    return NULL;
}

/* Sends the text still held by the detokenizer and the stop matcher. */
static void flush_text(sreq *q)
{
    if (q->r.embedding || q->stop.hit)
        return;
    int n = lms_detok_flush(&q->detok, q->piece, q->piece_cap);
    size_t len;
    char *text = lms_stopstr_finish(&q->stop, q->piece, n > 0 ? (size_t)n : 0, &len);
    lms_event *ev = text && len ? new_event(q, LMS_EV_TOKEN) : NULL;
    if (!ev) {
        free(text);
        return;
    }
    ev->text = text;
    ev->text_len = len;
    q->r.cb(q->r.user, ev);
}

/* A reranker's scores from the last token's state into q->embd (its
 * first n_cls_out floats); false out of memory. */
static bool rank_embedding(const lms_model *m, sreq *q)
{
    const size_t e = (size_t)m->hp.n_embd;
    float *t = malloc(3 * e * sizeof *t);
    void *scratch = aligned_alloc(64, (lms_rank_scratch(m) + 63) / 64 * 64 + 64);
    if (t && scratch) {
        lms_rank_scores(m, q->embd, t + 2 * e, t, t + e, scratch);
        memcpy(q->embd, t + 2 * e, (size_t)m->hp.n_cls_out * sizeof *t);
    }
    const bool ok = t && scratch;
    free(t);
    free(scratch);
    return ok;
}

/* The pooled vector out, of unit length; a reranker's scores instead. */
static void finish_embedding(lms_sched *s, sreq *q)
{
    int32_t n = s->m->hp.n_embd;
    if (q->r.pooling == LMS_POOL_RANK) {
        if (!rank_embedding(s->m, q)) {
            finish(s, q, "error", LMS_ERR_NOMEM, "out of memory for the reranker's head");
            return;
        }
        n = s->m->hp.n_cls_out;
    } else {
        double norm = 0;
        for (int32_t i = 0; i < n; i++) {
            if (q->r.pooling == LMS_POOL_MEAN)
                q->embd[i] /= (float)(q->n_embd_rows > 0 ? q->n_embd_rows : 1);
            norm += (double)q->embd[i] * q->embd[i];
        }
        const float inv = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
        for (int32_t i = 0; i < n; i++)
            q->embd[i] *= inv;
    }
    lms_event *ev = new_event(q, LMS_EV_EMBD);
    if (ev) {
        ev->embd = q->embd;
        ev->n_embd = n;
        q->embd = NULL;
        q->r.cb(q->r.user, ev);
    }
    finish(s, q, "stop", 0, NULL);
}

/* Consumes the forward's outputs for each request in the batch. */
static void after_forward(lms_sched *s, int32_t n_rows)
{
    const int32_t nv = s->m->hp.n_vocab, e = s->m->hp.n_embd;
    const float *hidden = lms_ctx_hidden(s->ctx);
    /* Sampling reads and writes only its own request's sampler: the logits
     * rows are sampled over the OpenMP team (a pass or more over the whole
     * vocabulary each), then the events go out in row order. */
    int32_t n_lg = 0;
    for (int32_t r = 0; r < n_rows; r++)
        if (s->b_lg[r]) {
            s->lg_plp[n_lg] = is_plp_row(s->b_owner[r], s->b_pos[r]);
            s->lg_spec[n_lg] = s->b_spec[r] > 0;
            s->lg_owner[n_lg++] = s->b_owner[r];
        }
#pragma omp parallel for schedule(dynamic, 1) if (n_lg >= 2)
    for (int32_t i = 0; i < n_lg; i++)
        if (!s->lg_plp[i] && !s->lg_spec[i])
            s->lg_tok[i] = sample_row(s->lg_owner[i], s->logits + (size_t)i * nv, &s->lg_prob[i]);
    int32_t lg_row = 0, out_row = 0;
    for (int32_t r = 0; r < n_rows; r++) {
        sreq *q = s->b_owner[r];
        if (s->b_spec[r] > 0) {
            /* proposal j - 1's row: drawn only while every draw before it
             * took its proposal, whose K/V this row then wrote */
            const int32_t j = s->b_spec[r];
            if (q->spec_live) {
                float prob;
                q->n_past = s->b_pos[r] + 1;
                q->n_accepted++;
                const int32_t tok = sample_row(q, s->logits + (size_t)lg_row * nv, &prob);
                q->done = tok < 0 ? "stop" : handle_token(s, q, tok, prob);
                q->spec_live = !q->done && j < q->n_prop && tok == q->prop[j];
            }
            lg_row++;
            out_row++;
            continue;
        }
        q->n_past = s->b_pos[r] + 1;
        if (q->r.prompt_logprobs && q->r.max_tokens == 0 && q->n_past >= q->n_prompt)
            q->done = "length"; /* the prompt's log-probabilities were all it asked */
        if (s->b_embd[r]) {
            const float *h = hidden + (size_t)out_row * e;
            for (int32_t i = 0; i < e; i++)
                q->embd[i] = q->r.pooling == LMS_POOL_MEAN ? q->embd[i] + h[i]
                             : q->r.pooling == LMS_POOL_FIRST && q->n_embd_rows > 0 ? q->embd[i]
                                                                                 : h[i];
            q->n_embd_rows++;
        }
        if (s->b_lg[r] || s->b_embd[r])
            out_row++;
        if (s->b_lg[r] && s->lg_plp[lg_row]) {
            emit_prompt_logprob(s, q, s->logits + (size_t)lg_row * nv, s->b_pos[r]);
            lg_row++;
        } else if (s->b_lg[r]) {
            const int32_t tok = s->lg_tok[lg_row];
            /* -1: JSON mode, and no token continues the text */
            q->done = tok < 0 ? "stop" : handle_token(s, q, tok, s->lg_prob[lg_row]);
            q->spec_live = !q->done && q->n_prop > 0 && tok == q->prop[0];
            lg_row++;
            q->state = ST_DECODE;
        }
    }
    /* the rejected proposals' K/V are dropped: the cache ends at the last
     * token taken (n_past), so they are overwritten and a block they
     * filled is registered only once real tokens fill it (register_blocks
     * counts n_past) */
    uint64_t drafted = 0, accepted = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        sreq *q = s->run[i];
        if (q->n_prop == 0)
            continue;
        q->n_drafted += q->n_prop;
        drafted += (uint64_t)q->n_prop;
        q->kv.n_pos = q->n_past;
        q->n_prop = 0;
        q->spec_live = false;
    }
    for (int32_t r = 0; r < n_rows; r++)
        accepted += s->b_spec[r] > 0 && s->b_owner[r]->n_past > s->b_pos[r];
    if (drafted) {
        pthread_mutex_lock(&s->mu);
        s->st.spec_drafted += drafted;
        s->st.spec_accepted += accepted;
        pthread_mutex_unlock(&s->mu);
    }
}

/* Registers full blocks and ends the requests that finished this step. */
static void sweep(lms_sched *s)
{
    uint64_t gen = 0, prompt = 0;
    for (int32_t i = s->n_run - 1; i >= 0; i--) {
        sreq *q = s->run[i];
        register_blocks(s, q);
        if (q->r.embedding && q->n_past == q->n_prompt) {
            prompt += (uint64_t)q->n_prompt;
            remove_running(s, i);
            finish_embedding(s, q);
        } else if (q->done) {
            prompt += (uint64_t)q->n_prompt;
            gen += (uint64_t)q->n_gen;
            remove_running(s, i);
            flush_text(q);
            finish(s, q, q->done, 0, NULL);
        }
    }
    pthread_mutex_lock(&s->mu);
    s->st.prompt_tokens += prompt;
    s->st.gen_tokens += gen;
    pthread_mutex_unlock(&s->mu);
}

static void fail_all_running(lms_sched *s, int rc)
{
    char msg[128];
    snprintf(msg, sizeof msg, "the engine step failed: %s", lms_strerror(rc));
    while (s->n_run > 0) {
        sreq *q = s->run[s->n_run - 1];
        remove_running(s, s->n_run - 1);
        finish(s, q, "error", rc, msg);
    }
}

static bool uses_lora(const sreq *q, const lms_lora *l)
{
    for (int32_t k = 0; k < q->lora.n; k++)
        if (q->lora.use[k].lora == l)
            return true;
    return false;
}

/* A step whose adapters found no room on the device ran nothing
 * (LMS_ERR_ADAPTER): the requests among its n rows with the adapter that
 * did not fit (any adapter when the context does not say which) end with
 * that error; the others keep their state and run in the next step. */
static void fail_lora_rows(lms_sched *s, int32_t n, int rc)
{
    const lms_lora *bad = lms_ctx_lora_failed(s->ctx);
    for (int32_t i = s->n_run - 1; i >= 0; i--) {
        sreq *q = s->run[i];
        bool in_step = false;
        for (int32_t r = 0; r < n && !in_step; r++)
            in_step = s->b_owner[r] == q;
        if (!in_step || q->lora.n == 0 || (bad && !uses_lora(q, bad)))
            continue;
        remove_running(s, i);
        finish(s, q, "error", rc,
               "the request's LoRA adapters do not fit in the GPU's memory beside the model "
               "(the server log names the adapter)");
    }
}

static void publish_stats(lms_sched *s, bool stepped)
{
    lms_kv_cache *kv = lms_ctx_kv(s->ctx);
    pthread_mutex_lock(&s->mu);
    s->st.busy = false;
    s->st.n_steps += stepped;
    s->st.kv_blocks_used = lms_kv_used(kv);
    s->st.kv_blocks_cached = kv->n_cached;
    s->st.draft_blocks_used = s->drafter ? lms_drafter_blocks_used(s->drafter) : 0;
    s->st.n_running = s->n_run;
    pthread_mutex_unlock(&s->mu);
}

/* Thermal protection: sleeps as the policy asks; returns the step's token
 * budget (0 = paused, run nothing now). */
static int32_t thermal_budget(lms_sched *s)
{
    if (!s->p.thermal)
        return s->p.n_batch;
    lms_thermal_out t;
    lms_thermal_get(s->p.thermal, &t);
    if (t.step_delay_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += t.step_delay_ms / 1000;
        ts.tv_nsec += (long)(t.step_delay_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L)
            ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_mutex_lock(&s->mu);
        if (!s->stop && !s->abandoned)
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        pthread_mutex_unlock(&s->mu);
    }
    int32_t b = (int32_t)(s->p.n_batch * t.token_factor);
    return t.token_factor > 0 && b < 1 ? 1 : b;
}

/* The test-only fault hook: this step hangs until the scheduler is
 * abandoned, as a stuck device or kernel would. */
static void maybe_hang(lms_sched *s)
{
    if (!lms_fault_should_hang())
        return;
    lms_log(LMS_LOG_WARN, "fault_hang_step", "model", LMS_LOG_STR(s->m->name));
    pthread_mutex_lock(&s->mu);
    while (!s->abandoned && !s->stop)
        pthread_cond_wait(&s->hang_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void step(lms_sched *s)
{
    apply_aborts(s);
    if (s->enc) { /* an embedding model */
        encode_next(s);
        publish_stats(s, true);
        return;
    }
    int32_t budget = thermal_budget(s);
    if (budget == 0) { /* paused: only aborts are served */
        publish_stats(s, false);
        return;
    }
    admit(s);
    propose(s, budget);
    bool any_lora;
    int32_t n = build_batch(s, budget, &any_lora);
    if (n > 0) {
        pthread_mutex_lock(&s->mu);
        s->st.busy = true;
        pthread_mutex_unlock(&s->mu);
        maybe_hang(s);
        if (s->abandoned)
            return; /* the owner has ended every request; touch none */
        lms_batch b = {.n_tokens = n, .tokens = s->b_tok, .pos = s->b_pos, .seq = s->b_seq,
                       .logits = s->b_lg, .embd = s->b_embd,
                       .lora = any_lora ? s->b_lora : NULL};
        int rc = lms_forward(s->ctx, &b, s->logits);
        if (s->abandoned)
            return;
        if (rc == LMS_ERR_ADAPTER && any_lora)
            fail_lora_rows(s, n, rc);
        else if (rc < 0)
            fail_all_running(s, rc);
        else
            after_forward(s, n);
        sweep(s);
    }
    publish_stats(s, n > 0);
}

/* ---- thread and lifecycle ----------------------------------------------------- */

static void free_all(lms_sched *s);

/* An idle scheduler releases its team (lms_release_omp_team) so that
 * another one in the process (a second model, the engine restarted after
 * a stall) decodes at full speed: Llama-3.2-1B, 2 threads, beside an idle
 * scheduler that kept its team, 60-100 context switches a token instead of
 * none, and 2% (slow memory mode) to 12% (fast mode) of the speed; each
 * idle period then costs one thread creation. libgomp only (GCC): there
 * the pause frees just the calling thread's team, while LLVM's runtime
 * pauses every thread of the process. */
void lms_release_omp_team(void)
{
#if defined(_OPENMP) && defined(__GNUC__) && !defined(__clang__)
    omp_pause_resource_all(omp_pause_soft);
#endif
}

static void *sched_main(void *arg)
{
    lms_sched *s = arg;
    bool has_team = false; /* ran a step since the team was last released */
    pthread_mutex_lock(&s->mu);
    while (!s->stop && !s->abandoned) {
        bool aborts = s->n_aborts > 0;
        if (s->n_queued == 0 && s->n_run == 0 && !aborts) {
            if (s->wdc)
                lms_watchdog_busy(s->wdc, false);
            if (has_team) { /* then look for work again */
                pthread_mutex_unlock(&s->mu);
                lms_release_omp_team();
                has_team = false;
                pthread_mutex_lock(&s->mu);
                continue;
            }
            pthread_cond_wait(&s->cv, &s->mu); /* idle: no CPU use */
            continue;
        }
        has_team = true;
        s->st.n_running = s->n_run;
        s->st.n_queued = s->n_queued;
        pthread_mutex_unlock(&s->mu);
        if (s->wdc)
            lms_watchdog_busy(s->wdc, true);
        step(s);
        if (s->wdc && !s->abandoned)
            lms_watchdog_beat(s->wdc);
        pthread_mutex_lock(&s->mu);
        s->st.n_running = s->n_run;
        s->st.n_queued = s->n_queued;
        if (aborts && s->n_run == 0 && s->n_queued == 0)
            s->n_aborts = 0; /* aborts of finished ids */
    }
    bool abandoned = s->abandoned;
    pthread_mutex_unlock(&s->mu);
    if (abandoned)
        free_all(s); /* nobody else holds s any more */
    return NULL;
}

static void on_stall(void *ud, const char *name, double stalled_ms)
{
    lms_sched *s = ud;
    lms_log(LMS_LOG_ERROR, "step_stalled", "component", LMS_LOG_STR(name), "stalled_ms",
            LMS_LOG_F64(stalled_ms));
    if (s->p.on_stall)
        s->p.on_stall(s->p.stall_ud, s);
}

static int alloc_buffers(lms_sched *s)
{
    size_t nb = (size_t)s->p.n_batch;
    /* an embedding model's pass takes up to ENC_BATCH requests */
    const int32_t n_run = s->m->hp.is_encoder && s->p.n_parallel < ENC_BATCH ? ENC_BATCH
                                                                            : s->p.n_parallel;
    s->run = calloc((size_t)n_run, sizeof *s->run);
    s->b_tok = malloc(nb * sizeof *s->b_tok);
    s->b_pos = malloc(nb * sizeof *s->b_pos);
    s->b_seq = malloc(nb * sizeof *s->b_seq);
    s->b_lora = malloc(nb * sizeof *s->b_lora);
    s->b_lg = malloc(nb * sizeof *s->b_lg);
    s->b_embd = malloc(nb * sizeof *s->b_embd);
    s->b_owner = malloc(nb * sizeof *s->b_owner);
    s->lg_base = s->p.n_parallel * (1 + (s->p.spec.mode != LMS_SPEC_NONE ? s->p.spec.n_max : 0));
    const size_t nl = (size_t)s->lg_base;
    s->logits = lms_ctx_host_alloc(s->ctx, nl * (size_t)s->m->hp.n_vocab * sizeof *s->logits);
    s->lg_owner = malloc(nl * sizeof *s->lg_owner);
    s->lg_tok = malloc(nl * sizeof *s->lg_tok);
    s->lg_prob = malloc(nl * sizeof *s->lg_prob);
    s->lg_plp = calloc(nl, sizeof *s->lg_plp);
    s->lg_spec = calloc(nl, sizeof *s->lg_spec);
    s->lg_cap = s->lg_base;
    s->b_spec = calloc(nb, sizeof *s->b_spec);
    s->jobs = calloc((size_t)s->p.n_parallel, sizeof *s->jobs);
    s->job_owner = calloc((size_t)s->p.n_parallel, sizeof *s->job_owner);
    return s->run && s->b_tok && s->b_pos && s->b_seq && s->b_lora && s->b_lg && s->b_embd && s->b_owner &&
                   s->logits && s->lg_owner && s->lg_tok && s->lg_prob && s->lg_plp && s->lg_spec &&
                   s->b_spec && s->jobs && s->job_owner
               ? 0
               : LMS_ERR_NOMEM;
}

static void free_buffers(lms_sched *s)
{
    void *bufs[] = {s->run, s->b_tok, s->b_pos, s->b_seq, (void *)s->b_lora, s->b_lg, s->b_embd, s->b_owner,
                    s->lg_owner, s->lg_tok, s->lg_prob, s->lg_plp, s->aborts,
                    s->lg_spec, s->b_spec, s->jobs, s->job_owner};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    lms_host_free(s->logits);
}

static int32_t pool_blocks(const lms_sched_params *p, const lms_hparams *hp)
{
    if (p->kv_budget_bytes <= 0)
        return 0;
    int64_t row = (int64_t)lms_row_size(p->kv_type ? p->kv_type : LMS_TYPE_F16,
                                        (int64_t)hp->n_head_kv * hp->head_dim);
    int64_t per_block = (int64_t)LMS_KV_BLOCK * hp->n_layer * row * 2;
    int64_t n = p->kv_budget_bytes / per_block;
    return n > (1 << 24) ? (1 << 24) : (int32_t)(n > 0 ? n : 1);
}

int lms_sched_create(lms_model *m, const lms_sched_params *p, lms_sched **out, char *err,
                     size_t errsz)
{
    if (p->n_ctx < 2 || p->n_parallel < 1 || p->n_parallel > 1024 || p->n_batch < 1 ||
        p->max_queue < 0)
        return lms_errf(err, errsz, LMS_ERR_INVAL,
                        "scheduler: n_ctx %d, parallel %d, batch %d, queue %d are not valid",
                        p->n_ctx, p->n_parallel, p->n_batch, p->max_queue);
    lms_sched *s = calloc(1, sizeof *s);
    if (!s)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "scheduler: out of memory");
    s->m = m;
    s->p = *p;
    if (s->p.n_batch < s->p.n_parallel)
        s->p.n_batch = s->p.n_parallel; /* every decoding sequence fits a step */
    s->p.draft_model = NULL; /* used here only */
    if (p->draft_model && s->p.spec.mode == LMS_SPEC_NONE)
        s->p.spec.mode = LMS_SPEC_DRAFT;
    int rc = lms_spec_params_fix(&s->p.spec, err, errsz);
    if (rc == 0 && s->p.spec.mode == LMS_SPEC_DRAFT && !p->draft_model)
        rc = lms_errf(err, errsz, LMS_ERR_INVAL, "speculative decoding with a draft model needs "
                                                 "the draft model (--draft)");
    if (rc < 0) {
        free(s);
        return rc;
    }
    lms_ctx_params cp = {.n_ctx = p->n_ctx, .n_batch = s->p.n_batch, .n_seq = p->n_parallel,
                         .n_threads = p->n_threads, .kv_blocks = pool_blocks(p, &m->hp),
                         .kv_type = p->kv_type,
                         .gpu_layers = p->gpu_layers, .vram_margin_mb = p->vram_margin_mb,
                         .vram_budget_mb = p->vram_budget_mb};
    if (m->hp.is_encoder && rc == 0) { /* encoders run on the CPU (engine/encoder.c) */
        if (cp.gpu_layers != 0 && cp.gpu_layers != LMS_GPU_LAYERS_AUTO) {
            free(s);
            return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                            "model '%s' is an embedding model (%s), which runs on the CPU "
                            "only: --gpu-layers is not supported for it", m->name, m->hp.arch);
        }
        cp.gpu_layers = 0;
    }
    rc = lms_ctx_create(m, &cp, &s->ctx, err, errsz);
    if (rc == 0 && m->hp.is_encoder) {
        rc = lms_encoder_create(m, p->n_threads, &s->enc, err, errsz);
        const char *eb = getenv("LMS_ENC_BATCH");
        s->enc_batch = eb && atoi(eb) >= 1 && atoi(eb) <= ENC_BATCH ? atoi(eb) : ENC_BATCH;
    }
    if (rc == 0 && s->p.spec.mode == LMS_SPEC_DRAFT) {
        /* as many positions as the target's pool: a sequence reserves the
         * same number in both; on the GPU as the target unless told */
        const lms_draft_place dp = {p->draft_gpu_set ? p->draft_gpu_layers : p->gpu_layers,
                                    p->vram_margin_mb, p->vram_budget_mb, s->ctx};
        rc = lms_drafter_create(m, p->draft_model, p->n_ctx, s->p.n_batch, p->n_parallel,
                                lms_ctx_kv(s->ctx)->n_blocks, p->n_threads, &dp, &s->drafter, err,
                                errsz);
    }
    if (rc == 0 && (rc = alloc_buffers(s)) < 0)
        lms_errf(err, errsz, rc, "scheduler: out of memory");
    if (rc == 0 && !m->hp.is_encoder)
        marker_ids(s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->hang_cv, NULL);
    if (rc == 0 && p->watchdog) {
        char name[160];
        snprintf(name, sizeof name, "scheduler %s", m->name);
        s->wdc = lms_watchdog_register(p->watchdog, name, p->stall_ms > 0 ? p->stall_ms : 60000,
                                       on_stall, s);
    }
    if (rc == 0 && pthread_create(&s->thread, NULL, sched_main, s) != 0)
        rc = lms_errf(err, errsz, LMS_ERR_NOMEM, "scheduler: cannot start its thread");
    if (rc < 0) {
        free_all(s);
        return rc;
    }
    s->st.kv_blocks_total = lms_ctx_kv(s->ctx)->n_blocks;
    *out = s;
    return 0;
}

/* Frees requests (without events), buffers, context and s itself. */
static void free_all(lms_sched *s)
{
    while (s->n_run > 0)
        sreq_free(s, s->run[--s->n_run]);
    while (s->q_head) {
        sreq *q = s->q_head;
        s->q_head = q->next;
        sreq_free(s, q);
    }
    if (s->wdc)
        lms_watchdog_unregister(s->wdc);
    free_buffers(s);
    lms_toktexts_destroy(s->tt);
    lms_drafter_destroy(s->drafter);
    lms_encoder_destroy(s->enc);
    lms_ctx_destroy(s->ctx);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->hang_cv);
    free(s);
}

void lms_sched_destroy(lms_sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_cond_signal(&s->hang_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    while (s->n_run > 0) {
        sreq *q = s->run[--s->n_run];
        finish(s, q, "abort", 0, NULL);
    }
    while (s->q_head) {
        sreq *q = s->q_head;
        s->q_head = q->next;
        finish(s, q, "abort", 0, NULL);
    }
    free_all(s);
}

/* Ends a request with an error event but leaves its memory to the
 * scheduler thread (which may still be inside a step that reads it). */
static void fail_in_place(sreq *q, const char *msg)
{
    lms_event *ev = q->final;
    q->final = NULL;
    if (ev) {
        ev->type = LMS_EV_ERROR;
        ev->id = q->id;
        ev->user = q->r.user;
        ev->token = -1;
        stats_of(q, "error", &ev->stats);
        ev->err = LMS_ERR_DEVICE;
        snprintf(ev->message, sizeof ev->message, "%s", msg);
        q->r.cb(q->r.user, ev);
    }
}

void lms_sched_abandon(lms_sched *s, const char *msg)
{
    pthread_mutex_lock(&s->mu);
    s->abandoned = true;
    for (int32_t i = 0; i < s->n_run; i++)
        fail_in_place(s->run[i], msg);
    for (sreq *q = s->q_head; q; q = q->next)
        fail_in_place(q, msg);
    lms_log(LMS_LOG_ERROR, "scheduler_abandoned", "model", LMS_LOG_STR(s->m->name), "reason",
            LMS_LOG_STR(msg));
    pthread_t th = s->thread;
    pthread_detach(th); /* before the unlock: the thread may free s right after it */
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->hang_cv);
    pthread_mutex_unlock(&s->mu);
}

void lms_sched_get_stats(lms_sched *s, lms_sched_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->n_queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
}

const lms_model *lms_sched_model(const lms_sched *s)
{
    return s->m;
}

const lms_sched_params *lms_sched_params_of(const lms_sched *s)
{
    return &s->p;
}
