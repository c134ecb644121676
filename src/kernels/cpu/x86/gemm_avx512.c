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
 *   Q4_K / Q5_K  1 row x 16 tokens    0..15 / 0..31         dmin * mins . bsums
 *   Q6_K         1 row x 16 tokens    x + 128 (q - 32 s8)   -128 * sum q, int32
 *   Q8_0         4 rows x 4 tokens    q + 128               -128 * sum x, int32
 *   Q4_0         4 rows x 4 tokens    q + 8                 -8 * sum x, int32
 *   IQ4_NL       4 rows x 4 tokens    value + 128 (vpshufb) -128 * sum x, int32
 *   F16          4 rows x 6 tokens    (float FMA)           -
 *
 * The driver loops keep a tile's tokens outermost, then a chunk of blocks
 * (so that those tokens' activations stay in L1), then the rows.
 *
 * Numerics are vec_dot's (quant_x86.h): exact int32 per super-block (or
 * per pair of 32-blocks), scaled in float lanes, summed horizontally once
 * per (row, token) and K chunk. Only the order of float additions differs,
 * which tests/kernels/test_gemm.c bounds. Measured with tools/kbench.c
 * (bench/kernels.sh): the development machine's Zen 4 (family 19h, model
 * 11h) runs one zmm vpdpbusd/vpdpwssd/vpmaddubsw per cycle (two ymm), so
 * the K-quant inner step (4 vpdpbusd + 2 vpdpwssd per token and
 * super-block) is the bound to aim at.
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

/* ---- K-quants (Q4_K, Q5_K, Q6_K): one row x pairs of tokens ----------------------
 *
 * Codes are unpacked "by lane": a super-block's 256 codes go to 4 registers
 * R0..R3 laid out so that every 32-bit lane holds codes of one sub-block,
 * the same sub-block in all four registers; each token's activations are
 * permuted once per tile into the same order (X0..X3). Then vpdpbusd can
 * sum several registers into one int32 accumulator without mixing
 * sub-blocks: all four for Q4_K (16 codes a lane, |sum| <= 15*127*16),
 * two and two for Q5_K (8 codes, <= 31*127*8) and Q6_K (8 codes, the exact
 * signed sum (q - 32) * x, <= 32*127*8). Every lane fits int16 (q8_K
 * activations are within +-127), so one vpackssdw packs two tokens'
 * accumulators and one vpdpwssd applies the sub-block scales to both:
 *
 *   per token pair and super-block   Q4_K          Q5_K / Q6_K
 *   vpdpbusd                         8             8
 *   vpackssdw + vpdpwssd             1 + 1         2 + 2
 *
 * The result of a pair has token a in lanes 4m, 4m+1 and token b in
 * lanes 4m+2, 4m+3 of each 128-bit lane m (that is how vpackssdw
 * interleaves); four pairs are folded into one vector (kq_fold4), then
 * converted and scaled once per 8 tokens and super-block. The Q4_K/Q5_K
 * mins are exact integers too: M = sum_s min_s * bs_s (bs: the tile's
 * 32-code sums, laid out as the fold's lanes in `aux`) is one vpmaddwd and
 * one vpdpwssd per 8 tokens, merged in the float step as
 * (d * I - dmin * M) * d_x, instead of one float FMA per pair.
 *
 * Zen 4 (measured beside a stream of vpdpbusd, one zmm a cycle): vpmaddwd,
 * vpdpwssd, float FMA/mul and vpermt2q take the same pipes as vpdpbusd, a
 * full cycle each; vpternlog about a third; adds, logic, shifts, vpermw,
 * vpackssdw, vshufps, vshufi64x2, vpunpck*qdq, cvt and loads issue beside
 * it, until about one such op per two vpdpbusd. So the unpacking avoids
 * vpermt2q and the scaling keeps multiplies few.
 *
 * In the Q4_K loop for 8 tokens (batched decode: 32 vpdpbusd, 9 more
 * multiply-pipe ops and ~40 others per row and super-block, ~53 cycles)
 * removing or adding ops costs about a cycle per multiply-pipe op and a
 * third of one per other op; register moves and zero idioms are free, and
 * the activation loads are not what limits (with them gone: 2% less time;
 * two rows sharing them: more time, as the registers run out and spill).
 *
 * Layouts (qword = 8 codes, slot j = qword j of a register, m = j / 2):
 *   Q4_K/Q5_K  R_k slot j: sub-block j, codes 8k..8k+7 (lane sub-block j/2
 *              of the 32-bit lanes: 2 lanes per sub-block, 8 sub-blocks)
 *   Q6_K       R_{2g+h} slot 2m+s: codes 128g + 64s + 16m + 8h .. +7, i.e.
 *              sub-block 8g + 4s + m of 16 (R0,R1 -> acc 0, R2,R3 -> acc 1)
 * Q6_K multiplies the signed codes q - 32 with activations x + 128 (so the
 * unsigned operand of vpdpbusd is the activation) and starts each
 * accumulator at -128 * (sum of the lane's codes), once per row and block. */

#define KQ_PAIRS 8   /* token pairs per tile: 16 tokens */
#define KQ_XB 256    /* bytes of one token's permuted super-block */
#define KQ_XBLK 64   /* token super-blocks per chunk (16 KiB, in L1): 4 blocks of 16 tokens */
#define KQ_ROWS 256  /* rows per pass: their token sums wait in a 16 KiB buffer */

