/*
 * quant_ref.c - scalar reference kernels for every tensor type, and the
 * block codecs (lms_unpack_* / lms_pack_*) they rest on.
 *
 * Central idea: the bit layout of each format is written down once, in its
 * unpack function and the pack function next to it; dequantization and dot
 * products are then generic loops over decoded blocks (lms_lq_block for the
 * 32-element formats, lms_kq_block for the 256-element K-quants). This is
 * slow on purpose: it is the readable definition the SIMD kernels are
 * tested against, and the fallback for CPUs without them.
 *
 * Called through the scalar table (kernels.c, lms_kernels_ref) and by the
 * weight quantizer (quantize_weights.c, for packing). Formats: ggml's
 * (ggml-common.h); numerics: see quant_ref.h.
 *
 * Where element e of a block lives (l = e % 32):
 *
 *   format     code bits                                        sub-block
 *   ---------  -----------------------------------------------  ---------
 *   Q4_x/Q5_x  nibble e / 16 of qs[e % 16]                      -
 *   Q5_x       + bit e of qh[4] (little-endian u32) as bit 4    -
 *   Q2_K/Q3_K  "crumb": bits 2g, 2g+1 of qs[32h + l],           e / 16
 *              where h = e / 128 and g = (e % 128) / 32
 *   Q3_K       + bit e / 32 of hmask[l]: set adds 0, clear -4   e / 16
 *   Q4_K/Q5_K  nibble (e / 32) % 2 of qs[32 (e / 64) + l]       e / 32
 *   Q5_K       + bit e / 32 of qh[l] as bit 4                   e / 32
 *   Q6_K       low 4 bits: nibble g / 2 of ql[64h + 32 (g % 2) + l],
 *              high 2 bits: crumb of qh (as Q2_K); minus 32     e / 16
 *   IQ4_NL     index: nibble e / 16 of qs[e % 16] (as Q4_0)     -
 *   IQ4_XS     index: nibble l / 16 of qs[16 (e / 32) + l % 16] e / 32
 *
 * The IQ4 indices select a value of lms_iq4_values; the decoded blocks hold
 * those values, so the generic loops below serve them unchanged.
 */
#include "kernels/cpu/quant_ref.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/fp16.h"

typedef void (*lq_unpack_fn)(const void *blk, lms_lq_block *out);
typedef void (*kq_unpack_fn)(const void *blk, lms_kq_block *out);

/* ---- element positions (see the table above) ------------------------------ */

static inline int crumb_byte(int e) { return 32 * (e / 128) + e % 32; }
static inline int crumb_shift(int e) { return 2 * (e % 128 / 32); }
static inline int k4_byte(int e) { return 32 * (e / 64) + e % 32; }
static inline int k4_shift(int e) { return 4 * (e / 32 % 2); }
static inline int q6_byte(int e) { return 64 * (e / 128) + 32 * (e / 32 % 2) + e % 32; }
static inline int q6_shift(int e) { return 4 * (e % 128 / 64); }

/* ---- 32-element formats ------------------------------------------------------ */

/* Codes of a Q4_x/Q5_x block; qh is NULL for the 4-bit formats. */
static void unpack_nibbles(const uint8_t qs[16], const uint8_t *qh, int offset, lms_lq_block *o)
{
    for (int i = 0; i < 32; i++) {
        int c = (qs[i % 16] >> (4 * (i / 16))) & 0xF;
        if (qh)
            c |= ((qh[i / 8] >> (i % 8)) & 1) << 4;
        o->q[i] = (int8_t)(c - offset);
    }
}

static void pack_nibbles(const lms_lq_block *in, int offset, uint8_t qs[16], uint8_t *qh)
{
    memset(qs, 0, 16);
    if (qh)
        memset(qh, 0, 4);
    for (int i = 0; i < 32; i++) {
        int c = in->q[i] + offset;
        assert(c >= 0 && c < (qh ? 32 : 16));
        qs[i % 16] |= (uint8_t)((c & 0xF) << (4 * (i / 16)));
        if (qh)
            qh[i / 8] |= (uint8_t)(((c >> 4) & 1) << (i % 8));
    }
}

