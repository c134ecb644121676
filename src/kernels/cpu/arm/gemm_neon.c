/*
 * gemm_neon.c - multi-row kernels for AArch64 NEON with the dot product
 * extension: decode (gemv: 4 weight rows x 1 token) and prompt tiles (gemm:
 * 1 row x 4 tokens for Q4_K and Q6_K, 4 rows x 4 tokens for Q8_0). The
 * contracts are lms_gemv_fn / lms_gemm_fn (kernels.h); quant_neon.c lists
 * these in its table beside the row-by-row vec_dot kernels.
 *
 * Central idea (K-quants): vec_dot_q4_K_q8_K_neon gives each sub-block its
 * own int32x4 accumulator, to be summed across lanes before the sub-block
 * scale applies. Here the weight codes are loaded with vld4q_u8, which puts
 * bytes from four different 16-byte runs of the block into the four 32-bit
 * lanes of one register, so each lane of an accumulator belongs to one
 * sub-block and a whole super-block takes four accumulators (g = 0..3,
 * four vdotq_s32 each). The scales then multiply whole accumulators
 * (sum_g acc_g * SC_g, lanes of SC_g = the lanes' sub-block scales) and a
 * row x token product is one int32x4 to be summed. The activations are
 * put into the same lane order once (per call for gemv, per tile and chunk
 * of blocks for gemm: kq_x below), so every row reads them as they are.
 *
 *   weights  register 4g+k (k = 0..3) of the unpacked super-block    lanes:
 *   Q4_K     g = 2c + hi: nibble hi of vld4q_u8(qs + 64c).val[k]     sub-blocks of 32
 *              g0 {0,0,2,2}  g1 {1,1,3,3}  g2 {4,4,6,6}  g3 {5,5,7,7}
 *   Q6_K     A = zip1_64(vld4(ql).val[k], vld4(ql + 64).val[k]),     sub-blocks of 16
 *            B = zip2_64(..); qh bits from vld4(qh).val[k]:
 *              g0 = A low nibbles {0,1,8,9}      g1 = A high {4,5,12,13}
 *              g2 = B low nibbles {2,3,10,11}    g3 = B high {6,7,14,15}
 *
 * Q6_K codes stay unsigned (0..63); each accumulator starts at -32 times
 * its lanes' activation sums (kq_x.init), so the scaled lanes are the
 * reference's sum of sc * (q - 32) * x. Q4_K's mins term (dmin * mins .
 * bsums) is a separate int32 sum with its own float factor, as in vec_dot.
 * Both sums are exact int32 per super-block (|Q6_K lane| <= 16*32*128,
 * times |sc| <= 128, 16 lanes; Q4_K's <= 32*15*128*63 a lane): only the
 * order of the float additions differs from vec_dot, within the tolerance
 * of tests/kernels/test_simd.c (gemv) and test_gemm.c (gemm).
 *
 * The row x token sums (one int32x4 each) are reduced four at a time by
 * two levels of vpaddq into one vector: rows in lanes for gemv (one float
 * step and one store per 4 rows and block), tokens in lanes for gemm (one
 * float step per row, 4 tokens and block). Tails: a short group of rows
 * repeats its last row and stores only the real lanes; the last tile of
 * tokens is compiled for its count (1 to 4).
 *
 * Instructions executed per row and super-block (Q8_0: per row and 32-
 * block), all included (activation preparation, drivers), counted under
 * qemu-aarch64 (-d in_asm,exec) for n = 4096 and 64 rows, GCC 12.2 -O3;
 * the row-by-row vec_dot of quant_neon.c beside them:
 *
 *            vec_dot/token   gemv    gemm 2 tok   gemm 4 tok   gemm 8 tok
 *   Q4_K     130.6           105.6   147.2        244.9        490.5
 *   Q6_K     195.9           139.4   177.2        266.0        532.7
 *   Q8_0      17.2            10.6    16.8         28.1         56.3
 *
 * Each token of a K-quant tile adds 42-56 instructions per row and super-
 * block (16 vdotq_s32 and their 16 activation loads, 4 accumulator starts,
 * 1 mul + 3 mla, Q4_K's mins); the rest (Q4_K ~65, Q6_K ~95: unpacking,
 * scales, the float step) is paid once per row and tile. Timings need real
 * hardware; qemu gives none.
 */
