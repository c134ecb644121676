/*
 * forward.c - one forward step of a decoder-only transformer (llama, qwen2,
 * qwen3, gemma2, gemma3) over a batch of tokens, in the order the data flows.
 *
 * Shapes (n = tokens in the batch, e = n_embd, hd = head_dim,
 * q = n_head*hd, kv = n_head_kv*hd, f = n_ff):
 *
 *   x   [n][e]   residual stream          xn  [n][max(e,q,f)] normed input
 *   qb  [n][q]   queries                  kb, vb [n][kv] keys, values
 *   att [n][q]   attention output         ga, up [n][f] FFN halves
 *
 * Numerics follow llama.cpp's CPU path so logits agree with it: K and V are
 * cached as f16, Q is rounded to f16 before Q·K, softmax weights are rounded
 * to f16 before they weight V, matrix products convert activations to the
 * weight's companion type (see kernels.h), and everything else (RMSNorm,
 * RoPE, SiLU, residual adds) is float32 with the same formulas.
 *
 * Gemma 2 / 3 (model.c's read_gemma): embeddings scaled by sqrt(e), queries
 * scaled after RoPE, RMSNorm of the attention and FFN outputs before each
 * residual add, a GELU-gated FFN, local layers (a window in attention.c)
 * and soft-capped scores (attention.c) and logits (lms_forward).
 *
 * LoRA adapters (model/lora.h) are applied per token: after each adapted
 * product, y += scale * B (A x) for the rows whose sequence uses the
 * adapter (section LoRA below; the GPU layers' deltas in forward_cuda.c);
 * a batch without adapters runs exactly the code it ran before they existed.
 */
#include "engine/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/err.h"
#include "base/fastmath.h"
#include "base/fp16.h"
#include "engine/forward_int.h"
#include "kernels/kernels.h"
#include "kernels/matmul.h"
#ifdef LMS_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

static void lora_free(fwd_lora *F);

/* Whole pages: a buffer never shares a page with another allocation, so
 * the CUDA prompt offload can page-lock it (forward_cuda.c). */
static float *alloc_f32(size_t n)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return aligned_alloc(page, (n * sizeof(float) + page - 1) / page * page);
}

static size_t max_scratch(const lms_model *m, int64_t n)
{
    const lms_hparams *hp = &m->hp;
    const lms_weight *ws[] = {&m->output};
    size_t best = lms_matmul_scratch(ws[0]->type, ws[0]->ne[0], n);
    for (int il = 0; il < hp->n_layer; il++) {
        const lms_layer *l = &m->layers[il];
        const lms_weight *lw[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
        for (size_t i = 0; i < sizeof lw / sizeof lw[0]; i++) {
            size_t s = lms_matmul_scratch(lw[i]->type, lw[i]->ne[0], n);
            best = s > best ? s : best;
        }
    }
    return best;
}

/* GPU placement when asked for; a CPU-only build refuses GPU layers.
 * (gemma's layers have their own GPU path in forward_cuda.c; their
 * embeddings are scaled here before they go up. LongRoPE's factors and
 * attention factor go up with the shape.) */
static int gpu_setup(lms_ctx *c, int32_t blocks, char *err, size_t errsz)
{
    if (c->p.gpu_layers == 0)
        return 0;
#ifdef LMS_HAVE_CUDA
    return fwd_gpu_create(c, blocks, err, errsz);
#else
    (void)blocks;
    if (c->p.gpu_layers == LMS_GPU_LAYERS_AUTO)
        return 0;
    return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                    "--gpu-layers: built without CUDA (configure with -DLMS_CUDA=ON)");
#endif
}

void lms_gpu_plan_format(const lms_gpu_plan *p, char *buf, size_t n)
{
    const double mib = 1 << 20;
    snprintf(buf, n,
             "gpu: %s, %d/%d layers%s on the GPU; VRAM planned: weights %.1f MiB, KV %.1f MiB, "
             "scratch %.1f MiB, prompt offload %.1f MiB (total %.1f MiB of %.1f usable = %.1f "
             "free - margin); allocated %.1f MiB",
             p->device, p->n_layer_gpu, p->n_layer, p->output_gpu ? " + output" : "",
             (double)p->weights_bytes / mib, (double)p->kv_bytes / mib,
             (double)p->scratch_bytes / mib, (double)p->offload_bytes / mib,
             (double)(p->weights_bytes + p->kv_bytes + p->scratch_bytes + p->offload_bytes) / mib,
             (double)p->usable_bytes / mib, (double)p->free_bytes / mib,
             (double)p->allocated_bytes / mib);
}

int lms_ctx_create(const lms_model *m, const lms_ctx_params *p, lms_ctx **out, char *err,
                   size_t errsz)
{
    const lms_hparams *hp = &m->hp;
    if (p->n_ctx <= 0 || p->n_batch <= 0 || p->n_seq <= 0 || p->n_ctx > (1 << 22) ||
        p->n_batch > (1 << 16))
        return lms_errf(err, errsz, LMS_ERR_INVAL, "context: n_ctx %d, n_batch %d, n_seq %d invalid",
                        p->n_ctx, p->n_batch, p->n_seq);
    int kvt = p->kv_type ? p->kv_type : LMS_TYPE_F16;
    if (!lms_kv_type_ok(kvt, hp->head_dim))
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                        "context: KV cache type must be f16, or q8_0/q4_0 with head_dim a multiple "
                        "of 32");
    lms_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "context: out of memory");
    c->m = m;
    c->p = *p;