void lms_unpack_q4_0(const void *blk, lms_lq_block *out)
{
    const lms_block_q4_0 *b = blk;
    unpack_nibbles(b->qs, NULL, 8, out);
    out->d = lms_f16_to_f32(b->d);
    out->m = 0.0f;
}

void lms_unpack_q4_1(const void *blk, lms_lq_block *out)
{
    const lms_block_q4_1 *b = blk;
    unpack_nibbles(b->qs, NULL, 0, out);
    out->d = lms_f16_to_f32(b->d);
    out->m = lms_f16_to_f32(b->m);
}

void lms_unpack_q5_0(const void *blk, lms_lq_block *out)
{
    const lms_block_q5_0 *b = blk;
    unpack_nibbles(b->qs, b->qh, 16, out);
    out->d = lms_f16_to_f32(b->d);
    out->m = 0.0f;
}

void lms_unpack_q5_1(const void *blk, lms_lq_block *out)
{
    const lms_block_q5_1 *b = blk;
    unpack_nibbles(b->qs, b->qh, 0, out);
    out->d = lms_f16_to_f32(b->d);
    out->m = lms_f16_to_f32(b->m);
}

void lms_unpack_q8_0(const void *blk, lms_lq_block *out)
{
    const lms_block_q8_0 *b = blk;
    memcpy(out->q, b->qs, 32);
    out->d = lms_f16_to_f32(b->d);
    out->m = 0.0f;
}

void lms_pack_q4_0(const lms_lq_block *in, void *blk)
{
    lms_block_q4_0 *b = blk;
    b->d = lms_f32_to_f16(in->d);
    pack_nibbles(in, 8, b->qs, NULL);
}

void lms_pack_q4_1(const lms_lq_block *in, void *blk)
{
    lms_block_q4_1 *b = blk;
    b->d = lms_f32_to_f16(in->d);
    b->m = lms_f32_to_f16(in->m);
    pack_nibbles(in, 0, b->qs, NULL);
}

void lms_pack_q5_0(const lms_lq_block *in, void *blk)
{
    lms_block_q5_0 *b = blk;
    b->d = lms_f32_to_f16(in->d);
    pack_nibbles(in, 16, b->qs, b->qh);
}

void lms_pack_q5_1(const lms_lq_block *in, void *blk)
{
    lms_block_q5_1 *b = blk;
    b->d = lms_f32_to_f16(in->d);
    b->m = lms_f32_to_f16(in->m);
    pack_nibbles(in, 0, b->qs, b->qh);
}

void lms_pack_q8_0(const lms_lq_block *in, void *blk)
{
    lms_block_q8_0 *b = blk;
    b->d = lms_f32_to_f16(in->d);
    memcpy(b->qs, in->q, 32);
}

/* ---- K-quant sub-block scales --------------------------------------------------
 *
 * Q4_K and Q5_K: 8 six-bit scales and 8 six-bit mins in 12 bytes:
 *
 *   byte    bits 0-5           bits 6-7
 *   0..3    sc[0..3]           bits 4-5 of sc[4..7]
 *   4..7    mn[0..3]           bits 4-5 of mn[4..7]
 *   8..11   bits 0-3: bits 0-3 of sc[4..7]; bits 4-7: bits 0-3 of mn[4..7]
 *
 * Q3_K: 16 six-bit scales stored plus 32, in 12 bytes:
 *
 *   byte    content
 *   0..7    bits 0-3: bits 0-3 of sc[0..7]; bits 4-7: bits 0-3 of sc[8..15]
 *   8..11   byte 8 + j, bits 2k, 2k+1: bits 4-5 of sc[4k + j]  (j, k < 4)
 */