#define KQ_CHUNK_MAX 16 /* super-blocks per chunk at most (fewer tokens: longer chunks) */

/* The token side of one super-block, for the tile's tokens, per group of
 * 8 tokens (4 pairs) in kq_fold4's lane order: token (i % 4) + 4 * (i / 8)
 * of the group in lane i, h = (i / 4) % 2 its half. */
typedef struct kq_aux {
    /* Q4_K/Q5_K: the int16 32-code sums bs_s; words 2i, 2i+1 of bs[g][e]
     * are bs_{4h+2e} and bs_{4h+2e+1} of lane i's token */
    __m512i bs[KQ_PAIRS / 4][2];
    __m512 dx[KQ_PAIRS / 4]; /* d_x of lane i's token */
} kq_aux;

/* Source qword (of the block's 32) of slot `slot` of permuted register r. */
INLINE int kq_src_qword(int kind, int r, int slot)
{
    if (kind != 2)
        return 4 * slot + r;
    const int g = r / 2, h = r % 2, m = slot / 2, s = slot % 2;
    return 16 * g + 8 * s + 2 * m + h;
}

/* A token's 256 codes q permuted into X0..X3 (kq_src_qword) at dst, as
 * unsigned x + 128 for Q6_K. */
INLINE void kq_perm_codes(int kind, const int8_t *q, uint8_t *dst)
{
    __m512i in[4];
    for (int i = 0; i < 4; i++)
        in[i] = load512(q + 64 * i);
    for (int r = 0; r < 4; r++) {
        /* slots 0..3 come from in[0..1], 4..7 from in[2..3] (Q4_K/Q5_K), or
         * all from in[2g], in[2g+1] (Q6_K): the index is the qword mod 16 */
        long long ix[8];
        for (int j = 0; j < 8; j++)
            ix[j] = kq_src_qword(kind, r, j) % 16;
        const __m512i idx =
            _mm512_setr_epi64(ix[0], ix[1], ix[2], ix[3], ix[4], ix[5], ix[6], ix[7]);
        __m512i v;
        if (kind == 2) {
            v = _mm512_xor_si512(_mm512_permutex2var_epi64(in[r & 2], idx, in[(r & 2) + 1]),
                                 _mm512_set1_epi8(-128));
        } else {
            v = _mm512_mask_blend_epi64(0xF0, _mm512_permutex2var_epi64(in[0], idx, in[1]),
                                        _mm512_permutex2var_epi64(in[2], idx, in[3]));
        }
        _mm512_store_si512(dst + 64 * r, v);
    }
}

/* Permuted activations xp[b][t] and aux[b] for blocks [b0, b0 + nb) of
 * tokens xt[0 .. 2 * np). A token past n_tok (the odd one of the last pair)
 * has d_x = 0: its products are finite and vanish. */
INLINE void kq_prep(int kind, const uint8_t *const *xt, int n_tok, int np, int64_t b0, int64_t nb,
                    uint8_t *xp, kq_aux *aux)
{
    /* bs[g][e] lane i <- dword 2h + e of token (i % 4) + 4 * (i / 8) (kq_aux) */
    int32_t bix[2][16];
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 16; i++)
            bix[e][i] = 4 * ((i % 4) + 4 * (i / 8)) + 2 * ((i / 4) % 2) + e;
    for (int64_t b = 0; b < nb; b++) {
        /* Q4_K/Q5_K: a token's 8 32-code sums as int16 (|sum| <= 32*127), 4 dwords */
        _Alignas(64) int16_t bsp[2 * KQ_PAIRS][8] = {{0}};
        for (int t = 0; t < 2 * np; t++) {
            const lms_block_q8_K *xb = (const lms_block_q8_K *)xt[t] + b0 + b;
            kq_perm_codes(kind, xb->qs, xp + ((size_t)b * 2 * np + (size_t)t) * KQ_XB);
            if (kind != 2) {
                const __m256i b16 = _mm256_loadu_si256((const __m256i *)xb->bsums);
                const __m256i s32 = _mm256_madd_epi16(b16, _mm256_set1_epi16(1));
                _mm_store_si128((__m128i *)bsp[t],
                                _mm_packs_epi32(_mm256_castsi256_si128(s32),
                                                _mm256_extracti128_si256(s32, 1)));
            }
        }
        float d[2 * KQ_PAIRS];
        for (int t = 0; t < 2 * KQ_PAIRS; t++)
            d[t] = t < n_tok ? ((const lms_block_q8_K *)xt[t < 2 * np ? t : 0] + b0 + b)->d : 0.0f;
        for (int g = 0; g < (np + 3) / 4; g++) {
            float dx[16];
            for (int i = 0; i < 16; i++)
                dx[i] = d[8 * g + i % 4 + 4 * (i / 8)];
            aux[b].dx[g] = _mm512_loadu_ps(dx);
            if (kind == 2)
                continue;
            const __m512i lo = _mm512_load_si512(bsp[8 * g]);
            const __m512i hi = _mm512_load_si512(bsp[8 * g + 4]);
            for (int e = 0; e < 2; e++)
                aux[b].bs[g][e] = _mm512_permutex2var_epi32(lo, _mm512_loadu_si512(bix[e]), hi);
        }
    }
}

/* One super-block of a row, unpacked: codes, int16 scale vectors for the
 * packed accumulators of group 0 and 1, and the float factors. */