#ifdef _OPENMP
    c->n_threads = p->n_threads > 0 ? p->n_threads : omp_get_num_procs();
    omp_set_num_threads(c->n_threads);
#else
    c->n_threads = 1;
#endif
    size_t n = (size_t)p->n_batch, e = (size_t)hp->n_embd, hd = (size_t)hp->head_dim;
    size_t q = (size_t)hp->n_head * hd, kv = (size_t)hp->n_head_kv * hd, f = (size_t)hp->n_ff;
    size_t wide = e > q ? e : q;
    wide = wide > f ? wide : f;
    c->x = alloc_f32(n * e);
    c->xn = alloc_f32(n * wide);
    c->qb = alloc_f32(n * q);
    c->kb = alloc_f32(n * kv);
    c->vb = alloc_f32(n * kv);
    c->att = alloc_f32(n * q);
    c->ga = alloc_f32(n * f);
    c->up = alloc_f32(n * f);
    c->hidden = alloc_f32(n * e);
    size_t group = (size_t)(hp->n_head / hp->n_head_kv) * ATT_TILE;
    c->scores = alloc_f32((size_t)c->n_threads * group * (size_t)p->n_ctx);
    c->qh = malloc((size_t)c->n_threads * group * hd * sizeof(uint16_t));
    c->tiles = malloc(n * sizeof *c->tiles);
    c->vconv = alloc_f32((size_t)c->n_threads * (size_t)p->n_ctx * hd);
    /* by-head: ATT_TILE * group query rows a thread; by-chunk: every head
     * of up to qf_tiles single-token tiles, with scores and chunk sums for
     * the longest context (up to 64 MiB; longer steps go by head) */
    const size_t qrow = hd + hd / LMS_QK8_0, n_chunk = ((size_t)p->n_ctx + ATT_CHUNK - 1) / ATT_CHUNK;
    const size_t nh = (size_t)hp->n_head;
    c->qf_rows = (int32_t)group;
    c->qf_tiles = p->n_seq < p->n_batch ? p->n_seq : p->n_batch;
    size_t per_tile = nh * n_chunk * ATT_CHUNK + n_chunk * nh * hd;
    if ((size_t)c->qf_tiles * per_tile > ((size_t)16 << 20))
        c->qf_tiles = (int32_t)(((size_t)16 << 20) / per_tile);
    c->dec_floats = (size_t)c->qf_tiles * per_tile;
    size_t qf_rows = (size_t)c->n_threads * group;
    qf_rows = qf_rows > (size_t)c->qf_tiles * nh ? qf_rows : (size_t)c->qf_tiles * nh;
    c->qf = alloc_f32(qf_rows * qrow);
    c->dec = c->dec_floats ? alloc_f32(c->dec_floats) : NULL;
    size_t qs = max_scratch(m, p->n_batch) * 3; /* Q, K, V may need three conversions */
    c->qbuf = aligned_alloc(64, (qs + 63) / 64 * 64);
    int32_t blocks = p->kv_blocks > 0 ? p->kv_blocks
                                      : (p->n_ctx + LMS_KV_BLOCK - 1) / LMS_KV_BLOCK * p->n_seq;
    int rc = LMS_ERR_NOMEM;
    if (c->x && c->xn && c->qb && c->kb && c->vb && c->att && c->ga && c->up && c->hidden &&
        c->scores && c->qh && c->tiles && c->vconv && c->qf && (c->dec || !c->dec_floats) &&
        c->qbuf) {
        fwd_set_attention(c, FWD_ATT_AUTO);
        rc = gpu_setup(c, blocks, err, errsz);
        if (rc < 0) {
            lms_ctx_destroy(c);
            return rc;
        }
        /* CPU only: the weights stream from huge pages (gguf.c). Not with
         * a GPU plan: the CPU layers' file pages may be page-locked there */
        if (!c->gpu)
            gguf_make_resident(m->gguf);
        /* the host pool holds the CPU layers only (at least one, for its
         * block bookkeeping) */
        int32_t host_layers = hp->n_layer - c->n_gpu;
        rc = lms_kv_cache_init(&c->kv, host_layers > 0 ? host_layers : 1, (int32_t)kv, blocks,
                               p->kv_type ? p->kv_type : LMS_TYPE_F16);
    }
    if (rc < 0) {
        lms_ctx_destroy(c);
        return lms_errf(err, errsz, rc, "context: cannot allocate %zu MiB of KV cache and buffers",
                        lms_model_kv_bytes(hp, (int64_t)p->n_ctx * p->n_seq) >> 20);
    }
    *out = c;
    return 0;
}

