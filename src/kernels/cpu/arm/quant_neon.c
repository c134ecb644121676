/*
 * quant_neon.c - the AArch64 NEON kernel table (ARMv8.2-A with the dot
 * product extension: Cortex-A55/A76 and later, Neoverse N1/V1/V2, Apple).
 *
 * Central idea: vdotq_s32 takes signed int8 on both sides, so every weight
 * code is first made a signed int8 (offsets such as Q4_0's -8 or Q6_K's
 * -32 are subtracted up front) and multiplied straight against the int8
 * activations, four products per int32 lane. Sub-block scales multiply
 * int32 lanes (vmlaq_n_s32); the float scaling happens once per block.
 *
 * Numerics as the x86 kernels (see cpu/x86/quant_x86.h): exact integer
 * parts, float scaling per block; from_float for Q8_0, Q8_1, Q8_K, F16 and
 * BF16 gives the reference's bytes, NaN and infinity included. Checked by
 * tests/kernels/test_simd.c, under qemu on x86 hosts (tools/check-neon).
 *
 * The multi-row kernels (gemv for decode, gemm tiles for prompts) are in
 * gemm_neon.c. Chosen by kernels.c when getauxval(AT_HWCAP) has
 * HWCAP_ASIMDDP, or with LMS_ISA=neon.
 */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "base/fp16.h"
#include "kernels/cpu/arm/gemm_neon.h"
#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels_impl.h"
#include "kernels/qtypes.h"

/* ---- helpers ------------------------------------------------------------------ */

static inline float h2f(uint16_t h)
{
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    return vdotq_s32(acc, a, b);
}

/* 16 bytes of nibbles -> codes 0..15 of elements 0..15 and 16..31. */
static inline void nibbles32(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi)
{
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
}

/* Bit 4 of each of the 32 codes from qh: 0x10 where bit i of qh is set. */
static inline void bits32(const uint8_t qh[4], uint8x16_t *lo, uint8x16_t *hi)
{
    static const uint8_t k_bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(k_bit), b4 = vdupq_n_u8(0x10);
    *lo = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), m), b4);
    *hi = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), m), b4);
}

/* ---- 32-element formats against Q8_0 / Q8_1 ------------------------------------- */

static void vec_dot_q8_0_q8_0_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q8_0 *w = vw, *x = vx;
    const int64_t nb = n / LMS_QK8_0;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        int32x4_t p0 = dot16(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(x[i].qs));
        int32x4_t p1 = dot16(vdupq_n_s32(0), vld1q_s8(w[i + 1].qs), vld1q_s8(x[i + 1].qs));
        p0 = dot16(p0, vld1q_s8(w[i].qs + 16), vld1q_s8(x[i].qs + 16));
        p1 = dot16(p1, vld1q_s8(w[i + 1].qs + 16), vld1q_s8(x[i + 1].qs + 16));
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[i].d) * h2f(x[i].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[i + 1].d) * h2f(x[i + 1].d));
    }
    if (i < nb) {
        int32x4_t p0 = dot16(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(x[i].qs));
        p0 = dot16(p0, vld1q_s8(w[i].qs + 16), vld1q_s8(x[i].qs + 16));
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[i].d) * h2f(x[i].d));
    }
    *s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

static inline int32x4_t q4_0_dot(const lms_block_q4_0 *w, const lms_block_q8_0 *x)
{
    int8x16_t lo, hi;
    nibbles32(w->qs, &lo, &hi);
    const int8x16_t m8 = vdupq_n_s8(8);
    const int32x4_t p = dot16(vdupq_n_s32(0), vsubq_s8(lo, m8), vld1q_s8(x->qs));
    return dot16(p, vsubq_s8(hi, m8), vld1q_s8(x->qs + 16));
}

static void vec_dot_q4_0_q8_0_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q4_0 *w = vw;
    const lms_block_q8_0 *x = vx;
    const int64_t nb = n / LMS_QK4_0;
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const int32x4_t p0 = q4_0_dot(&w[i], &x[i]);
        const int32x4_t p1 = q4_0_dot(&w[i + 1], &x[i + 1]);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[i].d) * h2f(x[i].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[i + 1].d) * h2f(x[i + 1].d));
    }
    if (i < nb)
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(q4_0_dot(&w[i], &x[i])), h2f(w[i].d) * h2f(x[i].d));
    *s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

