/*
 * iq4_avx512.c - IQ4_XS against Q8_K with 512-bit registers and VNNI: the
 * row kernel (vec_dot), the decode kernel (gemv, four rows at a time) and
 * the prompt tile kernel (gemm); and the IQ4_NL decode kernel (its tile
 * kernel shares Q4_0's in gemm_avx512.c). Listed by the AVX-512 table in
 * quant_avx512.c; contracts in kernels.h.
 *
 * kbench -d -k 2048 (Zen 4): IQ4_XS gemv 52.3 GB/s from DRAM on two
 * threads (vec_dot row by row 32.8; Q4_K's gemv 52.2), 30.5 from L2 on one
 * (18.5). IQ4_NL gemv 29.4 / 16.3 (vec_dot 25.1 / 13.0): its per-block
 * f16 scales cost a float step per 32 weights and row, as for Q4_0.
 *
 * Central idea: vpshufb with a 16-byte table in every 128-bit lane turns
 * index nibbles into bytes, and the table holds value + 128 (1..241), so
 * the bytes are unsigned and go straight into vpdpbusd against the int8
 * activations, four products per int32 lane. The +128 comes back as
 * -128 * (sum of the sub-block's activations), which starts the
 * accumulator: no sign juggling per product.
 *
 * Layout in registers. 64 bytes of qs are four sub-blocks of 16 index
 * bytes, one per 128-bit lane; their low nibbles are elements 0-15 of the
 * sub-block, the high nibbles elements 16-31. The activations are loaded
 * once (per call, or per tile) into the same order (iq4x_block: lane k of
 * lo[h] / hi[h] holds elements 0-15 / 16-31 of sub-block 4h + k). A lane's
 * int32 sums belong to one sub-block, so one vpmulld by the sub-block
 * scales (in every dword of the lane) applies them; |sum| <= 32 * 127 *
 * 128 and |scale| <= 32 keep every product exact in int32.
 *
 * Numerics: exact int32 per super-block, then d * d_x in float, as
 * vec_dot_iq4_xs_q8_K_ref (only the order of float additions differs;
 * tests/kernels/test_simd.c and test_gemm.c).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/x86/iq4_x86.h"
#include "kernels/cpu/x86/quant_x86.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- shared pieces ------------------------------------------------------------ */

/* The activation side of one super-block, in the lanes the row sums use. */
typedef struct iq4x_block {
    __m512i lo[2], hi[2]; /* lane k: elements 0-15 / 16-31 of sub-block 4h + k */
    __m512i ncorr[2];     /* dword 0 of lane k: -128 * sum of sub-block 4h + k */
    float d;              /* the activation scale */
} iq4x_block;

/* value + 128 for each index, in every lane (value + 128 = value ^ 0x80 as
 * bytes, since every value is in -128..127). */
INLINE __m512i iq4_utable(void)
{
    const __m128i t =
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)lms_iq4_values), _mm_set1_epi8((char)0x80));
    return _mm512_broadcast_i32x4(t);
}

INLINE void iq4x_prep(const lms_block_q8_K *x, iq4x_block *o)
{
    for (int h = 0; h < 2; h++) {
        const __m512i a = _mm512_loadu_si512(x->qs + 128 * h);
        const __m512i b = _mm512_loadu_si512(x->qs + 128 * h + 64);
        o->lo[h] = _mm512_shuffle_i64x2(a, b, 0x88); /* lanes a0 a2 b0 b2 */
        o->hi[h] = _mm512_shuffle_i64x2(a, b, 0xDD); /* lanes a1 a3 b1 b3 */
        const int16_t *bs = x->bsums + 8 * h;
        o->ncorr[h] =
            _mm512_setr_epi32(-128 * (bs[0] + bs[1]), 0, 0, 0, -128 * (bs[2] + bs[3]), 0, 0, 0,
                              -128 * (bs[4] + bs[5]), 0, 0, 0, -128 * (bs[6] + bs[7]), 0, 0, 0);
    }
    o->d = x->d;
}

/* A row's block unpacked: unsigned values in activation order, and its
 * sub-block scales in every dword of their lane. */
typedef struct iq4w_block {
    __m512i lo[2], hi[2];
    __m512i sc[2];
} iq4w_block;

INLINE void iq4w_unpack(const lms_block_iq4_xs *b, __m512i tbl, iq4w_block *o)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m128i s8 = iq4_xs_scales(b);
    for (int h = 0; h < 2; h++) {
        const __m512i q = _mm512_loadu_si512(b->qs + 64 * h);
        o->lo[h] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(q, m4));
        o->hi[h] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
        const __m128i sel =
            _mm_add_epi8(_mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                         _mm_set1_epi8((char)(4 * h)));
        o->sc[h] = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(s8, sel));
    }
}