#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/arm/gemm_neon.h"
#include "kernels/qtypes.h"

#define INLINE static inline __attribute__((always_inline))

/* ---- shared pieces ------------------------------------------------------------ */

/* {sum a, sum b, sum c, sum d} */
INLINE int32x4_t hsum4(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d)
{
    return vpaddq_s32(vpaddq_s32(a, b), vpaddq_s32(c, d));
}

/* Four halves as floats. */
INLINE float32x4_t halves4(uint16_t a, uint16_t b, uint16_t c, uint16_t d)
{
    const uint16x4_t h = {a, b, c, d};
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* Lanes j < n of v into p[j * stride]: stored, or added when add. */
INLINE void store_lanes(float32x4_t v, float *p, size_t stride, int n, int add)
{
    float f[4];
    vst1q_f32(f, v);
    for (int j = 0; j < n; j++)
        p[(size_t)j * stride] = add ? p[(size_t)j * stride] + f[j] : f[j];
}

/* tile(args..., NT) with the token count nt (1 to 4) as a constant NT. */
#define BY_TOKENS(nt, tile, ...)                                                                   \
    do {                                                                                           \
        switch (nt) {                                                                              \
        case 1: tile(__VA_ARGS__, 1); break;                                                       \
        case 2: tile(__VA_ARGS__, 2); break;                                                       \
        case 3: tile(__VA_ARGS__, 3); break;                                                       \
        default: tile(__VA_ARGS__, 4); break;                                                      \
        }                                                                                          \
    } while (0)

INLINE uint8x16_t zip1_64(uint8x16_t a, uint8x16_t b)
{
    return vreinterpretq_u8_u64(vzip1q_u64(vreinterpretq_u64_u8(a), vreinterpretq_u64_u8(b)));
}

INLINE uint8x16_t zip2_64(uint8x16_t a, uint8x16_t b)
{
    return vreinterpretq_u8_u64(vzip2q_u64(vreinterpretq_u64_u8(a), vreinterpretq_u64_u8(b)));
}

/* ---- K-quants: both sides in lane order --------------------------------------- */

#define KQ_XCHUNK 64 /* gemv: prepared super-blocks per chunk (22 KiB of stack) */
#define KQ_TOK 4     /* gemm: tokens per tile */
#define KQ_CHUNK 16  /* gemm: super-blocks per chunk (4 tokens: 22 KiB, in L1) */

/* Q6_K: the sub-block of each lane of accumulator g (table at the top;
 * q6k_unpack's tbl indices spell out the same). */
static const uint8_t k_q6k_sb[4][4] = {
    {0, 1, 8, 9}, {4, 5, 12, 13}, {2, 3, 10, 11}, {6, 7, 14, 15}};

/* One token's super-block, shared by every row. */
typedef struct kq_x {
    int8x16_t q[16];   /* codes; q[4g+k] pairs with weight register 4g+k */
    int32x4_t init[4]; /* Q6_K: -32 * the activation sum of each lane's sub-block */
    int16x8_t bp;      /* Q4_K: the 32-code sums bsums[2s] + bsums[2s+1], s = 0..7 */
    float d;
} kq_x;

/* One row's super-block, unpacked (lives in registers). */
typedef struct kq_w {
    int8x16_t c[16]; /* codes 0..15 (Q4_K) or 0..63 (Q6_K) */
    int32x4_t sc[4]; /* scale of each lane's sub-block, for accumulator g */
    int16x8_t mn;    /* Q4_K: the 6-bit mins, s = 0..7 (bp's order) */
    uint32_t dd;     /* d | dmin << 16, halves (Q6_K: dmin 0) */
} kq_w;

/* Constants of q4k_unpack's scale decoding: tbl indices (16 reads 0),
 * per-byte shifts and masks. */
enum { Q4K_LO, Q4K_HI, Q4K_SHIFT, Q4K_KEEP, Q4K_SC, Q4K_MN = Q4K_SC + 4, Q4K_N };
static const uint8_t k_q4k[Q4K_N][16] = {
    [Q4K_LO] = {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 12, 13, 14, 15},
    [Q4K_HI] = {16, 16, 16, 16, 16, 16, 16, 16, 4, 5, 6, 7, 8, 9, 10, 11},
    [Q4K_SHIFT] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 252, 252, 252, 252}, /* -4: right */
    [Q4K_KEEP] = {63, 63, 63, 63, 63, 63, 63, 63, 15, 15, 15, 15, 15, 15, 15, 15},
    /* SC_g lane l = the scale of its sub-block (table at the top), zero-extended */
    [Q4K_SC + 0] = {0, 16, 16, 16, 0, 16, 16, 16, 2, 16, 16, 16, 2, 16, 16, 16},
    [Q4K_SC + 1] = {1, 16, 16, 16, 1, 16, 16, 16, 3, 16, 16, 16, 3, 16, 16, 16},
    [Q4K_SC + 2] = {8, 16, 16, 16, 8, 16, 16, 16, 10, 16, 16, 16, 10, 16, 16, 16},
    [Q4K_SC + 3] = {9, 16, 16, 16, 9, 16, 16, 16, 11, 16, 16, 16, 11, 16, 16, 16},
    [Q4K_MN] = {4, 16, 5, 16, 6, 16, 7, 16, 12, 16, 13, 16, 14, 16, 15, 16}, /* as int16 */
};