void lms_ctx_destroy(lms_ctx *c)
{
    if (!c)
        return;
#ifdef LMS_HAVE_CUDA
    fwd_gpu_destroy(c);
#endif
    lms_kv_cache_deinit(&c->kv);
    lora_free(&c->lora);
    void *bufs[] = {c->x, c->xn, c->qb, c->kb, c->vb, c->att, c->ga, c->up, c->hidden,
                    c->scores, c->qh, c->tiles, c->vconv, c->qf, c->dec, c->qbuf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(c);
}

lms_kv_cache *lms_ctx_kv(lms_ctx *c) { return &c->kv; }
const lms_ctx_params *lms_ctx_params_of(const lms_ctx *c) { return &c->p; }
const lms_model *lms_ctx_model(const lms_ctx *c) { return c->m; }
const float *lms_ctx_hidden(const lms_ctx *c) { return c->hidden; }
const lms_gpu_plan *lms_ctx_gpu_plan(const lms_ctx *c) { return c->gpu ? &c->plan : NULL; }

const lms_lora *lms_ctx_lora_failed(const lms_ctx *c)
{
#ifdef LMS_HAVE_CUDA
    return c->gpu ? fwd_gpu_lora_failed(c) : NULL;
#else
    (void)c;
    return NULL;
#endif
}

/* A header before the block says how it was made (64 bytes: the block
 * keeps the allocator's alignment for vector loads). */
#define HOST_HDR 64

void *lms_ctx_host_alloc(const lms_ctx *c, size_t bytes)
{
    unsigned char *p = NULL;
    bool pinned = false;
#ifdef LMS_HAVE_CUDA
    if (c && c->gpu && (p = lcu_host_alloc(bytes + HOST_HDR)) != NULL)
        pinned = true;
#else
    (void)c;
#endif
    if (!p && !(p = malloc(bytes + HOST_HDR)))
        return NULL;
    p[0] = pinned;
    return p + HOST_HDR;
}

void lms_host_free(void *p)
{
    if (!p)
        return;
    unsigned char *h = (unsigned char *)p - HOST_HDR;
#ifdef LMS_HAVE_CUDA
    if (h[0]) {
        lcu_host_free(h);
        return;
    }
#endif
    free(h);
}

/* ---- element-wise pieces ----------------------------------------------- */

/* Built for several x86 levels, the loader picking one (as attention.c):
 * the default SSE2 build of swiglu's vector exp is slower than libm's
 * scalar expf, its AVX2/AVX-512 builds ~10x faster. Levels with FMA may
 * round products differently (float rounding). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define FWD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FWD_CLONES
#endif

/* out = x / rms(x) * w over n values (sum of squares in double, as ggml;
 * summed in vector lanes, which only reorders the double sum). */
FWD_CLONES static void rms_norm(const float *x, const float *w, float *out, int64_t n, float eps)
{
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    if (w) {
        for (int64_t i = 0; i < n; i++)
            out[i] = (x[i] * scale) * w[i];
    } else {
        for (int64_t i = 0; i < n; i++)
            out[i] = x[i] * scale;
    }
}

static void add_bias(float *y, const lms_weight *b, int64_t n_tok, int64_t n)
{
    if (!b->data)
        return;
    const float *bias = b->data;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++)
            y[t * n + i] += bias[i];
}

/* Most rotated dimension pairs (n_rot / 2) RoPE takes. */
#define ROPE_MAX_PAIRS 512

/* cos and sin of the n_rot / 2 angles of position pos (shared by the
 * query and key heads of one token), times LongRoPE's attention factor. */
static void rope_angles(const lms_hparams *hp, const lms_layer *l, const float *freq_factors,
                        int32_t pos, float *cosv, float *sinv)
{
    const int n_pairs = hp->n_rot / 2 < ROPE_MAX_PAIRS ? hp->n_rot / 2 : ROPE_MAX_PAIRS;
    const float theta_scale = powf(l->rope_base, -2.0f / (float)hp->n_rot);
    const float mscale = hp->rope_attn_factor != 0.0f ? hp->rope_attn_factor : 1.0f;
    float theta = (float)pos;
    for (int i = 0; i < n_pairs; i++) {
        float ff = freq_factors ? freq_factors[i] : 1.0f;
        float t = l->rope_freq_scale * (theta / ff);
        cosv[i] = cosf(t) * mscale;
        sinv[i] = sinf(t) * mscale;
        theta *= theta_scale;
    }
}

/* Rotates the first n_rot dims of each of n_heads heads of one token:
 * pairs (i, i + n_rot/2) for NEOX, else (2i, 2i + 1). */
FWD_CLONES static void rope(const lms_hparams *hp, const float *cosv, const float *sinv, float *x,
                             int n_heads)
{
    const int half = hp->n_rot / 2 < ROPE_MAX_PAIRS ? hp->n_rot / 2 : ROPE_MAX_PAIRS;
    const int hd = hp->head_dim;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * hd;
        if (hp->rope_type == LMS_ROPE_NEOX) {
            for (int i = 0; i < half; i++) {
                const float x0 = v[i], x1 = v[i + half];
                v[i] = x0 * cosv[i] - x1 * sinv[i];
                v[i + half] = x0 * sinv[i] + x1 * cosv[i];
            }
        } else {
            for (int i = 0; i < half; i++) {
                const float x0 = v[2 * i], x1 = v[2 * i + 1];
                v[2 * i] = x0 * cosv[i] - x1 * sinv[i];
                v[2 * i + 1] = x0 * sinv[i] + x1 * cosv[i];
            }
        }
    }
}

/* ga = silu(ga) * up over n values, silu(x) = x / (1 + e^-x): e^-|x| from
 * the vectorizable lms_exp_neg (relative error ~2e-7, float rounding). */
FWD_CLONES static void swiglu(float *ga, const float *up, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        const float x = ga[i];
        const float e = lms_exp_neg(x < 0.0f ? x : -x);
        ga[i] = (x < 0.0f ? x * e : x) / (1.0f + e) * up[i];
    }
}

/* GELU, tanh approximation, as ggml's CPU path computes it: the input
 * rounded to f16, 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) in
 * float, the result rounded to f16 (ggml reads it from a table of all f16
 * inputs); inputs <= -10 give 0 and >= 10 themselves. */
