/*
 * lora.h - LoRA adapters read from GGUF (as llama.cpp's
 * convert_lora_to_gguf.py writes them), checked against a base model and
 * kept as f32 for the forward pass, which applies them per token:
 *
 *   y = W x + scale * B (A x),   scale = user_scale * alpha / rank
 *                                (user_scale alone when alpha is 0 or absent)
 *
 * File facts relied on:
 *
 *   key / tensor                 meaning
 *   ---------------------------  ----------------------------------------------
 *   general.type = "adapter"     required
 *   general.architecture         must equal the base model's
 *   adapter.type = "lora"        required
 *   adapter.lora.alpha (f32)     optional; 0 or absent: scale = user_scale
 *   <W>.lora_a                   ne = [n_in, rank]   (rank rows of n_in)
 *   <W>.lora_b                   ne = [rank, n_out]  (n_out rows of rank)
 *   token_embd.weight.lora_a     ne = [rank, n_vocab] (transposed: a row per token)
 *   token_embd.weight.lora_b     ne = [rank, n_embd]
 *   *_norm.weight                ignored (llama.cpp ignores them too)
 *   adapter.alora.invocation_tokens  refused: activated LoRA is not supported
 *
 * where <W> is a base weight's tensor name (blk.N.attn_q.weight, ...,
 * output.weight), W has ne = [n_in, n_out], and the rank is lora_b's ne[0].
 * Tensor types: any with a dequantizer (F32, F16, BF16, Q8_0, ...);
 * everything is converted to f32 at load (adapters are small).
 *
 * PEFT adapters (Hugging Face) are read directly: a directory holding
 * adapter_model.safetensors and adapter_config.json, or the .safetensors
 * file with adapter_config.json beside it. They are mapped to the GGUF
 * names and layout above, as llama.cpp's convert_lora_to_gguf.py would:
 *
 *   PEFT (HF row-major shapes)                        GGUF equivalent
 *   ------------------------------------------------  -------------------------
 *   base_model.model.model.layers.N.self_attn.        blk.N.attn_{q,k,v,output}
 *     {q,k,v,o}_proj.lora_A.weight [r, n_in]            .weight.lora_a (same bytes)
 *     ...lora_B.weight [n_out, r]                       .lora_b (q, k: rows permuted*)
 *   ...layers.N.mlp.{gate,up,down}_proj.lora_A/B      blk.N.ffn_{gate,up,down}.weight
 *   base_model.model.lm_head.lora_A/B.weight          output.weight (untied only)
 *   base_model.model.model.embed_tokens.              token_embd.weight.lora_a
 *     lora_embedding_A [r, n_vocab]                     (transposed: [n_vocab][r])
 *     lora_embedding_B [n_embd, r]                      .lora_b (same bytes)
 *   adapter_config.json lora_alpha                    adapter.lora.alpha
 *
 *   * for models whose RoPE rotates adjacent pairs (llama, mistral), the
 *     converter stores attn_q/attn_k rows per head in the order
 *     (i, half) instead of HF's (half, i); lora_b gets the same order.
 *
 * adapter_config.json: r (must equal every tensor's rank), lora_alpha > 0
 * (scale alpha / r), use_rslora (scale alpha / sqrt(r), kept as alpha' =
 * alpha sqrt(r)), target_modules (a list of the module names above, or
 * "all-linear"; each tensor's module must be listed). Refused: peft_type
 * other than LORA, fan_in_fan_out, use_dora, non-empty rank_pattern,
 * alpha_pattern or modules_to_save, target_modules as a regex. Tensor
 * dtypes F32, F16, BF16.
 *
 * Lifetime: an adapter is reference counted. lms_lora_load returns it with
 * one reference (the caller's); the scheduler takes one per sequence that
 * uses it, so an adapter "unloaded" (released by its owner) while requests
 * still run stays alive until they finish. Retain and release may be
 * called from any thread; the adapter is immutable after load.
 */
#ifndef LMS_LORA_H
#define LMS_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct lms_lora lms_lora;

/* Adapters one sequence may use at once. */
#define LMS_LORA_MAX 4

/* One adapter applied with a user scale (the request field). */
typedef struct lms_lora_use {
    lms_lora *lora;  /* borrowed by the request; the scheduler retains it */
    float scale;     /* user scale (1 = as trained; 0 = no effect) */
} lms_lora_use;

/* The adapters of one sequence, in a canonical order (see
 * lms_lora_set_make); n = 0 means none. */
typedef struct lms_lora_set {
    int32_t n;
    lms_lora_use use[LMS_LORA_MAX];
    uint64_t id;     /* lms_lora_set_id of it, 0 when n = 0 */
} lms_lora_set;