static void unpack_k4_scales(const uint8_t s[12], int16_t sc[8], int16_t mn[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (int16_t)((s[j + 8] & 0xF) | (s[j] >> 6) << 4);
        mn[j + 4] = (int16_t)((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
    }
}

static void pack_k4_scales(const int16_t sc[8], const int16_t mn[8], uint8_t s[12])
{
    for (int j = 0; j < 8; j++)
        assert(sc[j] >= 0 && sc[j] < 64 && mn[j] >= 0 && mn[j] < 64);
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
    }
}

static void unpack_q3_scales(const uint8_t s[12], int16_t sc[16])
{
    for (int j = 0; j < 16; j++) {
        int lo = (s[j % 8] >> (4 * (j / 8))) & 0xF;
        int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        sc[j] = (int16_t)((lo | hi << 4) - 32);
    }
}

static void pack_q3_scales(const int16_t sc[16], uint8_t s[12])
{
    memset(s, 0, 12);
    for (int j = 0; j < 16; j++) {
        int c = sc[j] + 32;
        assert(c >= 0 && c < 64);
        s[j % 8] |= (uint8_t)((c & 0xF) << (4 * (j / 8)));
        s[8 + j % 4] |= (uint8_t)((c >> 4) << (2 * (j / 4)));
    }
}

/* ---- K-quant super-blocks ------------------------------------------------------- */

void lms_unpack_q2_K(const void *blk, lms_kq_block *out)
{
    const lms_block_q2_K *b = blk;
    memset(out, 0, sizeof *out);
    for (int e = 0; e < LMS_QK_K; e++)
        out->q[e] = (int8_t)((b->qs[crumb_byte(e)] >> crumb_shift(e)) & 3);
    for (int s = 0; s < 16; s++) {
        out->sc[s] = b->scales[s] & 0xF;
        out->mn[s] = b->scales[s] >> 4;
    }
    out->sub = 16;
    out->d = lms_f16_to_f32(b->d);
    out->dmin = lms_f16_to_f32(b->dmin);
}

void lms_unpack_q3_K(const void *blk, lms_kq_block *out)
{
    const lms_block_q3_K *b = blk;
    memset(out, 0, sizeof *out);
    for (int e = 0; e < LMS_QK_K; e++) {
        int lo = (b->qs[crumb_byte(e)] >> crumb_shift(e)) & 3;
        int hi = (b->hmask[e % 32] >> (e / 32)) & 1;
        out->q[e] = (int8_t)(lo + 4 * hi - 4);
    }
    unpack_q3_scales(b->scales, out->sc);
    out->sub = 16;
    out->d = lms_f16_to_f32(b->d);
}

/* Q4_K and Q5_K share everything but the fifth bit. */
static void unpack_k4(const uint8_t *qs, const uint8_t *qh, const uint8_t scales[12],
                      lms_kq_block *out)
{
    memset(out, 0, sizeof *out);
    for (int e = 0; e < LMS_QK_K; e++) {
        int c = (qs[k4_byte(e)] >> k4_shift(e)) & 0xF;
        if (qh)
            c |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
        out->q[e] = (int8_t)c;
    }
    unpack_k4_scales(scales, out->sc, out->mn);
    out->sub = 32;
}

void lms_unpack_q4_K(const void *blk, lms_kq_block *out)
{
    const lms_block_q4_K *b = blk;
    unpack_k4(b->qs, NULL, b->scales, out);
    out->d = lms_f16_to_f32(b->d);
    out->dmin = lms_f16_to_f32(b->dmin);
}

void lms_unpack_q5_K(const void *blk, lms_kq_block *out)
{
    const lms_block_q5_K *b = blk;
    unpack_k4(b->qs, b->qh, b->scales, out);
    out->d = lms_f16_to_f32(b->d);
    out->dmin = lms_f16_to_f32(b->dmin);
}

void lms_unpack_q6_K(const void *blk, lms_kq_block *out)
{
    const lms_block_q6_K *b = blk;
    memset(out, 0, sizeof *out);
    for (int e = 0; e < LMS_QK_K; e++) {
        int lo = (b->ql[q6_byte(e)] >> q6_shift(e)) & 0xF;
        int hi = (b->qh[crumb_byte(e)] >> crumb_shift(e)) & 3;
        out->q[e] = (int8_t)((lo | hi << 4) - 32);
    }
    for (int s = 0; s < 16; s++)
        out->sc[s] = b->scales[s];
    out->sub = 16;
    out->d = lms_f16_to_f32(b->d);
}

void lms_pack_q2_K(const lms_kq_block *in, void *blk)
{
    lms_block_q2_K *b = blk;
    memset(b, 0, sizeof *b);
    for (int e = 0; e < LMS_QK_K; e++) {
        assert(in->q[e] >= 0 && in->q[e] < 4);
        b->qs[crumb_byte(e)] |= (uint8_t)(in->q[e] << crumb_shift(e));
    }
    for (int s = 0; s < 16; s++) {
        assert(in->sc[s] >= 0 && in->sc[s] < 16 && in->mn[s] >= 0 && in->mn[s] < 16);
        b->scales[s] = (uint8_t)(in->sc[s] | in->mn[s] << 4);
    }
    b->d = lms_f32_to_f16(in->d);
    b->dmin = lms_f32_to_f16(in->dmin);
}

void lms_pack_q3_K(const lms_kq_block *in, void *blk)
{
    lms_block_q3_K *b = blk;
    memset(b, 0, sizeof *b);
    for (int e = 0; e < LMS_QK_K; e++) {
        int c = in->q[e] + 4;
        assert(c >= 0 && c < 8);
        b->qs[crumb_byte(e)] |= (uint8_t)((c & 3) << crumb_shift(e));
        b->hmask[e % 32] |= (uint8_t)((c >> 2) << (e / 32));
    }
    pack_q3_scales(in->sc, b->scales);
    b->d = lms_f32_to_f16(in->d);
}

static void pack_k4(const lms_kq_block *in, uint8_t *qs, uint8_t *qh, uint8_t scales[12])
{
    for (int e = 0; e < LMS_QK_K; e++) {
        int c = in->q[e];
        assert(c >= 0 && c < (qh ? 32 : 16));
        qs[k4_byte(e)] |= (uint8_t)((c & 0xF) << k4_shift(e));
        if (qh)
            qh[e % 32] |= (uint8_t)((c >> 4) << (e / 32));
    }
    pack_k4_scales(in->sc, in->mn, scales);
}

void lms_pack_q4_K(const lms_kq_block *in, void *blk)
{
    lms_block_q4_K *b = blk;
    memset(b, 0, sizeof *b);
    pack_k4(in, b->qs, NULL, b->scales);
    b->d = lms_f32_to_f16(in->d);
    b->dmin = lms_f32_to_f16(in->dmin);
}

void lms_pack_q5_K(const lms_kq_block *in, void *blk)
{
    lms_block_q5_K *b = blk;
    memset(b, 0, sizeof *b);
    pack_k4(in, b->qs, b->qh, b->scales);
    b->d = lms_f32_to_f16(in->d);
    b->dmin = lms_f32_to_f16(in->dmin);
}

void lms_pack_q6_K(const lms_kq_block *in, void *blk)
{
    lms_block_q6_K *b = blk;
    memset(b, 0, sizeof *b);
    for (int e = 0; e < LMS_QK_K; e++) {
        int c = in->q[e] + 32;
        assert(c >= 0 && c < 64);
        b->ql[q6_byte(e)] |= (uint8_t)((c & 0xF) << q6_shift(e));
        b->qh[crumb_byte(e)] |= (uint8_t)((c >> 4) << crumb_shift(e));
    }
    for (int s = 0; s < 16; s++) {
        assert(in->sc[s] >= -128 && in->sc[s] < 128);
        b->scales[s] = (int8_t)in->sc[s];
    }
    b->d = lms_f32_to_f16(in->d);
}

/* ---- IQ4_NL / IQ4_XS -------------------------------------------------------------- */

const int8_t lms_iq4_values[16] = LMS_IQ4_VALUES;

int lms_iq4_index(int value)
{
    for (int i = 0; i < 16; i++)
        if (lms_iq4_values[i] == value)
            return i;
    return -1;
}

/* 16 bytes of index nibbles (low nibbles: elements 0-15, high: 16-31) to
 * 32 table values, and back. */
static void iq4_unpack32(const uint8_t qs[16], int8_t q[32])
{
    for (int j = 0; j < 16; j++) {
        q[j] = lms_iq4_values[qs[j] & 0xF];
        q[j + 16] = lms_iq4_values[qs[j] >> 4];
    }
}

static void iq4_pack32(const int8_t q[32], uint8_t qs[16])
{
    for (int j = 0; j < 16; j++) {
        const int lo = lms_iq4_index(q[j]), hi = lms_iq4_index(q[j + 16]);
        assert(lo >= 0 && hi >= 0);
        qs[j] = (uint8_t)(lo | hi << 4);
    }
}

void lms_unpack_iq4_nl(const void *blk, lms_lq_block *out)
{
    const lms_block_iq4_nl *b = blk;
    iq4_unpack32(b->qs, out->q);
    out->d = lms_f16_to_f32(b->d);
    out->m = 0.0f;
}

void lms_pack_iq4_nl(const lms_lq_block *in, void *blk)
{
    lms_block_iq4_nl *b = blk;
    b->d = lms_f32_to_f16(in->d);
    iq4_pack32(in->q, b->qs);
}

/* IQ4_XS sub-block scales: 6 bits each, stored + 32; bits 0-3 of scale s
 * in nibble s % 2 of scales_l[s / 2], bits 4-5 in bits 2s, 2s+1 of
 * scales_h. */
void lms_unpack_iq4_xs(const void *blk, lms_kq_block *out)
{
    const lms_block_iq4_xs *b = blk;
    memset(out, 0, sizeof *out);
    for (int s = 0; s < 8; s++) {
        const int lo = (b->scales_l[s / 2] >> (4 * (s % 2))) & 0xF;
        const int hi = (b->scales_h >> (2 * s)) & 3;
        out->sc[s] = (int16_t)((lo | hi << 4) - 32);
        iq4_unpack32(b->qs + 16 * s, out->q + 32 * s);
    }
    out->sub = 32;
    out->d = lms_f16_to_f32(b->d);
}

void lms_pack_iq4_xs(const lms_kq_block *in, void *blk)
{
    lms_block_iq4_xs *b = blk;
    memset(b, 0, sizeof *b);
    for (int s = 0; s < 8; s++) {
        const int c = in->sc[s] + 32;
        assert(c >= 0 && c < 64);
        b->scales_l[s / 2] |= (uint8_t)((c & 0xF) << (4 * (s % 2)));
        b->scales_h |= (uint16_t)((c >> 4) << (2 * s));
        iq4_pack32(in->q + 32 * s, b->qs + 16 * s);
    }
    b->d = lms_f32_to_f16(in->d);
}

/* ---- to_float ------------------------------------------------------------------- */

static void lq_to_float(const void *x, size_t blk_bytes, lq_unpack_fn unpack, float *y,
                        int64_t n)
{
    assert(n % 32 == 0);
    const uint8_t *p = x;
    for (int64_t i = 0; i < n / 32; i++) {
        lms_lq_block b;
        unpack(p + (size_t)i * blk_bytes, &b);
        for (int j = 0; j < 32; j++)
            y[i * 32 + j] = b.q[j] * b.d + b.m;
    }
}

/* Per sub-block: dl = d * sc, ml = dmin * mn, element = dl * q - ml; the
 * same float operations as ggml's dequantize_row_*_K. */
static void kq_to_float(const void *x, size_t blk_bytes, kq_unpack_fn unpack, float *y,
                        int64_t n)
{
    assert(n % LMS_QK_K == 0);
    const uint8_t *p = x;
    for (int64_t i = 0; i < n / LMS_QK_K; i++) {
        lms_kq_block b;
        unpack(p + (size_t)i * blk_bytes, &b);
        float *yb = y + i * LMS_QK_K;
        for (int s0 = 0, k = 0; s0 < LMS_QK_K; s0 += b.sub, k++) {
            const float dl = b.d * b.sc[k];
            const float ml = b.dmin * b.mn[k];
            for (int e = s0; e < s0 + b.sub; e++)
                yb[e] = dl * b.q[e] - ml;
        }
    }
}

void lms_to_float_f32_ref(const void *x, float *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

void lms_to_float_f16_ref(const void *x, float *y, int64_t n)
{
    const lms_f16 *h = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = lms_f16_to_f32(h[i]);
}

void lms_to_float_bf16_ref(const void *x, float *y, int64_t n)
{
    const lms_bf16 *h = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = lms_bf16_to_f32(h[i]);
}

void lms_to_float_q4_0_ref(const void *x, float *y, int64_t n)
{
    lq_to_float(x, sizeof(lms_block_q4_0), lms_unpack_q4_0, y, n);
}

void lms_to_float_q4_1_ref(const void *x, float *y, int64_t n)
{
    lq_to_float(x, sizeof(lms_block_q4_1), lms_unpack_q4_1, y, n);
}

void lms_to_float_q5_0_ref(const void *x, float *y, int64_t n)
{
    lq_to_float(x, sizeof(lms_block_q5_0), lms_unpack_q5_0, y, n);
}

void lms_to_float_q5_1_ref(const void *x, float *y, int64_t n)
{
    lq_to_float(x, sizeof(lms_block_q5_1), lms_unpack_q5_1, y, n);
}

void lms_to_float_q8_0_ref(const void *x, float *y, int64_t n)
{
    lq_to_float(x, sizeof(lms_block_q8_0), lms_unpack_q8_0, y, n);
}

void lms_to_float_q8_1_ref(const void *x, float *y, int64_t n)
{
    assert(n % LMS_QK8_1 == 0);
    const lms_block_q8_1 *b = x;
    for (int64_t i = 0; i < n / LMS_QK8_1; i++) {
        const float d = lms_f16_to_f32(b[i].d);
        for (int j = 0; j < LMS_QK8_1; j++)
            y[i * LMS_QK8_1 + j] = b[i].qs[j] * d;
    }
}

void lms_to_float_q2_K_ref(const void *x, float *y, int64_t n)
{
    kq_to_float(x, sizeof(lms_block_q2_K), lms_unpack_q2_K, y, n);
}

void lms_to_float_q3_K_ref(const void *x, float *y, int64_t n)
{
    kq_to_float(x, sizeof(lms_block_q3_K), lms_unpack_q3_K, y, n);
}

void lms_to_float_q4_K_ref(const void *x, float *y, int64_t n)
{
    kq_to_float(x, sizeof(lms_block_q4_K), lms_unpack_q4_K, y, n);
}

void lms_to_float_q5_K_ref(const void *x, float *y, int64_t n)
{
    kq_to_float(x, sizeof(lms_block_q5_K), lms_unpack_q5_K, y, n);
}

void lms_to_float_q6_K_ref(const void *x, float *y, int64_t n)
{
    kq_to_float(x, sizeof(lms_block_q6_K), lms_unpack_q6_K, y, n);
}

void lms_to_float_q8_K_ref(const void *x, float *y, int64_t n)
{
    assert(n % LMS_QK_K == 0);
    const lms_block_q8_K *b = x;
    for (int64_t i = 0; i < n / LMS_QK_K; i++)
        for (int j = 0; j < LMS_QK_K; j++)
            y[i * LMS_QK_K + j] = b[i].qs[j] * b[i].d;
}

/* d * value, as ggml's dequantizer (lq_to_float would add m = +0, which
 * turns a -0 product into +0). */
void lms_to_float_iq4_nl_ref(const void *x, float *y, int64_t n)
{
    assert(n % LMS_QK4_NL == 0);
    const lms_block_iq4_nl *b = x;
    for (int64_t i = 0; i < n / LMS_QK4_NL; i++) {
        lms_lq_block q;
        lms_unpack_iq4_nl(&b[i], &q);
        for (int j = 0; j < LMS_QK4_NL; j++)
            y[i * LMS_QK4_NL + j] = q.d * q.q[j];
    }
}

/* dl = d * (scale - 32), element = dl * value - 0: exact, so ggml's values. */
void lms_to_float_iq4_xs_ref(const void *x, float *y, int64_t n)
{
    kq_to_float(x, sizeof(lms_block_iq4_xs), lms_unpack_iq4_xs, y, n);
}

/* ---- from_float (activations) ---------------------------------------------------- */

/* The common part of Q8_0 and Q8_1: 32 codes from x * (127 / amax);
 * returns the unrounded scale amax / 127. */
static float q8_block32(const float *x, int8_t qs[32])
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; j++)
        qs[j] = (int8_t)lms_round_clamp(x[j] * id, -128, 127);
    return amax / 127.0f;
}

