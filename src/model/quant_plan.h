/*
 * quant_plan.h - which type each tensor gets when a model is quantized to
 * a named type or mix (Q4_K_M, ...), and the conversion of one tensor.
 *
 * Shared by `lmserv quantize` (from a file) and `lmserv synth` (from
 * generated weights).
 */
#ifndef LMS_QUANT_PLAN_H
#define LMS_QUANT_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct lms_quant_plan {
    const char *name;   /* as users write it: "Q4_K_M" */
    int base;           /* type of most matrices */
    int more;           /* type of the output head and "more bits" tensors, -1: base */
    bool mix;           /* attn_v / ffn_down of some layers get `more` */
    int ftype;          /* general.file_type, llama.cpp's numbering */
} lms_quant_plan;

/* Plan by name (case-insensitive), NULL if unknown. */
const lms_quant_plan *lms_quant_plan_find(const char *name);
/* Space-separated names of all plans (static string). */
const char *lms_quant_plan_names(void);

/* Type for a tensor: name, its row length ne0, n_dims, the model's layer
 * count, and whether the model has a separate output.weight. */
int lms_quant_pick(const lms_quant_plan *p, const char *name, int n_dims, int64_t ne0, int n_layer,
                   bool has_output);

/* Quantization error totals, by output type. */
typedef struct lms_quant_err {
    double se[40], ss[40]; /* sum of squared error, sum of squares */
    int64_t n[40];
} lms_quant_err;

/* Converts n_rows rows of ne0 floats to `type` (rows in parallel); adds
 * the round-trip error to err when err is not NULL. Returns a malloc'd
 * buffer of *n_bytes, or NULL. */
void *lms_quant_rows(const float *x, int64_t ne0, int64_t n_rows, int type, size_t *n_bytes,
                     lms_quant_err *err);

#endif
