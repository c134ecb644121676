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
 * block table: position j is cell (tbl[off + j/16] * 16 + j % 16); in a
 * gemma local layer only (pos[t] - n_swa, pos[t]], and gemma2's scores are
 * soft-capped (the kernels' GEM builds).
 */
#include <limits.h>
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

/* GEM: gemma's layers (shape's q_scale, softcap, n_swa); the llama build
 * (GEM false) is the kernel as it was before they existed. */
template <int DPL, bool GEM>
__global__ void __launch_bounds__(32 * ATT_WARPS)
    attn_k(lcu_batch b, lcu_attn_shape s, const float *__restrict__ q,
           const uint16_t *__restrict__ kc, const uint16_t *__restrict__ vc,
           float *__restrict__ part, int n_split)
{
    pdl_trigger();
    pdl_wait();
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
    float scale = 1.0f / sqrtf((float)hd);
    if (GEM && s.q_scale != 0.0f)
        scale = s.q_scale;
    const float cap_inv = GEM && s.softcap != 0.0f ? 1.0f / s.softcap : 0.0f;

    const int32_t n_pos = b.pos[t] + 1;
    /* a local layer's window: the splits share positions [lo, n_pos) */
    const int32_t lo = GEM && s.n_swa > 0 ? max(0, n_pos - s.n_swa) : 0;
    const int32_t per = (n_pos - lo + n_split - 1) / n_split;
    const int32_t j0 = lo + split * per, j1 = min(n_pos, j0 + per);
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
            if (GEM && s.softcap != 0.0f) /* forward.c's order: tanh(s * (1 / cap)) * cap */
                sc = tanhf(sc * cap_inv) * s.softcap;
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
                             int n_split, int8_t *__restrict__ oq, float2 *__restrict__ od,
                             q8_perm pm)
{
    pdl_trigger();
    pdl_wait();
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
        if (pm.p4) {
            const int64_t k = (int64_t)h * hd + d;
            pm.p4[mq::perm4_at(t, k)] = (int8_t)qv;
            pm.p6[mq::perm6_at(t, k)] = (int8_t)qv;
            if ((threadIdx.x & 31) == 0)
                pm.pe[mq::perme_at(t, k)] = make_float2(dq, dq * sum);
        }
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

/* ---- prompt batches: flash attention on the tensor cores --------------------------
 * The per-token kernel above walks every position of every token one warp
 * at a time, which made a 512-token prompt's attention half of the prompt
 * time (3B, H200: 516 us a layer). Here a warp owns 16 consecutive tokens
 * of the batch and one query head and walks K/V in tiles of FA_KT
 * positions, all products on mma.sync m16n8k16 (f16 inputs, f32 sums):
 *
 *   S = Q K^T (16 x FA_KT), online softmax per row (running max m, sum l,
 *   base 2: Q is pre-scaled by log2(e)/sqrt(hd)), O = O * e^(m_old - m) + P V
 *
 * K and V are f16 in the cache; Q and P enter as two f16 terms each (the
 * value rounded, plus its rounding error), two products instead of one, so
 * the result keeps the per-token kernel's precision (a single f16 Q and P
 * moved a Q5_K golden case from 0.219 to 0.251 of the llama.cpp logits).
 *
 * A tile's K and V rows are copied into the warp's shared memory
 * (cp.async) and read as mma fragments with ldmatrix (V transposed);
 * the S fragments become P's A fragments in registers. Rows of padding
 * get 8 extra halves so that ldmatrix's eight rows hit distinct banks.
 * The 16 tokens may belong to different sequences (continuous batching):
 * the warp loops over their distinct block tables, each pass masking the
 * rows of other tables, so every row sees exactly positions [0, pos] of
 * its own sequence. Needs sm_80 (cp.async, f16 mma); g->fa says so. */
#define FA_WARPS 4
#define FA_KT 32

__device__ __forceinline__ void fa_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* Four 8x8 b16 matrices from shared memory, lane l giving row l % 8 of
 * matrix l / 8; trans: each read transposed. */
template <bool TRANS> __device__ __forceinline__ void fa_ldsm4(uint32_t (&r)[4], const uint16_t *p)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}

__device__ __forceinline__ void fa_cp16(uint16_t *dst, const uint16_t *src)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(a), "l"(src));
#endif
}

