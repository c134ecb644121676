/*
 * generate.c - single-conversation generation (see generate.h).
 *
 * The session remembers which tokens its cache holds; a new prompt that
 * starts with them (the next turn of a chat) evaluates only the rest.
 */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "engine/constrain.h"
#include "model/tokenizer.h"

void lms_session_init(lms_session *s, lms_ctx *ctx)
{
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
}

void lms_session_deinit(lms_session *s)
{
    lms_kv_seq_release(lms_ctx_kv(s->ctx), &s->seq);
    free(s->toks);
    memset(s, 0, sizeof *s);
}

void lms_session_reset(lms_session *s)
{
    s->n_toks = 0;
    s->seq.n_pos = 0;
}

void lms_session_set_lora(lms_session *s, const lms_lora_set *set)
{
    static const lms_lora_set none;
    if (!set)
        set = &none;
    if (set->id != s->lora.id)
        lms_session_reset(s);
    s->lora = *set;
}

static int remember(lms_session *s, int32_t tok)
{
    if (s->n_toks == s->cap) {
        int32_t cap = s->cap ? s->cap * 2 : 256;
        int32_t *nt = realloc(s->toks, (size_t)cap * sizeof *nt);
        if (!nt)
            return LMS_ERR_NOMEM;
        s->toks = nt;
        s->cap = cap;
    }
    s->toks[s->n_toks++] = tok;
    return 0;
}

/* Runs tokens [from, n) of the prompt; logits of the last one. */
static int eval_prompt(lms_session *s, const int32_t *prompt, int32_t from, int32_t n, float *logits)
{
    const int32_t nb = lms_ctx_params_of(s->ctx)->n_batch;
    int32_t *pos = malloc((size_t)nb * sizeof *pos);
    lms_kv_seq **seqs = malloc((size_t)nb * sizeof *seqs);
    const lms_lora_set **sets = malloc((size_t)nb * sizeof *sets);
    int rc = pos && seqs && sets ? 0 : LMS_ERR_NOMEM;
    for (int32_t i = from; i < n && rc == 0; i += nb) {
        int32_t m = n - i < nb ? n - i : nb;
        for (int32_t j = 0; j < m; j++) {
            pos[j] = i + j;
            seqs[j] = &s->seq;
            sets[j] = &s->lora;
        }
        lms_batch b = {.n_tokens = m, .tokens = prompt + i, .pos = pos, .seq = seqs,
                       .lora = s->lora.n > 0 ? sets : NULL};
        rc = lms_forward(s->ctx, &b, i + m == n ? logits : NULL);
        for (int32_t j = 0; j < m && rc == 0; j++)
            rc = remember(s, prompt[i + j]);
    }
    free(pos);
    free(seqs);
    free(sets);
    return rc;
}

/* Prepares the cache for the prompt; returns how many tokens are reused. */
static int prepare(lms_session *s, const int32_t *prompt, int32_t n, int32_t n_total, char *err,
                   size_t errsz)
{
    const lms_ctx_params *cp = lms_ctx_params_of(s->ctx);
    const int32_t n_vocab = lms_ctx_model(s->ctx)->hp.n_vocab;
    if (n <= 0)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "the prompt is empty (no tokens)");
    if (n > cp->n_ctx)
        return lms_errf(err, errsz, LMS_ERR_LIMIT, "the prompt has %d tokens, the context holds %d",
                        n, cp->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= n_vocab)
            return lms_errf(err, errsz, LMS_ERR_RANGE, "token id %d at position %d is not in [0, %d)",
                            prompt[i], i, n_vocab);
    int32_t keep = 0;
    while (keep < s->n_toks && keep < n - 1 && s->toks[keep] == prompt[keep])
        keep++;
    s->n_toks = keep;
    s->seq.n_pos = keep;
    int rc = lms_kv_seq_reserve(lms_ctx_kv(s->ctx), &s->seq, n_total);
    if (rc < 0)
        return lms_errf(err, errsz, rc, "no room in the KV cache for %d positions", n_total);
    return keep;
}

typedef struct gen_state {
    lms_detok detok;
    lms_stopstr stop;
    char *piece;       /* [piece_cap] */
    size_t piece_cap;
} gen_state;

/* Streams the text of one token; returns false when generation must end
 * (stop string, or the callback said so), setting *finish. */
static bool emit(gen_state *g, int32_t tok, float prob, lms_gen_piece_fn cb, void *ud,
                 const char **finish)
{
    int n = lms_detok_push(&g->detok, tok, g->piece, g->piece_cap);
    const char *out;
    size_t n_out;
    bool hit = lms_stopstr_feed(&g->stop, g->piece, n > 0 ? (size_t)n : 0, &out, &n_out);
    if ((n_out || !hit) && !cb(ud, out, n_out, tok, prob)) {
        *finish = "canceled";
        return false;
    }
    if (hit)
        *finish = "stop";
    return !hit;
}