static void vec_dot_q5_0_q8_0_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q5_0 *w = vw;
    const lms_block_q8_0 *x = vx;
    const int64_t nb = n / LMS_QK5_0;
    float32x4_t acc = vdupq_n_f32(0.0f);
    const int8x16_t m16 = vdupq_n_s8(16);
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t lo, hi;
        uint8x16_t blo, bhi;
        nibbles32(w[i].qs, &lo, &hi);
        bits32(w[i].qh, &blo, &bhi);
        lo = vsubq_s8(vorrq_s8(lo, vreinterpretq_s8_u8(blo)), m16);
        hi = vsubq_s8(vorrq_s8(hi, vreinterpretq_s8_u8(bhi)), m16);
        int32x4_t p = dot16(vdupq_n_s32(0), lo, vld1q_s8(x[i].qs));
        p = dot16(p, hi, vld1q_s8(x[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(w[i].d) * h2f(x[i].d));
    }
    *s = vaddvq_f32(acc);
}

static void vec_dot_q4_1_q8_1_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q4_1 *w = vw;
    const lms_block_q8_1 *x = vx;
    const int64_t nb = n / LMS_QK4_1;
    float32x4_t acc = vdupq_n_f32(0.0f);
    float summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t lo, hi;
        nibbles32(w[i].qs, &lo, &hi);
        int32x4_t p = dot16(vdupq_n_s32(0), lo, vld1q_s8(x[i].qs));
        p = dot16(p, hi, vld1q_s8(x[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(w[i].d) * h2f(x[i].d));
        summ += h2f(w[i].m) * h2f(x[i].s);
    }
    *s = vaddvq_f32(acc) + summ;
}

static void vec_dot_q5_1_q8_1_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q5_1 *w = vw;
    const lms_block_q8_1 *x = vx;
    const int64_t nb = n / LMS_QK5_1;
    float32x4_t acc = vdupq_n_f32(0.0f);
    float summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t lo, hi;
        uint8x16_t blo, bhi;
        nibbles32(w[i].qs, &lo, &hi);
        bits32(w[i].qh, &blo, &bhi);
        lo = vorrq_s8(lo, vreinterpretq_s8_u8(blo));
        hi = vorrq_s8(hi, vreinterpretq_s8_u8(bhi));
        int32x4_t p = dot16(vdupq_n_s32(0), lo, vld1q_s8(x[i].qs));
        p = dot16(p, hi, vld1q_s8(x[i].qs + 16));
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), h2f(w[i].d) * h2f(x[i].d));
        summ += h2f(w[i].m) * h2f(x[i].s);
    }
    *s = vaddvq_f32(acc) + summ;
}

/* ---- K-quants against Q8_K -----------------------------------------------------------
 *
 * Per super-block: int32 lanes accumulate sc[s] * (4-product sums) over the
 * sub-blocks, one horizontal add gives sumi; the min term is sum_s mn[s] *
 * bsums. Then (d d_x) sumi - (dmin d_x) summ in float, as the reference. */

/* Sum over s of mn[s] * (bsums of sub-block s); 16-wide sub-blocks when
 * pairs is 0, 32-wide (adjacent bsums added first) when 1. */
static inline int32_t mins_dot(const int16_t bsums[16], const uint8_t *mn, int pairs)
{
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    if (pairs) {
        const int16x8_t b = vpaddq_s16(b0, b1);
        const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
        int32x4_t p = vmull_s16(vget_low_s16(b), vget_low_s16(m));
        p = vmlal_high_s16(p, b, m);
        return vaddvq_s32(p);
    }
    const uint8x16_t m8 = vld1q_u8(mn);
    const int16x8_t m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(m8)));
    const int16x8_t m1 = vreinterpretq_s16_u16(vmovl_high_u8(m8));
    int32x4_t p = vmull_s16(vget_low_s16(b0), vget_low_s16(m0));
    p = vmlal_high_s16(p, b0, m0);
    p = vmlal_s16(p, vget_low_s16(b1), vget_low_s16(m1));
    p = vmlal_high_s16(p, b1, m1);
    return vaddvq_s32(p);
}