typedef struct kq_w {
    __m512i r[4];
    __m512i sc[2];  /* word pattern per 128-bit lane m: see kq_unpack */
    __m512i neg[2]; /* Q6_K: -128 * sum of each lane's codes of group g */
    __m512i mn[2];  /* Q4_K/Q5_K: words 2i, 2i+1 of mn[e]: min_{4h+2e}, min_{4h+2e+1}
                       of the 6-bit mins, h = (i / 4) % 2 (kq_aux.bs) */
    __m512 dw;
    __m512 dmin;    /* Q4_K/Q5_K */
} kq_w;

INLINE void kq_unpack(int kind, const uint8_t *blk, kq_w *o)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    if (kind == 2) {
        const lms_block_q6_K *b = (const lms_block_q6_K *)blk;
        const __m512i m2 = _mm512_set1_epi8(0x30), c32 = _mm512_set1_epi8(32);
        /* qh bits 0-1 / 2-3 (codes 0..31 / 32..63 of the half) up to bits 4-5,
         * bits 4-5 / 6-7 (codes 64..95 / 96..127) down: qword shifts (vpsllvw /
         * vpsrlvw cost more on Zen 4); what a neighbour byte shifts in is masked */
        const __m512i shl = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4);
        const __m512i shr = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
        __m512i q[4];
        for (int hf = 0; hf < 2; hf++) {
            const __m512i ql = load512(b->ql + 64 * hf);
            const __m512i qh =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * hf)));
            /* codes 128hf + 0..63 and 128hf + 64..127, in order */
            q[2 * hf] = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                        _mm512_and_si512(_mm512_sllv_epi64(qh, shl), m2));
            q[2 * hf + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                            _mm512_and_si512(_mm512_srlv_epi64(qh, shr), m2));
        }
        for (int g = 0; g < 2; g++) {
            const __m512i lo = _mm512_unpacklo_epi64(q[2 * g], q[2 * g + 1]);
            const __m512i hi = _mm512_unpackhi_epi64(q[2 * g], q[2 * g + 1]);
            o->r[2 * g] = _mm512_sub_epi8(lo, c32);
            o->r[2 * g + 1] = _mm512_sub_epi8(hi, c32);
            /* -128 * sum (q - 32) over the lane's 8 codes = 32768 - 128 * sum q,
             * from the codes 0..63 (a pair's sum fits a byte) */
            o->neg[g] = _mm512_dpbusd_epi32(_mm512_set1_epi32(32768), _mm512_add_epi8(lo, hi),
                                            _mm512_set1_epi8((char)0x80));
        }
        /* words of lane m: sub-blocks 8g + m, 8g + m, 8g + 4 + m, 8g + 4 + m, twice */
        const __m512i sc16 =
            _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales)));
        const __m512i i0 = _mm512_set_epi16(7, 7, 3, 3, 7, 7, 3, 3, 6, 6, 2, 2, 6, 6, 2, 2, 5, 5, 1,
                                            1, 5, 5, 1, 1, 4, 4, 0, 0, 4, 4, 0, 0);
        o->sc[0] = _mm512_permutexvar_epi16(i0, sc16);
        o->sc[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16(8)), sc16);
        o->dw = _mm512_set1_ps(x86_h2f(b->d));
        return;
    }
    const lms_block_q4_K *b = (const lms_block_q4_K *)blk;
    const uint8_t *qs = kind == 1 ? ((const lms_block_q5_K *)blk)->qs : b->qs;
    const __m512i lo = load512(qs), hi = load512(qs + 64);
    /* 128-bit lanes 0, 2 (k = 0, 1) or 1, 3 (k = 2, 3) of lo and of hi: qwords
     * k, 4 + k, 8 + k, 12 + k in the even (k even) or odd slots. vshufi64x2 and
     * vpunpck*qdq rather than one vpermt2q per register: on Zen 4 vpermt2q
     * takes the multiply pipes from vpdpbusd, these do not. The high nibbles
     * are shifted down once per pair of registers (t >> 4) */
    const __m512i t01 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i t23 = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i s01 = _mm512_srli_epi64(t01, 4), s23 = _mm512_srli_epi64(t23, 4);
    for (int k = 0; k < 4; k++) {
        /* slot j <- qword 4 * (j / 2) + k, low nibbles in even slots, high in odd */
        const __m512i t = k < 2 ? t01 : t23, ts = k < 2 ? s01 : s23;
        const __m512i v = k % 2 ? _mm512_unpackhi_epi64(t, ts) : _mm512_unpacklo_epi64(t, ts);
        o->r[k] = _mm512_and_si512(v, m4);
        if (kind == 1) {
            /* bit j of qh byte 8k + i is bit 4 of code i of sub-block j */
            uint64_t h;
            memcpy(&h, ((const lms_block_q5_K *)blk)->qh + 8 * k, 8);
            const __m512i rot = _mm512_set_epi64(61, 62, 63, 0, 1, 2, 3, 4);
            const __m512i hb = _mm512_rolv_epi64(_mm512_set1_epi64((long long)h), rot);
            o->r[k] = _mm512_or_si512(o->r[k], _mm512_and_si512(hb, _mm512_set1_epi8(0x10)));
        }
    }
    /* words 0..7 the scales, 8..15 the mins */
    const __m512i sm16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(k4_scales(b->scales)));
    /* words of lane m: sub-blocks 2m, 2m, 2m + 1, 2m + 1, twice */
    const __m512i i0 = _mm512_set_epi16(7, 7, 6, 6, 7, 7, 6, 6, 5, 5, 4, 4, 5, 5, 4, 4, 3, 3, 2,
                                        2, 3, 3, 2, 2, 1, 1, 0, 0, 1, 1, 0, 0);
    o->sc[0] = o->sc[1] = _mm512_permutexvar_epi16(i0, sm16);
    /* words 2i, 2i+1 of mn[e]: mins 4h + 2e, 4h + 2e + 1 (words 8 + ...), h = (i / 4) % 2 */
    const __m512i i1 = _mm512_set_epi16(13, 12, 13, 12, 13, 12, 13, 12, 9, 8, 9, 8, 9, 8, 9, 8,
                                        13, 12, 13, 12, 13, 12, 13, 12, 9, 8, 9, 8, 9, 8, 9, 8);
    o->mn[0] = _mm512_permutexvar_epi16(i1, sm16);
    o->mn[1] = _mm512_permutexvar_epi16(_mm512_add_epi16(i1, _mm512_set1_epi16(2)), sm16);
    /* d and dmin (adjacent halves) converted at once: lanes d, dmin, d, ... */
    uint32_t dd;
    memcpy(&dd, &b->d, sizeof dd);
    const __m512 f = _mm512_cvtph_ps(_mm256_set1_epi32((int)dd));
    o->dw = _mm512_permute_ps(f, 0x00);
    o->dmin = _mm512_permute_ps(f, 0x55);
}

