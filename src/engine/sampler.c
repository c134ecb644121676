/*
 * sampler.c - the sampling chain (see sampler.h).
 *
 * Candidates are (id, logit) pairs. Top-k keeps a min-heap of k entries
 * (O(n log k) over the vocabulary). Without top-k the filters and the draw
 * walk the vocabulary best first but rarely far: only the tokens within
 * SPAN of the best logit are sorted (a few, for a trained model), with the
 * rest's probability mass summed; should a cut or the draw fall past them,
 * the whole vocabulary is sorted (see sample_sorted). Greedy needs no
 * candidates at all. The random source is splitmix64 seeded per sequence,
 * so a seed reproduces a generation exactly.
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/fastmath.h"

typedef struct cand {
    int32_t id;
    float logit;
} cand;

struct lms_sampler {
    lms_sampler_params p;
    int32_t n_vocab;
    uint64_t rng;
    float *logits;     /* [n_vocab] penalised copy of the last logits */
    cand *cands;       /* [n_vocab] */
    int32_t *hist;     /* ring of the last penalty_last_n tokens */
    int32_t n_hist, hist_head;
    float lse;         /* log-sum-exp of `logits` (for probabilities) */
    float mu;          /* Mirostat: the surprise bound, 2 tau at first */
};

lms_sampler_params lms_sampler_defaults(void)
{
    lms_sampler_params p = {
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
        .repeat_penalty = 1.0f, .frequency_penalty = 0.0f, .presence_penalty = 0.0f,
        .penalty_last_n = 64, .seed = 0x5eed, .typical_p = 1.0f, .mirostat_tau = 5.0f,
        .mirostat_eta = 0.1f,
    };
    return p;
}

int lms_sampler_params_check(const lms_sampler_params *p, char *err, size_t errsz)
{
    if (!isfinite(p->temperature) || p->temperature < 0 || p->temperature > 100)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "temperature %g is not in [0, 100]", p->temperature);
    if (!(p->top_p >= 0 && p->top_p <= 1))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "top_p %g is not in [0, 1]", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "min_p %g is not in [0, 1]", p->min_p);
    if (p->top_k < 0)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "top_k %d is negative", p->top_k);
    if (!(p->typical_p > 0 && p->typical_p <= 1))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "typical_p %g is not in (0, 1]", p->typical_p);
    if (p->mirostat < 0 || p->mirostat > 2)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "mirostat %d is not 0, 1 or 2", p->mirostat);
    if (!(p->mirostat_tau >= 0 && p->mirostat_tau <= 100) ||
        !(p->mirostat_eta >= 0 && p->mirostat_eta <= 10))
        return lms_errf(err, errsz, LMS_ERR_INVAL,
                        "mirostat_tau %g / mirostat_eta %g not in [0, 100] / [0, 10]",
                        p->mirostat_tau, p->mirostat_eta);
    if (!(p->repeat_penalty > 0 && p->repeat_penalty <= 10))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "repeat_penalty %g is not in (0, 10]",
                        p->repeat_penalty);
    if (!(fabsf(p->frequency_penalty) <= 2) || !(fabsf(p->presence_penalty) <= 2))
        return lms_errf(err, errsz, LMS_ERR_INVAL,
                        "frequency_penalty %g / presence_penalty %g not in [-2, 2]",
                        p->frequency_penalty, p->presence_penalty);
    if (p->penalty_last_n < 0 || p->penalty_last_n > (1 << 20))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "penalty_last_n %d out of range", p->penalty_last_n);
    if (p->n_bias < 0 || p->n_bias > LMS_MAX_LOGIT_BIAS)
        return lms_errf(err, errsz, LMS_ERR_LIMIT, "at most %d logit biases", LMS_MAX_LOGIT_BIAS);
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias[i].id < 0 || !(fabsf(p->bias[i].bias) <= 100))
            return lms_errf(err, errsz, LMS_ERR_INVAL, "logit bias %g for token %d is not valid",
                            p->bias[i].bias, p->bias[i].id);
    return 0;
}

