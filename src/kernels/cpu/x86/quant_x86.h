/*
 * quant_x86.h - the 256-bit x86 kernels, compiled once per x86 ISA file.
 *
 * Central idea: quant_avx2.c and quant_avx512.c both include this file, so
 * every quantized dot product is written once over 256-bit vectors. What
 * differs between the two builds is two integer primitives: the AVX2 build
 * uses vpmaddubsw + vpmaddwd + vpaddd, the AVX-512 build (which has VNNI
 * and VL) folds each pair into one vpdpbusd / vpdpwssd. The AVX-512 file
 * adds its own 512-bit kernels where wider vectors pay (F16, BF16, F32,
 * conversions) and builds its table from both.
 *
 * Everything here is `static inline`: each includer gets private copies,
 * compiled with its own -m flags, and may leave some unused. Not a public
 * header; include only from cpu/x86/quant_*.c.
 *
 * Numerics (tests/kernels/test_simd.c checks them against quant_ref.c):
 *   - integer sums inside a block are exact int32, as in the reference;
 *     the block scaling d_w * d_x * sumi is done in float lanes and summed
 *     horizontally once per row (the reference sums block by block, so the
 *     float results differ in the last bits only);
 *   - from_float for Q8_0, Q8_1, Q8_K, F16 and BF16 gives the reference's
 *     bytes exactly, NaN and infinity included: the same float operations,
 *     round-half-to-even, the same saturation (NaN codes become -128).
 *
 * vpmaddubsw saturates each pair of u8 * i8 products to int16. Every use
 * below keeps |pair| < 2^15: weight codes are at most 63 in magnitude
 * except Q8_0's (up to 128) and the IQ4 table values (up to 127), whose
 * activations come from the Q8_0 / Q8_K quantizers and are within
 * -127..127 (128 * 127 * 2 < 2^15).
 */
#ifndef LMS_QUANT_X86_H
#define LMS_QUANT_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "base/fp16.h"
#include "kernels/cpu/quant_ref.h"
#include "kernels/qtypes.h"

/* ---- primitives ------------------------------------------------------------- */

/* acc + per int32 lane the sum of 4 adjacent u8 * i8 products. */
static inline __m256i x86_dpbusd(__m256i acc, __m256i u, __m256i s)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    const __m256i p = _mm256_maddubs_epi16(u, s);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

/* acc + per int32 lane the sum of 2 adjacent i16 * i16 products. */
static inline __m256i x86_dpwssd(__m256i acc, __m256i a, __m256i b)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* acc + per int32 lane the sum of 4 adjacent i8 * i8 products (a = weights:
 * its sign moves onto b so the u8 operand is |a|). */
static inline __m256i x86_dot_i8(__m256i acc, __m256i a, __m256i b)
{
    return x86_dpbusd(acc, _mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

static inline __m256i x86_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static inline float x86_hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int32_t x86_hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* Exact for every half but signalling NaNs (which come back quiet). */
static inline float x86_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* prefetcht0 / prefetcht1 of the line holding p. Asm statements rather
 * than _mm_prefetch: GCC takes the builtin for free of effects and deletes
 * a loop of nothing else unless it unrolls the loop completely. */
static inline void x86_prefetch_l1(const void *p)
{
    __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
}
static inline void x86_prefetch_l2(const void *p)
{
    __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p));
}

/* 16 bytes of nibbles -> 32 codes 0..15: low nibbles first, then high. */
static inline __m256i x86_nibbles32(const uint8_t *qs)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m256i t = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(t, _mm256_set1_epi8(0x0F));
}

/* Byte i is 0xFF where bit i of x is set, else 0. */
static inline __m256i x86_bits32(uint32_t x)
{
    const __m256i sel =
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), sel);
    v = _mm256_or_si256(v, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL));
    return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}

/* Sub-block scales for vpmaddwd, without a broadcast per sub-block: the
 * 16 int8 scales of a super-block become int16 with the even-numbered ones
 * in the low 128-bit lane and the odd-numbered ones in the high lane ... */
static inline __m256i x86_scales_eo(__m128i sc8)
{
    const __m128i eo =
        _mm_shuffle_epi8(sc8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    return _mm256_cvtepi8_epi16(eo);
}

/* ... so that one in-lane shuffle gives, for the 32 codes of chunk k
 * (sub-blocks 2k and 2k+1 of 16), eight lanes of sc[2k] then eight of
 * sc[2k+1], matching vpmaddubsw's output. With a vector holding 8 scales
 * in both lanes (Q4_K, Q5_K) the same shuffle broadcasts sc[k]. */
static inline __m256i x86_scale_k(__m256i scales, int k)
{
    return _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 + 0x0202 * k)));
}

