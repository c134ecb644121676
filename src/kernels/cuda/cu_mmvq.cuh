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
 *   IQ4_NL     chunk c = block c; IQ4_XS chunk c: super-block c/8, sub-block
 *              c%8. Their 4-bit indices become int8 table values
 *              (iq4_lookup), so the dot is Q8_0's.
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
LCU_HD uint2 ldu64(const void *p) { return __ldg((const uint2 *)p); }
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
LCU_HD uint2 ldu64(const void *p) { return *(const uint2 *)p; }
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

/* ---- IQ4 table lookup ------------------------------------------------------------
 * IQ4_NL / IQ4_XS store 4-bit indices into a 16-entry int8 table
 * (LMS_IQ4_VALUES). The table lives in four 32-bit constants; iq4_lookup
 * turns a word of four indices (one per byte, 0..15) into a word of the
 * four int8 values with two byte permutes, one over entries 0-7 and one
 * over 8-15, and keeps per byte the one that bit 3 of its index picks. */
constexpr int8_t iq4_table[16] = LMS_IQ4_VALUES;
constexpr uint32_t iq4_word(int i)
{
    return (uint32_t)(uint8_t)iq4_table[4 * i] | (uint32_t)(uint8_t)iq4_table[4 * i + 1] << 8 |
           (uint32_t)(uint8_t)iq4_table[4 * i + 2] << 16 |
           (uint32_t)(uint8_t)iq4_table[4 * i + 3] << 24;
}
constexpr uint32_t IQ4_W0 = iq4_word(0), IQ4_W1 = iq4_word(1), IQ4_W2 = iq4_word(2),
                   IQ4_W3 = iq4_word(3);
static_assert(IQ4_W0 == 0xBFAD9881u && IQ4_W3 == 0x71594535u, "IQ4 table words");

/* Bytes (s >> 4n) & 7 of the eight bytes {x, y} (s: 4 selector nibbles
 * with bit 3 clear, so the permute's sign-replicate mode never applies). */
LCU_HD uint32_t perm8(uint32_t x, uint32_t y, uint32_t s)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(x, y, s);
#else
    const uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int n = 0; n < 4; n++)
        r |= (uint32_t)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
#endif
}

/* q: four table indices, one per byte (each < 16); the four values. */
LCU_HD int iq4_lookup(uint32_t q)
{
    const uint32_t t = q | q >> 4;                                /* bytes 0, 2: i0 | i1 << 4, i2 | i3 << 4 */
    const uint32_t s = ((t & 0xFFu) | ((t >> 8) & 0xFF00u)) & 0x7777u; /* i0..i3 in nibbles, low 3 bits */
    const uint32_t lo = perm8(IQ4_W0, IQ4_W1, s), hi = perm8(IQ4_W2, IQ4_W3, s);
    const uint32_t m = ((q >> 3) & 0x01010101u) * 0xFFu;        /* 0xFF where the index is >= 8 */
    return (int)((lo & ~m) | (hi & m));
}

/* The same for the four nibbles (n0 | n1 << 4 | n2 << 8 | n3 << 12) of
 * w >> sh, as they lie in the qs bytes (low, high, low, high nibble):
 * the lookups select from the nibbles directly, and a third permute
 * takes each byte from entries 0-7 or 8-15. */
LCU_HD int iq4_lookup_nib(uint32_t w, int sh)
{
    const uint32_t s = (w >> sh) & 0x7777u;
    const uint32_t lo = perm8(IQ4_W0, IQ4_W1, s), hi = perm8(IQ4_W2, IQ4_W3, s);
    return (int)perm8(lo, hi, 0x3210u | ((w >> (sh + 1)) & 0x4444u));
}

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

/* 16 bytes from a 2-byte aligned address, as four words, read with the two
 * aligned 16-byte loads that cover them (the bytes up to 16 past the end
 * must be readable) and shifted into place: fewer, wider loads than
 * ldw_a2<4> for some ALU work. */