lms_sampler *lms_sampler_create(const lms_sampler_params *p, int32_t n_vocab)
{
    lms_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed;
    s->mu = 2.0f * p->mirostat_tau;
    s->logits = malloc((size_t)n_vocab * sizeof *s->logits);
    s->cands = malloc((size_t)n_vocab * sizeof *s->cands);
    s->hist = malloc((size_t)(p->penalty_last_n > 0 ? p->penalty_last_n : 1) * sizeof *s->hist);
    if (!s->logits || !s->cands || !s->hist) {
        lms_sampler_destroy(s);
        return NULL;
    }
    return s;
}

void lms_sampler_destroy(lms_sampler *s)
{
    if (!s)
        return;
    free(s->logits);
    free(s->cands);
    free(s->hist);
    free(s);
}

void lms_sampler_accept(lms_sampler *s, int32_t token)
{
    int32_t n = s->p.penalty_last_n;
    if (n <= 0)
        return;
    s->hist[s->hist_head] = token;
    s->hist_head = (s->hist_head + 1) % n;
    if (s->n_hist < n)
        s->n_hist++;
}

static uint64_t next_u64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Applies the penalties to s->logits for each distinct recent token. */
static void apply_penalties(lms_sampler *s)
{
    const lms_sampler_params *p = &s->p;
    if (s->n_hist == 0 ||
        (p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f))
        return;
    for (int32_t i = 0; i < s->n_hist; i++) {
        int32_t tok = s->hist[i], count = 0, first = 1;
        if (tok < 0 || tok >= s->n_vocab)
            continue;
        for (int32_t j = 0; j < s->n_hist; j++) {
            if (s->hist[j] == tok) {
                count++;
                if (j < i)
                    first = 0; /* handled at its first occurrence */
            }
        }
        if (!first)
            continue;
        float *l = &s->logits[tok];
        *l = *l > 0 ? *l / p->repeat_penalty : *l * p->repeat_penalty;
        *l -= (float)count * p->frequency_penalty + p->presence_penalty;
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define SAMPLER_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SAMPLER_CLONES
#endif

SAMPLER_CLONES static float max_of(const float *x, int32_t n)
{
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int32_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    return mx;
}

SAMPLER_CLONES static float sum_exp(const float *x, int32_t n, float mx)
{
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int32_t i = 0; i < n; i++)
        sum += lms_exp_neg(x[i] - mx);
    return sum;
}

/* sum of exp((x[i] - mx) / temp) in double (each term a float exp) */
SAMPLER_CLONES static double sum_exp_scaled(const float *x, int32_t n, float mx, float inv_temp)
{
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int32_t i = 0; i < n; i++)
        sum += (double)lms_exp_neg((x[i] - mx) * inv_temp);
    return sum;
}

/* log-sum-exp of the logits: runs for every token of every sequence, over
 * the whole vocabulary (150k for Qwen), so it is kept vectorizable.
 * Returns the largest logit. */
static float compute_lse(lms_sampler *s)
{
    float mx = max_of(s->logits, s->n_vocab);
    s->lse = mx + logf(sum_exp(s->logits, s->n_vocab, mx));
    return mx;
}

static int cand_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* Sift-down for a min-heap ordered by logit (ties: larger id is "smaller"). */
static int cand_less(const cand *a, const cand *b)
{
    return a->logit < b->logit || (a->logit == b->logit && a->id > b->id);
}

