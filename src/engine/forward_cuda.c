/*
 * forward_cuda.c - the GPU part of the forward pass: placement of the first
 * layers (and, where it fits, the output head) on the GPU, and the per-step
 * run of those layers. Compiled only with LMS_CUDA.
 *
 * Placement (the plan), decided once when the context is made:
 *
 *   free     = free VRAM after the CUDA context and cuBLAS exist,
 *              capped by --vram-budget-mb (to simulate a smaller card)
 *   usable   = free - margin (--vram-margin-mb, default 500)
 *   fixed    = scratch: activations for n_batch tokens, the f16 weight
 *              tile and activations of the prompt path, cuBLAS workspace,
 *              attention partials, the head's logits chunk, batch metadata
 *   layer i  = its weights (as stored: quantized blocks stay quantized)
 *              + its K/V blocks (pool blocks x 16 x n_kv_dim x 2 x f16)
 *   auto     = the longest prefix of layers with fixed + sum <= usable;
 *              then the output head if it still fits
 *   N / all  = that many layers; refused at load when they do not fit
 *
 * Everything is allocated here, at load, so a step never allocates device
 * memory and cannot fail for lack of it.
 *
 * A step: the embeddings are looked up on the CPU (forward.c), uploaded
 * once through a pinned buffer together with the batch metadata (positions
 * and block tables); layers [0, n_gpu) run on the device stream; the
 * residual comes back once. The CPU layers follow; the final norm is on
 * the CPU, and the head runs on the GPU (normed rows up, logits down in
 * chunks) when it was placed there.
 *
 * Prompt offload: when layers stay on the CPU, a batch of at least
 * OFFLOAD_MIN tokens still runs their matrix products on the GPU
 * (fwd_gpu_offload_layer): each matrix is copied from host memory into one
 * of OFFLOAD_SLOTS staging buffers on a second stream while the previous
 * product runs; RMSNorm, biases and the residual adds stay on the device
 * with the products; RoPE, the cache writes and attention run on the CPU
 * over the host cache. A prompt reads every weight anyway, and PCIe moves
 * it faster than the CPU multiplies a big batch by it. The staging and
 * the CPU layers' norm/bias vectors are part of the plan (offload_bytes).
 *
 * Gemma 2 / 3 layers (gemma_layers) run gpu_layer_run_gemma, chosen once
 * at load so that a captured decode graph holds one kind of layer: each
 * layer's shape carries its RoPE base, window and score cap (cu_attn.cu's
 * kernels built for them), the attention and FFN outputs are normed before
 * their residual adds, the FFN is GELU-gated, and gemma2's logits are
 * capped after the head. The embeddings arrive scaled (forward.c). A
 * gemma model's CPU layers take no prompt offload (that path is llama's).
 *
 * LoRA adapters (section LoRA below): a step whose batch carries adapters
 * runs its GPU layers eagerly (never a captured graph, so graphs hold no
 * adapters) through the unfused layer (gpu_layer_run_gemma, which for
 * llama/qwen has no post norms and SwiGLU), with y += s * B (A x) added
 * after each adapted product by cu_lora.cu for the rows of each adapter;
 * the head then runs unfused and forward.c adds its delta on the CPU.
 * Such a step's CPU layers take no prompt offload (their deltas are the
 * CPU's). Each adapter's pairs of the GPU layers are uploaded at its first
 * step and cached by content id (lms_lora_id) in up to LORA_CACHE entries,
 * the least recently used not in the step evicted beyond that, the rest
 * freed with the context; unlike everything above, that memory is
 * allocated when first needed and is not part of the plan (it comes out of
 * the margin; LMS_CUDA_LORA_MAX_MB caps it). A step whose adapters find no
 * room returns LMS_ERR_ADAPTER before anything ran: the scheduler then
 * fails only the requests with adapters in it. A step without
 * adapters runs exactly the kernels it ran before adapters existed.
 *
 * Owner: the thread that owns the lms_ctx.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/timeutil.h"
#include "engine/forward_int.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/kernels.h"

#define HEAD_CHUNK 64 /* logits rows computed per head pass on the GPU */
#define OFFLOAD_SLOTS 3 /* staging buffers of the prompt offload */
#define OFFLOAD_MIN 32  /* batches from this many tokens offload (LMS_CUDA_OFFLOAD_MIN) */
#define ALIGN 256
#define LORA_CACHE 8 /* adapters kept on the device beyond those of the current step */

typedef struct gpu_layer {
    lcu_mat wq, wk, wv, wo, w_gate, w_up, w_down;
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm; /* device, or NULL */
    const float *attn_post_norm, *ffn_post_norm;                        /* gemma, or NULL */
    void *mem;                                                          /* one block per layer */
    size_t mem_bytes;
    uint16_t *k, *v; /* this layer's K/V pool: [n_blocks][16][n_kv_dim] f16 */
    lcu_attn_shape shape; /* gemma: the model's shape with this layer's RoPE, window, caps */
} gpu_layer;

/* One adapter's pairs for the GPU layers, on the device. */
typedef struct gpu_lora {
    uint64_t id;          /* lms_lora_id: equal contents share an entry */
    uint64_t used;        /* step it was last used in */
    void *mem;            /* all its A and B^T */
    size_t bytes;
    lcu_lora_pair *pairs; /* [n_gpu][LMS_LORA_N_TARGETS]; rank 0 = not adapted */
} gpu_lora;

/* Device copies of a CPU layer's vectors, for the prompt offload. */
typedef struct gpu_vecs {
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *q_norm, *k_norm;
} gpu_vecs;

struct fwd_gpu {
    lcu *g;
    gpu_layer *layers; /* [n_gpu] */
    bool gemma;        /* the layers run gpu_layer_run_gemma (gemma_layers) */
    lcu_mat output;
    const float *out_norm; /* device copy of output_norm (fused head), or NULL */
    bool fuse_head;        /* decode steps end with final norm + head on the GPU */
    int32_t pre_n;         /* logits rows of this step already in pre_at, or -1 */
    float *pre_at;         /* where they are: logits_h, or the caller's buffer when that is
                              page-locked (lms_ctx_host_alloc): then no copy on the host */
    bool direct;           /* downloads may go into page-locked caller buffers
                              (LMS_CUDA_DIRECT=0: always through logits_h, for A/B) */
    void *out_mem;
    size_t out_bytes;
    bool has_output;
    float *freq_factors; /* device copy of the RoPE frequency factors, or NULL */
    size_t freq_bytes;
    uint16_t *kv_mem;    /* K and V of all GPU layers */
    size_t kv_bytes;
    float *act;          /* device activations, carved below */
    size_t act_bytes;
    float *x, *xn, *qb, *kb, *vb, *att, *ga, *up, *logits;
    void *xq;            /* q8 of the current mat-vec input (decode), or NULL */
    bool graphs;         /* CUDA graphs for decode steps (LMS_CUDA_GRAPHS=0: off) */
    int32_t *meta;       /* device: pos, tbl_off, tbl */
    int32_t *meta_h;     /* pinned host twin */
    size_t meta_n;       /* ints */
    float *x_h;          /* pinned [n_batch][e] */
    float *logits_h;     /* pinned [HEAD_CHUNK][n_vocab] */
    lcu_attn_shape shape;
    /* prompt offload of the CPU layers (fwd_gpu_offload_layer) */
    bool offload;
    int32_t off_min;     /* batches of at least this many tokens */
    void *off_mem;       /* vectors of layers [n_gpu, n_layer) */
    size_t off_bytes;
    gpu_vecs *off;       /* [n_layer - n_gpu] */
    const void *reg_w;   /* page-locked span of the CPU layers' weights, or NULL */
    const void *reg_act[5]; /* page-locked host activation buffers */
    /* the offload's attention on the GPU: a K/V scratch holding, per step,
     * the blocks of the batch's sequences renumbered from 0 */
    uint8_t *okv_k, *okv_v; /* [okv_blocks][16][n_kv_dim] f16 */
    int32_t okv_blocks;
    int32_t *ometa, *ometa_h; /* device / pinned: pos, tbl_off, tbl of the renumbered batch */
    lcu_batch odb;
    int32_t o_max_npos;
    int32_t *o_pre, *o_new;  /* [okv_blocks][4]: host block, scratch block, first row, rows:
                              * the cached rows to copy up, the batch's rows to copy back */
    int32_t o_n_pre, o_n_new;
    bool ob_ready;       /* this step's renumbering is made */
    bool o_gpu_att;      /* and the step's attention runs on the GPU */
    const void *reg_kv[2]; /* page-locked host K/V pools, or NULL */
    bool reg_kv_tried;
    double off_ms[4];    /* LMS_CUDA_OFFLOAD_PROF=1: ms in the phases of offloaded layers */
    int64_t off_layers, off_gpu_att; /* offloaded layer runs, of which attention on the GPU */
    bool off_prof;
    /* LoRA (see the top): cached adapters and this step's groups */
    gpu_lora *lora;          /* [n_lora] */
    int32_t n_lora;
    uint64_t lora_step;
    size_t lora_cap;         /* most bytes the adapters' entries may hold (LMS_CUDA_LORA_MAX_MB;
                                0: as the device allows) */
    const lms_lora *lora_failed; /* the adapter that found no room in this step, or NULL */
    bool lora_on;            /* this step applies adapters */
    gpu_lora **lora_grp;     /* [n_batch * LMS_LORA_MAX] the entry of each of c->lora's groups */
    void *lora_scr;          /* device: rows, scales, xr, t */
    size_t lora_scr_bytes;
    int32_t lora_scr_rank;   /* rank t has room for */
    int32_t *lora_rows;      /* [n_batch * LMS_LORA_MAX] c->lora.rows on the device */
    float *lora_scales;      /* [n_batch * LMS_LORA_MAX] */
    float *lora_xr, *lora_t; /* [n_batch][wide], [n_batch][lora_scr_rank] */
    void *lora_h;            /* pinned twin of rows and scales */
};

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static size_t weight_bytes(const lms_weight *w)
{
    return w->data ? align_up(w->row_bytes * (size_t)(w->ne[1] > 0 ? w->ne[1] : 1)) : 0;
}

/* The weights of layer il, in the order they are uploaded: the 7
 * matrices, then the vectors. */