LCU_HD void ld16_a2(const uint8_t *p, uint32_t (&o)[4])
{
    const uintptr_t a = (uintptr_t)p, b = a & ~(uintptr_t)15;
    const uint4 x = ld128((const void *)b), y = ld128((const void *)(b + 16));
    const uint32_t w[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
    const int q = (int)(a & 15) >> 2, sh = (int)(a & 3) * 8;
    uint32_t r[5];
#pragma unroll
    for (int k = 0; k < 5; k++) {
        const uint32_t t0 = (q & 1) ? w[k + 1] : w[k];
        const uint32_t t1 = (q & 1) ? w[k + 3] : w[k + 2];
        r[k] = (q & 2) ? t1 : t0;
    }
#pragma unroll
    for (int k = 0; k < 4; k++)
        o[k] = fshr(r[k], r[k + 1], sh);
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

/* ---- 64-element units for one token (mv1 kernels of cu_mmvq.cu) ----------------
 * With a single token there is nothing to reuse an unpacked chunk for, so
 * the per-chunk overhead (header loads, scale decoding, address arithmetic)
 * is paid per 32 weights. A unit is the work of two chunks that share all
 * of it: 64 elements whose scales come from one header, read as whole
 * 16-byte runs, and whose q8 activations are 64 contiguous bytes.
 *
 *   Q4_K  unit u: super-block u/4, pair j = u%4: qs bytes [32j, 32j + 32);
 *         low nibbles are elements 64j + [0,32) (sub-block 2j), high
 *         nibbles 64j + 32 + [0,32) (sub-block 2j+1).
 *   Q6_K  unit u: super-block u/4, half n = (u/2)%2, h = u%2: ql bytes
 *         [64n + 16h, +16) and [64n + 32 + 16h, +16), qh bytes
 *         [128 + 32n + 16h, +16) hold elements 128n + 16h + [0,16) + 32g,
 *         g = 0..3, whose scales are sc[8n + 2g + h].
 * load() reads only weights (the kernels issue it before waiting for the
 * activations' producer); dot() returns the unit's float contribution. */
template <int T> struct unit;

template <> struct unit<LMS_TYPE_Q4_K> {
    struct raw {
        uint4 h, q0, q1;
    };
    static LCU_HD void load(const uint8_t *row, int u, raw &r)
    {
        const uint8_t *b = row + (size_t)(u >> 2) * 144 + 16 + 32 * (u & 3);
        r.h = ld128(b - 16 - 32 * (u & 3));
        r.q0 = ld128(b);
        r.q1 = ld128(b + 16);
    }
    static LCU_HD float dot(const raw &r, int u, const int8_t *xs, const float2 *xd)
    {
        const int j = u & 3;
        const int8_t *a = xs + (size_t)(u >> 2) * 256 + 64 * j;
        const int4 a0 = ldi128(a), a1 = ldi128(a + 16), a2 = ldi128(a + 32), a3 = ldi128(a + 48);
        const float4 e = ldf128(xd + (size_t)(u >> 2) * 8 + 2 * j);
        const uint32_t q[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
        const int lo[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const int hi[8] = {a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
        int sa = 0, sb = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            sa = dp4a((int)(q[i] & 0x0F0F0F0Fu), lo[i], sa);
            sb = dp4a((int)((q[i] >> 4) & 0x0F0F0F0Fu), hi[i], sb);
        }
        uint32_t sc, mn;
        k4_pair(r.h.y, r.h.z, r.h.w, j, &sc, &mn);
        const float d = hf(r.h.x & 0xFFFF), dmin = hf(r.h.x >> 16);
        return d * (e.x * (float)(sc & 0xFF) * (float)sa + e.z * (float)(sc >> 8) * (float)sb) -
               dmin * ((float)(mn & 0xFF) * e.y + (float)(mn >> 8) * e.w);
    }
};

template <> struct unit<LMS_TYPE_Q6_K> {
    struct raw {
        uint32_t qa[4], qb[4], qh[4], sc[2], d;
    };
    static LCU_HD void load(const uint8_t *row, int u, raw &r)
    {
        const uint8_t *b = row + (size_t)(u >> 2) * 210;
        const int n = (u >> 1) & 1, o = 16 * (u & 1);
        ld16_a2(b + 64 * n + o, r.qa);
        ld16_a2(b + 64 * n + 32 + o, r.qb);
        ld16_a2(b + 128 + 32 * n + o, r.qh);
        ldw_a2<2>(b + 192 + 8 * n, r.sc);
        r.d = ld16(b + 208);
    }
    static LCU_HD float dot(const raw &r, int u, const int8_t *xs, const float2 *xd)
    {
        const int n = (u >> 1) & 1, h = u & 1;
        const int8_t *a = xs + (size_t)(u >> 2) * 256 + 128 * n + 16 * h;
        const int4 a0 = ldi128(a), a1 = ldi128(a + 32), a2 = ldi128(a + 64), a3 = ldi128(a + 96);
        const float4 e0 = ldf128(xd + (size_t)(u >> 2) * 8 + 4 * n);
        const float4 e1 = ldf128(xd + (size_t)(u >> 2) * 8 + 4 * n + 2);
        const int x0[4] = {a0.x, a0.y, a0.z, a0.w}, x1[4] = {a1.x, a1.y, a1.z, a1.w};
        const int x2[4] = {a2.x, a2.y, a2.z, a2.w}, x3[4] = {a3.x, a3.y, a3.z, a3.w};
        int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t qa = r.qa[k], qb = r.qb[k], qh = r.qh[k];
            s0 = dp4a(sub32((qa & 0x0F0F0F0Fu) | ((qh << 4) & 0x30303030u)), x0[k], s0);
            s1 = dp4a(sub32((qb & 0x0F0F0F0Fu) | ((qh << 2) & 0x30303030u)), x1[k], s1);
            s2 = dp4a(sub32(((qa >> 4) & 0x0F0F0F0Fu) | (qh & 0x30303030u)), x2[k], s2);
            s3 = dp4a(sub32(((qb >> 4) & 0x0F0F0F0Fu) | ((qh >> 2) & 0x30303030u)), x3[k], s3);
        }
        /* scale bytes h, h + 2 (word 0) and h, h + 2 (word 1) */
        const int sh = 8 * h;
        const float c0 = (float)(int8_t)(r.sc[0] >> sh), c1 = (float)(int8_t)(r.sc[0] >> (sh + 16));
        const float c2 = (float)(int8_t)(r.sc[1] >> sh), c3 = (float)(int8_t)(r.sc[1] >> (sh + 16));
        return hf(r.d) * (c0 * e0.x * (float)s0 + c1 * e0.z * (float)s1 + c2 * e1.x * (float)s2 +
                          c3 * e1.z * (float)s3);
    }
};

/* ---- IQ4_NL / IQ4_XS ---------------------------------------------------------
 * A chunk is 16 qs bytes (low nibbles: elements 0-15, high: 16-31) and one
 * float scale. Each qs word i (elements 4i..4i+3 and 16+4i..) is looked up
 * in nibble order, two words of values: {4i, 16+4i, 4i+1, 17+4i} and
 * {4i+2, 18+4i, 4i+3, 19+4i}; load_act puts the q8 activations in the same
 * order (a byte permute a token, shared by the rows), so the unpacking
 * needs no nibble masks or reordering. */
struct iq4_ops {
    struct prep {
        int q[8];
        float d;
    };
    struct act {
        int x[8];
        float2 e;
    };
    static LCU_HD void unpack_qs(const uint32_t (&q)[4], float d, prep &p)
    {
        p.d = d;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.q[2 * i] = iq4_lookup_nib(q[i], 0);
            p.q[2 * i + 1] = iq4_lookup_nib(q[i], 16);
        }
    }
    static LCU_HD void load_act(const int8_t *xs, const float2 *xd, int c, act &x)
    {
        ops<LMS_TYPE_Q8_0>::act a;
        ops<LMS_TYPE_Q8_0>::load_act(xs, xd, c, a);
        const uint32_t lo[4] = {(uint32_t)a.a0.x, (uint32_t)a.a0.y, (uint32_t)a.a0.z, (uint32_t)a.a0.w};
        const uint32_t hi[4] = {(uint32_t)a.a1.x, (uint32_t)a.a1.y, (uint32_t)a.a1.z, (uint32_t)a.a1.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x.x[2 * i] = (int)perm8(lo[i], hi[i], 0x5140u);
            x.x[2 * i + 1] = (int)perm8(lo[i], hi[i], 0x7362u);
        }
        x.e = a.e;
    }
    static LCU_HD float dotp(const prep &p, const act &x)
    {
        int s = 0;
#pragma unroll
        for (int k = 0; k < 8; k++)
            s = dp4a(p.q[k], x.x[k], s);
        return p.d * x.e.x * (float)s;
    }
    static LCU_HD float dot(const prep &p, const int8_t *xs, const float2 *xd, int c)
    {
        act x;
        load_act(xs, xd, c, x);
        return dotp(p, x);
    }
};

/* IQ4_NL: Q4_0's block layout with table values instead of q - 8. */
template <> struct ops<LMS_TYPE_IQ4_NL> : iq4_ops {
    typedef ops<LMS_TYPE_Q4_0>::raw raw;
    static LCU_HD void load(const uint8_t *row, int c, raw &r) { ops<LMS_TYPE_Q4_0>::load(row, c, r); }
    static LCU_HD void unpack(const raw &r, int c, prep &p)
    {
        (void)c;
        unpack_qs(r.q, hf(r.d), p);
    }
};

/* IQ4_XS chunk c: super-block c/8, sub-block s = c%8, whose 16 qs bytes
 * are at 8 + 16 s and whose scale is d * (6-bit scale - 32), the scale
 * from nibble s%2 of scales_l[s/2] and bits 2s, 2s+1 of scales_h. The
 * 136-byte blocks keep rows only 8-byte aligned: 8-byte loads. */
template <> struct ops<LMS_TYPE_IQ4_XS> : iq4_ops {
    struct raw {
        uint2 h, q0, q1; /* h: d, scales_h, scales_l[4] */
    };
    static LCU_HD void load(const uint8_t *row, int c, raw &r)
    {
        const uint8_t *b = row + (size_t)(c >> 3) * 136;
        r.h = ldu64(b);
        r.q0 = ldu64(b + 8 + 16 * (c & 7));
        r.q1 = ldu64(b + 16 + 16 * (c & 7));
    }
    static LCU_HD void unpack(const raw &r, int c, prep &p)
    {
        const int s = c & 7;
        const int lo = (int)(r.h.y >> (4 * s)) & 15; /* scales_l[s / 2] >> 4 (s % 2) */
        const int hi = (int)(r.h.x >> (16 + 2 * s)) & 3;
        const uint32_t q[4] = {r.q0.x, r.q0.y, r.q1.x, r.q1.y};
        unpack_qs(q, hf(r.h.x & 0xFFFF) * (float)((lo | hi << 4) - 32), p);
    }
};

/* Whether a type has 64-element unit code (the others run chunk by chunk). */
LCU_HD bool has_unit(int type)
{
    return type == LMS_TYPE_Q4_K || type == LMS_TYPE_Q6_K;
}

/* ---- tensor-core fragments (mma.sync m16n8k32 / m16n8k16, int8) -----------------
 * A warp multiplies 16 weight rows by 8 tokens. Lane (g = lane / 4,
 * t = lane % 4) supplies weight rows g and g + 8 (A), token g (B) and gets
 * back rows g, g + 8 times tokens 2t, 2t + 1 (C), per the PTX fragment
 * layouts: k32: A = {row g k 4t.., row g+8 k 4t.., row g k 16+4t..,
 * row g+8 k 16+4t..}, B = {k 4t.., k 16+4t..}; k16: A = {row g k 4t..,
 * row g+8 k 4t..}, B = {k 4t..}; 4 int8 per register. Which elements sit
 * in which k-slot is free as long as A and B agree, so each lane takes
 * neighbouring bytes. The functions below are one lane's share of one
 * super-block (256 elements) of NM matrices; `mma` is the instruction on
 * the device and an emulation in the host test (cu_mmq_host_check.cu). The
 * float scaling happens per sub-block: sum = d_w * d_x * C (- min terms).
 *
 *   Q4_K: k32 per 32-element sub-block; lane t's 8 bytes of pair j are qs
 *         [32j + 8t, +8): low nibbles = sub-block 2j elements 8t..8t+7,
 *         high nibbles = sub-block 2j+1; q8 bytes 32s + 8t.. of token g.
 *   Q6_K: k16 per 16-element scale group (n, g', h): elements 128n + 32g'
 *         + 16h + 4t + [0,4): ql word 64n + 16h + 4t (g' = 0, 2) or + 32
 *         (g' = 1, 3), qh word 32n + 16h + 4t; blocks are 2-byte aligned,
 *         so words are funnel-shifted from aligned pairs.
 *
 * xg: token g's q8 values (row), xd0/xd1: q8 scales of tokens 2t, 2t+1.
 * With PL the activations come from the lane-ordered copy (q8_perm in
 * cu_int.cuh): xg is its p4 (Q4_K) or p6 (Q6_K), xd0 its pe, lane = 4g + t;
 * the values, and so the sums, are the same. */

/* The q8 scales (d, d * sum) of tokens 2t (e0) and 2t + 1 (e1) for the
 * eight sub-blocks of super-block sb: from the rows xd0 / xd1, or with PL
 * from the lane-ordered copy's pe (xd0). */
template <bool PL>
LCU_HD void mmq_scales(int sb, int t, const float2 *xd0, const float2 *xd1, float4 (&e0)[4],
                       float4 (&e1)[4])
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        e0[j] = PL ? ldf128(xd0 + ((size_t)sb * 32 + j * 4 + t) * 2)
                   : ldf128(xd0 + (size_t)sb * 8 + 2 * j);
        e1[j] = PL ? ldf128(xd0 + ((size_t)sb * 32 + 16 + j * 4 + t) * 2)
                   : ldf128(xd1 + (size_t)sb * 8 + 2 * j);
    }
}