/* ---- 32-element formats against Q8_0 / Q8_1 --------------------------------------- */

static inline void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q8_0 *w = vw, *x = vx;
    const int64_t nb = n / LMS_QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __m256i p0 = x86_dot_i8(_mm256_setzero_si256(), x86_load(w[i].qs), x86_load(x[i].qs));
        const __m256i p1 =
            x86_dot_i8(_mm256_setzero_si256(), x86_load(w[i + 1].qs), x86_load(x[i + 1].qs));
        const __m256 d0 = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        const __m256 d1 = _mm256_set1_ps(x86_h2f(w[i + 1].d) * x86_h2f(x[i + 1].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(p1), acc1);
    }
    if (i < nb) {
        const __m256i p0 = x86_dot_i8(_mm256_setzero_si256(), x86_load(w[i].qs), x86_load(x[i].qs));
        const __m256 d0 = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), acc0);
    }
    *s = x86_hsum_ps(_mm256_add_ps(acc0, acc1));
}

static inline __m256i q4_0_codes(const lms_block_q4_0 *b)
{
    return _mm256_sub_epi8(x86_nibbles32(b->qs), _mm256_set1_epi8(8));
}

static inline void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q4_0 *w = vw;
    const lms_block_q8_0 *x = vx;
    const int64_t nb = n / LMS_QK4_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __m256i p0 = x86_dot_i8(_mm256_setzero_si256(), q4_0_codes(&w[i]), x86_load(x[i].qs));
        const __m256i p1 =
            x86_dot_i8(_mm256_setzero_si256(), q4_0_codes(&w[i + 1]), x86_load(x[i + 1].qs));
        const __m256 d0 = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        const __m256 d1 = _mm256_set1_ps(x86_h2f(w[i + 1].d) * x86_h2f(x[i + 1].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(p1), acc1);
    }
    if (i < nb) {
        const __m256i p0 = x86_dot_i8(_mm256_setzero_si256(), q4_0_codes(&w[i]), x86_load(x[i].qs));
        const __m256 d0 = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), acc0);
    }
    *s = x86_hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* Q5_0 codes -16..15: nibble, plus 16 where the qh bit is set, minus 16. */
static inline __m256i q5_0_codes(const lms_block_q5_0 *b)
{
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m256i hi = _mm256_and_si256(x86_bits32(qh), _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(x86_nibbles32(b->qs), hi), _mm256_set1_epi8(16));
}

static inline void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q5_0 *w = vw;
    const lms_block_q8_0 *x = vx;
    const int64_t nb = n / LMS_QK5_0;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m256i p = x86_dot_i8(_mm256_setzero_si256(), q5_0_codes(&w[i]), x86_load(x[i].qs));
        const __m256 d = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
    }
    *s = x86_hsum_ps(acc);
}

/* Q4_1 and Q5_1 codes are unsigned, so they go straight into vpmaddubsw;
 * the offset m meets the activation sum s kept in each Q8_1 block. */
static inline void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q4_1 *w = vw;
    const lms_block_q8_1 *x = vx;
    const int64_t nb = n / LMS_QK4_1;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const __m256i p =
            x86_dpbusd(_mm256_setzero_si256(), x86_nibbles32(w[i].qs), x86_load(x[i].qs));
        const __m256 d = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
        summ += x86_h2f(w[i].m) * x86_h2f(x[i].s);
    }
    *s = x86_hsum_ps(acc) + summ;
}

static inline void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q5_1 *w = vw;
    const lms_block_q8_1 *x = vx;
    const int64_t nb = n / LMS_QK5_1;
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint32_t qh;
        memcpy(&qh, w[i].qh, 4);
        const __m256i hi = _mm256_and_si256(x86_bits32(qh), _mm256_set1_epi8(0x10));
        const __m256i q = _mm256_or_si256(x86_nibbles32(w[i].qs), hi);
        const __m256i p = x86_dpbusd(_mm256_setzero_si256(), q, x86_load(x[i].qs));
        const __m256 d = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
        summ += x86_h2f(w[i].m) * x86_h2f(x[i].s);
    }
    *s = x86_hsum_ps(acc) + summ;
}