#define N_WEIGHTS 16
static void layer_weights(const lms_layer *l, const lms_weight *ws[N_WEIGHTS])
{
    const lms_weight *list[N_WEIGHTS] = {
        &l->wq,     &l->wk,       &l->wv,        &l->wo,        &l->w_gate, &l->w_up,
        &l->w_down, &l->attn_norm, &l->ffn_norm, &l->bq,        &l->bk,     &l->bv,
        &l->q_norm, &l->k_norm,   &l->attn_post_norm, &l->ffn_post_norm};
    memcpy(ws, list, sizeof list);
}

static size_t layer_bytes(const lms_layer *l)
{
    const lms_weight *ws[N_WEIGHTS];
    layer_weights(l, ws);
    size_t b = 0;
    for (int i = 0; i < N_WEIGHTS; i++)
        b += weight_bytes(ws[i]);
    return b;
}

/* Whether every tensor of the layer has a GPU kernel (matrices of a
 * supported type, vectors in f32). */
static bool layer_supported(const lms_layer *l)
{
    const lms_weight *ws[N_WEIGHTS];
    layer_weights(l, ws);
    for (int i = 0; i < N_WEIGHTS; i++) {
        if (!ws[i]->data)
            continue;
        if (i < 7 ? !lcu_type_supported(ws[i]->type) : ws[i]->type != LMS_TYPE_F32)
            return false;
    }
    return l->attn_norm.data && l->ffn_norm.data;
}

/* Whether the model's layers are gemma's (GeGLU, post-norms, query scale,
 * soft-capped scores, windows): they run gpu_layer_run_gemma; the llama /
 * qwen layers keep their own, unchanged, function and kernels. */
static bool gemma_layers(const lms_model *m)
{
    const lms_hparams *hp = &m->hp;
    if (hp->ffn_act != LMS_FFN_SILU || hp->q_scale != 0.0f || hp->attn_softcap != 0.0f)
        return true;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const lms_layer *l = &m->layers[il];
        if (l->attn_post_norm.data || l->ffn_post_norm.data || l->n_swa > 0)
            return true;
    }
    return false;
}

/* The vectors a CPU layer's offloaded step needs on the device. */
#define N_VECS 7
static void layer_vecs(const lms_layer *l, const lms_weight *vs[N_VECS])
{
    const lms_weight *list[N_VECS] = {&l->attn_norm, &l->ffn_norm, &l->bq, &l->bk,
                                      &l->bv,        &l->q_norm,   &l->k_norm};
    memcpy(vs, list, sizeof list);
}

static size_t largest_matrix(const lms_model *m)
{
    size_t mx = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const lms_weight *ws[N_WEIGHTS];
        layer_weights(&m->layers[il], ws);
        for (int i = 0; i < 7; i++)
            mx = weight_bytes(ws[i]) > mx ? weight_bytes(ws[i]) : mx;
    }
    return mx;
}

/* Blocks of the offload's device K/V scratch: the batch's own positions
 * and a cached prefix of up to OFFLOAD_PREFIX positions per step (longer
 * prefixes, or a q8_0 host cache, take attention on the CPU). */
#define OFFLOAD_PREFIX 4096
static int32_t offload_kv_blocks(const lms_ctx *c, int32_t n_blocks)
{
    int32_t s = 2 * ((c->p.n_batch + LMS_KV_BLOCK - 1) / LMS_KV_BLOCK) + OFFLOAD_PREFIX / LMS_KV_BLOCK;
    return s < n_blocks ? s : n_blocks;
}

static size_t offload_kv_bytes(const lms_ctx *c, int32_t n_blocks)
{
    if ((c->p.kv_type ? c->p.kv_type : LMS_TYPE_F16) != LMS_TYPE_F16)
        return 0;
    const size_t row = (size_t)c->m->hp.n_head_kv * (size_t)c->m->hp.head_dim * sizeof(uint16_t);
    const size_t nb = (size_t)offload_kv_blocks(c, n_blocks);
    return 2 * align_up(nb * LMS_KV_BLOCK * row) + align_up((2 * (size_t)c->p.n_batch + nb) * 4);
}

/* VRAM of the prompt offload when layers [k, n_layer) stay on the CPU: the
 * staging buffers, those layers' vectors and the K/V scratch; 0 when it is
 * off or some CPU layer has a type the GPU kernels lack. */
static size_t offload_bytes(const lms_ctx *c, int32_t k, int32_t n_blocks)
{
    const lms_model *m = c->m;
    const char *env = getenv("LMS_CUDA_OFFLOAD");
    /* the offloaded layer is llama's: gemma's CPU layers stay on the CPU */
    if (k >= m->hp.n_layer || (env && atoi(env) == 0) || gemma_layers(m))
        return 0;
    size_t b = OFFLOAD_SLOTS * largest_matrix(m) + offload_kv_bytes(c, n_blocks);
    for (int32_t il = k; il < m->hp.n_layer; il++) {
        if (!layer_supported(&m->layers[il]))
            return 0;
        const lms_weight *vs[N_VECS];
        layer_vecs(&m->layers[il], vs);
        for (int i = 0; i < N_VECS; i++)
            b += weight_bytes(vs[i]);
    }
    return b;
}

typedef struct sizes {
    size_t act, meta_n, scratch, kv_layer, max_cols, max_rows;
    int32_t n_blocks;
} sizes;

static void compute_sizes(const lms_ctx *c, int32_t n_blocks, sizes *z)
{
    const lms_model *m = c->m;
    const lms_hparams *hp = &m->hp;
    size_t n = (size_t)c->p.n_batch, e = (size_t)hp->n_embd, hd = (size_t)hp->head_dim;
    size_t q = (size_t)hp->n_head * hd, kv = (size_t)hp->n_head_kv * hd, f = (size_t)hp->n_ff;
    size_t wide = e > q ? e : q;
    wide = wide > f ? wide : f;
    size_t head_rows = n < HEAD_CHUNK ? n : HEAD_CHUNK;
    size_t nq8 = n < LCU_MATVEC_MAX ? n : LCU_MATVEC_MAX;
    z->act = align_up(n * e * 4) + align_up(n * wide * 4) + 2 * align_up(n * q * 4) +
             2 * align_up(n * kv * 4) + 2 * align_up(n * f * 4) +
             align_up(head_rows * (size_t)hp->n_vocab * 4) +
             (wide % 32 == 0 ? align_up(lcu_q8_bytes((int64_t)nq8, (int64_t)wide)) : 0);
    size_t n_seq = (size_t)(c->p.n_seq < c->p.n_batch ? c->p.n_seq : c->p.n_batch);
    z->meta_n = 2 * n + n_seq * ((size_t)c->p.n_ctx / LMS_KV_BLOCK + 2);
    size_t max_cols = (size_t)hp->n_embd, max_rows = (size_t)hp->n_vocab;
    max_cols = max_cols > f ? max_cols : f;
    max_cols = max_cols > q ? max_cols : q;
    max_rows = max_rows > f ? max_rows : f;
    z->max_cols = max_cols;
    z->max_rows = max_rows;
    z->scratch = z->act + align_up(z->meta_n * 4) +
                 lcu_scratch_bytes((int64_t)max_cols, (int64_t)max_rows, (int64_t)n, hp->n_head,
                                   hp->head_dim);
    z->kv_layer = (size_t)n_blocks * LMS_KV_BLOCK * kv * 2 * sizeof(uint16_t);
    z->n_blocks = n_blocks;
}

/* Fills c->plan: how many layers, whether the head. */
static int make_plan(lms_ctx *c, size_t free_bytes, const sizes *z, char *err, size_t errsz)
{
    const lms_model *m = c->m;
    const int32_t nl = m->hp.n_layer;
    lms_gpu_plan *pl = &c->plan;
    size_t margin = (size_t)(c->p.vram_margin_mb > 0 ? c->p.vram_margin_mb
                                                     : LMS_VRAM_MARGIN_MB_DEFAULT) << 20;
    if (c->p.vram_budget_mb > 0 && ((size_t)c->p.vram_budget_mb << 20) < free_bytes)
        free_bytes = (size_t)c->p.vram_budget_mb << 20;
    pl->n_layer = nl;
    pl->free_bytes = free_bytes;
    pl->usable_bytes = free_bytes > margin ? free_bytes - margin : 0;
    size_t used = z->scratch, usable = pl->usable_bytes;
    int32_t want = c->p.gpu_layers == LMS_GPU_LAYERS_ALL    ? nl
                   : c->p.gpu_layers == LMS_GPU_LAYERS_AUTO ? nl
                   : (c->p.gpu_layers < nl ? c->p.gpu_layers : nl);
    bool is_auto = c->p.gpu_layers == LMS_GPU_LAYERS_AUTO;
    int32_t k = 0;
    size_t w = 0;
    while (k < want && layer_supported(&m->layers[k])) {
        size_t lb = layer_bytes(&m->layers[k]);
        if (is_auto && used + lb + z->kv_layer > usable)
            break;
        used += lb + z->kv_layer;
        w += lb;
        k++;
    }
    /* layers left on the CPU: room for the prompt offload, for auto at the
     * cost of GPU layers (one layer's weights buy a prompt speed-up of
     * several times), for an explicit count only where it fits */
    size_t off = offload_bytes(c, k, z->n_blocks);
    while (is_auto && off && k > 1 && used + off > usable) {
        k--;
        size_t lb = layer_bytes(&m->layers[k]);
        used -= lb + z->kv_layer;
        w -= lb;
        off = offload_bytes(c, k, z->n_blocks);
    }
    if (off && used + off > usable)
        off = 0;
    used += off;
    pl->offload_bytes = off;
    if (!is_auto && k < want && !layer_supported(&m->layers[k]))
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                        "--gpu-layers: layer %d has a tensor type the CUDA kernels lack", k);
    if (!is_auto && used > usable)
        return lms_errf(err, errsz, LMS_ERR_NOMEM,
                        "--gpu-layers: %d layers need %.0f MiB of VRAM, %.0f MiB usable (%.0f MiB "
                        "free minus a %.0f MiB margin); use fewer layers or --gpu-layers auto",
                        k, (double)used / (1 << 20), (double)usable / (1 << 20),
                        (double)free_bytes / (1 << 20), (double)margin / (1 << 20));
    if (is_auto && k == 0) {
        pl->n_layer_gpu = 0;
        pl->offload_bytes = 0;
        return 0;
    }
    size_t ob = weight_bytes(&m->output) +
                (m->output_norm.data ? align_up((size_t)m->hp.n_embd * 4) : 0);
    pl->output_gpu = lcu_type_supported(m->output.type) && used + ob <= usable;
    if (pl->output_gpu) {
        used += ob;
        w += ob;
    }
    pl->n_layer_gpu = k;
    pl->weights_bytes = w;
    pl->kv_bytes = z->kv_layer * (size_t)k;
    pl->scratch_bytes = z->scratch;
    return 0;
}