static inline void k4_scales(const uint8_t s[12], uint8_t sc[8], uint8_t mn[8])
{
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&a2, s + 8, 4);
    const uint32_t sc_lo = a0 & 0x3f3f3f3f, mn_lo = a1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (a2 & 0x0f0f0f0f) | ((a0 >> 6) & 0x03030303) << 4;
    const uint32_t mn_hi = ((a2 >> 4) & 0x0f0f0f0f) | ((a1 >> 6) & 0x03030303) << 4;
    memcpy(sc, &sc_lo, 4);
    memcpy(sc + 4, &sc_hi, 4);
    memcpy(mn, &mn_lo, 4);
    memcpy(mn + 4, &mn_hi, 4);
}

/* Q4_K and Q5_K (has_qh): 32-wide sub-blocks, two per 32 bytes of qs. */
static inline void kq4_dot_neon(int64_t n, float *s, const void *vw, size_t blk_bytes,
                                const void *vx, int has_qh)
{
    const uint8_t *wp = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), b4 = vdupq_n_u8(0x10);
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *blk = wp + (size_t)i * blk_bytes;
        const lms_block_q4_K *b = (const lms_block_q4_K *)blk;
        const uint8_t *qs = has_qh ? ((const lms_block_q5_K *)blk)->qs : b->qs;
        const int8_t *a = x[i].qs;
        uint8_t sc[8], mn[8];
        k4_scales(b->scales, sc, mn);
        uint8x16_t h0 = vdupq_n_u8(0), h1 = h0;
        if (has_qh) {
            h0 = vld1q_u8(((const lms_block_q5_K *)blk)->qh);
            h1 = vld1q_u8(((const lms_block_q5_K *)blk)->qh + 16);
        }
        int32x4_t sumi = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++) {
            const uint8x16_t q0 = vld1q_u8(qs + 32 * j), q1 = vld1q_u8(qs + 32 * j + 16);
            uint8x16_t l0 = vandq_u8(q0, m4), l1 = vandq_u8(q1, m4);
            uint8x16_t u0 = vshrq_n_u8(q0, 4), u1 = vshrq_n_u8(q1, 4);
            if (has_qh) {
                l0 = vorrq_u8(l0, vandq_u8(vshlq_n_u8(h0, 4), b4));
                l1 = vorrq_u8(l1, vandq_u8(vshlq_n_u8(h1, 4), b4));
                u0 = vorrq_u8(u0, vandq_u8(vshlq_n_u8(h0, 3), b4));
                u1 = vorrq_u8(u1, vandq_u8(vshlq_n_u8(h1, 3), b4));
                h0 = vshrq_n_u8(h0, 2);
                h1 = vshrq_n_u8(h1, 2);
            }
            int32x4_t pl = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(l0), vld1q_s8(a + 64 * j));
            pl = dot16(pl, vreinterpretq_s8_u8(l1), vld1q_s8(a + 64 * j + 16));
            int32x4_t ph =
                dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(u0), vld1q_s8(a + 64 * j + 32));
            ph = dot16(ph, vreinterpretq_s8_u8(u1), vld1q_s8(a + 64 * j + 48));
            sumi = vmlaq_n_s32(sumi, pl, sc[2 * j]);
            sumi = vmlaq_n_s32(sumi, ph, sc[2 * j + 1]);
        }
        const int32_t summ = mins_dot(x[i].bsums, mn, 1);
        const float dx = x[i].d;
        sumf += (h2f(b->d) * dx) * (float)vaddvq_s32(sumi) - (h2f(b->dmin) * dx) * (float)summ;
    }
    *s = sumf;
}

static void vec_dot_q4_K_q8_K_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    kq4_dot_neon(n, s, vw, sizeof(lms_block_q4_K), vx, 0);
}

