/*
 * encoder.c - BERT's forward pass (see encoder.h for the data flow).
 *
 * Apart from the decoder on purpose: an encoder sees its whole input in one
 * call and every token attends to every other token of its input, so there
 * is no cache. Several inputs may go in one pass (lms_encode_batch): their
 * rows one after another, each input's positions from 0 and its attention
 * over its own rows only, so the weight products run over all of their
 * rows at once. The weight products go through lms_matmul (any weight
 * type, OpenMP team); the rest is plain loops, the attention split over
 * (head, query) pairs.
 */
#include "engine/encoder.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/err.h"
#include "base/fastmath.h"
#include "base/fp16.h"
#include "kernels/matmul.h"

struct lms_encoder {
    const lms_model *m;
    int32_t n_max;     /* tokens per input: the model's context */
    int32_t n_threads;
    float *x;          /* [n_max][e] the layer input / output */
    float *q, *k, *v;  /* [n_max][e] */
    float *kt, *vt;    /* [n_head][head_dim][n] k and v transposed per head */
    float *a;          /* [n_max][e] attention output, then projections */
    float *ff;         /* [n_max][n_ff] */
    float *gate;       /* [n_max][n_ff] SwiGLU's gate (nomic-bert), else NULL */
    float *rope_cs;    /* [n_max][n_rot/2][2] cos, sin (nomic-bert), else NULL */
    float *scores;     /* [n_threads][n_max] */
    void *mscratch;    /* lms_matmul scratch, LMS_MATMUL_MAX conversions */
    int32_t *pos;      /* [n_max] each row's position within its input */
    int32_t *start;    /* [n_max] the first row of each row's input */
    int32_t *len;      /* [n_max] the rows of each row's input */
};

/* GELU, tanh approximation, with ggml's CPU rounding (encoder.h): the
 * input rounded to f16, so every value comes from a table over the 65536
 * f16 inputs, filled once (the tanh of each value would cost more than
 * the FFN products of a small model). */
static float g_gelu[65536];
static pthread_once_t g_gelu_once = PTHREAD_ONCE_INIT;

static void gelu_fill(void)
{
    const float c = 0.79788456080286535588f;
    for (uint32_t i = 0; i < 65536; i++) {
        const float h = lms_f16_to_f32((lms_f16)i);
        const float g = 0.5f * h * (1.0f + tanhf(c * h * (1.0f + 0.044715f * h * h)));
        g_gelu[i] = lms_f16_to_f32(lms_f32_to_f16(g));
    }
}

static float gelu(float x)
{
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    return g_gelu[lms_f32_to_f16(x)];
}

static size_t scratch_bytes(const lms_model *m, int64_t n)
{
    size_t best = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const lms_layer *l = &m->layers[il];
        const lms_weight *ws[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            size_t s = lms_matmul_scratch(ws[i]->type, ws[i]->ne[0], n);
            best = s > best ? s : best;
        }
    }
    return best;
}

/* cos and sin of every position's rotated pairs, as ggml computes the
 * angles: theta = p, times base^(-2/n_rot) after each pair (a running
 * float product), times the linear scaling factor. */
static void rope_table(const lms_hparams *hp, int32_t n_max, float *cs)
{
    const int32_t half = hp->n_rot / 2;
    const float step = powf(hp->rope_base, -2.0f / (float)hp->n_rot);
    for (int32_t p = 0; p < n_max; p++) {
        float theta = (float)p;
        for (int32_t i = 0; i < half; i++) {
            const float a = hp->rope_freq_scale * theta;
            cs[((size_t)p * half + i) * 2] = cosf(a);
            cs[((size_t)p * half + i) * 2 + 1] = sinf(a);
            theta *= step;
        }
    }
}

/* NeoX RoPE of n rows of n_head heads (each at its position within its
 * input): in each head, pairs (i, i + n_rot/2). */
static void rope_rows(const lms_encoder *enc, float *x, int32_t n)
{
    const lms_hparams *hp = &enc->m->hp;
    const int32_t half = hp->n_rot / 2;
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < hp->n_head; h++) {
            float *r = x + (size_t)t * hp->n_embd + (size_t)h * hp->head_dim;
            const float *cs = enc->rope_cs + (size_t)enc->pos[t] * half * 2;
            for (int32_t i = 0; i < half; i++) {
                const float x0 = r[i], x1 = r[i + half], c = cs[2 * i], sn = cs[2 * i + 1];
                r[i] = x0 * c - x1 * sn;
                r[i + half] = x0 * sn + x1 * c;
            }
        }
}