static float gelu_tanh(float x)
{
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    const float h = lms_f16_to_f32(lms_f32_to_f16(x)), sqrt_2_over_pi = 0.79788456080286535588f;
    const float g = 0.5f * h * (1.0f + tanhf(sqrt_2_over_pi * h * (1.0f + 0.044715f * h * h)));
    return lms_f16_to_f32(lms_f32_to_f16(g));
}

/* ga = gelu(ga) * up over n values (gemma's GeGLU). */
static void geglu(float *ga, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        ga[i] = gelu_tanh(ga[i]) * up[i];
}

/* The FFN's gated activation over one row's f values. */
static void ffn_act_row(int act, float *ga, const float *up, int64_t f)
{
    if (act == LMS_FFN_GELU_TANH)
        geglu(ga, up, f);
    else
        swiglu(ga, up, f);
}

static lms_mat as_mat(const lms_weight *w)
{
    lms_mat m = {w->data, w->type, w->ne[0], w->ne[1], w->row_bytes};
    return m;
}

static void matmul(lms_ctx *c, const lms_weight *w, const float *x, int64_t n, float *y)
{
    lms_mat m = as_mat(w);
    lms_matmul(&m, x, n, y, c->qbuf);
}

/* Element-wise work over the rows of a batch is split over the threads
 * from this many values (below it the team's wake-up costs more). Below
 * it the loops do not enter OpenMP at all: even a `parallel if (0)`
 * region costs ~0.3 us in libgomp, and decode runs several a layer. */
#define ROWS_PAR_MIN 65536

/* Row t of add_norm_rows. */
static void add_norm_row(float *x, const float *d, const float *w, float *out, int64_t t,
                         int64_t e, float eps)
{
    float *xt = x + t * e;
    if (d)
        for (int64_t i = 0; i < e; i++)
            xt[i] += d[t * e + i];
    rms_norm(xt, w, out + t * e, e, eps);
}

/* For each of n rows of e values: x += d (when d is not NULL), then
 * out = rms_norm(x) * w. out may be d. */
static void add_norm_rows(float *x, const float *d, const float *w, float *out, int64_t n,
                          int64_t e, float eps)
{
    if (n * e < ROWS_PAR_MIN) {
        for (int64_t t = 0; t < n; t++)
            add_norm_row(x, d, w, out, t, e, eps);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; t++)
        add_norm_row(x, d, w, out, t, e, eps);
}

/* out = rms_norm(x) * w for each of n rows of e values, in place allowed
 * (gemma's post-attention and post-FFN norms). */
static void norm_rows(const float *x, const float *w, float *out, int64_t n, int64_t e, float eps)
{
    if (n * e < ROWS_PAR_MIN) {
        for (int64_t t = 0; t < n; t++)
            rms_norm(x + t * e, w, out + t * e, e, eps);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; t++)
        rms_norm(x + t * e, w, out + t * e, e, eps);
}

/* ---- LoRA ------------------------------------------------------------------
 *
 * Each adapted product gets y[t] += s_t * B (A x[t]) for the rows t whose
 * sequence uses the adapter, s_t = user scale * alpha / rank. The rows of a
 * step are grouped by adapter once (lora_group), then for each adapted
 * weight and group: T = A·x over the group's rows ([m][rank],
 * lora_down_row), then y += s * T·B^T in chunks of outputs (lora_up_chunk).
 * Both are f32 with each output summed by one thread in a fixed order, so
 * a row's result does not depend on what else is in the batch. As in
 * llama.cpp, the input of a product with an f16, bf16 or q8_0 adapter
 * tensor is first rounded to that tensor's companion type (lora_round).
 * A batch without adapters (b->lora NULL) never enters this code. */

/* Below this many multiply-adds a LoRA product runs on the calling thread. */
#define LORA_PAR_MIN 65536
/* Outputs per lora_up work item (its delta lives on the stack). */
#define LORA_CHUNK 256

static int lora_alloc(lms_ctx *c)
{
    fwd_lora *F = &c->lora;
    if (F->groups)
        return 0;
    const size_t n = (size_t)c->p.n_batch * LMS_LORA_MAX;
    F->groups = malloc(n * sizeof *F->groups);
    F->rows = malloc(n * sizeof *F->rows);
    F->scales = malloc(n * sizeof *F->scales);
    F->tmp = malloc(n * sizeof *F->tmp);
    F->head = malloc((size_t)c->p.n_batch * sizeof *F->head);
    const lms_hparams *hp = &c->m->hp;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim, e = hp->n_embd;
    F->wide = e > q ? e : q;
    F->wide = F->wide > hp->n_ff ? F->wide : hp->n_ff;
    F->xq_row = ((size_t)F->wide * sizeof(float) + 2 * 64 + 63) / 64 * 64;
    F->xr = malloc((size_t)c->p.n_batch * (size_t)F->wide * sizeof *F->xr);
    F->xq = aligned_alloc(64, (size_t)c->p.n_batch * F->xq_row);
    if (F->groups && F->rows && F->scales && F->tmp && F->head && F->xr && F->xq)
        return 0;
    free(F->groups), free(F->rows), free(F->scales), free(F->tmp), free(F->head);
    free(F->xr), free(F->xq);
    memset(F, 0, sizeof *F);
    return LMS_ERR_NOMEM;
}

static void lora_free(fwd_lora *F)
{
    free(F->groups), free(F->rows), free(F->scales), free(F->tmp), free(F->head), free(F->t);
    free(F->xr), free(F->xq);
}

/* x rounded through type vt (n values) as a product with a weight whose
 * companion type is vt would see it; returns x itself for f32. */
