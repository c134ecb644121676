/*
 * attention.c - the attention of the CPU layers over the paged KV cache:
 * the reference path (tiled gemm scores) and the per-row path (portable C
 * and AVX-512), with the by-head, by-group, by-heads and by-chunk schedules
 * described below, over an f16, q8_0 or q4_0 cache.
 * forward.c calls fwd_attention once per layer.
 *
 * Every schedule scores a query against all its earlier positions and goes
 * through att_softmax, which applies the layer's score transform (att_mask:
 * the 1/sqrt(head_dim) scale, gemma2's soft-capping) and its sliding window
 * (gemma's local layers): positions before the window get weight exactly 0,
 * so the value sums that follow are those of the window alone.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/err.h"
#include "base/fastmath.h"
#include "base/fp16.h"
#include "engine/forward_int.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"

/* The per-row attention kernels have an AVX-512 copy on x86-64 GCC/Clang,
 * chosen at run time (fwd_set_attention). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATT_AVX512 1
#include <immintrin.h>
#endif

/* ---- attention ------------------------------------------------------------ */

/*
 * Decode and prefill attention, one work item per (token, KV head): the
 * `group` query heads that share a KV head are done together, so each K
 * and V row is read from memory once per token rather than once per query
 * head (grouped-query attention). Scores for all positions are kept (one
 * row per query head), then softmax, then V rows are accumulated.
 */

/* y[i] += a * x[i] over n values of a V row in the cache type. Built for
 * several x86 levels (the compiler picks one at load time); the f16 -> f32
 * conversion is exact, so every level gives the same sums. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define LMS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LMS_CLONES
#endif

/* GCC 12 has _Float16 on x86-64 and ARM: the conversion vectorizes
 * (vcvtph2ps); elsewhere the bit-exact scalar conversion is used. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && \
    (defined(__x86_64__) || defined(__aarch64__))
typedef _Float16 half_t;
#define HALF_TO_F32(x) ((float)(x))
#define ROUND_F16(x) ((float)(_Float16)(x)) /* round to nearest even, like lms_f32_to_f16 */
#else
typedef uint16_t half_t;
#define HALF_TO_F32(x) lms_f16_to_f32(x)
#define ROUND_F16(x) lms_f16_to_f32(lms_f32_to_f16(x))
#endif

LMS_CLONES static void axpy_f16(int n, float a, const half_t *x, float *restrict y)
{
    for (int i = 0; i < n; i++)
        y[i] += a * HALF_TO_F32(x[i]);
}

/* y += a x for an f32 row (V converted once per tile); same contraction as
 * axpy_f16 on every level, so both paths round alike. */
LMS_CLONES static void axpy_f32(int n, float a, const float *x, float *restrict y)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* y += a[0] x0 + ... + a[3] x3 for f32 rows (V converted once per tile). */
LMS_CLONES static void axpy4_f32(int n, const float *a, const float *const *x, float *restrict y)
{
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    for (int i = 0; i < n; i++)
        y[i] += a[0] * x0[i] + a[1] * x1[i] + a[2] * x2[i] + a[3] * x3[i];
}

/* y += a[0] x0 + a[1] x1 + a[2] x2 + a[3] x3: four V rows per pass over y,
 * so the output row is loaded and stored a quarter as often. */
LMS_CLONES static void axpy4_f16(int n, const float *a, const half_t *const *x, float *restrict y)
{
    const half_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    for (int i = 0; i < n; i++)
        y[i] += a[0] * HALF_TO_F32(x0[i]) + a[1] * HALF_TO_F32(x1[i]) +
                a[2] * HALF_TO_F32(x2[i]) + a[3] * HALF_TO_F32(x3[i]);
}

LMS_CLONES static void axpy_q8_0(int n, float a, const lms_block_q8_0 *x, float *restrict y)
{
    for (int b = 0; b < n / LMS_QK8_0; b++) {
        const float s = a * lms_f16_to_f32(x[b].d);
        float *yb = y + b * LMS_QK8_0;
        for (int i = 0; i < LMS_QK8_0; i++)
            yb[i] += s * (float)x[b].qs[i];
    }
}

/* q4_0: value i of a block is (its nibble - 8) * d; qs[i] holds values i
 * (low nibble) and i + 16 (high nibble). */
LMS_CLONES static void axpy_q4_0(int n, float a, const lms_block_q4_0 *x, float *restrict y)
{
    for (int b = 0; b < n / LMS_QK4_0; b++) {
        const float s = a * lms_f16_to_f32(x[b].d);
        float *yb = y + b * LMS_QK4_0;
        for (int i = 0; i < LMS_QK4_0 / 2; i++) {
            yb[i] += s * (float)((x[b].qs[i] & 15) - 8);
            yb[i + LMS_QK4_0 / 2] += s * (float)((x[b].qs[i] >> 4) - 8);
        }
    }
}

/* A Q8_0 V row to floats (vectorized here: the reference converter is
 * scalar). Exact like the reference: d * q in float. */
LMS_CLONES static void deq_q8_0(const lms_block_q8_0 *x, float *restrict y, int n)
{
    for (int b = 0; b < n / LMS_QK8_0; b++) {
        const float d = lms_f16_to_f32(x[b].d);
        for (int i = 0; i < LMS_QK8_0; i++)
            y[b * LMS_QK8_0 + i] = d * (float)x[b].qs[i];
    }
}

/* The type the reference takes queries in for dot products with the
 * cache's K rows: f16 for f16, q8_0 for q8_0 and q4_0 (their vec_dot type). */
static int query_type(int kv_type)
{
    return lms_type_get(kv_type)->vec_dot_type;
}

/* Converts n query vectors (hd floats each, q_stride apart in groups) to
 * the cache type's dot-product form, packed qrow bytes apart. */
static void prepare_queries(lms_ctx *c, const float *q, int n, uint8_t *qc)
{
    const int hd = c->m->hp.head_dim, qt = query_type(c->kv.type);
    const size_t qrow = lms_row_size(qt, hd);
    for (int i = 0; i < n; i++) {
        if (qt == LMS_TYPE_F16) {
            uint16_t *h = (uint16_t *)(qc + i * qrow);
            for (int d = 0; d < hd; d++)
                h[d] = lms_f32_to_f16(q[i * hd + d]);
        } else {
            lms_kernels_get()->from_float[qt](q + i * hd, qc + i * qrow, hd);
        }
    }
}

/* scores[qi][j] = q_qi . K_j for j < n_max (not yet scaled), by blocks of the cache:
 * within a block the K rows are row_bytes apart, which is the stride the
 * tile kernels take. The tile kernel's result for a (query, row) pair does
 * not depend on the tile around it, so batching never changes a score. */
static void tile_scores(lms_ctx *c, int il_host, const att_tile *a, int kvh, const uint8_t *qc,
                        int n_q, float *w, lms_block_q4_0 *rows)
{
    const int hd = c->m->hp.head_dim, type = c->kv.type;
    const int32_t n_max = a->pos0 + a->n_tok, stride = c->p.n_ctx;
    const size_t off = lms_row_size(type, (int64_t)kvh * hd);
    const size_t qrow = lms_row_size(query_type(type), hd);
    const lms_kernel_table *k = lms_kernels_get();
    for (int32_t j0 = 0; j0 < n_max; j0 += LMS_KV_BLOCK) {
        int32_t nr = n_max - j0 < LMS_KV_BLOCK ? n_max - j0 : LMS_KV_BLOCK;
        const uint8_t *kr;
        size_t kstride = c->kv.row_bytes;
        if (lms_kv_k_tiled(type)) { /* the head's rows gathered from their tiles */
            const uint8_t *t = lms_kv_k_block(&c->kv, a->seq, il_host, j0) + LMS_KV_BLOCK * off;
            const int nb = hd / LMS_QK4_0;
            for (int32_t r = 0; r < nr; r++)
                for (int b = 0; b < nb; b++)
                    lms_kv_tile_get(t, r, b, &rows[r * nb + b]);
            kr = (const uint8_t *)rows;
            kstride = (size_t)nb * sizeof *rows;
        } else {
            kr = lms_kv_k(&c->kv, a->seq, il_host, j0) + off;
        }
        if (k->gemm[type]) {
            k->gemm[type](hd, nr, n_q, kr, kstride, qc, qrow, w + j0, (size_t)stride);
        } else {
            for (int32_t r = 0; r < nr; r++)
                for (int qi = 0; qi < n_q; qi++)
                    k->vec_dot[type](hd, &w[(size_t)qi * stride + j0 + r], kr + r * kstride,
                                     qc + qi * qrow);
        }
    }
}

/* Softmax over the n visible positions, weights rounded to f16 as llama.cpp
 * does; the exponentials vectorize (lms_exp_neg, like llama.cpp's own
 * vector exp, within 2e-7). softmax_exp leaves the exponentials and
 * returns 1 / their sum; the rounding of w * inv to f16 follows (the
 * compiler keeps that round trip scalar; the AVX-512 path does it with
 * F16C, round_f16_avx512, to the same values). */
LMS_CLONES static float softmax_exp(float *wg, int32_t n)
{
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int32_t j = 0; j < n; j++)
        mx = wg[j] > mx ? wg[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int32_t j = 0; j < n; j++) {
        wg[j] = lms_exp_neg(wg[j] - mx);
        sum += wg[j];
    }
    return 1.0f / sum;
}

static void softmax_f16(float *wg, int32_t n)
{
    const float inv = softmax_exp(wg, n);
    for (int32_t j = 0; j < n; j++)
        wg[j] = ROUND_F16(wg[j] * inv);
}

/* out += sum_j w[j] V_j over positions [0, n) of V (this head's slice at
 * byte offset off of each cached row). */
static void accumulate_v(lms_ctx *c, int il_host, const lms_kv_seq *seq, size_t off,
                         const float *w, int32_t n, float *out)
{
    const int hd = c->m->hp.head_dim;
    int32_t j = 0;
    if (c->kv.type == LMS_TYPE_F16) {
        for (; j + 4 <= n; j += 4) {
            const half_t *rows[4];
            for (int r = 0; r < 4; r++)
                rows[r] = (const half_t *)(lms_kv_v(&c->kv, seq, il_host, j + r) + off);
            axpy4_f16(hd, w + j, rows, out);
        }
    }
    for (; j < n; j++) {
        const uint8_t *vr = lms_kv_v(&c->kv, seq, il_host, j) + off;
        if (c->kv.type == LMS_TYPE_F16)
            axpy_f16(hd, w[j], (const half_t *)vr, out);
        else if (c->kv.type == LMS_TYPE_Q8_0)
            axpy_q8_0(hd, w[j], (const lms_block_q8_0 *)vr, out);
        else
            axpy_q4_0(hd, w[j], (const lms_block_q4_0 *)vr, out);
    }
}

static void accumulate_vf(int hd, const float *vf, const float *w, int32_t n, float *out)
{
    int32_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *rows[4] = {vf + (size_t)j * hd, vf + (size_t)(j + 1) * hd,
                                vf + (size_t)(j + 2) * hd, vf + (size_t)(j + 3) * hd};
        axpy4_f32(hd, w + j, rows, out);
    }
    for (; j < n; j++)
        axpy_f32(hd, w[j], vf + (size_t)j * hd, out);
}

/* A layer's transform of a score row before the softmax, and its window. */
typedef struct att_mask {
    float scale;   /* scores *= scale (1: gemma, whose queries carry the scale) */
    float softcap; /* 0, or scores = softcap * tanh(scores / softcap) (gemma2) */
    int32_t n_swa; /* 0, or the query at p sees positions (p - n_swa, p] only */
} att_mask;

static att_mask att_mask_of(const lms_ctx *c, int il)
{
    const lms_hparams *hp = &c->m->hp;
    att_mask am = {hp->q_scale != 0.0f ? 1.0f : 1.0f / sqrtf((float)hp->head_dim),
                   hp->attn_softcap, c->m->layers[il].n_swa};
    return am;
}

/* The first position the query at n - 1 sees (0 without a window). The
 * per-row schedules start its scores there and its value sums at that
 * position's chunk: the chunks before it would sum weights that are all
 * exactly 0, and adding such a zero chunk sum changes nothing, so leaving
 * them out gives the same bits while a local layer's cost stops growing
 * with the context (gemma's local layers keep 512 to 4096 positions). */
static inline int32_t att_first(const att_mask *am, int32_t n)
{
    return am->n_swa > 0 && n > am->n_swa ? n - am->n_swa : 0;
}

static inline int32_t att_first_chunk(const att_mask *am, int32_t n)
{
    return att_first(am, n) / ATT_CHUNK;
}

static void att_softmax(const lms_ctx *c, float *wq, int32_t n, const att_mask *am);

/* The reference: gemm scores over the tile, V rows converted to f32 once
 * per tile when several queries read them. */