/* ---- K-quants against Q8_K ----------------------------------------------------------
 *
 * Per super-block the integer part is one int32 vector: vpmaddubsw over 32
 * codes gives 16 int16 pair sums (two 16-wide sub-blocks, or half of one
 * 32-wide sub-block), and vpmaddwd with the sub-block scales folds them into
 * int32 lanes. The min (or offset) term uses the activation's bsums. Both
 * are exact; only the final (d * d_x) scaling is float. */

/* Q4_K/Q5_K: 8 six-bit scales then 8 mins, as bytes, from 12 bytes (layout:
 * quant_ref.c). Built in registers: a vector load of just-stored pieces
 * would miss store forwarding. */
static inline __m128i k4_scales(const uint8_t s[12])
{
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&a2, s + 8, 4);
    const uint32_t sc_lo = a0 & 0x3f3f3f3f, mn_lo = a1 & 0x3f3f3f3f;
    const uint32_t sc_hi = (a2 & 0x0f0f0f0f) | ((a0 >> 6) & 0x03030303) << 4;
    const uint32_t mn_hi = ((a2 >> 4) & 0x0f0f0f0f) | ((a1 >> 6) & 0x03030303) << 4;
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi);
}

/* Sum over the 8 sub-blocks of mn[s] * (bsums[2s] + bsums[2s+1]), in lanes;
 * the mins are the high 8 bytes of scmn. */
static inline __m256i k4_mins(__m128i scmn, const int16_t bsums[16])
{
    const __m128i m8 = _mm_unpackhi_epi64(scmn, scmn);
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    return _mm256_madd_epi16(x86_load(bsums), m16);
}

/* Q4_K and Q5_K share their loop; qh is NULL for Q4_K. */
static inline void kq4_dot(int64_t n, float *s, const void *vw, size_t blk_bytes, const void *vx,
                           int has_qh)
{
    const uint8_t *wp = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *blk = wp + (size_t)i * blk_bytes;
        /* Q4_K and Q5_K both start with d, dmin, scales[12] */
        const lms_block_q4_K *b = (const lms_block_q4_K *)blk;
        const uint8_t *qs = has_qh ? ((const lms_block_q5_K *)blk)->qs : b->qs;
        const int8_t *a = x[i].qs;
        const __m128i scmn = k4_scales(b->scales);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scmn));
        __m256i hb = has_qh ? x86_load(((const lms_block_q5_K *)blk)->qh) : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i q = x86_load(qs + 32 * j);
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (has_qh) {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), b4));
                hb = _mm256_srli_epi16(hb, 2);
            }
            const __m256i p0 = _mm256_maddubs_epi16(lo, x86_load(a + 64 * j));
            const __m256i p1 = _mm256_maddubs_epi16(hi, x86_load(a + 64 * j + 32));
            sumi = x86_dpwssd(sumi, p0, x86_scale_k(sc16, 2 * j));
            sumi = x86_dpwssd(sumi, p1, x86_scale_k(sc16, 2 * j + 1));
        }
        const float dx = x[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x86_h2f(b->d) * dx), _mm256_cvtepi32_ps(sumi), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(x86_h2f(b->dmin) * dx),
                               _mm256_cvtepi32_ps(k4_mins(scmn, x[i].bsums)), accm);
    }
    *s = x86_hsum_ps(acc) - x86_hsum_ps(accm);
}

static inline void vec_dot_q4_K_q8_K(int64_t n, float *s, const void *vw, const void *vx)
{
    kq4_dot(n, s, vw, sizeof(lms_block_q4_K), vx, 0);
}

static inline void vec_dot_q5_K_q8_K(int64_t n, float *s, const void *vw, const void *vx)
{
    kq4_dot(n, s, vw, sizeof(lms_block_q5_K), vx, 1);
}

/* Q6_K: unsigned codes u = q + 32 go through vpmaddubsw; the -32 comes back
 * as 32 * sum_s sc[s] * bsums[s]. */