static const float *lora_round(int vt, const float *x, int64_t n, uint8_t *tmp, float *out)
{
    if (vt == LMS_TYPE_F32)
        return x;
    const lms_kernel_table *k = lms_kernels_get();
    k->from_float[vt](x, tmp, n);
    k->to_float[vt](tmp, out, n);
    return out;
}

/* The batch's adapter sets are well formed; whether any is not empty. */
static int lora_check(const lms_batch *b, bool *any)
{
    *any = false;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const lms_lora_set *s = b->lora[t];
        if (!s)
            continue;
        if (s->n < 0 || s->n > LMS_LORA_MAX)
            return LMS_ERR_INVAL;
        for (int32_t i = 0; i < s->n; i++) {
            if (!s->use[i].lora)
                return LMS_ERR_INVAL;
            for (int32_t j = 0; j < i; j++)
                if (s->use[j].lora == s->use[i].lora)
                    return LMS_ERR_INVAL;
        }
        *any |= s->n > 0;
    }
    return 0;
}

/* Groups n rows by adapter (sets[r]: row r's set or NULL) into c->lora;
 * makes room for the largest rank. Uses with scale 0 are skipped. */
static int lora_group(lms_ctx *c, const lms_lora_set *const *sets, int32_t n)
{
    fwd_lora *F = &c->lora;
    const lms_lora_set *prev = NULL;
    int32_t prev_g[LMS_LORA_MAX] = {0}, k = 0, max_rank = 0;
    F->n_groups = 0;
    for (int32_t r = 0; r < n; r++) {
        const lms_lora_set *s = sets[r];
        if (!s)
            continue;
        for (int32_t i = 0; i < s->n; i++) {
            if (s->use[i].scale == 0.0f)
                continue;
            int32_t g = 0;
            if (s == prev) { /* the rows of one sequence come together */
                g = prev_g[i];
            } else {
                while (g < F->n_groups && F->groups[g].lora != s->use[i].lora)
                    g++;
                if (g == F->n_groups) {
                    F->groups[F->n_groups++] = (fwd_lora_group){s->use[i].lora, 0, 0};
                    int32_t rk = lms_lora_rank(s->use[i].lora);
                    max_rank = rk > max_rank ? rk : max_rank;
                }
                prev_g[i] = g;
            }
            F->groups[g].n_rows++;
            F->tmp[k++] = g;
        }
        prev = s;
    }
    for (int32_t g = 0, off = 0; g < F->n_groups; g++) {
        F->groups[g].off = off;
        off += F->groups[g].n_rows;
        F->groups[g].n_rows = 0;
    }
    k = 0;
    for (int32_t r = 0; r < n; r++) {
        const lms_lora_set *s = sets[r];
        for (int32_t i = 0; s && i < s->n; i++) {
            if (s->use[i].scale == 0.0f)
                continue;
            fwd_lora_group *g = &F->groups[F->tmp[k++]];
            F->rows[g->off + g->n_rows] = r;
            F->scales[g->off + g->n_rows] = s->use[i].scale;
            g->n_rows++;
        }
    }
    if (max_rank > F->t_rank) {
        float *t = malloc((size_t)c->p.n_batch * (size_t)max_rank * sizeof *t);
        if (!t)
            return LMS_ERR_NOMEM;
        free(F->t);
        F->t = t;
        F->t_rank = max_rank;
    }
    if (max_rank > F->wide) { /* the rounding scratch also holds rows of rank values */
        const size_t row = ((size_t)max_rank * sizeof(float) + 2 * 64 + 63) / 64 * 64;
        float *xr = malloc((size_t)c->p.n_batch * (size_t)max_rank * sizeof *xr);
        uint8_t *xq = aligned_alloc(64, (size_t)c->p.n_batch * row);
        if (!xr || !xq) {
            free(xr), free(xq);
            return LMS_ERR_NOMEM;
        }
        free(F->xr), free(F->xq);
        F->xr = xr, F->xq = xq, F->xq_row = row, F->wide = max_rank;
    }
    return 0;
}

/* t[r] = A[r] · x for the rank rows of A ([rank][n]). */
FWD_CLONES static void lora_dots(const float *a, int32_t rank, int64_t n, const float *x, float *t)
{
    for (int32_t r = 0; r < rank; r++) {
        const float *ar = a + (size_t)r * (size_t)n;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; i++)
            sum += ar[i] * x[i];
        t[r] = sum;
    }
}

/* Row i of a group's first half: t_i = A · round(x[rows[i]]), then
 * rounded for B; xr_i / xq_i: the row's scratch. */
static void lora_down_row(const lms_lora_pair *p, const float *x, float *t_i, float *xr_i,
                          uint8_t *xq_i)
{
    const float *xi = lora_round(p->a_vt, x, p->n_in, xq_i, xr_i);
    lora_dots(p->a, p->rank, p->n_in, xi, t_i);
    if (p->b_vt != LMS_TYPE_F32)
        lora_round(p->b_vt, t_i, p->rank, xq_i, t_i);
}

/* y[o0, o1) += s * sum_r t[r] * bt[r][o0, o1) (o1 - o0 <= LORA_CHUNK). */
FWD_CLONES static void lora_up_chunk(const float *bt, int32_t rank, int64_t n_out, const float *t,
                                     float s, int64_t o0, int64_t o1, float *y)
{
    float d[LORA_CHUNK];
    const int64_t len = o1 - o0;
    for (int64_t o = 0; o < len; o++)
        d[o] = 0.0f;
    for (int32_t r = 0; r < rank; r++) {
        const float *br = bt + (size_t)r * (size_t)n_out + o0, tr = t[r];
#pragma omp simd
        for (int64_t o = 0; o < len; o++)
            d[o] += tr * br[o];
    }
#pragma omp simd
    for (int64_t o = 0; o < len; o++)
        y[o0 + o] += s * d[o];
}