static void attend_tile_ref(lms_ctx *c, int il, const att_tile *a, int kvh, int tid)
{
    const lms_hparams *hp = &c->m->hp;
    const int hd = hp->head_dim, type = c->kv.type, group = hp->n_head / hp->n_head_kv;
    const int64_t q_stride = (int64_t)hp->n_head * hd;
    const int32_t stride = c->p.n_ctx, n_q = a->n_tok * group;
    const size_t off = lms_row_size(type, (int64_t)kvh * hd);
    const size_t qrow = lms_row_size(query_type(type), hd);
    float *w = c->scores + (size_t)tid * ATT_TILE * group * stride;
    uint8_t *qc = (uint8_t *)(c->qh + (size_t)tid * ATT_TILE * group * hd);
    const int il_host = il - c->n_gpu;
    for (int32_t t = 0; t < a->n_tok; t++) /* the group's heads are adjacent in a token's Q */
        prepare_queries(c, c->qb + (a->t0 + t) * q_stride + (int64_t)kvh * group * hd, group,
                        qc + (size_t)t * group * qrow);
    /* (vf's room holds a block's gathered K rows until the values need it) */
    float *vf = c->vconv + (size_t)tid * stride * hd;
    tile_scores(c, il_host, a, kvh, qc, n_q, w, (lms_block_q4_0 *)vf);
    const att_mask am = att_mask_of(c, il);
    for (int qi = 0; qi < n_q; qi++)
        att_softmax(c, w + (size_t)qi * stride, a->pos0 + qi / group + 1, &am);
    for (int32_t t = 0; t < a->n_tok; t++)
        memset(c->att + (a->t0 + t) * q_stride + (int64_t)kvh * group * hd, 0,
               (size_t)group * hd * sizeof(float));
    /* a tile of several queries (tokens, or heads sharing the KV head)
     * reads each V row many times: convert the rows it sees to f32 once
     * (the two paths give the same sums) */
    if (a->n_tok == 1 && group == 1)
        vf = NULL;
    if (vf)
        for (int32_t j = 0; j < a->pos0 + a->n_tok; j++) {
            const uint8_t *vr = lms_kv_v(&c->kv, a->seq, il_host, j) + off;
            if (type == LMS_TYPE_Q8_0)
                deq_q8_0((const lms_block_q8_0 *)vr, vf + (size_t)j * hd, hd);
            else
                lms_kernels_get()->to_float[type](vr, vf + (size_t)j * hd, hd);
        }
    for (int32_t t = 0; t < a->n_tok; t++) {
        const int32_t n = a->pos0 + t + 1; /* positions this token sees */
        float *out = c->att + (a->t0 + t) * q_stride + (int64_t)kvh * group * hd;
        for (int g = 0; g < group; g++) {
            const float *wg = w + (size_t)(t * group + g) * stride;
            if (vf)
                accumulate_vf(hd, vf, wg, n, out + g * hd);
            else
                accumulate_v(c, il_host, a->seq, off, wg, n, out + g * hd);
        }
    }
}

/* ---- attention: the per-row path -------------------------------------------- */

/*
 * The default path where AVX-512 is (fwd_set_attention), for decode and
 * prefill alike; its portable C twin is tested but not chosen. Each query row is scored
 * against the K rows straight from the cache (f16 -> f32 fused with the
 * FMA; q8_0 blocks as exact integer products times the two scales; q4_0's
 * tiled K 16 positions a vector, the same way),
 * softmax as above, then the V rows are accumulated straight from the cache
 * into registers. Up to ATT_ROWS query rows are done per pass over the rows,
 * so the query heads of a KV group share each K and V load; for decode (one
 * token, group <= ATT_ROWS heads) that is a single pass.
 *
 * The value sum of a row is defined by chunks: positions are cut at
 * multiples of ATT_CHUNK, each chunk's weighted sum is accumulated from zero
 * in position order, and the chunk sums are added left to right. Three
 * schedules compute exactly that:
 *
 *   by head    one work item per (tile, KV head) walks all positions
 *              (attend_tile_rows); any tile, used for prefill;
 *   by group   for a step of single-token tiles (decode): work items are
 *              (tile, group of adjacent KV heads), each done start to end by
 *              one thread with no waiting on the others; its scores walk
 *              the rows once, taking the group's part of each (a run of
 *              several head slices, read in address order: a head's slice
 *              alone is a short run every row_bytes, which the hardware
 *              prefetchers follow poorly), and its chunk sums go block by
 *              block (attention_by_group);
 *   by heads   decode steps of too few tiles for by group, while their
 *              cached rows are few: each thread takes whole KV heads of
 *              every tile (8 split 4/4 over 2 threads) start to end, with
 *              no barrier before the team's join (attention_by_heads);
 *   by chunk   the other decode steps of too few tiles for by group:
 *              work items are (tile, chunk) and take every KV head of each
 *              row, in phases: scores, softmax, chunk sums, merge
 *              (attention_by_chunk).
 *
 * Every query row's arithmetic (the order of every sum) is the same in
 * whatever schedule, tile, pass or batch it is computed, so batching never
 * changes a result. attend_tile_ref is the slow twin
 * (tests/unit/test_attention.c).
 */
#define ATT_ROWS 4
#define ATT_PF 32     /* prefetch distance in positions */

/* One KV head's slice of a sequence's cached K or V rows. */
typedef struct att_src {
    const uint8_t *base;   /* the layer's pool */
    const int32_t *blocks; /* the sequence's block table */
    size_t row_bytes;
    size_t off;            /* the head's byte offset within a row */
    bool tiled;            /* K of a q4_0 cache: tiles (kv_cache.h), not rows */
} att_src;

/* The heads a scores call takes in each row: head h's K slice lies
 * h * k_bytes after the first's, its queries h * q_floats and its scores
 * h * w_floats after the first head's. The decode schedules pass every
 * KV head, so that each cached row is read whole, in address order. A
 * values call takes its heads in turn over its positions (one cache block
 * in the decode schedules), head h's weights h * w_floats and its output
 * h * q_floats after the first head's. */
typedef struct att_heads {
    int n;
    size_t k_bytes;
    size_t q_floats;
    size_t w_floats;
} att_heads;

static inline const uint8_t *att_row(const att_src *s, int32_t j)
{
    const uint32_t u = (uint32_t)j; /* j >= 0: shifts, not signed division */
    size_t cell = (size_t)s->blocks[u / LMS_KV_BLOCK] * LMS_KV_BLOCK + (size_t)(u % LMS_KV_BLOCK);
    return s->base + cell * s->row_bytes + s->off;
}

/* Tiled K: the source's first tile in the block holding position j (its
 * head's tiles start 16 times its offset in a row into the block). */
static inline const uint8_t *att_tiles(const att_src *s, int32_t j)
{
    const uint32_t u = (uint32_t)j;
    return s->base + (size_t)s->blocks[u / LMS_KV_BLOCK] * LMS_KV_BLOCK * s->row_bytes +
           LMS_KV_BLOCK * s->off;
}

/* How a values call leaves out: */
enum {
    ATT_V_SET,  /* out = the sum over [j0, j1) */
    ATT_V_ADD,  /* out += the sum over [j0, j1) (a chunk after the first) */
    ATT_V_CONT, /* out = out + ... continuing a sum over the next positions */
};

/* A query row in the form the kernels take (qrow = hd + hd/32 floats of
 * room). f16 cache: the row rounded to f16, as floats. q8_0 and q4_0
 * caches: the row quantized to q8_0 as the reference does, packed as bytes
 * (att_q8q): its hd int8 values; per group of 4 values, an int32 offset:
 * the unsigned K operand of the VNNI product is K + 128 for q8_0, and q4_0's
 * nibble is K + 8, so the offset is -128 (q8_0) or -8 (q4_0) times the 4
 * values' sum; per block, its scale 8 times (one per int32 lane of the
 * block); per block, its 8 offsets summed (q4_0's tiled scores start each
 * position's block sum there). */
typedef struct att_q8q {
    const int8_t *qs;
    const int32_t *corr; /* hd/4 */
    const float *d;      /* hd/4: block b's scale in [8b, 8b + 8) */
    const int32_t *cblk; /* hd/32 */
} att_q8q;

static inline att_q8q att_q8_query(const float *qf, int hd)
{
    const uint8_t *p = (const uint8_t *)qf;
    return (att_q8q){(const int8_t *)p, (const int32_t *)(p + hd), (const float *)(p + 2 * hd),
                     (const int32_t *)(p + 3 * hd)};
}

/* qf = q rounded to f16, as floats (vectorized on the levels with F16C) */
LMS_CLONES static void round_row_f16(const float *q, float *restrict qf, int n)
{
    for (int d = 0; d < n; d++)
        qf[d] = ROUND_F16(q[d]);
}

static void load_query(int type, int hd, const float *q, float *qf)
{
    if (type == LMS_TYPE_F16) {
        round_row_f16(q, qf, hd);
        return;
    }
    const int32_t bias = type == LMS_TYPE_Q4_0 ? 8 : 128;
    const lms_from_float_fn quant = lms_kernels_get()->from_float[LMS_TYPE_Q8_0];
    uint8_t *p = (uint8_t *)qf;
    int8_t *qs = (int8_t *)p;
    int32_t *corr = (int32_t *)(p + hd);
    float *dd = (float *)(p + 2 * hd);
    int32_t *cblk = (int32_t *)(p + 3 * hd);
    for (int b = 0; b < hd / LMS_QK8_0; b++) {
        lms_block_q8_0 blk;
        quant(q + b * LMS_QK8_0, &blk, LMS_QK8_0);
        memcpy(qs + b * LMS_QK8_0, blk.qs, LMS_QK8_0);
        cblk[b] = 0;
        for (int g = 0; g < LMS_QK8_0 / 4; g++) {
            const int8_t *x = blk.qs + 4 * g;
            corr[b * 8 + g] = -bias * (x[0] + x[1] + x[2] + x[3]);
            cblk[b] += corr[b * 8 + g];
            dd[b * 8 + g] = lms_f16_to_f32(blk.d);
        }
    }
}

/* -- portable kernels: plain C the compiler vectorizes --
 *
 * scores: w[q*ws + j] = q_q . K_j for the nq rows of qf (qrow floats apart)
 * and j in [j0, j1). values: the nq rows of out (hd floats apart) get
 * sum_{j0<=j<j1} w[q*ws + j] V_j as mode says. n: the positions the caller
 * will read (the prefetch limit). */

LMS_CLONES static void scores_f16_c(const att_src *s, int hd, int nq, const float *qf, size_t qrow,
                                    int32_t j0, int32_t j1, int32_t n, float *w, size_t ws,
                                    const att_heads *hs)
{
    (void)n;
    for (int32_t j = j0; j < j1; j++)
        for (int h = 0; h < hs->n; h++) {
            const half_t *k = (const half_t *)(att_row(s, j) + h * hs->k_bytes);
            for (int q = 0; q < nq; q++) {
                const float *x = qf + h * hs->q_floats + q * qrow;
                float acc[16] = {0}, sum = 0.0f;
                int d = 0;
                for (; d + 16 <= hd; d += 16)
                    for (int l = 0; l < 16; l++)
                        acc[l] += x[d + l] * HALF_TO_F32(k[d + l]);
                for (; d < hd; d++)
                    sum += x[d] * HALF_TO_F32(k[d]);
                for (int l = 0; l < 16; l++)
                    sum += acc[l];
                w[h * hs->w_floats + q * ws + (size_t)j] = sum;
            }
        }
}

/* Blocks of a q8_0 (q4 false) or q4_0 (q4 true) row: block b's scale, and
 * its value i as an integer (q4_0: the nibble minus 8; qs[i] holds values
 * i, low nibble, and i + 16, high nibble). */
static inline __attribute__((always_inline)) float blk_d(const uint8_t *row, int b, bool q4)
{
    return lms_f16_to_f32(q4 ? ((const lms_block_q4_0 *)row)[b].d
                             : ((const lms_block_q8_0 *)row)[b].d);
}

static inline __attribute__((always_inline)) int blk_q(const uint8_t *row, int b, int i, bool q4)
{
    if (!q4)
        return ((const lms_block_q8_0 *)row)[b].qs[i];
    const uint8_t *qs = ((const lms_block_q4_0 *)row)[b].qs;
    return (i < LMS_QK4_0 / 2 ? qs[i] & 15 : qs[i - LMS_QK4_0 / 2] >> 4) - 8;
}

/* q8_0 scores, per 16 lanes as the AVX-512 kernel: lane (b % 2) * 8 + g
 * adds block b's group g of 4 products (an exact integer) times the two
 * scales. */
LMS_CLONES static void scores_q8_0_c(const att_src *s, int hd, int nq, const float *qf, size_t qrow,
                                     int32_t j0, int32_t j1, int32_t n, float *w, size_t ws,
                                     const att_heads *hs)
{
    (void)n;
    for (int32_t j = j0; j < j1; j++)
        for (int h = 0; h < hs->n; h++) {
            const uint8_t *k = att_row(s, j) + h * hs->k_bytes;
            for (int q = 0; q < nq; q++) {
                const att_q8q x = att_q8_query(qf + h * hs->q_floats + q * qrow, hd);
                float acc[16] = {0}, sum = 0.0f;
                for (int b = 0; b < hd / LMS_QK8_0; b++) {
                    const float kd = blk_d(k, b, false);
                    for (int g = 0; g < 8; g++) {
                        const int8_t *xq = x.qs + b * LMS_QK8_0 + 4 * g;
                        int32_t p = 0;
                        for (int i = 0; i < 4; i++)
                            p += xq[i] * blk_q(k, b, 4 * g + i, false);
                        acc[(b % 2) * 8 + g] += (float)p * (kd * x.d[b * 8 + g]);
                    }
                }
                for (int l = 0; l < 16; l++)
                    sum += acc[l];
                w[h * hs->w_floats + q * ws + (size_t)j] = sum;
            }
        }
}