/* Copies a host tensor into device memory at *cursor. */
static const void *put(fwd_gpu *gp, const lms_weight *w, char **cursor)
{
    if (!w->data)
        return NULL;
    size_t b = w->row_bytes * (size_t)(w->ne[1] > 0 ? w->ne[1] : 1);
    void *dst = *cursor;
    if (lcu_upload(gp->g, dst, w->data, b) < 0)
        return NULL;
    *cursor += align_up(b);
    return dst;
}

static lcu_mat as_lmat(const lms_weight *w, const void *dev)
{
    lcu_mat m = {dev, w->type, w->ne[0], w->ne[1], w->row_bytes};
    return m;
}

static int upload_layer(fwd_gpu *gp, const lms_layer *l, gpu_layer *dl, char *err, size_t errsz)
{
    dl->mem_bytes = layer_bytes(l);
    if (!(dl->mem = lcu_alloc(gp->g, dl->mem_bytes, err, errsz)))
        return LMS_ERR_NOMEM;
    char *cur = dl->mem;
    dl->wq = as_lmat(&l->wq, put(gp, &l->wq, &cur));
    dl->wk = as_lmat(&l->wk, put(gp, &l->wk, &cur));
    dl->wv = as_lmat(&l->wv, put(gp, &l->wv, &cur));
    dl->wo = as_lmat(&l->wo, put(gp, &l->wo, &cur));
    dl->w_gate = as_lmat(&l->w_gate, put(gp, &l->w_gate, &cur));
    dl->w_up = as_lmat(&l->w_up, put(gp, &l->w_up, &cur));
    dl->w_down = as_lmat(&l->w_down, put(gp, &l->w_down, &cur));
    dl->attn_norm = put(gp, &l->attn_norm, &cur);
    dl->ffn_norm = put(gp, &l->ffn_norm, &cur);
    dl->bq = put(gp, &l->bq, &cur);
    dl->bk = put(gp, &l->bk, &cur);
    dl->bv = put(gp, &l->bv, &cur);
    dl->q_norm = put(gp, &l->q_norm, &cur);
    dl->k_norm = put(gp, &l->k_norm, &cur);
    dl->attn_post_norm = put(gp, &l->attn_post_norm, &cur);
    dl->ffn_post_norm = put(gp, &l->ffn_post_norm, &cur);
    /* the mapped file is pageable: wait, so a later failure is reported here */
    return lcu_sync(gp->g, err, errsz);
}

static size_t head_rows_of(size_t n)
{
    return n < HEAD_CHUNK ? n : HEAD_CHUNK;
}

static int alloc_buffers(lms_ctx *c, fwd_gpu *gp, const sizes *z, int32_t n_blocks, char *err,
                         size_t errsz)
{
    const lms_hparams *hp = &c->m->hp;
    size_t n = (size_t)c->p.n_batch, e = (size_t)hp->n_embd, hd = (size_t)hp->head_dim;
    size_t q = (size_t)hp->n_head * hd, kv = (size_t)hp->n_head_kv * hd, f = (size_t)hp->n_ff;
    size_t wide = e > q ? e : q;
    wide = wide > f ? wide : f;
    gp->act_bytes = z->act;
    if (!(gp->act = lcu_alloc(gp->g, gp->act_bytes, err, errsz)))
        return LMS_ERR_NOMEM;
    char *cur = (char *)gp->act;
    float **bufs[] = {&gp->x, &gp->xn, &gp->qb, &gp->att, &gp->kb, &gp->vb, &gp->ga, &gp->up};
    size_t lens[] = {n * e, n * wide, n * q, n * q, n * kv, n * kv, n * f, n * f};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        *bufs[i] = (float *)cur;
        cur += align_up(lens[i] * 4);
    }
    gp->logits = (float *)cur;
    cur += align_up(head_rows_of(n) * (size_t)hp->n_vocab * 4);
    /* one q8 buffer serves every decode product in turn (the stream orders them) */
    gp->xq = wide % 32 == 0 ? (void *)cur : NULL;
    const char *gr = getenv("LMS_CUDA_GRAPHS");
    gp->graphs = !gr || atoi(gr) != 0;
    const char *dl = getenv("LMS_CUDA_DIRECT");
    gp->direct = !dl || atoi(dl) != 0;
    const char *lm = getenv("LMS_CUDA_LORA_MAX_MB");
    gp->lora_cap = lm && atol(lm) > 0 ? (size_t)atol(lm) << 20 : 0;
    gp->meta_n = z->meta_n;
    if (!(gp->meta = lcu_alloc(gp->g, z->meta_n * 4, err, errsz)))
        return LMS_ERR_NOMEM;
    int rc = lcu_reserve(gp->g, (int64_t)z->max_cols, (int64_t)z->max_rows, (int64_t)n,
                         hp->n_head, hp->head_dim, err, errsz);
    if (rc < 0)
        return rc;
    gp->kv_bytes = z->kv_layer * (size_t)c->n_gpu;
    if (c->n_gpu > 0 && !(gp->kv_mem = lcu_alloc(gp->g, gp->kv_bytes, err, errsz)))
        return LMS_ERR_NOMEM;
    size_t per = (size_t)n_blocks * LMS_KV_BLOCK * kv;
    for (int32_t il = 0; il < c->n_gpu; il++) {
        gp->layers[il].k = gp->kv_mem + (size_t)il * 2 * per;
        gp->layers[il].v = gp->kv_mem + (size_t)il * 2 * per + per;
    }
    size_t head_rows = n < HEAD_CHUNK ? n : HEAD_CHUNK;
    gp->meta_h = lcu_host_alloc(z->meta_n * 4);
    gp->x_h = lcu_host_alloc(n * e * 4);
    gp->logits_h = lcu_host_alloc(head_rows * (size_t)hp->n_vocab * 4);
    if (!gp->meta_h || !gp->x_h || !gp->logits_h)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "cuda: cannot allocate pinned host buffers");
    return 0;
}

static void free_gpu(fwd_gpu *gp, int32_t n_gpu)
{
    if (!gp)
        return;
    if (gp->off_prof && gp->off_layers)
        fprintf(stderr,
                "lmserv: prompt offload, %lld layer runs (%lld with attention on the GPU), ms: "
                "QKV %.1f, RoPE + cache on the CPU %.1f, attention on the CPU %.1f, W_o + FFN "
                "%.1f\n",
                (long long)gp->off_layers, (long long)gp->off_gpu_att, gp->off_ms[0], gp->off_ms[1],
                gp->off_ms[2], gp->off_ms[3]);
    lcu_host_unregister(gp->reg_w);
    lcu_host_unregister(gp->reg_kv[0]);
    lcu_host_unregister(gp->reg_kv[1]);
    lcu_host_free(gp->ometa_h);
    free(gp->o_pre);
    free(gp->o_new);
    for (int i = 0; i < 5; i++)
        lcu_host_unregister(gp->reg_act[i]);
    free(gp->off);
    if (gp->g) {
        for (int32_t i = 0; i < gp->n_lora; i++) {
            lcu_free(gp->g, gp->lora[i].mem, gp->lora[i].bytes);
            free(gp->lora[i].pairs);
        }
        lcu_free(gp->g, gp->lora_scr, gp->lora_scr_bytes);
        lcu_free(gp->g, gp->off_mem, gp->off_bytes);
        for (int32_t il = 0; gp->layers && il < n_gpu; il++)
            lcu_free(gp->g, gp->layers[il].mem, gp->layers[il].mem_bytes);
        lcu_free(gp->g, gp->out_mem, gp->out_bytes);
        lcu_free(gp->g, gp->kv_mem, gp->kv_bytes);
        lcu_free(gp->g, gp->act, gp->act_bytes);
        lcu_free(gp->g, gp->meta, gp->meta_n * 4);
        lcu_free(gp->g, gp->freq_factors, gp->freq_bytes);
        lcu_destroy(gp->g);
    }
    lcu_host_free(gp->meta_h);
    lcu_host_free(gp->x_h);
    lcu_host_free(gp->logits_h);
    lcu_host_free(gp->lora_h);
    free(gp->lora);
    free(gp->lora_grp);
    free(gp->layers);
    free(gp);
}

/* The prompt offload's staging, the CPU layers' vectors on the device, and
 * page-locking of the host memory it copies from: the CPU layers' weights
 * (one span of the mapped file, when they lie together) and the
 * activation buffers. A failed page-lock only makes copies synchronous. */