static inline void vec_dot_q6_K_q8_K(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q6_K *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        const __m256i corr = _mm256_madd_epi16(x86_load(x[i].bsums), _mm256_cvtepi8_epi16(sc8));
        const __m256i eo = x86_scales_eo(sc8);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = x86_load(w[i].ql + 64 * h), ql1 = x86_load(w[i].ql + 64 * h + 32);
            const __m256i qh = x86_load(w[i].qh + 32 * h);
            __m256i u[4];
            u[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2));
            u[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2));
            u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                   _mm256_and_si256(qh, m2));
            u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2));
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m256i p = _mm256_maddubs_epi16(u[g], x86_load(a + 128 * h + 32 * g));
                sumi = x86_dpwssd(sumi, p, x86_scale_k(eo, 4 * h + g));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        const __m256 d = _mm256_set1_ps(x86_h2f(w[i].d) * x[i].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = x86_hsum_ps(acc);
}

static inline void vec_dot_q2_K_q8_K(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q2_K *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m256i m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        const __m128i s8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        const __m256i mn16 =
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0F)));
        const __m256i summ = _mm256_madd_epi16(x86_load(x[i].bsums), mn16);
        const __m256i eo = x86_scales_eo(_mm_and_si128(s8, _mm_set1_epi8(0x0F)));
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = x86_load(w[i].qs + 32 * h);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), m2);
                const __m256i p = _mm256_maddubs_epi16(u, x86_load(a + 128 * h + 32 * g));
                sumi = x86_dpwssd(sumi, p, x86_scale_k(eo, 4 * h + g));
            }
        }
        const float dx = x[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x86_h2f(w[i].d) * dx), _mm256_cvtepi32_ps(sumi), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(x86_h2f(w[i].dmin) * dx), _mm256_cvtepi32_ps(summ),
                               accm);
    }
    *s = x86_hsum_ps(acc) - x86_hsum_ps(accm);
}

/* Q3_K: 16 six-bit scales (stored + 32) from 12 bytes, as int8 -32..31. */
static inline __m128i q3_scales(const uint8_t s[12])
{
    uint32_t a0, a1, a2;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&a2, s + 8, 4);
    const uint32_t w0 = (a0 & 0x0f0f0f0f) | (a2 & 0x03030303) << 4;
    const uint32_t w1 = (a1 & 0x0f0f0f0f) | ((a2 >> 2) & 0x03030303) << 4;
    const uint32_t w2 = ((a0 >> 4) & 0x0f0f0f0f) | ((a2 >> 4) & 0x03030303) << 4;
    const uint32_t w3 = ((a1 >> 4) & 0x0f0f0f0f) | ((a2 >> 6) & 0x03030303) << 4;
    const __m128i v = _mm_setr_epi32((int)w0, (int)w1, (int)w2, (int)w3);
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

/* Q3_K: unsigned u = low 2 bits + 4 * hmask bit (0..7); q = u - 4, so the
 * -4 comes back as 4 * sum_s sc[s] * bsums[s]. */
static inline void vec_dot_q3_K_q8_K(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q3_K *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m256i m2 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        const __m128i sc8 = q3_scales(w[i].scales);
        const __m256i eo = x86_scales_eo(sc8);
        const __m256i corr = _mm256_madd_epi16(x86_load(x[i].bsums), _mm256_cvtepi8_epi16(sc8));
        __m256i hb = x86_load(w[i].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = x86_load(w[i].qs + 32 * h);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * g), m2);
                const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(hb, 2), b2);
                hb = _mm256_srli_epi16(hb, 1);
                const __m256i u = _mm256_or_si256(lo, hi);
                const __m256i p = _mm256_maddubs_epi16(u, x86_load(a + 128 * h + 32 * g));
                sumi = x86_dpwssd(sumi, p, x86_scale_k(eo, 4 * h + g));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 2));
        const __m256 d = _mm256_set1_ps(x86_h2f(w[i].d) * x[i].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = x86_hsum_ps(acc);
}

/* ---- IQ4_NL / IQ4_XS: 4-bit indices into a table of 16 values ----------------------
 *
 * One vpshufb with the table in both 128-bit lanes turns 32 index nibbles
 * into 32 int8 values; from there the products are Q4_0's (IQ4_NL against
 * Q8_0) or, with the sub-block scales applied to int16 pair sums by
 * vpmaddwd, the K-quants' (IQ4_XS against Q8_K). Integer sums are exact. */

static inline __m256i x86_iq4_table(void)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lms_iq4_values));
}

/* 16 bytes of indices -> the 32 values of a 32-element block, in order. */
static inline __m256i x86_iq4_values32(__m256i table, const uint8_t *qs)
{
    return _mm256_shuffle_epi8(table, x86_nibbles32(qs));
}