/*
 * q4_0 scores over tiled K (kv_cache.h), as the AVX-512 kernel computes
 * them 16 positions at a time: per block b, the exact integer sum of the
 * 32 products of the nibbles with the query's int8 values, less 8 times
 * the query's sum (the nibble's offset), then acc = fma(sum, kd * xd, acc)
 * over the blocks in order.
 */
LMS_CLONES static void scores_q4_0_c(const att_src *s, int hd, int nq, const float *qf, size_t qrow,
                                     int32_t j0, int32_t j1, int32_t n, float *w, size_t ws,
                                     const att_heads *hs)
{
    (void)n;
    const int nb = hd / LMS_QK4_0;
    for (int32_t j = j0; j < j1; j++)
        for (int h = 0; h < hs->n; h++) {
            const uint8_t *t = att_tiles(s, j) + (size_t)h * nb * LMS_KV_Q4_TILE;
            for (int q = 0; q < nq; q++) {
                const att_q8q x = att_q8_query(qf + h * hs->q_floats + q * qrow, hd);
                float acc = 0.0f;
                for (int b = 0; b < nb; b++) {
                    lms_block_q4_0 k;
                    lms_kv_tile_get(t, j % LMS_KV_BLOCK, b, &k);
                    int32_t sum = x.cblk[b];
                    for (int i = 0; i < LMS_QK4_0 / 2; i++)
                        sum += x.qs[b * LMS_QK4_0 + i] * (k.qs[i] & 15) +
                               x.qs[b * LMS_QK4_0 + LMS_QK4_0 / 2 + i] * (k.qs[i] >> 4);
                    acc = fmaf((float)sum, lms_f16_to_f32(k.d) * x.d[b * 8], acc);
                }
                w[h * hs->w_floats + q * ws + (size_t)j] = acc;
            }
        }
}

/* 64 columns of one row at a time, in a local accumulator */
LMS_CLONES static void values_f16_c_one(const att_src *s, int hd, int nq, const float *w,
                                        size_t ws, int32_t j0, int32_t j1, int32_t n,
                                        float *restrict out, int mode)
{
    (void)n;
    for (int q = 0; q < nq; q++)
        for (int c0 = 0; c0 < hd; c0 += 64) {
            const int nc = hd - c0 < 64 ? hd - c0 : 64;
            float *restrict y = out + q * hd + c0, acc[64];
            for (int d = 0; d < nc; d++)
                acc[d] = mode == ATT_V_CONT ? y[d] : 0.0f;
            for (int32_t j = j0; j < j1; j++) {
                const half_t *v = (const half_t *)att_row(s, j) + c0;
                const float a = w[q * ws + (size_t)j];
                for (int d = 0; d < nc; d++)
                    acc[d] += a * HALF_TO_F32(v[d]);
            }
            for (int d = 0; d < nc; d++)
                y[d] = mode == ATT_V_ADD ? y[d] + acc[d] : acc[d];
        }
}

static inline __attribute__((always_inline)) void
values_blk_c_one(const att_src *s, int hd, int nq, const float *w, size_t ws, int32_t j0,
                 int32_t j1, float *restrict out, int mode, bool q4)
{
    for (int q = 0; q < nq; q++)
        for (int c0 = 0; c0 < hd; c0 += 64) {
            const int nc = hd - c0 < 64 ? hd - c0 : 64; /* a multiple of 32 */
            float *restrict y = out + q * hd + c0, acc[64];
            for (int d = 0; d < nc; d++)
                acc[d] = mode == ATT_V_CONT ? y[d] : 0.0f;
            for (int32_t j = j0; j < j1; j++) {
                const uint8_t *v = att_row(s, j);
                const float a = w[q * ws + (size_t)j];
                for (int b = 0; b < nc / LMS_QK8_0; b++) {
                    const int vb = c0 / LMS_QK8_0 + b;
                    const float d = blk_d(v, vb, q4); /* as the AVX-512 kernels */
                    for (int i = 0; i < LMS_QK8_0; i++)
                        acc[b * LMS_QK8_0 + i] += a * (d * (float)blk_q(v, vb, i, q4));
                }
            }
            for (int d = 0; d < nc; d++)
                y[d] = mode == ATT_V_ADD ? y[d] + acc[d] : acc[d];
        }
}

LMS_CLONES static void values_q8_0_c_one(const att_src *s, int hd, int nq, const float *w,
                                         size_t ws, int32_t j0, int32_t j1, int32_t n,
                                         float *restrict out, int mode)
{
    (void)n;
    values_blk_c_one(s, hd, nq, w, ws, j0, j1, out, mode, false);
}

LMS_CLONES static void values_q4_0_c_one(const att_src *s, int hd, int nq, const float *w,
                                         size_t ws, int32_t j0, int32_t j1, int32_t n,
                                         float *restrict out, int mode)
{
    (void)n;
    values_blk_c_one(s, hd, nq, w, ws, j0, j1, out, mode, true);
}

/* the C values kernels over a call's heads, one after another */
#define ATT_EACH_HEAD(one)                                                                  \
    for (int h = 0; h < hs->n; h++) {                                                       \
        att_src sh = *s;                                                                    \
        sh.off += (size_t)h * hs->k_bytes;                                                  \
        one(&sh, hd, nq, w + h * hs->w_floats, ws, j0, j1, n, out + h * hs->q_floats, mode); \
    }

static void values_f16_c(const att_src *s, int hd, int nq, const float *w, size_t ws, int32_t j0,
                         int32_t j1, int32_t n, float *out, int mode, const att_heads *hs)
{
    ATT_EACH_HEAD(values_f16_c_one)
}

static void values_q8_0_c(const att_src *s, int hd, int nq, const float *w, size_t ws, int32_t j0,
                          int32_t j1, int32_t n, float *out, int mode, const att_heads *hs)
{
    ATT_EACH_HEAD(values_q8_0_c_one)
}

static void values_q4_0_c(const att_src *s, int hd, int nq, const float *w, size_t ws, int32_t j0,
                          int32_t j1, int32_t n, float *out, int mode, const att_heads *hs)
{
    ATT_EACH_HEAD(values_q4_0_c_one)
}

/* -- AVX-512 kernels (hd a multiple of 64): the rows of a pass live in
 * registers; NQ is a constant in each inlined copy -- */

#ifdef ATT_AVX512
#define ATT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,f16c,fma")))
#define ATT_INLINE static inline __attribute__((always_inline)) ATT_TARGET

/* bytes of the same head slice ATT_PF positions ahead, into L2 */
ATT_INLINE void prefetch_ahead(const att_src *s, int32_t j, int32_t n, int64_t skip, int64_t bytes)
{
    if (j + ATT_PF >= n)
        return;
    const char *p = (const char *)att_row(s, j + ATT_PF) + skip;
    for (int64_t o = 0; o < bytes; o += 64)
        _mm_prefetch(p + o, _MM_HINT_T1);
}

/*
 * The pair kernels walk runs of positions within one cache block (rows
 * row_bytes apart from the run's first row). The rows ATT_PF positions
 * after a run lie in one block too (ATT_PF is a multiple of the block
 * size), so a run looks up its first row and the first row to prefetch
 * once (att_run) and steps by row_bytes from there.
 */
typedef struct att_run {
    int32_t jb, je;    /* positions [jb, je), within one block */
    const uint8_t *r;  /* row jb (plus the source's offset) */
    const uint8_t *pf; /* row jb + ATT_PF, or NULL past the positions read */
} att_run;

_Static_assert(ATT_PF % LMS_KV_BLOCK == 0, "prefetched runs stay within one block");

ATT_INLINE att_run att_run_at(const att_src *s, int32_t jb, int32_t j1, int32_t n)
{
    const int32_t end = (jb / LMS_KV_BLOCK + 1) * LMS_KV_BLOCK;
    return (att_run){jb, end < j1 ? end : j1, att_row(s, jb),
                     jb + ATT_PF < n ? att_row(s, jb + ATT_PF) : NULL};
}

/* bytes at skip of position j's row ATT_PF ahead, into L2 */
ATT_INLINE void prefetch_run(const att_src *s, const att_run *ru, int32_t j, int32_t n,
                             int64_t skip, int64_t bytes)
{
    if (j + ATT_PF >= n)
        return;
    const char *p = (const char *)ru->pf + (size_t)(j - ru->jb) * s->row_bytes + skip;
    for (int64_t o = 0; o < bytes; o += 64)
        _mm_prefetch(p + o, _MM_HINT_T1);
}

ATT_INLINE const uint8_t *run_row(const att_src *s, const att_run *ru, int32_t j)
{
    return ru->r + (size_t)(j - ru->jb) * s->row_bytes;
}

/* A values call's starting accumulator: out's 16 floats to continue a sum,
 * else zeros. A masked load: a plain zeroing loop becomes a memset of the
 * accumulator array (rep stosq, in memory) on every call. */
ATT_INLINE __m512 acc_start(const float *out, int mode)
{
    return _mm512_maskz_loadu_ps(mode == ATT_V_CONT ? (__mmask16)0xFFFF : 0, out);
}

ATT_INLINE __m512 q8_lanes(const int8_t *qs)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs)));
}

/*
 * q8_0 scores as integers: per pair of blocks, the 64 K values in one
 * register, each int32 lane the exact sum of 4 products with the query's
 * int8 values, then scaled by the two blocks' scales (lanes 0-7: block b,
 * 8-15: block b + 1) into a float accumulator. With AVX512-VNNI the
 * products are one vpdpbusd, which takes one operand unsigned: K + 128 (an
 * xor), the lane starting from -128 times the query's 4 values
 * (att_q8q.corr). Without it, |K| times the query with K's sign
 * (vpmaddubsw, no saturation at |values| <= 128 since each pair is
 * <= 2 * 128 * 127) then vpmaddwd with ones. The lanes are the same exact
 * integers either way. kb points at the pair's first block. (q4_0's K is
 * tiled and scored by ATT_SCORES_Q4T below.)
 */
#define ATT_BLK_BYTES(Q4) ((Q4) ? sizeof(lms_block_q4_0) : sizeof(lms_block_q8_0))

ATT_INLINE __m512 blk_pair_scales(const uint8_t *kb)
{
    /* the first block's scale in lanes 0-7, then the second's merged into
     * 8-15: a shuffle fewer than two broadcasts and an insert (scores 2%
     * faster) */
    uint16_t d0, d1;
    memcpy(&d0, kb, sizeof d0);
    memcpy(&d1, kb + sizeof(lms_block_q8_0), sizeof d1);
    return _mm512_cvtph_ps(_mm256_mask_set1_epi16(_mm256_set1_epi16((short)d0), 0xFF00, (short)d1));
}

/* the two blocks' 32 int8 values each */
ATT_INLINE __m512i blk_pair_qs(const uint8_t *kb)
{
    const size_t qs = offsetof(lms_block_q8_0, qs), bs = sizeof(lms_block_q8_0);
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(kb + qs))),
        _mm256_loadu_si256((const __m256i *)(kb + bs + qs)), 1);
}

/* Declares a K pair's operands: kd its scales, ku the unsigned VNNI
 * operand, ka and kneg the magnitudes and signs (left unused, and dropped,
 * with VNNI). */
#define ATT_KPAIR(kb)                                                                      \
    const __m512i kq = blk_pair_qs(kb);                                                    \
    const __m512 kd = blk_pair_scales(kb);                                                 \
    const __m512i ku = _mm512_xor_si512(kq, _mm512_set1_epi8((char)0x80));                  \
    const __m512i ka = _mm512_abs_epi8(kq);                                                \
    const __mmask64 kneg = _mm512_movepi8_mask(kq);                                        \
    (void)ka;                                                                              \
    (void)kneg;

/* p = the integer lanes of the K pair (ATT_KPAIR) with query values xq and
 * offsets corr */
#define ATT_KDOT(p, VNNI, xq, corr)                                                        \
    if (VNNI)                                                                              \
        p = ATT_DPBUSD(corr, ku, xq);                                                      \
    else                                                                                   \
        p = _mm512_madd_epi16(                                                             \
            _mm512_maddubs_epi16(ka, _mm512_mask_sub_epi8(xq, kneg, _mm512_setzero_si512(), xq)), \
            _mm512_set1_epi16(1));

/* The sums of the 16 lanes of a, b, c and d, in that order; each sum by
 * the same tree whatever the other three hold. */
ATT_INLINE __m128 att_hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    const __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 t1 = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
    u = _mm512_add_ps(u, _mm512_permute_ps(u, 0xB1));
    return _mm512_castps512_ps128(
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
}

/*
 * Units: one att_hsum4 ends the sums of U = 4 / NQ (position, head) units
 * times NQ rows. A call for one head takes U positions per step; one for
 * several heads (the decode schedules) takes U heads of one row. A step
 * short of U units repeats its last unit and drops the copy, so the unit
 * loops keep constant trip counts (their accumulators stay in registers).
 */