/* The head (d, dmin, scales[12]) decoded as k4_scales (quant_neon.c), 16
 * lanes at once, and the codes split into nibbles. */
INLINE void q4k_unpack(const uint8_t *blk, kq_w *w)
{
    const uint8x16_t h = vld1q_u8(blk);
    const uint8x16_t lo = vqtbl1q_u8(h, vld1q_u8(k_q4k[Q4K_LO]));
    const uint8x16_t hi = vqtbl1q_u8(h, vld1q_u8(k_q4k[Q4K_HI]));
    /* scmn = sc[0..3], mn[0..3], sc[4..7], mn[4..7] (k4_scales' words): the low
     * 6 bits of scales[0..7], or a nibble of scales[8..11] under the top two
     * bits of scales[0..7] */
    const int8x16_t shift = vreinterpretq_s8_u8(vld1q_u8(k_q4k[Q4K_SHIFT]));
    const uint8x16_t scmn = vorrq_u8(vandq_u8(vshlq_u8(lo, shift), vld1q_u8(k_q4k[Q4K_KEEP])),
                                     vandq_u8(vshrq_n_u8(hi, 2), vdupq_n_u8(0x30)));
    for (int g = 0; g < 4; g++)
        w->sc[g] = vreinterpretq_s32_u8(vqtbl1q_u8(scmn, vld1q_u8(k_q4k[Q4K_SC + g])));
    w->mn = vreinterpretq_s16_u8(vqtbl1q_u8(scmn, vld1q_u8(k_q4k[Q4K_MN])));
    w->dd = vgetq_lane_u32(vreinterpretq_u32_u8(h), 0);
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    for (int c = 0; c < 2; c++) {
        const uint8x16x4_t v = vld4q_u8(blk + offsetof(lms_block_q4_K, qs) + 64 * c);
        for (int k = 0; k < 4; k++) {
            w->c[8 * c + k] = vreinterpretq_s8_u8(vandq_u8(v.val[k], m4));
            w->c[8 * c + 4 + k] = vreinterpretq_s8_u8(vshrq_n_u8(v.val[k], 4));
        }
    }
}

