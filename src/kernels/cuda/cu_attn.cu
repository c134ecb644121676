/*
 * cu_attn.cu - attention over the paged f16 K/V cache, flash-decoding
 * style.
 *
 * Grid: (token, group of query heads sharing one KV head, split). A block
 * of ATT_WARPS warps walks its split's positions, one position per warp at
 * a time: each lane holds DPL = head_dim/32 dimensions of K and V, the
 * group's queries (up to 8 heads) are dotted with one K row each and an
 * online softmax (running max m, sum l, weighted V sum) is kept per head
 * in registers. The warps are merged in shared memory and each split
 * writes (m, l, acc[hd]) to scratch; attn_merge_k folds the splits:
 *
 *   out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s,   M = max m_s
 *
 * Token t sees positions [0, pos[t]] of its own sequence, found through the
 * block table: position j is cell (tbl[off + j/16] * 16 + j % 16).
 */
#include <math.h>

#include "kernels/cuda/cu_int.cuh"

#define ATT_WARPS 4
#define ATT_G 8 /* query heads per block */

template <int DPL> struct kv_vec;
template <> struct kv_vec<1> {
    static __device__ __forceinline__ void load(const uint16_t *p, float *o)
    {
        o[0] = __half2float(__ushort_as_half(__ldg(p)));
    }
};
template <> struct kv_vec<2> {
    static __device__ __forceinline__ void load(const uint16_t *p, float *o)
    {
        float2 f = __half22float2(*(const __half2 *)p);
        o[0] = f.x, o[1] = f.y;
    }
};
template <> struct kv_vec<4> {
    static __device__ __forceinline__ void load(const uint16_t *p, float *o)
    {
        uint2 u = __ldg((const uint2 *)p);
        float2 a = __half22float2(*(__half2 *)&u.x), b = __half22float2(*(__half2 *)&u.y);
        o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y;
    }
};
template <> struct kv_vec<8> {
    static __device__ __forceinline__ void load(const uint16_t *p, float *o)
    {
        uint4 u = __ldg((const uint4 *)p);
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(*(__half2 *)&w[i]);
            o[2 * i] = f.x, o[2 * i + 1] = f.y;
        }
    }
};

template <int DPL>
__global__ void __launch_bounds__(32 * ATT_WARPS)
    attn_k(lcu_batch b, lcu_attn_shape s, const float *__restrict__ q,
           const uint16_t *__restrict__ kc, const uint16_t *__restrict__ vc,
           float *__restrict__ part, int n_split)
{
    __shared__ float sm_m[ATT_WARPS][ATT_G], sm_l[ATT_WARPS][ATT_G];
    __shared__ float sm_acc[ATT_WARPS][ATT_G][32 * DPL];
    const int t = blockIdx.x, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hd = s.head_dim, group = s.n_head / s.n_head_kv;
    const int chunks = (group + ATT_G - 1) / ATT_G;
    const int kvh = blockIdx.y / chunks;
    const int h0 = kvh * group + (blockIdx.y % chunks) * ATT_G;
    const int h_end = min(h0 + ATT_G, (kvh + 1) * group);
    const int n_h = h_end - h0;
    const int kvd = s.n_head_kv * hd;
    const int d0 = lane * DPL;
    const bool active = d0 < hd;
    const float scale = 1.0f / sqrtf((float)hd);

    const int32_t n_pos = b.pos[t] + 1;
    const int32_t per = (n_pos + n_split - 1) / n_split;
    const int32_t j0 = split * per, j1 = min(n_pos, j0 + per);
    const int32_t *tbl = b.tbl + b.tbl_off[t];

    float qv[ATT_G][DPL], acc[ATT_G][DPL], m[ATT_G], l[ATT_G];
#pragma unroll
    for (int h = 0; h < ATT_G; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            acc[h][i] = 0.0f;
            qv[h][i] = (h < n_h && active) ? q[((size_t)t * s.n_head + h0 + h) * hd + d0 + i] * scale
                                           : 0.0f;
        }
    }
    for (int32_t j = j0 + warp; j < j1; j += ATT_WARPS) {
        const size_t cell = ((size_t)tbl[j >> 4] * 16 + (size_t)(j & 15)) * (size_t)kvd +
                            (size_t)kvh * hd + d0;
        float kv[DPL], vv[DPL];
        if (active) {
            kv_vec<DPL>::load(kc + cell, kv);
            kv_vec<DPL>::load(vc + cell, vv);
        } else {
#pragma unroll
            for (int i = 0; i < DPL; i++)
                kv[i] = vv[i] = 0.0f;
        }
#pragma unroll
        for (int h = 0; h < ATT_G; h++) {
            if (h >= n_h)
                break;
            float sc = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                sc = fmaf(qv[h][i], kv[i], sc);
            sc = warp_sum(sc);
            const float mn = fmaxf(m[h], sc);
            const float corr = __expf(m[h] - mn), p = __expf(sc - mn);
            l[h] = l[h] * corr + p;
#pragma unroll
            for (int i = 0; i < DPL; i++)
                acc[h][i] = acc[h][i] * corr + p * vv[i];
            m[h] = mn;
        }
    }