static int setup_offload(lms_ctx *c, fwd_gpu *gp, int32_t n_blocks, char *err, size_t errsz)
{
    const lms_model *m = c->m;
    const int32_t nl = m->hp.n_layer, n_cpu = nl - c->n_gpu;
    int rc = lcu_stage_reserve(gp->g, largest_matrix(m), OFFLOAD_SLOTS, err, errsz);
    if (rc < 0)
        return rc;
    gp->off_bytes = c->plan.offload_bytes - OFFLOAD_SLOTS * largest_matrix(m);
    if (!(gp->off = calloc((size_t)n_cpu, sizeof *gp->off)) ||
        !(gp->off_mem = lcu_alloc(gp->g, gp->off_bytes ? gp->off_bytes : 1, err, errsz)))
        return LMS_ERR_NOMEM;
    /* the K/V scratch and its batch table at the end of the block */
    const size_t kvb = offload_kv_bytes(c, n_blocks);
    if (kvb) {
        const size_t row = (size_t)m->hp.n_head_kv * (size_t)m->hp.head_dim * sizeof(uint16_t);
        gp->okv_blocks = offload_kv_blocks(c, n_blocks);
        const size_t pool = align_up((size_t)gp->okv_blocks * LMS_KV_BLOCK * row);
        gp->okv_k = (uint8_t *)gp->off_mem + gp->off_bytes - kvb;
        gp->okv_v = gp->okv_k + pool;
        gp->ometa = (int32_t *)(gp->okv_v + pool);
        const size_t nm = 2 * (size_t)c->p.n_batch + (size_t)gp->okv_blocks;
        gp->ometa_h = lcu_host_alloc(nm * 4);
        gp->o_pre = malloc((size_t)gp->okv_blocks * 4 * sizeof(int32_t));
        gp->o_new = malloc((size_t)gp->okv_blocks * 4 * sizeof(int32_t));
        if (!gp->ometa_h || !gp->o_pre || !gp->o_new)
            return lms_errf(err, errsz, LMS_ERR_NOMEM, "cuda: cannot allocate offload tables");
    }
    char *cur = gp->off_mem;
    const uint8_t *lo = NULL, *hi = NULL;
    size_t sum = 0;
    for (int32_t il = c->n_gpu; il < nl; il++) {
        const lms_layer *l = &m->layers[il];
        gpu_vecs *v = &gp->off[il - c->n_gpu];
        v->attn_norm = put(gp, &l->attn_norm, &cur);
        v->ffn_norm = put(gp, &l->ffn_norm, &cur);
        v->bq = put(gp, &l->bq, &cur);
        v->bk = put(gp, &l->bk, &cur);
        v->bv = put(gp, &l->bv, &cur);
        v->q_norm = put(gp, &l->q_norm, &cur);
        v->k_norm = put(gp, &l->k_norm, &cur);
        const lms_weight *ws[N_WEIGHTS];
        layer_weights(l, ws);
        for (int i = 0; i < 7; i++) {
            const uint8_t *d = ws[i]->data;
            size_t b = ws[i]->row_bytes * (size_t)ws[i]->ne[1];
            lo = !lo || d < lo ? d : lo;
            hi = !hi || d + b > hi ? d + b : hi;
            sum += b;
        }
    }
    if ((rc = lcu_sync(gp->g, err, errsz)) < 0)
        return rc;
    /* only a span that is mostly these weights (GGUF files store layers in order) */
    if (lo && (size_t)(hi - lo) <= sum + sum / 4 && lcu_host_register(lo, (size_t)(hi - lo), true) == 0)
        gp->reg_w = lo;
    const lms_hparams *hp = &m->hp;
    const size_t n = (size_t)c->p.n_batch, e = (size_t)hp->n_embd;
    const size_t q = (size_t)hp->n_head * (size_t)hp->head_dim;
    const size_t kv = (size_t)hp->n_head_kv * (size_t)hp->head_dim;
    const void *act[5] = {c->x, c->qb, c->kb, c->vb, c->att};
    const size_t len[5] = {n * e, n * q, n * kv, n * kv, n * q};
    for (int i = 0; i < 5; i++)
        if (lcu_host_register(act[i], len[i] * sizeof(float), false) == 0)
            gp->reg_act[i] = act[i];
    const char *mn = getenv("LMS_CUDA_OFFLOAD_MIN");
    gp->off_min = mn && atoi(mn) > LCU_MATVEC_MAX ? atoi(mn) : OFFLOAD_MIN;
    const char *oa = getenv("LMS_CUDA_OFFLOAD_ATT"); /* 0: attention on the CPU, for A/B */
    if (oa && atoi(oa) == 0)
        gp->okv_k = NULL;
    const char *pf = getenv("LMS_CUDA_OFFLOAD_PROF");
    gp->off_prof = pf && atoi(pf) != 0;
    gp->offload = true;
    fprintf(stderr,
            "lmserv: prompt offload: layers %d-%d run batches of %d+ tokens on the GPU (weights "
            "%s)\n",
            c->n_gpu, nl - 1, gp->off_min,
            gp->reg_w ? "page-locked" : "pageable: copies are synchronous");
    return 0;
}

static int create(lms_ctx *c, fwd_gpu *gp, int32_t n_blocks, char *err, size_t errsz)
{
    const lms_model *m = c->m;
    const lms_hparams *hp = &m->hp;
    lcu_info info;
    int rc = lcu_create(-1, &gp->g, &info, err, errsz);
    if (rc < 0)
        return rc;
    snprintf(c->plan.device, sizeof c->plan.device, "%s", info.name);
    if (hp->head_dim > LCU_HEAD_DIM_MAX || hp->n_head % hp->n_head_kv != 0)
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED, "cuda: head_dim %d is not supported",
                        hp->head_dim);
    sizes z;
    compute_sizes(c, n_blocks, &z);
    size_t free_b = 0, total_b = 0;
    lcu_mem_info(gp->g, &free_b, &total_b);
    if ((rc = make_plan(c, free_b, &z, err, errsz)) < 0)
        return rc;
    c->n_gpu = c->plan.n_layer_gpu;
    if (c->n_gpu == 0 && !c->plan.output_gpu)
        return 0;
    if (!(gp->layers = calloc((size_t)c->n_gpu + 1, sizeof *gp->layers)))
        return LMS_ERR_NOMEM;
    if ((rc = alloc_buffers(c, gp, &z, n_blocks, err, errsz)) < 0)
        return rc;
    for (int32_t il = 0; il < c->n_gpu; il++)
        if ((rc = upload_layer(gp, &m->layers[il], &gp->layers[il], err, errsz)) < 0)
            return rc;
    if (c->plan.output_gpu) {
        gp->out_bytes = weight_bytes(&m->output) +
                        (m->output_norm.data ? align_up((size_t)hp->n_embd * 4) : 0);
        if (!(gp->out_mem = lcu_alloc(gp->g, gp->out_bytes, err, errsz)))
            return LMS_ERR_NOMEM;
        char *cur = gp->out_mem;
        gp->output = as_lmat(&m->output, put(gp, &m->output, &cur));
        gp->has_output = true;
        /* all layers and the head on the GPU: a decode step runs the final
         * norm and the head in its graph too and brings back only logits */
        const char *fh = getenv("LMS_CUDA_FUSE_HEAD");
        if (m->output_norm.data && m->output_norm.type == LMS_TYPE_F32 &&
            m->output_norm.ne[0] == hp->n_embd && (!fh || atoi(fh) != 0)) {
            gp->out_norm = put(gp, &m->output_norm, &cur);
            gp->fuse_head = gp->out_norm && c->n_gpu == hp->n_layer && gp->xq;
        }
    }
    gp->pre_n = -1;
    /* Llama 3's frequency factors, or LongRoPE's long or short ones by the
     * context size (lms_model_rope_factors: the CPU's choice) */
    const float *ff = lms_model_rope_factors(m, c->p.n_ctx);
    if (ff) {
        gp->freq_bytes = (size_t)(hp->n_rot / 2) * 4;
        if (!(gp->freq_factors = lcu_alloc(gp->g, gp->freq_bytes, err, errsz)))
            return LMS_ERR_NOMEM;
        lcu_upload(gp->g, gp->freq_factors, ff, gp->freq_bytes);
    }
    if ((rc = lcu_sync(gp->g, err, errsz)) < 0)
        return rc;
    gp->shape = (lcu_attn_shape){hp->n_head,
                                 hp->n_head_kv,
                                 hp->head_dim,
                                 hp->n_rot,
                                 hp->rope_type == LMS_ROPE_NEOX,
                                 hp->rope_base,
                                 hp->rope_freq_scale,
                                 hp->rms_eps,
                                 gp->freq_factors,
                                 hp->rope_attn_factor != 0.0f ? hp->rope_attn_factor : 1.0f,
                                 0.0f,
                                 0.0f,
                                 0};
    gp->gemma = gemma_layers(m);
    for (int32_t il = 0; gp->gemma && il < c->n_gpu; il++) {
        const lms_layer *l = &m->layers[il];
        lcu_attn_shape *sh = &gp->layers[il].shape;
        *sh = gp->shape;
        sh->rope_base = l->rope_base;
        sh->rope_freq_scale = l->rope_freq_scale;
        sh->q_scale = hp->q_scale;
        sh->softcap = hp->attn_softcap;
        sh->n_swa = l->n_swa;
    }
    if (c->plan.offload_bytes && (rc = setup_offload(c, gp, n_blocks, err, errsz)) < 0)
        return rc;
    c->plan.allocated_bytes = lcu_allocated(gp->g);
    return 0;
}

int fwd_gpu_create(lms_ctx *c, int32_t n_blocks, char *err, size_t errsz)
{
    fwd_gpu *gp = calloc(1, sizeof *gp);
    if (!gp)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "context: out of memory");
    memset(&c->plan, 0, sizeof c->plan);
    c->n_gpu = 0;
    int rc = create(c, gp, n_blocks, err, errsz);
    if (rc < 0 || (c->n_gpu == 0 && !gp->has_output)) {
        free_gpu(gp, c->n_gpu);
        c->n_gpu = 0;
        c->gpu = NULL;
        if (rc < 0 && c->p.gpu_layers == LMS_GPU_LAYERS_AUTO) {
            /* auto falls back to the CPU; an explicit request fails */
            fprintf(stderr, "lmserv: %s; running on the CPU\n", err);
            return 0;
        }
        if (rc == 0 && c->p.gpu_layers == LMS_GPU_LAYERS_AUTO && c->m->hp.n_layer > 0 &&
            !layer_supported(&c->m->layers[0]))
            fprintf(stderr, "lmserv: layer 0 has a tensor type the CUDA kernels lack (IQ4_NL and "
                            "IQ4_XS run on the CPU only); running on the CPU\n");
        else if (rc == 0 && c->p.gpu_layers == LMS_GPU_LAYERS_AUTO)
            fprintf(stderr, "lmserv: no layer fits in the usable VRAM (%.0f MiB); running on the "
                            "CPU\n",
                    (double)c->plan.usable_bytes / (1 << 20));
        return rc;
    }
    c->gpu = gp;
    const int kvt = c->p.kv_type ? c->p.kv_type : LMS_TYPE_F16, rest = c->m->hp.n_layer - c->n_gpu;
    if (kvt != LMS_TYPE_F16 && c->n_gpu > 0 && rest == 0)
        fprintf(stderr, "lmserv: every layer is on the GPU, whose KV cache is f16: --kv-type %s "
                        "does not apply\n",
                lms_type_get(kvt)->name);
    else if (kvt != LMS_TYPE_F16 && c->n_gpu > 0)
        fprintf(stderr,
                "lmserv: the KV cache of the %d GPU layers is f16; --kv-type %s applies to the "
                "other %d layers\n",
                c->n_gpu, lms_type_get(kvt)->name, rest);
    return 0;
}

void fwd_gpu_destroy(lms_ctx *c)
{
    free_gpu(c->gpu, c->n_gpu);
    c->gpu = NULL;
}

/* ---- a step ------------------------------------------------------------------------ */

/* The tokens of the batch that belong to token t's sequence: the first of
 * them, and (when that is t) their lowest and highest position and count. */
typedef struct seq_span {
    int32_t first, lo, hi, n;
} seq_span;

