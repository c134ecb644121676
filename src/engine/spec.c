/*
 * spec.c - speculative decoding proposers (see spec.h).
 */
#include "engine/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/tokenizer.h"

int lms_spec_params_fix(lms_spec_params *p, char *err, size_t errsz)
{
    if (p->mode < LMS_SPEC_NONE || p->mode > LMS_SPEC_NGRAM)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "speculative mode %d is not known", p->mode);
    if (p->n_max == 0)
        p->n_max = p->mode == LMS_SPEC_DRAFT ? LMS_SPEC_DRAFT_MAX_DEFAULT : LMS_SPEC_NGRAM_MAX_DEFAULT;
    if (p->ngram_max == 0)
        p->ngram_max = 3;
    if (p->ngram_min == 0)
        p->ngram_min = 1;
    if (p->n_max < 1 || p->n_max > LMS_SPEC_MAX)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "draft-max %d is not in [1, %d]", p->n_max,
                        LMS_SPEC_MAX);
    if (p->n_min < 0 || p->n_min > p->n_max)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "draft-min %d is not in [0, draft-max %d]",
                        p->n_min, p->n_max);
    if (!(p->p_min >= 0 && p->p_min <= 1))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "draft-p-min %g is not in [0, 1]", p->p_min);
    if (p->ngram_min < 1 || p->ngram_max < p->ngram_min || p->ngram_max > 64)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "spec-ngram lengths %d..%d are not in 1..64",
                        p->ngram_min, p->ngram_max);
    return 0;
}

int32_t lms_spec_ngram(const int32_t *t, int32_t n_tok, int32_t ngram_max, int32_t ngram_min,
                       int32_t k, int32_t *out)
{
    for (int32_t g = ngram_max; g >= ngram_min && k > 0; g--) {
        if (g >= n_tok)
            continue;
        const int32_t *key = t + n_tok - g;
        /* the most recent earlier start i; at least one token follows it */
        for (int32_t i = n_tok - g - 1; i >= 0; i--) {
            if (t[i] != key[0] || memcmp(t + i, key, (size_t)g * sizeof *t) != 0)
                continue;
            int32_t m = 0;
            while (m < k && i + g + m < n_tok) {
                out[m] = t[i + g + m];
                m++;
            }
            return m;
        }
    }
    return 0;
}

int lms_spec_vocab_check(const lms_model *target, const lms_model *draft, char *err, size_t errsz)
{
    const int32_t nt = target->hp.n_vocab, nd = draft->hp.n_vocab;
    const int32_t tt = lms_tokenizer_n_vocab(target->tok), td = lms_tokenizer_n_vocab(draft->tok);
    if (nt != nd || tt != td)
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                        "the draft model's vocabulary does not match the target's: %d tokens "
                        "(tokenizer %d) against %d (tokenizer %d)",
                        nd, td, nt, tt);
    for (int32_t i = 0; i < tt; i++) {
        const char *a = lms_token_text(target->tok, i), *b = lms_token_text(draft->tok, i);
        if ((a == NULL) != (b == NULL) || (a && strcmp(a, b) != 0))
            return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                            "the draft model's vocabulary does not match the target's: token %d "
                            "is '%.40s' in the draft, '%.40s' in the target",
                            i, b ? b : "(none)", a ? a : "(none)");
    }
    return 0;
}

/* ---- draft model ------------------------------------------------------------ */

struct lms_drafter {
    lms_model *m;
    lms_ctx *ctx;
    int32_t n_batch, n_seq;
    int32_t *b_tok, *b_pos;      /* [n_batch] */
    lms_kv_seq **b_seq;
    bool *b_lg;
    int32_t *b_job;              /* [n_batch] job of each row */
    float *logits;               /* [n_batch][n_vocab] */
};

/* The budget a draft context may plan with: the user's less what the
 * target's context holds on the device (at least 1 MiB: a budget of 0
 * would mean none). */