void lms_from_float_f32_ref(const float *x, void *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

void lms_from_float_f16_ref(const float *x, void *y, int64_t n)
{
    lms_f16 *h = y;
    for (int64_t i = 0; i < n; i++)
        h[i] = lms_f32_to_f16(x[i]);
}

void lms_from_float_bf16_ref(const float *x, void *y, int64_t n)
{
    lms_bf16 *h = y;
    for (int64_t i = 0; i < n; i++)
        h[i] = lms_f32_to_bf16(x[i]);
}

void lms_from_float_q8_0_ref(const float *x, void *vy, int64_t n)
{
    assert(n % LMS_QK8_0 == 0);
    lms_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / LMS_QK8_0; i++)
        y[i].d = lms_f32_to_f16(q8_block32(x + i * LMS_QK8_0, y[i].qs));
}

void lms_from_float_q8_1_ref(const float *x, void *vy, int64_t n)
{
    assert(n % LMS_QK8_1 == 0);
    lms_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / LMS_QK8_1; i++) {
        const float d = q8_block32(x + i * LMS_QK8_1, y[i].qs);
        int sum = 0;
        for (int j = 0; j < LMS_QK8_1; j++)
            sum += y[i].qs[j];
        y[i].d = lms_f32_to_f16(d);
        y[i].s = lms_f32_to_f16(d * (float)sum);
    }
}