typedef struct att_units {
    int32_t j[4];
    int h[4];
    int n;      /* the valid ones */
} att_units;

static inline att_units att_step(const att_heads *hs, int32_t j, int32_t j1, int h, int U)
{
    att_units u;
    const bool by_row = hs->n > 1;
    u.n = by_row ? (hs->n - h < U ? hs->n - h : U) : (j1 - j < U ? j1 - j : U);
    for (int i = 0; i < 4; i++) {
        const int c = i < u.n ? i : u.n - 1;
        u.j[i] = by_row ? j : j + c;
        u.h[i] = by_row ? h + c : h;
    }
    return u;
}

/* the loop over a call's units: positions, and heads within a row */
#define ATT_FOR_STEPS(hs, j0, j1, U)                                                 \
    for (int32_t j = j0; j < j1; j += (hs)->n > 1 ? 1 : (U))                         \
        for (int h = 0; h < (hs)->n; h += (hs)->n > 1 ? (U) : (hs)->n)

#define ATT_SCORES_Q8(name, TARGET, VNNI)                                                     \
    static inline __attribute__((always_inline)) TARGET void name(                                \
        const att_src *s, int hd, const float *qf, size_t qrow, int32_t j0, int32_t j1,           \
        int32_t n, float *w, size_t ws, const att_heads *hs, const int NQ)                        \
    {                                                                                             \
        const int U = 4 / NQ;                                                                     \
        ATT_FOR_STEPS(hs, j0, j1, U)                                                              \
        {                                                                                         \
            const att_units un = att_step(hs, j, j1, h, U);                                       \
            if (h == 0)                                                                           \
                for (int u = 0; u < (hs->n > 1 ? 1 : un.n); u++)                                  \
                    prefetch_ahead(s, j + u, n, 0, (int64_t)hs->n * (int64_t)hs->k_bytes);       \
            const uint8_t *k[4];                                                                  \
            att_q8q x[4][ATT_ROWS];                                                               \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++)                                   \
            {                                                                                     \
                k[u] = att_row(s, un.j[u]) + un.h[u] * hs->k_bytes;                               \
                _Pragma("GCC unroll 4") for (int q = 0; q < NQ; q++) x[u][q] =                    \
                    att_q8_query(qf + un.h[u] * hs->q_floats + q * qrow, hd);                     \
            }                                                                                     \
            __m512 acc[4];                                                                        \
            for (int i = 0; i < 4; i++)                                                           \
                acc[i] = _mm512_setzero_ps();                                                     \
            for (int b = 0; b < hd / LMS_QK8_0; b += 2) {                                         \
                _Pragma("GCC unroll 4") for (int u = 0; u < U; u++)                               \
                {                                                                                 \
                    ATT_KPAIR(k[u] + b * sizeof(lms_block_q8_0))                                  \
                    _Pragma("GCC unroll 4") for (int q = 0; q < NQ; q++)                          \
                    {                                                                             \
                        const __m512i xq = _mm512_loadu_si512(x[u][q].qs + b * LMS_QK8_0);        \
                        const __m512i xc = _mm512_loadu_si512(x[u][q].corr + b * 8);              \
                        __m512i p;                                                                \
                        ATT_KDOT(p, VNNI, xq, xc)                                                 \
                        acc[u * NQ + q] = _mm512_fmadd_ps(                                        \
                            _mm512_cvtepi32_ps(p),                                                \
                            _mm512_mul_ps(kd, _mm512_loadu_ps(x[u][q].d + b * 8)),                \
                            acc[u * NQ + q]);                                                     \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            float o[4];                                                                           \
            _mm_storeu_ps(o, att_hsum4(acc[0], acc[1], acc[2], acc[3]));                          \
            for (int u = 0; u < un.n; u++)                                                        \
                for (int q = 0; q < NQ; q++)                                                      \
                    w[un.h[u] * hs->w_floats + q * ws + (size_t)un.j[u]] = o[u * NQ + q];         \
        }                                                                                         \
    }

/* f16 scores: K converted by vcvtph2ps and fused into the FMA; units and
 * sums as the q8_0 kernels */
ATT_INLINE void scores_f16_x(const att_src *s, int hd, const float *qf, size_t qrow, int32_t j0,
                             int32_t j1, int32_t n, float *w, size_t ws, const att_heads *hs,
                             const int NQ)
{
    const int U = 4 / NQ;
    ATT_FOR_STEPS(hs, j0, j1, U)
    {
        const att_units un = att_step(hs, j, j1, h, U);
        if (h == 0)
            for (int u = 0; u < (hs->n > 1 ? 1 : un.n); u++)
                prefetch_ahead(s, j + u, n, 0, (int64_t)hs->n * (int64_t)hs->k_bytes);
        const uint16_t *k[4];
        const float *x[4];
#pragma GCC unroll 4
        for (int u = 0; u < U; u++) {
            k[u] = (const uint16_t *)(att_row(s, un.j[u]) + un.h[u] * hs->k_bytes);
            x[u] = qf + un.h[u] * hs->q_floats;
        }
        __m512 acc[4];
        for (int i = 0; i < 4; i++)
            acc[i] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
#pragma GCC unroll 4
            for (int u = 0; u < U; u++) {
                const __m512 kv =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(k[u] + d)));
#pragma GCC unroll 4
                for (int q = 0; q < NQ; q++)
                    acc[u * NQ + q] =
                        _mm512_fmadd_ps(_mm512_loadu_ps(x[u] + q * qrow + d), kv, acc[u * NQ + q]);
            }
        }
        float o[4];
        _mm_storeu_ps(o, att_hsum4(acc[0], acc[1], acc[2], acc[3]));
        for (int u = 0; u < un.n; u++)
            for (int q = 0; q < NQ; q++)
                w[un.h[u] * hs->w_floats + q * ws + (size_t)un.j[u]] = o[u * NQ + q];
    }
}

/*
 * f16 scores of a decode step (every KV head of each row, hs->n > 1) with
 * two query rows a head (GQA groups of 2) and HD = 64 or 128: position runs
 * within a cache block, and per head the two query rows held in registers
 * (2 * HD / 16 of them) while the run's K slices pass, two positions a step.
 * scores_f16_x reloads the queries for every K vector instead; this cuts
 * the hot (cached K) time by about a fifth. Each dot product is the same
 * FMA chain and att_hsum4 tree as scores_f16_x's, so the scores are
 * identical. The prefetch covers, head by head, the block two runs ahead.
 */
ATT_INLINE void scores_f16_pairs_x(const att_src *s, const float *qf, size_t qrow, int32_t j0,
                                   int32_t j1, int32_t n, float *w, size_t ws,
                                   const att_heads *hs, const int HD)
{
    for (int32_t jb = j0; jb < j1;) {
        const att_run ru = att_run_at(s, jb, j1, n);
        const int32_t je = ru.je;
        for (int h = 0; h < hs->n; h++) {
            const float *x = qf + (size_t)h * hs->q_floats;
            const int64_t off = (int64_t)h * (int64_t)hs->k_bytes;
            __m512 q0[8], q1[8];
            for (int i = 0; i < HD / 16; i++) {
                q0[i] = _mm512_loadu_ps(x + 16 * i);
                q1[i] = _mm512_loadu_ps(x + qrow + 16 * i);
            }
            float *wh = w + (size_t)h * hs->w_floats;
            for (int32_t j = jb; j < je; j += 2) {
                const int32_t jn = j + 1 < je ? j + 1 : j; /* a lone last position: twice */
                prefetch_run(s, &ru, j, n, off, (int64_t)hs->k_bytes);
                prefetch_run(s, &ru, jn, n, off, (int64_t)hs->k_bytes);
                const uint8_t *ra = run_row(s, &ru, j) + off, *rb = run_row(s, &ru, jn) + off;
                const uint16_t *ka = (const uint16_t *)ra, *kb = (const uint16_t *)rb;
                __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
                __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
                for (int i = 0; i < HD / 16; i++) {
                    const __m512 kva =
                        _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ka + 16 * i)));
                    const __m512 kvb =
                        _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kb + 16 * i)));
                    a0 = _mm512_fmadd_ps(q0[i], kva, a0);
                    a1 = _mm512_fmadd_ps(q1[i], kva, a1);
                    b0 = _mm512_fmadd_ps(q0[i], kvb, b0);
                    b1 = _mm512_fmadd_ps(q1[i], kvb, b1);
                }
                float o[4];
                _mm_storeu_ps(o, att_hsum4(a0, a1, b0, b1));
                wh[j] = o[0];
                wh[ws + (size_t)j] = o[1];
                wh[jn] = o[2];
                wh[ws + (size_t)jn] = o[3];
            }
        }
        jb = je;
    }
}

#define ATT_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define ATT_DPBUSD(acc, u, s) _mm512_dpbusd_epi32(acc, u, s)
ATT_SCORES_Q8(scores_q8_0_x, ATT_TARGET, 0)
ATT_SCORES_Q8(scores_q8_0_vnni_x, ATT_TARGET_VNNI, 1)

/*
 * q8_0 scores of a decode step with two query rows a head and HD = 64 or
 * 128, as scores_f16_pairs_x: per head, both rows' int8 values, VNNI
 * offsets and scales held in registers (6 * HD / 64 of them) while the
 * block's K slices pass, two positions a step. Each dot product is the
 * same integer lanes, FMA chain and att_hsum4 tree as ATT_SCORES_Q8's, so
 * the scores are identical.
 */
#define ATT_SCORES_Q8_PAIRS(name, TARGET, VNNI)                                               \
    static inline __attribute__((always_inline)) TARGET void name(                                \
        const att_src *s, const float *qf, size_t qrow, int32_t j0, int32_t j1, int32_t n,        \
        float *w, size_t ws, const att_heads *hs, const int HD)                                   \
    {                                                                                             \
        for (int32_t jb = j0; jb < j1;) {                                                         \
            const att_run ru = att_run_at(s, jb, j1, n);                                          \
            const int32_t je = ru.je;                                                             \
            for (int h = 0; h < hs->n; h++) {                                                     \
                const int64_t off = (int64_t)h * (int64_t)hs->k_bytes;                            \
                __m512i xq[2][2], xc[2][2];                                                       \
                __m512 xd[2][2];                                                                  \
                for (int q = 0; q < 2; q++) {                                                     \
                    const att_q8q x = att_q8_query(qf + h * hs->q_floats + q * qrow, HD);         \
                    for (int p = 0; p < HD / 64; p++) {                                           \
                        xq[q][p] = _mm512_loadu_si512(x.qs + 64 * p);                             \
                        xc[q][p] = _mm512_loadu_si512(x.corr + 16 * p);                           \
                        xd[q][p] = _mm512_loadu_ps(x.d + 16 * p);                                 \
                    }                                                                             \
                }                                                                                 \
                float *wh = w + (size_t)h * hs->w_floats;                                         \
                for (int32_t j = jb; j < je; j += 2) {                                            \
                    const int32_t jn = j + 1 < je ? j + 1 : j; /* a lone last position: twice */  \
                    prefetch_run(s, &ru, j, n, off, (int64_t)hs->k_bytes);                        \
                    prefetch_run(s, &ru, jn, n, off, (int64_t)hs->k_bytes);                       \
                    __m512 acc[4];                                                                \
                    for (int u = 0; u < 2; u++) {                                                 \
                        const uint8_t *k = run_row(s, &ru, u ? jn : j) + off;                     \
                        acc[2 * u] = acc[2 * u + 1] = _mm512_setzero_ps();                        \
                        for (int p = 0; p < HD / 64; p++) {                                       \
                            ATT_KPAIR(k + 2 * p * sizeof(lms_block_q8_0))                         \
                            for (int q = 0; q < 2; q++) {                                         \
                                __m512i pr;                                                       \
                                ATT_KDOT(pr, VNNI, xq[q][p], xc[q][p])                            \
                                acc[2 * u + q] =                                                  \
                                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(pr),                       \
                                                    _mm512_mul_ps(kd, xd[q][p]), acc[2 * u + q]); \
                            }                                                                     \
                        }                                                                         \
                    }                                                                             \
                    float o[4];                                                                   \
                    _mm_storeu_ps(o, att_hsum4(acc[0], acc[1], acc[2], acc[3]));                  \
                    wh[j] = o[0];                                                                 \
                    wh[ws + (size_t)j] = o[1];                                                    \
                    wh[jn] = o[2];                                                                \
                    wh[ws + (size_t)jn] = o[3];                                                   \
                }                                                                                 \
            }                                                                                     \
            jb = je;                                                                              \
        }                                                                                         \
    }

ATT_SCORES_Q8_PAIRS(scores_q8_0_pairs_x, ATT_TARGET, 0)
ATT_SCORES_Q8_PAIRS(scores_q8_0_vnni_pairs_x, ATT_TARGET_VNNI, 1)