__device__ __forceinline__ void fa_cp_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t fa_h2(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* (lo, hi) as f16 pairs h + l with l the rounding error of h: h + l
 * carries about 22 bits of each value */
__device__ __forceinline__ void fa_split(float lo, float hi, uint32_t &h, uint32_t &l)
{
    h = fa_h2(lo, hi);
    const float2 r = __half22float2(*(const __half2 *)&h);
    l = fa_h2(lo - r.x, hi - r.y);
}

/* GEM as attn_k's: gemma's scale, soft-capped scores (Q then carries only
 * the scale; the cap's tanh works on natural-log scores, which are turned
 * to base 2 after it) and windows (tiles wholly before every row's window
 * are not loaded; the rest are masked). */
template <int HD, bool GEM>
__global__ void __launch_bounds__(32 * FA_WARPS)
    fa_prompt_k(lcu_batch b, lcu_attn_shape s, const float *__restrict__ q,
                const uint16_t *__restrict__ kc, const uint16_t *__restrict__ vc,
                float *__restrict__ out)
{
    pdl_trigger();
    pdl_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int LD = HD + 8, NK = HD / 16, ND = HD / 8, NT = FA_KT / 8;
    extern __shared__ __align__(16) uint16_t fa_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    uint16_t *ks = fa_sm + (size_t)warp * 2 * FA_KT * LD, *vs = ks + FA_KT * LD;
    const int h = blockIdx.y, kvh = h / (s.n_head / s.n_head_kv), kvd = s.n_head_kv * HD;
    const int r0 = (blockIdx.x * FA_WARPS + warp) * 16;
    if (r0 >= b.n_tok)
        return;
    /* this thread's two rows (a: g, b: g + 8) */
    const int ta = r0 + g, tb = r0 + g + 8;
    const bool va = ta < b.n_tok, vb = tb < b.n_tok;
    const int pa = va ? b.pos[ta] : -1, pb = vb ? b.pos[tb] : -1;
    const int oa = va ? b.tbl_off[ta] : INT_MAX, ob = vb ? b.tbl_off[tb] : INT_MAX;

    const bool capped = GEM && s.softcap != 0.0f;
    float qs = rsqrtf((float)HD) * 1.4426950408889634f;
    if (GEM)
        qs = (s.q_scale != 0.0f ? s.q_scale : rsqrtf((float)HD)) *
             (capped ? 1.0f : 1.4426950408889634f);
    const float cap_inv = capped ? 1.0f / s.softcap : 0.0f;
    const float cap_l2 = capped ? s.softcap * 1.4426950408889634f : 0.0f;
    const int swa = GEM ? s.n_swa : 0;
    const float *qa = q + ((size_t)(va ? ta : r0) * s.n_head + h) * HD;
    const float *qb = q + ((size_t)(vb ? tb : r0) * s.n_head + h) * HD;
    /* Q as f16 pairs hi + lo (lo = the rounding error of hi), so that the
     * products see Q at nearly f32 precision; P likewise below */
    uint32_t qh[NK][4], ql[NK][4];
#pragma unroll
    for (int k = 0; k < NK; k++) {
        const int c = k * 16 + 2 * tq;
        const float2 x[4] = {*(const float2 *)(qa + c), *(const float2 *)(qb + c),
                             *(const float2 *)(qa + c + 8), *(const float2 *)(qb + c + 8)};
#pragma unroll
        for (int i = 0; i < 4; i++)
            fa_split(x[i].x * qs, x[i].y * qs, qh[k][i], ql[k][i]);
    }
    float o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
        o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float ma = -1e30f, mb = -1e30f, la = 0.0f, lb = 0.0f;
    bool pend_a = va, pend_b = vb;
    for (;;) {
        /* next block table among the rows not done yet */
        const int tab = __reduce_min_sync(0xffffffffu, pend_a ? oa : (pend_b ? ob : INT_MAX));
        if (tab == INT_MAX)
            break;
        const bool ia = pend_a && oa == tab, ib = pend_b && ob == tab;
        const int end = __reduce_max_sync(0xffffffffu, max(ia ? pa + 1 : 0, ib ? pb + 1 : 0));
        const int32_t *tbl = b.tbl + tab;
        int start = 0;
        if (GEM && swa > 0) { /* the lowest first position of these rows' windows */
            const int wa = ia ? max(0, pa + 1 - swa) : INT_MAX;
            const int wb = ib ? max(0, pb + 1 - swa) : INT_MAX;
            start = __reduce_min_sync(0xffffffffu, min(wa, wb)) / FA_KT * FA_KT;
        }
        for (int j0 = start; j0 < end; j0 += FA_KT) {
            __syncwarp(); /* the previous tile's fragments are read */
            for (int c = lane; c < FA_KT * (HD / 8); c += 32) {
                const int r = c / (HD / 8), part = c % (HD / 8), j = j0 + r;
                uint16_t *dk = ks + r * LD + part * 8, *dv = vs + r * LD + part * 8;
                if (j < end) {
                    const size_t cell = ((size_t)tbl[j >> 4] * 16 + (size_t)(j & 15)) * kvd +
                                        (size_t)kvh * HD + (size_t)part * 8;
                    fa_cp16(dk, kc + cell);
                    fa_cp16(dv, vc + cell);
                } else { /* past the table's end: zeros, so that 0 * V stays 0 */
                    *(uint4 *)dk = make_uint4(0, 0, 0, 0);
                    *(uint4 *)dv = make_uint4(0, 0, 0, 0);
                }
            }
            fa_cp_wait();
            __syncwarp();
            float sc[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++) {
                sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
                for (int k = 0; k < NK; k += 2) {
                    uint32_t kb[4];
                    fa_ldsm4<false>(kb, ks + (n * 8 + (lane & 7)) * LD + k * 16 + (lane >> 3) * 8);
                    fa_mma(sc[n], qh[k], kb[0], kb[1]);
                    fa_mma(sc[n], ql[k], kb[0], kb[1]);
                    fa_mma(sc[n], qh[k + 1], kb[2], kb[3]);
                    fa_mma(sc[n], ql[k + 1], kb[2], kb[3]);
                }
            }
            /* mask (other tables, future positions), then the running max */
            float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = j0 + n * 8 + 2 * tq + (i & 1);
                    bool ok = i < 2 ? (ia && j <= pa) : (ib && j <= pb);
                    if (GEM) {
                        if (swa > 0)
                            ok = ok && j > (i < 2 ? pa : pb) - swa;
                        if (capped) /* forward.c's tanh(s * (1 / cap)) * cap, then base 2 */
                            sc[n][i] = tanhf(sc[n][i] * cap_inv) * cap_l2;
                    }
                    sc[n][i] = ok ? sc[n][i] : -INFINITY;
                    if (i < 2)
                        xa = fmaxf(xa, sc[n][i]);
                    else
                        xb = fmaxf(xb, sc[n][i]);
                }
            xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
            xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
            xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
            xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
            const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
            const float ca = exp2f(ma - na), cb = exp2f(mb - nb);
            ma = na, mb = nb;
            la *= ca, lb *= cb;
#pragma unroll
            for (int d = 0; d < ND; d++) {
                o[d][0] *= ca, o[d][1] *= ca;
                o[d][2] *= cb, o[d][3] *= cb;
            }
            /* P as the A fragments of P V: S tiles 2k and 2k+1 make k-step k */
            uint32_t ph[NT / 2][4], pl[NT / 2][4];
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const float p0 = exp2f(sc[n][0] - ma), p1 = exp2f(sc[n][1] - ma);
                const float p2 = exp2f(sc[n][2] - mb), p3 = exp2f(sc[n][3] - mb);
                la += p0 + p1;
                lb += p2 + p3;
                const int k = n / 2, i = (n & 1) * 2;
                fa_split(p0, p1, ph[k][i], pl[k][i]);
                fa_split(p2, p3, ph[k][i + 1], pl[k][i + 1]);
            }
#pragma unroll
            for (int k = 0; k < NT / 2; k++)
#pragma unroll
                for (int d = 0; d < ND; d += 2) {
                    uint32_t vb4[4];
                    fa_ldsm4<true>(vb4, vs + (k * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                            d * 8 + (lane >> 4) * 8);
                    fa_mma(o[d], ph[k], vb4[0], vb4[1]);
                    fa_mma(o[d], pl[k], vb4[0], vb4[1]);
                    fa_mma(o[d + 1], ph[k], vb4[2], vb4[3]);
                    fa_mma(o[d + 1], pl[k], vb4[2], vb4[3]);
                }
        }
        pend_a = pend_a && !ia;
        pend_b = pend_b && !ib;
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    const float ia_ = la > 0.0f ? 1.0f / la : 0.0f, ib_ = lb > 0.0f ? 1.0f / lb : 0.0f;
#pragma unroll
    for (int d = 0; d < ND; d++) {
        const int c = d * 8 + 2 * tq;
        if (va)
            *(float2 *)(out + ((size_t)ta * s.n_head + h) * HD + c) =
                make_float2(o[d][0] * ia_, o[d][1] * ia_);
        if (vb)
            *(float2 *)(out + ((size_t)tb * s.n_head + h) * HD + c) =
                make_float2(o[d][2] * ib_, o[d][3] * ib_);
    }
#endif
}

template <int HD, bool GEM>
static void fa_launch(lcu *g, const lcu_batch *b, const lcu_attn_shape *s, const float *q,
                      const uint16_t *kc, const uint16_t *vc, float *out)
{
    const size_t smem = (size_t)FA_WARPS * 2 * FA_KT * (HD + 8) * sizeof(uint16_t);
    static bool attr;
    if (!attr) {
        cudaFuncSetAttribute(fa_prompt_k<HD, GEM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem);
        attr = true;
    }
    dim3 grid((unsigned)lcu_cdiv(b->n_tok, 16 * FA_WARPS), (unsigned)s->n_head);
    lcu_go_smem(g, fa_prompt_k<HD, GEM>, grid, dim3(32 * FA_WARPS), smem, *b, *s, q, kc, vc, out);
}

template <int DPL>
static void attn_launch(lcu *g, bool gem, dim3 grid, const lcu_batch *b, const lcu_attn_shape *s,
                        const float *q, const uint16_t *kc, const uint16_t *vc, int n_split)
{
    if (gem)
        lcu_go(g, attn_k<DPL, true>, grid, dim3(32 * ATT_WARPS), *b, *s, q, kc, vc, g->attn_part,
               n_split);
    else
        lcu_go(g, attn_k<DPL, false>, grid, dim3(32 * ATT_WARPS), *b, *s, q, kc, vc, g->attn_part,
               n_split);
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
    const int64_t n_q = (int64_t)s->n_head * s->head_dim;
    /* gemma's extras: chosen here, per launch, never tested by the llama kernels */
    const bool gem = s->q_scale != 0.0f || s->softcap != 0.0f || s->n_swa > 0;
    if (g->fa && b->n_tok > LCU_MATVEC_MAX && (s->head_dim == 64 || s->head_dim == 128)) {
        if (s->head_dim == 64 && gem)
            fa_launch<64, true>(g, b, s, q, kc, vc, out);
        else if (s->head_dim == 64)
            fa_launch<64, false>(g, b, s, q, kc, vc, out);
        else if (gem)
            fa_launch<128, true>(g, b, s, q, kc, vc, out);
        else
            fa_launch<128, false>(g, b, s, q, kc, vc, out);
        if (outq && n_q % 32 == 0)
            lcu_quantize_q8(g, out, outq, b->n_tok, n_q);
        return;
    }
    const int group = s->n_head / s->n_head_kv;
    const int chunks = (group + ATT_G - 1) / ATT_G;
    dim3 grid((unsigned)b->n_tok, (unsigned)(s->n_head_kv * chunks), (unsigned)n_split);
    const int dpl = s->head_dim <= 32 ? 1 : s->head_dim <= 64 ? 2 : s->head_dim <= 128 ? 4 : 8;
    switch (dpl) {
    case 1: attn_launch<1>(g, gem, grid, b, s, q, kc, vc, n_split); break;
    case 2: attn_launch<2>(g, gem, grid, b, s, q, kc, vc, n_split); break;
    case 4: attn_launch<4>(g, gem, grid, b, s, q, kc, vc, n_split); break;
    default: attn_launch<8>(g, gem, grid, b, s, q, kc, vc, n_split); break;
    }
    dim3 mg((unsigned)b->n_tok, (unsigned)s->n_head);
    const bool fuse_q = outq && s->head_dim % 32 == 0 && s->head_dim <= 256;
    int8_t *oq = fuse_q ? (int8_t *)outq : NULL;
    float2 *od = fuse_q ? (float2 *)((int8_t *)outq + b->n_tok * n_q) : NULL;
    lcu_go(g, attn_merge_k, dim3(mg),
           dim3(s->head_dim < 32 ? 32 : (s->head_dim > 256 ? 256 : s->head_dim)), *s, g->attn_part,
           out, n_split, oq, od, fuse_q ? lcu_q8_perm(g, outq, b->n_tok, n_q) : q8_perm{});
    if (outq && !fuse_q && n_q % 32 == 0)
        lcu_quantize_q8(g, out, outq, b->n_tok, n_q);
}
