/*
 * gemm_avx512.c - tile kernels (weight rows x tokens) for the prompt path,
 * AVX-512 BW/VL/DQ + VNNI. The contract is lms_gemm_fn's (kernels.h).
 *
 * Central idea: vec_dot unpacks a weight block (nibbles -> bytes, scales
 * decoded) for every token it meets; here each block is unpacked once into
 * registers and used against 4-8 tokens, and everything that depends on
 * the token alone (activation scales, sub-block sums, offset sums) is
 * computed once per tile into a small `aux` array that every row reads.
 * Two tokens' integer sums are folded into one vector before the float
 * scaling, halving the float work per token.
 *
 *   kernel       tile                 u8 codes (vpdpbusd)   offset handled by
 *   -----------  -------------------  --------------------  ---------------------
 *   Q4_K / Q5_K  1 row x 8 tokens     0..15 / 0..31         dmin * mins . bsums
 *   Q6_K         1 row x 8 tokens     q + 32, 0..63         -32 * sc . bsums, int32
 *   Q8_0         4 rows x 4 tokens    q + 128               -128 * sum x, int32
 *   Q4_0         4 rows x 4 tokens    q + 8                 -8 * sum x, int32
 *   F16          4 rows x 4 tokens    (float FMA)           -
 *
 * The driver loops keep a tile's tokens outermost, then a chunk of blocks
 * (so that those tokens' activations stay in L1), then the rows.
 *
 * Numerics are vec_dot's (quant_x86.h): exact int32 per super-block (or
 * per pair of 32-blocks), scaled in float lanes, summed horizontally once
 * per (row, token) and K chunk. Only the order of float additions differs,
 * which tests/kernels/test_gemm.c bounds. Measured with tools/kbench.c
 * (bench/kernels.sh): Zen 5 runs one zmm vpdpbusd/vpdpwssd/vpmaddubsw per
 * cycle (two ymm), so the K-quant inner step (4 vpdpbusd + 2 vpdpwssd per
 * token and super-block) is the bound to aim at.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/x86/gemm_x86.h"
#include "kernels/cpu/x86/quant_x86.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- shared pieces ------------------------------------------------------------ */

INLINE __m512i load512(const void *p) { return _mm512_loadu_si512(p); }

/* Writes the horizontal sums of acc[r][t] into s[t * lds + r]. */
#define STORE_TILE(acc, MR, NR, s, lds)                                                            \
    do {                                                                                           \
        for (int t_ = 0; t_ < (NR); t_++)                                                          \
            for (int r_ = 0; r_ < (MR); r_++)                                                      \
                (s)[(size_t)t_ * (lds) + r_] = _mm512_reduce_add_ps((acc)[r_][t_]);                \
    } while (0)

/* One driver per kernel: tiles of up to MR rows x NR tokens, the edge
 * tiles through the same always-inline body with smaller constants. */
