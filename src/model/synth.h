/*
 * synth.h - writes models of real architectures' exact shapes with seeded
 * random weights (for benchmarks, tests and the out-of-the-box default),
 * loadable by lmserv and by llama.cpp.
 */
#ifndef LMS_SYNTH_H
#define LMS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

typedef struct lms_synth_shape {
    const char *name;     /* "llama-3.2-1b", ... */
    const char *arch;     /* "llama", "qwen3", ... (phi3: fused attn_qkv and gate+up ffn_up) */
    int32_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    float rope_base, rms_eps;
    int tied;             /* output head tied to token_embd */
    int llama3_rope;      /* write Llama 3 rope frequency factors */
} lms_synth_shape;

/* A shape's family extras (gemma2 / gemma3 / phi3; zeros for the others). */
typedef struct lms_synth_extra {
    int32_t n_swa;        /* attention.sliding_window; 0: key not written */
    float attn_softcap;   /* attn_logit_softcapping (gemma2); 0: not written */
    float final_softcap;  /* final_logit_softcapping; 0: not written */
    /* 0: matrices N(0, 0.02^2), norm weights 1; else matrices N(0, w_sd^2) and
     * norm weights 1 + N(0, 0.1^2) (tiny test models with visible signal) */
    float w_sd;
} lms_synth_extra;

/* Shape by name, NULL if unknown. */
const lms_synth_shape *lms_synth_find(const char *name);
/* Space-separated names (static string). */
const char *lms_synth_names(void);

/* Writes the model with weights of the quantization plan `type` (a
 * quant_plan name such as "Q4_K_M"). Returns < 0 with a message. */
int lms_synth_write(const lms_synth_shape *s, const char *type, uint64_t seed, const char *path,
                    char *err, size_t errsz);
/* The same with explicit extras (NULL: those of a shape from the table,
 * none for any other shape). */
int lms_synth_write_ex(const lms_synth_shape *s, const lms_synth_extra *x, const char *type,
                       uint64_t seed, const char *path, char *err, size_t errsz);

/* ---- random LoRA adapters -----------------------------------------------------
 *
 * A GGUF LoRA adapter (lora.h's format, loadable by llama.cpp's --lora) for
 * the model at model_path: for each targeted weight W [n_in, n_out], A
 * with N(0, 1/n_in) values and B with values sized so that at user scale 1
 * the delta's RMS is `strength` times the RMS of W x (x of unit RMS); W's
 * RMS is measured on a sample of its rows. */
typedef struct lms_synth_lora_params {
    int32_t rank;        /* >= 1 */
    float alpha;         /* adapter.lora.alpha; 0 writes none (scale = user scale) */
    const char *targets; /* comma-separated among attn_q, attn_k, attn_v, attn_output,
                          * ffn_gate, ffn_up, ffn_down, output, token_embd; NULL or "":
                          * the seven layer matrices */
    const char *type;    /* "f32" (NULL), "f16", "bf16" or "q8_0" (tensors whose rows q8_0
                          * cannot hold are written as f16) */
    float strength;      /* 0: 0.5 */
    uint64_t seed;
} lms_synth_lora_params;

int lms_synth_lora_write(const char *model_path, const lms_synth_lora_params *p, const char *path,
                         char *err, size_t errsz);

#endif