static void vec_dot_q5_K_q8_K_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    kq4_dot_neon(n, s, vw, sizeof(lms_block_q5_K), vx, 1);
}

static void vec_dot_q6_K_q8_K_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q6_K *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x30);
    const int8x16_t m32 = vdupq_n_s8(32);
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs, *sc = w[i].scales;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            for (int r = 0; r < 2; r++) { /* 16 of the 32 columns l at a time */
                const uint8x16_t ql0 = vld1q_u8(w[i].ql + 64 * h + 16 * r);
                const uint8x16_t ql1 = vld1q_u8(w[i].ql + 64 * h + 32 + 16 * r);
                const uint8x16_t qh = vld1q_u8(w[i].qh + 32 * h + 16 * r);
                uint8x16_t u[4];
                u[0] = vorrq_u8(vandq_u8(ql0, m4), vandq_u8(vshlq_n_u8(qh, 4), m2));
                u[1] = vorrq_u8(vandq_u8(ql1, m4), vandq_u8(vshlq_n_u8(qh, 2), m2));
                u[2] = vorrq_u8(vshrq_n_u8(ql0, 4), vandq_u8(qh, m2));
                u[3] = vorrq_u8(vshrq_n_u8(ql1, 4), vandq_u8(vshrq_n_u8(qh, 2), m2));
                for (int g = 0; g < 4; g++) {
                    /* elements 128h + 32g + 16r + 0..15: sub-block 8h + 2g + r */
                    const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(u[g]), m32);
                    const int32x4_t p =
                        dot16(vdupq_n_s32(0), q, vld1q_s8(a + 128 * h + 32 * g + 16 * r));
                    sumi = vmlaq_n_s32(sumi, p, sc[8 * h + 2 * g + r]);
                }
            }
        }
        sumf += (h2f(w[i].d) * x[i].d) * (float)vaddvq_s32(sumi);
    }
    *s = sumf;
}

static void vec_dot_q2_K_q8_K_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q2_K *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const uint8x16_t m2 = vdupq_n_u8(3);
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        uint8_t sc[16], mn[16];
        const uint8x16_t s8 = vld1q_u8(w[i].scales);
        vst1q_u8(sc, vandq_u8(s8, vdupq_n_u8(0x0F)));
        vst1q_u8(mn, vshrq_n_u8(s8, 4));
        int32x4_t sumi = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            for (int r = 0; r < 2; r++) {
                const uint8x16_t q = vld1q_u8(w[i].qs + 32 * h + 16 * r);
                for (int g = 0; g < 4; g++) {
                    const uint8x16_t u = vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * g))), m2);
                    const int32x4_t p = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(u),
                                              vld1q_s8(a + 128 * h + 32 * g + 16 * r));
                    sumi = vmlaq_n_s32(sumi, p, sc[8 * h + 2 * g + r]);
                }
            }
        }
        const int32_t summ = mins_dot(x[i].bsums, mn, 0);
        const float dx = x[i].d;
        sumf += (h2f(w[i].d) * dx) * (float)vaddvq_s32(sumi) - (h2f(w[i].dmin) * dx) * (float)summ;
    }
    *s = sumf;
}

/* Q3_K scales (stored + 32) -> int8 -32..31, layout in quant_ref.c. */
static inline void q3_scales(const uint8_t s[12], int8_t sc[16])
{
    uint32_t a0, a1, a2, w[4];
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&a2, s + 8, 4);
    w[0] = (a0 & 0x0f0f0f0f) | (a2 & 0x03030303) << 4;
    w[1] = (a1 & 0x0f0f0f0f) | ((a2 >> 2) & 0x03030303) << 4;
    w[2] = ((a0 >> 4) & 0x0f0f0f0f) | ((a2 >> 4) & 0x03030303) << 4;
    w[3] = ((a1 >> 4) & 0x0f0f0f0f) | ((a2 >> 6) & 0x03030303) << 4;
    memcpy(sc, w, 16);
    for (int j = 0; j < 16; j++)
        sc[j] = (int8_t)(sc[j] - 32);
}

