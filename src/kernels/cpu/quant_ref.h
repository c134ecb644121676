/*
 * quant_ref.h - the scalar reference kernels (the `_ref` twin of every
 * kernel) and the block codecs they are built on.
 *
 * Central idea: each block format is decoded and encoded in exactly one
 * place (lms_unpack_* / lms_pack_*, in quant_ref.c). A decoded block is a
 * plain array of small signed integers plus integer sub-block scales; the
 * dequantizers and dot products are written once over that form, and the
 * weight quantizer (quantize_weights.c) writes codes in that form and packs
 * them. SIMD kernels are tested against these functions.
 *
 * Numerics are ggml's: dequantized values are computed with the same float
 * operations in the same order as ggml's dequantize_row_*; dot products
 * take exact int32 sums inside a block and scale them in float (F32, F16
 * and BF16 rows are accumulated in double instead: the reference is meant
 * to be the accurate answer; the SIMD twins use float lanes).
 *
 * Kernel names follow STYLE.md: <op>_<wtype>[_<xtype>]_ref. Rows are n
 * elements, n a multiple of the type's block size (asserted).
 */
#ifndef LMS_QUANT_REF_H
#define LMS_QUANT_REF_H

#include <stdint.h>

#include "kernels/qtypes.h"

/* Nearest integer to v, ties to even, clamped to [lo, hi] (|lo|, |hi| < 2^22);
 * NaN gives lo, as x86's convert-then-saturating-pack sequence does. Shared
 * by the activation and the weight quantizers. */
static inline int lms_round_clamp(float v, int lo, int hi)
{
    if (!(v > (float)lo))
        return lo;
    if (!(v < (float)hi))
        return hi;
    /* v + 1.5 * 2^23 has no fraction bits left, so the addition rounds v
     * to an integer in the default mode (half to even); inline, unlike
     * nearbyintf on baseline x86-64. */
    return (int)((v + 0x1.8p23f) - 0x1.8p23f);
}

/* ---- decoded blocks -------------------------------------------------------- */

/* One 32-element block of Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0:
 * element i = q[i] * d + m. */
typedef struct lms_lq_block {
    int8_t q[32]; /* codes with the format's offset removed: Q4_0 -8..7,
                     Q5_0 -16..15, Q4_1 0..15, Q5_1 0..31, Q8_0 -128..127;
                     IQ4_NL: the table values (lms_iq4_values), not indices */
    float d;      /* scale (an f16 value) */
    float m;      /* offset (an f16 value; 0 for Q4_0, Q5_0, Q8_0) */
} lms_lq_block;

/* One 256-element K-quant super-block: element e, in sub-block s = e / sub,
 * is (d * sc[s]) * q[e] - dmin * mn[s]. */
typedef struct lms_kq_block {
    int8_t q[LMS_QK_K]; /* codes, offset removed: Q2_K 0..3, Q3_K -4..3,
                           Q4_K 0..15, Q5_K 0..31, Q6_K -32..31; IQ4_XS: the
                           table values (lms_iq4_values), not indices */
    int16_t sc[16];     /* sub-block scale codes: Q2_K 0..15, Q3_K -32..31,
                           Q4_K/Q5_K 0..63, Q6_K -128..127, IQ4_XS -32..31
                           (stored + 32) */
    int16_t mn[16];     /* sub-block min codes (Q2_K 0..15, Q4_K/Q5_K 0..63;
                           0 for Q3_K, Q6_K and IQ4_XS) */
    int sub;            /* sub-block width: 16 (Q2_K Q3_K Q6_K) or 32 */
    float d;            /* super-block scale (an f16 value) */
    float dmin;         /* super-block min scale (an f16 value, or 0) */
} lms_kq_block;

void lms_unpack_q4_0(const void *blk, lms_lq_block *out);
void lms_unpack_q4_1(const void *blk, lms_lq_block *out);
void lms_unpack_q5_0(const void *blk, lms_lq_block *out);
void lms_unpack_q5_1(const void *blk, lms_lq_block *out);
void lms_unpack_q8_0(const void *blk, lms_lq_block *out);
void lms_unpack_q2_K(const void *blk, lms_kq_block *out);
void lms_unpack_q3_K(const void *blk, lms_kq_block *out);
void lms_unpack_q4_K(const void *blk, lms_kq_block *out);
void lms_unpack_q5_K(const void *blk, lms_kq_block *out);
void lms_unpack_q6_K(const void *blk, lms_kq_block *out);
void lms_unpack_iq4_nl(const void *blk, lms_lq_block *out);
void lms_unpack_iq4_xs(const void *blk, lms_kq_block *out);