static seq_span span_of(const lms_batch *b, int32_t t)
{
    seq_span sp = {0, b->pos[t], b->pos[t], 0};
    while (b->seq[sp.first] != b->seq[t])
        sp.first++;
    for (int32_t v = t; sp.first == t && v < b->n_tokens; v++) {
        if (b->seq[v] != b->seq[t])
            continue;
        sp.lo = b->pos[v] < sp.lo ? b->pos[v] : sp.lo;
        sp.hi = b->pos[v] > sp.hi ? b->pos[v] : sp.hi;
        sp.n++;
    }
    return sp;
}

/* Positions, per-token table offsets and the block tables of the batch's
 * sequences, into the pinned buffer; then one upload. */
static int upload_batch(lms_ctx *c, const lms_batch *b, lcu_batch *db, int32_t *max_npos)
{
    fwd_gpu *gp = c->gpu;
    const int32_t n = b->n_tokens;
    int32_t *pos = gp->meta_h, *off = pos + n, *tbl = off + n;
    size_t used = 2 * (size_t)n;
    *max_npos = 0;
    for (int32_t t = 0; t < n; t++) {
        pos[t] = b->pos[t];
        *max_npos = b->pos[t] + 1 > *max_npos ? b->pos[t] + 1 : *max_npos;
        const seq_span sp = span_of(b, t);
        if (sp.first < t) {
            off[t] = off[sp.first];
            continue;
        }
        /* a sequence's table up to the highest position it has in the batch */
        size_t nb = (size_t)sp.hi / LMS_KV_BLOCK + 1;
        if (used + nb > gp->meta_n)
            return LMS_ERR_LIMIT;
        off[t] = (int32_t)(used - 2 * (size_t)n);
        memcpy(tbl + off[t], b->seq[t]->blocks, nb * sizeof *tbl);
        used += nb;
    }
    if (lcu_upload(gp->g, gp->meta, gp->meta_h, used * 4) < 0)
        return LMS_ERR_DEVICE;
    *db = (lcu_batch){n, gp->meta, gp->meta + n, gp->meta + 2 * n};
    return 0;
}

/* x += post_norm(y) where the layer has that norm (gemma), else x += y. */
static void add_out(lcu *g, float *x, const float *y, const float *post_norm, int64_t n, int64_t e,
                    float eps)
{
    if (post_norm)
        lcu_norm_add(g, x, y, post_norm, n, e, eps);
    else
        lcu_add(g, x, y, n * e);
}

/* ---- LoRA ------------------------------------------------------------------------ */

/* The rounding of a pair's input on the device (lms_lora_pair's a_vt,
 * b_vt); -1 for a type the kernels do not round through. */
static int lora_vt(int vt)
{
    switch (vt) {
    case LMS_TYPE_F32: return LCU_LORA_F32;
    case LMS_TYPE_F16: return LCU_LORA_F16;
    case LMS_TYPE_BF16: return LCU_LORA_BF16;
    case LMS_TYPE_Q8_0: return LCU_LORA_Q8_0;
    default: return -1;
    }
}

/* Drops cache entry i (its memory is not used by queued work: the entry
 * is not in the current step and every earlier step was waited for). */
static void lora_evict(fwd_gpu *gp, int32_t i)
{
    lcu_free(gp->g, gp->lora[i].mem, gp->lora[i].bytes);
    free(gp->lora[i].pairs);
    gp->lora[i] = gp->lora[--gp->n_lora];
}

/* The cache entry of adapter l, uploaded (its pairs of the GPU layers)
 * when it has none; NULL with a message on failure. Entries move (the
 * array grows, evictions fill holes): the pointer holds until the next call. */
/* Evicts the least recently used entries not in this step until at most
 * n_max remain and, under a cap, `bytes` more fit beside them; false when
 * the step's own entries leave no such room. */
static bool lora_make_room(fwd_gpu *gp, size_t bytes, int32_t n_max)
{
    for (;;) {
        size_t held = 0;
        for (int32_t i = 0; i < gp->n_lora; i++)
            held += gp->lora[i].bytes;
        const bool over = gp->lora_cap && held + bytes > gp->lora_cap;
        if (gp->n_lora <= n_max && !over)
            return true;
        int32_t old = -1;
        for (int32_t i = 0; i < gp->n_lora; i++) {
            const uint64_t u = gp->lora[i].used;
            if (u < gp->lora_step && (old < 0 || u < gp->lora[old].used))
                old = i;
        }
        if (old < 0)
            return !over;
        lora_evict(gp, old);
    }
}

static gpu_lora *lora_entry(lms_ctx *c, const lms_lora *l)
{
    fwd_gpu *gp = c->gpu;
    const uint64_t id = lms_lora_id(l);
    for (int32_t i = 0; i < gp->n_lora; i++)
        if (gp->lora[i].id == id) {
            gp->lora[i].used = gp->lora_step;
            return &gp->lora[i];
        }
    const int nt = LMS_LORA_N_TARGETS;
    gpu_lora e = {id, gp->lora_step, NULL, 0, calloc((size_t)c->n_gpu * nt + 1, sizeof *e.pairs)};
    gpu_lora *grown = realloc(gp->lora, ((size_t)gp->n_lora + 1) * sizeof *grown);
    if (!e.pairs || !grown) {
        free(e.pairs);
        fprintf(stderr, "lmserv: LoRA adapter '%s': out of memory\n", lms_lora_name(l));
        return NULL;
    }
    gp->lora = grown;
    for (int32_t il = 0; il < c->n_gpu; il++)
        for (int t = 0; t < nt; t++) {
            const lms_lora_pair *p = lms_lora_layer_pair(l, il, t);
            if (!p)
                continue;
            const int avt = lora_vt(p->a_vt), bvt = lora_vt(p->b_vt);
            if (avt < 0 || bvt < 0 || (avt == LCU_LORA_Q8_0 && p->n_in % 32) ||
                (bvt == LCU_LORA_Q8_0 && p->rank % 32)) {
                free(e.pairs);
                fprintf(stderr, "lmserv: LoRA adapter '%s': blk.%d.%s rounds its input through "
                                "type %s, which the CUDA layers do not (use --gpu-layers 0)\n",
                        lms_lora_name(l), il, lms_lora_target_name(t),
                        lms_type_get(avt < 0 ? p->a_vt : p->b_vt)->name);
                return NULL;
            }
            e.bytes += align_up((size_t)p->rank * (size_t)p->n_in * 4) +
                       align_up((size_t)p->rank * (size_t)p->n_out * 4);
        }
    char err[256];
    if (!lora_make_room(gp, e.bytes, LORA_CACHE - 1)) {
        free(e.pairs);
        fprintf(stderr, "lmserv: LoRA adapter '%s' (%.1f MiB on the GPU) does not fit beside "
                        "this step's other adapters in LMS_CUDA_LORA_MAX_MB=%zu\n",
                lms_lora_name(l), (double)e.bytes / (1 << 20), gp->lora_cap >> 20);
        return NULL;
    }
    if (e.bytes && !(e.mem = lcu_alloc(gp->g, e.bytes, err, sizeof err))) {
        free(e.pairs);
        fprintf(stderr, "lmserv: LoRA adapter '%s' (%.1f MiB on the GPU): %s\n", lms_lora_name(l),
                (double)e.bytes / (1 << 20), err);
        return NULL;
    }
    char *cur = e.mem;
    for (int32_t il = 0; il < c->n_gpu; il++)
        for (int t = 0; t < nt; t++) {
            const lms_lora_pair *p = lms_lora_layer_pair(l, il, t);
            if (!p)
                continue;
            const size_t na = (size_t)p->rank * (size_t)p->n_in * 4;
            const size_t nb = (size_t)p->rank * (size_t)p->n_out * 4;
            lcu_upload(gp->g, cur, p->a, na);
            lcu_upload(gp->g, cur + align_up(na), p->bt, nb);
            e.pairs[(size_t)il * nt + t] =
                (lcu_lora_pair){(const float *)cur, (const float *)(cur + align_up(na)),
                                p->rank, p->n_in, p->n_out, p->factor, lora_vt(p->a_vt),
                                lora_vt(p->b_vt)};
            cur += align_up(na) + align_up(nb);
        }
    gp->lora[gp->n_lora] = e;
    return &gp->lora[gp->n_lora++];
}

/* A step with adapters (c->lora grouped by forward.c): scratch, each
 * group's cache entry, and the groups' rows and scales on the device. */
static int lora_begin(lms_ctx *c)
{
    fwd_gpu *gp = c->gpu;
    const fwd_lora *F = &c->lora;
    const lms_hparams *hp = &c->m->hp;
    const size_t n = (size_t)c->p.n_batch, uses = n * LMS_LORA_MAX;
    size_t wide = (size_t)hp->n_embd, q = (size_t)hp->n_head * (size_t)hp->head_dim;
    wide = wide > q ? wide : q;
    wide = wide > (size_t)hp->n_ff ? wide : (size_t)hp->n_ff;
    char err[256];
    gp->lora_failed = NULL;
    if (!gp->lora_grp && !(gp->lora_grp = malloc(uses * sizeof *gp->lora_grp)))
        return LMS_ERR_NOMEM;
    if (!gp->lora_h && !(gp->lora_h = lcu_host_alloc(uses * 8)))
        return LMS_ERR_NOMEM;
    if (F->t_rank > gp->lora_scr_rank) {
        lcu_free(gp->g, gp->lora_scr, gp->lora_scr_bytes);
        gp->lora_scr_rank = 0;
        gp->lora_scr_bytes = align_up(uses * 4) * 2 + align_up(n * wide * 4) +
                             align_up(n * (size_t)F->t_rank * 4);
        if (!(gp->lora_scr = lcu_alloc(gp->g, gp->lora_scr_bytes, err, sizeof err))) {
            gp->lora_scr_bytes = 0;
            fprintf(stderr, "lmserv: LoRA scratch on the GPU: %s\n", err);
            return LMS_ERR_ADAPTER;
        }
        char *cur = gp->lora_scr;
        gp->lora_rows = (int32_t *)cur;
        gp->lora_scales = (float *)(cur + align_up(uses * 4));
        gp->lora_xr = (float *)(cur + 2 * align_up(uses * 4));
        gp->lora_t = (float *)(cur + 2 * align_up(uses * 4) + align_up(n * wide * 4));
        gp->lora_scr_rank = F->t_rank;
    }
    gp->lora_step++;
    int32_t total = 0;
    for (int32_t i = 0; i < F->n_groups; i++) { /* all present first, then where they are */
        if (!lora_entry(c, F->groups[i].lora)) {
            gp->lora_failed = F->groups[i].lora; /* nothing ran yet: the scheduler fails
                                                    only the requests with it */
            return LMS_ERR_ADAPTER;
        }
        const int32_t end = F->groups[i].off + F->groups[i].n_rows;
        total = end > total ? end : total;
    }
    for (int32_t i = 0; i < F->n_groups; i++)
        gp->lora_grp[i] = lora_entry(c, F->groups[i].lora);
    int32_t *rows_h = gp->lora_h;
    float *scales_h = (float *)((char *)gp->lora_h + uses * 4);
    memcpy(rows_h, F->rows, (size_t)total * 4);
    memcpy(scales_h, F->scales, (size_t)total * 4);
    if (lcu_upload(gp->g, gp->lora_rows, rows_h, (size_t)total * 4) < 0 ||
        lcu_upload(gp->g, gp->lora_scales, scales_h, (size_t)total * 4) < 0)
        return LMS_ERR_DEVICE;
    gp->lora_on = true;
    return 0;
}