static void heap_down(cand *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_less(&h[l], &h[m]))
            m = l;
        if (r < n && cand_less(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* Radix key of a candidate: ascending keys are descending logits
 * (-0 taken as +0, as the comparison does). */
static inline uint32_t desc_key(const cand *c)
{
    uint32_t b;
    const float f = c->logit == 0.0f ? 0.0f : c->logit;
    memcpy(&b, &f, sizeof b);
    return ~(b & 0x80000000u ? ~b : b | 0x80000000u);
}

/* Sorts m candidates as cand_desc does (logit descending, ties by id),
 * given in ascending id order: a stable LSD radix sort of 4 byte digits
 * (a tenth of qsort's time over a 150k vocabulary); qsort when small or
 * out of memory. */
static void sort_desc(cand *c, int32_t m)
{
    cand *tmp = m >= 256 ? malloc((size_t)m * sizeof *tmp) : NULL;
    if (!tmp) {
        qsort(c, (size_t)m, sizeof(cand), cand_desc);
        return;
    }
    int32_t count[4][256] = {{0}};
    for (int32_t i = 0; i < m; i++) {
        const uint32_t k = desc_key(&c[i]);
        for (int d = 0; d < 4; d++)
            count[d][(k >> (8 * d)) & 255]++;
    }
    cand *src = c, *dst = tmp;
    for (int d = 0; d < 4; d++) {
        int32_t at = 0;
        for (int v = 0; v < 256; v++) {
            const int32_t n = count[d][v];
            count[d][v] = at;
            at += n;
        }
        for (int32_t i = 0; i < m; i++)
            dst[count[d][(desc_key(&src[i]) >> (8 * d)) & 255]++] = src[i];
        cand *t = src;
        src = dst;
        dst = t;
    }
    free(tmp); /* four passes: the result is back in c */
}

/* Fills s->cands with the tokens whose logit is at least lo, sorted
 * descending; returns their count. *below: the largest logit left out
 * (-inf if none). */
static int32_t gather_sorted(lms_sampler *s, float lo, float *below)
{
    int32_t m = 0;
    float bl = -INFINITY;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        const float l = s->logits[i];
        if (!(l < lo)) /* NaNs too, as a full sort would keep them */
            s->cands[m++] = (cand){i, l};
        else if (l > bl)
            bl = l;
    }
    sort_desc(s->cands, m);
    *below = bl;
    return m;
}

/* Fills s->cands with the top k (0 < k < n_vocab) sorted descending. */
static int32_t select_top(lms_sampler *s, int32_t k)
{
    int32_t n = s->n_vocab;
    for (int32_t i = 0; i < k; i++)
        s->cands[i] = (cand){i, s->logits[i]};
    for (int32_t i = k / 2 - 1; i >= 0; i--)
        heap_down(s->cands, k, i);
    for (int32_t i = k; i < n; i++) {
        cand c = {i, s->logits[i]};
        if (cand_less(&s->cands[0], &c)) {
            s->cands[0] = c;
            heap_down(s->cands, k, 0);
        }
    }
    qsort(s->cands, (size_t)k, sizeof(cand), cand_desc);
    return k;
}

/* Lowest index of the largest value mx (from max_of): a scan that stops
 * at the first match. */
static int32_t argmax_of(const float *l, int32_t n, float mx)
{
    for (int32_t i = 0; i < n; i++)
        if (l[i] == mx)
            return i;
    return 0; /* all NaN */
}

/* Without top-k: the tokens within SPAN of the best logit (or within
 * min-p's cut, if nearer) are sorted first (their probability relative to
 * the best is at least e^-SPAN). */
#define SPAN 16.0f

/* Top-p, min-p, temperature and the draw (u in [0, 1)) over the best m of
 * n_cand candidates, sorted in s->cands; `rest` is the sum of exp(logit -
 * best) over the other n_cand - m, whose logits are all below those of the
 * sorted ones, the largest being `below`. Returns the token, or -1 when a
 * decision falls past the sorted ones (the caller sorts them all). */
static int32_t sample_sorted(lms_sampler *s, int32_t m, int32_t n_cand, double rest, float below,
                             double u)
{
    double *probs = malloc((size_t)m * sizeof *probs);
    if (!probs) /* out of memory: the best */
        return s->cands[0].id;
    const double best = s->cands[0].logit;
    double sum = rest;
    for (int32_t i = 0; i < m; i++)
        sum += probs[i] = exp((double)s->cands[i].logit - best);
    int32_t keep = n_cand;
    if (s->p.top_p < 1.0f) {
        double acc = 0;
        for (int32_t i = 0; i < m && keep == n_cand; i++) {
            acc += probs[i] / sum;
            if (acc >= s->p.top_p)
                keep = i + 1;
        }
    }
    if (s->p.min_p > 0.0f) {
        for (int32_t i = 1; i < keep && i < m; i++)
            if (probs[i] < s->p.min_p) { /* probs[0] == 1: relative to the max */
                keep = i;
                break;
            }
        /* the best unsorted one is the next in order: the same test */
        if (keep > m && exp((double)below - best) < s->p.min_p)
            keep = m;
    }
    if (keep > m && (s->p.top_p < 1.0f || s->p.min_p > 0.0f)) {
        free(probs); /* a cut falls past the sorted ones */
        return -1;
    }
    const double inv_t = 1.0 / s->p.temperature;
    double sum_t = 0;
    for (int32_t i = 0; i < keep && i < m; i++)
        sum_t += probs[i] = exp(((double)s->cands[i].logit - best) * inv_t);
    if (keep > m) { /* every candidate stays: add the unsorted ones' tempered mass */
        double rest_t = sum_exp_scaled(s->logits, s->n_vocab, (float)best, (float)inv_t);
        for (int32_t i = 0; i < m; i++)
            rest_t -= (double)lms_exp_neg((float)((s->cands[i].logit - best) * inv_t));
        sum_t += rest_t > 0 ? rest_t : 0;
    }
    u *= sum_t;
    int32_t tok = keep > m ? -1 : s->cands[keep - 1].id; /* -1: the draw falls past them */
    for (int32_t i = 0; i < keep && i < m; i++) {
        if (u < probs[i]) {
            tok = s->cands[i].id;
            break;
        }
        u -= probs[i];
    }
    free(probs);
    return tok;
}

/* A candidate's distance from typicality, for typical_filter's order. */
typedef struct typ_rank {
    double dist; /* |-log p - H| */
    int32_t i;   /* its place in s->cands */
} typ_rank;

static int typ_rank_cmp(const void *a, const void *b)
{
    const typ_rank *x = a, *y = b;
    if (x->dist != y->dist)
        return x->dist < y->dist ? -1 : 1;
    return x->i - y->i; /* ties: the more likely first */
}

/* Locally typical sampling over the m sorted candidates (the top k, or the
 * whole vocabulary): their entropy H, then the tokens whose surprise
 * -log p is nearest H, in that order, until their mass reaches typical_p;
 * the kept ones stay in s->cands in descending order. Returns how many. */
static int32_t typical_filter(lms_sampler *s, int32_t m)
{
    double *lp = malloc((size_t)m * sizeof *lp);
    typ_rank *order = malloc((size_t)m * sizeof *order);
    bool *keep = calloc((size_t)m, sizeof *keep);
    if (!lp || !order || !keep) {
        free(lp), free(order), free(keep);
        return m;
    }
    const double best = s->cands[0].logit;
    double sum = 0, ent = 0;
    for (int32_t i = 0; i < m; i++)
        sum += exp((double)s->cands[i].logit - best);
    for (int32_t i = 0; i < m; i++) {
        lp[i] = (double)s->cands[i].logit - best - log(sum);
        ent -= exp(lp[i]) * lp[i];
    }
    for (int32_t i = 0; i < m; i++)
        order[i] = (typ_rank){fabs(-lp[i] - ent), i};
    qsort(order, (size_t)m, sizeof *order, typ_rank_cmp);
    double acc = 0;
    for (int32_t i = 0; i < m; i++) {
        keep[order[i].i] = true;
        acc += exp(lp[order[i].i]);
        if (acc >= s->p.typical_p)
            break;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < m; i++)
        if (keep[i])
            s->cands[n++] = s->cands[i];
    free(lp), free(order), free(keep);
    return n;
}

/* Mirostat over every candidate (sorted descending in s->cands, m of
 * them), tempered; draws with u and moves mu by the draw's surprise. */
static int32_t mirostat(lms_sampler *s, int32_t m, double u)
{
    const double inv_t = 1.0 / s->p.temperature, best = s->cands[0].logit;
    double sum = 0;
    for (int32_t i = 0; i < m; i++)
        sum += exp(((double)s->cands[i].logit - best) * inv_t);
    const double lsum = log(sum);
    /* log2 p of candidate i under the tempered distribution */
#define LOG2P(i) ((((double)s->cands[i].logit - best) * inv_t - lsum) / M_LN2)
    int32_t keep = 1;
    if (s->p.mirostat == 1) { /* Zipf exponent from the top 100, then a top-k */
        const int32_t top = m < 100 ? m : 100;
        double num = 0, den = 0;
        for (int32_t i = 0; i + 1 < top; i++) {
            const double t = log((i + 2.0) / (i + 1.0)), b = (LOG2P(i) - LOG2P(i + 1)) * M_LN2;
            num += t * b;
            den += t * t;
        }
        const double sh = den > 0 ? num / den : 1.0, eps = sh - 1.0;
        double k = eps != 0 ? pow(eps * pow(2.0, s->mu) / (1.0 - pow(s->n_vocab, -eps)), 1.0 / sh)
                            : (double)m;
        keep = !(k >= 1) ? 1 : k >= m ? m : (int32_t)(k + 0.5);
        keep = keep < 1 ? 1 : keep;
    } else { /* v2: cut where the surprise passes mu */
        while (keep < m && -LOG2P(keep) <= s->mu)
            keep++;
    }
    double kept = 0;
    for (int32_t i = 0; i < keep; i++)
        kept += exp(LOG2P(i) * M_LN2);
    u *= kept;
    int32_t pick = keep - 1;
    for (int32_t i = 0; i < keep; i++) {
        const double p = exp(LOG2P(i) * M_LN2);
        if (u < p) {
            pick = i;
            break;
        }
        u -= p;
    }
    /* the draw's surprise, under the kept tokens' renormalized distribution */
    const double surprise = -(LOG2P(pick) - log2(kept));
#undef LOG2P
    s->mu -= s->p.mirostat_eta * (float)(surprise - s->p.mirostat_tau);
    return s->cands[pick].id;
}

/* Top-k (or the best part of the vocabulary), then sample_sorted; falls
 * back to sorting every candidate when the best part does not decide. */
static int32_t sample_dist(lms_sampler *s, float mx)
{
    const int32_t n = s->n_vocab, k = s->p.top_k;
    const double u = (double)(next_u64(&s->rng) >> 11) * (1.0 / 9007199254740992.0);
    float below;
    if (s->p.mirostat)
        return mirostat(s, gather_sorted(s, -INFINITY, &below), u);
    if (s->p.typical_p < 1.0f) { /* over every candidate (or the top k), in order */
        const int32_t m = k > 0 && k < n ? select_top(s, k) : gather_sorted(s, -INFINITY, &below);
        const int32_t t = typical_filter(s, m);
        return sample_sorted(s, t, t, 0, -INFINITY, u);
    }
    if (k > 0 && k < n)
        return sample_sorted(s, select_top(s, k), k, 0, -INFINITY, u);
    /* min-p cuts every token below e^-span = min_p of the best's
     * probability: nothing past that span can be kept */
    float span = SPAN;
    if (s->p.min_p > 0.0f && -logf(s->p.min_p) < span)
        span = -logf(s->p.min_p);
    const int32_t m = gather_sorted(s, mx - span, &below);
    double rest = 0;
    if (m < n) {
        rest = sum_exp_scaled(s->logits, n, mx, 1.0f);
        for (int32_t i = 0; i < m; i++)
            rest -= (double)lms_exp_neg(s->cands[i].logit - mx);
        rest = rest > 0 ? rest : 0;
    }
    const int32_t tok = sample_sorted(s, m, n, rest, below, u);
    if (tok >= 0)
        return tok;
    /* decided past the best part: sort everything */
    const int32_t all = gather_sorted(s, -INFINITY, &below);
    return sample_sorted(s, all, n, 0, below, u);
}

int32_t lms_sampler_sample(lms_sampler *s, const float *logits, float *prob)
{
    memcpy(s->logits, logits, (size_t)s->n_vocab * sizeof *logits);
    for (int32_t i = 0; i < s->p.n_bias; i++) {
        const lms_logit_bias *b = &s->p.bias[i];
        if (b->id < s->n_vocab)
            s->logits[b->id] = b->bias <= -100.0f ? -INFINITY : s->logits[b->id] + b->bias;
    }
    apply_penalties(s);
    const float mx = compute_lse(s);
    const int32_t tok =
        s->p.temperature <= 0.0f ? argmax_of(s->logits, s->n_vocab, mx) : sample_dist(s, mx);
    if (prob)
        *prob = expf(s->logits[tok] - s->lse);
    return tok;
}

int lms_sampler_top(const lms_sampler *s, lms_token_prob *out, int n)
{
    if (n <= 0)
        return 0;
    if (n > s->n_vocab)
        n = s->n_vocab;
    /* simple partial selection: n is small (<= 20) */
    int k = 0;
    for (int32_t i = 0; i < s->n_vocab; i++) {
        float lp = s->logits[i] - s->lse;
        if (k < n || lp > out[k - 1].logprob) {
            int j = k < n ? k++ : n - 1;
            while (j > 0 && out[j - 1].logprob < lp) {
                out[j] = out[j - 1];
                j--;
            }
            out[j] = (lms_token_prob){i, lp};
        }
    }
    return k;
}