#pragma unroll
    for (int h = 0; h < ATT_G; h++) {
        if (lane == 0) {
            sm_m[warp][h] = m[h];
            sm_l[warp][h] = l[h];
        }
#pragma unroll
        for (int i = 0; i < DPL; i++)
            sm_acc[warp][h][d0 + i] = acc[h][i];
    }
    __syncthreads();
    /* merge the warps: thread (h, d) for every head and dimension */
    for (int e = threadIdx.x; e < n_h * (hd + 2); e += blockDim.x) {
        const int h = e / (hd + 2), d = e % (hd + 2);
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            M = fmaxf(M, sm_m[w][h]);
        float v = 0.0f;
        if (M != -INFINITY) {
            for (int w = 0; w < ATT_WARPS; w++) {
                const float f = __expf(sm_m[w][h] - M);
                v += f * (d == 0 ? 0.0f : d == 1 ? sm_l[w][h] : sm_acc[w][h][d - 2]);
            }
        }
        float *dst = part + (((size_t)t * s.n_head + h0 + h) * n_split + split) * (hd + 2);
        dst[d] = d == 0 ? M : v;
    }
}

/* With oq (q8 of out, see cu_mmvq.cuh): blockDim == head_dim, a multiple
 * of 32, so each warp quantizes one 32-value block. */
__global__ void attn_merge_k(lcu_attn_shape s, const float *__restrict__ part, float *__restrict__ out,
                             int n_split, int8_t *__restrict__ oq, float2 *__restrict__ od)
{
    const int t = blockIdx.x, h = blockIdx.y, hd = s.head_dim;
    const float *p = part + ((size_t)t * s.n_head + h) * n_split * (hd + 2);
    float M = -INFINITY;
    for (int i = 0; i < n_split; i++)
        M = fmaxf(M, p[i * (hd + 2)]);
    if (oq) {
        const int d = threadIdx.x;
        float num = 0.0f, den = 0.0f;
        for (int i = 0; i < n_split; i++) {
            const float *pi = p + i * (hd + 2);
            if (pi[0] == -INFINITY)
                continue;
            const float f = __expf(pi[0] - M);
            den += f * pi[1];
            num += f * pi[2 + d];
        }
        const float o = num / den;
        const size_t flat = ((size_t)t * s.n_head + h) * hd + d;
        out[flat] = o;
        const float am = warp_max(fabsf(o));
        const float dq = am / 127.0f, id = dq > 0.0f ? 1.0f / dq : 0.0f;
        const int qv = __float2int_rn(o * id);
        const float sum = warp_sum((float)qv);
        oq[flat] = (int8_t)qv;
        if ((threadIdx.x & 31) == 0)
            od[flat >> 5] = make_float2(dq, dq * sum);
        return;
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.0f, den = 0.0f;
        for (int i = 0; i < n_split; i++) {
            const float *pi = p + i * (hd + 2);
            if (pi[0] == -INFINITY)
                continue;
            const float f = __expf(pi[0] - M);
            den += f * pi[1];
            num += f * pi[2 + d];
        }
        out[((size_t)t * s.n_head + h) * hd + d] = num / den;
    }
}

extern "C" int lcu_attn_max_split(int64_t n_tok)
{
    return n_tok <= LCU_MATVEC_MAX ? 64 : 4;
}

extern "C" void lcu_attention(lcu *g, const lcu_batch *b, const lcu_attn_shape *s, const float *q,
                              const uint16_t *kc, const uint16_t *vc, float *out, int n_split,
                              void *outq)
{
    if (b->n_tok <= 0)
        return;
    const int group = s->n_head / s->n_head_kv;
    const int chunks = (group + ATT_G - 1) / ATT_G;
    dim3 grid((unsigned)b->n_tok, (unsigned)(s->n_head_kv * chunks), (unsigned)n_split);
    const int dpl = s->head_dim <= 32 ? 1 : s->head_dim <= 64 ? 2 : s->head_dim <= 128 ? 4 : 8;
    switch (dpl) {
    case 1: attn_k<1><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(*b, *s, q, kc, vc, g->attn_part, n_split); break;
    case 2: attn_k<2><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(*b, *s, q, kc, vc, g->attn_part, n_split); break;
    case 4: attn_k<4><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(*b, *s, q, kc, vc, g->attn_part, n_split); break;
    default: attn_k<8><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(*b, *s, q, kc, vc, g->attn_part, n_split); break;
    }
    dim3 mg((unsigned)b->n_tok, (unsigned)s->n_head);
    const int64_t n_q = (int64_t)s->n_head * s->head_dim;
    const bool fuse_q = outq && s->head_dim % 32 == 0 && s->head_dim <= 256;
    int8_t *oq = fuse_q ? (int8_t *)outq : NULL;
    float2 *od = fuse_q ? (float2 *)((int8_t *)outq + b->n_tok * n_q) : NULL;
    attn_merge_k<<<mg, s->head_dim < 32 ? 32 : (s->head_dim > 256 ? 256 : s->head_dim), 0,
                   g->stream>>>(*s, g->attn_part, out, n_split, oq, od);
    if (outq && !fuse_q && n_q % 32 == 0)
        lcu_quantize_q8(g, out, outq, b->n_tok, n_q);
}