/* y += each adapter's delta for weight `target` of GPU layer il, over its
 * rows (x, y: the product's input and output rows on the device); nothing
 * in a step without adapters. */
static void lora_gpu(lms_ctx *c, int il, int target, const float *x, float *y)
{
    fwd_gpu *gp = c->gpu;
    if (!gp->lora_on)
        return;
    for (int32_t i = 0; i < c->lora.n_groups; i++) {
        const fwd_lora_group *grp = &c->lora.groups[i];
        const lcu_lora_pair *p = &gp->lora_grp[i]->pairs[(size_t)il * LMS_LORA_N_TARGETS + target];
        if (p->rank > 0)
            lcu_lora_apply(gp->g, p, x, y, gp->lora_rows + grp->off, gp->lora_scales + grp->off,
                           grp->n_rows, gp->lora_xr, gp->lora_t);
    }
}

/* Whether one-token steps fuse RoPE into the Q/K/V products (lcu_qkv_rope);
 * LMS_CUDA_QKV_ROPE=0 keeps the separate epilogue launch, for A/B. */
static bool qkv_rope_on(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LMS_CUDA_QKV_ROPE");
        v = e ? atoi(e) != 0 : 1;
    }
    return v;
}

/* A layer's attention half up to its output att: the normed residual
 * (and its q8 into eq), the Q/K/V products and biases, the epilogue into
 * the cache and the attention (and its q8 into aq). */
static int attn_half(lms_ctx *c, int il, const lcu_batch *db, int n_split,
                     const lcu_attn_shape *sh, void *eq, void *aq)
{
    fwd_gpu *gp = c->gpu;
    lcu *g = gp->g;
    const lms_hparams *hp = &c->m->hp;
    const gpu_layer *l = &gp->layers[il];
    const int64_t n = db->n_tok, e = hp->n_embd;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
    lcu_rms_norm_q8(g, gp->x, l->attn_norm, gp->xn, eq, n, e, hp->rms_eps);
    const lcu_mat *qkv[3] = {&l->wq, &l->wk, &l->wv};
    /* one token of a layer without Q/K norms, biases or adapters: RoPE and
     * the cache stores in the products' epilogue (one launch less a layer) */
    const bool fused = n == 1 && qkv_rope_on() && !l->q_norm && !l->k_norm && !l->bq && !l->bk &&
                       !l->bv && c->lora.n_groups == 0 &&
                       lcu_qkv_rope(g, qkv, eq, gp->qb, db, sh, l->k, l->v) == 0;
    int rc = 0;
    if (!fused) {
        float *qkv_out[3] = {gp->qb, gp->kb, gp->vb};
        rc = lcu_matmul_q8(g, 3, qkv, gp->xn, eq, n, qkv_out, false);
        lora_gpu(c, il, LMS_LORA_Q, gp->xn, gp->qb);
        lora_gpu(c, il, LMS_LORA_K, gp->xn, gp->kb);
        lora_gpu(c, il, LMS_LORA_V, gp->xn, gp->vb);
        lcu_add_bias(g, gp->qb, l->bq, n, q);
        lcu_add_bias(g, gp->kb, l->bk, n, kv);
        lcu_add_bias(g, gp->vb, l->bv, n, kv);
        lcu_qkv_post(g, db, sh, gp->qb, gp->kb, gp->vb, l->q_norm, l->k_norm, l->k, l->v);
    }
    lcu_attention(g, db, sh, gp->qb, l->k, l->v, gp->att, n_split, aq);
    return rc;
}

/* A gemma layer (forward.c's layer() with its gemma parts): the layer's
 * own RoPE base, window and score cap in its shape (the query scale is
 * applied in the attention kernels), the attention and FFN outputs
 * normed before their residual adds, and the GeGLU FFN. The products'
 * outputs go to xn first, so they cannot accumulate into x. Also every
 * step with adapters (llama/qwen too: no post norms, SwiGLU), their
 * deltas added after each product (lora_gpu). */
static int gpu_layer_run_gemma(lms_ctx *c, int il, const lcu_batch *db, int n_split)
{
    fwd_gpu *gp = c->gpu;
    lcu *g = gp->g;
    const lms_hparams *hp = &c->m->hp;
    const gpu_layer *l = &gp->layers[il];
    const int64_t n = db->n_tok, e = hp->n_embd, f = hp->n_ff;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim;
    /* decode: q8 copies of the products' inputs, each only where its width
     * has whole q8 blocks (else the product reads the f32 input) */
    void *xq = n <= LCU_MATVEC_MAX ? gp->xq : NULL;
    void *eq = e % 32 == 0 ? xq : NULL, *aq = q % 32 == 0 ? xq : NULL, *fq = f % 32 == 0 ? xq : NULL;
    int rc = attn_half(c, il, db, n_split, gp->gemma ? &l->shape : &gp->shape, eq, aq);
    const lcu_mat *wo[1] = {&l->wo};
    float *yo[1] = {gp->xn};
    rc |= lcu_matmul_q8(g, 1, wo, gp->att, aq, n, yo, false); /* xn = Wo·att */
    lora_gpu(c, il, LMS_LORA_O, gp->att, gp->xn);
    add_out(g, gp->x, gp->xn, l->attn_post_norm, n, e, hp->rms_eps);
    lcu_rms_norm_q8(g, gp->x, l->ffn_norm, gp->xn, eq, n, e, hp->rms_eps);
    const lcu_mat *gu[2] = {&l->w_gate, &l->w_up};
    float *gu_out[2] = {gp->ga, gp->up};
    rc |= lcu_matmul_q8(g, 2, gu, gp->xn, eq, n, gu_out, false);
    lora_gpu(c, il, LMS_LORA_GATE, gp->xn, gp->ga);
    lora_gpu(c, il, LMS_LORA_UP, gp->xn, gp->up);
    if (hp->ffn_act == LMS_FFN_GELU_TANH)
        lcu_geglu(g, gp->ga, gp->up, n * f);
    else
        lcu_swiglu(g, gp->ga, gp->up, n * f);
    if (fq)
        lcu_quantize_q8(g, gp->ga, fq, n, f);
    const lcu_mat *wd[1] = {&l->w_down};
    rc |= lcu_matmul_q8(g, 1, wd, gp->ga, fq, n, yo, false); /* xn = Wdown·h */
    lora_gpu(c, il, LMS_LORA_DOWN, gp->ga, gp->xn);
    add_out(g, gp->x, gp->xn, l->ffn_post_norm, n, e, hp->rms_eps);
    return rc ? LMS_ERR_DEVICE : 0;
}

static int gpu_layer_run(lms_ctx *c, int il, const lcu_batch *db, int n_split)
{
    fwd_gpu *gp = c->gpu;
    /* gemma: decided at load, so a captured graph holds one or the other;
     * adapters: steps that are never captured */
    if (gp->gemma || gp->lora_on)
        return gpu_layer_run_gemma(c, il, db, n_split);
    lcu *g = gp->g;
    const lms_hparams *hp = &c->m->hp;
    const gpu_layer *l = &gp->layers[il];
    const int64_t n = db->n_tok, e = hp->n_embd, f = hp->n_ff;
    /* decode: inputs also as int8 (q8) for the int8 mat-vec kernels */
    void *xq = n <= LCU_MATVEC_MAX ? gp->xq : NULL;
    int rc = attn_half(c, il, db, n_split, &gp->shape, xq, xq);
    const lcu_mat *wo[1] = {&l->wo};
    float *xo[1] = {gp->x};
    rc |= lcu_matmul_q8(g, 1, wo, gp->att, xq, n, xo, true); /* x += Wo·att */
    lcu_rms_norm_q8(g, gp->x, l->ffn_norm, gp->xn, xq, n, e, hp->rms_eps);
    /* ga = silu(Wgate·xn) * (Wup·xn), and its q8 into xq for the down product */
    rc |= lcu_ffn_gate_up(g, &l->w_gate, &l->w_up, gp->xn, xq, n, gp->ga, gp->up, xq);
    const lcu_mat *wd[1] = {&l->w_down};
    rc |= lcu_matmul_q8(g, 1, wd, gp->ga, xq, n, xo, true); /* x += Wdown·h */
    (void)f;
    return rc ? LMS_ERR_DEVICE : 0;
}

/* Whether decode steps' attention takes the tiled kernel (gemma's never). */
static bool dec_kernel(const fwd_gpu *gp)
{
    return !gp->gemma && lcu_attn_dec_takes(gp->g, &gp->shape);
}

/* Splits of the positions per head: enough blocks to fill the GPU on long
 * contexts, one split for short ones. dec: the tiled decode kernel takes
 * the step (32 positions a split, its tile: H200, Llama-3-8B at 128-256
 * positions, one token 2.47 ms a step vs 2.51 with 16, 8 tokens 3.90 vs
 * 4.01; 64 and 128 slower). */