#define GEMM_DRIVER(name, body, MR, NR, ...)                                                       \
    void name(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw, const void *x,  \
              size_t ldx, float *s, size_t lds)                                                    \
    {                                                                                              \
        const uint8_t *wp = w, *xp = x;                                                            \
        for (int64_t t0 = 0; t0 < n_tok; t0 += (NR)) {                                             \
            const int64_t nt = n_tok - t0 < (NR) ? n_tok - t0 : (NR);                              \
            for (int64_t r0 = 0; r0 < n_rows; r0 += (MR)) {                                        \
                const int64_t nr = n_rows - r0 < (MR) ? n_rows - r0 : (MR);                        \
                const uint8_t *wr = wp + (size_t)r0 * ldw, *xr = xp + (size_t)t0 * ldx;            \
                float *sr = s + (size_t)t0 * lds + r0;                                             \
                GEMM_SWITCH(body, MR, NR, nr, nt, n, wr, ldw, xr, ldx, sr, lds, ##__VA_ARGS__);    \
            }                                                                                      \
        }                                                                                          \
    }

#define GEMM_CASE_T(body, mr, NR, nt, ...)                                                         \
    switch (nt) {                                                                                  \
    case 1: body(__VA_ARGS__, mr, 1); break;                                                       \
    case 2: if ((NR) >= 2) body(__VA_ARGS__, mr, (NR) >= 2 ? 2 : 1); break;                        \
    case 3: if ((NR) >= 3) body(__VA_ARGS__, mr, (NR) >= 3 ? 3 : 1); break;                        \
    default: body(__VA_ARGS__, mr, (NR) >= 4 ? 4 : 1); break;                                      \
    }

#define GEMM_SWITCH(body, MR, NR, nr, nt, ...)                                                     \
    do {                                                                                           \
        if ((MR) >= 4 && nr == 4) { GEMM_CASE_T(body, (MR) >= 4 ? 4 : 1, NR, nt, __VA_ARGS__) }    \
        else if ((MR) >= 3 && nr == 3) { GEMM_CASE_T(body, (MR) >= 3 ? 3 : 1, NR, nt, __VA_ARGS__) } \
        else if ((MR) >= 2 && nr == 2) { GEMM_CASE_T(body, (MR) >= 2 ? 2 : 1, NR, nt, __VA_ARGS__) } \
        else { GEMM_CASE_T(body, 1, NR, nt, __VA_ARGS__) }                                         \
    } while (0)

/* ---- Q4_K / Q5_K / Q6_K -------------------------------------------------------------- */

/* 64 codes of chunk j (sub-blocks 2j, 2j+1) of a Q4_K/Q5_K block; h: the
 * Q5_K high bits, advanced by the call. */
INLINE __m512i k4_chunk(const uint8_t *qs, int j, __m512i *h, int has_qh)
{
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1);
    q = _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
    if (has_qh) {
        q = _mm512_or_si512(q, _mm512_and_si512(_mm512_slli_epi16(*h, 4), _mm512_set1_epi8(0x10)));
        *h = _mm512_srli_epi16(*h, 2);
    }
    return q;
}

/* ---- K-quants: one row x pairs of tokens ------------------------------------------
 *
 * Per (row, token, super-block) the integer part takes 4 vpdpbusd over the
 * 64-code chunks (int32 lanes, each a sum of 4 products, |.| < 2^15 for
 * every K-quant code range against |x| <= 127), two vpackssdw that pack
 * them exactly into int16, and 2 vpdpwssd with the sub-block scales laid
 * out to match the packing. Tokens go in pairs: the two tokens' int32
 * sums are folded into one vector (lanes 0..7 token a, 8..15 token b)
 * before the float scaling, which halves the float work per token. The
 * per-token, per-block float factors (d_x for both tokens; for Q4_K/Q5_K
 * also d_x * sub-block sums for the mins term) are computed once per tile
 * into `aux` and read by every row.
 *
 * vpackssdw works within 128-bit lanes: lane L of pack(P0, P1) holds words
 * P0[4L..4L+3] then P1[4L..4L+3]; the scale vectors below follow that. */

#define KQ_PAIRS 4       /* token pairs per tile: 8 tokens (the switch in kq_gemm) */
#define KQ_CHUNK 8       /* super-blocks per aux chunk: 8 tokens' activations in L1 */

typedef struct kq_aux {
    __m512 dx;  /* d_x of token a in lanes 0..7, of token b in 8..15 */
    __m512 bsf; /* Q4_K/Q5_K: d_x * sum of each 32-code sub-block, same layout */
} kq_aux;

/* aux[b][p] for blocks [b0, b0 + nb) and token pairs p of tokens xt[]. A
 * token past n_tok has d_x = 0 (its products are finite and vanish). */
INLINE void kq_prep(const uint8_t *const *xt, int n_tok, int64_t b0, int64_t nb, kq_aux *aux)
{
    for (int64_t b = 0; b < nb; b++)
        for (int p = 0; p < KQ_PAIRS; p++) {
            float d[2];
            __m256 bs[2];
            for (int u = 0; u < 2; u++) {
                const int t = 2 * p + u;
                const lms_block_q8_K *xb = (const lms_block_q8_K *)xt[t] + b0 + b;
                d[u] = t < n_tok ? xb->d : 0.0f;
                const __m256i s16 = _mm256_loadu_si256((const __m256i *)xb->bsums);
                bs[u] = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
            }
            const __m512 dx =
                _mm512_insertf32x8(_mm512_set1_ps(d[0]), _mm256_set1_ps(d[1]), 1);
            const __m512 bsv = _mm512_insertf32x8(_mm512_castps256_ps512(bs[0]), bs[1], 1);
            aux[b * KQ_PAIRS + p].dx = dx;
            aux[b * KQ_PAIRS + p].bsf = _mm512_mul_ps(bsv, dx);
        }
}