void lms_from_float_q8_K_ref(const float *x, void *vy, int64_t n)
{
    assert(n % LMS_QK_K == 0);
    lms_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / LMS_QK_K; i++) {
        const float *xb = x + i * LMS_QK_K;
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < LMS_QK_K; j++) {
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                m = xb[j];
            }
        }
        memset(&y[i], 0, sizeof y[i]);
        if (amax == 0.0f)
            continue;
        /* Negative iscale maps m to -127, so a positive m gives a negative d. */
        const float iscale = -127.0f / m;
        for (int j = 0; j < LMS_QK_K; j++) {
            y[i].qs[j] = (int8_t)lms_round_clamp(iscale * xb[j], -128, 127);
            y[i].bsums[j / 16] += y[i].qs[j];
        }
        y[i].d = 1.0f / iscale;
    }
}

/* ---- vec_dot ---------------------------------------------------------------------- */

static int32_t dot_i8(const int8_t *a, const int8_t *b, int n)
{
    int32_t s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Per block: exact int32 sum, then sumi * (d_w * d_x) accumulated in float. */
static void lq_dot_q8_0(int64_t n, float *s, const void *w, size_t blk_bytes, lq_unpack_fn unpack,
                        const void *x)
{
    assert(n % 32 == 0);
    const uint8_t *p = w;
    const lms_block_q8_0 *a = x;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        lms_lq_block b;
        unpack(p + (size_t)i * blk_bytes, &b);
        const int32_t sumi = dot_i8(b.q, a[i].qs, 32);
        sumf += (float)sumi * (b.d * lms_f16_to_f32(a[i].d));
    }
    *s = sumf;
}