static float *alloc_f32(size_t n)
{
    return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
}

int lms_encoder_create(const lms_model *m, int32_t n_threads, lms_encoder **out, char *err,
                       size_t errsz)
{
    const lms_hparams *hp = &m->hp;
    if (!hp->is_encoder)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "encoder: model '%s' (%s) is not an encoder",
                        m->name, hp->arch);
    pthread_once(&g_gelu_once, gelu_fill);
    lms_encoder *e = calloc(1, sizeof *e);
    if (!e)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "encoder: out of memory");
    e->m = m;
    e->n_max = hp->n_ctx_train;
#ifdef _OPENMP
    e->n_threads = n_threads > 0 ? n_threads : omp_get_num_procs();
#else
    (void)n_threads;
    e->n_threads = 1;
#endif
    const size_t ne = (size_t)e->n_max * (size_t)hp->n_embd;
    e->x = alloc_f32(ne);
    e->q = alloc_f32(ne);
    e->k = alloc_f32(ne);
    e->v = alloc_f32(ne);
    e->kt = alloc_f32(ne);
    e->vt = alloc_f32(ne);
    e->a = alloc_f32(ne);
    e->ff = alloc_f32((size_t)e->n_max * (size_t)hp->n_ff);
    const bool swiglu = hp->n_layer > 0 && m->layers[0].w_gate.data;
    e->gate = swiglu ? alloc_f32((size_t)e->n_max * (size_t)hp->n_ff) : NULL;
    e->rope_cs = hp->encoder_rope ? alloc_f32((size_t)e->n_max * (size_t)hp->n_rot) : NULL;
    e->scores = alloc_f32((size_t)e->n_threads * (size_t)e->n_max);
    e->mscratch = aligned_alloc(64, ((size_t)LMS_MATMUL_MAX * scratch_bytes(m, e->n_max) + 63) /
                                        64 * 64 + 64);
    e->pos = malloc((size_t)e->n_max * sizeof *e->pos);
    e->start = malloc((size_t)e->n_max * sizeof *e->start);
    e->len = malloc((size_t)e->n_max * sizeof *e->len);
    if (!e->x || !e->q || !e->k || !e->v || !e->kt || !e->vt || !e->a || !e->ff || !e->scores ||
        !e->mscratch || (swiglu && !e->gate) || (hp->encoder_rope && !e->rope_cs) || !e->pos ||
        !e->start || !e->len) {
        lms_encoder_destroy(e);
        return lms_errf(err, errsz, LMS_ERR_NOMEM,
                        "encoder: out of memory for %d tokens of model '%s'", hp->n_ctx_train,
                        m->name);
    }
    if (hp->encoder_rope)
        rope_table(hp, e->n_max, e->rope_cs);
    *out = e;
    return 0;
}

void lms_encoder_destroy(lms_encoder *e)
{
    if (!e)
        return;
    free(e->x);
    free(e->q);
    free(e->k);
    free(e->v);
    free(e->kt);
    free(e->vt);
    free(e->a);
    free(e->ff);
    free(e->gate);
    free(e->rope_cs);
    free(e->scores);
    free(e->mscratch);
    free(e->pos);
    free(e->start);
    free(e->len);
    free(e);
}

int32_t lms_encoder_max_tokens(const lms_encoder *e)
{
    return e->n_max;
}

int32_t lms_encoder_n_out(const lms_encoder *e)
{
    const lms_hparams *hp = &e->m->hp;
    return hp->pooling == LMS_POOLING_RANK ? hp->n_cls_out : hp->n_embd;
}

/* ---- pieces ------------------------------------------------------------------ */

static lms_mat as_mat(const lms_weight *w)
{
    lms_mat m = {w->data, w->type, w->ne[0], w->ne[1], w->row_bytes};
    return m;
}

/* y[t] += b for each of n rows of len values (b absent: nothing). */
static void add_bias(float *y, const lms_weight *b, int32_t n, int64_t len)
{
    if (!b->data)
        return;
    const float *bv = b->data;
    for (int32_t t = 0; t < n; t++)
        for (int64_t i = 0; i < len; i++)
            y[(size_t)t * len + i] += bv[i];
}

