/*
 * quant_avx512.c - the AVX-512 kernel table (F/BW/VL/DQ + VNNI + BF16:
 * Ice Lake / Sapphire Rapids, Zen 4 and later).
 *
 * Two kinds of kernel: the quantized dot products of quant_x86.h compiled
 * with VNNI (vpdpbusd / vpdpwssd replace the three-instruction AVX2 integer
 * sequences; still 256-bit, which keeps one 32-element block per register),
 * and 512-bit float-row kernels written here: F32 and F16 rows with FMA,
 * BF16 rows with vdpbf16ps. Row tails use masked loads, so any n works.
 *
 * vdpbf16ps treats subnormal bfloat inputs as zero and rounds its pairs
 * differently from separate multiplies and adds: results agree with the
 * reference to float rounding (tests use a relative tolerance).
 */
#include "kernels/cpu/x86/gemm_x86.h"
#include "kernels/cpu/x86/quant_x86.h"
#include "kernels/kernels_impl.h"

static inline float hsum_ps_512(__m512 v) { return _mm512_reduce_add_ps(v); }

/* Mask of the first r (< 16 or < 32) lanes. */
static inline __mmask16 tail16(int64_t r) { return (__mmask16)((1u << r) - 1); }

static inline __mmask32 tail32(int64_t r) { return (__mmask32)((1ull << r) - 1); }

static void vec_dot_f32_avx512(int64_t n, float *s, const void *vw, const void *vx)
{
    const float *w = vw, *x = vx;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
    if (i < n) {
        const __mmask16 m = tail16(n - i);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    *s = hsum_ps_512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static inline __m512 load_f16x16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static void vec_dot_f16_avx512(int64_t n, float *s, const void *vw, const void *vx)
{
    const uint16_t *w = vw, *x = vx;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(load_f16x16(w + i), load_f16x16(x + i), a0);
        a1 = _mm512_fmadd_ps(load_f16x16(w + i + 16), load_f16x16(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(load_f16x16(w + i + 32), load_f16x16(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(load_f16x16(w + i + 48), load_f16x16(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(load_f16x16(w + i), load_f16x16(x + i), a0);
    if (i < n) {
        const __mmask16 m = tail16(n - i);
        const __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
        const __m512 xv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
        a1 = _mm512_fmadd_ps(wv, xv, a1);
    }
    *s = hsum_ps_512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static inline __m512bh load_bf16x32(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

static void vec_dot_bf16_avx512(int64_t n, float *s, const void *vw, const void *vx)
{
    const uint16_t *w = vw, *x = vx;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm512_dpbf16_ps(a0, load_bf16x32(w + i), load_bf16x32(x + i));
        a1 = _mm512_dpbf16_ps(a1, load_bf16x32(w + i + 32), load_bf16x32(x + i + 32));
        a2 = _mm512_dpbf16_ps(a2, load_bf16x32(w + i + 64), load_bf16x32(x + i + 64));
        a3 = _mm512_dpbf16_ps(a3, load_bf16x32(w + i + 96), load_bf16x32(x + i + 96));
    }
    for (; i + 32 <= n; i += 32)
        a0 = _mm512_dpbf16_ps(a0, load_bf16x32(w + i), load_bf16x32(x + i));
    if (i < n) {
        const __mmask32 m = tail32(n - i);
        const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(m, w + i);
        const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x + i);
        a1 = _mm512_dpbf16_ps(a1, wv, xv);
    }
    *s = hsum_ps_512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* clang-format off */
/* Q4_K against Q8_K with 512-bit registers: two 32-byte groups of codes
 * per step (four sub-blocks: low nibbles of groups j and j+1, then their
 * high nibbles), so the decode loop issues half the instructions of the
 * 256-bit kernel for the same integer sums (exact). */
static inline __m512i join256(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static void vec_dot_q4_K_q8_K_512(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q4_K *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *qs = w[i].qs;
        const int8_t *a = x[i].qs;
        const __m128i scmn = k4_scales(w[i].scales);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scmn));
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < 4; j += 2) {
            const __m512i q = _mm512_loadu_si512(qs + 32 * j);
            const __m512i lo = _mm512_and_si512(q, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            const __m512i alo = join256(x86_load(a + 64 * j), x86_load(a + 64 * j + 64));
            const __m512i ahi = join256(x86_load(a + 64 * j + 32), x86_load(a + 64 * j + 96));
            const __m512i slo = join256(x86_scale_k(sc16, 2 * j), x86_scale_k(sc16, 2 * j + 2));
            const __m512i shi = join256(x86_scale_k(sc16, 2 * j + 1), x86_scale_k(sc16, 2 * j + 3));
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(lo, alo), slo);
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(hi, ahi), shi);
        }
        const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(sumi),
                                            _mm512_extracti64x4_epi64(sumi, 1));
        const float dx = x[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x86_h2f(w[i].d) * dx), _mm256_cvtepi32_ps(s8), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(x86_h2f(w[i].dmin) * dx),
                               _mm256_cvtepi32_ps(k4_mins(scmn, x[i].bsums)), accm);
    }
    *s = x86_hsum_ps(acc) - x86_hsum_ps(accm);
}

static const lms_kernel_table k_avx512 = {
    .isa = "avx512",
    .vec_dot = {
        [LMS_TYPE_F32] = vec_dot_f32_avx512,
        [LMS_TYPE_F16] = vec_dot_f16_avx512,
        [LMS_TYPE_BF16] = vec_dot_bf16_avx512,
        [LMS_TYPE_Q4_0] = vec_dot_q4_0_q8_0,
        [LMS_TYPE_Q5_0] = vec_dot_q5_0_q8_0,
        [LMS_TYPE_Q8_0] = vec_dot_q8_0_q8_0,
        [LMS_TYPE_Q4_1] = vec_dot_q4_1_q8_1,
        [LMS_TYPE_Q5_1] = vec_dot_q5_1_q8_1,
        [LMS_TYPE_Q2_K] = vec_dot_q2_K_q8_K,
        [LMS_TYPE_Q3_K] = vec_dot_q3_K_q8_K,
        [LMS_TYPE_Q4_K] = vec_dot_q4_K_q8_K_512,
        [LMS_TYPE_Q5_K] = vec_dot_q5_K_q8_K,
        [LMS_TYPE_Q6_K] = vec_dot_q6_K_q8_K,
    },
    .from_float = {
        [LMS_TYPE_F16] = from_float_f16_x86,
        [LMS_TYPE_BF16] = from_float_bf16_x86,
        [LMS_TYPE_Q8_0] = from_float_q8_0_x86,
        [LMS_TYPE_Q8_1] = from_float_q8_1_x86,
        [LMS_TYPE_Q8_K] = from_float_q8_K_x86,
    },
    .to_float = {
        [LMS_TYPE_F16] = to_float_f16_x86,
        [LMS_TYPE_BF16] = to_float_bf16_x86,
    },
    .gemm = {
        [LMS_TYPE_F16] = gemm_f16_f16_avx512,
        [LMS_TYPE_Q4_0] = gemm_q4_0_q8_0_avx512,
        [LMS_TYPE_Q8_0] = gemm_q8_0_q8_0_avx512,
        [LMS_TYPE_Q4_K] = gemm_q4_K_q8_K_avx512,
        [LMS_TYPE_Q5_K] = gemm_q5_K_q8_K_avx512,
        [LMS_TYPE_Q6_K] = gemm_q6_K_q8_K_avx512,
    },
};
/* clang-format on */

const lms_kernel_table *lms_kernels_avx512(void) { return &k_avx512; }