/* A lane's 64 bytes of super-block sb in the lane-ordered copy xp. */
LCU_HD void mmq_perm_ld(const int8_t *xp, int sb, int lane, uint4 (&v)[4])
{
#pragma unroll
    for (int i = 0; i < 4; i++)
        v[i] = ld128(xp + (((size_t)sb * 4 + i) * 32 + lane) * 16);
}

/* The mmq_*_sb functions are a load of the lane's weight words (mmq_*_load,
 * into a struct the kernels can hold while the previous super-block's
 * math runs) followed by the math (mmq_*_math), which loads the
 * activations and accumulates. */
template <int NM> struct q4k_w {
    uint4 ha[NM], hb[NM];
    uint2 qa[NM][4], qb[NM][4];
};

template <int NM>
LCU_HD void mmq_q4k_load(const uint8_t *const (&ra)[NM], const uint8_t *const (&rb)[NM], int sb,
                         int t, q4k_w<NM> &w)
{
#pragma unroll
    for (int k = 0; k < NM; k++) {
        const uint8_t *pa = ra[k] + (size_t)sb * 144, *pb = rb[k] + (size_t)sb * 144;
        w.ha[k] = ld128(pa);
        w.hb[k] = ld128(pb);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            w.qa[k][j] = ldu64(pa + 16 + 32 * j + 8 * t);
            w.qb[k][j] = ldu64(pb + 16 + 32 * j + 8 * t);
        }
    }
}