static int choose_split(int32_t n_tok, int32_t max_npos, bool dec)
{
    int cap = lcu_attn_max_split(n_tok);
    /* decode: few positions per split (each block's 4 warps walk them one
     * by one), so even short contexts give n_kv_head x splits blocks; 16
     * for one to three tokens, 32 from four on, where the tokens give
     * blocks enough and fewer partials are merged (H100, 8 tokens at ~130
     * positions: step 4.76 vs 5.25 ms; one token: 32 gave 3.13 vs 3.04 ms).
     * LMS_CUDA_ATTN_PER=N (>= 16) forces N, for tuning. */
    static int dec_per = -1;
    if (dec_per < 0) {
        const char *e = getenv("LMS_CUDA_ATTN_PER");
        dec_per = e && atoi(e) >= 16 ? atoi(e) : 0;
    }
    int per = n_tok > LCU_MATVEC_MAX ? 512 : dec_per > 0 ? dec_per : (dec || n_tok >= 4) ? 32 : 16;
    int s = (max_npos + per - 1) / per;
    s = s < 1 ? 1 : (s > cap ? cap : s);
    if (n_tok <= LCU_MATVEC_MAX) {
        /* decode: a power of two, so that few graphs cover every length */
        int p = 1;
        while (p < s)
            p *= 2;
        s = p > cap ? cap : p;
    }
    return s;
}

/* Graph slot of a decode step: by batch size and split count. */
static int graph_slot(int32_t n_tok, int n_split)
{
    int k = 0;
    while ((1 << k) < n_split)
        k++;
    int slot = (n_tok - 1) * 7 + k;
    return n_tok >= 1 && n_tok <= LCU_MATVEC_MAX && k < 7 && slot < LCU_GRAPH_MAX ? slot : -1;
}

/* Final RMSNorm of every row and the head over all of them into
 * gp->logits (decode batches: the head's weights are read once anyway). */
static int run_head(lms_ctx *c, int32_t n)
{
    fwd_gpu *gp = c->gpu;
    const lms_hparams *hp = &c->m->hp;
    lcu_rms_norm_q8(gp->g, gp->x, gp->out_norm, gp->xn, gp->xq, n, hp->n_embd, hp->rms_eps);
    const lcu_mat *wo[1] = {&gp->output};
    float *lo[1] = {gp->logits};
    int rc = lcu_matmul_q8(gp->g, 1, wo, gp->xn, gp->xq, n, lo, false) ? LMS_ERR_DEVICE : 0;
    if (hp->final_softcap != 0.0f) /* gemma2 (forward.c leaves GPU logits to us) */
        lcu_softcap(gp->g, gp->logits, (int64_t)n * hp->n_vocab, hp->final_softcap);
    return rc;
}

static int run_layers(lms_ctx *c, const lcu_batch *db, int n_split, bool head)
{
    int rc = 0;
    for (int il = 0; il < c->n_gpu && rc == 0; il++)
        rc = gpu_layer_run(c, il, db, n_split);
    if (rc == 0 && head)
        rc = run_head(c, db->n_tok);
    return rc;
}

/* Whether logits may come down straight into the caller's buffer p:
 * page-locked (lms_ctx_host_alloc) and not LMS_CUDA_DIRECT=0. */
static bool direct_to(const fwd_gpu *gp, const float *p)
{
    return p && gp->direct && lcu_host_pinned(p);
}