/* Byte-shuffle control that fills each 128-bit lane L with word wa(L) x4
 * then word wb(L) x4, wa/wb given for lanes 0-1 and lanes 2-3. */
INLINE __m512i kq_ctrl(int a01, int b01, int a23, int b23)
{
    const __m128i lo = _mm_setr_epi8(2 * a01, 2 * a01 + 1, 2 * a01, 2 * a01 + 1, 2 * a01,
                                     2 * a01 + 1, 2 * a01, 2 * a01 + 1, 2 * b01, 2 * b01 + 1,
                                     2 * b01, 2 * b01 + 1, 2 * b01, 2 * b01 + 1, 2 * b01,
                                     2 * b01 + 1);
    const __m128i hi = _mm_setr_epi8(2 * a23, 2 * a23 + 1, 2 * a23, 2 * a23 + 1, 2 * a23,
                                     2 * a23 + 1, 2 * a23, 2 * a23 + 1, 2 * b23, 2 * b23 + 1,
                                     2 * b23, 2 * b23 + 1, 2 * b23, 2 * b23 + 1, 2 * b23,
                                     2 * b23 + 1);
    const __m256i l2 = _mm256_set_m128i(lo, lo), h2 = _mm256_set_m128i(hi, hi);
    return _mm512_inserti64x4(_mm512_castsi256_si512(l2), h2, 1);
}

/* One token's int32 lanes for one super-block: 4 chunks of codes q[] x its
 * activations, packed and scaled by s01 / s23. */
INLINE __m512i kq_token(const __m512i q[4], const int8_t *xq, __m512i s01, __m512i s23)
{
    const __m512i z = _mm512_setzero_si512();
    const __m512i p0 = _mm512_dpbusd_epi32(z, q[0], load512(xq));
    const __m512i p1 = _mm512_dpbusd_epi32(z, q[1], load512(xq + 64));
    const __m512i p2 = _mm512_dpbusd_epi32(z, q[2], load512(xq + 128));
    const __m512i p3 = _mm512_dpbusd_epi32(z, q[3], load512(xq + 192));
    const __m512i a = _mm512_dpwssd_epi32(z, _mm512_packs_epi32(p0, p1), s01);
    return _mm512_dpwssd_epi32(a, _mm512_packs_epi32(p2, p3), s23);
}

/* Lanes 0..7: low + high half of a; lanes 8..15: the same of b. */
INLINE __m512i fold_pair(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, 0x44), _mm512_shuffle_i64x2(a, b, 0xEE));
}

/* The codes of one Q4_K / Q5_K super-block as 4 chunks of 64 (chunk j:
 * sub-block 2j in bytes 0..31, 2j+1 in 32..63) and its scale vectors. */
INLINE void k4_unpack(const uint8_t *blk, int has_qh, __m512i q[4], __m512i *s01, __m512i *s23,
                      __m512 *mins, __m512 *dw)
{
    const lms_block_q4_K *b = (const lms_block_q4_K *)blk;
    const uint8_t *qs = has_qh ? ((const lms_block_q5_K *)blk)->qs : b->qs;
    __m512i h = _mm512_setzero_si512();
    if (has_qh) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)((const lms_block_q5_K *)blk)->qh);
        h = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 1), 1);
    }
    for (int j = 0; j < 4; j++)
        q[j] = k4_chunk(qs, j, &h, has_qh);
    const __m128i scmn = k4_scales(b->scales);
    const __m512i sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(scmn));
    /* pack(P0,P1) lane L: sub-blocks (0,2) for L < 2, (1,3) for L >= 2 */
    *s01 = _mm512_shuffle_epi8(sc, kq_ctrl(0, 2, 1, 3));
    *s23 = _mm512_shuffle_epi8(sc, kq_ctrl(4, 6, 5, 7));
    const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(scmn, scmn)));
    *mins = _mm512_broadcast_f32x8(_mm256_mul_ps(mnf, _mm256_set1_ps(x86_h2f(b->dmin))));
    *dw = _mm512_set1_ps(x86_h2f(b->d));
}

/* The codes of one Q6_K super-block as u = q + 32 in 4 chunks of 64
 * (chunk j: elements 64j..64j+63, sub-blocks 4j..4j+3), its scale vectors
 * and the -32 offset as int16 scales for the bsums. */