static int32_t draft_budget(const lms_draft_place *pl)
{
    if (pl->vram_budget_mb <= 0)
        return 0;
    const lms_gpu_plan *tp = pl->target_ctx ? lms_ctx_gpu_plan(pl->target_ctx) : NULL;
    const int64_t used = tp ? (int64_t)(tp->allocated_bytes >> 20) : 0;
    const int64_t left = (int64_t)pl->vram_budget_mb - used;
    return left > 1 ? (int32_t)left : 1;
}

int lms_drafter_create(const lms_model *target, const char *path, int32_t n_ctx, int32_t n_batch,
                       int32_t n_seq, int32_t kv_blocks, int32_t n_threads,
                       const lms_draft_place *place, lms_drafter **out, char *err, size_t errsz)
{
    lms_drafter *d = calloc(1, sizeof *d);
    if (!d)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "draft model: out of memory");
    char e2[384];
    int rc = lms_model_load(path, &d->m, e2, sizeof e2);
    if (rc < 0) {
        free(d);
        return lms_errf(err, errsz, rc, "draft model %s: %s", path, e2);
    }
    if ((rc = lms_spec_vocab_check(target, d->m, e2, sizeof e2)) < 0) {
        lms_model_free(d->m);
        free(d);
        return lms_errf(err, errsz, rc, "draft model %s: %s", path, e2);
    }
    /* the catch-up of a whole prompt goes in chunks of n_batch rows; every
     * sequence's row of a proposal pass must fit one */
    d->n_batch = n_batch < n_seq ? n_seq : n_batch;
    d->n_seq = n_seq;
    lms_ctx_params cp = {.n_ctx = n_ctx, .n_batch = d->n_batch, .n_seq = n_seq,
                         .kv_blocks = kv_blocks, .n_threads = n_threads};
    if (place) {
        cp.gpu_layers = place->gpu_layers;
        cp.vram_margin_mb = place->vram_margin_mb;
        cp.vram_budget_mb = draft_budget(place);
    }
    if ((rc = lms_ctx_create(d->m, &cp, &d->ctx, e2, sizeof e2)) < 0) {
        lms_model_free(d->m);
        free(d);
        return lms_errf(err, errsz, rc, "draft model %s: %s", path, e2);
    }
    const size_t nb = (size_t)d->n_batch;
    d->b_tok = malloc(nb * sizeof *d->b_tok);
    d->b_pos = malloc(nb * sizeof *d->b_pos);
    d->b_seq = malloc(nb * sizeof *d->b_seq);
    d->b_lg = malloc(nb * sizeof *d->b_lg);
    d->b_job = malloc(nb * sizeof *d->b_job);
    /* logits rows: one per sequence at most in any pass (page-locked when
     * the draft runs on the GPU: they come down without a host copy) */
    d->logits = lms_ctx_host_alloc(d->ctx, (size_t)n_seq * (size_t)d->m->hp.n_vocab *
                                               sizeof *d->logits);
    if (!d->b_tok || !d->b_pos || !d->b_seq || !d->b_lg || !d->b_job || !d->logits) {
        lms_drafter_destroy(d);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "draft model: out of memory");
    }
    *out = d;
    return 0;
}

void lms_drafter_destroy(lms_drafter *d)
{
    if (!d)
        return;
    free(d->b_tok);
    free(d->b_pos);
    free(d->b_seq);
    free(d->b_lg);
    free(d->b_job);
    lms_host_free(d->logits);
    lms_ctx_destroy(d->ctx);
    lms_model_free(d->m);
    free(d);
}

const lms_model *lms_drafter_model(const lms_drafter *d)
{
    return d->m;
}

const lms_gpu_plan *lms_drafter_gpu_plan(const lms_drafter *d)
{
    return lms_ctx_gpu_plan(d->ctx);
}

int32_t lms_drafter_blocks_used(lms_drafter *d)
{
    return lms_kv_used(lms_ctx_kv(d->ctx));
}

int lms_draft_seq_reserve(lms_drafter *d, lms_draft_seq *ds, int32_t n_pos)
{
    if (ds->ready && ds->cap >= n_pos && ds->kv.n_blocks * LMS_KV_BLOCK >= n_pos)
        return 0;
    if (ds->cap < n_pos) {
        int32_t *t = realloc(ds->toks, (size_t)n_pos * sizeof *t);
        if (!t)
            return LMS_ERR_NOMEM;
        ds->toks = t;
        ds->cap = n_pos;
    }
    int rc = lms_kv_seq_reserve(lms_ctx_kv(d->ctx), &ds->kv, n_pos);
    if (rc < 0)
        return rc;
    ds->ready = true;
    return 0;
}

