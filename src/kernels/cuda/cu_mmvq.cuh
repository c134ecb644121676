/*
 * cu_mmvq.cuh - int8 dot products of quantized weight rows with int8
 * activations, for the decode (matrix-vector) kernels of cu_mmvq.cu.
 *
 * Activations (the "q8" format): every 32 consecutive values of a row are
 * stored as 32 int8 q[i] = round(x[i] / d) with d = max|x| / 127, and a
 * float2 (d, d * sum q[i]) per 32. qs is [n_tok][n] int8, ds [n_tok][n/32]
 * float2; within a buffer made by lcu_q8_* the flat element index i gives
 * qs[i] and ds[i / 32].
 *
 * Central idea: a row of any supported type splits into "chunks" of 32
 * elements, chunk c = thread work item; each thread loads the chunk's
 * quant bits once (wide loads where the block layout is aligned), unpacks
 * them into bytes in registers (prep), and then dots them with the q8
 * activations of every token of the batch with __dp4a (4 multiply-adds
 * per instruction). The block's float scales are applied once per group
 * of integers. Layouts are those of cu_quant.cuh / kernels/cpu/quant_ref.c:
 *
 *   Q4_K/Q5_K  chunk c: super-block c/8, pair j = (c/2)%4, half h = c%2:
 *              qs bytes [32j + 16h, +16): low nibbles are elements
 *              64j + 16h + [0,16) (sub-block 2j), high nibbles elements
 *              64j + 32 + 16h + [0,16) (sub-block 2j+1); Q5_K's fifth bit
 *              is bit 2j / 2j+1 of qh[16h + l]. The min term d_min*m*sum(x)
 *              of a sub-block is added once, by the h = 0 chunk, from the
 *              q8 block sums.
 *   Q6_K       chunk c: super-block c/8, half n = (c/4)%2, l0 = 8 (c%4):
 *              ql[64n + l0 + i], ql[64n + 32 + l0 + i], qh[32n + l0 + i],
 *              i < 8, hold elements 128n + l0 + i + {0, 32, 64, 96}.
 *   Q8_0/Q4_0  chunk c = block c.
 *
 * Q6_K, Q8_0 and Q4_0 blocks are only 2-byte aligned: their words are
 * read as aligned 32-bit words and funnel-shifted into place.
 *
 * Everything here is __host__ __device__ so that tests can check the bit
 * manipulation against the CPU reference without a GPU.
 */
#ifndef LMS_CU_MMVQ_CUH
#define LMS_CU_MMVQ_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#if defined(__cplusplus) && !defined(_Static_assert)
#define _Static_assert static_assert
#endif
#include "kernels/qtypes.h"

#define LCU_HD __host__ __device__ __forceinline__

