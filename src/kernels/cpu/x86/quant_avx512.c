/*
 * quant_avx512.c - the AVX-512 kernel table (F/BW/VL/DQ + VNNI + BF16:
 * Ice Lake / Sapphire Rapids, Zen 4 and later).
 *
 * Two kinds of kernel: the quantized dot products of quant_x86.h compiled
 * with VNNI (vpdpbusd / vpdpwssd replace the three-instruction AVX2 integer
 * sequences; still 256-bit, which keeps one 32-element block per register),
 * and 512-bit float-row kernels written here: F32 and F16 rows with FMA,
 * BF16 rows with vdpbf16ps, and 512-bit Q4_K and Q6_K rows against Q8_K.
 * Row tails use masked loads, so any n works.
 * Decode also has multi-row Q4_K and Q6_K kernels (gemv: four rows share
 * the activation loads, the scale unpacking and the final reductions).
 * IQ4_XS's row, decode and tile kernels are in iq4_avx512.c.
 *
 * vdpbf16ps treats subnormal bfloat inputs as zero and rounds its pairs
 * differently from separate multiplies and adds: results agree with the
 * reference to float rounding (tests use a relative tolerance).
 */
#include "kernels/cpu/x86/gemm_x86.h"
#include "kernels/cpu/x86/iq4_x86.h"
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

/* Q6_K against Q8_K with 512-bit registers, in address order (one row is
 * one linear stream). Per half super-block (128 codes): one 64-byte load of
 * ql (its low nibbles are codes 0-63 of the half, its high nibbles 64-127)
 * and the matching 32 bytes of qh broadcast to both 256-bit halves; one
 * variable shift per group brings the right 2-bit pair of qh to bits 4-5.
 * vpdpbusd of the unsigned codes (0..63) with the activations gives int32
 * sums of 4 products (|sum| <= 4 * 63 * 128, exact in int16), vpackssdw
 * folds the two groups into int16 and one vpdpwssd applies the sub-block
 * scales. The -32 offset comes back as 32 * sum_s sc[s] * bsums[s]. */
static inline __m512i q6k_half_sum(__m512i sumi, const uint8_t *ql, const uint8_t *qh,
                                   __m512i alo, __m512i ahi, __m512i sc)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x30);
    /* codes 0-31 take qh bits 0-1, 32-63 bits 2-3, 64-95 bits 4-5, 96-127 bits 6-7 */
    const __m512i shl = _mm512_setr_epi64(0x0004000400040004ll, 0x0004000400040004ll,
                                          0x0004000400040004ll, 0x0004000400040004ll,
                                          0x0002000200020002ll, 0x0002000200020002ll,
                                          0x0002000200020002ll, 0x0002000200020002ll);
    const __m512i shr = _mm512_setr_epi64(0, 0, 0, 0, 0x0002000200020002ll, 0x0002000200020002ll,
                                          0x0002000200020002ll, 0x0002000200020002ll);
    const __m512i q = _mm512_loadu_si512(ql);
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    const __m512i hl = _mm512_and_si512(_mm512_sllv_epi16(h, shl), m2);
    const __m512i hh = _mm512_and_si512(_mm512_srlv_epi16(h, shr), m2);
    /* (a & b) | c */
    const __m512i ulo = _mm512_ternarylogic_epi32(q, m4, hl, 0xEA);
    const __m512i uhi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(q, 4), m4, hh, 0xEA);
    const __m512i z = _mm512_setzero_si512();
    const __m512i plo = _mm512_dpbusd_epi32(z, ulo, alo);
    const __m512i phi = _mm512_dpbusd_epi32(z, uhi, ahi);
    return _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(plo, phi), sc);
}

/* vpermw index of the scales for q6k_half_sum's packed sums: vpackssdw
 * lane k of a half holds words 0-3 from sub-block k, 4-7 from sub-block
 * k + 4 (of that half's eight); add 8 for the second half. */
static inline __m512i q6k_scale_index(void)
{
    return _mm512_setr_epi64(0x0000000000000000ll, 0x0004000400040004ll, 0x0001000100010001ll,
                             0x0005000500050005ll, 0x0002000200020002ll, 0x0006000600060006ll,
                             0x0003000300030003ll, 0x0007000700070007ll);
}