INLINE void q6k_unpack(const uint8_t *blk, kq_w *w)
{
    /* tbl indices: scale k_q6k_sb[g][l] into the top byte of lane l (sign-extended below) */
    static const uint8_t i_sc[4][16] = {
        {16, 16, 16, 0, 16, 16, 16, 1, 16, 16, 16, 8, 16, 16, 16, 9},
        {16, 16, 16, 4, 16, 16, 16, 5, 16, 16, 16, 12, 16, 16, 16, 13},
        {16, 16, 16, 2, 16, 16, 16, 3, 16, 16, 16, 10, 16, 16, 16, 11},
        {16, 16, 16, 6, 16, 16, 16, 7, 16, 16, 16, 14, 16, 16, 16, 15},
    };
    const lms_block_q6_K *b = (const lms_block_q6_K *)blk;
    const uint8x16_t sc8 = vld1q_u8((const uint8_t *)b->scales);
    for (int g = 0; g < 4; g++)
        w->sc[g] = vshrq_n_s32(vreinterpretq_s32_u8(vqtbl1q_u8(sc8, vld1q_u8(i_sc[g]))), 24);
    w->dd = b->d;
    const uint8x16x4_t w0 = vld4q_u8(b->ql), w1 = vld4q_u8(b->ql + 64), qh = vld4q_u8(b->qh);
    const uint8x16_t m6 = vdupq_n_u8(0x3F), m2 = vdupq_n_u8(0x30);
    for (int k = 0; k < 4; k++) {
        /* A: ql lanes of elements 128h + 0..31, B: 128h + 32..63 (low nibbles;
         * high nibbles 64 further on); qh bits 0-1 / 4-5 for A, 2-3 / 6-7 for B */
        const uint8x16_t a = zip1_64(w0.val[k], w1.val[k]), bb = zip2_64(w0.val[k], w1.val[k]);
        const uint8x16_t ha = qh.val[k], hb = vshrq_n_u8(ha, 2);
        /* high nibbles first: vsli overwrites its first operand */
        w->c[4 + k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(a, 4), vandq_u8(ha, m2)));
        w->c[12 + k] = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(bb, 4), vandq_u8(hb, m2)));
        w->c[k] = vreinterpretq_s8_u8(vandq_u8(vsliq_n_u8(a, ha, 4), m6));
        w->c[8 + k] = vreinterpretq_s8_u8(vandq_u8(vsliq_n_u8(bb, hb, 4), m6));
    }
}

/* The token side of a Q4_K super-block: the codes each weight byte's low
 * and high nibble meet, laid out as the weights' bytes, through vld4q. */
static void q4k_prep(const lms_block_q8_K *x, kq_x *o)
{
    int8_t lo[128], hi[128];
    for (int j = 0; j < 4; j++) {
        memcpy(lo + 32 * j, x->qs + 64 * j, 32);
        memcpy(hi + 32 * j, x->qs + 64 * j + 32, 32);
    }
    for (int c = 0; c < 2; c++) {
        const int8x16x4_t l = vld4q_s8(lo + 64 * c), h = vld4q_s8(hi + 64 * c);
        for (int k = 0; k < 4; k++) {
            o->q[8 * c + k] = l.val[k];
            o->q[8 * c + 4 + k] = h.val[k];
        }
    }
    o->bp = vpaddq_s16(vld1q_s16(x->bsums), vld1q_s16(x->bsums + 8));
    o->d = x->d;
}

/* The token side of a Q6_K super-block: elements 128h + p (p < 64) meet the
 * low nibble of ql[64h + p], 128h + 64 + p its high nibble, so the same
 * vld4q + zip as q6k_unpack over the four 64-code runs. */