/* Sends the text still held by the detokenizer and the stop matcher. */
static void finish_text(gen_state *g, lms_gen_piece_fn cb, void *ud)
{
    int n = lms_detok_flush(&g->detok, g->piece, g->piece_cap);
    size_t len;
    char *text = lms_stopstr_finish(&g->stop, g->piece, n > 0 ? (size_t)n : 0, &len);
    if (text && len)
        cb(ud, text, len, -1, 0.0f);
    free(text);
}

/* Up to k proposals for the session's next tokens (its cached tokens then
 * tok, which is not in the cache yet); returns how many went to out. */
static int32_t propose(lms_session *s, const lms_gen_params *gp, int32_t tok, int32_t k,
                       int32_t *out, int *rc)
{
    const lms_spec_params *sp = &gp->spec;
    int32_t n = 0;
    if (k <= 0 || (*rc = remember(s, tok)) < 0) /* tok joins the list for the lookup */
        return 0;
    if (sp->mode == LMS_SPEC_NGRAM) {
        n = lms_spec_ngram(s->toks, s->n_toks, sp->ngram_max, sp->ngram_min, k, out);
    } else if (sp->mode == LMS_SPEC_DRAFT && gp->drafter && gp->draft_seq &&
               lms_draft_seq_reserve(gp->drafter, gp->draft_seq, s->n_toks + k) == 0) {
        lms_draft_job j = {.ds = gp->draft_seq, .tokens = s->toks, .n_tokens = s->n_toks, .k = k,
                           .p_min = sp->p_min, .out = out};
        *rc = lms_drafter_propose(gp->drafter, &j, 1);
        n = *rc < 0 ? 0 : j.n_out;
    }
    s->n_toks--;
    return n < sp->n_min ? 0 : n;
}

/* The decode loop. With speculation, one forward pass runs the new token
 * and the proposals after it (rows 0..k of `logits`); row i's draw is the
 * next token, and while it equals proposal i the cache already holds that
 * proposal's K/V, so row i + 1 is drawn without another pass. The first
 * draw that differs (or the last row) starts the next pass, from the
 * cache truncated to the tokens taken: one sampler draw per token, as
 * without speculation. */
static int decode_loop(lms_session *s, const lms_gen_params *gp, float *logits, int32_t n_total,
                       lms_gen_piece_fn cb, void *ud, lms_gen_stats *st, gen_state *g)
{
    const lms_model *m = lms_ctx_model(s->ctx);
    const int32_t nv = m->hp.n_vocab, nb = lms_ctx_params_of(s->ctx)->n_batch;
    lms_sampler *smp = lms_sampler_create(&gp->sp, m->hp.n_vocab);
    if (!smp)
        return LMS_ERR_NOMEM;
    lms_toktexts *tt = NULL;
    lms_constraint *cons = NULL;
    if (gp->json || gp->schema || gp->grammar) {
        tt = lms_toktexts_create(m->tok);
        cons = tt ? lms_constraint_create(tt, gp->schema, gp->grammar) : NULL;
        if (!cons) {
            lms_toktexts_destroy(tt);
            lms_sampler_destroy(smp);
            return gp->grammar && tt ? LMS_ERR_LIMIT : LMS_ERR_NOMEM;
        }
    }
    for (int32_t i = 0; i < s->n_toks; i++)
        lms_sampler_accept(smp, s->toks[i]);
    int32_t k_max = gp->spec.mode == LMS_SPEC_NONE ? 0 : gp->spec.n_max;
    k_max = k_max < nb - 1 ? k_max : nb - 1;
    k_max = k_max < LMS_SPEC_MAX ? k_max : LMS_SPEC_MAX;
    int32_t prop[LMS_SPEC_MAX + 1], rtok[LMS_SPEC_MAX + 1], rpos[LMS_SPEC_MAX + 1];
    lms_kv_seq *rseq[LMS_SPEC_MAX + 1];
    const lms_lora_set *rset[LMS_SPEC_MAX + 1];
    bool rlg[LMS_SPEC_MAX + 1];
    int32_t n_rows = 1, cur = 0; /* rows of logits computed; the one to draw from */
    int rc = 0;
    double t_first = 0;
    st->finish = "length";
    while (s->n_toks < n_total) {
        float prob;
        int32_t tok = cons ? lms_constraint_sample(cons, smp, logits + (size_t)cur * nv, &prob)
                           : lms_sampler_sample(smp, logits + (size_t)cur * nv, &prob);
        if (tok < 0) { /* the JSON or grammar allows no token here */
            st->finish = "stop";
            break;
        }
        lms_sampler_accept(smp, tok);
        if (cons)
            lms_constraint_accept(cons, tok);
        if (st->n_gen++ == 0)
            t_first = lms_now_ms();
        if (cur > 0)
            st->n_accepted++; /* the draw from row cur follows an accepted proposal */
        if (!gp->ignore_eos && lms_token_is_eog(m->tok, tok)) {
            st->finish = "stop";
            break;
        }
        if (!emit(g, tok, prob, cb, ud, &st->finish))
            break;
        if (gp->cancel && *gp->cancel) {
            st->finish = "canceled";
            break;
        }
        if (s->n_toks + 1 >= n_total)
            break;
        if (cur + 1 < n_rows && tok == prop[cur]) { /* its K/V are in the cache */
            if ((rc = remember(s, tok)) < 0)
                break;
            cur++;
            continue;
        }
        s->seq.n_pos = s->n_toks; /* drop the rejected proposals' K/V */
        int32_t room = n_total - 1 - (s->n_toks + 1), k = k_max < room ? k_max : room;
        k = propose(s, gp, tok, k, prop, &rc);
        if (rc < 0)
            break;
        st->n_drafted += k;
        rtok[0] = tok;
        memcpy(rtok + 1, prop, (size_t)k * sizeof *prop);
        for (int32_t i = 0; i <= k; i++) {
            rpos[i] = s->n_toks + i;
            rseq[i] = &s->seq;
            rset[i] = &s->lora;
            rlg[i] = true;
        }
        lms_batch b = {.n_tokens = k + 1, .tokens = rtok, .pos = rpos, .seq = rseq, .logits = rlg,
                       .lora = s->lora.n > 0 ? rset : NULL};
        if ((rc = lms_forward(s->ctx, &b, logits)) < 0 || (rc = remember(s, tok)) < 0)
            break;
        n_rows = k + 1;
        cur = 0;
    }
    s->seq.n_pos = s->n_toks;
    double t1 = lms_now_ms();
    st->gen_tps = st->n_gen > 1 && t1 > t_first ? (st->n_gen - 1) * 1000.0 / (t1 - t_first) : 0;
    lms_sampler_destroy(smp);
    lms_constraint_destroy(cons);
    lms_toktexts_destroy(tt);
    return rc;
}