namespace mq {

#ifdef __CUDA_ARCH__
LCU_HD uint32_t ld32(const void *p) { return __ldg((const uint32_t *)p); }
LCU_HD uint32_t ld16(const void *p) { return __ldg((const uint16_t *)p); }
LCU_HD uint4 ld128(const void *p) { return __ldg((const uint4 *)p); }
LCU_HD int4 ldi128(const void *p) { return __ldg((const int4 *)p); }
LCU_HD int2 ldi64(const void *p) { return __ldg((const int2 *)p); }
LCU_HD float4 ldf128(const void *p) { return __ldg((const float4 *)p); }
LCU_HD float2 ldf64(const void *p) { return __ldg((const float2 *)p); }
LCU_HD int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }
LCU_HD uint32_t fshr(uint32_t lo, uint32_t hi, int sh) { return __funnelshift_r(lo, hi, sh); }
LCU_HD float hf(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }
#else
LCU_HD uint32_t ld32(const void *p) { return *(const uint32_t *)p; }
LCU_HD uint32_t ld16(const void *p) { return *(const uint16_t *)p; }
LCU_HD uint4 ld128(const void *p) { return *(const uint4 *)p; }
LCU_HD int4 ldi128(const void *p) { return *(const int4 *)p; }
LCU_HD int2 ldi64(const void *p) { return *(const int2 *)p; }
LCU_HD float4 ldf128(const void *p) { return *(const float4 *)p; }
LCU_HD float2 ldf64(const void *p) { return *(const float2 *)p; }
LCU_HD int dp4a(int a, int b, int c)
{
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
LCU_HD uint32_t fshr(uint32_t lo, uint32_t hi, int sh)
{
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
LCU_HD float hf(uint32_t h)
{
    __half_raw r;
    r.x = (unsigned short)h;
    return __half2float(__half(r));
}
#endif

/* N 32-bit words from a 2-byte aligned address. */
template <int N> LCU_HD void ldw_a2(const uint8_t *p, uint32_t *o)
{
    const uintptr_t a = (uintptr_t)p;
    const uint8_t *b = (const uint8_t *)(a & ~(uintptr_t)3);
    const int sh = (int)(a & 3) * 8;
    uint32_t w[N + 1];
#pragma unroll
    for (int i = 0; i < N; i++)
        w[i] = ld32(b + 4 * i);
    w[N] = sh ? ld32(b + 4 * N) : 0u;
#pragma unroll
    for (int i = 0; i < N; i++)
        o[i] = fshr(w[i], w[i + 1], sh);
}

/* Per-byte q - 32 for bytes q < 128, as signed bytes (no borrow between bytes). */
LCU_HD int sub32(uint32_t v)
{
    return (int)(((v | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
}

/* Six-bit scales and mins of the sub-block pair (2j, 2j+1) of a Q4_K/Q5_K
 * header (w0..w2 = scale bytes 0-3, 4-7, 8-11), as two bytes each. */
LCU_HD void k4_pair(uint32_t w0, uint32_t w1, uint32_t w2, int j, uint32_t *sc, uint32_t *mn)
{
    const int k = (j & 1) * 16;
    if (j < 2) {
        *sc = (w0 >> k) & 0x3F3Fu;
        *mn = (w1 >> k) & 0x3F3Fu;
    } else {
        *sc = ((w2 >> k) & 0x0F0Fu) | ((w0 >> k >> 2) & 0x3030u);
        *mn = ((w2 >> k >> 4) & 0x0F0Fu) | ((w1 >> k >> 2) & 0x3030u);
    }
}

template <int T> struct ops;

/* ---- Q4_K ------------------------------------------------------------------ */
template <> struct ops<LMS_TYPE_Q4_K> {
    struct raw {
        uint4 h, q;
    };
    struct prep {
        int lo[4], hi[4];
        float da, db, ma, mb;
    };
    static LCU_HD void load(const uint8_t *row, int c, raw &r)
    {
        const uint8_t *b = row + (size_t)(c >> 3) * 144;
        r.h = ld128(b);
        r.q = ld128(b + 16 + 32 * ((c >> 1) & 3) + 16 * (c & 1));
    }
    static LCU_HD void unpack(const raw &r, int c, prep &p)
    {
        const int j = (c >> 1) & 3;
        const float d = hf(r.h.x & 0xFFFF), dmin = hf(r.h.x >> 16);
        uint32_t sc, mn;
        k4_pair(r.h.y, r.h.z, r.h.w, j, &sc, &mn);
        p.da = d * (float)(sc & 0xFF);
        p.db = d * (float)(sc >> 8);
        const bool first = (c & 1) == 0;
        p.ma = first ? dmin * (float)(mn & 0xFF) : 0.0f;
        p.mb = first ? dmin * (float)(mn >> 8) : 0.0f;
        const uint32_t q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.lo[i] = (int)(q[i] & 0x0F0F0F0Fu);
            p.hi[i] = (int)((q[i] >> 4) & 0x0F0F0F0Fu);
        }
    }
    /* A token's q8 values for chunk c (xs, xd: its q8 row, int8 [n], float2 [n/32]). */
    struct act {
        int4 a0, a1;
        float4 e;
    };
    static LCU_HD void load_act(const int8_t *xs, const float2 *xd, int c, act &x)
    {
        const int sb = c >> 3, j = (c >> 1) & 3, h = c & 1;
        const int8_t *a = xs + (size_t)sb * 256 + 64 * j + 16 * h;
        x.a0 = ldi128(a);
        x.a1 = ldi128(a + 32);
        x.e = ldf128(xd + (size_t)sb * 8 + 2 * j);
    }
    static LCU_HD float dotp(const prep &p, const act &x)
    {
        int sa = dp4a(p.lo[0], x.a0.x, 0);
        sa = dp4a(p.lo[1], x.a0.y, sa);
        sa = dp4a(p.lo[2], x.a0.z, sa);
        sa = dp4a(p.lo[3], x.a0.w, sa);
        int sb = dp4a(p.hi[0], x.a1.x, 0);
        sb = dp4a(p.hi[1], x.a1.y, sb);
        sb = dp4a(p.hi[2], x.a1.z, sb);
        sb = dp4a(p.hi[3], x.a1.w, sb);
        return x.e.x * (p.da * (float)sa) + x.e.z * (p.db * (float)sb) - (p.ma * x.e.y + p.mb * x.e.w);
    }
    static LCU_HD float dot(const prep &p, const int8_t *xs, const float2 *xd, int c)
    {
        act x;
        load_act(xs, xd, c, x);
        return dotp(p, x);
    }
};

/* ---- Q5_K ------------------------------------------------------------------ */
template <> struct ops<LMS_TYPE_Q5_K> {
    struct raw {
        uint4 h, q, qh;
    };
    typedef ops<LMS_TYPE_Q4_K>::prep prep;
    static LCU_HD void load(const uint8_t *row, int c, raw &r)
    {
        const uint8_t *b = row + (size_t)(c >> 3) * 176;
        r.h = ld128(b);
        r.qh = ld128(b + 16 + 16 * (c & 1));
        r.q = ld128(b + 48 + 32 * ((c >> 1) & 3) + 16 * (c & 1));
    }
    static LCU_HD void unpack(const raw &r, int c, prep &p)
    {
        const int j = (c >> 1) & 3;
        const float d = hf(r.h.x & 0xFFFF), dmin = hf(r.h.x >> 16);
        uint32_t sc, mn;
        k4_pair(r.h.y, r.h.z, r.h.w, j, &sc, &mn);
        p.da = d * (float)(sc & 0xFF);
        p.db = d * (float)(sc >> 8);
        const bool first = (c & 1) == 0;
        p.ma = first ? dmin * (float)(mn & 0xFF) : 0.0f;
        p.mb = first ? dmin * (float)(mn >> 8) : 0.0f;
        const uint32_t q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        const uint32_t qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.lo[i] = (int)((q[i] & 0x0F0F0F0Fu) | (((qh[i] >> (2 * j)) & 0x01010101u) << 4));
            p.hi[i] = (int)(((q[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * j + 1)) & 0x01010101u) << 4));
        }
    }
    typedef ops<LMS_TYPE_Q4_K>::act act;
    static LCU_HD void load_act(const int8_t *xs, const float2 *xd, int c, act &x)
    {
        ops<LMS_TYPE_Q4_K>::load_act(xs, xd, c, x);
    }
    static LCU_HD float dotp(const prep &p, const act &x) { return ops<LMS_TYPE_Q4_K>::dotp(p, x); }
    static LCU_HD float dot(const prep &p, const int8_t *xs, const float2 *xd, int c)
    {
        return ops<LMS_TYPE_Q4_K>::dot(p, xs, xd, c);
    }
};

/* ---- Q6_K ------------------------------------------------------------------ */
template <> struct ops<LMS_TYPE_Q6_K> {
    struct raw {
        uint32_t qa[2], qb[2], qh[2], sc[2], d;
    };
    struct prep {
        int v[4][2];
        float dg[4];
    };
    static LCU_HD void load(const uint8_t *row, int c, raw &r)
    {
        const uint8_t *b = row + (size_t)(c >> 3) * 210;
        const int n = (c >> 2) & 1, l0 = 8 * (c & 3);
        ldw_a2<2>(b + 64 * n + l0, r.qa);
        ldw_a2<2>(b + 64 * n + 32 + l0, r.qb);
        ldw_a2<2>(b + 128 + 32 * n + l0, r.qh);
        ldw_a2<2>(b + 192 + 8 * n, r.sc);
        r.d = ld16(b + 208);
    }
    static LCU_HD void unpack(const raw &r, int c, prep &p)
    {
        const float d = hf(r.d);
        const int sh = 8 * ((c & 3) >> 1); /* l0 >> 4 */
#pragma unroll
        for (int g = 0; g < 4; g++)
            p.dg[g] = d * (float)(int8_t)((r.sc[g >> 1] >> (sh + 16 * (g & 1))) & 0xFF);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            p.v[0][k] = sub32((r.qa[k] & 0x0F0F0F0Fu) | ((r.qh[k] << 4) & 0x30303030u));
            p.v[1][k] = sub32((r.qb[k] & 0x0F0F0F0Fu) | ((r.qh[k] << 2) & 0x30303030u));
            p.v[2][k] = sub32(((r.qa[k] >> 4) & 0x0F0F0F0Fu) | (r.qh[k] & 0x30303030u));
            p.v[3][k] = sub32(((r.qb[k] >> 4) & 0x0F0F0F0Fu) | ((r.qh[k] >> 2) & 0x30303030u));
        }
    }
    struct act {
        int2 a[4];
        float d8[4];
    };
    static LCU_HD void load_act(const int8_t *xs, const float2 *xd, int c, act &x)
    {
        const int sb = c >> 3, n = (c >> 2) & 1, l0 = 8 * (c & 3);
        const int8_t *a = xs + (size_t)sb * 256 + 128 * n + l0;
#pragma unroll
        for (int g = 0; g < 4; g++)
            x.a[g] = ldi64(a + 32 * g);
        const float4 e0 = ldf128(xd + (size_t)sb * 8 + 4 * n), e1 = ldf128(xd + (size_t)sb * 8 + 4 * n + 2);
        x.d8[0] = e0.x, x.d8[1] = e0.z, x.d8[2] = e1.x, x.d8[3] = e1.z;
    }
    static LCU_HD float dotp(const prep &p, const act &x)
    {
        float s = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int si = dp4a(p.v[g][1], x.a[g].y, dp4a(p.v[g][0], x.a[g].x, 0));
            s += p.dg[g] * x.d8[g] * (float)si;
        }
        return s;
    }
    static LCU_HD float dot(const prep &p, const int8_t *xs, const float2 *xd, int c)
    {
        act x;
        load_act(xs, xd, c, x);
        return dotp(p, x);
    }
};