static void vec_dot_q6_K_q8_K_512(int64_t n, float *s, const void *vw, const void *vx)
{
    const lms_block_q6_K *w = vw;
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m512i i0 = q6k_scale_index(), i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(8));
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        const __m512i sc = _mm512_castsi256_si512(sc16);
        const __m256i corr = _mm256_madd_epi16(x86_load(x[i].bsums), sc16);
        const __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        __m512i sumi = _mm512_zextsi256_si512(neg);
        sumi = q6k_half_sum(sumi, w[i].ql, w[i].qh, _mm512_loadu_si512(a),
                            _mm512_loadu_si512(a + 64), _mm512_permutexvar_epi16(i0, sc));
        sumi = q6k_half_sum(sumi, w[i].ql + 64, w[i].qh + 32, _mm512_loadu_si512(a + 128),
                            _mm512_loadu_si512(a + 192), _mm512_permutexvar_epi16(i1, sc));
        const __m512 d = _mm512_set1_ps(x86_h2f(w[i].d) * x[i].d);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
    }
    *s = hsum_ps_512(acc);
}

/* ---- decode: several Q4_K rows against one Q8_K row ------------------------
 *
 * Four rows share every activation load. Per row and super-block:
 *   - vpdpbusd of the 4-bit codes (u8) with the activations (i8) gives
 *     int32 sums of 4 products (|sum| <= 4 * 15 * 128, exact in int16);
 *     vpackssdw folds a low-nibble and a high-nibble result into one
 *     vector of int16, and one vpdpwssd applies the sub-block scales;
 *   - the scales and mins of the four rows are unpacked together, one row
 *     per 128-bit lane, with byte shuffles (no scalar work);
 *   - the four rows' int32 sums are transposed into "row r in lane r" and
 *     scaled by d and dmin in one float step for all four rows.
 * Codes of a 512-bit load: bytes 0-31 are chunk j, 32-63 chunk j+1; their
 * low nibbles are sub-blocks 2j and 2j+2, the high ones 2j+1 and 2j+3, so
 * the activations are loaded in that order. */

/* 16 bytes of row r's block (d, dmin, scales[12]) in lane r. */
static inline __m512i q4k_heads(const uint8_t *b0, size_t ldw)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)b0));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b0 + ldw)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b0 + 2 * ldw)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b0 + 3 * ldw)), 3);
}

/* Per lane: bytes 0-7 the 6-bit scales, 8-15 the 6-bit mins (k4_scales's
 * layout) from a block head as q4k_heads loads it (scales at byte 4). */
static inline __m512i q4k_scmn(__m512i h)
{
    /* sc[s<4] = b[4+s] & 63; sc[s>=4] = (b[8+s] & 15) | (b[s] >> 6) << 4;
     * mn[s<4] = b[8+s] & 63; mn[s>=4] = (b[8+s] >> 4) | (b[4+s] >> 6) << 4 */
    const __m512i ia = _mm512_broadcast_i32x4(
        _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m512i ib = _mm512_broadcast_i32x4(
        _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m512i ma = _mm512_broadcast_i32x4(
        _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
    const __m512i a = _mm512_shuffle_epi8(h, ia);
    const __m512i a4 = _mm512_srli_epi16(a, 4);
    const __m512i lo = _mm512_and_si512(_mm512_mask_blend_epi8(0xF000F000F000F000ull, a, a4), ma);
    const __m512i b = _mm512_shuffle_epi8(h, ib);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 2), _mm512_set1_epi8(0x30));
    return _mm512_or_si512(lo, hi);
}

/* Row r's int32 sums in lane r (each lane: 4 partial sums of one row). */
static inline __m512i rows4_lanes(__m512i s0, __m512i s1, __m512i s2, __m512i s3)
{
    const __m512i t01 = _mm512_add_epi32(_mm512_shuffle_i32x4(s0, s1, 0x88),
                                         _mm512_shuffle_i32x4(s0, s1, 0xDD));
    const __m512i t23 = _mm512_add_epi32(_mm512_shuffle_i32x4(s2, s3, 0x88),
                                         _mm512_shuffle_i32x4(s2, s3, 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(t01, t23, 0x88),
                            _mm512_shuffle_i32x4(t01, t23, 0xDD));
}

/* Sum of each 128-bit lane of v into s[0..3]. */
static inline void store_lane_sums(float *s, __m512 v)
{
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4E));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    const __m512 t = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0,
                                                             0, 0, 0, 0), v);
    _mm_storeu_ps(s, _mm512_castps512_ps128(t));
}

/* One row's integer sum over a super-block: q the 128 code bytes, a0..a3
 * the activations in nibble order, sc the row's scale vector (lane r of
 * q4k_scmn broadcast to every lane). */