int lms_session_generate(lms_session *s, const int32_t *prompt, int32_t n_prompt,
                         const lms_gen_params *gp, lms_gen_piece_fn cb, void *ud,
                         lms_gen_stats *st, char *err, size_t errsz)
{
    const lms_model *m = lms_ctx_model(s->ctx);
    const int32_t n_ctx = lms_ctx_params_of(s->ctx)->n_ctx;
    memset(st, 0, sizeof *st);
    int64_t want = gp->n_predict < 0 ? n_ctx : (int64_t)n_prompt + gp->n_predict;
    int32_t n_total = want < n_ctx ? (int32_t)want : n_ctx;
    int keep = prepare(s, prompt, n_prompt, n_total, err, errsz);
    if (keep < 0)
        return keep;
    gen_state g = {.piece_cap = lms_detok_max_out(m->tok)};
    const int32_t rows = gp->spec.mode == LMS_SPEC_NONE ? 1 : LMS_SPEC_MAX + 1;
    float *logits = lms_ctx_host_alloc(s->ctx, (size_t)rows * (size_t)m->hp.n_vocab * sizeof *logits);
    g.piece = malloc(g.piece_cap);
    int rc = logits && g.piece ? lms_stopstr_init(&g.stop, gp->stop, gp->n_stop) : LMS_ERR_NOMEM;
    if (rc < 0) {
        free(g.piece);
        lms_host_free(logits);
        return lms_errf(err, errsz, rc, "cannot start generation: %s", lms_strerror(rc));
    }
    lms_detok_init(&g.detok, m->tok, false);
    double t0 = lms_now_ms();
    st->n_prompt = n_prompt;
    st->n_cached = keep;
    rc = eval_prompt(s, prompt, keep, n_prompt, logits);
    st->prompt_ms = lms_now_ms() - t0;
    if (rc == 0 && gp->n_predict != 0)
        rc = decode_loop(s, gp, logits, n_total, cb, ud, st, &g);
    else if (rc == 0)
        st->finish = "length";
    st->ttft_ms = st->prompt_ms; /* the first token is sampled right after */
    if (rc == 0)
        finish_text(&g, cb, ud);
    st->total_ms = lms_now_ms() - t0;
    lms_stopstr_deinit(&g.stop);
    free(g.piece);
    lms_host_free(logits);
    if (rc < 0)
        return lms_errf(err, errsz, rc, "generation failed: %s", lms_strerror(rc));
    return 0;
}