/* One token's int32 accumulators for a super-block (x: its permuted codes). */
INLINE void kq_token(int kind, const kq_w *w, const uint8_t *x, __m512i acc[2])
{
    const __m512i z = _mm512_setzero_si512();
    if (kind == 2) {
        for (int g = 0; g < 2; g++)
            acc[g] = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(w->neg[g], load512(x + 128 * g), w->r[2 * g]),
                load512(x + 128 * g + 64), w->r[2 * g + 1]);
    } else if (kind == 1) {
        for (int g = 0; g < 2; g++)
            acc[g] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, w->r[2 * g], load512(x + 128 * g)),
                                         w->r[2 * g + 1], load512(x + 128 * g + 64));
    } else {
        __m512i a = _mm512_dpbusd_epi32(z, w->r[0], load512(x));
        a = _mm512_dpbusd_epi32(a, w->r[1], load512(x + 64));
        a = _mm512_dpbusd_epi32(a, w->r[2], load512(x + 128));
        acc[0] = _mm512_dpbusd_epi32(a, w->r[3], load512(x + 192));
    }
}

/* Four pairs' int32 results (lanes as the section comment) folded into one
 * vector, token (i % 4) + 4 * (i / 8) in lane i: the sub-blocks are
 * already scaled, so from here on a token's lanes only need adding. */
INLINE __m512i kq_fold4(const __m512i *ii)
{
    __m512i v[2];
    for (int h = 0; h < 2; h++) {
        const __m512 a = _mm512_castsi512_ps(ii[2 * h]), b = _mm512_castsi512_ps(ii[2 * h + 1]);
        v[h] = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(a, b, 0x88)),
                                _mm512_castps_si512(_mm512_shuffle_ps(a, b, 0xDD)));
    }
    return _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], 0x88),
                            _mm512_shuffle_i32x4(v[0], v[1], 0xDD));
}

/* The float step of one block: the folded integer sums ii (and for
 * Q4_K/Q5_K the mins) scaled into acc[]. */
INLINE void kq_float(int kind, const __m512i *ii, const kq_w *w, const kq_aux *ax, __m512 *acc,
                     const int NG)
{
    for (int g = 0; g < NG; g++) {
        const __m512 fi = _mm512_cvtepi32_ps(kq_fold4(ii + 4 * g));
        if (kind == 2) {
            acc[g] = _mm512_fmadd_ps(fi, _mm512_mul_ps(w->dw, ax->dx[g]), acc[g]);
        } else {
            /* the mins, exact: M = sum_s min_s * bs_s; then (d * I - dmin * M) * d_x */
            const __m512i m = _mm512_dpwssd_epi32(_mm512_madd_epi16(ax->bs[g][0], w->mn[0]),
                                                  ax->bs[g][1], w->mn[1]);
            const __m512 v =
                _mm512_fmsub_ps(fi, w->dw, _mm512_mul_ps(_mm512_cvtepi32_ps(m), w->dmin));
            acc[g] = _mm512_fmadd_ps(v, ax->dx[g], acc[g]);
        }
    }
}

/* kind: 0 Q4_K, 1 Q5_K, 2 Q6_K. One weight row against NP token pairs over
 * blocks [b0, b0 + nb); stores (or adds) its 16 token sums into out[].
 *
 * Software-pipelined: block b + 1 is unpacked while block b's products
 * run (in program order after them), so its loads and shuffles, which wait
 * on nothing of b, are ready when its vpdpbusd come instead of holding
 * them up. For Q4_K/Q5_K and up to 8 tokens the float step of block b
 * also waits until after block b + 1's products (`defer`); with 16 tokens
 * (more live registers) or Q6_K that did not pay. Hot, one thread, 8
 * tokens: q4_K ~4%, q6_K ~3% less time; with the cheaper unpacking above,
 * kbench -b (8 tokens from DRAM, 2 threads): q4_K 5-8%, q6_K 6-16%. */
