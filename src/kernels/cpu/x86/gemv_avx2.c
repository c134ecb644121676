/*
 * gemv_avx2.c - decode kernels for AVX2 without VNNI (lms_gemv_fn in
 * kernels.h): Q8_0 rows against one Q8_0 row, four rows at a time.
 * quant_avx2.c lists it under `gemv`.
 *
 * Central idea: per row and block the integer work is vec_dot_q8_0_q8_0's
 * (quant_x86.h: vpsignb moves the weights' signs onto the activations,
 * vpmaddubsw + vpmaddwd give exact int32 lanes). Four rows share each
 * activation load and the per-block float step: their int32 lanes are
 * folded by two levels of vphaddd into "row r in lane r" (exact integer
 * adds), the four d's become floats in one conversion, and one FMA scales
 * the four rows (vec_dot: per row and block a conversion, two half
 * conversions, a multiply, a broadcast and an FMA). kbench -d, rows in L2
 * (-k 2048 -m 384, one thread): 35.6 GB/s against vec_dot's 31.0; from
 * DRAM (-m 32768) 29.6 against 27.8 on one thread, 42.3 against 41.2 on
 * two.
 *
 * Four rows read side by side are four interleaved streams, which the
 * hardware prefetcher of the development machine (Zen 4) does not follow:
 * without software prefetch the kernel streamed from DRAM at a third of
 * vec_dot's speed. So each step prefetches the group's bytes in address
 * order Q8_PF_L2_BYTES ahead into L2 and each row's stream Q8_PF_L1_BYTES
 * ahead into L1. That keeps up only while the group's rows are short
 * (Q8_MAX_ROW_BYTES); longer rows take vec_dot, row by row.
 *
 * Q4_K and Q6_K have no AVX2 gemv: on that machine every variant tried
 * (four rows side by side with shared activation registers and scale
 * decoding, two heads per register; or the group's rows read one after
 * another with the per-block int32 lanes kept on the stack) ran at
 * vec_dot's speed from L2 (Q4_K 22.7-23.5 GB/s against 22.9, Q6_K 24-31
 * against 30), and whole-model decode (Llama-3.2-1B Q4_K_M) was at best
 * as fast and up to 25% slower: without VNNI the K-quant products are
 * bound by the per-row vpmaddubsw/vpmaddwd/vpshufb work that a group
 * cannot share, and four streams cost more than the reduction saves.
 *
 * Results equal vec_dot's within float rounding (only the order of the
 * float additions differs; tests/kernels/test_simd.c). A short last group
 * repeats its last row and stores only the real ones.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/x86/gemv_avx2.h"
#include "kernels/cpu/x86/quant_x86.h"

#define INLINE static inline __attribute__((always_inline))

#define GEMV_ROWS 4
/* Q8_0 prefetch distances: the group's bytes in address order into L2,
 * each row's stream into L1 */
#define Q8_PF_L2_BYTES 16384
#define Q8_PF_L1_BYTES 512
/* Longer rows go through vec_dot row by row: the address-order prefetch
 * falls behind the group's later rows (kbench -d -k 8192: 20 GB/s against
 * vec_dot's 25 on one thread), and one long row is a stream the hardware
 * follows. 2304 bytes: rows of up to 67 blocks (2144 columns). */
#define Q8_MAX_ROW_BYTES 2304

/* ---- shared pieces ------------------------------------------------------------------ */

/* The sums of the lanes of a, b, c, d: [sum a, sum b, sum c, sum d]. */
INLINE __m128i sum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* Rows [r0, r0 + 4) of w, the ones past n_rows repeating the last. */
INLINE void group_rows(const void *w, size_t ldw, int64_t r0, int64_t n_rows, const uint8_t *row[4])
{
    for (int k = 0; k < GEMV_ROWS; k++) {
        const int64_t r = r0 + k < n_rows ? r0 + k : n_rows - 1;
        row[k] = (const uint8_t *)w + (size_t)r * ldw;
    }
}

/* Stores the group's sums of the rows that exist. */
INLINE void store_rows(float *s, int64_t r0, int64_t n_rows, __m128 v)
{
    float t[GEMV_ROWS];
    _mm_storeu_ps(t, v);
    const int64_t nr = n_rows - r0 < GEMV_ROWS ? n_rows - r0 : GEMV_ROWS;
    memcpy(s + r0, t, (size_t)nr * sizeof *t);
}

/* Four halves as floats, gathered in a general register (the integer
 * ports are idle in these loops; vpinsrw would take the vector ones). */
INLINE __m128 halves4(uint16_t a, uint16_t b, uint16_t c, uint16_t d)
{
    const uint64_t v = a | (uint64_t)b << 16 | (uint64_t)c << 32 | (uint64_t)d << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

/* ---- Q8_0 --------------------------------------------------------------------------- */

/* One block of four Q8_0 rows against x: adds d_r * dx * sumi of each row
 * (lane r) to acc. */
INLINE __m128 q8_block4(const lms_block_q8_0 *const b[4], const lms_block_q8_0 *x, __m128 acc)
{
    const __m256i a = x86_load(x->qs);
    __m256i p[4];
    for (int r = 0; r < 4; r++) {
        /* the row's bytes ahead, past this block: byte arithmetic (not
         * an index into qs[32], which C bounds to the array) */
        x86_prefetch_l1((const char *)b[r] + offsetof(lms_block_q8_0, qs) + Q8_PF_L1_BYTES);
        p[r] = x86_dot_i8(_mm256_setzero_si256(), x86_load(b[r]->qs), a);
    }
    const __m128 d = halves4(b[0]->d, b[1]->d, b[2]->d, b[3]->d);
    const __m128 v = _mm_cvtepi32_ps(sum4_epi32(p[0], p[1], p[2], p[3]));
    return _mm_fmadd_ps(_mm_mul_ps(d, _mm_set1_ps(x86_h2f(x->d))), v, acc);
}

void gemv_q8_0_q8_0_avx2(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *vx,
                         float *s)
{
    const lms_block_q8_0 *x = vx;
    const int64_t nb = n / LMS_QK8_0;
    if (ldw > Q8_MAX_ROW_BYTES) {
        for (int64_t r = 0; r < n_rows; r++)
            vec_dot_q8_0_q8_0(n, s + r, (const uint8_t *)w + (size_t)r * ldw, vx);
        return;
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += GEMV_ROWS) {
        const uint8_t *row[GEMV_ROWS];
        group_rows(w, ldw, r0, n_rows, row);
        __m128 acc = _mm_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const lms_block_q8_0 *b[GEMV_ROWS];
            for (int k = 0; k < GEMV_ROWS; k++)
                b[k] = (const lms_block_q8_0 *)row[k] + i;
            /* 4 * 34 bytes of the group a step: a line every 64 from its start */
            const uint8_t *pf = row[0] + Q8_PF_L2_BYTES + GEMV_ROWS * (size_t)i * sizeof *x;
            for (int l = 0; l < GEMV_ROWS * (int)sizeof *x; l += 64)
                x86_prefetch_l2(pf + l);
            acc = q8_block4(b, &x[i], acc);
        }
        store_rows(s, r0, n_rows, acc);
    }
}