static void vec_dot_q3_K_q8_K_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q3_K *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const uint8x16_t m2 = vdupq_n_u8(3), b2 = vdupq_n_u8(4);
    const int8x16_t m4 = vdupq_n_s8(4);
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        int8_t sc[16];
        q3_scales(w[i].scales, sc);
        int32x4_t sumi = vdupq_n_s32(0);
        for (int r = 0; r < 2; r++) {
            uint8x16_t hb = vld1q_u8(w[i].hmask + 16 * r);
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q = vld1q_u8(w[i].qs + 32 * h + 16 * r);
                for (int g = 0; g < 4; g++) {
                    const uint8x16_t lo = vandq_u8(vshlq_u8(q, vdupq_n_s8((int8_t)(-2 * g))), m2);
                    const uint8x16_t hi = vandq_u8(vshlq_n_u8(hb, 2), b2);
                    hb = vshrq_n_u8(hb, 1);
                    const int8x16_t c = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), m4);
                    const int32x4_t p =
                        dot16(vdupq_n_s32(0), c, vld1q_s8(a + 128 * h + 32 * g + 16 * r));
                    sumi = vmlaq_n_s32(sumi, p, sc[8 * h + 2 * g + r]);
                }
            }
        }
        sumf += (h2f(w[i].d) * x[i].d) * (float)vaddvq_s32(sumi);
    }
    *s = sumf;
}

/* ---- IQ4_NL / IQ4_XS: 4-bit indices into a table of 16 values ----------------------
 *
 * vqtbl1q_s8 with the table in one register turns 16 index nibbles into 16
 * int8 values, which go straight into vdotq_s32 against the activations. */

/* The 32 values of a 32-element block from its 16 bytes of indices. */
static inline void iq4_values32(int8x16_t tbl, const uint8_t *qs, int8x16_t *lo, int8x16_t *hi)
{
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vqtbl1q_s8(tbl, vandq_u8(v, vdupq_n_u8(0x0F)));
    *hi = vqtbl1q_s8(tbl, vshrq_n_u8(v, 4));
}

static inline int32x4_t iq4_dot32(int8x16_t tbl, const uint8_t *qs, const int8_t *a)
{
    int8x16_t lo, hi;
    iq4_values32(tbl, qs, &lo, &hi);
    return dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(a)), hi, vld1q_s8(a + 16));
}

static void vec_dot_iq4_nl_q8_0_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_iq4_nl *w = vw;
    const lms_block_q8_0 *x = vx;
    const int64_t nb = n / LMS_QK4_NL;
    const int8x16_t tbl = vld1q_s8(lms_iq4_values);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const int32x4_t p0 = iq4_dot32(tbl, w[i].qs, x[i].qs);
        const int32x4_t p1 = iq4_dot32(tbl, w[i + 1].qs, x[i + 1].qs);
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[i].d) * h2f(x[i].d));
        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[i + 1].d) * h2f(x[i + 1].d));
    }
    if (i < nb)
        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(iq4_dot32(tbl, w[i].qs, x[i].qs)),
                           h2f(w[i].d) * h2f(x[i].d));
    *s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

/* Per super-block: int32 lanes accumulate (scale - 32) * (4-product sums)
 * of each 32-element sub-block, then one float scaling by d * d_x. */
static void vec_dot_iq4_xs_q8_K_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_iq4_xs *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const int8x16_t tbl = vld1q_s8(lms_iq4_values);
    float sumf = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        int32x4_t sum0 = vdupq_n_s32(0), sum1 = sum0;
        for (int j = 0; j < 8; j += 2) {
            const int ls0 = ((w[i].scales_l[j / 2] & 0xF) | ((w[i].scales_h >> (2 * j)) & 3) << 4);
            const int ls1 =
                ((w[i].scales_l[j / 2] >> 4) | ((w[i].scales_h >> (2 * j + 2)) & 3) << 4);
            sum0 = vmlaq_n_s32(sum0, iq4_dot32(tbl, w[i].qs + 16 * j, a + 32 * j), ls0 - 32);
            sum1 = vmlaq_n_s32(sum1, iq4_dot32(tbl, w[i].qs + 16 * j + 16, a + 32 * j + 32),
                               ls1 - 32);
        }
        sumf += (h2f(w[i].d) * x[i].d) * (float)vaddvq_s32(vaddq_s32(sum0, sum1));
    }
    *s = sumf;
}

