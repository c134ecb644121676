/*
 * cu_quant.cuh - dequantization of 32-element "units" of a weight row, for
 * every weight type, on the device.
 *
 * Central idea: whatever the block format, unit u of a row is the 32
 * logical elements [32u, 32u + 32), and deq_unit<T>() turns it into 32
 * floats in registers. Kernels are then written once over units (matrix-
 * vector products, f16 tiles for cuBLAS). The bit positions are those of
 * kernels/cpu/quant_ref.c (its table "where element e of a block lives"),
 * specialised to a unit: with l = e % 32 and s = unit index in the block,
 *
 *   Q4_0/Q5_0/Q4_1/Q5_1/Q8_0  one block = one unit
 *   Q2_K, Q3_K   crumb of qs[32 (s/4) + l] at shift 2 (s%4); scale 2s + l/16
 *   Q3_K         + bit s of hmask[l]
 *   Q4_K, Q5_K   nibble s%2 of qs[32 (s/2) + l]; scale/min s; Q5_K bit s of qh[l]
 *   Q6_K         nibble (s%4)/2 of ql[64 (s/4) + 32 (s%2) + l],
 *                crumb of qh as Q2_K; scale 2s + l/16
 *   IQ4_NL       one block = one unit, nibbles as Q4_0, each an index into
 *                the IQ4 table (mq::iq4_lookup): x = d * value
 *   IQ4_XS       nibble l/16 of qs[16 s + l%16]; x = d * (scale s - 32) * value
 *
 * Values use the reference's float operations (d * sc, then * q, minus
 * dmin * mn), so a dequantized weight equals the CPU's bit for bit.
 */
#ifndef LMS_CU_QUANT_CUH
#define LMS_CU_QUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

/* qtypes.h pins its layouts with C11 _Static_assert; C++ spells it static_assert. */
#if defined(__cplusplus) && !defined(_Static_assert)
#define _Static_assert static_assert
#endif
#include "kernels/qtypes.h"
#include "kernels/cuda/cu_mmvq.cuh" /* mq::iq4_lookup */