INLINE void kq_row(const uint8_t *wrow, int kind, int64_t b0, int64_t nb, const uint8_t *xp,
                   const kq_aux *aux, float *out, int add, const uint8_t *pf1,
                   const uint8_t *pf2, const int NP)
{
    const size_t bw = kind == 0 ? sizeof(lms_block_q4_K)
                      : kind == 1 ? sizeof(lms_block_q5_K) : sizeof(lms_block_q6_K);
    const int ng = kind == 0 ? 1 : 2;
    const int NG = (NP + 3) / 4;
    const int defer = kind != 2 && NP <= 4;
    __m512 acc[KQ_PAIRS / 4];
    for (int g = 0; g < KQ_PAIRS / 4; g++)
        acc[g] = _mm512_setzero_ps();
    kq_w wn; /* block b + 1, unpacked ahead */
    kq_unpack(kind, wrow + (size_t)b0 * bw, &wn);
    kq_w wq = wn; /* with defer: block b - 1, and its integer sums iq */
    __m512i iq[KQ_PAIRS];
    for (int p = 0; p < KQ_PAIRS; p++)
        iq[p] = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++) {
        /* this block of a row ahead, into L1 (pf1) and L2 (pf2): see kq_gemm */
        for (size_t i = 0; pf1 && i < bw; i += 64)
            _mm_prefetch((const char *)pf1 + (size_t)b * bw + i, _MM_HINT_T0);
        for (size_t i = 0; pf2 && i < bw; i += 64)
            _mm_prefetch((const char *)pf2 + (size_t)b * bw + i, _MM_HINT_T1);
        const kq_w w = wn;
        const uint8_t *xb = xp + (size_t)b * 2 * NP * KQ_XB;
        __m512i ii[KQ_PAIRS];
        for (int p = 0; p < 4 * NG; p++) {
            if (p >= NP) {
                ii[p] = _mm512_setzero_si512();
                continue;
            }
            __m512i ta[2], tb[2];
            kq_token(kind, &w, xb + (size_t)(2 * p) * KQ_XB, ta);
            kq_token(kind, &w, xb + (size_t)(2 * p + 1) * KQ_XB, tb);
            /* vpmaddwd: vpdpwssd from zero without the zeroed register */
            ii[p] = _mm512_madd_epi16(_mm512_packs_epi32(ta[0], tb[0]), w.sc[0]);
            if (ng == 2)
                ii[p] = _mm512_dpwssd_epi32(ii[p], _mm512_packs_epi32(ta[1], tb[1]), w.sc[1]);
        }
        if (defer && b > 0)
            kq_float(kind, iq, &wq, aux + b - 1, acc, NG);
        if (b + 1 < nb)
            kq_unpack(kind, wrow + (size_t)(b0 + b + 1) * bw, &wn);
        if (defer) {
            wq = w;
            for (int p = 0; p < 4 * NG; p++)
                iq[p] = ii[p];
        } else {
            kq_float(kind, ii, &w, aux + b, acc, NG);
        }
    }
    if (defer)
        kq_float(kind, iq, &wq, aux + nb - 1, acc, NG);
    /* tokens 0..3 in 128-bit lanes 0 (and 1), 4..7 in 2 (and 3) of each acc[g] */
    __m512 h[2];
    for (int g = 0; g < 2; g++)
        h[g] = _mm512_add_ps(acc[g], _mm512_shuffle_f32x4(acc[g], acc[g], 0xB1));
    const __m512 v = _mm512_shuffle_f32x4(h[0], h[1], 0x88);
    _mm512_store_ps(out, add ? _mm512_add_ps(_mm512_load_ps(out), v) : v);
}

/* Tokens 0..nt-1 (nt <= 8) of 8 rows' sums (sums[r][t], rows 16 floats
 * apart) to s[t * lds + r], 8 floats a store. */
INLINE void kq_store8x8(const float *sums, float *s, size_t lds, int nt)
{
    __m256 v[8], u[8];
    for (int r = 0; r < 8; r++)
        v[r] = _mm256_load_ps(sums + 2 * KQ_PAIRS * r);
    for (int r = 0; r < 8; r += 2) {
        u[r] = _mm256_unpacklo_ps(v[r], v[r + 1]);
        u[r + 1] = _mm256_unpackhi_ps(v[r], v[r + 1]);
    }
    /* u[r], u[r + 1] (r even): rows r and r + 1 interleaved, tokens 0, 1 and
     * 2, 3 in the low 128 bits (4, 5 and 6, 7 in the high) */
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < 2; i++) {
            v[4 * q + 2 * i] = _mm256_shuffle_ps(u[4 * q + i], u[4 * q + 2 + i], 0x44);
            v[4 * q + 2 * i + 1] = _mm256_shuffle_ps(u[4 * q + i], u[4 * q + 2 + i], 0xEE);
        }
    /* v[4q + j]: token j (and j + 4 in the high 128 bits) of rows 4q..4q+3 */
    for (int t = 0; t < nt; t++) {
        const int j = t % 4;
        const __m256 c = t < 4 ? _mm256_permute2f128_ps(v[j], v[4 + j], 0x20)
                               : _mm256_permute2f128_ps(v[j], v[4 + j], 0x31);
        _mm256_storeu_ps(s + (size_t)t * lds, c);
    }
}