/* x[t] = LayerNorm(x[t] + d[t]) * w + b over n rows of e values (d NULL:
 * no sum): mean and variance of the row, eps inside the square root. */
static void add_layer_norm(float *x, const float *d, const lms_weight *w, const lms_weight *b,
                           int32_t n, int64_t e, float eps)
{
    const float *wv = w->data, *bv = b->data;
#pragma omp parallel for schedule(static) if (n * e >= 65536)
    for (int32_t t = 0; t < n; t++) {
        float *r = x + (size_t)t * e;
        double sum = 0;
        for (int64_t i = 0; i < e; i++) {
            if (d)
                r[i] += d[(size_t)t * e + i];
            sum += r[i];
        }
        const float mean = (float)(sum / (double)e);
        double var = 0;
        for (int64_t i = 0; i < e; i++) {
            r[i] -= mean;
            var += (double)r[i] * r[i];
        }
        const float scale = 1.0f / sqrtf((float)(var / (double)e) + eps);
        for (int64_t i = 0; i < e; i++)
            r[i] = r[i] * scale * wv[i] + bv[i];
    }
}

/* k and v of n tokens into kt, vt [n_head][head_dim][n]: a query's scores
 * and a head's value sums then run along contiguous rows. */
static void transpose_kv(lms_encoder *enc, int32_t n)
{
    const int64_t e = enc->m->hp.n_embd;
#pragma omp parallel for schedule(static) if ((int64_t)n * e >= 65536)
    for (int64_t c = 0; c < e; c++)
        for (int32_t j = 0; j < n; j++) {
            enc->kt[c * n + j] = enc->k[(int64_t)j * e + c];
            enc->vt[c * n + j] = enc->v[(int64_t)j * e + c];
        }
}

/* Built for several x86 levels, the loader picking one (as forward.c and
 * attention.c do): the default SSE2 build of these loops is several times
 * slower than the AVX2 / AVX-512 ones. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define ENC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ENC_CLONES
#endif

/* One query row of one head: ai[hd] = softmax(qi . kt * scale) vt over the
 * n keys; kt, vt are the head's [hd] rows of its input's keys, `stride`
 * apart; sc is [n] scratch. */
ENC_CLONES static void attend_row(const float *qi, const float *kt, const float *vt, int32_t n,
                                  int64_t stride, int64_t hd, float scale, float *sc, float *ai)
{
    for (int32_t j = 0; j < n; j++)
        sc[j] = 0.0f;
    for (int64_t d = 0; d < hd; d++) {
        const float qd = qi[d] * scale, *kr = kt + d * stride;
#pragma omp simd
        for (int32_t j = 0; j < n; j++)
            sc[j] += qd * kr[j];
    }
    float mx = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : mx)
    for (int32_t j = 0; j < n; j++)
        mx = sc[j] > mx ? sc[j] : mx;
#pragma omp simd reduction(+ : sum)
    for (int32_t j = 0; j < n; j++) {
        sc[j] = lms_exp_neg(sc[j] - mx);
        sum += sc[j];
    }
    for (int64_t d = 0; d < hd; d++) {
        const float *vr = vt + d * stride;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int32_t j = 0; j < n; j++)
            s += sc[j] * vr[j];
        ai[d] = s / sum;
    }
}

/* a = softmax(q k^T * scale) v for every head and query, over the keys of
 * the query's input. */
static void attention(lms_encoder *enc, int32_t n)
{
    const lms_hparams *hp = &enc->m->hp;
    const int64_t e = hp->n_embd, hd = hp->head_dim;
    const int64_t n_pairs = (int64_t)hp->n_head * n;
    const float scale = 1.0f / sqrtf((float)hd);
    transpose_kv(enc, n);
#pragma omp parallel for schedule(static)
    for (int64_t pi = 0; pi < n_pairs; pi++) {
#ifdef _OPENMP
        float *sc = enc->scores + (size_t)omp_get_thread_num() * enc->n_max;
#else
        float *sc = enc->scores;
#endif
        const int64_t h = pi / n, i = pi % n, s0 = enc->start[i];
        attend_row(enc->q + i * e + h * hd, enc->kt + h * hd * n + s0, enc->vt + h * hd * n + s0,
                   enc->len[i], n, hd, scale, sc, enc->a + i * e + h * hd);
    }
}