/* ---- loading and lifetime -------------------------------------------------- */

/* Reads the adapter at path (a GGUF file, or a PEFT adapter: a directory,
 * or a .safetensors file with adapter_config.json beside it) and checks
 * it against base (architecture,
 * every pair names a weight of base, shapes, ranks, types). On failure
 * returns < 0 with a message naming the file and the tensor or key, and
 * leaves *out untouched. base is only read during the call. */
int lms_lora_load(const char *path, const lms_model *base, lms_lora **out, char *err,
                  size_t errsz);
/* Same, from a caller's buffer holding a GGUF file (tests, fuzzing); name
 * is used in messages and as the adapter's name. */
int lms_lora_load_mem(const void *buf, size_t n, const char *name, const lms_model *base,
                      lms_lora **out, char *err, size_t errsz);
/* Takes one more reference; returns l. */
lms_lora *lms_lora_retain(lms_lora *l);
/* Drops one reference; the last one frees the adapter. NULL is a no-op. */
void lms_lora_release(lms_lora *l);

/* ---- getters ------------------------------------------------------------------- */

/* 64-bit content id (never 0): a hash of the adapter's values, alpha and
 * targets, so the same file loaded twice has the same id (and shares
 * prefix-cache blocks) while different adapters never do. */
uint64_t lms_lora_id(const lms_lora *l);
const char *lms_lora_name(const lms_lora *l);  /* general.name, else the file's base name */
const char *lms_lora_path(const lms_lora *l);  /* as given to lms_lora_load ("" from memory) */
int32_t lms_lora_rank(const lms_lora *l);      /* largest rank of its pairs */
float lms_lora_alpha(const lms_lora *l);       /* adapter.lora.alpha (0 when absent) */
int32_t lms_lora_n_tensors(const lms_lora *l); /* weight pairs (A, B) */
size_t lms_lora_bytes(const lms_lora *l);      /* memory of its f32 values */

/* Whether l fits model m (architecture and every pair's shape): 0, or
 * LMS_ERR_INVAL with a message. For a scheduler checking a request. */
int lms_lora_check(const lms_lora *l, const lms_model *m, char *err, size_t errsz);

/* ---- sets ------------------------------------------------------------------------ */

/* Builds a sequence's set from n uses (n <= LMS_LORA_MAX, each lora not
 * NULL, scale finite): uses with scale 0 are dropped (they change
 * nothing), the rest sorted by (id, scale) so that equal sets compute the
 * same way, and id set. Takes no references. LMS_ERR_INVAL with a message
 * on a bad list. */
int lms_lora_set_make(lms_lora_set *s, const lms_lora_use *uses, int n, char *err, size_t errsz);
/* 64-bit id of a set's (adapter, scale) pairs for the prefix cache: 0 for
 * the empty set (the base model), never 0 otherwise. */
uint64_t lms_lora_set_id(const lms_lora_set *s);

/* ---- for the forward pass ---------------------------------------------------------- */

/* Matrices an adapter may target in each layer. */
enum lms_lora_target {
    LMS_LORA_Q = 0,
    LMS_LORA_K,
    LMS_LORA_V,
    LMS_LORA_O,
    LMS_LORA_GATE,
    LMS_LORA_UP,
    LMS_LORA_DOWN,
    LMS_LORA_N_TARGETS
};

/* One weight's pair, as f32. */
typedef struct lms_lora_pair {
    int32_t rank;
    int64_t n_in, n_out; /* of the base weight (token_embd: n_vocab rows in, n_embd out) */
    float factor;        /* alpha / rank, or 1 when alpha is 0 */
    float *a;            /* [rank][n_in]; token_embd: [n_vocab][rank] */
    float *bt;           /* [rank][n_out]: B transposed, so B·t is a sum of rows */
    /* The types llama.cpp rounds the product's input to (the file types'
     * companion vec_dot types, kernels.h): x before A (a_vt), A·x before B
     * (b_vt); LMS_TYPE_F32 = no rounding (f32 tensors). */
    int a_vt, b_vt;
} lms_lora_pair;

/* The pair for weight `target` of layer il, for token_embd.weight, for
 * output.weight; NULL when the adapter does not touch it. */
const lms_lora_pair *lms_lora_layer_pair(const lms_lora *l, int il, int target);
const lms_lora_pair *lms_lora_embd_pair(const lms_lora *l);
const lms_lora_pair *lms_lora_output_pair(const lms_lora *l);

/* Tensor-name stem of a layer target ("attn_q", ..., "ffn_down"). */
const char *lms_lora_target_name(int target);

#endif