/* As above plus the offset term: sum_j (q_j d + m) a_j d_x = ... + m * s_x. */
static void lq_dot_q8_1(int64_t n, float *s, const void *w, size_t blk_bytes, lq_unpack_fn unpack,
                        const void *x)
{
    assert(n % 32 == 0);
    const uint8_t *p = w;
    const lms_block_q8_1 *a = x;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        lms_lq_block b;
        unpack(p + (size_t)i * blk_bytes, &b);
        const int32_t sumi = dot_i8(b.q, a[i].qs, 32);
        sumf += (b.d * lms_f16_to_f32(a[i].d)) * (float)sumi + b.m * lms_f16_to_f32(a[i].s);
    }
    *s = sumf;
}

/* Per super-block: sumi = sum_s sc[s] * (q . a over s), summ = sum_s mn[s] *
 * (bsums over s), both exact int32; then (d d_x) sumi - (dmin d_x) summ in
 * float. The min term uses the activation's bsums, as ggml does. */
static void kq_dot_q8_K(int64_t n, float *s, const void *w, size_t blk_bytes, kq_unpack_fn unpack,
                        const void *x)
{
    assert(n % LMS_QK_K == 0);
    const uint8_t *p = w;
    const lms_block_q8_K *a = x;
    float sumf = 0.0f;
    for (int64_t i = 0; i < n / LMS_QK_K; i++) {
        lms_kq_block b;
        unpack(p + (size_t)i * blk_bytes, &b);
        int32_t sumi = 0, summ = 0;
        for (int s0 = 0, k = 0; s0 < LMS_QK_K; s0 += b.sub, k++) {
            int32_t bsum = 0;
            for (int j = s0 / 16; j < (s0 + b.sub) / 16; j++)
                bsum += a[i].bsums[j];
            sumi += b.sc[k] * dot_i8(b.q + s0, a[i].qs + s0, b.sub);
            summ += b.mn[k] * bsum;
        }
        sumf += (b.d * a[i].d) * (float)sumi - (b.dmin * a[i].d) * (float)summ;
    }
    *s = sumf;
}