static void layer(lms_encoder *enc, const lms_layer *l, int32_t n)
{
    const lms_hparams *hp = &enc->m->hp;
    const int64_t e = hp->n_embd, f = hp->n_ff;
    const lms_mat wq = as_mat(&l->wq), wk = as_mat(&l->wk), wv = as_mat(&l->wv);
    const lms_mat *ws[3] = {&wq, &wk, &wv};
    float *const ys[3] = {enc->q, enc->k, enc->v};
    lms_matmul_n(ws, ys, 3, enc->x, n, enc->mscratch);
    add_bias(enc->q, &l->bq, n, e);
    add_bias(enc->k, &l->bk, n, e);
    add_bias(enc->v, &l->bv, n, e);
    if (hp->encoder_rope) {
        rope_rows(enc, enc->q, n);
        rope_rows(enc, enc->k, n);
    }
    attention(enc, n);
    const lms_mat wo = as_mat(&l->wo);
    lms_matmul(&wo, enc->a, n, enc->q, enc->mscratch); /* q is free again */
    add_bias(enc->q, &l->bo, n, e);
    add_layer_norm(enc->x, enc->q, &l->attn_norm, &l->attn_norm_b, n, e, hp->norm_eps);
    const lms_mat wu = as_mat(&l->w_up), wd = as_mat(&l->w_down), wg = as_mat(&l->w_gate);
    const int64_t nf = (int64_t)n * f;
    if (l->w_gate.data) { /* nomic-bert: silu(gate) * up */
        const lms_mat *ws2[2] = {&wg, &wu};
        float *const ys2[2] = {enc->gate, enc->ff};
        lms_matmul_n(ws2, ys2, 2, enc->x, n, enc->mscratch);
        add_bias(enc->ff, &l->b_up, n, f);
#pragma omp parallel for schedule(static) if (nf >= 65536)
        for (int64_t i = 0; i < nf; i++)
            enc->ff[i] *= enc->gate[i] / (1.0f + expf(-enc->gate[i]));
    } else {
        lms_matmul(&wu, enc->x, n, enc->ff, enc->mscratch);
        add_bias(enc->ff, &l->b_up, n, f);
#pragma omp parallel for schedule(static) if (nf >= 65536)
        for (int64_t i = 0; i < nf; i++)
            enc->ff[i] = gelu(enc->ff[i]);
    }
    lms_matmul(&wd, enc->ff, n, enc->q, enc->mscratch);
    add_bias(enc->q, &l->b_down, n, e);
    add_layer_norm(enc->x, enc->q, &l->ffn_norm, &l->ffn_norm_b, n, e, hp->norm_eps);
}

size_t lms_rank_scratch(const lms_model *m)
{
    size_t a = m->cls.data ? lms_matmul_scratch(m->cls.type, m->cls.ne[0], 1) : 0;
    size_t b = m->cls_out.data ? lms_matmul_scratch(m->cls_out.type, m->cls_out.ne[0], 1) : 0;
    return a > b ? a : b;
}