static inline __m512i q4k_row_sum(const uint8_t *q, __m512i sc, __m512i a0, __m512i a1,
                                  __m512i a2, __m512i a3)
{
    /* int16 scale pairs for the packed sums: lanes 0-1 hold sub-blocks
     * (2j, 2j+1), lanes 2-3 (2j+2, 2j+3), four words each */
    const __m512i i01 = _mm512_setr_epi64(0x8000800080008000ull, 0x8001800180018001ull,
                                          0x8000800080008000ull, 0x8001800180018001ull,
                                          0x8002800280028002ull, 0x8003800380038003ull,
                                          0x8002800280028002ull, 0x8003800380038003ull);
    const __m512i i45 = _mm512_add_epi8(i01, _mm512_set1_epi16(4));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i q0 = _mm512_loadu_si512(q), q1 = _mm512_loadu_si512(q + 64);
    const __m512i z = _mm512_setzero_si512();
    const __m512i l0 = _mm512_dpbusd_epi32(z, _mm512_and_si512(q0, m4), a0);
    const __m512i h0 = _mm512_dpbusd_epi32(z, _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), a1);
    const __m512i l1 = _mm512_dpbusd_epi32(z, _mm512_and_si512(q1, m4), a2);
    const __m512i h1 = _mm512_dpbusd_epi32(z, _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4), a3);
    __m512i sum = _mm512_madd_epi16(_mm512_packs_epi32(l0, h0), _mm512_shuffle_epi8(sc, i01));
    return _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(l1, h1), _mm512_shuffle_epi8(sc, i45));
}

/* Software prefetch of the multi-row kernels. Four rows side by side are
 * four interleaved streams within a page, which the hardware prefetcher
 * does not follow (kbench -d from DRAM: Q6_K four rows at a time without
 * prefetch, 6 GB/s a core; row by row, 20). So the kernels fetch ahead in
 * address order, GEMV_PF_BYTES ahead of the group's progress (about two
 * DRAM latencies at one core's share of the bandwidth), into L2: prefetcht0
 * that far ahead holds too many L1 fill buffers and ran at half the speed.
 * 8 KiB rather than 16: whole-model decode, the two distances alternating
 * token by token in one process (the bandwidth here drifts from minute to
 * minute), Llama-3.2-1B Q4_K_M 0.9-5.8% and Qwen3-0.6B 2.9-3.4% faster a
 * token over six runs; 4 KiB was 20-30% slower, 10-12 KiB as 16.
 * Past a gemv call's rows it fetches the rows of the thread's next call
 * (decode splits the rows of a matrix in contiguous shares).
 *
 * The Q6_K kernel takes rows of up to GEMV_MAX_ROW_BYTES: longer rows are
 * each a long stream the hardware prefetcher follows, and vec_dot row by
 * row, with less work per byte than Q4_K's, streams them as fast. */
#define GEMV_PF_BYTES 8192
#define GEMV_MAX_ROW_BYTES 2304

/* Prefetch for a group of four rows at w0 whose first `off` bytes (of
 * each row) have been read; blk bytes of each are read next. A line every
 * 64 bytes from each step's start covers every line of the contiguous
 * range. */
static inline void gemv_prefetch4(const uint8_t *w0, size_t off, size_t blk)
{
    const uint8_t *pf = w0 + GEMV_PF_BYTES + 4 * off;
    for (size_t l = 0; l < 4 * blk; l += 64)
        x86_prefetch_l2(pf + l);
}

/* The activation side of a super-block, in the order q4k_row_sum takes it:
 * built once per call (per chunk of GEMV_XBLOCKS blocks) and read by every
 * group of four rows. */
typedef struct q4k_xblock {
    __m512i a[4]; /* codes in nibble order (see above) */
    __m512i bp16; /* bsums[2s] + bsums[2s+1], int16, s = 0..7, in every lane */
} q4k_xblock;

#define GEMV_XBLOCKS 64 /* 20 KiB of stack: rows up to 16384 columns in one chunk */

static inline void q4k_prep_x(const lms_block_q8_K *x, int64_t nb, q4k_xblock *o)
{
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *a = x[i].qs;
        o[i].a[0] = join256(x86_load(a), x86_load(a + 64));
        o[i].a[1] = join256(x86_load(a + 32), x86_load(a + 96));
        o[i].a[2] = join256(x86_load(a + 128), x86_load(a + 192));
        o[i].a[3] = join256(x86_load(a + 160), x86_load(a + 224));
        const __m256i bp = _mm256_madd_epi16(x86_load(x[i].bsums), _mm256_set1_epi16(1));
        o[i].bp16 = _mm512_broadcast_i32x4(_mm256_cvtepi32_epi16(bp));
    }
}