/*
 * q4_0 scores over tiled K (kv_cache.h): 16 positions (a cache block) a
 * vector, each int32 lane one position. Per block b of the head: the
 * block's 16 scales; its four vectors of 4-byte words, each giving the
 * nibbles of values 4w..4w+3 (low) and 16+4w.. (high) of every position;
 * per query row, a lane starts at -8 times the query's sum over the block
 * (the nibbles' offset, att_q8q.cblk) and takes 8 vpdpbusd with the query's matching 4
 * int8 values broadcast (without VNNI: vpmaddubsw, at most 2 * 15 * 127
 * a pair, then vpmaddwd with ones), giving the exact integer sum; then
 * acc = fma(sum, kd * xd, acc) over the blocks in order, as scores_q4_0_c.
 * No horizontal sums; positions of the block outside [j0, j1) are computed
 * (whatever the slots hold) and not stored. The prefetch covers the block
 * ATT_PF positions ahead, the call's heads' tiles of it.
 */
/* sum += the 4-product sums of k's lanes with the query's 4 int8 values at x */
#define ATT_Q4T_DOT(sum, k, x, VNNI)                                                          \
    {                                                                                         \
        int32_t x4;                                                                           \
        memcpy(&x4, x, sizeof x4);                                                            \
        const __m512i xb = _mm512_set1_epi32(x4);                                             \
        if (VNNI)                                                                             \
            sum = ATT_DPBUSD(sum, k, xb);                                                     \
        else                                                                                  \
            sum = _mm512_add_epi32(                                                           \
                sum, _mm512_madd_epi16(_mm512_maddubs_epi16(k, xb), _mm512_set1_epi16(1)));  \
    }

#define ATT_SCORES_Q4T(name, TARGET, VNNI)                                                         \
    static inline __attribute__((always_inline)) TARGET void name(                                 \
        const att_src *s, int hd, const float *qf, size_t qrow, int32_t j0, int32_t j1,            \
        int32_t n, float *w, size_t ws, const att_heads *hs, const int NQ)                         \
    {                                                                                              \
        const int nb = hd / LMS_QK4_0;                                                             \
        const size_t head = (size_t)nb * LMS_KV_Q4_TILE; /* a head's tiles */                   \
        const __m512i m4 = _mm512_set1_epi8(0x0F);                                                 \
        for (int32_t jb = j0 / LMS_KV_BLOCK * LMS_KV_BLOCK; jb < j1; jb += LMS_KV_BLOCK) {         \
            const int32_t lo = j0 > jb ? j0 - jb : 0;                                              \
            const int32_t hi = j1 - jb < LMS_KV_BLOCK ? j1 - jb : LMS_KV_BLOCK;                    \
            const __mmask16 mask = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));             \
            if (jb + ATT_PF < n) {                                                                 \
                const char *p = (const char *)att_tiles(s, jb + ATT_PF);                           \
                for (size_t o = 0; o < (size_t)hs->n * head; o += 64)                              \
                    _mm_prefetch(p + o, _MM_HINT_T1);                                              \
            }                                                                                      \
            const uint8_t *blk = att_tiles(s, jb);                                                 \
            for (int h = 0; h < hs->n; h++) {                                                      \
                const uint8_t *t = blk + (size_t)h * head;                                         \
                att_q8q x[ATT_ROWS];                                                               \
                __m512 acc[ATT_ROWS];                                                              \
                _Pragma("GCC unroll 4") for (int q = 0; q < NQ; q++)                               \
                {                                                                                  \
                    x[q] = att_q8_query(qf + h * hs->q_floats + q * qrow, hd);                     \
                    acc[q] = _mm512_setzero_ps();                                                  \
                }                                                                                  \
                for (int b = 0; b < nb; b++, t += LMS_KV_Q4_TILE) {                                \
                    const __m512 kd =                                                              \
                        _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t));                   \
                    __m512i kl[4], kh[4];                                                          \
                    for (int v = 0; v < 4; v++) {                                                  \
                        const __m512i k = _mm512_loadu_si512(t + 2 * LMS_KV_BLOCK + 64 * v);       \
                        kl[v] = _mm512_and_si512(k, m4);                                           \
                        kh[v] = _mm512_and_si512(_mm512_srli_epi16(k, 4), m4);                     \
                    }                                                                              \
                    _Pragma("GCC unroll 4") for (int q = 0; q < NQ; q++)                           \
                    {                                                                              \
                        const int8_t *xw = x[q].qs + b * LMS_QK4_0;                                \
                        __m512i sum = _mm512_set1_epi32(x[q].cblk[b]);                             \
                        for (int v = 0; v < 4; v++) {                                              \
                            ATT_Q4T_DOT(sum, kl[v], xw + 4 * v, VNNI)                              \
                            ATT_Q4T_DOT(sum, kh[v], xw + 16 + 4 * v, VNNI)                         \
                        }                                                                          \
                        acc[q] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),                          \
                                                 _mm512_mul_ps(kd, _mm512_set1_ps(x[q].d[b * 8])), \
                                                 acc[q]);                                          \
                    }                                                                              \
                }                                                                                  \
                _Pragma("GCC unroll 4") for (int q = 0; q < NQ; q++)                               \
                    _mm512_mask_storeu_ps(w + h * hs->w_floats + q * ws + (size_t)jb, mask,        \
                                          acc[q]);                                                 \
            }                                                                                      \
        }                                                                                          \
    }

ATT_SCORES_Q4T(scores_q4t_x, ATT_TARGET, 0)
ATT_SCORES_Q4T(scores_q4t_vnni_x, ATT_TARGET_VNNI, 1)

/* 64 columns at a time: NQ x 4 accumulators; V64 loads a row's 64 values */
#define ATT_VALUES_X(name, V64, COL_BYTES)                                                       \
    ATT_INLINE void name(const att_src *s, int hd, const float *w, size_t ws, int32_t j0,       \
                         int32_t j1, int32_t n, float *out, int mode, const int NQ)              \
    {                                                                                            \
        for (int c0 = 0; c0 < hd; c0 += 64) {                                                    \
            __m512 acc[ATT_ROWS][4];                                                             \
            for (int q = 0; q < NQ; q++)                                                         \
                for (int i = 0; i < 4; i++)                                                      \
                    acc[q][i] = acc_start(out + q * hd + c0 + 16 * i, mode);                   \
            for (int32_t j = j0; j < j1; j++) {                                                  \
                prefetch_ahead(s, j, n, (int64_t)c0 * (COL_BYTES) / 64, COL_BYTES);              \
                __m512 x[4];                                                                     \
                V64(att_row(s, j), c0, x);                                                       \
                for (int q = 0; q < NQ; q++) {                                                   \
                    const __m512 a = _mm512_set1_ps(w[q * ws + (size_t)j]);                      \
                    for (int i = 0; i < 4; i++)                                                  \
                        acc[q][i] = _mm512_fmadd_ps(a, x[i], acc[q][i]);                         \
                }                                                                                \
            }                                                                                    \
            for (int q = 0; q < NQ; q++)                                                         \
                for (int i = 0; i < 4; i++) {                                                    \
                    float *y = out + q * hd + c0 + 16 * i;                                       \
                    _mm512_storeu_ps(y, mode == ATT_V_ADD ? _mm512_add_ps(_mm512_loadu_ps(y),    \
                                                                          acc[q][i])             \
                                                          : acc[q][i]);                          \
                }                                                                                \
        }                                                                                        \
    }

ATT_INLINE void v64_f16(const uint8_t *row, int c0, __m512 *x)
{
    const uint16_t *v = (const uint16_t *)row + c0;
    for (int i = 0; i < 4; i++)
        x[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i)));
}

ATT_VALUES_X(values_f16_x, v64_f16, 128)

/* The two rows' accumulators of a pair kernel (HD / 16 vectors each): their
 * start (acc_start) and their store (added to out for ATT_V_ADD). */
ATT_INLINE void pairs_start(const float *out, int mode, const int HD, __m512 *a0, __m512 *a1)
{
    for (int i = 0; i < HD / 16; i++) {
        a0[i] = acc_start(out + 16 * i, mode);
        a1[i] = acc_start(out + HD + 16 * i, mode);
    }
}

ATT_INLINE void pairs_end(float *out, int mode, const int HD, __m512 *a0, __m512 *a1)
{
    for (int i = 0; i < HD / 16; i++) {
        float *y0 = out + 16 * i, *y1 = out + HD + 16 * i;
        if (mode == ATT_V_ADD) {
            a0[i] = _mm512_add_ps(_mm512_loadu_ps(y0), a0[i]);
            a1[i] = _mm512_add_ps(_mm512_loadu_ps(y1), a1[i]);
        }
        _mm512_storeu_ps(y0, a0[i]);
        _mm512_storeu_ps(y1, a1[i]);
    }
}

/* Two rows of f16 values with HD = 64 or 128 in one pass: all 2 * HD / 16
 * accumulators in registers, each V slice read once (values_f16_x takes 64
 * columns a pass). Every output element is the same FMA chain over j as
 * there. */
ATT_INLINE void values_f16_pairs_x(const att_src *s, const float *w, size_t ws, int32_t j0,
                                   int32_t j1, int32_t n, float *out, int mode, const int HD)
{
    __m512 a0[8], a1[8];
    pairs_start(out, mode, HD, a0, a1);
    for (int32_t jb = j0; jb < j1;) {
        const att_run ru = att_run_at(s, jb, j1, n);
        for (int32_t j = jb; j < ru.je; j++) {
            prefetch_run(s, &ru, j, n, 0, 2 * HD);
            const uint16_t *v = (const uint16_t *)run_row(s, &ru, j);
            const __m512 wa = _mm512_set1_ps(w[j]), wb = _mm512_set1_ps(w[ws + (size_t)j]);
            for (int i = 0; i < HD / 16; i++) {
                const __m512 x =
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * i)));
                a0[i] = _mm512_fmadd_ps(wa, x, a0[i]);
                a1[i] = _mm512_fmadd_ps(wb, x, a1[i]);
            }
        }
        jb = ru.je;
    }
    pairs_end(out, mode, HD, a0, a1);
}

/*
 * q8_0 and q4_0 values: each value dequantized first, q * d (exact in f32:
 * an f16 scale times an integer of at most 8 bits), then one FMA per 16
 * values and row: acc += w * (q * d), as for an f16 cache. The dequantized
 * values are shared by the rows of a pass. Every kernel below and the
 * portable twin use this order.
 */

/* Block b of a V row (q8_0, or q4_0 where Q4): its values 0-15 and 16-31
 * dequantized. q4_0: the scale times the table of q - 8, then each byte in
 * its own lane indexes it; vpermps reads only an index's low 4 bits, so the
 * low nibble indexes it as it is and the high one after a shift (5 vector
 * instructions for the 32 values, where masking, offsetting, converting and
 * scaling took 12). */
ATT_INLINE void blk_lanes(const uint8_t *row, int b, const int Q4, __m512 *x0, __m512 *x1)
{
    const uint8_t *blk = row + b * ATT_BLK_BYTES(Q4), *qs = blk + offsetof(lms_block_q8_0, qs);
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
    if (!Q4) {
        *x0 = _mm512_mul_ps(q8_lanes((const int8_t *)qs), d);
        *x1 = _mm512_mul_ps(q8_lanes((const int8_t *)qs + 16), d);
    } else {
        const __m512 t = _mm512_mul_ps(
            _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7), d);
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
        *x0 = _mm512_permutexvar_ps(v, t);
        *x1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), t);
    }
}

/* 64 columns (two blocks) at a time, NQ x 4 accumulators */
ATT_INLINE void values_blk_x(const att_src *s, int hd, const float *w, size_t ws, int32_t j0,
                             int32_t j1, int32_t n, float *out, int mode, const int Q4,
                             const int NQ)
{
    const int64_t bs = (int64_t)ATT_BLK_BYTES(Q4);
    for (int c0 = 0; c0 < hd; c0 += 64) {
        __m512 acc[ATT_ROWS][4];
        for (int q = 0; q < NQ; q++)
            for (int i = 0; i < 4; i++)
                acc[q][i] = acc_start(out + q * hd + c0 + 16 * i, mode);
        for (int32_t j = j0; j < j1; j++) {
            prefetch_ahead(s, j, n, (int64_t)c0 / LMS_QK8_0 * bs, 2 * bs);
            const uint8_t *v = att_row(s, j);
            for (int b = 0; b < 2; b++) {
                __m512 x0, x1;
                blk_lanes(v, c0 / LMS_QK8_0 + b, Q4, &x0, &x1);
                for (int q = 0; q < NQ; q++) {
                    const __m512 e = _mm512_set1_ps(w[q * ws + (size_t)j]);
                    acc[q][2 * b] = _mm512_fmadd_ps(e, x0, acc[q][2 * b]);
                    acc[q][2 * b + 1] = _mm512_fmadd_ps(e, x1, acc[q][2 * b + 1]);
                }
            }
        }
        for (int q = 0; q < NQ; q++)
            for (int i = 0; i < 4; i++) {
                float *y = out + q * hd + c0 + 16 * i;
                _mm512_storeu_ps(y, mode == ATT_V_ADD ? _mm512_add_ps(_mm512_loadu_ps(y), acc[q][i])
                                                      : acc[q][i]);
            }
    }
}

/* Two rows of q8_0 (q4_0) values with HD = 64 or 128 in one pass, as
 * values_f16_pairs_x: all accumulators in registers, each V slice read
 * once; per output element the same FMA chain as values_blk_x. */