/* Row block w against activation block x: 16 int32 lanes whose sum is the
 * super-block's integer dot product sum_s (scale_s - 32) * (values . a). */
INLINE __m512i iq4_sum(const iq4w_block *w, const iq4x_block *x)
{
    __m512i p0 = _mm512_dpbusd_epi32(x->ncorr[0], w->lo[0], x->lo[0]);
    __m512i p1 = _mm512_dpbusd_epi32(x->ncorr[1], w->lo[1], x->lo[1]);
    p0 = _mm512_dpbusd_epi32(p0, w->hi[0], x->hi[0]);
    p1 = _mm512_dpbusd_epi32(p1, w->hi[1], x->hi[1]);
    return _mm512_add_epi32(_mm512_mullo_epi32(p0, w->sc[0]), _mm512_mullo_epi32(p1, w->sc[1]));
}

/* ---- vec_dot -------------------------------------------------------------------- */

void vec_dot_iq4_xs_q8_K_avx512(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_iq4_xs *w = vw;
    const lms_block_q8_K *x = vx;
    const __m512i tbl = iq4_utable();
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / LMS_QK_K; i++) {
        iq4x_block xb;
        iq4w_block wb;
        iq4x_prep(&x[i], &xb);
        iq4w_unpack(&w[i], tbl, &wb);
        const __m512 d = _mm512_set1_ps(x86_h2f(w[i].d) * xb.d);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(iq4_sum(&wb, &xb)), acc);
    }
    *s = _mm512_reduce_add_ps(acc);
}

/* ---- gemv: four rows against one activation row -----------------------------------
 *
 * The activations are prepared once per call (per chunk of GEMV_XBLOCKS
 * super-blocks for very long rows) and read by every group of four rows;
 * the four rows' int32 sums are transposed into "row r in lane r" and
 * scaled by their d in one float step. Prefetch as the Q4_K/Q6_K gemv
 * kernels (quant_avx512.c): four rows side by side are four interleaved
 * streams that the hardware prefetcher does not follow, so the group's
 * bytes are fetched GEMV_PF_BYTES ahead in address order into L2. */
#define GEMV_PF_BYTES 8192
#define GEMV_XBLOCKS 48 /* 19 KiB of stack: rows up to 12288 columns in one chunk */

/* Row r's int32 sums in lane r (each lane: 4 partial sums of one row). */
INLINE __m512i rows4_lanes(__m512i s0, __m512i s1, __m512i s2, __m512i s3)
{
    const __m512i t01 =
        _mm512_add_epi32(_mm512_shuffle_i32x4(s0, s1, 0x88), _mm512_shuffle_i32x4(s0, s1, 0xDD));
    const __m512i t23 =
        _mm512_add_epi32(_mm512_shuffle_i32x4(s2, s3, 0x88), _mm512_shuffle_i32x4(s2, s3, 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(t01, t23, 0x88),
                            _mm512_shuffle_i32x4(t01, t23, 0xDD));
}

/* Sum of each 128-bit lane of v into s[0..3]. */
INLINE void store_lane_sums(float *s, __m512 v)
{
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    const __m512 t = _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v);
    _mm_storeu_ps(s, _mm512_castps512_ps128(t));
}

void gemv_iq4_xs_q8_K_avx512(int64_t n, int64_t n_rows, const void *vw, size_t ldw, const void *vx,
                             float *s)
{
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m512i tbl = iq4_utable();
    /* d of row r (a half in the low word of dword r) into lanes 4r..4r+3 */
    const __m512i dsel = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    iq4x_block xb[GEMV_XBLOCKS];
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const uint8_t *w0 = (const uint8_t *)vw + (size_t)r * ldw;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const int64_t c = i % GEMV_XBLOCKS;
            /* once per call, or per chunk and group for very long rows */
            if (c == 0 && (r == 0 || nb > GEMV_XBLOCKS)) {
                const int64_t m = nb - i < GEMV_XBLOCKS ? nb - i : GEMV_XBLOCKS;
                for (int64_t k = 0; k < m; k++)
                    iq4x_prep(&x[i + k], &xb[k]);
            }
            const size_t off = (size_t)i * sizeof(lms_block_iq4_xs);
            const uint8_t *pf = w0 + GEMV_PF_BYTES + 4 * off;
            for (size_t l = 0; l < 4 * sizeof(lms_block_iq4_xs); l += 64)
                x86_prefetch_l2(pf + l);
            const lms_block_iq4_xs *b[4];
            __m512i sum[4];
            for (int k = 0; k < 4; k++) {
                iq4w_block wb;
                b[k] = (const lms_block_iq4_xs *)(w0 + off + (size_t)k * ldw);
                iq4w_unpack(b[k], tbl, &wb);
                sum[k] = iq4_sum(&wb, &xb[c]);
            }
            const __m512i sumi = rows4_lanes(sum[0], sum[1], sum[2], sum[3]);
            const __m128i dh = _mm_setr_epi32(b[0]->d, b[1]->d, b[2]->d, b[3]->d);
            const __m512 d = _mm512_permutexvar_ps(
                dsel, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_packus_epi32(dh, dh))));
            acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb[c].d)),
                                  _mm512_cvtepi32_ps(sumi), acc);
        }
        store_lane_sums(s + r, acc);
    }
    for (; r < n_rows; r++)
        vec_dot_iq4_xs_q8_K_avx512(n, s + r, (const uint8_t *)vw + (size_t)r * ldw, vx);
}

