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

/* Value d of head h of token t's attention output: into out, and with oq
 * as q8 (each warp holds one 32-value block of a head). */
__device__ __forceinline__ void out_store(const lcu_attn_shape &s, int t, int h, int d, float o,
                                          float *__restrict__ out, int8_t *__restrict__ oq,
                                          float2 *__restrict__ od, const q8_perm &pm)
{
    const size_t flat = ((size_t)t * s.n_head + h) * s.head_dim + d;
    out[flat] = o;
    if (oq)
        quant_lane(o, oq, od, (int64_t)flat, pm);
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
        out_store(s, t, h, d, num / den, out, oq, od, pm);
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

/* ---- decode: tiles of positions through shared memory --------------------------------
 * attn_k walks a split one position per warp, each step a chain of
 * dependent loads, shuffles and exponentials; at decode depths that chain,
 * not the bytes, is its time (H200, Llama-3-8B, ~150 positions: attn_k and
 * its merge were 0.37 ms of a 2.54 ms one-token step). attn_dec_k serves
 * the llama/qwen shapes (head_dim 64 or 128, up to ATT_G query heads per
 * KV head, no gemma extras): a block of 128 threads takes one (token, KV
 * head, split) and walks the split in tiles of DEC_TP positions:
 *   - the tile's K and V rows go to shared memory, every 16-byte load of
 *     the tile issued at once;
 *   - lane j of the warp of head h dots K row j with the query (no
 *     shuffles), the warp's max and sum update the head's online softmax;
 *   - each thread adds p_j V_j over the tile to its dimensions of its heads.
 * The splits meet in the last block of their (token, KV head) to finish
 * (an atomic count, reset by that block for the next launch): the merge of
 * attn_merge_k and the q8 of the output, without a second launch. */
#define DEC_TP 32
#define DEC_THREADS 128
#define DEC_SPLIT_MAX 64 /* lcu_attn_max_split of a decode batch */

template <int HD>
__global__ void __launch_bounds__(DEC_THREADS)
    attn_dec_k(lcu_batch b, lcu_attn_shape s, const float *__restrict__ q,
               const uint16_t *__restrict__ kc, const uint16_t *__restrict__ vc,
               float *__restrict__ part, int *__restrict__ cnt, int n_split,
               float *__restrict__ out, int8_t *__restrict__ oq, float2 *__restrict__ od,
               q8_perm pm)
{
    constexpr int RS = HD + 8; /* a row in shared memory, halves: 16-byte reads of 8 rows
                                  at one column fall in distinct banks */
    constexpr int CH = HD / 8; /* 16-byte chunks of a row */
    constexpr int NP = HD / 2; /* dimension pairs */
    constexpr int NS = DEC_THREADS / NP;   /* thread sets over the heads (2 or 4) */
    constexpr int KH = (ATT_G + NS - 1) / NS; /* heads per thread in the value sums */
    __shared__ __align__(16) __half ks[DEC_TP * RS], vs[DEC_TP * RS];
    __shared__ __align__(16) float qs[ATT_G * HD];
    __shared__ float ps[ATT_G][DEC_TP], cs[ATT_G], ms[ATT_G], ls[ATT_G];
    __shared__ float fw[ATT_G][DEC_SPLIT_MAX];
    __shared__ int last;
    pdl_trigger();
    const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int group = s.n_head / s.n_head_kv, kvd = s.n_head_kv * HD, h0 = kvh * group;
    /* positions and block tables come from the host before the step, so
     * they are read, and the first tile's rows fetched into L2, while the
     * kernel before this one (which writes the newest rows) still runs */
    const int32_t n_pos = b.pos[t] + 1;
    const int32_t per = (n_pos + n_split - 1) / n_split;
    const int32_t j0 = split * per, j1 = min(n_pos, j0 + per);
    const int32_t *tbl = b.tbl + b.tbl_off[t];
    constexpr int LINES = HD / 64; /* 128-byte lines of a row's head */
    for (int e = tid; e < min(DEC_TP, j1 - j0) * 2 * LINES; e += DEC_THREADS) {
        const int32_t j = j0 + e / (2 * LINES);
        const int w = e % (2 * LINES);
        const uint16_t *p = (w < LINES ? kc : vc) +
                            ((size_t)tbl[j >> 4] * 16 + (size_t)(j & 15)) * (size_t)kvd +
                            (size_t)kvh * HD + (size_t)(w % LINES) * 64;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
    pdl_wait();
    const float scale = 1.0f / sqrtf((float)HD);
    for (int e = tid; e < group * HD; e += DEC_THREADS)
        qs[e] = q[((size_t)t * s.n_head + h0) * HD + e] * scale;
    /* softmax state of heads warp and warp + 4 (the same in every lane) */
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int dp = tid % NP, hs = tid / NP;
    float2 acc[KH];
#pragma unroll
    for (int k = 0; k < KH; k++)
        acc[k] = make_float2(0.0f, 0.0f);
    for (int32_t jt = j0; jt < j1; jt += DEC_TP) {
        const int nj = min(DEC_TP, j1 - jt);
        __syncthreads(); /* the previous tile's readers are done (and qs is written) */
#pragma unroll
        for (int e = tid; e < DEC_TP * CH; e += DEC_THREADS) {
            const int r = e / CH, c = e % CH;
            uint4 ku = make_uint4(0, 0, 0, 0), vu = ku;
            if (r < nj) {
                const int32_t j = jt + r;
                const size_t cell = ((size_t)tbl[j >> 4] * 16 + (size_t)(j & 15)) * (size_t)kvd +
                                    (size_t)kvh * HD + (size_t)c * 8;
                ku = __ldg((const uint4 *)(kc + cell));
                vu = __ldg((const uint4 *)(vc + cell));
            }
            *(uint4 *)&ks[r * RS + c * 8] = ku;
            *(uint4 *)&vs[r * RS + c * 8] = vu;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int h = warp + 4 * k;
            if (h >= group)
                break;
            float sc = -INFINITY;
            if (lane < nj) {
                const uint4 *kr = (const uint4 *)&ks[lane * RS];
                const float4 *qr = (const float4 *)&qs[h * HD];
                float a[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* four chains */
#pragma unroll
                for (int c = 0; c < CH; c++) {
                    const uint4 u = kr[c];
                    const float4 qa = qr[2 * c], qb = qr[2 * c + 1];
                    const float2 f0 = __half22float2(*(const __half2 *)&u.x);
                    const float2 f1 = __half22float2(*(const __half2 *)&u.y);
                    const float2 f2 = __half22float2(*(const __half2 *)&u.z);
                    const float2 f3 = __half22float2(*(const __half2 *)&u.w);
                    a[0] = fmaf(qa.x, f0.x, a[0]), a[1] = fmaf(qa.y, f0.y, a[1]);
                    a[2] = fmaf(qa.z, f1.x, a[2]), a[3] = fmaf(qa.w, f1.y, a[3]);
                    a[0] = fmaf(qb.x, f2.x, a[0]), a[1] = fmaf(qb.y, f2.y, a[1]);
                    a[2] = fmaf(qb.z, f3.x, a[2]), a[3] = fmaf(qb.w, f3.y, a[3]);
                }
                sc = (a[0] + a[1]) + (a[2] + a[3]);
            }
            const float mn = fmaxf(m[k], warp_max(sc));
            const float p = lane < nj ? __expf(sc - mn) : 0.0f;
            const float corr = __expf(m[k] - mn);
            l[k] = l[k] * corr + warp_sum(p);
            m[k] = mn;
            ps[h][lane] = p;
            if (lane == 0)
                cs[h] = corr;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < KH; k++) {
            const int h = hs + NS * k;
            if (h < group) {
                const float c = cs[h];
                float2 a = make_float2(acc[k].x * c, acc[k].y * c);
#pragma unroll 8
                for (int r = 0; r < DEC_TP; r++) {
                    const float2 v = __half22float2(*(const __half2 *)&vs[r * RS + 2 * dp]);
                    const float pr = ps[h][r];
                    a.x = fmaf(pr, v.x, a.x), a.y = fmaf(pr, v.y, a.y);
                }
                acc[k] = a;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < 2; k++)
        if (warp + 4 * k < group && lane == 0)
            ms[warp + 4 * k] = m[k], ls[warp + 4 * k] = l[k];
    __syncthreads();
    /* the split's (m, l, acc) */
#pragma unroll
    for (int k = 0; k < KH; k++) {
        const int h = hs + NS * k;
        if (h < group) {
            float *dst = part + (((size_t)t * s.n_head + h0 + h) * n_split + split) * (HD + 2);
            if (dp == 0)
                dst[0] = ms[h], dst[1] = ls[h];
            *(float2 *)(dst + 2 + 2 * dp) = acc[k];
        }
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int *c = cnt + (size_t)t * s.n_head_kv + kvh;
        last = atomicAdd(c, 1) == n_split - 1;
        if (last)
            *c = 0;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    /* the merge, partials read from L2 (other blocks wrote them): each warp
     * turns its heads' (m, l) of every split into weights e^(m_i - M) / L,
     * then thread (d, heads) sums weight x acc over the splits */
    const float *pb = part + ((size_t)t * s.n_head + h0) * n_split * (HD + 2);
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int h = warp + 4 * k;
        if (h >= group)
            break;
        const float *ph = pb + (size_t)h * n_split * (HD + 2);
        const bool a0 = lane < n_split, a1 = lane + 32 < n_split;
        const float m0 = a0 ? __ldcg(ph + (size_t)lane * (HD + 2)) : -INFINITY;
        const float m1 = a1 ? __ldcg(ph + (size_t)(lane + 32) * (HD + 2)) : -INFINITY;
        const float l0 = a0 ? __ldcg(ph + (size_t)lane * (HD + 2) + 1) : 0.0f;
        const float l1 = a1 ? __ldcg(ph + (size_t)(lane + 32) * (HD + 2) + 1) : 0.0f;
        const float M = warp_max(fmaxf(m0, m1)); /* finite: split 0 holds position 0 */
        const float f0 = m0 == -INFINITY ? 0.0f : __expf(m0 - M);
        const float f1 = m1 == -INFINITY ? 0.0f : __expf(m1 - M);
        const float inv = 1.0f / warp_sum(f0 * l0 + f1 * l1);
        if (a0)
            fw[h][lane] = f0 * inv;
        if (a1)
            fw[h][lane + 32] = f1 * inv;
    }
    __syncthreads();
    constexpr int MS = DEC_THREADS / HD, MH = ATT_G / MS; /* head sets, heads per thread */
    const int d = tid % HD, hm = tid / HD;
    float o[MH];
#pragma unroll
    for (int k = 0; k < MH; k++)
        o[k] = 0.0f;
#pragma unroll 4
    for (int i = 0; i < n_split; i++)
#pragma unroll
        for (int k = 0; k < MH; k++) {
            const int h = hm + MS * k;
            if (h < group)
                o[k] = fmaf(fw[h][i], __ldcg(pb + ((size_t)h * n_split + i) * (HD + 2) + 2 + d),
                            o[k]);
        }
#pragma unroll
    for (int k = 0; k < MH; k++)
        if (hm + MS * k < group) /* whole warps */
            out_store(s, t, h0 + hm + MS * k, d, o[k], out, oq, od, pm);
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

/* gemma's extras (query scale, score cap, window): kernels built with them */
static bool shape_gem(const lcu_attn_shape *s)
{
    return s->q_scale != 0.0f || s->softcap != 0.0f || s->n_swa > 0;
}

extern "C" bool lcu_attn_dec_takes(const lcu *g, const lcu_attn_shape *s)
{
    return g->att_dec && g->attn_cnt && !shape_gem(s) && (s->head_dim == 64 || s->head_dim == 128) &&
           s->n_head_kv > 0 && s->n_head % s->n_head_kv == 0 && s->n_head / s->n_head_kv <= ATT_G;
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
    const bool gem = shape_gem(s);
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
    if (lcu_attn_dec_takes(g, s) && n_split <= DEC_SPLIT_MAX) {
        int8_t *oq = outq ? (int8_t *)outq : NULL;
        float2 *od = outq ? (float2 *)((int8_t *)outq + b->n_tok * n_q) : NULL;
        const q8_perm pm = outq ? lcu_q8_perm(g, outq, b->n_tok, n_q) : q8_perm{};
        const dim3 grid((unsigned)b->n_tok, (unsigned)s->n_head_kv, (unsigned)n_split);
        if (s->head_dim == 64)
            lcu_go(g, attn_dec_k<64>, grid, dim3(DEC_THREADS), *b, *s, q, kc, vc, g->attn_part,
                   g->attn_cnt, n_split, out, oq, od, pm);
        else
            lcu_go(g, attn_dec_k<128>, grid, dim3(DEC_THREADS), *b, *s, q, kc, vc, g->attn_part,
                   g->attn_cnt, n_split, out, oq, od, pm);
        return;
    }
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
