/*
 * iq4_avx2.c - IQ4_XS prompt tiles (lms_gemm_fn, kernels.h) for AVX2
 * without VNNI; listed by the AVX2 table in quant_avx2.c.
 *
 * Central idea: vec_dot_iq4_xs_q8_K (quant_x86.h) spends most of its work
 * per 32 weights on the weight side: splitting nibbles, the table lookup
 * and the absolute values. Here each weight block is unpacked once for up
 * to GEMM_NT tokens, whose part per 32 weights is what is left: vpsignb of
 * the activations by the values' signs, vpmaddubsw (|value| <= 127 and
 * |activation| <= 127, so a pair never saturates int16) and vpmaddwd by
 * the sub-block scale. Activations are read in place (Q8_K rows need no
 * rearranging for 256-bit lanes).
 *
 * Numerics as vec_dot: exact int32 per super-block, d * d_x in float;
 * only the order of float additions differs (tests/kernels/test_gemm.c).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/x86/iq4_x86.h"
#include "kernels/cpu/x86/quant_x86.h"

#define INLINE static inline __attribute__((always_inline))

#define GEMM_NT 4 /* tokens per pass: 2 * GEMM_NT accumulators + 4 temporaries in 16 ymm */

/* Row w (nb super-blocks) against NT activation rows x[t]: the NT dot
 * products into s[t * lds]. */
INLINE void row_tokens(const lms_block_iq4_xs *w, int64_t nb, const lms_block_q8_K *const *x,
                       float *s, size_t lds, const int NT)
{
    const __m256i tbl = x86_iq4_table();
    __m256 acc[GEMM_NT];
    for (int t = 0; t < NT; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(iq4_xs_scales(&w[i])));
        __m256i sum[GEMM_NT];
        for (int t = 0; t < NT; t++)
            sum[t] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const __m256i v = x86_iq4_values32(tbl, w[i].qs + 16 * j);
            const __m256i av = _mm256_sign_epi8(v, v);
            const __m256i sc = x86_scale_k(sc16, j);
            for (int t = 0; t < NT; t++) {
                const __m256i a = _mm256_sign_epi8(x86_load(x[t][i].qs + 32 * j), v);
                sum[t] = x86_dpwssd(sum[t], _mm256_maddubs_epi16(av, a), sc);
            }
        }
        const float dw = x86_h2f(w[i].d);
        for (int t = 0; t < NT; t++)
            acc[t] =
                _mm256_fmadd_ps(_mm256_set1_ps(dw * x[t][i].d), _mm256_cvtepi32_ps(sum[t]), acc[t]);
    }
    for (int t = 0; t < NT; t++)
        s[(size_t)t * lds] = x86_hsum_ps(acc[t]);
}

void gemm_iq4_xs_q8_K_avx2(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds)
{
    const int64_t nb = n / LMS_QK_K;
    for (int64_t t0 = 0; t0 < n_tok; t0 += GEMM_NT) {
        const int nt = n_tok - t0 < GEMM_NT ? (int)(n_tok - t0) : GEMM_NT;
        const lms_block_q8_K *xr[GEMM_NT];
        for (int t = 0; t < nt; t++)
            xr[t] = (const lms_block_q8_K *)((const uint8_t *)x + (size_t)(t0 + t) * ldx);
        for (int64_t r = 0; r < n_rows; r++) {
            const lms_block_iq4_xs *wr =
                (const lms_block_iq4_xs *)((const uint8_t *)w + (size_t)r * ldw);
            float *sr = s + (size_t)t0 * lds + (size_t)r;
            switch (nt) {
            case 1: row_tokens(wr, nb, xr, sr, lds, 1); break;
            case 2: row_tokens(wr, nb, xr, sr, lds, 2); break;
            case 3: row_tokens(wr, nb, xr, sr, lds, 3); break;
            default: row_tokens(wr, nb, xr, sr, lds, GEMM_NT); break;
            }
        }
    }
}