void lms_rank_scores(const lms_model *m, const float *h, float *out, float *t0, float *t1,
                     void *scratch)
{
    const int64_t e = m->hp.n_embd;
    const int32_t n = m->hp.n_cls_out;
    const float *y = h;
    if (m->cls.data) {
        const lms_mat w = as_mat(&m->cls);
        lms_matmul(&w, y, 1, t0, scratch);
        add_bias(t0, &m->cls_b, 1, e);
        for (int64_t i = 0; i < e; i++)
            t0[i] = tanhf(t0[i]);
        y = t0;
    }
    if (m->cls_out.data) {
        const lms_mat w = as_mat(&m->cls_out);
        lms_matmul(&w, y, 1, t1, scratch);
        add_bias(t1, &m->cls_out_b, 1, n);
        y = t1;
    }
    memcpy(out, y, (size_t)n * sizeof *out);
    if (m->hp.is_encoder)
        return;
    float mx = out[0];
    for (int32_t i = 1; i < n; i++)
        mx = out[i] > mx ? out[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += out[i] = expf(out[i] - mx);
    for (int32_t i = 0; i < n; i++)
        out[i] = (float)(out[i] / sum);
}

/* ---- the pass ------------------------------------------------------------------ */

/* Input k's output (rows [s0, s0 + n) of enc->x) into out: pooled and of
 * unit length, or a reranker's scores. Uses enc->q (and enc->a). */
static void pool(lms_encoder *enc, int32_t s0, int32_t n, float *out)
{
    const lms_hparams *hp = &enc->m->hp;
    const int64_t e = hp->n_embd;
    const float *x = enc->x + (size_t)s0 * e;
    if (hp->pooling == LMS_POOLING_RANK) { /* the [CLS] state */
        lms_rank_scores(enc->m, x, out, enc->q, enc->a, enc->mscratch);
        return;
    }
    double norm = 0;
    for (int64_t i = 0; i < e; i++) {
        float p;
        if (hp->pooling == LMS_POOLING_CLS || hp->pooling == LMS_POOLING_LAST) {
            p = x[(size_t)(hp->pooling == LMS_POOLING_CLS ? 0 : n - 1) * e + i];
        } else {
            double s = 0;
            for (int32_t t = 0; t < n; t++)
                s += x[(size_t)t * e + i];
            p = (float)(s / n);
        }
        enc->q[i] = p;
        norm += (double)p * p;
    }
    const float inv = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
    for (int64_t i = 0; i < e; i++)
        out[i] = enc->q[i] * inv;
}

int lms_encode_batch(lms_encoder *enc, const int32_t *tokens, const int32_t *lens,
                     int32_t n_in, float *out, char *err, size_t errsz)
{
    const lms_model *m = enc->m;
    const lms_hparams *hp = &m->hp;
    const int64_t e = hp->n_embd;
    int64_t n64 = 0;
    for (int32_t k = 0; k < n_in; k++) {
        if (lens[k] <= 0 || lens[k] > enc->n_max)
            return lms_errf(err, errsz, LMS_ERR_LIMIT,
                            "the input has %d tokens; model '%s' takes 1 to %d (its context)",
                            lens[k], m->name, enc->n_max);
        n64 += lens[k];
    }
    if (n_in <= 0 || n64 > enc->n_max)
        return lms_errf(err, errsz, LMS_ERR_LIMIT,
                        "%d inputs of %lld tokens in all: one pass of model '%s' takes 1 to %d",
                        n_in, (long long)n64, m->name, enc->n_max);
    const int32_t n = (int32_t)n64;
    for (int32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return lms_errf(err, errsz, LMS_ERR_RANGE,
                            "token id %d at position %d is not in [0, %d)", tokens[t], t,
                            hp->n_vocab);
    for (int32_t k = 0, s0 = 0; k < n_in; s0 += lens[k++])
        for (int32_t t = 0; t < lens[k]; t++) {
            enc->pos[s0 + t] = t;
            enc->start[s0 + t] = s0;
            enc->len[s0 + t] = lens[k];
        }
#ifdef _OPENMP
    omp_set_num_threads(enc->n_threads); /* the team size is per calling thread */
#endif
    const lms_mat te = as_mat(&m->tok_embd), pe = as_mat(&m->pos_embd);
    const lms_mat ty = as_mat(&m->type_embd);
    float *row = enc->a;
    for (int32_t t = 0; t < n; t++) {
        float *x = enc->x + (size_t)t * e;
        lms_mat_get_row(&te, tokens[t], x);
        if (m->pos_embd.data) { /* bert; nomic-bert rotates q and k instead */
            lms_mat_get_row(&pe, enc->pos[t], row);
            for (int64_t i = 0; i < e; i++)
                x[i] += row[i];
        }
        if (m->type_embd.data) { /* token type 0 ("sentence A") for every token */
            lms_mat_get_row(&ty, 0, row);
            for (int64_t i = 0; i < e; i++)
                x[i] += row[i];
        }
    }
    add_layer_norm(enc->x, NULL, &m->tok_norm, &m->tok_norm_b, n, e, hp->norm_eps);
    for (int il = 0; il < hp->n_layer; il++)
        layer(enc, &m->layers[il], n);
    const int32_t n_out = lms_encoder_n_out(enc);
    for (int32_t k = 0, s0 = 0; k < n_in; s0 += lens[k++])
        pool(enc, s0, lens[k], out + (size_t)k * n_out);
    return 0;
}

int lms_encode(lms_encoder *enc, const int32_t *tokens, int32_t n, float *out, char *err,
               size_t errsz)
{
    return lms_encode_batch(enc, tokens, &n, 1, out, err, errsz);
}