void lms_draft_seq_release(lms_drafter *d, lms_draft_seq *ds)
{
    if (d)
        lms_kv_seq_release(lms_ctx_kv(d->ctx), &ds->kv);
    free(ds->toks);
    memset(ds, 0, sizeof *ds);
}

/* Argmax of a logits row and its probability. */
static int32_t top_of(const float *l, int32_t n, float *prob)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)(l[i] - l[best]));
    *prob = (float)(1.0 / sum);
    return best;
}

/* Runs rows [0, n) of the batch; each logits row (in order) gives its
 * job's next proposal, or ends the job's proposals (p_min). */
static int run_rows(lms_drafter *d, lms_draft_job *jobs, int32_t n, bool *stopped)
{
    lms_batch b = {.n_tokens = n, .tokens = d->b_tok, .pos = d->b_pos, .seq = d->b_seq,
                   .logits = d->b_lg};
    int rc = lms_forward(d->ctx, &b, d->logits);
    if (rc < 0)
        return rc;
    const int32_t nv = d->m->hp.n_vocab;
    int32_t row = 0;
    for (int32_t r = 0; r < n; r++) {
        lms_draft_job *j = &jobs[d->b_job[r]];
        lms_draft_seq *ds = j->ds;
        ds->toks[ds->n_toks++] = d->b_tok[r];
        if (!d->b_lg[r])
            continue;
        float p;
        const int32_t tok = top_of(d->logits + (size_t)row++ * nv, nv, &p);
        if (p < j->p_min)
            stopped[d->b_job[r]] = true;
        else
            j->out[j->n_out++] = tok;
    }
    return 0;
}

int lms_drafter_propose(lms_drafter *d, lms_draft_job *jobs, int n)
{
    bool *stopped = calloc((size_t)(n > 0 ? n : 1), sizeof *stopped);
    if (!stopped)
        return LMS_ERR_NOMEM;
    int rc = 0;
    /* catch-up: the draft cache keeps the prefix it shares with the
     * sequence; the rest (the prompt at first, then the last step's
     * accepted tokens) goes in chunks; the last row of a sequence gives
     * its first proposal */
    int32_t nr = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        lms_draft_job *j = &jobs[i];
        lms_draft_seq *ds = j->ds;
        j->n_out = 0;
        int32_t keep = 0;
        while (keep < ds->n_toks && keep < j->n_tokens - 1 && ds->toks[keep] == j->tokens[keep])
            keep++;
        ds->n_toks = keep;
        ds->kv.n_pos = keep;
        for (int32_t p = keep; p < j->n_tokens && rc == 0; p++) {
            d->b_tok[nr] = j->tokens[p];
            d->b_pos[nr] = p;
            d->b_seq[nr] = &ds->kv;
            d->b_lg[nr] = p == j->n_tokens - 1;
            d->b_job[nr] = i;
            if (++nr == d->n_batch) {
                rc = run_rows(d, jobs, nr, stopped);
                nr = 0;
            }
        }
    }
    if (nr > 0 && rc == 0)
        rc = run_rows(d, jobs, nr, stopped);
    /* then one row per sequence still proposing, a pass per token */
    for (;;) {
        nr = 0;
        for (int i = 0; i < n && rc == 0; i++) {
            lms_draft_job *j = &jobs[i];
            if (stopped[i] || j->n_out == 0 || j->n_out >= j->k)
                continue;
            d->b_tok[nr] = j->out[j->n_out - 1];
            d->b_pos[nr] = j->n_tokens + j->n_out - 1;
            d->b_seq[nr] = &j->ds->kv;
            d->b_lg[nr] = true;
            d->b_job[nr] = i;
            nr++;
        }
        if (nr == 0 || rc < 0)
            break;
        rc = run_rows(d, jobs, nr, stopped);
    }
    free(stopped);
    return rc;
}