static inline void vec_dot_iq4_nl_q8_0(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_iq4_nl *w = vw;
    const lms_block_q8_0 *x = vx;
    const int64_t nb = n / LMS_QK4_NL;
    const __m256i tbl = x86_iq4_table();
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __m256i p0 = x86_dot_i8(_mm256_setzero_si256(), x86_iq4_values32(tbl, w[i].qs),
                                      x86_load(x[i].qs));
        const __m256i p1 = x86_dot_i8(_mm256_setzero_si256(), x86_iq4_values32(tbl, w[i + 1].qs),
                                      x86_load(x[i + 1].qs));
        const __m256 d0 = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        const __m256 d1 = _mm256_set1_ps(x86_h2f(w[i + 1].d) * x86_h2f(x[i + 1].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), acc0);
        acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(p1), acc1);
    }
    if (i < nb) {
        const __m256i p0 = x86_dot_i8(_mm256_setzero_si256(), x86_iq4_values32(tbl, w[i].qs),
                                      x86_load(x[i].qs));
        const __m256 d0 = _mm256_set1_ps(x86_h2f(w[i].d) * x86_h2f(x[i].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(p0), acc0);
    }
    *s = x86_hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* The 8 sub-block scales of an IQ4_XS block as int8 (-32..31) in the low 8
 * bytes: pdep spreads the 8 low nibbles (scales_l, in sub-block order) and
 * the 8 bit pairs (scales_h) over the 8 bytes. */
static inline __m128i iq4_xs_scales(const lms_block_iq4_xs *b)
{
    uint32_t lo;
    memcpy(&lo, b->scales_l, 4);
    const uint64_t v =
        _pdep_u64(lo, 0x0F0F0F0F0F0F0F0FULL) | _pdep_u64(b->scales_h, 0x3030303030303030ULL);
    return _mm_sub_epi8(_mm_cvtsi64_si128((long long)v), _mm_set1_epi8(32));
}

/* Per sub-block j: vpmaddubsw of |value| and the activations with the
 * values' signs (16 int16 pair sums, |pair| <= 2 * 127 * 127), then
 * vpmaddwd by the scale broadcast from the 8 int16 scales. */
static inline void vec_dot_iq4_xs_q8_K(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_iq4_xs *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m256i tbl = x86_iq4_table();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(iq4_xs_scales(&w[i])));
        __m256i sum0 = _mm256_setzero_si256(), sum1 = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 8; j += 2) {
            const __m256i v0 = x86_iq4_values32(tbl, w[i].qs + 16 * j);
            const __m256i v1 = x86_iq4_values32(tbl, w[i].qs + 16 * j + 16);
            const __m256i p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(v0, v0),
                                                    _mm256_sign_epi8(x86_load(a + 32 * j), v0));
            const __m256i p1 = _mm256_maddubs_epi16(
                _mm256_sign_epi8(v1, v1), _mm256_sign_epi8(x86_load(a + 32 * j + 32), v1));
            sum0 = x86_dpwssd(sum0, p0, x86_scale_k(sc16, j));
            sum1 = x86_dpwssd(sum1, p1, x86_scale_k(sc16, j + 1));
        }
        const __m256 d = _mm256_set1_ps(x86_h2f(w[i].d) * x[i].d);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1)), acc);
    }
    *s = x86_hsum_ps(acc);
}

/* ---- float rows ---------------------------------------------------------------------- */

static inline __m256 x86_load_f32x8(const float *p)
{
    return _mm256_loadu_ps(p);
}

static inline __m256 x86_load_f16x8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 x86_load_bf16x8(const uint16_t *p)
{
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static inline float x86_f32_value(float v)
{
    return v;
}

/* The dot product of two rows of a float type T: four chains of 8 lanes
 * (LOAD8: 8 values as floats), then 8 at a time, then the tail one by one
 * (VALUE: one value as a float). */
#define X86_VEC_DOT_FLOAT(name, T, LOAD8, VALUE)                                            \
    static inline void name(int64_t n, float *s, const void *vw, const void *vx)            \
    {                                                                                       \
        const T *w = vw, *x = vx;                                                           \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                         \
        int64_t i = 0;                                                                      \
        for (; i + 32 <= n; i += 32) {                                                      \
            a0 = _mm256_fmadd_ps(LOAD8(w + i), LOAD8(x + i), a0);                           \
            a1 = _mm256_fmadd_ps(LOAD8(w + i + 8), LOAD8(x + i + 8), a1);                   \
            a2 = _mm256_fmadd_ps(LOAD8(w + i + 16), LOAD8(x + i + 16), a2);                 \
            a3 = _mm256_fmadd_ps(LOAD8(w + i + 24), LOAD8(x + i + 24), a3);                 \
        }                                                                                   \
        for (; i + 8 <= n; i += 8)                                                          \
            a0 = _mm256_fmadd_ps(LOAD8(w + i), LOAD8(x + i), a0);                           \
        float sum = x86_hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))); \
        for (; i < n; i++)                                                                  \
            sum += VALUE(w[i]) * VALUE(x[i]);                                               \
        *s = sum;                                                                           \
    }