int fwd_gpu_layers(lms_ctx *c, const lms_batch *b, float *logits)
{
    fwd_gpu *gp = c->gpu;
    gp->pre_n = -1;
    gp->ob_ready = false;
    gp->lora_on = false;
    if (c->n_gpu == 0)
        return 0;
    /* adapters: their deltas on the device, the step run eagerly below */
    int rc;
    if (b->lora && c->lora.n_groups > 0 && (rc = lora_begin(c)) < 0)
        return rc;
    const size_t bytes = (size_t)b->n_tokens * (size_t)c->m->hp.n_embd * sizeof(float);
    lcu_batch db;
    int32_t max_npos;
    rc = upload_batch(c, b, &db, &max_npos);
    if (rc < 0)
        return rc;
    memcpy(gp->x_h, c->x, bytes);
    if (lcu_upload(gp->g, gp->x, gp->x_h, bytes) < 0)
        return LMS_ERR_DEVICE;
    const int n_split = choose_split(b->n_tokens, max_npos, dec_kernel(gp));
    /* decode steps replay a captured graph of all GPU layers: the kernels'
     * arguments depend only on the batch size and split count (positions
     * and block tables are read from device memory) */
    const int slot = gp->graphs && !gp->lora_on ? graph_slot(b->n_tokens, n_split) : -1;
    /* with adapters the head runs unfused: forward.c adds its delta */
    const bool head = gp->fuse_head && b->n_tokens <= LCU_MATVEC_MAX && !b->lora;
    bool done = false;
    /* one- and two-token steps: each kernel may start while the previous
     * one ends (H200, Llama-3-8B Q4_K_M: one token 2.79 -> 2.66 ms a step,
     * two 3.49 -> 3.38). From 3 tokens on the tensor-core kernels run, and
     * there it cost time: 8 tokens 4.47 -> 4.95 ms (4.56 even with those
     * kernels launched without it) */
    lcu_pdl(gp->g, b->n_tokens <= 2);
    if (slot >= 0 && !lcu_graph_ready(gp->g, slot) && lcu_graph_begin(gp->g) == 0) {
        rc = run_layers(c, &db, n_split, head);
        if (lcu_graph_end(gp->g, slot) < 0 || rc != 0) {
            gp->graphs = false; /* capture failed: run directly from now on */
            rc = 0;
        }
    }
    if (slot >= 0 && gp->graphs && lcu_graph_ready(gp->g, slot)) {
        rc = lcu_graph_launch(gp->g, slot) < 0 ? LMS_ERR_DEVICE : 0;
        done = true;
    }
    if (!done)
        rc = run_layers(c, &db, n_split, head);
    lcu_pdl(gp->g, false);
    gp->lora_on = false;
    if (rc == 0 && lcu_download(gp->g, gp->x_h, gp->x, bytes) < 0)
        rc = LMS_ERR_DEVICE;
    /* the rows forward.c will ask logits for (its rule), compacted, each
     * run of consecutive rows in one copy; they come back with the
     * residual, under the same single wait. Into the caller's buffer when
     * it is page-locked: the 8-token step's 4 MB of logits (Llama 3) then
     * cost no copy on the host. */
    int32_t n_lg = 0;
    const size_t nv = (size_t)c->m->hp.n_vocab;
    gp->pre_at = direct_to(gp, logits) ? logits : gp->logits_h;
    for (int32_t t = 0; head && rc == 0 && t < b->n_tokens;) {
        int32_t k = 0;
        while (t + k < b->n_tokens && (b->logits ? b->logits[t + k] : t + k == b->n_tokens - 1))
            k++;
        if (k > 0 && lcu_download(gp->g, gp->pre_at + (size_t)n_lg * nv,
                                  gp->logits + (size_t)t * nv, (size_t)k * nv * sizeof(float)) < 0)
            rc = LMS_ERR_DEVICE;
        n_lg += k;
        t += k > 0 ? k : 1;
    }
    char err[256];
    if (lcu_sync(gp->g, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv: %s\n", err);
        return LMS_ERR_DEVICE;
    }
    if (rc == 0) {
        memcpy(c->x, gp->x_h, bytes);
        gp->pre_n = head ? n_lg : -1;
    }
    return rc;
}

const lms_lora *fwd_gpu_lora_failed(const lms_ctx *c)
{
    return c->gpu->lora_failed;
}

bool fwd_gpu_has_output(const lms_ctx *c)
{
    return c->gpu && c->gpu->has_output;
}

int fwd_gpu_output(lms_ctx *c, const float *xn, int32_t n, float *logits, bool cap)
{
    fwd_gpu *gp = c->gpu;
    const size_t e = (size_t)c->m->hp.n_embd, nv = (size_t)c->m->hp.n_vocab;
    if (gp->pre_n >= 0 && gp->pre_n == n) { /* computed in this step's graph */
        if (logits != gp->pre_at)
            memcpy(logits, gp->pre_at, (size_t)n * nv * sizeof(float));
        gp->pre_n = -1;
        return 0;
    }
    gp->pre_n = -1;
    const bool direct = direct_to(gp, logits);
    for (int32_t r0 = 0; r0 < n; r0 += HEAD_CHUNK) {
        int32_t k = n - r0 < HEAD_CHUNK ? n - r0 : HEAD_CHUNK;
        memcpy(gp->x_h, xn + (size_t)r0 * e, (size_t)k * e * sizeof(float));
        if (lcu_upload(gp->g, gp->xn, gp->x_h, (size_t)k * e * sizeof(float)) < 0 ||
            lcu_matmul(gp->g, &gp->output, gp->xn, k, gp->logits, false) < 0)
            return LMS_ERR_DEVICE;
        if (cap && c->m->hp.final_softcap != 0.0f) /* gemma2: forward.c returns our logits */
            lcu_softcap(gp->g, gp->logits, (int64_t)k * (int64_t)nv, c->m->hp.final_softcap);
        float *to = direct ? logits + (size_t)r0 * nv : gp->logits_h;
        if (lcu_download(gp->g, to, gp->logits, (size_t)k * nv * sizeof(float)) < 0)
            return LMS_ERR_DEVICE;
        char err[256];
        if (lcu_sync(gp->g, err, sizeof err) < 0) {
            fprintf(stderr, "lmserv: %s\n", err);
            return LMS_ERR_DEVICE;
        }
        if (!direct)
            memcpy(logits + (size_t)r0 * nv, gp->logits_h, (size_t)k * nv * sizeof(float));
    }
    return 0;
}

/* ---- prompt offload of a CPU layer ------------------------------------------------ */

/* y = W·x (+= when acc) with W copied from host memory into a staging slot. */
static int staged_matmul(lcu *g, const lms_weight *w, const float *x, int64_t n, float *y, bool acc)
{
    const void *d = lcu_stage(g, w->data, w->row_bytes * (size_t)w->ne[1]);
    if (!d)
        return LMS_ERR_DEVICE;
    lcu_mat m = as_lmat(w, d);
    int rc = lcu_matmul(g, &m, x, n, y, acc);
    lcu_stage_done(g, d);
    return rc < 0 ? LMS_ERR_DEVICE : 0;
}

/* The step's batch for the offload's attention on the GPU: per sequence,
 * its blocks up to its highest position renumbered 0, 1, ... into the K/V
 * scratch, with the blocks holding a cached prefix to copy up and those
 * receiving the batch's rows to copy back. false (attention on the CPU)
 * when they do not fit or a sequence's positions are not one run. */
static bool offload_batch(lms_ctx *c, const lms_batch *b)
{
    fwd_gpu *gp = c->gpu;
    const int32_t n = b->n_tokens;
    int32_t *pos = gp->ometa_h, *off = pos + n, *tbl = off + n;
    int32_t used = 0;
    gp->o_n_pre = gp->o_n_new = 0;
    gp->o_max_npos = 0;
    for (int32_t t = 0; t < n; t++) {
        pos[t] = b->pos[t];
        gp->o_max_npos = b->pos[t] + 1 > gp->o_max_npos ? b->pos[t] + 1 : gp->o_max_npos;
        const seq_span sp = span_of(b, t);
        if (sp.first < t) {
            off[t] = off[sp.first];
            continue;
        }
        const int32_t lo = sp.lo, hi = sp.hi, nb = hi / LMS_KV_BLOCK + 1;
        if (sp.n != hi - lo + 1 || used + nb > gp->okv_blocks)
            return false;
        off[t] = used;
        for (int32_t j = 0; j < nb; j++) {
            const int32_t host = b->seq[t]->blocks[j], dev = used + j, p0 = j * LMS_KV_BLOCK;
            tbl[dev] = dev;
            if (p0 < lo) { /* rows [p0, lo) are cached */
                int32_t *r = gp->o_pre + 4 * gp->o_n_pre++;
                r[0] = host, r[1] = dev, r[2] = 0;
                r[3] = (lo < p0 + LMS_KV_BLOCK ? lo : p0 + LMS_KV_BLOCK) - p0;
            }
            if (p0 + LMS_KV_BLOCK > lo) { /* rows [max(p0, lo), min(end, hi + 1)) are new */
                int32_t *r = gp->o_new + 4 * gp->o_n_new++;
                const int32_t a = lo > p0 ? lo : p0;
                const int32_t z = hi + 1 < p0 + LMS_KV_BLOCK ? hi + 1 : p0 + LMS_KV_BLOCK;
                r[0] = host, r[1] = dev, r[2] = a - p0, r[3] = z - a;
            }
        }
        used += nb;
    }
    if (lcu_upload(gp->g, gp->ometa, gp->ometa_h, (2 * (size_t)n + (size_t)used) * 4) < 0)
        return false;
    gp->odb = (lcu_batch){n, gp->ometa, gp->ometa + n, gp->ometa + 2 * n};
    return true;
}

/* Copies K and V rows of host-cache layer lh between the host pool and
 * the scratch: n entries (host block, scratch block, first row, rows), the
 * rows of a block being contiguous in both. */
static int copy_rows(lms_ctx *c, int lh, const int32_t *list, int32_t n, bool up)
{
    fwd_gpu *gp = c->gpu;
    const lms_kv_cache *kv = &c->kv;
    const size_t blk = LMS_KV_BLOCK * kv->row_bytes;
    int rc = 0;
    for (const int32_t *r = list; r < list + 4 * n; r += 4) {
        const size_t ho = (size_t)lh * kv->layer_stride + (size_t)r[0] * blk + (size_t)r[2] * kv->row_bytes;
        const size_t dof = (size_t)r[1] * blk + (size_t)r[2] * kv->row_bytes;
        const size_t len = (size_t)r[3] * kv->row_bytes;
        if (up)
            rc |= lcu_upload(gp->g, gp->okv_k + dof, kv->k + ho, len) |
                  lcu_upload(gp->g, gp->okv_v + dof, kv->v + ho, len);
        else
            rc |= lcu_download(gp->g, kv->k + ho, gp->okv_k + dof, len) |
                  lcu_download(gp->g, kv->v + ho, gp->okv_v + dof, len);
    }
    return rc;
}

/* Once per step: whether its attention can run on the GPU (an f16 host
 * cache, a scratch, a batch that fits); page-locks the host K/V pools on
 * first use (pools of whole huge pages only: a smaller one may share a
 * page with another allocation). */
static void offload_step(lms_ctx *c, const lms_batch *b)
{
    fwd_gpu *gp = c->gpu;
    gp->ob_ready = true;
    gp->o_gpu_att = gp->okv_k && c->kv.type == LMS_TYPE_F16 && offload_batch(c, b);
    if (!gp->reg_kv_tried) {
        gp->reg_kv_tried = true;
        const size_t bytes = (size_t)c->kv.n_layer * c->kv.layer_stride;
        if (bytes >= ((size_t)2 << 20) && bytes % ((size_t)2 << 20) == 0) {
            if (lcu_host_register(c->kv.k, bytes, false) == 0)
                gp->reg_kv[0] = c->kv.k;
            if (lcu_host_register(c->kv.v, bytes, false) == 0)
                gp->reg_kv[1] = c->kv.v;
        }
    }
}

/* RoPE, the cache and attention of an offloaded layer on the GPU: the
 * prefix blocks up into the scratch, the batch's rows written there, the
 * attention, and the blocks with new rows back into the host cache. */
static int offload_attention_gpu(lms_ctx *c, int il, const gpu_vecs *v)
{
    fwd_gpu *gp = c->gpu;
    const int lh = il - c->n_gpu;
    int rc = copy_rows(c, lh, gp->o_pre, gp->o_n_pre, true);
    uint16_t *kc = (uint16_t *)gp->okv_k, *vc = (uint16_t *)gp->okv_v;
    lcu_qkv_post(gp->g, &gp->odb, &gp->shape, gp->qb, gp->kb, gp->vb, v->q_norm, v->k_norm, kc, vc);
    lcu_attention(gp->g, &gp->odb, &gp->shape, gp->qb, kc, vc, gp->att,
                  choose_split(gp->odb.n_tok, gp->o_max_npos, dec_kernel(gp)), NULL);
    rc |= copy_rows(c, lh, gp->o_new, gp->o_n_new, false);
    return rc;
}

static int offload_layer(lms_ctx *c, int il, const lms_batch *b)
{
    fwd_gpu *gp = c->gpu;
    lcu *g = gp->g;
    const lms_hparams *hp = &c->m->hp;
    const lms_layer *l = &c->m->layers[il];
    const gpu_vecs *v = &gp->off[il - c->n_gpu];
    const int64_t n = b->n_tokens, e = hp->n_embd;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
    const size_t fl = sizeof(float);
    char err[256];
    const double t0 = lms_now_ms();
    if (!gp->ob_ready)
        offload_step(c, b);
    /* Q, K, V of the normed residual */
    int rc = lcu_upload(g, gp->x, c->x, (size_t)(n * e) * fl);
    lcu_rms_norm(g, gp->x, v->attn_norm, gp->xn, n, e, hp->rms_eps);
    rc |= staged_matmul(g, &l->wq, gp->xn, n, gp->qb, false);
    rc |= staged_matmul(g, &l->wk, gp->xn, n, gp->kb, false);
    rc |= staged_matmul(g, &l->wv, gp->xn, n, gp->vb, false);
    lcu_add_bias(g, gp->qb, v->bq, n, q);
    lcu_add_bias(g, gp->kb, v->bk, n, kv);
    lcu_add_bias(g, gp->vb, v->bv, n, kv);
    const void *wo = NULL;
    double t1 = t0, t2 = t0, t3 = t0;
    if (gp->o_gpu_att) {
        rc |= offload_attention_gpu(c, il, v);
        if (!(wo = lcu_stage(g, l->wo.data, l->wo.row_bytes * (size_t)l->wo.ne[1])))
            return LMS_ERR_DEVICE;
    } else {
        /* Q, K, V back to the host, attention on the CPU; W_o's copy
         * overlaps it */
        rc |= lcu_download(g, c->qb, gp->qb, (size_t)(n * q) * fl);
        rc |= lcu_download(g, c->kb, gp->kb, (size_t)(n * kv) * fl);
        rc |= lcu_download(g, c->vb, gp->vb, (size_t)(n * kv) * fl);
        wo = lcu_stage(g, l->wo.data, l->wo.row_bytes * (size_t)l->wo.ne[1]);
        if (rc || !wo || lcu_sync(g, err, sizeof err) < 0)
            return LMS_ERR_DEVICE;
        t1 = lms_now_ms();
        fwd_qkv_post(c, il, b);
        t2 = lms_now_ms();
        fwd_attention(c, il, b);
        t3 = lms_now_ms();
        rc = lcu_upload(g, gp->att, c->att, (size_t)(n * q) * fl);
    }
    /* x += W_o·att; the FFN block; x back to the host */
    lcu_mat mo = as_lmat(&l->wo, wo);
    rc |= lcu_matmul(g, &mo, gp->att, n, gp->x, true);
    lcu_stage_done(g, wo);
    lcu_rms_norm(g, gp->x, v->ffn_norm, gp->xn, n, e, hp->rms_eps);
    const void *dg = lcu_stage(g, l->w_gate.data, l->w_gate.row_bytes * (size_t)l->w_gate.ne[1]);
    const void *du = lcu_stage(g, l->w_up.data, l->w_up.row_bytes * (size_t)l->w_up.ne[1]);
    if (rc || !dg || !du)
        return LMS_ERR_DEVICE;
    lcu_mat mg = as_lmat(&l->w_gate, dg), mu = as_lmat(&l->w_up, du);
    rc |= lcu_ffn_gate_up(g, &mg, &mu, gp->xn, NULL, n, gp->ga, gp->up, NULL);
    lcu_stage_done(g, dg);
    lcu_stage_done(g, du);
    rc |= staged_matmul(g, &l->w_down, gp->ga, n, gp->x, true);
    rc |= lcu_download(g, c->x, gp->x, (size_t)(n * e) * fl);
    if (lcu_sync(g, err, sizeof err) < 0)
        return LMS_ERR_DEVICE;
    double t4 = lms_now_ms();
    gp->off_ms[0] += t1 - t0;
    gp->off_ms[1] += t2 - t1;
    gp->off_ms[2] += t3 - t2;
    gp->off_ms[3] += t4 - t3;
    gp->off_gpu_att += gp->o_gpu_att;
    gp->off_layers++;
    return rc ? LMS_ERR_DEVICE : 0;
}

bool fwd_gpu_offload_layer(lms_ctx *c, int il, const lms_batch *b)
{
    fwd_gpu *gp = c->gpu;
    if (!gp->offload || b->n_tokens < gp->off_min || b->lora) /* adapters: the CPU's layer */
        return false;
    if (offload_layer(c, il, b) < 0) {
        /* c->x is written only by the last copy: the CPU redoes the layer;
         * the wait drains the stream and takes the error off it */
        char err[256] = "a copy or product could not be queued";
        lcu_sync(gp->g, err, sizeof err);
        fprintf(stderr, "lmserv: prompt offload of layer %d failed (%s); CPU layers stay on the "
                        "CPU\n", il, err);
        gp->offload = false;
        return false;
    }
    return true;
}
