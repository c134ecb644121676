/*
 * encoder.h - the forward pass of a BERT encoder (an embedding model): the
 * whole input at once, bidirectional attention computed directly (no K/V
 * cache), one pooled, unit-length vector out.
 *
 * Data flow (e = n_embd, n = tokens, post-norm layers):
 *
 *   x[n][e]  = LayerNorm(token_embd[id] + token_types[0] + position_embd[pos])
 *   per layer:
 *     q, k, v = Wq x + bq, Wk x + bk, Wv x + bv              [n][e]
 *     a       = softmax(q k^T / sqrt(head_dim)) v, per head, every key
 *     x       = LayerNorm(Wo a + bo + x)                     (attn_output_norm)
 *     x       = LayerNorm(Wdown gelu(Wup x + bup) + bdown + x) (layer_output_norm)
 *   pooled   = mean of x's rows, or x[0] (cls), or x[n-1] (last): the
 *              file's pooling_type; then divided by its L2 norm
 *   rank     = (rerankers) cls_out tanh(cls x[0] + cls_b) + cls_out_b
 *              (lms_rank_scores)
 *
 * GELU is the tanh approximation with the input and output rounded to f16,
 * as ggml's CPU path computes it (llama.cpp's bert uses that GELU).
 *
 * nomic-bert (hp.encoder_rope): no position_embd; q and k get NeoX RoPE at
 * positions 0..n-1 after their biases; the FFN is Wdown (silu(Wgate x) *
 * (Wup x + bup)) + bdown.
 */
#ifndef LMS_ENCODER_H
#define LMS_ENCODER_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

/* Scratch for inputs of up to the model's n_ctx_train tokens. Owner: one
 * thread at a time (the model's scheduler, or a test). */
typedef struct lms_encoder lms_encoder;

/* n_threads: compute threads (0 = all cores). Fails on a model that is not
 * an encoder (hp.is_encoder). */
int lms_encoder_create(const lms_model *m, int32_t n_threads, lms_encoder **out, char *err,
                       size_t errsz);
void lms_encoder_destroy(lms_encoder *e);

/* The most tokens one input may have (the model's context). */
int32_t lms_encoder_max_tokens(const lms_encoder *e);

/* Encodes tokens[0..n) (already with [CLS] ... [SEP]) into out[n_embd]:
 * pooled and of unit length (all zero if the pooled vector is zero); a
 * reranker (rank pooling) writes its hp.n_cls_out scores instead.
 * Errors (n out of range, a token id outside the vocabulary) are named in
 * err; out is untouched then. */
int lms_encode(lms_encoder *e, const int32_t *tokens, int32_t n, float *out, char *err,
               size_t errsz);

/* Encodes n_in inputs in one pass: tokens holds them one after another
 * (input k has lens[k] tokens), lens summing to at most the model's
 * context; each input attends to its own tokens, at positions from 0, and
 * gets what lms_encode gives it alone (up to the rounding of the weight
 * products over more rows). out: [n_in][lms_encoder_n_out]. */
int lms_encode_batch(lms_encoder *e, const int32_t *tokens, const int32_t *lens, int32_t n_in,
                     float *out, char *err, size_t errsz);

/* Values lms_encode writes per input: n_embd, or a reranker's n_cls_out. */
int32_t lms_encoder_n_out(const lms_encoder *e);

/* A reranker's scores (hp.n_cls_out of them) from one pooled state h
 * (n_embd floats: an encoder's [CLS] state, a decoder's last token's,
 * final-normed), as llama.cpp's rank pooling: tanh(cls h + cls_b) where the
 * file has cls, then cls_out . + cls_out_b where it has cls_out; a
 * decoder's (Qwen3-Reranker: the "yes" and "no" rows) then through a
 * softmax, so out[0] is the probability of the first label. t0, t1:
 * n_embd floats each; scratch: lms_rank_scratch bytes. */
size_t lms_rank_scratch(const lms_model *m);
void lms_rank_scores(const lms_model *m, const float *h, float *out, float *t0, float *t1,
                     void *scratch);

#endif