X86_VEC_DOT_FLOAT(vec_dot_f32_x86, float, x86_load_f32x8, x86_f32_value)
X86_VEC_DOT_FLOAT(vec_dot_f16_x86, uint16_t, x86_load_f16x8, x86_h2f)
X86_VEC_DOT_FLOAT(vec_dot_bf16_x86, uint16_t, x86_load_bf16x8, lms_bf16_to_f32)

/* ---- conversions ------------------------------------------------------------------------ */

/* max |x| of 8 floats into acc, ignoring NaN as fmaxf does: vmaxps returns
 * its second operand when either is NaN. */
static inline __m256 x86_absmax(__m256 acc, __m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return _mm256_max_ps(_mm256_andnot_ps(sign, v), acc);
}

static inline float x86_hmax_ps(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* lms_round_clamp(v, -128, 127) of quant_ref.h on 8 lanes: round half to
 * even (MXCSR's default mode), clamp; NaN gives -128. vminps returns its
 * second operand when one is NaN, so NaN and large negatives reach
 * vcvtps2dq, which gives INT_MIN for them, saturated to -128 by the packs
 * in x86_pack_i8x32. */
static inline __m256i x86_round_i8x8(__m256 v)
{
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_set1_ps(127.0f), v));
}

/* Four vectors of 8 int32 (-128..127) -> 32 int8 in order. */
static inline __m256i x86_pack_i8x32(__m256i i0, __m256i i1, __m256i i2, __m256i i3)
{
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 32 floats to int8 codes by their largest magnitude am (written to *am):
 * code = round(x * 127 / am), as the reference rounds. */
static inline __m256i x86_q8_block(const float *xb, float *am_out)
{
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(xb + 8 * k);
        amax = x86_absmax(amax, v[k]);
    }
    const float am = x86_hmax_ps(amax);
    const __m256 id = _mm256_set1_ps(am != 0.0f ? 127.0f / am : 0.0f);
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = x86_round_i8x8(_mm256_mul_ps(v[k], id));
    *am_out = am;
    return x86_pack_i8x32(q[0], q[1], q[2], q[3]);
}

static inline void from_float_q8_0_x86(const float *x, void *vy, int64_t n)
{
    lms_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / LMS_QK8_0; i++) {
        float am;
        _mm256_storeu_si256((__m256i *)y[i].qs, x86_q8_block(x + i * LMS_QK8_0, &am));
        y[i].d = lms_f32_to_f16(am / 127.0f);
    }
}

/* Sums of each 16 of 32 int8: lane 0 and lane 4 of the result. */
static inline __m256i x86_sum16_i8(__m256i q)
{
    const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
    __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    s = _mm256_hadd_epi32(s, s);
    return _mm256_hadd_epi32(s, s);
}

/* Q8_0 plus s = f16(d * sum q), d unrounded, as the reference. */
static inline void from_float_q8_1_x86(const float *x, void *vy, int64_t n)
{
    lms_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / LMS_QK8_1; i++) {
        float am;
        const __m256i q8 = x86_q8_block(x + i * LMS_QK8_1, &am);
        _mm256_storeu_si256((__m256i *)y[i].qs, q8);
        const __m256i sums = x86_sum16_i8(q8);
        const int sum = _mm256_extract_epi32(sums, 0) + _mm256_extract_epi32(sums, 4);
        const float d = am / 127.0f;
        y[i].d = lms_f32_to_f16(d);
        y[i].s = lms_f32_to_f16(d * (float)sum);
    }
}