/* Work item `it` of lora_apply_group's second half: row it / n_ch, chunk
 * it % n_ch of its outputs. */
static void lora_up_item(const lms_lora_pair *p, const float *t, const int32_t *rows,
                         const float *sc, int64_t n_ch, int64_t it, float *y)
{
    const int64_t i = it / n_ch, o0 = it % n_ch * LORA_CHUNK;
    const int64_t o1 = o0 + LORA_CHUNK < p->n_out ? o0 + LORA_CHUNK : p->n_out;
    lora_up_chunk(p->bt, p->rank, p->n_out, t + (size_t)i * (size_t)p->rank, sc[i] * p->factor, o0,
                  o1, y + (size_t)rows[i] * (size_t)p->n_out);
}

/* Adds group g's delta of pair p: x rows of p->n_in, y rows of p->n_out. */
static void lora_apply_group(lms_ctx *c, const fwd_lora_group *g, const lms_lora_pair *p,
                             const float *x, float *y)
{
    const fwd_lora *F = &c->lora;
    const int32_t m = g->n_rows, rank = p->rank;
    const int32_t *rows = F->rows + g->off;
    const float *sc = F->scales + g->off;
    float *t = F->t;
    const int64_t n_down = (int64_t)m * rank * p->n_in, n_up = (int64_t)m * rank * p->n_out;
    float *xr = F->xr;
    uint8_t *xq = F->xq;
    const size_t xq_row = F->xq_row, wide = (size_t)F->wide;
    if (n_down < LORA_PAR_MIN) {
        for (int32_t i = 0; i < m; i++)
            lora_down_row(p, x + (size_t)rows[i] * (size_t)p->n_in, t + (size_t)i * (size_t)rank,
                          xr + (size_t)i * wide, xq + (size_t)i * xq_row);
    } else {
#pragma omp parallel for schedule(static)
        for (int32_t i = 0; i < m; i++)
            lora_down_row(p, x + (size_t)rows[i] * (size_t)p->n_in, t + (size_t)i * (size_t)rank,
                          xr + (size_t)i * wide, xq + (size_t)i * xq_row);
    }
    /* work items: (row, chunk of LORA_CHUNK outputs) */
    const int64_t n_ch = (p->n_out + LORA_CHUNK - 1) / LORA_CHUNK, items = (int64_t)m * n_ch;
    if (n_up < LORA_PAR_MIN) {
        for (int64_t it = 0; it < items; it++)
            lora_up_item(p, t, rows, sc, n_ch, it, y);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t it = 0; it < items; it++)
            lora_up_item(p, t, rows, sc, n_ch, it, y);
    }
}

/* y += each adapter's delta for weight `target` of layer il (il < 0: the
 * output head) over the grouped rows; x and y are the product's input
 * and output rows. */
static void lora_apply(lms_ctx *c, int il, int target, const float *x, float *y)
{
    for (int32_t gi = 0; gi < c->lora.n_groups; gi++) {
        const fwd_lora_group *g = &c->lora.groups[gi];
        const lms_lora_pair *p = il < 0 ? lms_lora_output_pair(g->lora)
                                        : lms_lora_layer_pair(g->lora, il, target);
        if (p)
            lora_apply_group(c, g, p, x, y);
    }
}

/* Token embeddings: x[t] += s * B · A[token] (A holds a row per token). */
static void lora_embd(lms_ctx *c, const lms_batch *b)
{
    const int64_t e = c->m->hp.n_embd;
    for (int32_t gi = 0; gi < c->lora.n_groups; gi++) {
        const fwd_lora_group *g = &c->lora.groups[gi];
        const lms_lora_pair *p = lms_lora_embd_pair(g->lora);
        if (!p)
            continue;
        for (int32_t i = 0; i < g->n_rows; i++) {
            const int32_t t = c->lora.rows[g->off + i];
            const float *at = lora_round(p->b_vt, p->a + (size_t)b->tokens[t] * (size_t)p->rank,
                                         p->rank, c->lora.xq, c->lora.xr);
            for (int64_t o0 = 0; o0 < e; o0 += LORA_CHUNK)
                lora_up_chunk(p->bt, p->rank, e, at, c->lora.scales[g->off + i] * p->factor, o0,
                              o0 + LORA_CHUNK < e ? o0 + LORA_CHUNK : e, c->x + (size_t)t * (size_t)e);
        }
    }
}

/* ---- one layer ------------------------------------------------------------ */

/* Q/K/V projections, optional biases and per-head norms, RoPE, and K/V
 * written to the cache. */
static void qkv(lms_ctx *c, const lms_layer *l, int il, const lms_batch *b)
{
    const lms_hparams *hp = &c->m->hp;
    const int64_t n = b->n_tokens, hd = hp->head_dim;
    const int64_t q = hp->n_head * hd, kv = hp->n_head_kv * hd;
    lms_mat mq = as_mat(&l->wq), mk = as_mat(&l->wk), mv = as_mat(&l->wv);
    const lms_mat *ws[3] = {&mq, &mk, &mv};
    float *ys[3] = {c->qb, c->kb, c->vb};
    lms_matmul_n(ws, ys, 3, c->xn, n, c->qbuf);
    if (b->lora) {
        lora_apply(c, il, LMS_LORA_Q, c->xn, c->qb);
        lora_apply(c, il, LMS_LORA_K, c->xn, c->kb);
        lora_apply(c, il, LMS_LORA_V, c->xn, c->vb);
    }
    add_bias(c->qb, &l->bq, n, q);
    add_bias(c->kb, &l->bk, n, kv);
    add_bias(c->vb, &l->bv, n, kv);
    fwd_qkv_post(c, il, b);
}