/* The values of the IQ4 indices (LMS_IQ4_VALUES), and the index of a value
 * (-1 for a value not in the table). */
extern const int8_t lms_iq4_values[16];
int lms_iq4_index(int value);

/* Inverses of the above. Codes must be in the ranges listed; d, m and dmin
 * are rounded to f16 (they should already be f16 values). `sub` is ignored. */
void lms_pack_q4_0(const lms_lq_block *in, void *blk);
void lms_pack_q4_1(const lms_lq_block *in, void *blk);
void lms_pack_q5_0(const lms_lq_block *in, void *blk);
void lms_pack_q5_1(const lms_lq_block *in, void *blk);
void lms_pack_q8_0(const lms_lq_block *in, void *blk);
void lms_pack_q2_K(const lms_kq_block *in, void *blk);
void lms_pack_q3_K(const lms_kq_block *in, void *blk);
void lms_pack_q4_K(const lms_kq_block *in, void *blk);
void lms_pack_q5_K(const lms_kq_block *in, void *blk);
void lms_pack_q6_K(const lms_kq_block *in, void *blk);
void lms_pack_iq4_nl(const lms_lq_block *in, void *blk); /* q: table values */
void lms_pack_iq4_xs(const lms_kq_block *in, void *blk); /* q: table values */

/* ---- to_float: dequantize n elements ----------------------------------------- */

void lms_to_float_f32_ref(const void *x, float *y, int64_t n);
void lms_to_float_f16_ref(const void *x, float *y, int64_t n);
void lms_to_float_bf16_ref(const void *x, float *y, int64_t n);
void lms_to_float_q4_0_ref(const void *x, float *y, int64_t n);
void lms_to_float_q4_1_ref(const void *x, float *y, int64_t n);
void lms_to_float_q5_0_ref(const void *x, float *y, int64_t n);
void lms_to_float_q5_1_ref(const void *x, float *y, int64_t n);
void lms_to_float_q8_0_ref(const void *x, float *y, int64_t n);
void lms_to_float_q8_1_ref(const void *x, float *y, int64_t n);
void lms_to_float_q2_K_ref(const void *x, float *y, int64_t n);
void lms_to_float_q3_K_ref(const void *x, float *y, int64_t n);
void lms_to_float_q4_K_ref(const void *x, float *y, int64_t n);
void lms_to_float_q5_K_ref(const void *x, float *y, int64_t n);
void lms_to_float_q6_K_ref(const void *x, float *y, int64_t n);
void lms_to_float_q8_K_ref(const void *x, float *y, int64_t n);
void lms_to_float_iq4_nl_ref(const void *x, float *y, int64_t n);
void lms_to_float_iq4_xs_ref(const void *x, float *y, int64_t n);

/* ---- from_float: activation conversion ------------------------------------------
 *
 * These reproduce llama.cpp's x86 build bit for bit:
 *   F16, BF16  round to nearest even.
 *   Q8_0       per 32: amax = max |x|; q = x * (127 / amax) rounded half to
 *              even; d = f16(amax / 127).
 *   Q8_1       as Q8_0, plus s = f16(amax / 127 * sum q).
 *   Q8_K       per 256: m = the value of largest magnitude (first one on a
 *              tie), iscale = -127 / m, q = min(127, x * iscale rounded half
 *              to even), d = 1 / iscale in f32, bsums = sums of 16 q's.
 * Weight types are converted by the quantizer in quantize_weights.h. */
void lms_from_float_f32_ref(const float *x, void *y, int64_t n);
void lms_from_float_f16_ref(const float *x, void *y, int64_t n);
void lms_from_float_bf16_ref(const float *x, void *y, int64_t n);
void lms_from_float_q8_0_ref(const float *x, void *y, int64_t n);
void lms_from_float_q8_1_ref(const float *x, void *y, int64_t n);
void lms_from_float_q8_K_ref(const float *x, void *y, int64_t n);

/* ---- vec_dot: *s = w · x, x already in w's vec_dot type ---------------------- */

void lms_vec_dot_f32_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_f16_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_bf16_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q4_0_q8_0_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q5_0_q8_0_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q8_0_q8_0_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q4_1_q8_1_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q5_1_q8_1_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q2_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q3_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q4_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q5_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_q6_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_iq4_nl_q8_0_ref(int64_t n, float *s, const void *w, const void *x);
void lms_vec_dot_iq4_xs_q8_K_ref(int64_t n, float *s, const void *w, const void *x);

#endif