ATT_INLINE void values_blk_pairs_x(const att_src *s, const float *w, size_t ws, int32_t j0,
                                   int32_t j1, int32_t n, float *out, int mode, const int Q4,
                                   const int HD)
{
    __m512 a0[8], a1[8];
    pairs_start(out, mode, HD, a0, a1);
    for (int32_t jb = j0; jb < j1;) {
        const att_run ru = att_run_at(s, jb, j1, n);
        for (int32_t j = jb; j < ru.je; j++) {
            prefetch_run(s, &ru, j, n, 0, HD / LMS_QK8_0 * (int64_t)ATT_BLK_BYTES(Q4));
            const uint8_t *v = run_row(s, &ru, j);
            const __m512 ea = _mm512_set1_ps(w[j]), eb = _mm512_set1_ps(w[ws + (size_t)j]);
            for (int b = 0; b < HD / LMS_QK8_0; b++) {
                __m512 x0, x1;
                blk_lanes(v, b, Q4, &x0, &x1);
                a0[2 * b] = _mm512_fmadd_ps(ea, x0, a0[2 * b]);
                a0[2 * b + 1] = _mm512_fmadd_ps(ea, x1, a0[2 * b + 1]);
                a1[2 * b] = _mm512_fmadd_ps(eb, x0, a1[2 * b]);
                a1[2 * b + 1] = _mm512_fmadd_ps(eb, x1, a1[2 * b + 1]);
            }
        }
        jb = ru.je;
    }
    pairs_end(out, mode, HD, a0, a1);
}

/* Dispatch on the pass's row count so each copy keeps its rows in registers. */
#define ATT_BY_ROWS(fn, nq, ...)            \
    switch (nq) {                           \
    case 1: fn(__VA_ARGS__, 1); break;      \
    case 2: fn(__VA_ARGS__, 2); break;      \
    case 3: fn(__VA_ARGS__, 3); break;      \
    default: fn(__VA_ARGS__, 4); break;     \
    }

/* A scores entry point: the GQA-pair kernel `pairs` for decode steps with
 * two rows a head and head sizes 64 and 128, else `rows` by row count. */
#define ATT_SCORES_AVX512(name, TARGET, pairs, rows)                                          \
    TARGET static void name(const att_src *s, int hd, int nq, const float *qf, size_t qrow,   \
                            int32_t j0, int32_t j1, int32_t n, float *w, size_t ws,           \
                            const att_heads *hs)                                              \
    {                                                                                         \
        if (hs->n > 1 && nq == 2 && (hd == 64 || hd == 128)) {                                \
            if (hd == 64)                                                                     \
                pairs(s, qf, qrow, j0, j1, n, w, ws, hs, 64);                                 \
            else                                                                              \
                pairs(s, qf, qrow, j0, j1, n, w, ws, hs, 128);                                \
            return;                                                                           \
        }                                                                                     \
        ATT_BY_ROWS(rows, nq, s, hd, qf, qrow, j0, j1, n, w, ws, hs)                          \
    }

ATT_SCORES_AVX512(scores_f16_avx512, ATT_TARGET, scores_f16_pairs_x, scores_f16_x)
ATT_SCORES_AVX512(scores_q8_0_avx512, ATT_TARGET, scores_q8_0_pairs_x, scores_q8_0_x)
ATT_SCORES_AVX512(scores_q8_0_vnni, ATT_TARGET_VNNI, scores_q8_0_vnni_pairs_x, scores_q8_0_vnni_x)

/* the q4_0 entry points: the tiled kernel by row count */
#define ATT_SCORES_Q4T_ENTRY(name, TARGET, rows)                                              \
    TARGET static void name(const att_src *s, int hd, int nq, const float *qf, size_t qrow,   \
                            int32_t j0, int32_t j1, int32_t n, float *w, size_t ws,           \
                            const att_heads *hs)                                              \
    {                                                                                         \
        ATT_BY_ROWS(rows, nq, s, hd, qf, qrow, j0, j1, n, w, ws, hs)                          \
    }

ATT_SCORES_Q4T_ENTRY(scores_q4_0_avx512, ATT_TARGET, scores_q4t_x)
ATT_SCORES_Q4T_ENTRY(scores_q4_0_vnni, ATT_TARGET_VNNI, scores_q4t_vnni_x)

/* The values of a call's heads in turn, inlined into one function (a
 * decode step makes a call per cache block: per head, it would cost an
 * indirect call and a dispatch every 16 positions). */
#define ATT_VALUES_HEADS(fn, ...)                                                  \
    for (int h = 0; h < hs->n; h++) {                                            \
        att_src sh = *s;                                                         \
        sh.off += (size_t)h * hs->k_bytes;                                       \
        const float *wh = w + h * hs->w_floats;                                  \
        float *oh = out + h * hs->q_floats;                                      \
        fn(&sh, __VA_ARGS__);                                                    \
    }

/* The value pass of one cache block over every head: the GQA-pair kernel
 * `pairs` for head sizes 64 and 128, else `rows` row by row. */
#define ATT_VALUES_BLOCK(pairs, rows)                                                    \
    if (nq == 2 && hd == 64) {                                                           \
        ATT_VALUES_HEADS(pairs, wh, ws, j0, j1, n, oh, mode, 64)                         \
    } else if (nq == 2 && hd == 128) {                                                   \
        ATT_VALUES_HEADS(pairs, wh, ws, j0, j1, n, oh, mode, 128)                        \
    } else {                                                                             \
        for (int h = 0; h < hs->n; h++) {                                                \
            att_src sh = *s;                                                             \
            sh.off += (size_t)h * hs->k_bytes;                                           \
            ATT_BY_ROWS(rows, nq, &sh, hd, w + h * hs->w_floats, ws, j0, j1, n,          \
                        out + h * hs->q_floats, mode)                                    \
        }                                                                                \
    }

ATT_TARGET static void values_f16_avx512(const att_src *s, int hd, int nq, const float *w,
                                         size_t ws, int32_t j0, int32_t j1, int32_t n, float *out,
                                         int mode, const att_heads *hs)
{
    ATT_VALUES_BLOCK(values_f16_pairs_x, values_f16_x)
}

/* The q8_0 and q4_0 values kernels with the type fixed, as
 * ATT_VALUES_BLOCK takes them, and their entry points. */
