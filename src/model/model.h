/*
 * model.h - a transformer model loaded from GGUF: hyper-parameters, weight
 * views into the mapped file, tokenizer.
 *
 * Architectures are rows of a table (model.c: arch_table) naming the rope
 * style and which optional tensors a family has; the loader resolves every
 * tensor by name and checks its shape against the hyper-parameters, so the
 * forward pass never meets a surprise.
 */
#ifndef LMS_MODEL_H
#define LMS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct lms_tokenizer lms_tokenizer; /* model/tokenizer.h */

enum lms_rope_type {
    LMS_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): llama */
    LMS_ROPE_NEOX = 2, /* rotate halves (x[i], x[i+d/2]): qwen2, qwen3, gemma2, gemma3, phi3 */
};

/* The gated FFN's activation: act(gate) * up. */
enum lms_ffn_act {
    LMS_FFN_SILU = 0,      /* SwiGLU: llama, qwen */
    LMS_FFN_GELU_TANH = 1, /* GeGLU, tanh approximation: gemma2, gemma3 */
};

/* A weight matrix or vector, used in place from the mapping.
 * ne[0] = input (fastest) dimension, ne[1] = output rows. It may be a range
 * of rows of a larger tensor (phi3's fused attn_qkv and gate+up): rows are
 * whole quantization blocks, so a row range is itself a matrix. */
typedef struct lms_weight {
    const void *data; /* NULL when the tensor is absent (optional parts) */
    int type;         /* enum lms_type */
    int64_t ne[2];
    size_t row_bytes;
} lms_weight;

typedef struct lms_layer {
    lms_weight attn_norm;          /* [n_embd] f32 */
    lms_weight wq, wk, wv, wo;     /* [n_embd, n_head*hd], [n_embd, n_kv*hd] x2, [n_head*hd, n_embd] */
    lms_weight bq, bk, bv;         /* optional biases (qwen2) */
    lms_weight q_norm, k_norm;     /* optional per-head RMSNorm [hd] (qwen3) */
    lms_weight attn_post_norm;     /* optional [n_embd]: RMSNorm of the attention output (gemma) */
    lms_weight ffn_norm;           /* [n_embd] */
    lms_weight w_gate, w_up;       /* [n_embd, n_ff] */
    lms_weight w_down;             /* [n_ff, n_embd] */
    lms_weight ffn_post_norm;      /* optional [n_embd]: RMSNorm of the FFN output (gemma) */
    /* bert (post-norm encoder): attn_norm / ffn_norm hold the LayerNorms
     * after the attention and FFN residual sums (attn_output_norm,
     * layer_output_norm); these are their biases and the linear biases */
    lms_weight attn_norm_b, ffn_norm_b; /* [n_embd] */
    lms_weight bo;                 /* optional [n_embd] */
    lms_weight b_up;               /* optional [n_ff] */
    lms_weight b_down;             /* optional [n_embd] */
    /* attention of this layer */
    int32_t n_swa;                 /* sliding window: a query at p sees keys (p - n_swa, p];
                                    * 0 = every earlier position */
    float rope_base;               /* RoPE frequency base of this layer */
    float rope_freq_scale;         /* and its 1 / linear scaling factor */
} lms_layer;