INLINE void q6_unpack(const lms_block_q6_K *b, __m512i q[4], __m512i *s01, __m512i *s23,
                      __m512i *corr, __m512 *dw)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int hf = 0; hf < 2; hf++) {
        const __m512i ql = load512(b->ql + 64 * hf);
        const __m512i qh =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * hf)));
        q[2 * hf] = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                    _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m2));
        q[2 * hf + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                        _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m2));
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    const __m512i lo = _mm512_broadcast_i32x4(_mm256_castsi256_si128(sc16));
    const __m512i hi = _mm512_broadcast_i32x4(_mm256_extracti128_si256(sc16, 1));
    /* pack(P0,P1) lane L: sub-blocks L and 4 + L; pack(P2,P3): 8 + L, 12 + L */
    const __m512i c = kq_ctrl(0, 4, 0, 4), c1 = kq_ctrl(1, 5, 1, 5);
    const __m512i c2 = kq_ctrl(2, 6, 2, 6), c3 = kq_ctrl(3, 7, 3, 7);
    const __mmask64 l1 = 0x00000000FFFF0000ull, l2 = 0x0000FFFF00000000ull,
                    l3 = 0xFFFF000000000000ull;
    __m512i v = _mm512_shuffle_epi8(lo, c);
    v = _mm512_mask_shuffle_epi8(v, l1, lo, c1);
    v = _mm512_mask_shuffle_epi8(v, l2, lo, c2);
    *s01 = _mm512_mask_shuffle_epi8(v, l3, lo, c3);
    v = _mm512_shuffle_epi8(hi, c);
    v = _mm512_mask_shuffle_epi8(v, l1, hi, c1);
    v = _mm512_mask_shuffle_epi8(v, l2, hi, c2);
    *s23 = _mm512_mask_shuffle_epi8(v, l3, hi, c3);
    *corr = _mm512_zextsi256_si512(_mm256_mullo_epi16(sc16, _mm256_set1_epi16(-32)));
    *dw = _mm512_set1_ps(x86_h2f(b->d));
}

/* kind: 0 Q4_K, 1 Q5_K, 2 Q6_K. One weight row against NP token pairs over
 * blocks [b0, b0 + nb); adds (or stores) into s[t * lds]. */
INLINE void kq_row(const uint8_t *wrow, int kind, int64_t b0, int64_t nb,
                   const uint8_t *const *xt, const kq_aux *aux, float *s, size_t lds, int n_tok,
                   int add, const int NP)
{
    const size_t bw = kind == 0 ? sizeof(lms_block_q4_K)
                      : kind == 1 ? sizeof(lms_block_q5_K) : sizeof(lms_block_q6_K);
    __m512 acc[KQ_PAIRS];
    for (int p = 0; p < NP; p++)
        acc[p] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + (size_t)(b0 + b) * bw;
        __m512i q[4], s01, s23, corr = _mm512_setzero_si512();
        __m512 mins = _mm512_setzero_ps(), dw;
        if (kind == 2)
            q6_unpack((const lms_block_q6_K *)blk, q, &s01, &s23, &corr, &dw);
        else
            k4_unpack(blk, kind == 1, q, &s01, &s23, &mins, &dw);
        const kq_aux *ax = aux + b * KQ_PAIRS;
        for (int p = 0; p < NP; p++) {
            __m512i si[2];
            for (int u = 0; u < 2; u++) {
                const lms_block_q8_K *xb = (const lms_block_q8_K *)xt[2 * p + u] + b0 + b;
                si[u] = kq_token(q, xb->qs, s01, s23);
                if (kind == 2) {
                    const __m512i bs =
                        _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)xb->bsums));
                    si[u] = _mm512_dpwssd_epi32(si[u], bs, corr);
                }
            }
            const __m512 f = _mm512_cvtepi32_ps(fold_pair(si[0], si[1]));
            acc[p] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, ax[p].dx), acc[p]);
            if (kind != 2)
                acc[p] = _mm512_fnmadd_ps(mins, ax[p].bsf, acc[p]);
        }
    }
    for (int p = 0; p < NP; p++)
        for (int u = 0; u < 2; u++) {
            const int t = 2 * p + u;
            if (t >= n_tok)
                break;
            const __m256 h = u ? _mm512_extractf32x8_ps(acc[p], 1) : _mm512_castps512_ps256(acc[p]);
            const float v = x86_hsum_ps(h);
            s[(size_t)t * lds] = add ? s[(size_t)t * lds] + v : v;
        }
}