#define ATT_VALUES_BLK(name, Q4)                                                              \
    ATT_INLINE void name##_pairs_x(const att_src *s, const float *w, size_t ws, int32_t j0,   \
                                   int32_t j1, int32_t n, float *out, int mode, const int HD) \
    {                                                                                         \
        values_blk_pairs_x(s, w, ws, j0, j1, n, out, mode, Q4, HD);                           \
    }                                                                                         \
    ATT_INLINE void name##_x(const att_src *s, int hd, const float *w, size_t ws, int32_t j0, \
                             int32_t j1, int32_t n, float *out, int mode, const int NQ)       \
    {                                                                                         \
        values_blk_x(s, hd, w, ws, j0, j1, n, out, mode, Q4, NQ);                             \
    }                                                                                         \
    ATT_TARGET static void name##_avx512(const att_src *s, int hd, int nq, const float *w,    \
                                         size_t ws, int32_t j0, int32_t j1, int32_t n,        \
                                         float *out, int mode, const att_heads *hs)           \
    {                                                                                         \
        ATT_VALUES_BLOCK(name##_pairs_x, name##_x)                                            \
    }

ATT_VALUES_BLK(values_q8_0, 0)
ATT_VALUES_BLK(values_q4_0, 1)

/* w[j] = w[j] * inv rounded to f16 (to nearest even, as ROUND_F16), as floats */
ATT_TARGET static void round_f16_avx512(float *w, int32_t n, float inv)
{
    const __m512 s = _mm512_set1_ps(inv);
    int32_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(w + j, _mm512_cvtph_ps(_mm512_cvtps_ph(
                                    _mm512_mul_ps(_mm512_loadu_ps(w + j), s),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    if (j < n) {
        const __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
        _mm512_mask_storeu_ps(w + j, m, _mm512_cvtph_ps(_mm512_cvtps_ph(
                                             _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + j), s),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    }
}
#endif /* ATT_AVX512 */

typedef void (*att_scores_fn)(const att_src *s, int hd, int nq, const float *qf, size_t qrow,
                              int32_t j0, int32_t j1, int32_t n, float *w, size_t ws,
                              const att_heads *hs);
typedef void (*att_values_fn)(const att_src *s, int hd, int nq, const float *w, size_t ws,
                              int32_t j0, int32_t j1, int32_t n, float *out, int mode,
                              const att_heads *hs);

typedef struct att_kernels {
    att_scores_fn scores;
    att_values_fn values;
} att_kernels;

static att_kernels att_pick(const lms_ctx *c)
{
    const int t = c->kv.type;
    att_kernels k = {scores_f16_c, values_f16_c};
    if (t == LMS_TYPE_Q8_0)
        k = (att_kernels){scores_q8_0_c, values_q8_0_c};
    else if (t == LMS_TYPE_Q4_0)
        k = (att_kernels){scores_q4_0_c, values_q4_0_c};
#ifdef ATT_AVX512
    if (c->att_impl == FWD_ATT_AVX512) {
        /* LMS_ATT_NO_VNNI=1: the AVX512BW products instead (the same integers) */
        const bool vnni = __builtin_cpu_supports("avx512vnni") && !getenv("LMS_ATT_NO_VNNI");
        k = (att_kernels){scores_f16_avx512, values_f16_avx512};
        if (t == LMS_TYPE_Q8_0)
            k = (att_kernels){vnni ? scores_q8_0_vnni : scores_q8_0_avx512, values_q8_0_avx512};
        else if (t == LMS_TYPE_Q4_0)
            k = (att_kernels){vnni ? scores_q4_0_vnni : scores_q4_0_avx512, values_q4_0_avx512};
    }
#endif
    return k;
}

/* KV head kvh's K and V slices of a tile's sequence in layer il. */
static void att_srcs(const lms_ctx *c, int il, const lms_kv_seq *seq, int kvh, att_src *ks,
                     att_src *vs)
{
    const int il_host = il - c->n_gpu;
    const size_t off = lms_row_size(c->kv.type, (int64_t)kvh * c->m->hp.head_dim);
    *ks = (att_src){c->kv.k + (size_t)il_host * c->kv.layer_stride, seq->blocks, c->kv.row_bytes,
                    off, lms_kv_k_tiled(c->kv.type)};
    *vs = *ks;
    vs->base = c->kv.v + (size_t)il_host * c->kv.layer_stride;
    vs->tiled = false;
}

/* Scores rows [r0, r0 + nr) of qf against positions [j0, j1), in passes. */
static void scores_rows(const att_kernels *k, const att_src *ks, int hd, int nr, const float *qf,
                        size_t qrow, int32_t j0, int32_t j1, int32_t n, float *w, size_t ws,
                        const att_heads *hs)
{
    for (int q0 = 0; q0 < nr; q0 += ATT_ROWS)
        k->scores(ks, hd, nr - q0 < ATT_ROWS ? nr - q0 : ATT_ROWS, qf + (size_t)q0 * qrow, qrow,
                  j0, j1, n, w + (size_t)q0 * ws, ws, hs);
}

static void values_rows(const att_kernels *k, const att_src *vs, int hd, int nr, const float *w,
                        size_t ws, int32_t j0, int32_t j1, int32_t n, float *out, int mode,
                        const att_heads *hs)
{
    for (int q0 = 0; q0 < nr; q0 += ATT_ROWS)
        k->values(vs, hd, nr - q0 < ATT_ROWS ? nr - q0 : ATT_ROWS, w + (size_t)q0 * ws, ws, j0, j1,
                  n, out + (size_t)q0 * hd, mode, hs);
}

/* w[j] *= s over n values (vectorized per level, the same products) */
LMS_CLONES static void scale_row(float *w, int32_t n, float s)
{
    for (int32_t j = 0; j < n; j++)
        w[j] *= s;
}

/* w[j] = cap * tanh(w[j] * (1 / cap)): the products as ggml's scale ops
 * round them (llama.cpp's gemma2 graph). */
static void softcap_row(float *w, int32_t n, float cap)
{
    const float inv = 1.0f / cap;
    for (int32_t j = 0; j < n; j++)
        w[j] = tanhf(w[j] * inv) * cap;
}

/* The row of a query at position n - 1 (n scores): positions before the
 * window get weight 0; the others are scaled, soft-capped, then softmaxed. */
static void att_softmax(const lms_ctx *c, float *wq, int32_t n, const att_mask *am)
{
    (void)c; /* without AVX-512 */
    if (am->n_swa > 0 && n > am->n_swa) {
        memset(wq, 0, (size_t)(n - am->n_swa) * sizeof *wq);
        wq += n - am->n_swa;
        n = am->n_swa;
    }
    if (am->scale != 1.0f)
        scale_row(wq, n, am->scale);
    if (am->softcap != 0.0f)
        softcap_row(wq, n, am->softcap);
#ifdef ATT_AVX512
    if (c->att_impl == FWD_ATT_AVX512) {
        round_f16_avx512(wq, n, softmax_exp(wq, n));
        return;
    }
#endif
    softmax_f16(wq, n);
}

/* The by-head schedule: one (tile, KV head). */
static void attend_tile_rows(lms_ctx *c, int il, const att_tile *a, int kvh, int tid)
{
    const lms_hparams *hp = &c->m->hp;
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    const int64_t q_stride = (int64_t)hp->n_head * hd;
    const int32_t stride = c->p.n_ctx, n_q = a->n_tok * group, n_max = a->pos0 + a->n_tok;
    const size_t qrow = (size_t)hd + (size_t)hd / LMS_QK8_0;
    float *w = c->scores + (size_t)tid * ATT_TILE * group * stride;
    float *qf = c->qf + (size_t)tid * c->qf_rows * qrow;
    const att_kernels k = att_pick(c);
    att_src ks, vs;
    att_srcs(c, il, a->seq, kvh, &ks, &vs);
    /* queries: row t * group + g is token t's head kvh * group + g */
    for (int32_t t = 0; t < a->n_tok; t++)
        for (int g = 0; g < group; g++)
            load_query(c->kv.type, hd,
                       c->qb + (a->t0 + t) * q_stride + ((int64_t)kvh * group + g) * hd,
                       qf + (size_t)(t * group + g) * qrow);
    const att_heads one = {1, 0, 0, 0};
    const att_mask am = att_mask_of(c, il);
    /* the tile's first token has the earliest window */
    scores_rows(&k, &ks, hd, n_q, qf, qrow, att_first(&am, a->pos0 + 1), n_max, n_max, w,
                (size_t)stride, &one);
    for (int qi = 0; qi < n_q; qi++)
        att_softmax(c, w + (size_t)qi * stride, a->pos0 + qi / group + 1, &am);
    /* a pass takes rows of one token (they see the same positions) */
    for (int32_t t = 0; t < a->n_tok; t++) {
        float *out = c->att + (a->t0 + t) * q_stride + (int64_t)kvh * group * hd;
        const int32_t n = a->pos0 + t + 1, first = att_first_chunk(&am, n) * ATT_CHUNK;
        for (int32_t j0 = first; j0 < n; j0 += ATT_CHUNK)
            values_rows(&k, &vs, hd, group, w + (size_t)t * group * stride, (size_t)stride, j0,
                        j0 + ATT_CHUNK < n ? j0 + ATT_CHUNK : n, n, out,
                        j0 > first ? ATT_V_ADD : ATT_V_SET, &one);
    }
}

/* Where a decode step's scores and chunk sums live, in c->dec: per tile,
 * the scores [n_head][ws] then the chunk sums [n_chunk][n_head][hd]; ws is
 * the longest tile's position count rounded up to ATT_CHUNK. */
typedef struct att_step_layout {
    int32_t n_chunk;
    size_t ws;
    size_t per_tile; /* floats */
} att_step_layout;

/* The layout of a step of single-token tiles; false when a tile has more
 * tokens or the step does not fit c->dec and c->qf. */
static bool att_layout(const lms_ctx *c, const att_tile *tiles, int32_t n_tiles,
                       att_step_layout *l)
{
    const lms_hparams *hp = &c->m->hp;
    int32_t n_longest = 0;
    for (int32_t i = 0; i < n_tiles; i++) {
        if (tiles[i].n_tok != 1)
            return false;
        n_longest = tiles[i].pos0 + 1 > n_longest ? tiles[i].pos0 + 1 : n_longest;
    }
    l->n_chunk = (n_longest + ATT_CHUNK - 1) / ATT_CHUNK;
    l->ws = (size_t)l->n_chunk * ATT_CHUNK;
    l->per_tile = (size_t)hp->n_head * l->ws + (size_t)l->n_chunk * hp->n_head * hp->head_dim;
    return (size_t)n_tiles * l->per_tile <= c->dec_floats && n_tiles <= c->qf_tiles;
}

/* Chunk ci's sums of tile ti for KV heads [h0, h1). f16 cache: block by
 * block, each block's heads in turn (one values call a block). The cached
 * rows are then read whole, in address order, a block at a time (each
 * head's pass prefetches its slice ATT_PF rows ahead). A pass per head over
 * the whole chunk (fewer, longer kernel calls: faster on cached rows) reads
 * each row in head slices far apart in time, and was 10-15% slower on an
 * f16 cache at depth 1024 (rows from DRAM), prefetching however. q8_0
 * and q4_0 caches: one call for the chunk (a pass per head over it). Their kernels
 * are bound by their arithmetic more than by memory (a values pass over
 * rows in L2 takes about as long as one over rows from DRAM), and the
 * fewer calls (the accumulators started and stored once a head and chunk,
 * not once a block) made decode attention at depth 1024 2-3% faster in an
 * attention-only timing (within the noise of whole decode steps); on f16
 * the same change was 3% slower. */
static void att_chunk_sums(lms_ctx *c, int il, const att_kernels *k, const att_tile *a,
                           const att_step_layout *l, int32_t ti, int32_t ci, int h0, int h1)
{
    const lms_hparams *hp = &c->m->hp;
    const int hd = hp->head_dim, nh = hp->n_head, group = nh / hp->n_head_kv;
    const int32_t n = a->pos0 + 1, j0 = ci * ATT_CHUNK;
    const int32_t step = c->kv.type != LMS_TYPE_F16 ? ATT_CHUNK : LMS_KV_BLOCK;
    const float *w = c->dec + (size_t)ti * l->per_tile + (size_t)h0 * group * l->ws;
    float *sum = c->dec + (size_t)ti * l->per_tile + (size_t)nh * l->ws + (size_t)ci * nh * hd +
                 (size_t)h0 * group * hd;
    const att_heads heads = {h1 - h0, lms_row_size(c->kv.type, hd), (size_t)group * hd,
                             (size_t)group * l->ws};
    att_src ks, vs;
    att_srcs(c, il, a->seq, h0, &ks, &vs);
    for (int32_t b0 = j0; b0 < n && b0 < j0 + ATT_CHUNK; b0 += step)
        values_rows(k, &vs, hd, group, w, l->ws, b0, b0 + step < n ? b0 + step : n, n, sum,
                    b0 > j0 ? ATT_V_CONT : ATT_V_SET, &heads);
}

/* The first ATT_PF rows of a run of positions from j0, bytes from a row's
 * start (a thread's first rows in a phase: the kernels prefetch ATT_PF
 * positions ahead of their reads, which leaves these to demand misses). */
static void att_prefetch_rows(const att_src *s, int32_t j0, int32_t j1, size_t bytes)
{
    if (s->tiled) { /* the blocks' tiles of those rows */
        for (int32_t j = j0; j < j1 && j < j0 + ATT_PF; j = (j / LMS_KV_BLOCK + 1) * LMS_KV_BLOCK)
            for (size_t o = 0; o < LMS_KV_BLOCK * bytes; o += 64)
                __builtin_prefetch(att_tiles(s, j) + o, 0, 2);
        return;
    }
    for (int32_t j = j0; j < j1 && j < j0 + ATT_PF; j++)
        for (size_t o = 0; o < bytes; o += 64)
            __builtin_prefetch(att_row(s, j) + o, 0, 2);
}

/* Thread t's share (of nt) of a tile's chunk sums: the (chunk, KV head)
 * items in chunk-major order, each weighing its chunk's positions, cut into
 * nt contiguous runs of equal weight: mostly whole chunks (whole cached
 * rows), and an even split whatever the chunk count (a last chunk shorter
 * than the others, or fewer chunks than threads). Sets the share's KV heads
 * [*h0, *h1) of chunk ci; false when it has none there. */
static bool att_share_heads(const lms_ctx *c, const att_tile *a, int32_t c0, int32_t ci, int t,
                            int nt, int *h0, int *h1)
{
    const int nkv = c->m->hp.n_head_kv;
    const int32_t n = a->pos0 + 1;
    const int64_t total = (int64_t)(n - c0 * ATT_CHUNK) * nkv, w0 = total * t / nt,
                  w1 = total * (t + 1) / nt;
    /* head h of chunk ci starts at weight base + h * len (the chunks from c0
     * before it are whole); it is this thread's if that is in [w0, w1) */
    const int64_t base = (int64_t)(ci - c0) * ATT_CHUNK * nkv;
    const int64_t len = n - ci * ATT_CHUNK < ATT_CHUNK ? n - ci * ATT_CHUNK : ATT_CHUNK;
    const int64_t lo = w0 <= base ? 0 : (w0 - base + len - 1) / len;
    const int64_t hi = w1 <= base ? 0 : (w1 - base + len - 1) / len;
    if (lo >= hi || lo >= nkv)
        return false;
    *h0 = (int)lo;
    *h1 = (int)(hi < nkv ? hi : nkv);
    return true;
}

/* Thread t's share of tile ti's chunk sums from chunk c0 (att_share_heads). */
static void att_chunk_share(lms_ctx *c, int il, const att_kernels *k, const att_tile *a,
                            const att_step_layout *l, int32_t ti, int32_t c0, int t, int nt)
{
    int h0, h1;
    for (int32_t ci = c0; (int64_t)ci * ATT_CHUNK <= a->pos0; ci++)
        if (att_share_heads(c, a, c0, ci, t, nt, &h0, &h1))
            att_chunk_sums(c, il, k, a, l, ti, ci, h0, h1);
}

/* Prefetches the first V rows (its heads of them) of thread t's share. */
static void att_chunk_share_prefetch(lms_ctx *c, int il, const att_tile *a, int32_t c0, int t,
                                     int nt)
{
    int h0, h1;
    for (int32_t ci = c0; (int64_t)ci * ATT_CHUNK <= a->pos0; ci++)
        if (att_share_heads(c, a, c0, ci, t, nt, &h0, &h1)) {
            att_src ks, vs;
            att_srcs(c, il, a->seq, h0, &ks, &vs);
            att_prefetch_rows(&vs, ci * ATT_CHUNK, a->pos0 + 1,
                              lms_row_size(c->kv.type, (int64_t)(h1 - h0) * c->m->hp.head_dim));
            return;
        }
}

/* out = chunk c0 + chunk c0 + 1 + ..., left to right, for row r of tile ti */
static void att_merge(lms_ctx *c, const att_tile *a, const att_step_layout *l, int32_t ti,
                      int32_t c0, int r)
{
    const int hd = c->m->hp.head_dim, nh = c->m->hp.n_head;
    const float *sum = c->dec + (size_t)ti * l->per_tile + (size_t)nh * l->ws + (size_t)r * hd;
    float *out = c->att + a->t0 * (int64_t)nh * hd + (int64_t)r * hd;
    memcpy(out, sum + (size_t)c0 * nh * hd, (size_t)hd * sizeof(float));
    for (int32_t ci = c0 + 1; ci <= a->pos0 / ATT_CHUNK; ci++)
        for (int d = 0; d < hd; d++)
            out[d] += sum[(size_t)ci * nh * hd + d];
}

/* The by-chunk schedule: each thread takes a contiguous range of every
 * tile's cached rows, whole (every KV head), which streams at about twice
 * the bandwidth of threads taking parts of each row. Phases: queries;
 * scores of the thread's blocks; softmax; chunk sums ((chunk, KV head)
 * items in shares of equal weight, att_chunk_share); merge. Each thread's
 * first K rows are prefetched before its queries, its first V rows before
 * the softmax (Qwen3-0.6B at depth 1024, in-process A/B: the attention of
 * a token 2-5% faster, f16 and q8_0 caches). */
static bool attention_by_chunk(lms_ctx *c, int il, const att_tile *tiles, int32_t n_tiles)
{
    const lms_hparams *hp = &c->m->hp;
    const int hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, group = nh / nkv;
    att_step_layout l;
    if (!att_layout(c, tiles, n_tiles, &l))
        return false;
    const size_t qrow = (size_t)hd + (size_t)hd / LMS_QK8_0;
    const att_kernels k = att_pick(c);
    const att_heads heads = {nkv, lms_row_size(c->kv.type, hd), (size_t)group * qrow,
                             (size_t)group * l.ws};
    const att_mask am = att_mask_of(c, il);
    const bool par = (int64_t)n_tiles * l.n_chunk * ATT_CHUNK * nh * hd >= 65536;
    (void)par; /* without OpenMP */
#pragma omp parallel if (par)
    {
#ifdef _OPENMP
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
        const int nt = 1, t = 0;
#endif
        for (int32_t ti = 0; ti < n_tiles; ti++) {
            const int32_t n = tiles[ti].pos0 + 1, nb = (n + LMS_KV_BLOCK - 1) / LMS_KV_BLOCK;
            const int32_t b0 = att_first(&am, n) / LMS_KV_BLOCK;
            att_src ks, vs;
            att_srcs(c, il, tiles[ti].seq, 0, &ks, &vs);
            att_prefetch_rows(&ks, (b0 + (nb - b0) * t / nt) * LMS_KV_BLOCK, n, c->kv.row_bytes);
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)n_tiles * nh; r++)
            load_query(c->kv.type, hd, c->qb + tiles[r / nh].t0 * (int64_t)nh * hd + (r % nh) * hd,
                       c->qf + (size_t)r * qrow);
        for (int32_t ti = 0; ti < n_tiles; ti++) {
            /* the thread's blocks of those holding the window */
            const int32_t n = tiles[ti].pos0 + 1, nb = (n + LMS_KV_BLOCK - 1) / LMS_KV_BLOCK;
            const int32_t b0 = att_first(&am, n) / LMS_KV_BLOCK;
            const int32_t j0 = (b0 + (nb - b0) * t / nt) * LMS_KV_BLOCK,
                          j1 = (b0 + (nb - b0) * (t + 1) / nt) * LMS_KV_BLOCK;
            att_src ks, vs;
            att_srcs(c, il, tiles[ti].seq, 0, &ks, &vs);
            if (j0 < j1)
                scores_rows(&k, &ks, hd, group, c->qf + (size_t)ti * nh * qrow, qrow, j0,
                            j1 < n ? j1 : n, n, c->dec + (size_t)ti * l.per_tile, l.ws, &heads);
        }
        for (int32_t ti = 0; ti < n_tiles; ti++)
            att_chunk_share_prefetch(c, il, &tiles[ti], att_first_chunk(&am, tiles[ti].pos0 + 1),
                                     t, nt);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)n_tiles * nh; r++)
            att_softmax(c, c->dec + (size_t)(r / nh) * l.per_tile + (size_t)(r % nh) * l.ws,
                        tiles[r / nh].pos0 + 1, &am);
        for (int32_t ti = 0; ti < n_tiles; ti++)
            att_chunk_share(c, il, &k, &tiles[ti], &l, ti,
                            att_first_chunk(&am, tiles[ti].pos0 + 1), t, nt);
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)n_tiles * nh; r++)
            att_merge(c, &tiles[r / nh], &l, (int32_t)(r / nh),
                      att_first_chunk(&am, tiles[r / nh].pos0 + 1), (int)(r % nh));
    }
    return true;
}