/* ---- float rows -------------------------------------------------------------------------- */

static void vec_dot_f32_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const float *w = vw, *x = vx;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
        a1 = vfmaq_f32(a1, vld1q_f32(w + i + 4), vld1q_f32(x + i + 4));
        a2 = vfmaq_f32(a2, vld1q_f32(w + i + 8), vld1q_f32(x + i + 8));
        a3 = vfmaq_f32(a3, vld1q_f32(w + i + 12), vld1q_f32(x + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        a0 = vfmaq_f32(a0, vld1q_f32(w + i), vld1q_f32(x + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++)
        sum += w[i] * x[i];
    *s = sum;
}

static void vec_dot_f16_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const uint16_t *w = vw, *x = vx;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float16x8_t w0 = vreinterpretq_f16_u16(vld1q_u16(w + i));
        const float16x8_t w1 = vreinterpretq_f16_u16(vld1q_u16(w + i + 8));
        const float16x8_t x0 = vreinterpretq_f16_u16(vld1q_u16(x + i));
        const float16x8_t x1 = vreinterpretq_f16_u16(vld1q_u16(x + i + 8));
        a0 = vfmaq_f32(a0, vcvt_f32_f16(vget_low_f16(w0)), vcvt_f32_f16(vget_low_f16(x0)));
        a1 = vfmaq_f32(a1, vcvt_high_f32_f16(w0), vcvt_high_f32_f16(x0));
        a2 = vfmaq_f32(a2, vcvt_f32_f16(vget_low_f16(w1)), vcvt_f32_f16(vget_low_f16(x1)));
        a3 = vfmaq_f32(a3, vcvt_high_f32_f16(w1), vcvt_high_f32_f16(x1));
    }
    for (; i + 4 <= n; i += 4) {
        const float16x4_t wv = vreinterpret_f16_u16(vld1_u16(w + i));
        const float16x4_t xv = vreinterpret_f16_u16(vld1_u16(x + i));
        a0 = vfmaq_f32(a0, vcvt_f32_f16(wv), vcvt_f32_f16(xv));
    }
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++)
        sum += h2f(w[i]) * h2f(x[i]);
    *s = sum;
}

static inline float32x4_t bf16_lo(uint16x8_t v)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
}

static inline float32x4_t bf16_hi(uint16x8_t v)
{
    return vreinterpretq_f32_u32(vshll_high_n_u16(v, 16));
}

static void vec_dot_bf16_neon(int64_t n, float *s, const void *vw, const void *vx)
{
    const uint16_t *w = vw, *x = vx;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const uint16x8_t w0 = vld1q_u16(w + i), w1 = vld1q_u16(w + i + 8);
        const uint16x8_t x0 = vld1q_u16(x + i), x1 = vld1q_u16(x + i + 8);
        a0 = vfmaq_f32(a0, bf16_lo(w0), bf16_lo(x0));
        a1 = vfmaq_f32(a1, bf16_hi(w0), bf16_hi(x0));
        a2 = vfmaq_f32(a2, bf16_lo(w1), bf16_lo(x1));
        a3 = vfmaq_f32(a3, bf16_hi(w1), bf16_hi(x1));
    }
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; i < n; i++)
        sum += lms_bf16_to_f32(w[i]) * lms_bf16_to_f32(x[i]);
    *s = sum;
}

/* ---- conversions ---------------------------------------------------------------------------- */

/* max |x| over 4k floats, ignoring NaN as fmaxf does (vmaxnm). */
static inline float absmax(const float *x, int n)
{
    float32x4_t m = vdupq_n_f32(0.0f);
    for (int k = 0; k < n; k += 4)
        m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + k)));
    return vmaxnmvq_f32(m);
}