/* ---- Q8_0 ------------------------------------------------------------------ */
template <> struct ops<LMS_TYPE_Q8_0> {
    struct raw {
        uint32_t q[8], d;
    };
    struct prep {
        int q[8];
        float d;
    };
    static LCU_HD void load(const uint8_t *row, int c, raw &r)
    {
        const uint8_t *b = row + (size_t)c * 34;
        r.d = ld16(b);
        ldw_a2<8>(b + 2, r.q);
    }
    static LCU_HD void unpack(const raw &r, int c, prep &p)
    {
        (void)c;
        p.d = hf(r.d);
#pragma unroll
        for (int i = 0; i < 8; i++)
            p.q[i] = (int)r.q[i];
    }
    struct act {
        int4 a0, a1;
        float2 e;
    };
    static LCU_HD void load_act(const int8_t *xs, const float2 *xd, int c, act &x)
    {
        x.a0 = ldi128(xs + (size_t)c * 32);
        x.a1 = ldi128(xs + (size_t)c * 32 + 16);
        x.e = ldf64(xd + c);
    }
    static LCU_HD float dot(const prep &p, const int8_t *xs, const float2 *xd, int c)
    {
        act x;
        load_act(xs, xd, c, x);
        return dotp(p, x);
    }
    static LCU_HD float dotp(const prep &p, const act &x)
    {
        const int4 a0 = x.a0, a1 = x.a1;
        const float2 e = x.e;
        int s = dp4a(p.q[0], a0.x, 0);
        s = dp4a(p.q[1], a0.y, s);
        s = dp4a(p.q[2], a0.z, s);
        s = dp4a(p.q[3], a0.w, s);
        s = dp4a(p.q[4], a1.x, s);
        s = dp4a(p.q[5], a1.y, s);
        s = dp4a(p.q[6], a1.z, s);
        s = dp4a(p.q[7], a1.w, s);
        return p.d * e.x * (float)s;
    }
};