static void gemv_q4_K_q8_K_512(int64_t n, int64_t n_rows, const void *vw, size_t ldw,
                               const void *vx, float *s)
{
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    q4k_xblock xb[GEMV_XBLOCKS];
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        const uint8_t *w0 = (const uint8_t *)vw + (size_t)r * ldw;
        __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const int64_t c = i % GEMV_XBLOCKS;
            /* once per call, or per chunk and group for very long rows */
            if (c == 0 && (r == 0 || nb > GEMV_XBLOCKS))
                q4k_prep_x(x + i, nb - i < GEMV_XBLOCKS ? nb - i : GEMV_XBLOCKS, xb);
            const q4k_xblock *xc = &xb[c];
            const size_t off = (size_t)i * sizeof(lms_block_q4_K);
            gemv_prefetch4(w0, off, sizeof(lms_block_q4_K));
            const __m512i h = q4k_heads(w0 + off, ldw);
            const __m512i scmn = q4k_scmn(h);
            const uint8_t *q = w0 + off + offsetof(lms_block_q4_K, qs);
            const __m512i s0 = q4k_row_sum(q, _mm512_shuffle_i32x4(scmn, scmn, 0x00), xc->a[0],
                                           xc->a[1], xc->a[2], xc->a[3]);
            const __m512i s1 = q4k_row_sum(q + ldw, _mm512_shuffle_i32x4(scmn, scmn, 0x55),
                                           xc->a[0], xc->a[1], xc->a[2], xc->a[3]);
            const __m512i s2 = q4k_row_sum(q + 2 * ldw, _mm512_shuffle_i32x4(scmn, scmn, 0xAA),
                                           xc->a[0], xc->a[1], xc->a[2], xc->a[3]);
            const __m512i s3 = q4k_row_sum(q + 3 * ldw, _mm512_shuffle_i32x4(scmn, scmn, 0xFF),
                                           xc->a[0], xc->a[1], xc->a[2], xc->a[3]);
            const __m512i sumi = rows4_lanes(s0, s1, s2, s3);
            /* mins: sum_s mn[s] * (bsums[2s] + bsums[2s+1]), row r in lane r */
            const __m512i mn16 = _mm512_shuffle_epi8(
                scmn, _mm512_broadcast_i32x4(_mm_setr_epi8(8, -1, 9, -1, 10, -1, 11, -1, 12, -1,
                                                           13, -1, 14, -1, 15, -1)));
            const __m512i summ = _mm512_madd_epi16(mn16, xc->bp16);
            /* d and dmin of row r in lane r, times the activation scale */
            const __m512i dd = _mm512_shuffle_epi32(h, _MM_PERM_AAAA);
            const __m512 dxv = _mm512_set1_ps(x[i].d);
            const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)), dxv);
            const __m512 dm = _mm512_mul_ps(
                _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))), dxv);
            acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc);
            accm = _mm512_fmadd_ps(dm, _mm512_cvtepi32_ps(summ), accm);
        }
        store_lane_sums(s + r, _mm512_sub_ps(acc, accm));
    }
    for (; r < n_rows; r++)
        vec_dot_q4_K_q8_K_512(n, s + r, (const uint8_t *)vw + (size_t)r * ldw, vx);
}

/* ---- decode: several Q6_K rows against one Q8_K row ------------------------
 *
 * Four rows share every activation load (in address order, as the row
 * kernel above reads them) and the negated activation sub-block sums; per
 * row and super-block the integer work is vec_dot_q6_K_q8_K_512's, with
 * the -32 offset folded in by one vpmaddwd of (32 * scales) and -bsums
 * (|32 * sc| <= 4096, |bsums| <= 2032: exact). The four rows' int32 sums
 * are transposed into "row r in lane r" and scaled by d in one float step.
 * Only the scales and d of the rows are read outside address order. */

/* One row's int32 sums over a super-block (16 lanes to be added). */
static inline __m512i q6k_row_sum(const lms_block_q6_K *b, __m512i a0, __m512i a1, __m512i a2,
                                  __m512i a3, __m256i nbsums, __m512i i0, __m512i i1)
{
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i sumi = _mm512_zextsi256_si512(_mm256_madd_epi16(_mm256_slli_epi16(sc16, 5), nbsums));
    sumi = q6k_half_sum(sumi, b->ql, b->qh, a0, a1, _mm512_permutexvar_epi16(i0, sc));
    return q6k_half_sum(sumi, b->ql + 64, b->qh + 32, a2, a3, _mm512_permutexvar_epi16(i1, sc));
}

