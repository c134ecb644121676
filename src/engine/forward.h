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
#include "model/model.h"

typedef struct lms_ctx_params {
    int32_t n_ctx;     /* max positions of one sequence */
    int32_t n_batch;   /* max tokens per lms_forward call */
    int32_t n_seq;     /* sequences the KV pool is sized for */
    int32_t n_threads; /* compute threads (0 = all cores) */
    int32_t kv_blocks; /* KV pool size in blocks; 0 = n_seq full contexts */
} lms_ctx_params;

typedef struct lms_batch {
    int32_t n_tokens;
    const int32_t *tokens;   /* [n_tokens] */
    const int32_t *pos;      /* [n_tokens] */
    lms_kv_seq *const *seq;  /* [n_tokens] sequence of each token */
    const bool *logits;      /* [n_tokens] which rows want logits; NULL: last only */
    const bool *embd;        /* [n_tokens] rows that want only the hidden state, or NULL */
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

/* Final-normed hidden states of the last forward's rows that wanted logits
 * or embeddings, in batch order ([n][n_embd]); valid until the next call. */
const float *lms_ctx_hidden(const lms_ctx *c);

#endif