static void q6k_prep(const lms_block_q8_K *x, kq_x *o)
{
    const int8x16x4_t l0 = vld4q_s8(x->qs), l1 = vld4q_s8(x->qs + 128);
    const int8x16x4_t h0 = vld4q_s8(x->qs + 64), h1 = vld4q_s8(x->qs + 192);
    for (int k = 0; k < 4; k++) {
        o->q[k] = vreinterpretq_s8_u8(
            zip1_64(vreinterpretq_u8_s8(l0.val[k]), vreinterpretq_u8_s8(l1.val[k])));
        o->q[4 + k] = vreinterpretq_s8_u8(
            zip1_64(vreinterpretq_u8_s8(h0.val[k]), vreinterpretq_u8_s8(h1.val[k])));
        o->q[8 + k] = vreinterpretq_s8_u8(
            zip2_64(vreinterpretq_u8_s8(l0.val[k]), vreinterpretq_u8_s8(l1.val[k])));
        o->q[12 + k] = vreinterpretq_s8_u8(
            zip2_64(vreinterpretq_u8_s8(h0.val[k]), vreinterpretq_u8_s8(h1.val[k])));
    }
    for (int g = 0; g < 4; g++) {
        int32_t v[4];
        for (int l = 0; l < 4; l++)
            v[l] = -32 * x->bsums[k_q6k_sb[g][l]];
        o->init[g] = vld1q_s32(v);
    }
    o->d = x->d;
}

/* Row w times token x over one super-block: lanes to be summed. */
INLINE int32x4_t kq_dot(const kq_w *w, const kq_x *x, int is_q6)
{
    int32x4_t p = vdupq_n_s32(0);
    for (int g = 0; g < 4; g++) {
        int32x4_t a = is_q6 ? x->init[g] : vdupq_n_s32(0);
        for (int k = 0; k < 4; k++)
            a = vdotq_s32(a, w->c[4 * g + k], x->q[4 * g + k]);
        p = g ? vmlaq_s32(p, a, w->sc[g]) : vmulq_s32(a, w->sc[g]);
    }
    return p;
}

/* Q4_K: mins . (32-code sums), lanes to be summed. */
INLINE int32x4_t kq_mins(int16x8_t mn, int16x8_t bp)
{
    return vmlal_high_s16(vmull_s16(vget_low_s16(mn), vget_low_s16(bp)), mn, bp);
}

INLINE void kq_unpack(int is_q6, const uint8_t *blk, kq_w *w)
{
    if (is_q6)
        q6k_unpack(blk, w);
    else
        q4k_unpack(blk, w);
}

/* Prepares the token's super-blocks [0, nb) of x into o. */
static void kq_prep(int is_q6, const lms_block_q8_K *x, int64_t nb, kq_x *o)
{
    for (int64_t i = 0; i < nb; i++) {
        if (is_q6)
            q6k_prep(&x[i], &o[i]);
        else
            q4k_prep(&x[i], &o[i]);
    }
}

/* ---- K-quants: decode, 4 rows x 1 token ---------------------------------------- */

/* Rows w0 + r * ldw, r < nr (<= 4; the group repeats the last), over nb
 * blocks from block b0 against the prepared xp[0 .. nb); row r's sum into
 * s[r], stored or added. */