static void gemv_q6_K_q8_K_512(int64_t n, int64_t n_rows, const void *vw, size_t ldw,
                               const void *vx, float *s)
{
    const lms_block_q8_K *x = vx;
    const int64_t nb = n / LMS_QK_K;
    const __m512i i0 = q6k_scale_index(), i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(8));
    /* d of row r (a half in the low word of dword r) into lanes 4r..4r+3 */
    const __m512i dsel = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    int64_t r = 0;
    for (; ldw <= GEMV_MAX_ROW_BYTES && r + 4 <= n_rows; r += 4) {
        const uint8_t *w0 = (const uint8_t *)vw + (size_t)r * ldw;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const int8_t *a = x[i].qs;
            const size_t off = (size_t)i * sizeof(lms_block_q6_K);
            const __m512i a0 = _mm512_loadu_si512(a), a1 = _mm512_loadu_si512(a + 64);
            const __m512i a2 = _mm512_loadu_si512(a + 128), a3 = _mm512_loadu_si512(a + 192);
            const __m256i nbs = _mm256_sub_epi16(_mm256_setzero_si256(), x86_load(x[i].bsums));
            gemv_prefetch4(w0, off, sizeof(lms_block_q6_K));
            const lms_block_q6_K *b0 = (const lms_block_q6_K *)(w0 + off);
            const lms_block_q6_K *b1 = (const lms_block_q6_K *)(w0 + off + ldw);
            const lms_block_q6_K *b2 = (const lms_block_q6_K *)(w0 + off + 2 * ldw);
            const lms_block_q6_K *b3 = (const lms_block_q6_K *)(w0 + off + 3 * ldw);
            const __m512i sumi = rows4_lanes(q6k_row_sum(b0, a0, a1, a2, a3, nbs, i0, i1),
                                             q6k_row_sum(b1, a0, a1, a2, a3, nbs, i0, i1),
                                             q6k_row_sum(b2, a0, a1, a2, a3, nbs, i0, i1),
                                             q6k_row_sum(b3, a0, a1, a2, a3, nbs, i0, i1));
            const __m128i dh = _mm_setr_epi32(b0->d, b1->d, b2->d, b3->d);
            const __m512 d = _mm512_permutexvar_ps(
                dsel, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_packus_epi32(dh, dh))));
            acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x[i].d)),
                                  _mm512_cvtepi32_ps(sumi), acc);
        }
        store_lane_sums(s + r, acc);
    }
    for (; r < n_rows; r++)
        vec_dot_q6_K_q8_K_512(n, s + r, (const uint8_t *)vw + (size_t)r * ldw, vx);
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
        [LMS_TYPE_Q6_K] = vec_dot_q6_K_q8_K_512,
        [LMS_TYPE_IQ4_NL] = vec_dot_iq4_nl_q8_0,
        [LMS_TYPE_IQ4_XS] = vec_dot_iq4_xs_q8_K_avx512,
    },
    X86_CONVERSIONS
    .gemm = {
        [LMS_TYPE_F16] = gemm_f16_f16_avx512,
        [LMS_TYPE_Q4_0] = gemm_q4_0_q8_0_avx512,
        [LMS_TYPE_Q8_0] = gemm_q8_0_q8_0_avx512,
        [LMS_TYPE_Q4_K] = gemm_q4_K_q8_K_avx512,
        [LMS_TYPE_Q5_K] = gemm_q5_K_q8_K_avx512,
        [LMS_TYPE_Q6_K] = gemm_q6_K_q8_K_avx512,
        [LMS_TYPE_IQ4_NL] = gemm_iq4_nl_q8_0_avx512,
        [LMS_TYPE_IQ4_XS] = gemm_iq4_xs_q8_K_avx512,
    },
    .gemv = {
        [LMS_TYPE_Q4_K] = gemv_q4_K_q8_K_512,
        [LMS_TYPE_Q6_K] = gemv_q6_K_q8_K_512,
        [LMS_TYPE_IQ4_NL] = gemv_iq4_nl_q8_0_avx512,
        [LMS_TYPE_IQ4_XS] = gemv_iq4_xs_q8_K_avx512,
    },
};
/* clang-format on */

const lms_kernel_table *lms_kernels_avx512(void) { return &k_avx512; }