template <int NM, bool PL = false, class MMA>
LCU_HD void mmq_q4k_math(MMA &mma, const q4k_w<NM> &w, int sb, int t, const int8_t *xg,
                         const float2 *xd0, const float2 *xd1, float (&acc)[NM][2][2],
                         int lane = 0)
{
    const uint4(&ha)[NM] = w.ha, (&hb)[NM] = w.hb;
    const uint2(&qa)[NM][4] = w.qa, (&qb)[NM][4] = w.qb;
    int2 xv[8];
    float4 e0[4], e1[4];
    mmq_scales<PL>(sb, t, xd0, xd1, e0, e1);
    if (PL) {
        uint4 v[4];
        mmq_perm_ld(xg, sb, lane, v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            xv[2 * i] = make_int2((int)v[i].x, (int)v[i].y);
            xv[2 * i + 1] = make_int2((int)v[i].z, (int)v[i].w);
        }
    } else {
#pragma unroll
        for (int s = 0; s < 8; s++)
            xv[s] = ldi64(xg + (size_t)sb * 256 + 32 * s + 8 * t);
    }
#pragma unroll
    for (int k = 0; k < NM; k++) {
        float m[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, n[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t sca, mna, scb, mnb;
            k4_pair(ha[k].y, ha[k].z, ha[k].w, j, &sca, &mna);
            k4_pair(hb[k].y, hb[k].z, hb[k].w, j, &scb, &mnb);
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const int sh = 4 * hi, s = 2 * j + hi;
                int c[4];
                mma.k32(c, (int)((qa[k][j].x >> sh) & 0x0F0F0F0Fu),
                        (int)((qb[k][j].x >> sh) & 0x0F0F0F0Fu),
                        (int)((qa[k][j].y >> sh) & 0x0F0F0F0Fu),
                        (int)((qb[k][j].y >> sh) & 0x0F0F0F0Fu), xv[s].x, xv[s].y);
                const float d80 = hi ? e0[j].z : e0[j].x, s80 = hi ? e0[j].w : e0[j].y;
                const float d81 = hi ? e1[j].z : e1[j].x, s81 = hi ? e1[j].w : e1[j].y;
                const float fa = (float)((sca >> (8 * hi)) & 0xFF);
                const float fb = (float)((scb >> (8 * hi)) & 0xFF);
                const float ga = (float)((mna >> (8 * hi)) & 0xFF);
                const float gb = (float)((mnb >> (8 * hi)) & 0xFF);
                m[0][0] = fmaf(fa, d80 * (float)c[0], m[0][0]);
                m[0][1] = fmaf(fa, d81 * (float)c[1], m[0][1]);
                m[1][0] = fmaf(fb, d80 * (float)c[2], m[1][0]);
                m[1][1] = fmaf(fb, d81 * (float)c[3], m[1][1]);
                n[0][0] = fmaf(ga, s80, n[0][0]);
                n[0][1] = fmaf(ga, s81, n[0][1]);
                n[1][0] = fmaf(gb, s80, n[1][0]);
                n[1][1] = fmaf(gb, s81, n[1][1]);
            }
        }
        const float da = hf(ha[k].x & 0xFFFF), dma = hf(ha[k].x >> 16);
        const float db = hf(hb[k].x & 0xFFFF), dmb = hf(hb[k].x >> 16);
        acc[k][0][0] += da * m[0][0] - dma * n[0][0];
        acc[k][0][1] += da * m[0][1] - dma * n[0][1];
        acc[k][1][0] += db * m[1][0] - dmb * n[1][0];
        acc[k][1][1] += db * m[1][1] - dmb * n[1][1];
    }
}