/* lms_round_clamp(v, -128, 127) on 4 lanes, narrowed later with saturation:
 * vcvtnq rounds half to even and saturates; it gives 0 for NaN, where the
 * reference gives -128. */
static inline int32x4_t round_i8x4(float32x4_t v)
{
    const uint32x4_t ok = vceqq_f32(v, v);
    return vbslq_s32(ok, vcvtnq_s32_f32(v), vdupq_n_s32(-128));
}

/* 16 int32 -> 16 int8 with saturation. */
static inline int8x16_t narrow16(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d)
{
    const int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    const int16x8_t cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
    return vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd));
}

/* 32 codes of x * scale; returns their sum. */
static inline int q8_codes32(const float *x, float scale, int8_t *qs)
{
    int sum = 0;
    for (int h = 0; h < 32; h += 16) {
        int32x4_t r[4];
        for (int k = 0; k < 4; k++)
            r[k] = round_i8x4(vmulq_n_f32(vld1q_f32(x + h + 4 * k), scale));
        const int8x16_t q = narrow16(r[0], r[1], r[2], r[3]);
        vst1q_s8(qs + h, q);
        sum += vaddlvq_s8(q);
    }
    return sum;
}

static void from_float_q8_0_neon(const float *x, void *vy, int64_t n)
{
    lms_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / LMS_QK8_0; i++) {
        const float *xb = x + i * LMS_QK8_0;
        const float am = absmax(xb, 32);
        q8_codes32(xb, am != 0.0f ? 127.0f / am : 0.0f, y[i].qs);
        y[i].d = lms_f32_to_f16(am / 127.0f);
    }
}

static void from_float_q8_1_neon(const float *x, void *vy, int64_t n)
{
    lms_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / LMS_QK8_1; i++) {
        const float *xb = x + i * LMS_QK8_1;
        const float am = absmax(xb, 32);
        const int sum = q8_codes32(xb, am != 0.0f ? 127.0f / am : 0.0f, y[i].qs);
        const float d = am / 127.0f;
        y[i].d = lms_f32_to_f16(d);
        y[i].s = lms_f32_to_f16(d * (float)sum);
    }
}

static void from_float_q8_K_neon(const float *x, void *vy, int64_t n)
{
    lms_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / LMS_QK_K; i++) {
        const float *xb = x + i * LMS_QK_K;
        const float am = absmax(xb, LMS_QK_K);
        memset(&y[i], 0, sizeof y[i]);
        if (am == 0.0f)
            continue;
        int j = 0; /* the first element of largest magnitude, with its sign */
        while (fabsf(xb[j]) != am)
            j++;
        const float iscale = -127.0f / xb[j];
        for (int c = 0; c < LMS_QK_K; c += 16) {
            int32x4_t r[4];
            for (int k = 0; k < 4; k++)
                r[k] = round_i8x4(vmulq_n_f32(vld1q_f32(xb + c + 4 * k), iscale));
            const int8x16_t q = narrow16(r[0], r[1], r[2], r[3]);
            vst1q_s8(y[i].qs + c, q);
            y[i].bsums[c / 16] = vaddlvq_s8(q);
        }
        y[i].d = 1.0f / iscale;
    }
}

/* 4 floats -> 4 halves, round to nearest even; NaN becomes the reference's
 * 0x7e00 with the sign kept (fcvtn would keep payload bits). */
static inline uint16x4_t f32_to_f16x4(float32x4_t v)
{
    const uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(v));
    const uint16x4_t isnan = vcgt_u16(vand_u16(h, vdup_n_u16(0x7fff)), vdup_n_u16(0x7c00));
    const uint16x4_t qnan = vorr_u16(vand_u16(h, vdup_n_u16(0x8000)), vdup_n_u16(0x7e00));
    return vbsl_u16(isnan, qnan, h);
}

static void from_float_f16_neon(const float *x, void *vy, int64_t n)
{
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1_u16(y + i, f32_to_f16x4(vld1q_f32(x + i)));
    for (; i < n; i++)
        y[i] = lms_f32_to_f16(x[i]);
}