INLINE void kq_gemm(int kind, int64_t n, int64_t n_rows, int64_t n_tok, const void *w,
                    size_t ldw, const void *x, size_t ldx, float *s, size_t lds)
{
    kq_aux aux[KQ_CHUNK * KQ_PAIRS];
    const int64_t nb = n / LMS_QK_K;
    for (int64_t t0 = 0; t0 < n_tok; t0 += 2 * KQ_PAIRS) {
        const int nt = n_tok - t0 < 2 * KQ_PAIRS ? (int)(n_tok - t0) : 2 * KQ_PAIRS;
        const int np = (nt + 1) / 2;
        const uint8_t *xt[2 * KQ_PAIRS];
        for (int t = 0; t < 2 * KQ_PAIRS; t++)
            xt[t] = (const uint8_t *)x + (size_t)(t0 + (t < nt ? t : nt - 1)) * ldx;
        for (int64_t b0 = 0; b0 < nb; b0 += KQ_CHUNK) {
            const int64_t nbc = nb - b0 < KQ_CHUNK ? nb - b0 : KQ_CHUNK;
            kq_prep(xt, nt, b0, nbc, aux);
            for (int64_t r = 0; r < n_rows; r++) {
                const uint8_t *wr = (const uint8_t *)w + (size_t)r * ldw;
                float *sr = s + (size_t)t0 * lds + r;
                const int add = b0 > 0;
                switch (np) {
                case 1: kq_row(wr, kind, b0, nbc, xt, aux, sr, lds, nt, add, 1); break;
                case 2: kq_row(wr, kind, b0, nbc, xt, aux, sr, lds, nt, add, 2); break;
                case 3: kq_row(wr, kind, b0, nbc, xt, aux, sr, lds, nt, add, 3); break;
                default: kq_row(wr, kind, b0, nbc, xt, aux, sr, lds, nt, add, 4); break;
                }
            }
        }
    }
}

void gemm_q4_K_q8_K_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds)
{
    kq_gemm(0, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

void gemm_q5_K_q8_K_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds)
{
    kq_gemm(1, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

void gemm_q6_K_q8_K_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds)
{
    kq_gemm(2, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

/* Unsigned weight codes (q + off) of blocks 2p and 2p+1 (only 2p if `one`). */
INLINE __m512i q8_0_pair(const lms_block_q8_0 *b, int one)
{
    const __m256i lo = _mm256_loadu_si256((const __m256i *)b[0].qs);
    const __m256i hi = one ? _mm256_set1_epi8(-128) : _mm256_loadu_si256((const __m256i *)b[1].qs);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_xor_si512(v, _mm512_set1_epi8(-128));
}

INLINE __m512i q4_0_pair(const lms_block_q4_0 *b, int one)
{
    const __m128i a = _mm_loadu_si128((const __m128i *)b[0].qs);
    const __m128i c = one ? _mm_setzero_si128() : _mm_loadu_si128((const __m128i *)b[1].qs);
    const __m256i lo = _mm256_set_m128i(_mm_srli_epi16(a, 4), a);
    const __m256i hi = _mm256_set_m128i(_mm_srli_epi16(c, 4), c);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
}

/* ---- Q8_0 and Q4_0: pairs of 32-blocks per zmm ------------------------------------
 *
 * Per (row, token, pair of blocks): one vpdpbusd of the unsigned weight
 * codes (q + 128 for Q8_0, q + 8 for Q4_0) with the activations, starting
 * from -offset * (sums of 4 activations), which makes the int32 lanes exact
 * signed sums. Two tokens' lanes are then folded into one vector (lanes
 * 0..3 block a, 4..7 block b of token 0; 8..15 the same of token 1) before
 * the float scaling. The activation side (codes of both blocks side by
 * side, the offset sums, d_x laid out as the fold) is prepared once per
 * tile in `aux` and read by every row. */

#define Q8_PAIRS 2  /* token pairs per tile */
#define Q8_ROWS 4   /* weight rows per tile */
#define Q8_CHUNK 16 /* block pairs per aux chunk */

typedef struct q8_aux {
    __m512i xv[2]; /* codes of blocks a, b of tokens 0, 1 */
    __m512i nc[2]; /* -offset * sums of 4 codes */
    __m512 dx;     /* d_x: a(t0) x4, b(t0) x4, a(t1) x4, b(t1) x4 */
} q8_aux;

/* Lanes: a x4, b x4, c x4, e x4. */
INLINE __m512 four_by4(float a, float b, float c, float e)
{
    const __m512 v = _mm512_castps128_ps512(_mm_setr_ps(a, b, c, e));
    return _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), v);
}

INLINE void q8_prep(const uint8_t *const *xt, int n_tok, int64_t pb0, int64_t npb, int64_t nb,
                    __m512i off, q8_aux *aux)
{
    for (int64_t pb = 0; pb < npb; pb++) {
        const int64_t i = 2 * (pb0 + pb);
        const int one = i + 1 == nb;
        for (int p = 0; p < Q8_PAIRS; p++) {
            q8_aux *a = &aux[pb * Q8_PAIRS + p];
            float d[2][2];
            for (int u = 0; u < 2; u++) {
                const int t = 2 * p + u;
                const lms_block_q8_0 *xb = (const lms_block_q8_0 *)xt[t] + i;
                if (t >= n_tok) {
                    a->xv[u] = _mm512_setzero_si512();
                    d[u][0] = d[u][1] = 0.0f;
                } else {
                    const __m256i lo = _mm256_loadu_si256((const __m256i *)xb[0].qs);
                    const __m256i hi =
                        one ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)xb[1].qs);
                    a->xv[u] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                    d[u][0] = x86_h2f(xb[0].d);
                    d[u][1] = one ? 0.0f : x86_h2f(xb[1].d);
                }
                a->nc[u] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, a->xv[u]));
            }
            a->dx = four_by4(d[0][0], d[0][1], d[1][0], d[1][1]);
        }
    }
}