template <int NM, bool PL = false, class MMA>
LCU_HD void mmq_q4k_sb(MMA &mma, const uint8_t *const (&ra)[NM], const uint8_t *const (&rb)[NM],
                       int sb, int t, const int8_t *xg, const float2 *xd0, const float2 *xd1,
                       float (&acc)[NM][2][2], int lane = 0)
{
    q4k_w<NM> w;
    mmq_q4k_load<NM>(ra, rb, sb, t, w);
    mmq_q4k_math<NM, PL>(mma, w, sb, t, xg, xd0, xd1, acc, lane);
}

/* Six-bit quants of Q6_K group g' (0..3) from the ql words w0 (g' 0, 2),
 * w1 (g' 1, 3) and the qh word, as signed bytes q - 32. */
LCU_HD int q6_group(uint32_t w0, uint32_t w1, uint32_t qh, int gq)
{
    const uint32_t lo = gq == 0 ? w0 : gq == 1 ? w1 : gq == 2 ? w0 >> 4 : w1 >> 4;
    const uint32_t hi = gq == 0 ? qh << 4 : gq == 1 ? qh << 2 : gq == 2 ? qh : qh >> 2;
    return sub32((lo & 0x0F0F0F0Fu) | (hi & 0x30303030u));
}

/* Lane t's words of one Q6_K block p (see above): ql for g' 0/2 and 1/3,
 * qh, per (n, h); the 16 scale bytes and d. A2: p is only 2-byte aligned. */