INLINE void kq_gemv_rows(int is_q6, const uint8_t *w0, size_t ldw, int nr, int64_t b0, int64_t nb,
                         const kq_x *xp, float *s, int add)
{
    const size_t bb = is_q6 ? sizeof(lms_block_q6_K) : sizeof(lms_block_q4_K);
    const uint8_t *row[4];
    for (int r = 0; r < 4; r++)
        row[r] = w0 + (size_t)(r < nr ? r : nr - 1) * ldw + (size_t)b0 * bb;
    float32x4_t acc = vdupq_n_f32(0.0f), accm = acc;
    for (int64_t i = 0; i < nb; i++) {
        int32x4_t p[4], m[4];
        uint32_t dd[4];
        /* rolled: unrolled, GCC 12 interleaves the four rows' unpacking and
         * spills ~90 registers a block; rolled, p, m and dd pass through the
         * stack (8 stores and 8 loads per 4 rows) */
#pragma GCC unroll 1
        for (int r = 0; r < 4; r++) {
            kq_w w;
            kq_unpack(is_q6, row[r] + (size_t)i * bb, &w);
            p[r] = kq_dot(&w, &xp[i], is_q6);
            m[r] = is_q6 ? vdupq_n_s32(0) : kq_mins(w.mn, xp[i].bp);
            dd[r] = w.dd;
        }
        /* d and dmin of row r in lane r, times the token's scale */
        const uint32x4_t ddv = vld1q_u32(dd);
        const float32x4_t dx = vdupq_n_f32(xp[i].d);
        const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vmovn_u32(ddv)));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(hsum4(p[0], p[1], p[2], p[3])), vmulq_f32(d, dx));
        if (!is_q6) {
            const float32x4_t dm = vcvt_f32_f16(vreinterpret_f16_u16(vshrn_n_u32(ddv, 16)));
            accm = vfmaq_f32(accm, vcvtq_f32_s32(hsum4(m[0], m[1], m[2], m[3])), vmulq_f32(dm, dx));
        }
    }
    store_lanes(vsubq_f32(acc, accm), s, 1, nr, add);
}

/* Chunks of KQ_XCHUNK blocks prepared once and read by every group of 4
 * rows (stored for the first chunk, added for the others). */
INLINE void kq_gemv(int is_q6, int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                    float *s)
{
    kq_x xp[KQ_XCHUNK];
    const int64_t nb = n / LMS_QK_K;
    for (int64_t b0 = 0; b0 < nb; b0 += KQ_XCHUNK) {
        const int64_t nbc = nb - b0 < KQ_XCHUNK ? nb - b0 : KQ_XCHUNK;
        kq_prep(is_q6, (const lms_block_q8_K *)x + b0, nbc, xp);
        for (int64_t r = 0; r < n_rows; r += 4) {
            const int nr = n_rows - r < 4 ? (int)(n_rows - r) : 4;
            kq_gemv_rows(is_q6, (const uint8_t *)w + (size_t)r * ldw, ldw, nr, b0, nbc, xp, s + r,
                         b0 > 0);
        }
    }
}

void gemv_q4_K_q8_K_neon(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                         float *s)
{
    kq_gemv(0, n, n_rows, w, ldw, x, s);
}

void gemv_q6_K_q8_K_neon(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                         float *s)
{
    kq_gemv(1, n, n_rows, w, ldw, x, s);
}

/* ---- K-quants: prompt tiles, 1 row x 4 tokens ---------------------------------- */

/* Row w (its blocks [b0, b0 + nb)) against the NT (<= 4) tokens prepared
 * in xp[4 i + t], dx[i] their scales; token t's sum into s[t * lds],
 * stored or added. The row's super-block is unpacked once for the NT. */
INLINE void kq_gemm_row(int is_q6, const uint8_t *w, int64_t b0, int64_t nb, const kq_x *xp,
                        const float32x4_t *dx, float *s, size_t lds, int add, const int NT)
{
    const size_t bb = is_q6 ? sizeof(lms_block_q6_K) : sizeof(lms_block_q4_K);
    float32x4_t acc = vdupq_n_f32(0.0f), accm = acc;
    for (int64_t i = 0; i < nb; i++) {
        kq_w wb;
        kq_unpack(is_q6, w + (size_t)(b0 + i) * bb, &wb);
        int32x4_t p[KQ_TOK], m[KQ_TOK];
        for (int t = 0; t < KQ_TOK; t++) { /* lanes past NT: copies, not stored */
            p[t] = t < NT ? kq_dot(&wb, &xp[KQ_TOK * i + t], is_q6) : p[0];
            m[t] = is_q6 || t >= NT ? vdupq_n_s32(0) : kq_mins(wb.mn, xp[KQ_TOK * i + t].bp);
        }
        /* {d, dmin, d, dmin} */
        const float32x4_t dd = vcvt_f32_f16(vreinterpret_f16_u32(vdup_n_u32(wb.dd)));
        acc = vfmaq_f32(acc, vcvtq_f32_s32(hsum4(p[0], p[1], p[2], p[3])),
                        vmulq_laneq_f32(dx[i], dd, 0));
        if (!is_q6)
            accm = vfmaq_f32(accm, vcvtq_f32_s32(hsum4(m[0], m[1], m[2], m[3])),
                             vmulq_laneq_f32(dx[i], dd, 1));
    }
    store_lanes(vsubq_f32(acc, accm), s, lds, NT, add);
}