/* fwd_qkv_post for token t of b. The token's K and V cache rows are cold
 * (the weights streamed since evicted whatever was there): they are
 * fetched for writing first, so that the misses overlap the norms and RoPE
 * rather than stall the conversion's stores (Qwen3-0.6B decode: the two
 * 2 KiB rows took 3-7 us a layer to write without it, 1-5 with). */
static void qkv_post_token(lms_ctx *c, const lms_layer *l, int il, const lms_batch *b,
                           int64_t t, lms_from_float_fn to_cache)
{
    const lms_hparams *hp = &c->m->hp;
    const int64_t hd = hp->head_dim, q = hp->n_head * hd, kv = hp->n_head_kv * hd;
    float *qt = c->qb + t * q, *kt = c->kb + t * kv;
    uint8_t *vc = lms_kv_v(&c->kv, b->seq[t], il - c->n_gpu, b->pos[t]);
    const size_t row_bytes = lms_row_size(c->kv.type, kv);
    /* (a tiled K row is spread over its block: fetched as it is written) */
    const bool k_row = !lms_kv_k_tiled(c->kv.type);
    uint8_t *kc = k_row ? lms_kv_k(&c->kv, b->seq[t], il - c->n_gpu, b->pos[t]) : NULL;
    for (size_t o = 0; o < row_bytes; o += 64) {
        if (k_row)
            __builtin_prefetch(kc + o, 1, 3);
        __builtin_prefetch(vc + o, 1, 3);
    }
    float cosv[ROPE_MAX_PAIRS], sinv[ROPE_MAX_PAIRS];
    if (l->q_norm.data)
        for (int h = 0; h < hp->n_head; h++)
            rms_norm(qt + h * hd, l->q_norm.data, qt + h * hd, hd, hp->rms_eps);
    if (l->k_norm.data)
        for (int h = 0; h < hp->n_head_kv; h++)
            rms_norm(kt + h * hd, l->k_norm.data, kt + h * hd, hd, hp->rms_eps);
    rope_angles(hp, l, lms_model_rope_factors(c->m, c->p.n_ctx), b->pos[t], cosv, sinv);
    rope(hp, cosv, sinv, qt, hp->n_head);
    rope(hp, cosv, sinv, kt, hp->n_head_kv);
    if (hp->q_scale != 0.0f) /* gemma: the scores' scale goes into the queries */
        for (int64_t i = 0; i < q; i++)
            qt[i] *= hp->q_scale;
    lms_kv_put_k(&c->kv, b->seq[t], il - c->n_gpu, b->pos[t], kt);
    to_cache(c->vb + t * kv, vc, kv);
}

void fwd_qkv_post(lms_ctx *c, int il, const lms_batch *b)
{
    const lms_layer *l = &c->m->layers[il];
    const int64_t n = b->n_tokens;
    /* the cache row writer (kv_cache.h): f16, q8_0 or q4_0 */
    const lms_from_float_fn to_cache = lms_kv_row_writer(c->kv.type);
    /* tokens are independent here; a prompt's are split over the threads
     * (a few tokens stay out of OpenMP, see ROWS_PAR_MIN) */
    if (n < 8) {
        for (int64_t t = 0; t < n; t++)
            qkv_post_token(c, l, il, b, t, to_cache);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; t++)
        qkv_post_token(c, l, il, b, t, to_cache);
}

static void layer(lms_ctx *c, int il, const lms_batch *b)
{
    const lms_hparams *hp = &c->m->hp;
    const lms_layer *l = &c->m->layers[il];
    const int64_t n = b->n_tokens, e = hp->n_embd, f = hp->n_ff;
#ifdef LMS_HAVE_CUDA
    /* a prompt batch on a split model: this layer's products on the GPU */
    if (c->gpu && fwd_gpu_offload_layer(c, il, b))
        return;
#endif
    add_norm_rows(c->x, NULL, l->attn_norm.data, c->xn, n, e, hp->rms_eps);
    qkv(c, l, il, b);
    fwd_attention(c, il, b);
    matmul(c, &l->wo, c->att, n, c->xn);
    if (b->lora)
        lora_apply(c, il, LMS_LORA_O, c->att, c->xn);
    if (l->attn_post_norm.data)
        norm_rows(c->xn, l->attn_post_norm.data, c->xn, n, e, hp->rms_eps);
    add_norm_rows(c->x, c->xn, l->ffn_norm.data, c->xn, n, e, hp->rms_eps);
    lms_mat mg = as_mat(&l->w_gate), mu = as_mat(&l->w_up);
    const lms_mat *ws[2] = {&mg, &mu};
    float *ys[2] = {c->ga, c->up};
    lms_matmul_n(ws, ys, 2, c->xn, n, c->qbuf);
    if (b->lora) {
        lora_apply(c, il, LMS_LORA_GATE, c->xn, c->ga);
        lora_apply(c, il, LMS_LORA_UP, c->xn, c->up);
    }
    const int act = hp->ffn_act;
    if (n * f < ROWS_PAR_MIN) {
        for (int64_t t = 0; t < n; t++)
            ffn_act_row(act, c->ga + t * f, c->up + t * f, f);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t t = 0; t < n; t++)
            ffn_act_row(act, c->ga + t * f, c->up + t * f, f);
    }
    matmul(c, &l->w_down, c->ga, n, c->xn);
    if (b->lora)
        lora_apply(c, il, LMS_LORA_DOWN, c->ga, c->xn);
    if (l->ffn_post_norm.data)
        norm_rows(c->xn, l->ffn_post_norm.data, c->xn, n, e, hp->rms_eps);
    for (int64_t i = 0; i < n * e; i++)
        c->x[i] += c->xn[i];
}