template <bool A2>
LCU_HD void q6_words(const uint8_t *p, int t, uint32_t (&w0)[2][2], uint32_t (&w1)[2][2],
                     uint32_t (&qh)[2][2], uint32_t (&sc)[4], uint32_t &d)
{
    const uint8_t *pa = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)3);
    const int sh = (int)((uintptr_t)p & 3) * 8;
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int l = 64 * n + 16 * h + 4 * t, q = 128 + 32 * n + 16 * h + 4 * t;
            if (A2) {
                w0[n][h] = fshr(ld32(pa + l), ld32(pa + l + 4), sh);
                w1[n][h] = fshr(ld32(pa + l + 32), ld32(pa + l + 36), sh);
                qh[n][h] = fshr(ld32(pa + q), ld32(pa + q + 4), sh);
            } else {
                w0[n][h] = ld32(pa + l);
                w1[n][h] = ld32(pa + l + 32);
                qh[n][h] = ld32(pa + q);
            }
        }
    ldw_a2<4>(p + 192, sc);
    d = ld16(p + 208);
}

/* [matrix][row A/B][n][h]: ql words (g' 0/2 and 1/3) and the qh word;
 * the scale words and d per matrix and row */
template <int NM> struct q6k_w {
    uint32_t w0[NM][2][2][2], w1[NM][2][2][2], qh[NM][2][2][2], sc[NM][2][4], dd[NM][2];
};

