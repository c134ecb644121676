/*
 * forward_int.h - internal to the engine's forward pass: the context
 * structure, shared by forward.c (CPU layers) and forward_cuda.c (the
 * layers and output head placed on the GPU).
 *
 * Placement: layers [0, n_gpu) run on the GPU with their K/V blocks in
 * device memory; layers [n_gpu, n_layer) run on the CPU with theirs in the
 * host pool, whose layer index is therefore il - n_gpu. Both pools use the
 * same block ids: the block tables and prefix cache (kv_cache.c) are the
 * host's, and the device pool mirrors its layout per layer.
 */
#ifndef LMS_FORWARD_INT_H
#define LMS_FORWARD_INT_H

#include "engine/forward.h"

typedef struct fwd_gpu fwd_gpu; /* forward_cuda.c */

/* A tile: up to ATT_TILE consecutive tokens of one sequence (positions
 * pos0, pos0+1, ...) and one KV head; its n_q = n_tok * group queries are
 * scored against each K row once. */
#define ATT_TILE 8

/* Attention's value sums are defined by chunks of this many positions
 * (attention.c); a multiple of LMS_KV_BLOCK. */
#define ATT_CHUNK 128

typedef struct att_tile {
    const lms_kv_seq *seq;
    int32_t pos0;     /* position of the first token */
    int32_t t0;       /* its row in the batch */
    int32_t n_tok;
} att_tile;

/* LoRA work of one step (forward.c): the distinct adapters of the rows,
 * each with the rows that use it and their user scales. */
typedef struct fwd_lora_group {
    const lms_lora *lora;
    int32_t off;      /* its entries in rows[] / scales[] */
    int32_t n_rows;
} fwd_lora_group;

typedef struct fwd_lora {
    int32_t n_groups;
    fwd_lora_group *groups;     /* [n_batch * LMS_LORA_MAX] */
    int32_t *rows;              /* [n_batch * LMS_LORA_MAX] activation rows, by group */
    float *scales;              /* [n_batch * LMS_LORA_MAX] their user scales */
    int32_t *tmp;               /* [n_batch * LMS_LORA_MAX] group of each use (grouping) */
    const lms_lora_set **head;  /* [n_batch] the set of each logits row */
    float *t;                   /* [n_batch][t_rank] A·x of a group's rows */
    int32_t t_rank;
    float *xr;                  /* [n_batch][wide] input rows rounded as llama.cpp does */
    uint8_t *xq;                /* [n_batch][xq_row] the same in the rounding type */
    size_t xq_row;              /* bytes: room for a row of `wide` values in any type */
    int64_t wide;               /* max(n_embd, n_head * head_dim, n_ff) */
} fwd_lora;

struct lms_ctx {
    const lms_model *m;
    lms_ctx_params p;
    lms_kv_cache kv; /* host K/V of the CPU layers [n_gpu, n_layer) */
    int n_threads;
    float *x, *xn, *qb, *kb, *vb, *att, *ga, *up; /* see forward.c's shapes */
    float *hidden;      /* [n_batch][e] normed rows that want logits */
    float *scores;      /* [n_threads][ATT_TILE * group][n_ctx] attention weights */
    uint16_t *qh;       /* [n_threads][ATT_TILE * group][hd] a tile's queries, cache type */
    att_tile *tiles;    /* [n_batch] the batch cut into attention tiles */
    float *vconv;       /* [n_threads][n_ctx][hd] a tile's V rows as f32 (reference path) */
    float *qf;          /* queries as floats, rows of hd + hd/32: per thread qf_rows
                         * (by head), or qf_tiles * n_head (by chunk) */
    int32_t qf_rows;    /* ATT_TILE * group */
    int32_t qf_tiles;   /* most single-token tiles the by-chunk schedule takes */
    float *dec;         /* by-chunk scores and chunk sums (forward.c) */
    size_t dec_floats;
    int att_impl;       /* FWD_ATT_*: which attention path runs */
    void *qbuf;         /* activation conversion scratch */
    int32_t n_hidden;
    int32_t n_gpu;      /* layers on the GPU (0: CPU only) */
    fwd_gpu *gpu;       /* NULL when nothing is on the GPU */
    lms_gpu_plan plan;  /* valid when gpu != NULL */
    fwd_lora lora;      /* allocated at the first batch with adapters */
};

/* Attention paths (forward.c): the reference (tiled gemm scores, V rows
 * converted per tile), and the per-row path in portable C or AVX-512. */
enum { FWD_ATT_AUTO = 0, FWD_ATT_REF, FWD_ATT_C, FWD_ATT_AVX512 };

/* Selects the attention path (FWD_ATT_AUTO: AVX-512 where the CPU, kernel
 * ISA and head size allow, else the reference; the environment's
 * LMS_ATTENTION=ref|c overrides auto for A/B timings); LMS_ERR_UNSUPPORTED
 * if the asked one cannot run here. */
int fwd_set_attention(lms_ctx *c, int impl);

/* The attention of CPU layer il for every token of b: queries in c->qb,
 * this step's K/V already in the cache, output to c->att (attention.c). */
void fwd_attention(lms_ctx *c, int il, const lms_batch *b);

/* After the Q/K/V products of CPU layer il (c->qb, kb, vb, biases added):
 * per-head norms, RoPE, and K/V written to the host cache (forward.c). */
void fwd_qkv_post(lms_ctx *c, int il, const lms_batch *b);

#ifdef LMS_HAVE_CUDA
/* Plans the placement from free VRAM and c->p, allocates device memory and
 * uploads the chosen layers; sets c->n_gpu, c->gpu and c->plan. With
 * gpu_layers auto and no usable device, leaves everything on the CPU
 * (and says why on stderr). n_blocks: the KV pool size in blocks. */
int fwd_gpu_create(lms_ctx *c, int32_t n_blocks, char *err, size_t errsz);
void fwd_gpu_destroy(lms_ctx *c);
/* Runs layers [0, n_gpu) over c->x (n_tokens rows) in place; logits: the
 * caller's buffer of lms_forward (a fused head's rows may go there). */
int fwd_gpu_layers(lms_ctx *c, const lms_batch *b, float *logits);
/* Runs CPU layer il with its matrix products on the GPU (the weights are
 * uploaded for the step; attention stays on the CPU over the host cache)
 * when the batch is large enough for that to win. false: not done (too
 * few tokens, offload off, or a device error), the caller runs the layer;
 * c->x is then unchanged. */
bool fwd_gpu_offload_layer(lms_ctx *c, int il, const lms_batch *b);
/* Whether the output head is on the GPU, and logits of n normed rows
 * (cap: with gemma2's final soft-capping; false leaves it to the caller,
 * which adds the adapters' head deltas first). */
bool fwd_gpu_has_output(const lms_ctx *c);
/* The adapter of the last step's LMS_ERR_ADAPTER, or NULL. */
const lms_lora *fwd_gpu_lora_failed(const lms_ctx *c);
int fwd_gpu_output(lms_ctx *c, const float *xn, int32_t n, float *logits, bool cap);
#endif

#endif