/* ---- the step --------------------------------------------------------------- */

/* x = cap * tanh(x * (1 / cap)) over n values (gemma's logit soft-capping,
 * the products as ggml's scale ops round them). */
static void softcap(float *x, int64_t n, float cap)
{
    const float inv = 1.0f / cap;
#pragma omp parallel for schedule(static) if (n >= ROWS_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        x[i] = tanhf(x[i] * inv) * cap;
}

static int check_batch(const lms_ctx *c, const lms_batch *b)
{
    if (b->n_tokens <= 0 || b->n_tokens > c->p.n_batch)
        return LMS_ERR_INVAL;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const lms_kv_seq *s = b->seq[t];
        if (b->tokens[t] < 0 || b->tokens[t] >= c->m->hp.n_vocab)
            return LMS_ERR_RANGE;
        if (b->pos[t] < 0 || b->pos[t] >= c->p.n_ctx || b->pos[t] >= s->n_blocks * LMS_KV_BLOCK ||
            b->pos[t] > s->n_pos + t)
            return LMS_ERR_RANGE;
    }
    return 0;
}

int lms_forward(lms_ctx *c, const lms_batch *b, float *logits)
{
    if (c->m->hp.is_encoder) /* bert: no output head; engine/encoder.c runs it */
        return LMS_ERR_UNSUPPORTED;
    int rc = check_batch(c, b);
    if (rc < 0)
        return rc;
    lms_batch bl;
    if (b->lora) { /* adapters: grouped once for the layers; none at all: the plain path */
        bool any;
        if ((rc = lora_check(b, &any)) < 0)
            return rc;
        bl = *b;
        if (!any)
            bl.lora = NULL;
        else if ((rc = lora_alloc(c)) < 0 || (rc = lora_group(c, bl.lora, bl.n_tokens)) < 0)
            return rc;
        b = &bl;
    }
#ifdef _OPENMP
    /* the team size is per calling thread (the scheduler's, the CLI's) and
     * the per-thread scratch is sized for exactly n_threads */
    omp_set_num_threads(c->n_threads);
#endif
    const lms_model *m = c->m;
    const int64_t e = m->hp.n_embd, n = b->n_tokens;
    lms_mat emb = as_mat(&m->tok_embd);
    for (int64_t t = 0; t < n; t++)
        lms_mat_get_row(&emb, b->tokens[t], c->x + t * e);
    if (b->lora)
        lora_embd(c, b);
    if (m->hp.embd_scale != 0.0f) /* gemma, after the adapters as llama.cpp */
        for (int64_t i = 0; i < n * e; i++)
            c->x[i] *= m->hp.embd_scale;
#ifdef LMS_HAVE_CUDA
    if (c->gpu && (rc = fwd_gpu_layers(c, b, logits)) < 0)
        return rc;
#endif
    for (int il = c->n_gpu; il < m->hp.n_layer; il++)
        layer(c, il, b);
    for (int64_t t = 0; t < n; t++)
        if (b->seq[t]->n_pos < b->pos[t] + 1)
            b->seq[t]->n_pos = b->pos[t] + 1;
    /* final norm of every output row; the head only for logits rows */
    int32_t n_out = 0, n_lg = 0;
    for (int64_t t = 0; t < n; t++) {
        bool lg = b->logits ? b->logits[t] : t == n - 1;
        if (!lg && !(b->embd && b->embd[t]))
            continue;
        rms_norm(c->x + t * e, m->output_norm.data, c->hidden + n_out * e, e, m->hp.rms_eps);
        if (lg) {
            memcpy(c->xn + n_lg * e, c->hidden + n_out * e, (size_t)e * sizeof(float));
            if (b->lora)
                c->lora.head[n_lg] = b->lora[t];
            n_lg++;
        }
        n_out++;
    }
    c->n_hidden = n_out;
    if (logits && n_lg > 0) {
        bool gpu_head = false;
#ifdef LMS_HAVE_CUDA
        /* adapters: their head deltas here, on the GPU head's logits */
        gpu_head = c->gpu && fwd_gpu_has_output(c);
        if (gpu_head && !b->lora)
            return fwd_gpu_output(c, c->xn, n_lg, logits, true);
        if (gpu_head && (rc = fwd_gpu_output(c, c->xn, n_lg, logits, false)) < 0)
            return rc;
#endif
        if (!gpu_head)
            matmul(c, &m->output, c->xn, n_lg, logits);
        if (b->lora) {
            if ((rc = lora_group(c, c->lora.head, n_lg)) < 0)
                return rc;
            lora_apply(c, -1, 0, c->xn, logits);
        }
        if (m->hp.final_softcap != 0.0f)
            softcap(logits, (int64_t)n_lg * m->hp.n_vocab, m->hp.final_softcap);
    }
    return 0;
}