typedef struct lms_hparams {
    char arch[32];
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;      /* key/value length per head */
    int32_t n_ff;
    int32_t n_ctx_train;
    int32_t n_rot;         /* rotated dimensions per head */
    int rope_type;         /* enum lms_rope_type */
    float rope_base;
    float rope_freq_scale; /* 1 / linear scaling factor */
    float rms_eps;
    /* family specifics; the defaults (zero) are the llama / qwen behaviour */
    int ffn_act;           /* enum lms_ffn_act */
    float embd_scale;      /* token embeddings are multiplied by this; 0 = not scaled */
    float q_scale;         /* 0: scores scaled by 1/sqrt(head_dim); else queries are
                            * multiplied by this after RoPE and scores are not scaled */
    float attn_softcap;    /* 0 = none; else scores = cap * tanh(scores / cap) */
    float final_softcap;   /* 0 = none; else logits = cap * tanh(logits / cap) */
    /* LongRoPE (phi3 128k): lms_model_rope_factors picks the frequency
     * factors by context length; cos and sin are multiplied by this (0 = 1) */
    float rope_attn_factor;
    int32_t n_ctx_orig;    /* contexts longer than this take the long factors */
    /* encoders (bert): no output head, bidirectional attention over at most
     * n_ctx_train tokens, LayerNorm with this epsilon, one pooled vector */
    bool is_encoder;
    int pooling;           /* enum lms_pooling_type: the file's pooling_type (0: a decoder
                            * without one, a plain language model) */
    bool encoder_rope;     /* nomic-bert: RoPE of q, k instead of position_embd */
    float norm_eps;
    int32_t n_cls_out;     /* rank pooling: the head's outputs (scores), <= n_embd */
} lms_hparams;

/* GGUF's <arch>.pooling_type values (the ones the encoder computes). */
enum lms_pooling_type {
    LMS_POOLING_MEAN = 1, /* mean of every token's final state */
    LMS_POOLING_CLS = 2,  /* the first token's ([CLS]) */
    LMS_POOLING_LAST = 3, /* the last token's */
    LMS_POOLING_RANK = 4, /* a reranker: the [CLS] state (a decoder's: the last token's)
                           * through the classification head */
};

/* A pooling_type's name ("mean", "cls", "last", "rank"; "none" for any
 * other value), and the value of such a name (0 for any other). */
const char *lms_pooling_name(int pooling);
int lms_pooling_parse(const char *name);

typedef struct lms_model {
    gguf_file *gguf;        /* owns the mapping the weights point into */
    lms_hparams hp;
    char name[128];         /* general.name or the file's base name */
    lms_weight tok_embd;    /* [n_embd, n_vocab] */
    lms_weight output_norm; /* [n_embd]; absent (data NULL) in encoders */
    lms_weight output;      /* [n_embd, n_vocab]; = tok_embd when tied; absent in encoders */
    lms_weight rope_freqs;  /* optional [n_rot/2] f32 (Llama 3 frequency factors) */
    lms_weight rope_long;   /* optional [n_rot/2] f32 LongRoPE factors (phi3), both */
    lms_weight rope_short;  /* or neither */
    /* bert: learned absolute positions [n_embd, n_ctx_train], token type 0's
     * row (optional; token types are always 0), the embeddings' LayerNorm */
    lms_weight pos_embd, type_embd, tok_norm, tok_norm_b;
    /* rerankers (rank pooling): [CLS] -> tanh(cls x + cls_b) -> cls_out . + cls_out_b;
     * either matrix may be absent (then that step is skipped) */
    lms_weight cls, cls_b, cls_out, cls_out_b;
    lms_layer *layers;      /* [n_layer] */
    lms_tokenizer *tok;
    size_t weight_bytes;    /* bytes of every tensor the forward pass reads */
} lms_model;

/* Loads a model (weights and tokenizer). On failure returns < 0 with a
 * message naming the problem. */
int lms_model_load(const char *path, lms_model **out, char *err, size_t errsz);
void lms_model_free(lms_model *m);

/* The RoPE frequency factors (angles divided by them) for contexts of
 * n_ctx positions per sequence: rope_freqs if the file has it, else the
 * LongRoPE long factors when n_ctx > hp.n_ctx_orig and the short ones
 * otherwise, NULL when the model has none. */
const float *lms_model_rope_factors(const lms_model *m, int32_t n_ctx);

/* Bytes of the K/V cache for n_ctx tokens (f16 cells). */
size_t lms_model_kv_bytes(const lms_hparams *hp, int64_t n_ctx);

/* Names of the architectures the loader accepts, comma separated. */
const char *lms_model_supported_archs(void);

#endif