/*
 * The by-group schedule for steps of many single-token tiles: one work item
 * per tile, done start to end by one thread with no waiting on the others:
 * scores walking the tile's rows once (whole rows, in address order),
 * softmax, chunk sums, merge. Same layout in c->dec as by chunk.
 */
static bool attention_by_group(lms_ctx *c, int il, const att_tile *tiles, int32_t n_tiles)
{
    const lms_hparams *hp = &c->m->hp;
    const int hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, group = nh / nkv;
    att_step_layout l;
    if (n_tiles < 2 * c->n_threads || !att_layout(c, tiles, n_tiles, &l))
        return false;
    const size_t qrow = (size_t)hd + (size_t)hd / LMS_QK8_0;
    const att_kernels k = att_pick(c);
    const att_heads heads = {nkv, lms_row_size(c->kv.type, hd), (size_t)group * qrow,
                             (size_t)group * l.ws};
    const att_mask am = att_mask_of(c, il);
#pragma omp parallel for schedule(dynamic, 1)
    for (int32_t ti = 0; ti < n_tiles; ti++) {
        const att_tile *a = &tiles[ti];
        const int32_t n = a->pos0 + 1;
        float *w = c->dec + (size_t)ti * l.per_tile, *qf = c->qf + (size_t)ti * nh * qrow;
        for (int r = 0; r < nh; r++)
            load_query(c->kv.type, hd, c->qb + a->t0 * (int64_t)nh * hd + (int64_t)r * hd,
                       qf + (size_t)r * qrow);
        const int32_t c0 = att_first_chunk(&am, n);
        att_src ks, vs;
        att_srcs(c, il, a->seq, 0, &ks, &vs);
        scores_rows(&k, &ks, hd, group, qf, qrow, att_first(&am, n), n, n, w, l.ws, &heads);
        for (int r = 0; r < nh; r++)
            att_softmax(c, w + (size_t)r * l.ws, n, &am);
        for (int32_t ci = c0; ci <= a->pos0 / ATT_CHUNK; ci++)
            att_chunk_sums(c, il, &k, a, &l, ti, ci, 0, nkv);
        for (int r = 0; r < nh; r++)
            att_merge(c, a, &l, ti, c0, r);
    }
    return true;
}

/* Thread t's share (of nt) of a by-heads step: KV heads [nkv t / nt,
 * nkv (t + 1) / nt) of every tile, start to end: queries, scores, softmax,
 * chunk sums, merge, the same calls as by chunk over those heads alone.
 * The share's first ATT_PF rows (K and V slices) are fetched before the
 * scores start: the kernels prefetch ATT_PF positions ahead, which leaves
 * those rows to demand misses, and at these depths they are a large part
 * of the step (a step's rows are cold: the layer's weights streamed since;
 * the attention of a step at depth 16-128 took 7-10% less time with it). */
static void att_heads_share(lms_ctx *c, int il, const att_kernels *k, const att_tile *tiles,
                            int32_t n_tiles, const att_step_layout *l, int t, int nt)
{
    const lms_hparams *hp = &c->m->hp;
    const int hd = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv, group = nh / nkv;
    const int h0 = nkv * t / nt, h1 = nkv * (t + 1) / nt;
    if (h0 == h1)
        return;
    const size_t qrow = (size_t)hd + (size_t)hd / LMS_QK8_0;
    const att_heads heads = {h1 - h0, lms_row_size(c->kv.type, hd), (size_t)group * qrow,
                             (size_t)group * l->ws};
    const size_t bytes = (size_t)heads.n * heads.k_bytes; /* the share of a row */
    const att_mask am = att_mask_of(c, il);
    for (int32_t ti = 0; ti < n_tiles; ti++) {
        const att_tile *a = &tiles[ti];
        const int32_t n = a->pos0 + 1, first = att_first(&am, n), c0 = first / ATT_CHUNK;
        float *w = c->dec + (size_t)ti * l->per_tile, *qf = c->qf + (size_t)ti * nh * qrow;
        att_src ks, vs;
        att_srcs(c, il, a->seq, h0, &ks, &vs);
        att_prefetch_rows(&ks, first, n, bytes);
        att_prefetch_rows(&vs, c0 * ATT_CHUNK, n, bytes);
        for (int r = h0 * group; r < h1 * group; r++)
            load_query(c->kv.type, hd, c->qb + a->t0 * (int64_t)nh * hd + (int64_t)r * hd,
                       qf + (size_t)r * qrow);
        scores_rows(k, &ks, hd, group, qf + (size_t)h0 * group * qrow, qrow, first, n, n,
                    w + (size_t)h0 * group * l->ws, l->ws, &heads);
        for (int r = h0 * group; r < h1 * group; r++)
            att_softmax(c, w + (size_t)r * l->ws, n, &am);
        for (int32_t ci = c0; ci <= a->pos0 / ATT_CHUNK; ci++)
            att_chunk_sums(c, il, k, a, l, ti, ci, h0, h1);
        for (int r = h0 * group; r < h1 * group; r++)
            att_merge(c, a, l, ti, c0, r);
    }
}

/*
 * The cached bytes (K rows, all heads, over the step's tiles) up to which
 * a decode step goes by heads rather than by chunk; LMS_ATT_HEADS_MAX
 * (read by fwd_set_attention, for the whole process) overrides it: tests,
 * A/B timings. Qwen3-0.6B, 2 threads, one sequence, attention time of a
 * token (in-process A/B, token by token): by heads 24-37% less at depth
 * 0-128, 12-24% less at 128-288, even at 320-384 (f16) and 448-512
 * (q8_0), 17% more at 1024 (f16): its threads read parts of each row,
 * which streams worse than by chunk's whole rows. 576 KiB: 288 positions
 * of that model's f16 cache, 542 of its q8_0 cache. A q4_0 cache goes by
 * heads up to 1 MiB (1820 positions there): its kernels cost about what
 * q8_0's do per position on half the bytes, and by heads was 10% faster
 * at depth 1024, 5% at 1536 and even at 2048 (attention alone, 16 MiB
 * read between layers as the weights would; the same runs: q8_0 by chunk
 * 7-11% faster at 768-1024, f16 20% at 1024). With q4_0's K tiled
 * (ATT_SCORES_Q4T), by heads still leads at 1024: 2.05 vs 2.24 ms for the
 * 28 layers' attention of a token (attention alone, cold rows, the two
 * alternating in one process); each thread's K is then one run of bytes
 * per cache block.
 */
#define ATT_HEADS_MAX_BYTES ((int64_t)576 << 10)
#define ATT_HEADS_MAX_BYTES_Q4 ((int64_t)1 << 20)
static int64_t att_heads_max = -1; /* -1: by the cache type, as above */

/* The by-heads schedule (see the top of this section); false when the step
 * is not for it. */
static bool attention_by_heads(lms_ctx *c, int il, const att_tile *tiles, int32_t n_tiles)
{
    att_step_layout l;
    const att_mask am = att_mask_of(c, il);
    int64_t n_pos = 0; /* the positions read */
    for (int32_t ti = 0; ti < n_tiles; ti++)
        n_pos += tiles[ti].pos0 + 1 - att_first(&am, tiles[ti].pos0 + 1);
    const int64_t max = att_heads_max >= 0                 ? att_heads_max
                        : c->kv.type == LMS_TYPE_Q4_0 ? ATT_HEADS_MAX_BYTES_Q4
                                                      : ATT_HEADS_MAX_BYTES;
    if (c->m->hp.n_head_kv < c->n_threads || n_pos * (int64_t)c->kv.row_bytes > max ||
        !att_layout(c, tiles, n_tiles, &l))
        return false;
    const att_kernels k = att_pick(c);
    if (c->n_threads < 2) { /* (no OpenMP region: even one of a thread costs) */
        att_heads_share(c, il, &k, tiles, n_tiles, &l, 0, 1);
        return true;
    }
#pragma omp parallel
    {
#ifdef _OPENMP
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
        const int nt = 1, t = 0;
#endif
        att_heads_share(c, il, &k, tiles, n_tiles, &l, t, nt);
    }
    return true;
}

int fwd_set_attention(lms_ctx *c, int impl)
{
    bool simd = false;
#ifdef ATT_AVX512
    const int hd = c->m->hp.head_dim;
    /* (every AVX-512 CPU has F16C, which clang's builtin cannot name) */
    simd = hd % 64 == 0 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
#endif
    const char *env = getenv("LMS_ATTENTION"); /* ref | c: for A/B timings */
    const char *heads = getenv("LMS_ATT_HEADS_MAX");
    att_heads_max = heads ? strtoll(heads, NULL, 10) : -1;
    if (impl == FWD_ATT_AUTO && env && (!strcmp(env, "ref") || !strcmp(env, "c")))
        impl = env[0] == 'r' ? FWD_ATT_REF : FWD_ATT_C;
    /* The kernel ISA (LMS_ISA) caps it. Without AVX-512 the reference
     * runs: GCC 12 leaves the portable kernels' inner loops scalar (no
     * vector type for the f16 conversion there), which makes them slower
     * than the reference's gemm at depth; they stay as the tested twin. */
    if (impl == FWD_ATT_AUTO)
        impl = simd && !strcmp(lms_kernels_get()->isa, "avx512") ? FWD_ATT_AVX512 : FWD_ATT_REF;
    if ((impl != FWD_ATT_REF && impl != FWD_ATT_C && impl != FWD_ATT_AVX512) ||
        (impl == FWD_ATT_AVX512 && !simd))
        return LMS_ERR_UNSUPPORTED;
    c->att_impl = impl;
    return 0;
}

/* Splits the batch into tiles of consecutive positions of one sequence. */
static int32_t make_tiles(const lms_batch *b, att_tile *tiles)
{
    int32_t n = 0;
    for (int32_t t = 0; t < b->n_tokens;) {
        att_tile a = {b->seq[t], b->pos[t], t, 1};
        while (t + a.n_tok < b->n_tokens && a.n_tok < ATT_TILE && b->seq[t + a.n_tok] == a.seq &&
               b->pos[t + a.n_tok] == a.pos0 + a.n_tok)
            a.n_tok++;
        tiles[n++] = a;
        t += a.n_tok;
    }
    return n;
}

void fwd_attention(lms_ctx *c, int il, const lms_batch *b)
{
    const lms_hparams *hp = &c->m->hp;
    const int nkv = hp->n_head_kv;
    att_tile *tiles = c->tiles;
    const int32_t n_tiles = make_tiles(b, tiles);
    const int64_t n_work = (int64_t)n_tiles * nkv;
    int64_t n_pos = 0;
    for (int32_t t = 0; t < b->n_tokens; t++)
        n_pos += b->pos[t] + 1;
    if (c->att_impl != FWD_ATT_REF &&
        (attention_by_group(c, il, tiles, n_tiles) || attention_by_heads(c, il, tiles, n_tiles) ||
         attention_by_chunk(c, il, tiles, n_tiles)))
        return;
    const bool par = n_pos * hp->n_head * hp->head_dim >= 65536;
    (void)par;
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t wi = 0; wi < n_work; wi++) {
#ifdef _OPENMP
        int tid = omp_get_thread_num();
#else
        int tid = 0;
#endif
        if (c->att_impl == FWD_ATT_REF)
            attend_tile_ref(c, il, &tiles[wi / nkv], (int)(wi % nkv), tid);
        else
            attend_tile_rows(c, il, &tiles[wi / nkv], (int)(wi % nkv), tid);
    }
}
