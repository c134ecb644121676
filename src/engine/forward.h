/*
 * forward.h - the transformer forward pass over a batch of tokens that may
 * belong to different sequences, reading and writing the paged K/V cache.
 *
 * A batch lists, for each token, its id, its position and its sequence;
 * the caller has reserved cache blocks up to pos+1 for every sequence.
 * Tokens of one sequence must appear in increasing position order, and all
 * positions before a token's position must already be in the cache or
 * earlier in the same batch.
 */
#ifndef LMS_FORWARD_H
#define LMS_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kv_cache.h"
#include "model/lora.h"
#include "model/model.h"

typedef struct lms_ctx_params {
    int32_t n_ctx;     /* max positions of one sequence */
    int32_t n_batch;   /* max tokens per lms_forward call */
    int32_t n_seq;     /* sequences the KV pool is sized for */
    int32_t n_threads; /* compute threads (0 = all cores) */
    int32_t kv_blocks; /* KV pool size in blocks; 0 = n_seq full contexts */
    int kv_type;       /* cache type: 0 or LMS_TYPE_F16 (default), LMS_TYPE_Q8_0, LMS_TYPE_Q4_0 */
    /* GPU placement (CUDA builds; see forward_int.h). The first gpu_layers
     * layers and their K/V go to the GPU, the rest stay on the CPU. */
    int32_t gpu_layers;     /* 0 = CPU only, N, or LMS_GPU_LAYERS_AUTO / _ALL */
    int32_t vram_margin_mb; /* free VRAM left untouched; 0 = default (500) */
    int32_t vram_budget_mb; /* treat the card as having this much free; 0 = as is */
} lms_ctx_params;

#define LMS_GPU_LAYERS_AUTO (-1) /* as many layers as fit in free VRAM */
#define LMS_GPU_LAYERS_ALL (-2)  /* every layer; fails at load if they do not fit */
#define LMS_VRAM_MARGIN_MB_DEFAULT 500

/* Where a context put the model: filled when a context uses the GPU. */
typedef struct lms_gpu_plan {
    char device[96];
    int32_t n_layer;         /* layers of the model */
    int32_t n_layer_gpu;     /* of which on the GPU: [0, n_layer_gpu) */
    bool output_gpu;         /* output head on the GPU */
    size_t free_bytes;       /* free VRAM seen (after --vram-budget-mb) */
    size_t usable_bytes;     /* free minus the margin */
    size_t weights_bytes;    /* planned: layer weights (+ head) on the GPU */
    size_t kv_bytes;         /* planned: K/V blocks of the GPU layers */
    size_t scratch_bytes;    /* planned: activations, matmul and attention scratch */
    size_t offload_bytes;    /* planned: staging for the CPU layers' prompt products
                              * (0: no prompt offload) */
    size_t allocated_bytes;  /* actually allocated on the device */
} lms_gpu_plan;

typedef struct lms_batch {
    int32_t n_tokens;
    const int32_t *tokens;   /* [n_tokens] */
    const int32_t *pos;      /* [n_tokens] */
    lms_kv_seq *const *seq;  /* [n_tokens] sequence of each token */
    const bool *logits;      /* [n_tokens] which rows want logits; NULL: last only */
    const bool *embd;        /* [n_tokens] rows that want only the hidden state, or NULL */
    /* [n_tokens] each token's LoRA adapters (NULL or an empty set: none),
     * or NULL when no token has any. Each set names an adapter at most
     * once (lms_lora_set_make sees to it) and every adapter was checked
     * against the model (lms_lora_check). GPU layers apply them too
     * (forward_cuda.c; such a step runs without a CUDA graph). */
    const lms_lora_set *const *lora;
} lms_batch;

/* Execution state for one model: KV pool and scratch buffers.
 * Owner: one thread at a time (the model's scheduler, or the CLI). */
typedef struct lms_ctx lms_ctx;

int lms_ctx_create(const lms_model *m, const lms_ctx_params *p, lms_ctx **out, char *err,
                   size_t errsz);
void lms_ctx_destroy(lms_ctx *c);
lms_kv_cache *lms_ctx_kv(lms_ctx *c);
const lms_ctx_params *lms_ctx_params_of(const lms_ctx *c);
const lms_model *lms_ctx_model(const lms_ctx *c);

/* Runs the batch. Writes n_vocab logits for each row that wants them, in
 * batch order, to `logits` (may be NULL when no row wants any). Also
 * advances each sequence's n_pos past its largest position. */
int lms_forward(lms_ctx *c, const lms_batch *b, float *logits);

/* Host memory for the logits of lms_forward: page-locked when the
 * context runs layers on a GPU, so that a step's logits arrive there
 * straight from the device (no copy on the host; 4 MB a step for 8 rows of
 * Llama 3's vocabulary), plain otherwise. Freed with lms_host_free, which
 * does not need the context (it may be gone). NULL when out of memory. */
void *lms_ctx_host_alloc(const lms_ctx *c, size_t bytes);
void lms_host_free(void *p);

/* After lms_forward returned LMS_ERR_ADAPTER: the adapter that found no
 * room on the device (the step ran nothing; requests without it may run
 * again), else NULL. */
const lms_lora *lms_ctx_lora_failed(const lms_ctx *c);

/* The GPU placement of a context, or NULL when it runs on the CPU only. */
const lms_gpu_plan *lms_ctx_gpu_plan(const lms_ctx *c);
/* One line describing a plan ("gpu: NAME, 32/32 layers + output, ..."). */
void lms_gpu_plan_format(const lms_gpu_plan *p, char *buf, size_t n);

/* Final-normed hidden states of the last forward's rows that wanted logits
 * or embeddings, in batch order ([n][n_embd]); valid until the next call. */
const float *lms_ctx_hidden(const lms_ctx *c);

#endif