template <int NM>
LCU_HD void mmq_q6k_load(const uint8_t *const (&ra)[NM], const uint8_t *const (&rb)[NM], int sb,
                         int t, q6k_w<NM> &w)
{
#pragma unroll
    for (int k = 0; k < NM; k++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            /* rows of a multiple of 4 bytes: the branch is uniform over the warp */
            const uint8_t *p = (r ? rb[k] : ra[k]) + (size_t)sb * 210;
            if ((uintptr_t)p & 3)
                q6_words<true>(p, t, w.w0[k][r], w.w1[k][r], w.qh[k][r], w.sc[k][r], w.dd[k][r]);
            else
                q6_words<false>(p, t, w.w0[k][r], w.w1[k][r], w.qh[k][r], w.sc[k][r], w.dd[k][r]);
        }
}

template <int NM, bool PL = false, class MMA>
LCU_HD void mmq_q6k_math(MMA &mma, const q6k_w<NM> &w, int sb, int t, const int8_t *xg,
                         const float2 *xd0, const float2 *xd1, float (&acc)[NM][2][2],
                         int lane = 0)
{
    const uint32_t(&w0)[NM][2][2][2] = w.w0, (&w1)[NM][2][2][2] = w.w1, (&qh)[NM][2][2][2] = w.qh;
    const uint32_t(&sc)[NM][2][4] = w.sc, (&dd)[NM][2] = w.dd;
    int xv[2][2][4];
    float4 e0[4], e1[4];
    mmq_scales<PL>(sb, t, xd0, xd1, e0, e1);
    if (PL) {
        uint4 v[4];
        mmq_perm_ld(xg, sb, lane, v);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            xv[i >> 1][i & 1][0] = (int)v[i].x, xv[i >> 1][i & 1][1] = (int)v[i].y;
            xv[i >> 1][i & 1][2] = (int)v[i].z, xv[i >> 1][i & 1][3] = (int)v[i].w;
        }
    } else {
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int gq = 0; gq < 4; gq++)
                    xv[n][h][gq] =
                        (int)ld32(xg + (size_t)sb * 256 + 128 * n + 32 * gq + 16 * h + 4 * t);
    }