static inline void from_float_q8_K_x86(const float *x, void *vy, int64_t n)
{
    lms_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / LMS_QK_K; i++) {
        const float *xb = x + i * LMS_QK_K;
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < LMS_QK_K; k += 8)
            amax = x86_absmax(amax, _mm256_loadu_ps(xb + k));
        const float am = x86_hmax_ps(amax);
        memset(&y[i], 0, sizeof y[i]);
        if (am == 0.0f)
            continue;
        /* m: the first element of largest magnitude, with its sign */
        const __m256 amv = _mm256_set1_ps(am), sign = _mm256_set1_ps(-0.0f);
        float m = 0.0f;
        for (int k = 0; k < LMS_QK_K; k += 8) {
            const __m256 ax = _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + k));
            const int mask = _mm256_movemask_ps(_mm256_cmp_ps(ax, amv, _CMP_EQ_OQ));
            if (mask) {
                m = xb[k + __builtin_ctz((unsigned)mask)];
                break;
            }
        }
        const float iscale = -127.0f / m;
        const __m256 is = _mm256_set1_ps(iscale);
        for (int c = 0; c < LMS_QK_K / 32; c++) {
            const float *xc = xb + 32 * c;
            __m256i q[4];
            for (int k = 0; k < 4; k++)
                q[k] = x86_round_i8x8(_mm256_mul_ps(is, _mm256_loadu_ps(xc + 8 * k)));
            const __m256i q8 = x86_pack_i8x32(q[0], q[1], q[2], q[3]);
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * c), q8);
            const __m256i sums = x86_sum16_i8(q8);
            y[i].bsums[2 * c] = (int16_t)_mm256_extract_epi32(sums, 0);
            y[i].bsums[2 * c + 1] = (int16_t)_mm256_extract_epi32(sums, 4);
        }
        y[i].d = 1.0f / iscale;
    }
}

/* 8 floats -> 8 halves, round to nearest even; NaN becomes the reference's
 * quiet NaN 0x7e00 with the sign kept (vcvtps2ph would keep payload bits). */
static inline __m128i x86_f32_to_f16x8(__m256 v)
{
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i isnan =
        _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
    const __m128i qnan =
        _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)), _mm_set1_epi16(0x7e00));
    return _mm_blendv_epi8(h, qnan, isnan);
}

static inline void from_float_f16_x86(const float *x, void *vy, int64_t n)
{
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), x86_f32_to_f16x8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] = lms_f32_to_f16(x[i]);
}

/* 8 floats -> 8 bfloats as the reference: add 0x7fff + lsb, keep the top
 * half; NaN -> top half with the quiet bit set. In 32-bit lanes. */
static inline __m256i x86_f32_to_bf16x8_epi32(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                             _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(r, nan, isnan);
}

static inline void from_float_bf16_x86(const float *x, void *vy, int64_t n)
{
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i a = x86_f32_to_bf16x8_epi32(_mm256_loadu_ps(x + i));
        const __m256i b = x86_f32_to_bf16x8_epi32(_mm256_loadu_ps(x + i + 8));
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    for (; i < n; i++)
        y[i] = lms_f32_to_bf16(x[i]);
}

/* Exact except that signalling NaNs come back quiet. */
static inline void to_float_f16_x86(const void *vx, float *y, int64_t n)
{
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, x86_load_f16x8(x + i));
    for (; i < n; i++)
        y[i] = lms_f16_to_f32(x[i]);
}

static inline void to_float_bf16_x86(const void *vx, float *y, int64_t n)
{
    const uint16_t *x = vx;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, x86_load_bf16x8(x + i));
    for (; i < n; i++)
        y[i] = lms_bf16_to_f32(x[i]);
}

/* The conversion entries of an x86 kernel table (the AVX2 and AVX-512
 * tables share them). */
#define X86_CONVERSIONS                                                                     \
    .from_float = {[LMS_TYPE_F16] = from_float_f16_x86,                                     \
                   [LMS_TYPE_BF16] = from_float_bf16_x86,                                   \
                   [LMS_TYPE_Q8_0] = from_float_q8_0_x86,                                   \
                   [LMS_TYPE_Q8_1] = from_float_q8_1_x86,                                   \
                   [LMS_TYPE_Q8_K] = from_float_q8_K_x86},                                  \
    .to_float = {[LMS_TYPE_F16] = to_float_f16_x86, [LMS_TYPE_BF16] = to_float_bf16_x86},

#endif