/* MR rows x NP token pairs over block pairs [pb0, pb0 + npb). */
INLINE void q8_rows(const uint8_t *w, size_t ldw, int is_q4, int64_t pb0, int64_t npb, int64_t nb,
                    const q8_aux *aux, float *s, size_t lds, int n_tok, int add, const int MR,
                    const int NP)
{
    const size_t bw = is_q4 ? sizeof(lms_block_q4_0) : sizeof(lms_block_q8_0);
    __m512 acc[Q8_ROWS][Q8_PAIRS];
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++)
            acc[r][p] = _mm512_setzero_ps();
    for (int64_t pb = 0; pb < npb; pb++) {
        const int64_t i = 2 * (pb0 + pb);
        const int one = i + 1 == nb;
        __m512i u[Q8_ROWS];
        __m512 dw[Q8_ROWS];
        for (int r = 0; r < MR; r++) {
            const uint8_t *wb = w + (size_t)r * ldw + (size_t)i * bw;
            float da, db;
            if (is_q4) {
                const lms_block_q4_0 *b = (const lms_block_q4_0 *)wb;
                u[r] = q4_0_pair(b, one);
                da = x86_h2f(b[0].d), db = one ? 0.0f : x86_h2f(b[1].d);
            } else {
                const lms_block_q8_0 *b = (const lms_block_q8_0 *)wb;
                u[r] = q8_0_pair(b, one);
                da = x86_h2f(b[0].d), db = one ? 0.0f : x86_h2f(b[1].d);
            }
            dw[r] = four_by4(da, db, da, db);
        }
        for (int p = 0; p < NP; p++) {
            const q8_aux *a = &aux[pb * Q8_PAIRS + p];
            for (int r = 0; r < MR; r++) {
                const __m512i p0 = _mm512_dpbusd_epi32(a->nc[0], u[r], a->xv[0]);
                const __m512i p1 = _mm512_dpbusd_epi32(a->nc[1], u[r], a->xv[1]);
                const __m512i f = _mm512_add_epi32(_mm512_shuffle_i64x2(p0, p1, 0x88),
                                                   _mm512_shuffle_i64x2(p0, p1, 0xDD));
                acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(f), _mm512_mul_ps(dw[r], a->dx),
                                            acc[r][p]);
            }
        }
    }
    for (int r = 0; r < MR; r++)
        for (int p = 0; p < NP; p++)
            for (int v = 0; v < 2; v++) {
                const int t = 2 * p + v;
                if (t >= n_tok)
                    break;
                const __m256 h = v ? _mm512_extractf32x8_ps(acc[r][p], 1)
                                   : _mm512_castps512_ps256(acc[r][p]);
                const float x = x86_hsum_ps(h);
                float *o = &s[(size_t)t * lds + r];
                *o = add ? *o + x : x;
            }
}