/* Tiles of KQ_TOK tokens (the last one of 1 to 4); for each, chunks of
 * KQ_CHUNK blocks prepared once; for each, every row. */
INLINE void kq_gemm(int is_q6, int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                    const void *x, size_t ldx, float *s, size_t lds)
{
    kq_x xp[KQ_CHUNK * KQ_TOK];
    float32x4_t dx[KQ_CHUNK];
    const int64_t nb = n / LMS_QK_K;
    for (int64_t t0 = 0; t0 < n_tok; t0 += KQ_TOK) {
        const int nt = n_tok - t0 < KQ_TOK ? (int)(n_tok - t0) : KQ_TOK;
        const lms_block_q8_K *xt[KQ_TOK];
        for (int t = 0; t < KQ_TOK; t++) /* past nt: the last token (for dx's spare lanes) */
            xt[t] = (const lms_block_q8_K *)((const uint8_t *)x +
                                             (size_t)(t0 + (t < nt ? t : nt - 1)) * ldx);
        for (int64_t b0 = 0; b0 < nb; b0 += KQ_CHUNK) {
            const int64_t nbc = nb - b0 < KQ_CHUNK ? nb - b0 : KQ_CHUNK;
            for (int64_t i = 0; i < nbc; i++) {
                float d[KQ_TOK];
                for (int t = 0; t < KQ_TOK; t++) {
                    if (t < nt)
                        kq_prep(is_q6, xt[t] + b0 + i, 1, &xp[KQ_TOK * i + t]);
                    d[t] = xt[t][b0 + i].d;
                }
                dx[i] = vld1q_f32(d);
            }
            for (int64_t r = 0; r < n_rows; r++) {
                const uint8_t *wr = (const uint8_t *)w + (size_t)r * ldw;
                float *sr = s + (size_t)t0 * lds + r;
                BY_TOKENS(nt, kq_gemm_row, is_q6, wr, b0, nbc, xp, dx, sr, lds, b0 > 0);
            }
        }
    }
}