void lms_vec_dot_f32_ref(int64_t n, float *s, const void *w, const void *x)
{
    const float *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)a[i] * (double)b[i];
    *s = (float)sum;
}

/* Products of two halves (or two bfloats) are exact in float. */
void lms_vec_dot_f16_ref(int64_t n, float *s, const void *w, const void *x)
{
    const lms_f16 *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(lms_f16_to_f32(a[i]) * lms_f16_to_f32(b[i]));
    *s = (float)sum;
}

void lms_vec_dot_bf16_ref(int64_t n, float *s, const void *w, const void *x)
{
    const lms_bf16 *a = w, *b = x;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(lms_bf16_to_f32(a[i]) * lms_bf16_to_f32(b[i]));
    *s = (float)sum;
}

void lms_vec_dot_q4_0_q8_0_ref(int64_t n, float *s, const void *w, const void *x)
{
    lq_dot_q8_0(n, s, w, sizeof(lms_block_q4_0), lms_unpack_q4_0, x);
}

void lms_vec_dot_q5_0_q8_0_ref(int64_t n, float *s, const void *w, const void *x)
{
    lq_dot_q8_0(n, s, w, sizeof(lms_block_q5_0), lms_unpack_q5_0, x);
}

void lms_vec_dot_q8_0_q8_0_ref(int64_t n, float *s, const void *w, const void *x)
{
    lq_dot_q8_0(n, s, w, sizeof(lms_block_q8_0), lms_unpack_q8_0, x);
}