INLINE void q8_gemm(int is_q4, int64_t n, int64_t n_rows, int64_t n_tok, const void *w,
                    size_t ldw, const void *x, size_t ldx, float *s, size_t lds)
{
    q8_aux aux[Q8_CHUNK * Q8_PAIRS];
    const int64_t nb = n / LMS_QK8_0, npb_all = (nb + 1) / 2;
    const __m512i off = _mm512_set1_epi8(is_q4 ? 8 : -128);
    for (int64_t t0 = 0; t0 < n_tok; t0 += 2 * Q8_PAIRS) {
        const int nt = n_tok - t0 < 2 * Q8_PAIRS ? (int)(n_tok - t0) : 2 * Q8_PAIRS;
        const int np = (nt + 1) / 2;
        const uint8_t *xt[2 * Q8_PAIRS];
        for (int t = 0; t < 2 * Q8_PAIRS; t++)
            xt[t] = (const uint8_t *)x + (size_t)(t0 + (t < nt ? t : nt - 1)) * ldx;
        for (int64_t pb0 = 0; pb0 < npb_all; pb0 += Q8_CHUNK) {
            const int64_t npb = npb_all - pb0 < Q8_CHUNK ? npb_all - pb0 : Q8_CHUNK;
            const int add = pb0 > 0;
            q8_prep(xt, nt, pb0, npb, nb, off, aux);
            for (int64_t r0 = 0; r0 < n_rows; r0 += Q8_ROWS) {
                const int64_t nr = n_rows - r0 < Q8_ROWS ? n_rows - r0 : Q8_ROWS;
                const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * ldw;
                float *sr = s + (size_t)t0 * lds + r0;
#define Q8_ROWS_CALL(mr)                                                                           \
    do {                                                                                           \
        if (np == 1)                                                                               \
            q8_rows(wr, ldw, is_q4, pb0, npb, nb, aux, sr, lds, nt, add, mr, 1);                   \
        else                                                                                       \
            q8_rows(wr, ldw, is_q4, pb0, npb, nb, aux, sr, lds, nt, add, mr, 2);                   \
    } while (0)
                switch (nr) {
                case 1: Q8_ROWS_CALL(1); break;
                case 2: Q8_ROWS_CALL(2); break;
                case 3: Q8_ROWS_CALL(3); break;
                default: Q8_ROWS_CALL(4); break;
                }
#undef Q8_ROWS_CALL
            }
        }
    }
}

void gemm_q8_0_q8_0_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds)
{
    q8_gemm(0, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

void gemm_q4_0_q8_0_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds)
{
    q8_gemm(1, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

/* ---- F16 ------------------------------------------------------------------------- */

INLINE void f16_tile(int64_t n, const uint8_t *w, size_t ldw, const uint8_t *x, size_t ldx,
                     float *s, size_t lds, const int MR, const int NR)
{
    __m512 acc[4][4];
    for (int r = 0; r < MR; r++)
        for (int t = 0; t < NR; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 xv[4];
        for (int t = 0; t < NR; t++)
            xv[t] = _mm512_cvtph_ps(
                _mm256_maskz_loadu_epi16(m, (const uint16_t *)(x + (size_t)t * ldx) + i));
        for (int r = 0; r < MR; r++) {
            const __m512 wv = _mm512_cvtph_ps(
                _mm256_maskz_loadu_epi16(m, (const uint16_t *)(w + (size_t)r * ldw) + i));
            for (int t = 0; t < NR; t++)
                acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
        }
    }
    STORE_TILE(acc, MR, NR, s, lds);
}

#define F16_BODY(n, w, ldw, x, ldx, s, lds, MR, NR) f16_tile(n, w, ldw, x, ldx, s, lds, MR, NR)

GEMM_DRIVER(gemm_f16_f16_avx512, F16_BODY, 4, 4)