__device__ __forceinline__ float h2f(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ float bf2f(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Exact float of a small unsigned integer (v < 2^23) without the
 * quarter-rate int-to-float instruction: 2^23 + v as float bits, minus 2^23. */
__device__ __forceinline__ float u2f(uint32_t v)
{
    return __uint_as_float(0x4B000000u | v) - 8388608.0f;
}

/* Loads N bytes (N % 4 == 0) at p, known to be A-byte aligned, as words. */
template <int N, int A> __device__ __forceinline__ void load_words(const uint8_t *p, uint32_t *w)
{
    if (A >= 16) {
#pragma unroll
        for (int i = 0; i < N / 16; i++) {
            uint4 v = __ldg((const uint4 *)p + i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if (A >= 4) {
#pragma unroll
        for (int i = 0; i < N / 4; i++)
            w[i] = __ldg((const uint32_t *)p + i);
    } else {
#pragma unroll
        for (int i = 0; i < N / 4; i++) {
            uint32_t lo = __ldg((const uint16_t *)p + 2 * i), hi = __ldg((const uint16_t *)p + 2 * i + 1);
            w[i] = lo | hi << 16;
        }
    }
}

__device__ __forceinline__ int byte_of(const uint32_t *w, int i)
{
    return (w[i >> 2] >> (8 * (i & 3))) & 0xFF;
}

/* Bytes per unit and alignment of a row start (for the generic loops). */
template <int T> struct qtraits;
#define QT(T, BYTES_PER_BLOCK, UNITS_PER_BLOCK)                                                     \
    template <> struct qtraits<T> {                                                                \
        static constexpr int block_bytes = BYTES_PER_BLOCK;                                        \
        static constexpr int units = UNITS_PER_BLOCK;                                              \
    };
QT(LMS_TYPE_F32, 128, 1)
QT(LMS_TYPE_F16, 64, 1)
QT(LMS_TYPE_BF16, 64, 1)
QT(LMS_TYPE_Q4_0, 18, 1)
QT(LMS_TYPE_Q4_1, 20, 1)
QT(LMS_TYPE_Q5_0, 22, 1)
QT(LMS_TYPE_Q5_1, 24, 1)
QT(LMS_TYPE_Q8_0, 34, 1)
QT(LMS_TYPE_Q2_K, 84, 8)
QT(LMS_TYPE_Q3_K, 110, 8)
QT(LMS_TYPE_Q4_K, 144, 8)
QT(LMS_TYPE_Q5_K, 176, 8)
QT(LMS_TYPE_Q6_K, 210, 8)
QT(LMS_TYPE_IQ4_NL, 18, 1)
QT(LMS_TYPE_IQ4_XS, 136, 8)
#undef QT

/* Unit u of a row at `row` into w[32]. */
template <int T> __device__ __forceinline__ void deq_unit(const uint8_t *row, int64_t u, float *w);

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_F32>(const uint8_t *row, int64_t u, float *w)
{
    const float4 *p = (const float4 *)(row + u * 128);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 v = __ldg(p + i);
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_F16>(const uint8_t *row, int64_t u, float *w)
{
    uint32_t q[16];
    load_words<64, 16>(row + u * 64, q);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        w[2 * i] = h2f((uint16_t)q[i]);
        w[2 * i + 1] = h2f((uint16_t)(q[i] >> 16));
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_BF16>(const uint8_t *row, int64_t u, float *w)
{
    uint32_t q[16];
    load_words<64, 16>(row + u * 64, q);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        w[2 * i] = bf2f((uint16_t)q[i]);
        w[2 * i + 1] = bf2f((uint16_t)(q[i] >> 16));
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q4_0>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + u * 18;
    float d = h2f(__ldg((const uint16_t *)b));
    uint32_t q[4];
    load_words<16, 2>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int c = byte_of(q, i);
        w[i] = (u2f(c & 15) - 8.0f) * d;
        w[i + 16] = (u2f(c >> 4) - 8.0f) * d;
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q4_1>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + u * 20;
    uint32_t dm = __ldg((const uint32_t *)b);
    float d = h2f((uint16_t)dm), m = h2f((uint16_t)(dm >> 16));
    uint32_t q[4];
    load_words<16, 4>(b + 4, q);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int c = byte_of(q, i);
        w[i] = u2f(c & 15) * d + m;
        w[i + 16] = u2f(c >> 4) * d + m;
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q5_0>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + u * 22;
    float d = h2f(__ldg((const uint16_t *)b));
    uint32_t qh = __ldg((const uint16_t *)b + 1) | (uint32_t)__ldg((const uint16_t *)b + 2) << 16;
    uint32_t q[4];
    load_words<16, 2>(b + 6, q);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int c = byte_of(q, i);
        int lo = (c & 15) | ((qh >> i) & 1) << 4, hi = (c >> 4) | ((qh >> (i + 16)) & 1) << 4;
        w[i] = (u2f(lo) - 16.0f) * d;
        w[i + 16] = (u2f(hi) - 16.0f) * d;
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q5_1>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + u * 24;
    uint32_t dm = __ldg((const uint32_t *)b);
    float d = h2f((uint16_t)dm), m = h2f((uint16_t)(dm >> 16));
    uint32_t qh = __ldg((const uint32_t *)b + 1);
    uint32_t q[4];
    load_words<16, 4>(b + 8, q);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int c = byte_of(q, i);
        int lo = (c & 15) | ((qh >> i) & 1) << 4, hi = (c >> 4) | ((qh >> (i + 16)) & 1) << 4;
        w[i] = u2f(lo) * d + m;
        w[i + 16] = u2f(hi) * d + m;
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q8_0>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + u * 34;
    float d = h2f(__ldg((const uint16_t *)b));
    uint32_t q[8];
    load_words<32, 2>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 32; i++)
        w[i] = (u2f(byte_of(q, i) ^ 0x80) - 128.0f) * d;
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q2_K>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + (u >> 3) * 84;
    const int s = (int)(u & 7);
    uint32_t dd = __ldg((const uint32_t *)(b + 80));
    float d = h2f((uint16_t)dd), dmin = h2f((uint16_t)(dd >> 16));
    uint32_t sc2 = __ldg((const uint16_t *)(b + 2 * s));
    uint32_t q[8];
    load_words<32, 4>(b + 16 + 32 * (s >> 2), q);
    const int sh = 2 * (s & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int sc = (sc2 >> (8 * h)) & 0xFF;
        float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
#pragma unroll
        for (int l = 16 * h; l < 16 * h + 16; l++)
            w[l] = dl * u2f((byte_of(q, l) >> sh) & 3) - ml;
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q3_K>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + (u >> 3) * 110;
    const int s = (int)(u & 7);
    float d = h2f(__ldg((const uint16_t *)(b + 108)));
    uint32_t hm[8], q[8], scw[3];
    load_words<32, 2>(b, hm);
    load_words<32, 2>(b + 32 + 32 * (s >> 2), q);
    load_words<12, 2>(b + 96, scw);
    const int sh = 2 * (s & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int j = 2 * s + h;
        int lo = (byte_of(scw, j % 8) >> (4 * (j / 8))) & 15;
        int hi = (byte_of(scw, 8 + j % 4) >> (2 * (j / 4))) & 3;
        float dl = d * (float)((lo | hi << 4) - 32);
#pragma unroll
        for (int l = 16 * h; l < 16 * h + 16; l++) {
            int c = ((byte_of(q, l) >> sh) & 3) + 4 * ((byte_of(hm, l) >> s) & 1);
            w[l] = dl * (u2f(c) - 4.0f);
        }
    }
}

/* Six-bit scale and min j of the Q4_K/Q5_K scale bytes. */
__device__ __forceinline__ void k4_scale(const uint32_t *sw, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = byte_of(sw, j) & 63;
        *mn = byte_of(sw, j + 4) & 63;
    } else {
        *sc = (byte_of(sw, j + 4) & 15) | (byte_of(sw, j - 4) >> 6) << 4;
        *mn = (byte_of(sw, j + 4) >> 4) | (byte_of(sw, j) >> 6) << 4;
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q4_K>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + (u >> 3) * 144;
    const int s = (int)(u & 7);
    uint4 hdr = __ldg((const uint4 *)b); /* d, dmin, scales[12] */
    uint32_t sw[3] = {hdr.y, hdr.z, hdr.w};
    float d = h2f((uint16_t)hdr.x), dmin = h2f((uint16_t)(hdr.x >> 16));
    int sc, mn;
    k4_scale(sw, s, &sc, &mn);
    float dl = d * (float)sc, ml = dmin * (float)mn;
    uint32_t q[8];
    load_words<32, 16>(b + 16 + 32 * (s >> 1), q);
    const int sh = 4 * (s & 1);
#pragma unroll
    for (int l = 0; l < 32; l++)
        w[l] = dl * u2f((byte_of(q, l) >> sh) & 15) - ml;
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q5_K>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + (u >> 3) * 176;
    const int s = (int)(u & 7);
    uint4 hdr = __ldg((const uint4 *)b);
    uint32_t sw[3] = {hdr.y, hdr.z, hdr.w};
    float d = h2f((uint16_t)hdr.x), dmin = h2f((uint16_t)(hdr.x >> 16));
    int sc, mn;
    k4_scale(sw, s, &sc, &mn);
    float dl = d * (float)sc, ml = dmin * (float)mn;
    uint32_t q[8], qh[8];
    load_words<32, 16>(b + 16, qh);
    load_words<32, 16>(b + 48 + 32 * (s >> 1), q);
    const int sh = 4 * (s & 1);
#pragma unroll
    for (int l = 0; l < 32; l++) {
        int c = ((byte_of(q, l) >> sh) & 15) | ((byte_of(qh, l) >> s) & 1) << 4;
        w[l] = dl * u2f(c) - ml;
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_Q6_K>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + (u >> 3) * 210;
    const int s = (int)(u & 7);
    float d = h2f(__ldg((const uint16_t *)(b + 208)));
    uint32_t sc2 = __ldg((const uint16_t *)(b + 192 + 2 * s));
    uint32_t ql[8], qh[8];
    load_words<32, 2>(b + 64 * (s >> 2) + 32 * (s & 1), ql);
    load_words<32, 2>(b + 128 + 32 * (s >> 2), qh);
    const int shl = 4 * ((s & 3) >> 1), shh = 2 * (s & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float dl = d * (float)(int8_t)((sc2 >> (8 * h)) & 0xFF);
#pragma unroll
        for (int l = 16 * h; l < 16 * h + 16; l++) {
            int c = ((byte_of(ql, l) >> shl) & 15) | ((byte_of(qh, l) >> shh) & 3) << 4;
            w[l] = dl * (u2f(c) - 32.0f);
        }
    }
}

/* 16 bytes of IQ4 index nibbles (low nibbles: elements 0-15, high: 16-31)
 * to w[32] = d * value, the reference's order (to_float_iq4_nl_ref; IQ4_XS:
 * d = d * (scale - 32), as kq_to_float, whose "- dmin * min" is - 0). */
__device__ __forceinline__ void iq4_deq(const uint32_t (&q)[4], float d, float *w)
{
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int v = mq::iq4_lookup(i < 4 ? q[i] & 0x0F0F0F0Fu : (q[i - 4] >> 4) & 0x0F0F0F0Fu);
#pragma unroll
        for (int k = 0; k < 4; k++)
            w[4 * i + k] = d * (float)(int8_t)(v >> (8 * k));
    }
}

template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_IQ4_NL>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + u * 18;
    uint32_t q[4];
    load_words<16, 2>(b + 2, q);
    iq4_deq(q, h2f(__ldg((const uint16_t *)b)), w);
}

/* Blocks of 136 bytes keep rows 8-byte aligned only. */
template <> __device__ __forceinline__ void deq_unit<LMS_TYPE_IQ4_XS>(const uint8_t *row, int64_t u, float *w)
{
    const uint8_t *b = row + (u >> 3) * 136;
    const int s = (int)(u & 7);
    const uint2 h = __ldg((const uint2 *)b); /* d, scales_h, scales_l[4] */
    const int lo = (int)(h.y >> (4 * s)) & 15, hi = (int)(h.x >> (16 + 2 * s)) & 3;
    uint32_t q[4];
    load_words<16, 8>(b + 8 + 16 * s, q);
    iq4_deq(q, h2f((uint16_t)h.x) * (float)((lo | hi << 4) - 32), w);
}

/* Calls F.template operator()<T>() for a run-time type id; false if the
 * type has no kernels. */
#define LCU_TYPES(X)                                                                               \
    X(LMS_TYPE_F32) X(LMS_TYPE_F16) X(LMS_TYPE_BF16) X(LMS_TYPE_Q4_0) X(LMS_TYPE_Q4_1)             \
    X(LMS_TYPE_Q5_0) X(LMS_TYPE_Q5_1) X(LMS_TYPE_Q8_0) X(LMS_TYPE_Q2_K) X(LMS_TYPE_Q3_K)           \
    X(LMS_TYPE_Q4_K) X(LMS_TYPE_Q5_K) X(LMS_TYPE_Q6_K) X(LMS_TYPE_IQ4_NL) X(LMS_TYPE_IQ4_XS)

#endif