/* ---- Q4_0 ------------------------------------------------------------------ */
template <> struct ops<LMS_TYPE_Q4_0> {
    struct raw {
        uint32_t q[4], d;
    };
    struct prep {
        int lo[4], hi[4];
        float d;
    };
    static LCU_HD void load(const uint8_t *row, int c, raw &r)
    {
        const uint8_t *b = row + (size_t)c * 18;
        r.d = ld16(b);
        ldw_a2<4>(b + 2, r.q);
    }
    static LCU_HD void unpack(const raw &r, int c, prep &p)
    {
        (void)c;
        p.d = hf(r.d);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.lo[i] = (int)(r.q[i] & 0x0F0F0F0Fu);
            p.hi[i] = (int)((r.q[i] >> 4) & 0x0F0F0F0Fu);
        }
    }
    typedef ops<LMS_TYPE_Q8_0>::act act;
    static LCU_HD void load_act(const int8_t *xs, const float2 *xd, int c, act &x)
    {
        ops<LMS_TYPE_Q8_0>::load_act(xs, xd, c, x);
    }
    static LCU_HD float dot(const prep &p, const int8_t *xs, const float2 *xd, int c)
    {
        act x;
        load_act(xs, xd, c, x);
        return dotp(p, x);
    }
    static LCU_HD float dotp(const prep &p, const act &x)
    {
        const int4 a0 = x.a0, a1 = x.a1;
        const float2 e = x.e;
        int s = dp4a(p.lo[0], a0.x, 0);
        s = dp4a(p.lo[1], a0.y, s);
        s = dp4a(p.lo[2], a0.z, s);
        s = dp4a(p.lo[3], a0.w, s);
        s = dp4a(p.hi[0], a1.x, s);
        s = dp4a(p.hi[1], a1.y, s);
        s = dp4a(p.hi[2], a1.z, s);
        s = dp4a(p.hi[3], a1.w, s);
        return p.d * (e.x * (float)s - 8.0f * e.y);
    }
};

/* Whether a type has int8 kernels (chunks of 32 elements; K-quants need
 * n_cols % 256 == 0, which their block size implies). */
LCU_HD bool has_ops(int type)
{
    return type == LMS_TYPE_Q4_K || type == LMS_TYPE_Q5_K || type == LMS_TYPE_Q6_K ||
           type == LMS_TYPE_Q8_0 || type == LMS_TYPE_Q4_0;
}

/* q8 of 32 values (host reference; the device kernels do the same per lane
 * with warp reductions). */
inline void quant_block_host(const float *x, int8_t *q, float2 *ds)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; i++) {
        q[i] = (int8_t)lrintf(x[i] * id);
        sum += q[i];
    }
    *ds = make_float2(d, d * (float)sum);
}

} // namespace mq

#endif