void lms_vec_dot_q4_1_q8_1_ref(int64_t n, float *s, const void *w, const void *x)
{
    lq_dot_q8_1(n, s, w, sizeof(lms_block_q4_1), lms_unpack_q4_1, x);
}

void lms_vec_dot_q5_1_q8_1_ref(int64_t n, float *s, const void *w, const void *x)
{
    lq_dot_q8_1(n, s, w, sizeof(lms_block_q5_1), lms_unpack_q5_1, x);
}

void lms_vec_dot_q2_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x)
{
    kq_dot_q8_K(n, s, w, sizeof(lms_block_q2_K), lms_unpack_q2_K, x);
}

void lms_vec_dot_q3_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x)
{
    kq_dot_q8_K(n, s, w, sizeof(lms_block_q3_K), lms_unpack_q3_K, x);
}

void lms_vec_dot_q4_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x)
{
    kq_dot_q8_K(n, s, w, sizeof(lms_block_q4_K), lms_unpack_q4_K, x);
}

void lms_vec_dot_q5_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x)
{
    kq_dot_q8_K(n, s, w, sizeof(lms_block_q5_K), lms_unpack_q5_K, x);
}

void lms_vec_dot_q6_K_q8_K_ref(int64_t n, float *s, const void *w, const void *x)
{
    kq_dot_q8_K(n, s, w, sizeof(lms_block_q6_K), lms_unpack_q6_K, x);
}

void lms_vec_dot_iq4_nl_q8_0_ref(int64_t n, float *s, const void *w, const void *x)
{
    lq_dot_q8_0(n, s, w, sizeof(lms_block_iq4_nl), lms_unpack_iq4_nl, x);
}

/* Sub-block scales enter the int32 sum, the min term is zero (mn = 0). */
void lms_vec_dot_iq4_xs_q8_K_ref(int64_t n, float *s, const void *w, const void *x)
{
    kq_dot_q8_K(n, s, w, sizeof(lms_block_iq4_xs), lms_unpack_iq4_xs, x);
}
