/*
 * gemm_avx2.c - tile kernels (weight rows x tokens) for the prompt path on
 * AVX2 (no VNNI): Q4_K and Q6_K against Q8_K. The contract is lms_gemm_fn's
 * (kernels.h); the AVX-512 tiles are in gemm_avx512.c.
 *
 * Central idea: vec_dot_q4_K_q8_K (quant_x86.h) unpacks a super-block's
 * nibbles and broadcasts its sub-block scales for every token it meets;
 * here one row's block is unpacked once, one 32-code sub-block pair at a
 * time, and used against up to 4 tokens. Per token and 32 codes that
 * leaves vpmaddubsw (u8 codes x i8 activations, pairs <= 2 * 15 * 127, no
 * saturation) and vpmaddwd + vpaddd with the sub-block scale: the exact
 * int32 sum of vec_dot. The mins term (dmin * mins . bsums) and the float
 * scaling are per token and block, as in vec_dot; only the order of the
 * float additions differs (tests/kernels/test_gemm.c bounds it). Q6_K
 * likewise, with vec_dot_q6_K_q8_K's unsigned codes and offset term.
 *
 * The driver keeps a group of 4 tokens outermost, then a chunk of blocks
 * (their activations, 4 x 16 x 292 bytes, stay in L1), then the rows.
 */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/cpu/x86/gemm_x86.h"
#include "kernels/cpu/x86/quant_x86.h"

#define INLINE static inline __attribute__((always_inline))

#define Q4K2_TOK 4    /* tokens per tile */
#define Q4K2_CHUNK 16 /* super-blocks per chunk */

/* Row w (blocks [b0, b0 + nb)) against NT tokens x[t] (Q8_K rows); the
 * NT sums are stored into s[t * lds] (add: added to them). */
INLINE void q4k_row_avx2(const lms_block_q4_K *w, const lms_block_q8_K *const *x, int64_t b0,
                         int64_t nb, float *s, size_t lds, int add, const int NT)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[Q4K2_TOK];
    for (int t = 0; t < NT; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t i = b0; i < b0 + nb; i++) {
        const __m128i scmn = k4_scales(w[i].scales);
        const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scmn));
        /* mins as int16 pairs (mn[s], mn[s]) against bsums[2s], bsums[2s+1] */
        const __m128i m8 = _mm_unpackhi_epi64(scmn, scmn);
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m256i sumi[Q4K2_TOK];
        for (int t = 0; t < NT; t++)
            sumi[t] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = x86_load(w[i].qs + 32 * j);
            const __m256i lo = _mm256_and_si256(q, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i slo = x86_scale_k(sc16, 2 * j), shi = x86_scale_k(sc16, 2 * j + 1);
            for (int t = 0; t < NT; t++) {
                const int8_t *a = x[t][i].qs + 64 * j;
                const __m256i p0 = _mm256_maddubs_epi16(lo, x86_load(a));
                const __m256i p1 = _mm256_maddubs_epi16(hi, x86_load(a + 32));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(_mm256_madd_epi16(p0, slo),
                                                                     _mm256_madd_epi16(p1, shi)));
            }
        }
        const float d = x86_h2f(w[i].d), dmin = x86_h2f(w[i].dmin);
        for (int t = 0; t < NT; t++) {
            const float dx = x[t][i].d;
            const __m256i summ = _mm256_madd_epi16(x86_load(x[t][i].bsums), mn16);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * dx), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(summ), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        const float v = x86_hsum_ps(acc[t]);
        s[(size_t)t * lds] = add ? s[(size_t)t * lds] + v : v;
    }
}

/* Row w (Q6_K, blocks [b0, b0 + nb)) against NT tokens, as q4k_row_avx2.
 * The unsigned codes u = q + 32 (0..63) go through vpmaddubsw (pairs <=
 * 2 * 63 * 127); the -32 comes back per token as 32 * sc . bsums, as in
 * vec_dot_q6_K_q8_K (quant_x86.h). */
