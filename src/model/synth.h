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
    const char *arch;     /* "llama", "qwen3" */
    int32_t n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    float rope_base, rms_eps;
    int tied;             /* output head tied to token_embd */
    int llama3_rope;      /* write Llama 3 rope frequency factors */
} lms_synth_shape;

/* Shape by name, NULL if unknown. */
const lms_synth_shape *lms_synth_find(const char *name);
/* Space-separated names (static string). */
const char *lms_synth_names(void);

/* Writes the model with weights of the quantization plan `type` (a
 * quant_plan name such as "Q4_K_M"). Returns < 0 with a message. */
int lms_synth_write(const lms_synth_shape *s, const char *type, uint64_t seed, const char *path,
                    char *err, size_t errsz);

#endif