/* As lms_f32_to_bf16: add 0x7fff + lsb and keep the top half; NaN -> top
 * half with the quiet bit. */
static inline uint16x4_t f32_to_bf16x4(float32x4_t v)
{
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
    const uint32x4_t nan = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(64));
    const uint32x4_t isnan =
        vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
    return vmovn_u32(vbslq_u32(isnan, nan, r));
}

static void from_float_bf16_neon(const float *x, void *vy, int64_t n)
{
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1_u16(y + i, f32_to_bf16x4(vld1q_f32(x + i)));
    for (; i < n; i++)
        y[i] = lms_f32_to_bf16(x[i]);
}

/* Exact except that signalling NaNs come back quiet. */
static void to_float_f16_neon(const void *vx, float *y, int64_t n)
{
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i))));
    for (; i < n; i++)
        y[i] = lms_f16_to_f32(x[i]);
}

static void to_float_bf16_neon(const void *vx, float *y, int64_t n)
{
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t v = vld1q_u16(x + i);
        vst1q_f32(y + i, bf16_lo(v));
        vst1q_f32(y + i + 4, bf16_hi(v));
    }
    for (; i < n; i++)
        y[i] = lms_bf16_to_f32(x[i]);
}

/* ---- the table ------------------------------------------------------------------------------- */

/* clang-format off */
static const lms_kernel_table k_neon = {
    .isa = "neon",
    .vec_dot = {
        [LMS_TYPE_F32] = vec_dot_f32_neon,
        [LMS_TYPE_F16] = vec_dot_f16_neon,
        [LMS_TYPE_BF16] = vec_dot_bf16_neon,
        [LMS_TYPE_Q4_0] = vec_dot_q4_0_q8_0_neon,
        [LMS_TYPE_Q5_0] = vec_dot_q5_0_q8_0_neon,
        [LMS_TYPE_Q8_0] = vec_dot_q8_0_q8_0_neon,
        [LMS_TYPE_Q4_1] = vec_dot_q4_1_q8_1_neon,
        [LMS_TYPE_Q5_1] = vec_dot_q5_1_q8_1_neon,
        [LMS_TYPE_Q2_K] = vec_dot_q2_K_q8_K_neon,
        [LMS_TYPE_Q3_K] = vec_dot_q3_K_q8_K_neon,
        [LMS_TYPE_Q4_K] = vec_dot_q4_K_q8_K_neon,
        [LMS_TYPE_Q5_K] = vec_dot_q5_K_q8_K_neon,
        [LMS_TYPE_Q6_K] = vec_dot_q6_K_q8_K_neon,
        [LMS_TYPE_IQ4_NL] = vec_dot_iq4_nl_q8_0_neon,
        [LMS_TYPE_IQ4_XS] = vec_dot_iq4_xs_q8_K_neon,
    },
    .from_float = {
        [LMS_TYPE_F16] = from_float_f16_neon,
        [LMS_TYPE_BF16] = from_float_bf16_neon,
        [LMS_TYPE_Q8_0] = from_float_q8_0_neon,
        [LMS_TYPE_Q8_1] = from_float_q8_1_neon,
        [LMS_TYPE_Q8_K] = from_float_q8_K_neon,
    },
    .to_float = {
        [LMS_TYPE_F16] = to_float_f16_neon,
        [LMS_TYPE_BF16] = to_float_bf16_neon,
    },
    .gemm = {
        [LMS_TYPE_Q8_0] = gemm_q8_0_q8_0_neon,
        [LMS_TYPE_Q4_K] = gemm_q4_K_q8_K_neon,
        [LMS_TYPE_Q6_K] = gemm_q6_K_q8_K_neon,
    },
    .gemv = {
        [LMS_TYPE_Q8_0] = gemv_q8_0_q8_0_neon,
        [LMS_TYPE_Q4_K] = gemv_q4_K_q8_K_neon,
        [LMS_TYPE_Q6_K] = gemv_q6_K_q8_K_neon,
    },
};
/* clang-format on */

const lms_kernel_table *lms_kernels_neon(void) { return &k_neon; }