INLINE void q6k_row_avx2(const lms_block_q6_K *w, const lms_block_q8_K *const *x, int64_t b0,
                         int64_t nb, float *s, size_t lds, int add, const int NT)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    __m256 acc[Q4K2_TOK];
    for (int t = 0; t < NT; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t i = b0; i < b0 + nb; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[i].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const __m256i eo = x86_scales_eo(sc8);
        __m256i sumi[Q4K2_TOK];
        for (int t = 0; t < NT; t++)
            sumi[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = x86_load(w[i].ql + 64 * h), ql1 = x86_load(w[i].ql + 64 * h + 32);
            const __m256i qh = x86_load(w[i].qh + 32 * h);
            for (int g = 0; g < 4; g++) {
                /* codes 32g..32g+31 of this half: a nibble of ql0 or ql1, two bits of qh */
                const __m256i ql = g & 1 ? ql1 : ql0;
                const __m256i lo = _mm256_and_si256(g < 2 ? ql : _mm256_srli_epi16(ql, 4), m4);
                const __m256i hb = g == 0   ? _mm256_slli_epi16(qh, 4)
                                   : g == 1 ? _mm256_slli_epi16(qh, 2)
                                   : g == 2 ? qh
                                            : _mm256_srli_epi16(qh, 2);
                const __m256i u = _mm256_or_si256(lo, _mm256_and_si256(hb, m2));
                const __m256i sc = x86_scale_k(eo, 4 * h + g);
                for (int t = 0; t < NT; t++) {
                    const __m256i p =
                        _mm256_maddubs_epi16(u, x86_load(x[t][i].qs + 128 * h + 32 * g));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, sc));
                }
            }
        }
        const float d = x86_h2f(w[i].d);
        for (int t = 0; t < NT; t++) {
            const __m256i corr = _mm256_madd_epi16(x86_load(x[t][i].bsums), sc16);
            const __m256i v = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(corr, 5));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * x[t][i].d), _mm256_cvtepi32_ps(v), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        const float v = x86_hsum_ps(acc[t]);
        s[(size_t)t * lds] = add ? s[(size_t)t * lds] + v : v;
    }
}

/* Tiles of Q4K2_TOK tokens; for each, chunks of blocks; for each, every
 * row. is_q6: Q6_K rows, else Q4_K. */
INLINE void kq_gemm_avx2(int is_q6, int64_t n, int64_t n_rows, int64_t n_tok, const void *w,
                         size_t ldw, const void *x, size_t ldx, float *s, size_t lds)
{
    const int64_t nb = n / LMS_QK_K;
    for (int64_t t0 = 0; t0 < n_tok; t0 += Q4K2_TOK) {
        const int nt = n_tok - t0 < Q4K2_TOK ? (int)(n_tok - t0) : Q4K2_TOK;
        const lms_block_q8_K *xt[Q4K2_TOK];
        for (int t = 0; t < Q4K2_TOK; t++)
            xt[t] = (const lms_block_q8_K *)((const uint8_t *)x +
                                             (size_t)(t0 + (t < nt ? t : 0)) * ldx);
        for (int64_t b0 = 0; b0 < nb; b0 += Q4K2_CHUNK) {
            const int64_t nbc = nb - b0 < Q4K2_CHUNK ? nb - b0 : Q4K2_CHUNK;
            const int add = b0 > 0;
            for (int64_t r = 0; r < n_rows; r++) {
                const void *wr = (const uint8_t *)w + (size_t)r * ldw;
                float *sr = s + (size_t)t0 * lds + r;
#define KQ2_ROW(nt_)                                                                               \
    do {                                                                                           \
        if (is_q6)                                                                                 \
            q6k_row_avx2(wr, xt, b0, nbc, sr, lds, add, nt_);                                      \
        else                                                                                       \
            q4k_row_avx2(wr, xt, b0, nbc, sr, lds, add, nt_);                                      \
    } while (0)
                switch (nt) {
                case 1: KQ2_ROW(1); break;
                case 2: KQ2_ROW(2); break;
                case 3: KQ2_ROW(3); break;
                default: KQ2_ROW(4); break;
                }
#undef KQ2_ROW
            }
        }
    }
}

void gemm_q4_K_q8_K_avx2(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds)
{
    kq_gemm_avx2(0, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

void gemm_q6_K_q8_K_avx2(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds)
{
    kq_gemm_avx2(1, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}