/* ---- IQ4_NL gemv: four rows against one Q8_0 activation row ----------------------
 *
 * Pairs of 32-blocks per zmm, as the Q4_0 / IQ4_NL tile kernel of
 * gemm_avx512.c: the nibbles of blocks i and i+1 looked up into value +
 * 128, one vpdpbusd against the two activation blocks starting from -128 *
 * (sums of 4 activations), computed once per pair and shared by the four
 * rows. The rows' lanes are folded to one 128-bit lane per (row, block),
 * two rows to a vector, and scaled by d_w * d_x in one float step per two
 * rows. An odd last block goes through the row kernel. */

/* Nibbles of two IQ4_NL blocks, looked up: lanes 0-1 block a, 2-3 block b. */
INLINE __m512i nl_pair(const lms_block_iq4_nl *b, __m512i tbl)
{
    const __m128i qa = _mm_loadu_si128((const __m128i *)b[0].qs);
    const __m128i qb = _mm_loadu_si128((const __m128i *)b[1].qs);
    const __m256i lo = _mm256_set_m128i(_mm_srli_epi16(qa, 4), qa);
    const __m256i hi = _mm256_set_m128i(_mm_srli_epi16(qb, 4), qb);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_shuffle_epi8(tbl, _mm512_and_si512(v, _mm512_set1_epi8(0x0F)));
}

/* [r0a, r0b, r1a, r1b]: each 128-bit lane the sum of one block's two lanes. */
INLINE __m512i fold2(__m512i p0, __m512i p1)
{
    return _mm512_add_epi32(_mm512_shuffle_i32x4(p0, p1, 0x88), _mm512_shuffle_i32x4(p0, p1, 0xDD));
}

void gemv_iq4_nl_q8_0_avx512(int64_t n, int64_t n_rows, const void *vw, size_t ldw, const void *vx,
                             float *s)
{
    const lms_block_q8_0 *x = vx;
    const int64_t nb = n / LMS_QK4_NL;
    const __m512i tbl = iq4_utable(), off = _mm512_set1_epi8((char)0x80);
    const __m512i sel01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i sel23 = _mm512_add_epi32(sel01, _mm512_set1_epi32(4));
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const uint8_t *w0 = (const uint8_t *)vw + (size_t)r * ldw;
        __m512 acc01 = _mm512_setzero_ps(), acc23 = _mm512_setzero_ps();
        for (int64_t i = 0; i + 1 < nb; i += 2) {
            const size_t ob = (size_t)i * sizeof(lms_block_iq4_nl);
            const uint8_t *pf = w0 + GEMV_PF_BYTES + 4 * ob;
            for (size_t l = 0; l < 8 * sizeof(lms_block_iq4_nl); l += 64)
                x86_prefetch_l2(pf + l);
            const __m512i xv = _mm512_inserti64x4(_mm512_castsi256_si512(x86_load(x[i].qs)),
                                                  x86_load(x[i + 1].qs), 1);
            const __m512i nc = _mm512_sub_epi32(
                _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, xv));
            __m512i pr[4];
            uint16_t dh[8];
            for (int k = 0; k < 4; k++) {
                const lms_block_iq4_nl *b = (const lms_block_iq4_nl *)(w0 + (size_t)k * ldw) + i;
                pr[k] = _mm512_dpbusd_epi32(nc, nl_pair(b, tbl), xv);
                dh[2 * k] = b[0].d;
                dh[2 * k + 1] = b[1].d;
            }
            /* d_w of [r0a r0b r1a r1b r2a r2b r3a r3b] times d_x of [a b a b ...] */
            const float dxa = x86_h2f(x[i].d), dxb = x86_h2f(x[i + 1].d);
            const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)),
                                           _mm256_setr_ps(dxa, dxb, dxa, dxb, dxa, dxb, dxa, dxb));
            const __m512 d512 = _mm512_castps256_ps512(d);
            acc01 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold2(pr[0], pr[1])),
                                    _mm512_permutexvar_ps(sel01, d512), acc01);
            acc23 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold2(pr[2], pr[3])),
                                    _mm512_permutexvar_ps(sel23, d512), acc23);
        }
        float t01[4], t23[4];
        store_lane_sums(t01, acc01);
        store_lane_sums(t23, acc23);
        float rs[4] = {t01[0] + t01[1], t01[2] + t01[3], t23[0] + t23[1], t23[2] + t23[3]};
        if (nb % 2) {
            for (int k = 0; k < 4; k++) {
                float t;
                vec_dot_iq4_nl_q8_0(LMS_QK4_NL, &t,
                                    (const lms_block_iq4_nl *)(w0 + (size_t)k * ldw) + nb - 1,
                                    &x[nb - 1]);
                rs[k] += t;
            }
        }
        memcpy(s + r, rs, sizeof rs);
    }
    for (; r < n_rows; r++)
        vec_dot_iq4_nl_q8_0(n, s + r, (const uint8_t *)vw + (size_t)r * ldw, vx);
}