#pragma unroll
    for (int k = 0; k < NM; k++) {
        float m[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int gq = 0; gq < 4; gq++) {
                const int s = 4 * n + gq; /* 32-element block: q8 scale index */
                const float d80 = (s & 1) ? e0[s >> 1].z : e0[s >> 1].x;
                const float d81 = (s & 1) ? e1[s >> 1].z : e1[s >> 1].x;
                /* the two 16-element groups' int8 scales applied in integers
                 * (|C * sc| <= 16 * 32 * 127 * 128 per group: the sum of two
                 * stays exact in float too) */
                int ic[4] = {0, 0, 0, 0};
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int si = 8 * n + 2 * gq + h; /* scale byte */
                    int c[4];
                    mma.k16(c, q6_group(w0[k][0][n][h], w1[k][0][n][h], qh[k][0][n][h], gq),
                            q6_group(w0[k][1][n][h], w1[k][1][n][h], qh[k][1][n][h], gq),
                            xv[n][h][gq]);
                    const int sa = (int)(int8_t)(sc[k][0][si >> 2] >> (8 * (si & 3)));
                    const int sb2 = (int)(int8_t)(sc[k][1][si >> 2] >> (8 * (si & 3)));
                    ic[0] += c[0] * sa;
                    ic[1] += c[1] * sa;
                    ic[2] += c[2] * sb2;
                    ic[3] += c[3] * sb2;
                }
                m[0][0] = fmaf(d80, (float)ic[0], m[0][0]);
                m[0][1] = fmaf(d81, (float)ic[1], m[0][1]);
                m[1][0] = fmaf(d80, (float)ic[2], m[1][0]);
                m[1][1] = fmaf(d81, (float)ic[3], m[1][1]);
            }
        const float da = hf(dd[k][0]), db = hf(dd[k][1]);
        acc[k][0][0] += da * m[0][0];
        acc[k][0][1] += da * m[0][1];
        acc[k][1][0] += db * m[1][0];
        acc[k][1][1] += db * m[1][1];
    }
}

template <int NM, bool PL = false, class MMA>
LCU_HD void mmq_q6k_sb(MMA &mma, const uint8_t *const (&ra)[NM], const uint8_t *const (&rb)[NM],
                       int sb, int t, const int8_t *xg, const float2 *xd0, const float2 *xd1,
                       float (&acc)[NM][2][2], int lane = 0)
{
    q6k_w<NM> w;
    mmq_q6k_load<NM>(ra, rb, sb, t, w);
    mmq_q6k_math<NM, PL>(mma, w, sb, t, xg, xd0, xd1, acc, lane);
}

/* Where token u's q8 value k (and, at a sub-block's first value, its
 * scales) go in the lane-ordered copy that the PL loads above read
 * (q8_perm in cu_int.cuh). */
LCU_HD size_t perm4_at(int64_t u, int64_t k)
{
    const int w = (int)(k & 255), s = w >> 5, t = (w >> 3) & 3;
    return ((size_t)((k >> 8) * 4 + (s >> 1)) * 32 + (size_t)(u * 4 + t)) * 16 + (s & 1) * 8 +
           (w & 7);
}

LCU_HD size_t perm6_at(int64_t u, int64_t k)
{
    const int w = (int)(k & 255), s = w >> 5, c = w & 31, t = (c >> 2) & 3;
    const int wi = (s >> 2) * 8 + (c >> 4) * 4 + (s & 3);
    return ((size_t)((k >> 8) * 4 + (wi >> 2)) * 32 + (size_t)(u * 4 + t)) * 16 + (wi & 3) * 4 +
           (c & 3);
}

LCU_HD size_t perme_at(int64_t u, int64_t k)
{
    const int s = (int)(k & 255) >> 5;
    return ((size_t)((k >> 8) * 8 + (u & 1) * 4 + (s >> 1)) * 4 + (size_t)(u >> 1)) * 2 + (s & 1);
}

/* Whether a type has int8 kernels (chunks of 32 elements; K-quants need
 * n_cols % 256 == 0, which their block size implies). */
LCU_HD bool has_ops(int type)
{
    return type == LMS_TYPE_Q4_K || type == LMS_TYPE_Q5_K || type == LMS_TYPE_Q6_K ||
           type == LMS_TYPE_Q8_0 || type == LMS_TYPE_Q4_0 || type == LMS_TYPE_IQ4_NL ||
           type == LMS_TYPE_IQ4_XS;
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
