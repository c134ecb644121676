/*
 * quant_plan.c - per-tensor type choice for quantization mixes, and row
 * conversion with error accounting (see quant_plan.h).
 *
 *   Q4_K_M / Q5_K_M  base type everywhere, Q6_K for the output head (or the
 *                    tied embedding) and for attn_v and ffn_down of the
 *                    layers use_more_bits() selects (first and last eighth,
 *                    and every third in between), as llama.cpp's mixes do.
 *
 *   IQ4_NL / IQ4_XS  base type for every matrix, Q6_K for the output head
 *                    (or the tied embedding), as llama.cpp's head rule; no
 *                    per-layer mix (llama.cpp's IQ4 mixes raise attn_v and
 *                    early ffn_down by model shape: not reproduced).
 *
 * A row length that the chosen block size cannot divide falls back to
 * Q5_0 / Q5_1 / Q8_0 (for Q4_K / Q5_K / Q6_K), IQ4_NL (for IQ4_XS: the same
 * values on 32-element blocks, 4.5 bits a weight instead of 4.25, as
 * llama.cpp does) or, failing that, F16.
 */
#include "model/quant_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/kernels.h"
#include "kernels/quantize_weights.h"

static const lms_quant_plan plans[] = {
    {"F32", LMS_TYPE_F32, -1, false, 0},
    {"F16", LMS_TYPE_F16, -1, false, 1},
    {"BF16", LMS_TYPE_BF16, -1, false, 32},
    {"Q8_0", LMS_TYPE_Q8_0, -1, false, 7},
    {"Q4_0", LMS_TYPE_Q4_0, LMS_TYPE_Q6_K, false, 2},
    {"Q4_1", LMS_TYPE_Q4_1, LMS_TYPE_Q6_K, false, 3},
    {"Q5_0", LMS_TYPE_Q5_0, LMS_TYPE_Q6_K, false, 8},
    {"Q5_1", LMS_TYPE_Q5_1, LMS_TYPE_Q6_K, false, 9},
    {"Q2_K", LMS_TYPE_Q2_K, LMS_TYPE_Q4_K, false, 10},
    {"Q3_K", LMS_TYPE_Q3_K, LMS_TYPE_Q5_K, false, 12},
    {"Q3_K_M", LMS_TYPE_Q3_K, LMS_TYPE_Q5_K, true, 12},
    {"Q4_K", LMS_TYPE_Q4_K, LMS_TYPE_Q6_K, false, 14},
    {"Q4_K_S", LMS_TYPE_Q4_K, LMS_TYPE_Q6_K, false, 14},
    {"Q4_K_M", LMS_TYPE_Q4_K, LMS_TYPE_Q6_K, true, 15},
    {"Q5_K", LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, false, 16},
    {"Q5_K_S", LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, false, 16},
    {"Q5_K_M", LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, true, 17},
    {"Q6_K", LMS_TYPE_Q6_K, -1, false, 18},
    {"IQ4_NL", LMS_TYPE_IQ4_NL, LMS_TYPE_Q6_K, false, 25},
    {"IQ4_XS", LMS_TYPE_IQ4_XS, LMS_TYPE_Q6_K, false, 30},
};

const lms_quant_plan *lms_quant_plan_find(const char *name)
{
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++)
        if (!strcasecmp(name, plans[i].name))
            return &plans[i];
    return NULL;
}

const char *lms_quant_plan_names(void)
{
    return "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q3_K_M Q4_K Q4_K_S Q4_K_M Q5_K Q5_K_S "
           "Q5_K_M Q6_K IQ4_NL IQ4_XS";
}

static bool use_more_bits(int il, int n_layer)
{
    return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

static int fallback(int type, int64_t ne0)
{
    if (ne0 % lms_type_get(type)->blck_size == 0)
        return type;
    int alt = type == LMS_TYPE_Q6_K                           ? LMS_TYPE_Q8_0
              : type == LMS_TYPE_Q5_K                         ? LMS_TYPE_Q5_1
              : type == LMS_TYPE_Q4_K                         ? LMS_TYPE_Q5_0
              : type == LMS_TYPE_Q2_K || type == LMS_TYPE_Q3_K ? LMS_TYPE_Q4_0
              : type == LMS_TYPE_IQ4_XS                       ? LMS_TYPE_IQ4_NL
                                                              : LMS_TYPE_F16;
    return ne0 % lms_type_get(alt)->blck_size == 0 ? alt : LMS_TYPE_F16;
}

int lms_quant_pick(const lms_quant_plan *p, const char *name, int n_dims, int64_t ne0, int n_layer,
                   bool has_output)
{
    if (n_dims < 2)
        return LMS_TYPE_F32; /* norms and biases stay exact */
    if (!strcmp(name, "position_embd.weight") || !strcmp(name, "token_types.weight"))
        return LMS_TYPE_F32; /* bert: added as they are (llama.cpp never quantizes them) */
    bool head = !strcmp(name, "output.weight") ||
                (!has_output && !strcmp(name, "token_embd.weight"));
    int il = -1, type = p->base;
    if (sscanf(name, "blk.%d.", &il) != 1)
        il = -1;
    if (head && p->more >= 0)
        type = LMS_TYPE_Q6_K;
    else if (p->mix && il >= 0 && (strstr(name, "attn_v.weight") || strstr(name, "ffn_down.weight")) &&
             use_more_bits(il, n_layer))
        type = p->more;
    return fallback(type, ne0);
}

void *lms_quant_rows(const float *x, int64_t ne0, int64_t n_rows, int type, size_t *n_bytes,
                     lms_quant_err *err)
{
    const lms_kernel_table *k = lms_kernels_ref();
    size_t row = lms_row_size(type, ne0);
    uint8_t *out = row ? malloc(row * (size_t)n_rows) : NULL;
    if (!out || (type != LMS_TYPE_F32 && (!lms_quantize_supported(type) || !k->to_float[type]))) {
        free(out);
        return NULL;
    }
    double se = 0, ss = 0;
#pragma omp parallel for reduction(+ : se, ss) schedule(dynamic, 16)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *src = x + r * ne0;
        uint8_t *dst = out + (size_t)r * row;
        if (type == LMS_TYPE_F32) {
            memcpy(dst, src, row);
            continue;
        }
        lms_quantize_row(type, src, dst, ne0);
        if (!err)
            continue;
        float *back = malloc((size_t)ne0 * sizeof *back);
        if (!back)
            continue;
        k->to_float[type](dst, back, ne0);
        for (int64_t i = 0; i < ne0; i++) {
            double d = (double)back[i] - src[i];
            se += d * d;
            ss += (double)src[i] * src[i];
        }
        free(back);
    }
    if (err && type < 40) {
        err->se[type] += se;
        err->ss[type] += ss;
        err->n[type] += ne0 * n_rows;
    }
    *n_bytes = row * (size_t)n_rows;
    return out;
}