void gemm_q4_K_q8_K_neon(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds)
{
    kq_gemm(0, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

void gemm_q6_K_q8_K_neon(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds)
{
    kq_gemm(1, n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}

/* ---- Q8_0 ---------------------------------------------------------------------------
 *
 * No unpacking: a block is 2 registers and 2 vdotq_s32 against a token.
 * What the multi-row kernels share is loads (a tile's 4 rows x 4 tokens
 * load 16 registers for 32 vdotq_s32), the horizontal sums (4 products
 * reduced by 3 vpaddq, rows in lanes) and the float scaling (one FMA per 4
 * products). Each block's int32 sum is exact, scaled by d_w * d_x in float
 * as vec_dot. Decode is the same tile with one token. */

#define Q8_TOK 4
#define Q8_CHUNK 64 /* blocks per chunk: 4 tokens' activations, 8.5 KiB, stay in L1 */

/* w . x over one block: lanes to be summed. */
INLINE int32x4_t q8_dot(const lms_block_q8_0 *w, const lms_block_q8_0 *x)
{
    const int32x4_t p = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w->qs), vld1q_s8(x->qs));
    return vdotq_s32(p, vld1q_s8(w->qs + 16), vld1q_s8(x->qs + 16));
}

/* 4 rows (row[r], blocks [b0, b0 + nb)) x NT (<= 4) tokens (xt[t], their
 * scales dx[(i - b0) * Q8_TOK + t]): row r and token t into s[t * lds + r]
 * for r < nr, stored or added. */
INLINE void q8_tile(const lms_block_q8_0 *const *row, const lms_block_q8_0 *const *xt, int64_t b0,
                    int64_t nb, const float *dx, float *s, size_t lds, int nr, int add,
                    const int NT)
{
    float32x4_t acc[Q8_TOK];
    for (int t = 0; t < NT; t++)
        acc[t] = vdupq_n_f32(0.0f);
    for (int64_t i = b0; i < b0 + nb; i++) {
        const float32x4_t d = halves4(row[0][i].d, row[1][i].d, row[2][i].d, row[3][i].d);
        for (int t = 0; t < NT; t++) {
            const int32x4_t p = hsum4(q8_dot(&row[0][i], &xt[t][i]), q8_dot(&row[1][i], &xt[t][i]),
                                      q8_dot(&row[2][i], &xt[t][i]), q8_dot(&row[3][i], &xt[t][i]));
            acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(p), vmulq_n_f32(d, dx[(i - b0) * Q8_TOK + t]));
        }
    }
    for (int t = 0; t < NT; t++)
        store_lanes(acc[t], s + (size_t)t * lds, 1, nr, add);
}

/* Tiles of Q8_TOK tokens (the last one of 1 to 4); for each, chunks of
 * Q8_CHUNK blocks; for each, the rows 4 at a time (a short group repeats
 * its last row). */
static void q8_gemm(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                    const void *x, size_t ldx, float *s, size_t lds)
{
    float dx[Q8_CHUNK * Q8_TOK];
    const int64_t nb = n / LMS_QK8_0;
    for (int64_t t0 = 0; t0 < n_tok; t0 += Q8_TOK) {
        const int nt = n_tok - t0 < Q8_TOK ? (int)(n_tok - t0) : Q8_TOK;
        const lms_block_q8_0 *xt[Q8_TOK];
        for (int t = 0; t < Q8_TOK; t++)
            xt[t] = (const lms_block_q8_0 *)((const uint8_t *)x +
                                             (size_t)(t0 + (t < nt ? t : nt - 1)) * ldx);
        for (int64_t b0 = 0; b0 < nb; b0 += Q8_CHUNK) {
            const int64_t nbc = nb - b0 < Q8_CHUNK ? nb - b0 : Q8_CHUNK;
            for (int64_t i = 0; i < nbc; i++)
                vst1q_f32(dx + i * Q8_TOK, halves4(xt[0][b0 + i].d, xt[1][b0 + i].d,
                                                   xt[2][b0 + i].d, xt[3][b0 + i].d));
            for (int64_t r0 = 0; r0 < n_rows; r0 += 4) {
                const int nr = n_rows - r0 < 4 ? (int)(n_rows - r0) : 4;
                const lms_block_q8_0 *row[4];
                for (int r = 0; r < 4; r++)
                    row[r] = (const lms_block_q8_0 *)((const uint8_t *)w +
                                                      (size_t)(r0 + (r < nr ? r : nr - 1)) * ldw);
                float *st = s + (size_t)t0 * lds + r0;
                BY_TOKENS(nt, q8_tile, row, xt, b0, nbc, dx, st, lds, nr, b0 > 0);
            }
        }
    }
}

void gemv_q8_0_q8_0_neon(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                         float *s)
{
    q8_gemm(n, n_rows, 1, w, ldw, x, 0, s, 0);
}

void gemm_q8_0_q8_0_neon(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds)
{
    q8_gemm(n, n_rows, n_tok, w, ldw, x, ldx, s, lds);
}