#define KQ_AHEAD 2    /* rows between a row's prefetch into L1 and its use */
#define KQ_AHEAD_L2 4 /* the same into L2, for rows cut into chunks */

/* Tiles of 16 tokens; for each, passes of up to KQ_ROWS rows; for each,
 * chunks of blocks whose permuted activations stay in L1 while every row
 * of the pass runs over them. Each row's 16 token sums wait in sums[]
 * (contiguous: s is strided by token, and 16 stores 4 or 8 KiB apart
 * would fight over one L1 set) until the pass is done. */
INLINE void kq_gemm(int kind, int64_t n, int64_t n_rows, int64_t n_tok, const void *w,
                    size_t ldw, const void *x, size_t ldx, float *s, size_t lds)
{
    kq_aux aux[KQ_CHUNK_MAX];
    _Alignas(64) uint8_t xp[KQ_XBLK * KQ_XB];
    _Alignas(64) float sums[KQ_ROWS][2 * KQ_PAIRS];
    const int64_t nb = n / LMS_QK_K;
    const size_t bw = kind == 0 ? sizeof(lms_block_q4_K)
                      : kind == 1 ? sizeof(lms_block_q5_K) : sizeof(lms_block_q6_K);
    for (int64_t t0 = 0; t0 < n_tok; t0 += 2 * KQ_PAIRS) {
        const int nt = n_tok - t0 < 2 * KQ_PAIRS ? (int)(n_tok - t0) : 2 * KQ_PAIRS;
        const int np = (nt + 1) / 2;
        const int64_t chunk =
            KQ_XBLK / (2 * np) < KQ_CHUNK_MAX ? KQ_XBLK / (2 * np) : KQ_CHUNK_MAX;
        const uint8_t *xt[2 * KQ_PAIRS];
        for (int t = 0; t < 2 * KQ_PAIRS; t++)
            xt[t] = (const uint8_t *)x + (size_t)(t0 + (t < nt ? t : nt - 1)) * ldx;
        for (int64_t r0 = 0; r0 < n_rows; r0 += KQ_ROWS) {
            const int64_t nr = n_rows - r0 < KQ_ROWS ? n_rows - r0 : KQ_ROWS;
            for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
                const int64_t nbc = nb - b0 < chunk ? nb - b0 : chunk;
                kq_prep(kind, xt, nt, np, b0, nbc, xp, aux);
                for (int64_t r = 0; r < nr; r++) {
                    const uint8_t *wr = (const uint8_t *)w + (size_t)(r0 + r) * ldw;
                    const int add = b0 > 0;
                    /* the weights come once from DRAM in batched decode:
                     * while row r runs, kq_row asks for the same chunk of
                     * row r + KQ_AHEAD, a block per block (spread, rather
                     * than a burst of lines at the row's start). A row cut
                     * into chunks (ffn_down: 32 blocks) is read in pieces
                     * a row apart, which the hardware prefetchers follow
                     * poorly: there row r + KQ_AHEAD_L2 is also asked into
                     * L2 (kbench -b -k 8192 -m 16384 q6_K/q4_K: ~10-15%
                     * less time; for whole rows, contiguous, it only costs) */
                    const uint8_t *pf1 =
                        r + KQ_AHEAD < nr ? wr + KQ_AHEAD * ldw + (size_t)b0 * bw : NULL;
                    const uint8_t *pf2 = nbc < nb && r + KQ_AHEAD_L2 < nr
                                             ? wr + KQ_AHEAD_L2 * ldw + (size_t)b0 * bw
                                             : NULL;
#define KQ_ROW(np_) kq_row(wr, kind, b0, nbc, xp, aux, sums[r], add, pf1, pf2, np_)
                    switch (np) {
                    case 1: KQ_ROW(1); break;
                    case 2: KQ_ROW(2); break;
                    case 3: KQ_ROW(3); break;
                    case 4: KQ_ROW(4); break;
                    case 5: KQ_ROW(5); break;
                    case 6: KQ_ROW(6); break;
                    case 7: KQ_ROW(7); break;
                    default: KQ_ROW(8); break;
                    }
#undef KQ_ROW
                }
            }
            /* up to 8 tokens: 8 x 8 transposes, scalar for the last rows */
            int64_t rt = 0;
            if (nt <= 8)
                for (; rt + 8 <= nr; rt += 8)
                    kq_store8x8(sums[rt], s + (size_t)t0 * lds + r0 + rt, lds, nt);
            for (int t = 0; t < nt; t++) {
                float *st = s + (size_t)(t0 + t) * lds + r0;
                for (int64_t r = rt; r < nr; r++)
                    st[r] = sums[r][t];
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

/* IQ4_NL: the Q4_0 nibbles of blocks 2p and 2p+1 looked up in a table of
 * value + 128 (1..241) held in every 128-bit lane. */
INLINE __m512i iq4_nl_pair(const lms_block_iq4_nl *b, int one)
{
    const __m128i t = _mm_xor_si128(_mm_loadu_si128((const __m128i *)lms_iq4_values),
                                    _mm_set1_epi8(-128));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t),
                               q4_0_pair((const lms_block_q4_0 *)(const void *)b, one));
}

/* ---- Q8_0, Q4_0 and IQ4_NL: pairs of 32-blocks per zmm -----------------------------
 *
 * Per (row, token, pair of blocks): one vpdpbusd of the unsigned weight
 * codes (q + 128 for Q8_0, q + 8 for Q4_0, value + 128 for IQ4_NL, whose
 * blocks have Q4_0's layout) with the activations, starting
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

/* Weight kinds of the kernels below. */
#define Q8K_Q8_0 0
#define Q8K_Q4_0 1
#define Q8K_IQ4_NL 2

/* MR rows x NP token pairs over block pairs [pb0, pb0 + npb). */
INLINE void q8_rows(const uint8_t *w, size_t ldw, int kind, int64_t pb0, int64_t npb, int64_t nb,
                    const q8_aux *aux, float *s, size_t lds, int n_tok, int add, const int MR,
                    const int NP)
{
    const size_t bw = kind != Q8K_Q8_0 ? sizeof(lms_block_q4_0) : sizeof(lms_block_q8_0);
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
            if (kind != Q8K_Q8_0) {
                const lms_block_q4_0 *b = (const lms_block_q4_0 *)wb;
                u[r] = kind == Q8K_Q4_0 ? q4_0_pair(b, one)
                                        : iq4_nl_pair((const lms_block_iq4_nl *)wb, one);
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

INLINE void q8_gemm(int kind, int64_t n, int64_t n_rows, int64_t n_tok, const void *w,
                    size_t ldw, const void *x, size_t ldx, float *s, size_t lds)
{
    q8_aux aux[Q8_CHUNK * Q8_PAIRS];
    const int64_t nb = n / LMS_QK8_0, npb_all = (nb + 1) / 2;
    const __m512i off = _mm512_set1_epi8(kind == Q8K_Q4_0 ? 8 : -128);
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
            q8_rows(wr, ldw, kind, pb0, npb, nb, aux, sr, lds, nt, add, mr, 1);                    \
        else                                                                                       \
            q8_rows(wr, ldw, kind, pb0, npb, nb, aux, sr, lds, nt, add, mr, 2);                    \
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
    q8_gemm(Q8K_Q8_0, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

void gemm_q4_0_q8_0_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds)
{
    q8_gemm(Q8K_Q4_0, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

void gemm_iq4_nl_q8_0_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w,
                             size_t ldw, const void *x, size_t ldx, float *s, size_t lds)
{
    q8_gemm(Q8K_IQ4_NL, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

/* ---- F16 -------------------------------------------------------------------------
 *
 * 4 rows x 6 tokens of named float accumulators (24 zmm; with the 6
 * activation vectors and one weight vector, 31 of the 32 registers).
 * The tile's activations are converted to float once per K chunk into a
 * buffer that stays in L1 (F16_KC floats a token, zero beyond n), so a
 * 16-column step is 6 loads, 4 weight conversions and 24 FMAs. Named
 * variables rather than an array: GCC keeps such an array in memory and
 * stores it every step. Partial sums of the chunks are added into s. */

#define F16_MR 4
#define F16_NR 6
#define F16_KC 1024 /* columns per chunk: 6 tokens' floats are 24 KiB */

/* Rows [0, MR) x tokens [0, NR) of the tile: accumulator a<r><t>, zeroed. */
#define F16_ACC_ROW(r)                                                                             \
    __m512 a##r##0 = _mm512_setzero_ps(), a##r##1 = a##r##0, a##r##2 = a##r##0, a##r##3 = a##r##0, \
           a##r##4 = a##r##0, a##r##5 = a##r##0

/* Row r's step: its 16 weights (from wv_expr) times every token. */
#define F16_FMA_ROW(r, wv_expr)                                                                    \
    do {                                                                                           \
        if ((r) < MR) {                                                                            \
            const __m512 wv_ = (wv_expr);                                                          \
            a##r##0 = _mm512_fmadd_ps(wv_, x0, a##r##0);                                           \
            if (NR > 1)                                                                            \
                a##r##1 = _mm512_fmadd_ps(wv_, x1, a##r##1);                                       \
            if (NR > 2)                                                                            \
                a##r##2 = _mm512_fmadd_ps(wv_, x2, a##r##2);                                       \
            if (NR > 3)                                                                            \
                a##r##3 = _mm512_fmadd_ps(wv_, x3, a##r##3);                                       \
            if (NR > 4)                                                                            \
                a##r##4 = _mm512_fmadd_ps(wv_, x4, a##r##4);                                       \
            if (NR > 5)                                                                            \
                a##r##5 = _mm512_fmadd_ps(wv_, x5, a##r##5);                                       \
        }                                                                                          \
    } while (0)

/* One 16-column step at column i; LOAD(p) converts 16 weights at p. */
#define F16_STEP(i, LOAD)                                                                          \
    do {                                                                                           \
        const __m512 x0 = _mm512_load_ps(xf + (i));                                                \
        const __m512 x1 = NR > 1 ? _mm512_load_ps(xf + 1 * F16_KC + (i)) : x0;                     \
        const __m512 x2 = NR > 2 ? _mm512_load_ps(xf + 2 * F16_KC + (i)) : x0;                     \
        const __m512 x3 = NR > 3 ? _mm512_load_ps(xf + 3 * F16_KC + (i)) : x0;                     \
        const __m512 x4 = NR > 4 ? _mm512_load_ps(xf + 4 * F16_KC + (i)) : x0;                     \
        const __m512 x5 = NR > 5 ? _mm512_load_ps(xf + 5 * F16_KC + (i)) : x0;                     \
        F16_FMA_ROW(0, LOAD(w0 + (i)));                                                            \
        F16_FMA_ROW(1, LOAD(w0 + ldw2 + (i)));                                                     \
        F16_FMA_ROW(2, LOAD(w0 + 2 * ldw2 + (i)));                                                 \
        F16_FMA_ROW(3, LOAD(w0 + 3 * ldw2 + (i)));                                                 \
    } while (0)

/* 16 halves at p (those of mask m; zero elsewhere) as floats. */
INLINE __m512 f16_load(const uint16_t *p, __mmask16 m)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

#define F16_LOAD_FULL(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))

/* The horizontal sums of a, b, c, d as one vector {sum a, sum b, sum c, sum d}. */
INLINE __m128 f16_reduce4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    /* 128-bit quarters: ab = {a0+a2, a1+a3, b0+b2, b1+b3}, likewise cd */
    const __m512 ab =
        _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 cd =
        _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    /* quarter q holds four partial sums of a, b, c, d for q = 0..3 */
    __m512 v =
        _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0x4E));
    v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0xB1)); /* every lane of quarter q: the sum */
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
}

/* Token t's MR sums into s[t * lds + 0..MR-1], stored (first chunk) or added. */
#define F16_STORE_TOK(t)                                                                           \
    do {                                                                                           \
        if ((t) < NR) {                                                                            \
            __m128 v_ = f16_reduce4(a0##t, a1##t, a2##t, a3##t);                                   \
            float *st_ = s + (size_t)(t)*lds;                                                      \
            const __mmask8 mk_ = (__mmask8)((1u << MR) - 1);                                       \
            if (!first)                                                                            \
                v_ = _mm_add_ps(v_, _mm_maskz_loadu_ps(mk_, st_));                                 \
            _mm_mask_storeu_ps(st_, mk_, v_);                                                      \
        }                                                                                          \
    } while (0)

/* Rows [0, MR) of w (columns [0, n) of the chunk) times the tile's NR
 * tokens in xf (token t at xf + t * F16_KC, zero from n to the next
 * multiple of 16). */
INLINE void f16_tile(int64_t n, const uint16_t *w0, size_t ldw2, const float *xf, float *s,
                     size_t lds, int first, const int MR, const int NR)
{
    F16_ACC_ROW(0);
    F16_ACC_ROW(1);
    F16_ACC_ROW(2);
    F16_ACC_ROW(3);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        F16_STEP(i, F16_LOAD_FULL);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
#define F16_LOAD_TAIL(p) f16_load(p, m)
        F16_STEP(i, F16_LOAD_TAIL);
#undef F16_LOAD_TAIL
    }
    F16_STORE_TOK(0);
    F16_STORE_TOK(1);
    F16_STORE_TOK(2);
    F16_STORE_TOK(3);
    F16_STORE_TOK(4);
    F16_STORE_TOK(5);
}

#define F16_CASE_T(mr, nt, ...)                                                                    \
    switch (nt) {                                                                                  \
    case 1: f16_tile(__VA_ARGS__, mr, 1); break;                                                   \
    case 2: f16_tile(__VA_ARGS__, mr, 2); break;                                                   \
    case 3: f16_tile(__VA_ARGS__, mr, 3); break;                                                   \
    case 4: f16_tile(__VA_ARGS__, mr, 4); break;                                                   \
    case 5: f16_tile(__VA_ARGS__, mr, 5); break;                                                   \
    default: f16_tile(__VA_ARGS__, mr, 6); break;                                                  \
    }

void gemm_f16_f16_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds)
{
    _Alignas(64) float xf[F16_NR * F16_KC];
    const size_t ldw2 = ldw / 2;
    for (int64_t t0 = 0; t0 < n_tok; t0 += F16_NR) {
        const int64_t nt = n_tok - t0 < F16_NR ? n_tok - t0 : F16_NR;
        for (int64_t k0 = 0; k0 < n; k0 += F16_KC) {
            const int64_t kc = n - k0 < F16_KC ? n - k0 : F16_KC;
            /* the tokens' chunk as floats, zero up to the next multiple of 16 */
            for (int64_t t = 0; t < nt; t++) {
                const uint16_t *xt =
                    (const uint16_t *)((const uint8_t *)x + (size_t)(t0 + t) * ldx) + k0;
                for (int64_t i = 0; i < kc; i += 16) {
                    const __mmask16 m =
                        kc - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (kc - i)) - 1);
                    _mm512_store_ps(xf + t * F16_KC + i,
                                    m == 0xFFFF ? F16_LOAD_FULL(xt + i) : f16_load(xt + i, m));
                }
            }
            const int first = k0 == 0;
            for (int64_t r0 = 0; r0 < n_rows; r0 += F16_MR) {
                const int64_t nr = n_rows - r0 < F16_MR ? n_rows - r0 : F16_MR;
                const uint16_t *wr = (const uint16_t *)((const uint8_t *)w + (size_t)r0 * ldw) + k0;
                float *sr = s + (size_t)t0 * lds + r0;
                switch (nr) {
                case 4: F16_CASE_T(4, nt, kc, wr, ldw2, xf, sr, lds, first) break;
                case 3: F16_CASE_T(3, nt, kc, wr, ldw2, xf, sr, lds, first) break;
                case 2: F16_CASE_T(2, nt, kc, wr, ldw2, xf, sr, lds, first) break;
                default: F16_CASE_T(1, nt, kc, wr, ldw2, xf, sr, lds, first) break;
                }
            }
        }
    }
}