/* ---- gemm: rows x tokens -----------------------------------------------------------
 *
 * Tokens in groups of up to GEMM_NT and super-blocks in chunks of up to
 * GEMM_KB: the group's activations of the chunk are prepared once (into
 * iq4x_block form, 24 KiB) and every row of the call passes over them,
 * unpacking each of its blocks once for all the group's tokens. Per row
 * and token the float sums of the chunks are added into s. */
#define GEMM_NT 8
#define GEMM_KB 8

/* Rows [0, n_rows) against NT tokens' prepared chunk of kb super-blocks
 * (NT a constant, so the accumulators stay in registers). */
INLINE void gemm_chunk(int64_t n_rows, const void *w, size_t ldw, int64_t k0, int kb,
                       iq4x_block xb[GEMM_NT][GEMM_KB], float *s, size_t lds, __m512i tbl,
                       const int NT)
{
    for (int64_t r = 0; r < n_rows; r++) {
        const lms_block_iq4_xs *wr =
            (const lms_block_iq4_xs *)((const uint8_t *)w + (size_t)r * ldw) + k0;
        __m512 acc[GEMM_NT];
        for (int t = 0; t < NT; t++)
            acc[t] = _mm512_setzero_ps();
        for (int k = 0; k < kb; k++) {
            iq4w_block wb;
            iq4w_unpack(&wr[k], tbl, &wb);
            const float dw = x86_h2f(wr[k].d);
            for (int t = 0; t < NT; t++)
                acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(dw * xb[t][k].d),
                                         _mm512_cvtepi32_ps(iq4_sum(&wb, &xb[t][k])), acc[t]);
        }
        for (int t = 0; t < NT; t++) {
            float *o = &s[(size_t)t * lds + (size_t)r];
            const float v = _mm512_reduce_add_ps(acc[t]);
            *o = k0 == 0 ? v : *o + v;
        }
    }
}

void gemm_iq4_xs_q8_K_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                             const void *x, size_t ldx, float *s, size_t lds)
{
    const int64_t nb = n / LMS_QK_K;
    const __m512i tbl = iq4_utable();
    iq4x_block xb[GEMM_NT][GEMM_KB];
    for (int64_t t0 = 0; t0 < n_tok; t0 += GEMM_NT) {
        const int nt = n_tok - t0 < GEMM_NT ? (int)(n_tok - t0) : GEMM_NT;
        float *st = s + (size_t)t0 * lds;
        for (int64_t k0 = 0; k0 < nb; k0 += GEMM_KB) {
            const int kb = nb - k0 < GEMM_KB ? (int)(nb - k0) : GEMM_KB;
            for (int t = 0; t < nt; t++) {
                const lms_block_q8_K *xr =
                    (const lms_block_q8_K *)((const uint8_t *)x + (size_t)(t0 + t) * ldx);
                for (int k = 0; k < kb; k++)
                    iq4x_prep(&xr[k0 + k], &xb[t][k]);
            }
            switch (nt) {
            case 1: gemm_chunk(n_rows, w, ldw, k0, kb, xb, st, lds, tbl, 1); break;
            case 2: gemm_chunk(n_rows, w, ldw, k0, kb, xb, st, lds, tbl, 2); break;
            case 3: gemm_chunk(n_rows, w, ldw, k0, kb, xb, st, lds, tbl, 3); break;
            case 4: gemm_chunk(n_rows, w, ldw, k0, kb, xb, st, lds, tbl, 4); break;
            case 5: gemm_chunk(n_rows, w, ldw, k0, kb, xb, st, lds, tbl, 5); break;
            case 6: gemm_chunk(n_rows, w, ldw, k0, kb, xb, st, lds, tbl, 6); break;
            case 7: gemm_chunk(n_rows, w, ldw, k0, kb, xb, st, lds, tbl, 7); break;
            default: gemm_chunk(n_rows, w, ldw, k0, kb, xb, st, lds, tbl, GEMM_NT); break;
            }
        }
    }
}
