/*
 * cu_mmvq.cu - decode-time matrix-vector products on int8 activations
 * (cu_mmvq.cuh), activation quantization, RMSNorm fused with it, and the
 * FFN's gate/up products fused with SwiGLU.
 *
 * mmvq_k: a block of 128 threads owns RR consecutive rows of one matrix
 * (up to three matrices that read the same input share one launch, e.g.
 * Q, K and V). Thread i takes the rows' chunks i, i + 128, ...: it loads
 * each chunk of its RR rows with wide loads (several loads in flight),
 * unpacks them once into registers, and dots them with the q8 activations
 * of every token (NT <= 8) with __dp4a, so the weight bytes are read once
 * per step whatever the batch, and each activation load serves RR rows.
 * The block sums its threads' partials (warp shuffles, then shared
 * memory). RR = 2 for one or two tokens, 4 for more (more reuse of each
 * activation load from L1 where the batch is larger).
 *
 * mmvq_glu_k: the same over RH rows of W_gate and the same RH rows of
 * W_up; writes h = silu(gate) * up.
 *
 * mv1_k / mv1_glu_k: one token, rows of 64-element units, several rows a
 * block (below); they take the Q4_K products of that shape.
 *
 * mmq_k / mmq_glu_k: Q4_K and Q6_K batches of 3..8 tokens on the tensor
 * cores (mma.sync int8, see below); LMS_CUDA_MMA=N moves the threshold,
 * 0 turns them off.
 *
 * mmvw_k / mmvw_glu_k (LMS_CUDA_MV_WARP=1, one or two tokens): a warp per
 * row, 4 chunk loads in flight per lane, no barrier. Measured slower than
 * mmvq_k on an H200 (tg128 234 vs 250 t/s, Llama-3-8B Q4_K_M), so off by
 * default; kept for tuning on other cards.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_int.cuh"
#include "kernels/cuda/cu_mmvq.cuh"

#define MMVQ_THREADS 128
#define MMVQ_WARPS (MMVQ_THREADS / 32)

/* The Q/K/V products' fused epilogue for one token (lcu_qkv_rope): Q and
 * K rotated (RoPE, pairs 2i, 2i+1), Q into y[0], K and V into the layer's
 * cache as f16, as qkv_post_k does; on = 0 elsewhere. */
struct mv_rope {
    lcu_batch b;
    lcu_attn_shape s;
    uint16_t *kc, *vc;
    int on;
};

struct mv_args {
    const uint8_t *w[3];
    size_t rb[3];
    float *y[3];
    int64_t nr[3];
    int type[3];
    int blk0[3]; /* first block of each matrix; INT_MAX when absent */
    int n_chunks;
    const int8_t *xs;
    const float2 *xd;
    int64_t ldq; /* q8 values per token row (= n_cols) */
    int accumulate;
    /* the lane-ordered copy of xs/xd (q8_perm, cu_int.cuh) for the tensor-core
     * kernels; NULL when the producer did not write one */
    const int8_t *xp4, *xp6;
    const float2 *xpe;
    mv_rope rope;
};

/* Row r of matrix m (0: Q, 1: K, 2: V) of a one-token step: its value v
 * and pv, the value of its RoPE partner (row r ^ 1, in the same block), to
 * where the attention reads them. The rotation is qkv_post_k's, operand
 * for operand. */
__device__ __forceinline__ void rope_out(const mv_args &a, int m, int64_t r, float v, float pv)
{
    const mv_rope &e = a.rope;
    const size_t cell = kv_cell(e.b, e.s, 0);
    if (m == 2) {
        e.vc[cell + r] = __half_as_ushort(__float2half_rn(v));
        return;
    }
    const int d = (int)(r % e.s.head_dim);
    float o = v;
    if (d < e.s.n_rot) {
        float c, sn;
        rope_cs(e.s, e.b.pos[0], d / 2, &c, &sn);
        o = (d & 1) ? rope_x1(pv, v, c, sn) : rope_x0(v, pv, c, sn);
    }
    if (m == 0)
        a.y[0][r] = o;
    else
        e.kc[cell + r] = __half_as_ushort(__float2half_rn(o));
}

template <int T, int NT, int RR>
__device__ __forceinline__ void mv_accum(const uint8_t *const *rows, int n_chunks,
                                         const int8_t *__restrict__ xs,
                                         const float2 *__restrict__ xd, int64_t ldq,
                                         float (&acc)[RR][NT])
{
    typedef mq::ops<T> O;
    /* the first chunk's weights are constant: load them before waiting for
     * the previous kernel (pdl_wait), so their latency hides behind its tail */
    int c = threadIdx.x;
    typename O::raw r[RR];
    if (c < n_chunks)
#pragma unroll
        for (int i = 0; i < RR; i++)
            O::load(rows[i], c, r[i]);
    pdl_wait();
    for (; c < n_chunks; c += MMVQ_THREADS) {
        if (c != (int)threadIdx.x)
#pragma unroll
            for (int i = 0; i < RR; i++)
                O::load(rows[i], c, r[i]);
        typename O::prep p[RR];
#pragma unroll
        for (int i = 0; i < RR; i++)
            O::unpack(r[i], c, p[i]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            typename O::act a;
            O::load_act(xs + t * ldq, xd + t * (ldq / 32), c, a);
#pragma unroll
            for (int i = 0; i < RR; i++)
                acc[i][t] += O::dotp(p[i], a);
        }
    }
}

/* IQ: whether the IQ4 types' code is compiled in (see has_iq4). */
template <int NT, int RR, bool IQ>
__device__ __forceinline__ void mv_dispatch(int type, const uint8_t *const *rows, int n_chunks,
                                            const int8_t *__restrict__ xs,
                                            const float2 *__restrict__ xd, int64_t ldq,
                                            float (&acc)[RR][NT])
{
    switch (type) {
    case LMS_TYPE_Q4_K: mv_accum<LMS_TYPE_Q4_K, NT, RR>(rows, n_chunks, xs, xd, ldq, acc); break;
    case LMS_TYPE_Q6_K: mv_accum<LMS_TYPE_Q6_K, NT, RR>(rows, n_chunks, xs, xd, ldq, acc); break;
    case LMS_TYPE_Q5_K: mv_accum<LMS_TYPE_Q5_K, NT, RR>(rows, n_chunks, xs, xd, ldq, acc); break;
    case LMS_TYPE_Q8_0: mv_accum<LMS_TYPE_Q8_0, NT, RR>(rows, n_chunks, xs, xd, ldq, acc); break;
    case LMS_TYPE_Q4_0: mv_accum<LMS_TYPE_Q4_0, NT, RR>(rows, n_chunks, xs, xd, ldq, acc); break;
    default:
        if constexpr (IQ) {
            if (type == LMS_TYPE_IQ4_NL) {
                mv_accum<LMS_TYPE_IQ4_NL, NT, RR>(rows, n_chunks, xs, xd, ldq, acc);
                break;
            }
            if (type == LMS_TYPE_IQ4_XS) {
                mv_accum<LMS_TYPE_IQ4_XS, NT, RR>(rows, n_chunks, xs, xd, ldq, acc);
                break;
            }
        }
        pdl_wait();
        break;
    }
}

/* Sums acc over the block into red[0][i] (i < RR*NT); ends with a barrier. */
template <int NT, int RR>
__device__ __forceinline__ void block_reduce(float (&acc)[RR][NT], float (*red)[RR * NT])
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < RR; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = warp_sum(acc[i][t]);
            if (lane == 0)
                red[warp][i * NT + t] = v;
        }
    __syncthreads();
    if (threadIdx.x < RR * NT) {
        float s = red[0][threadIdx.x];
#pragma unroll
        for (int w = 1; w < MMVQ_WARPS; w++)
            s += red[w][threadIdx.x];
        red[0][threadIdx.x] = s;
    }
    __syncthreads();
}

template <int NT, int RR, bool IQ>
__global__ void __launch_bounds__(MMVQ_THREADS, NT <= 2 ? 8 : (NT <= 4 ? 4 : 3)) mmvq_k(mv_args a)
{
    pdl_trigger();
    __shared__ float red[MMVQ_WARPS][RR * NT];
    const int b = blockIdx.x;
    const int m = b >= a.blk0[2] ? 2 : (b >= a.blk0[1] ? 1 : 0);
    const int64_t nr = a.nr[m], r0 = (int64_t)(b - a.blk0[m]) * RR;
    const uint8_t *rows[RR];
#pragma unroll
    for (int i = 0; i < RR; i++)
        rows[i] = a.w[m] + (size_t)(r0 + i < nr ? r0 + i : nr - 1) * a.rb[m];
    float acc[RR][NT];
#pragma unroll
    for (int i = 0; i < RR; i++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[i][t] = 0.0f;
    mv_dispatch<NT, RR, IQ>(a.type[m], rows, a.n_chunks, a.xs, a.xd, a.ldq, acc);
    block_reduce<NT, RR>(acc, red);
    if constexpr (NT == 1 && RR % 2 == 0) {
        if (a.rope.on) { /* rows r0 + i, i < RR: RoPE pairs (r0 is even) */
            const int i = threadIdx.x;
            if (i < RR && r0 + i < nr)
                rope_out(a, m, r0 + i, red[0][i], red[0][i ^ 1]);
            return;
        }
    }
    if (threadIdx.x < RR * NT) {
        const int i = threadIdx.x / NT, t = threadIdx.x % NT;
        if (r0 + i < nr) {
            float *dst = a.y[m] + t * nr + r0 + i;
            const float v = red[0][threadIdx.x];
            *dst = a.accumulate ? *dst + v : v;
        }
    }
}

/* RH rows of gate (w[0]) and the same rows of up (w[1]); h = y[0]. */
template <int NT, int RH, bool IQ>
__global__ void __launch_bounds__(MMVQ_THREADS, NT <= 2 ? 8 : (NT <= 4 ? 4 : 3)) mmvq_glu_k(mv_args a)
{
    pdl_trigger();
    __shared__ float red[MMVQ_WARPS][2 * RH * NT];
    const int64_t nr = a.nr[0], r0 = (int64_t)blockIdx.x * RH;
    const uint8_t *rows[2 * RH];
#pragma unroll
    for (int i = 0; i < RH; i++) {
        const int64_t r = r0 + i < nr ? r0 + i : nr - 1;
        rows[i] = a.w[0] + (size_t)r * a.rb[0];
        rows[RH + i] = a.w[1] + (size_t)r * a.rb[1];
    }
    float acc[2 * RH][NT];
#pragma unroll
    for (int i = 0; i < 2 * RH; i++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[i][t] = 0.0f;
    mv_dispatch<NT, 2 * RH, IQ>(a.type[0], rows, a.n_chunks, a.xs, a.xd, a.ldq, acc);
    block_reduce<NT, 2 * RH>(acc, red);
    if (threadIdx.x < RH * NT) {
        const int i = threadIdx.x / NT, t = threadIdx.x % NT;
        if (r0 + i < nr) {
            const float g = red[0][i * NT + t], u = red[0][(RH + i) * NT + t];
            a.y[0][t * nr + r0 + i] = g / (1.0f + expf(-g)) * u;
        }
    }
}

/* ---- warp-per-row variant (one or two tokens) -----------------------------------
 * A warp owns R rows; its lanes take chunks lane, lane + 32, ... in groups
 * of U whose loads are all issued before any is used, so each lane keeps
 * U chunk loads per row in flight; no shared memory, no barrier. */
template <int T, int NT, int R, int U>
__device__ __forceinline__ void mw_accum(const uint8_t *const *rows, int n_chunks,
                                         const int8_t *__restrict__ xs,
                                         const float2 *__restrict__ xd, int64_t ldq,
                                         float (&acc)[R][NT])
{
    typedef mq::ops<T> O;
    const int lane = threadIdx.x & 31;
    for (int c0 = lane; c0 < n_chunks; c0 += 32 * U) {
        typename O::raw r[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (c0 + 32 * u < n_chunks)
#pragma unroll
                for (int i = 0; i < R; i++)
                    O::load(rows[i], c0 + 32 * u, r[u][i]);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + 32 * u;
            if (c < n_chunks) {
                typename O::prep p[R];
#pragma unroll
                for (int i = 0; i < R; i++)
                    O::unpack(r[u][i], c, p[i]);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    typename O::act a;
                    O::load_act(xs + t * ldq, xd + t * (ldq / 32), c, a);
#pragma unroll
                    for (int i = 0; i < R; i++)
                        acc[i][t] += O::dotp(p[i], a);
                }
            }
        }
    }
}

template <int NT, int R, int U, bool IQ>
__device__ __forceinline__ void mw_dispatch(int type, const uint8_t *const *rows, int n_chunks,
                                            const int8_t *__restrict__ xs,
                                            const float2 *__restrict__ xd, int64_t ldq,
                                            float (&acc)[R][NT])
{
    switch (type) {
    case LMS_TYPE_Q4_K: mw_accum<LMS_TYPE_Q4_K, NT, R, U>(rows, n_chunks, xs, xd, ldq, acc); break;
    case LMS_TYPE_Q6_K: mw_accum<LMS_TYPE_Q6_K, NT, R, U>(rows, n_chunks, xs, xd, ldq, acc); break;
    case LMS_TYPE_Q5_K: mw_accum<LMS_TYPE_Q5_K, NT, R, U>(rows, n_chunks, xs, xd, ldq, acc); break;
    case LMS_TYPE_Q8_0: mw_accum<LMS_TYPE_Q8_0, NT, R, U>(rows, n_chunks, xs, xd, ldq, acc); break;
    case LMS_TYPE_Q4_0: mw_accum<LMS_TYPE_Q4_0, NT, R, U>(rows, n_chunks, xs, xd, ldq, acc); break;
    default:
        if constexpr (IQ) {
            if (type == LMS_TYPE_IQ4_NL)
                mw_accum<LMS_TYPE_IQ4_NL, NT, R, U>(rows, n_chunks, xs, xd, ldq, acc);
            else if (type == LMS_TYPE_IQ4_XS)
                mw_accum<LMS_TYPE_IQ4_XS, NT, R, U>(rows, n_chunks, xs, xd, ldq, acc);
        }
        break;
    }
}

/* blk0[] and the row groups count warps here (group = global warp id). */
template <int NT, bool IQ>
__global__ void __launch_bounds__(MMVQ_THREADS, 6) mmvw_k(mv_args a)
{
    pdl_trigger();
    pdl_wait();
    const int wid = blockIdx.x * MMVQ_WARPS + (threadIdx.x >> 5);
    const int m = wid >= a.blk0[2] ? 2 : (wid >= a.blk0[1] ? 1 : 0);
    const int64_t nr = a.nr[m], r0 = (int64_t)(wid - a.blk0[m]);
    if (r0 >= nr)
        return;
    const uint8_t *rows[1] = {a.w[m] + (size_t)r0 * a.rb[m]};
    float acc[1][NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[0][t] = 0.0f;
    mw_dispatch<NT, 1, 4, IQ>(a.type[m], rows, a.n_chunks, a.xs, a.xd, a.ldq, acc);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[0][t]);
        if ((threadIdx.x & 31) == 0) {
            float *dst = a.y[m] + t * nr + r0;
            *dst = a.accumulate ? *dst + v : v;
        }
    }
}

/* Row r0 of gate and of up per warp; h = y[0]. */
template <int NT, bool IQ>
__global__ void __launch_bounds__(MMVQ_THREADS, 6) mmvw_glu_k(mv_args a)
{
    pdl_trigger();
    pdl_wait();
    const int64_t nr = a.nr[0], r0 = (int64_t)blockIdx.x * MMVQ_WARPS + (threadIdx.x >> 5);
    if (r0 >= nr)
        return;
    const uint8_t *rows[2] = {a.w[0] + (size_t)r0 * a.rb[0], a.w[1] + (size_t)r0 * a.rb[1]};
    float acc[2][NT];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[i][t] = 0.0f;
    mw_dispatch<NT, 2, 2, IQ>(a.type[0], rows, a.n_chunks, a.xs, a.xd, a.ldq, acc);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float gv = warp_sum(acc[0][t]), uv = warp_sum(acc[1][t]);
        if ((threadIdx.x & 31) == 0)
            a.y[0][t * nr + r0] = gv / (1.0f + expf(-gv)) * uv;
    }
}

/* ---- one token: 64-element units, TPR threads per row ------------------------------
 * mv1_k / mv1_glu_k: a row's units (mq::unit: Q4_K, Q6_K; other types fall
 * back to 32-element chunks) are spread over TPR threads (32, 64 or 128),
 * a block holds 128 / TPR rows, and a thread loads its next unit's weights
 * before it dots the current one. Why: the mmvq_k layout (every row spread
 * over the whole block, one chunk of 32 per thread and row) spends most of
 * its instructions on per-chunk scale decoding, addressing and the
 * block-wide reduction. On an H200 (Llama-3-8B Q4_K_M, one token, ncu at
 * the card's own clocks) the gate/up product took 16.1 M instructions and
 * 26.2 us with mmvq_glu_k, 8.5 M and 22.8 us (2.9 TB/s) with mv1_glu_k;
 * W_o 7.5 -> 6.6 us; the decode step 2.66-2.69 -> 2.53-2.54 ms. Q6_K
 * units (2-byte aligned blocks) stay slower than mmvq_k even when read
 * with aligned 16-byte loads: W_down 20.2 -> 22.2-25.2 us, the Q6_K head
 * 150 -> 163 us; they are latency-bound (instructions issued on 39-48% of
 * the cycles). So by default only launches whose matrices are all Q4_K
 * take these kernels (LMS_CUDA_MV1=2: any type, 0: none). blk0[] counts
 * rows here. */
template <int T, int TPR, bool GLU>
__device__ __forceinline__ void mv1_units(const uint8_t *r0, const uint8_t *r1, int n_units,
                                          const int8_t *__restrict__ xs,
                                          const float2 *__restrict__ xd, float &s0, float &s1)
{
    typedef mq::unit<T> U;
    int u = (int)(threadIdx.x % TPR);
    typename U::raw w0, w1;
    if (u < n_units) {
        U::load(r0, u, w0);
        if (GLU)
            U::load(r1, u, w1);
    }
    pdl_wait();
    while (u < n_units) {
        const int un = u + TPR;
        typename U::raw n0, n1;
        if (un < n_units) {
            U::load(r0, un, n0);
            if (GLU)
                U::load(r1, un, n1);
        }
        s0 += U::dot(w0, u, xs, xd);
        if (GLU)
            s1 += U::dot(w1, u, xs, xd);
        w0 = n0;
        if (GLU)
            w1 = n1;
        u = un;
    }
}

/* The same over 32-element chunks (mq::ops), for the types without units. */
template <int T, int TPR, bool GLU>
__device__ __forceinline__ void mv1_chunks(const uint8_t *r0, const uint8_t *r1, int n_chunks,
                                           const int8_t *__restrict__ xs,
                                           const float2 *__restrict__ xd, float &s0, float &s1)
{
    typedef mq::ops<T> O;
    pdl_wait();
    for (int c = (int)(threadIdx.x % TPR); c < n_chunks; c += TPR) {
        typename O::raw w;
        typename O::prep p;
        O::load(r0, c, w);
        O::unpack(w, c, p);
        s0 += O::dot(p, xs, xd, c);
        if (GLU) {
            O::load(r1, c, w);
            O::unpack(w, c, p);
            s1 += O::dot(p, xs, xd, c);
        }
    }
}

template <int TPR, bool GLU>
__device__ __forceinline__ void mv1_any(int type, const uint8_t *r0, const uint8_t *r1,
                                        int n_chunks, const int8_t *__restrict__ xs,
                                        const float2 *__restrict__ xd, float &s0, float &s1)
{
    switch (type) {
    case LMS_TYPE_Q4_K: mv1_units<LMS_TYPE_Q4_K, TPR, GLU>(r0, r1, n_chunks / 2, xs, xd, s0, s1); break;
    case LMS_TYPE_Q6_K: mv1_units<LMS_TYPE_Q6_K, TPR, GLU>(r0, r1, n_chunks / 2, xs, xd, s0, s1); break;
    case LMS_TYPE_Q5_K: mv1_chunks<LMS_TYPE_Q5_K, TPR, GLU>(r0, r1, n_chunks, xs, xd, s0, s1); break;
    case LMS_TYPE_Q8_0: mv1_chunks<LMS_TYPE_Q8_0, TPR, GLU>(r0, r1, n_chunks, xs, xd, s0, s1); break;
    case LMS_TYPE_Q4_0: mv1_chunks<LMS_TYPE_Q4_0, TPR, GLU>(r0, r1, n_chunks, xs, xd, s0, s1); break;
    case LMS_TYPE_IQ4_NL: mv1_chunks<LMS_TYPE_IQ4_NL, TPR, GLU>(r0, r1, n_chunks, xs, xd, s0, s1); break;
    case LMS_TYPE_IQ4_XS: mv1_chunks<LMS_TYPE_IQ4_XS, TPR, GLU>(r0, r1, n_chunks, xs, xd, s0, s1); break;
    default: pdl_wait(); break; /* a row past the end */
    }
}

/* TY: the one type every row has (its code alone is compiled: fewer
 * registers), or -1 for any (the QKV launch may mix types). */
template <int TPR, bool GLU, int TY>
__device__ __forceinline__ void mv1_dispatch(int type, const uint8_t *r0, const uint8_t *r1,
                                             int n_chunks, const int8_t *__restrict__ xs,
                                             const float2 *__restrict__ xd, float &s0, float &s1)
{
    if constexpr (TY >= 0) {
        if (type == TY)
            mv1_units<TY, TPR, GLU>(r0, r1, n_chunks / 2, xs, xd, s0, s1);
        else
            pdl_wait();
    } else {
        mv1_any<TPR, GLU>(type, r0, r1, n_chunks, xs, xd, s0, s1);
    }
}

/* Sums v over the TPR threads of each row; the row's first thread gets it. */
template <int TPR> __device__ __forceinline__ float mv1_reduce(float v, float *red)
{
    v = warp_sum(v);
    if (TPR > 32) {
        const int warp = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0)
            red[warp] = v;
        __syncthreads();
        if (threadIdx.x % TPR == 0)
#pragma unroll
            for (int w = 1; w < TPR / 32; w++)
                v += red[warp + w];
    }
    return v;
}

template <int TPR, int TY>
__global__ void __launch_bounds__(MMVQ_THREADS) mv1_k(mv_args a)
{
    pdl_trigger();
    __shared__ float red[MMVQ_WARPS];
    const int row = (int)(blockIdx.x * (MMVQ_THREADS / TPR) + threadIdx.x / TPR);
    const int m = row >= a.blk0[2] ? 2 : (row >= a.blk0[1] ? 1 : 0);
    const int64_t r = row - a.blk0[m];
    const bool ok = r < a.nr[m];
    const uint8_t *w = a.w[m] + (size_t)(ok ? r : 0) * a.rb[m];
    float s = 0.0f, unused = 0.0f;
    mv1_dispatch<TPR, false, TY>(ok ? a.type[m] : -1, w, w, a.n_chunks, a.xs, a.xd, s, unused);
    s = mv1_reduce<TPR>(s, red);
    if constexpr (TPR < MMVQ_THREADS) {
        if (a.rope.on) { /* a block's rows come in RoPE pairs (lcu_qkv_rope) */
            __shared__ float pair[MMVQ_THREADS / TPR];
            const int k = threadIdx.x / TPR;
            if (threadIdx.x % TPR == 0)
                pair[k] = s;
            __syncthreads();
            if (ok && threadIdx.x % TPR == 0)
                rope_out(a, m, r, s, pair[k ^ 1]);
            return;
        }
    }
    if (ok && threadIdx.x % TPR == 0) {
        float *dst = a.y[m] + r;
        *dst = a.accumulate ? *dst + s : s;
    }
}

/* Row r of gate (w[0]) and of up (w[1]) per TPR threads; h = y[0]. */
template <int TPR, int TY>
__global__ void __launch_bounds__(MMVQ_THREADS) mv1_glu_k(mv_args a)
{
    pdl_trigger();
    __shared__ float red[MMVQ_WARPS * 2];
    const int64_t r = (int64_t)blockIdx.x * (MMVQ_THREADS / TPR) + threadIdx.x / TPR;
    const bool ok = r < a.nr[0];
    const uint8_t *wg = a.w[0] + (size_t)(ok ? r : 0) * a.rb[0];
    const uint8_t *wu = a.w[1] + (size_t)(ok ? r : 0) * a.rb[1];
    float g = 0.0f, u = 0.0f;
    mv1_dispatch<TPR, true, TY>(ok ? a.type[0] : -1, wg, wu, a.n_chunks, a.xs, a.xd, g, u);
    g = mv1_reduce<TPR>(g, red);
    u = mv1_reduce<TPR>(u, red + MMVQ_WARPS);
    if (ok && threadIdx.x % TPR == 0)
        a.y[0][r] = g / (1.0f + expf(-g)) * u;
}

/* ---- tensor-core variant: 3..8 tokens of Q4_K / Q6_K -------------------------------
 * mma.sync (int8 in, int32 out) multiplies 16 weight rows by 8 tokens per
 * instruction (fragments: cu_mmvq.cuh), so the integer work of a decode
 * step no longer grows with the batch; what remains per token is the float
 * scaling of the int32 results. A block of W warps (8; LMS_CUDA_MMA_WARPS=4
 * or 16 for tuning) owns 16 rows; warp w takes super-blocks w, w + W, ...
 * and the warps' partial sums meet in shared memory. Columns past the batch
 * read the last token and are dropped. Needs sm_80 or newer: the host
 * launches it only there (g->mma). H100, Llama-3-8B Q4_K_M, 8 sequences:
 * decode step 6.30 ms with the __dp4a kernels, 4.86 ms with these. */
#define MMQ_ROWS 16

struct mma_dev {
    LCU_HD void k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1)
    {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
            : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
        (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1;
        c[0] = c[1] = c[2] = c[3] = 0;
#endif
    }
    LCU_HD void k16(int (&c)[4], int a0, int a1, int b0)
    {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
            "{%7, %7, %7, %7};"
            : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
            : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
        (void)a0, (void)a1, (void)b0;
        c[0] = c[1] = c[2] = c[3] = 0;
#endif
    }
};

template <int T, int NM, bool PL>
__device__ __forceinline__ void mmq_sb(const uint8_t *const (&ra)[NM],
                                       const uint8_t *const (&rb)[NM], int sb, int t,
                                       const int8_t *__restrict__ xg,
                                       const float2 *__restrict__ xd0,
                                       const float2 *__restrict__ xd1, float (&acc)[NM][2][2])
{
    mma_dev mma;
    const int lane = threadIdx.x & 31;
    if (T == LMS_TYPE_Q4_K)
        mq::mmq_q4k_sb<NM, PL>(mma, ra, rb, sb, t, xg, xd0, xd1, acc, lane);
    else
        mq::mmq_q6k_sb<NM, PL>(mma, ra, rb, sb, t, xg, xd0, xd1, acc, lane);
}

/* A warp's super-blocks sb = warp, warp + W, ... The activation pointers
 * come in as restrict parameters of this loop rather than through the
 * kernel's arguments: with the same work per super-block, the code nvcc
 * makes of this ran the 8-token step 3-5% faster (H200, Llama-3-8B Q4_K_M,
 * alternating in one call: 3.93-3.97 ms against 4.05-4.11). */
template <int T, int NM, int W, bool PL>
__device__ __forceinline__ void mmq_loop(const uint8_t *const (&ra)[NM],
                                         const uint8_t *const (&rb)[NM], int n_sb, int t,
                                         const int8_t *__restrict__ xg,
                                         const float2 *__restrict__ xd0,
                                         const float2 *__restrict__ xd1, float (&acc)[NM][2][2])
{
    for (int sb = threadIdx.x >> 5; sb < n_sb; sb += W)
        mmq_sb<T, NM, PL>(ra, rb, sb, t, xg, xd0, xd1, acc);
}

/* Sums acc[NM][2][2] of the block's warps; returns the totals in warp 0's
 * lanes (other warps get garbage). red: [W][32][NM * 4] floats. */
template <int W, int NM>
__device__ __forceinline__ void mmq_reduce(float (&acc)[NM][2][2], float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *mine = red + ((size_t)warp * 32 + lane) * NM * 4;
#pragma unroll
    for (int k = 0; k < NM; k++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            mine[k * 4 + i] = acc[k][i >> 1][i & 1];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int w = 1; w < W; w++) {
            const float *o = red + ((size_t)w * 32 + lane) * NM * 4;
#pragma unroll
            for (int k = 0; k < NM; k++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[k][i >> 1][i & 1] += o[k * 4 + i];
        }
    }
}

/* y[m] (+)= W[m]·x for up to three matrices of type T (blocks of 16 rows;
 * blk0 counts blocks), n_tok in [1, 8]. */
template <int T, int W, bool PL>
__global__ void __launch_bounds__(W * 32) mmq_k(mv_args a, int n_tok)
{
    pdl_trigger();
    __shared__ float red[W * 32 * 4];
    const int b = blockIdx.x;
    const int m = b >= a.blk0[2] ? 2 : (b >= a.blk0[1] ? 1 : 0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t nr = a.nr[m], r0 = (int64_t)(b - a.blk0[m]) * MMQ_ROWS;
    pdl_wait();
    const int64_t rg = r0 + g < nr ? r0 + g : nr - 1, rh = r0 + g + 8 < nr ? r0 + g + 8 : nr - 1;
    const uint8_t *const ra[1] = {a.w[m] + (size_t)rg * a.rb[m]};
    const uint8_t *const rb[1] = {a.w[m] + (size_t)rh * a.rb[m]};
    const int tg = g < n_tok ? g : n_tok - 1;
    const int u0 = 2 * t < n_tok ? 2 * t : n_tok - 1, u1 = 2 * t + 1 < n_tok ? 2 * t + 1 : n_tok - 1;
    const int8_t *xg = a.xs + (size_t)tg * a.ldq;
    const float2 *xd0 = a.xd + (size_t)u0 * (a.ldq / 32), *xd1 = a.xd + (size_t)u1 * (a.ldq / 32);
    float acc[1][2][2] = {{{0.0f, 0.0f}, {0.0f, 0.0f}}};
    const int n_sb = a.n_chunks / 8;
    if (PL)
        mmq_loop<T, 1, W, true>(ra, rb, n_sb, t, T == LMS_TYPE_Q4_K ? a.xp4 : a.xp6, a.xpe, a.xpe,
                                acc);
    else
        mmq_loop<T, 1, W, false>(ra, rb, n_sb, t, xg, xd0, xd1, acc);
    mmq_reduce<W, 1>(acc, red);
    if (warp != 0)
        return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r = r0 + g + 8 * (i >> 1);
        const int u = 2 * t + (i & 1);
        if (r < nr && u < n_tok) {
            float *dst = a.y[m] + (size_t)u * nr + r;
            const float v = acc[0][i >> 1][i & 1];
            *dst = a.accumulate ? *dst + v : v;
        }
    }
}

/* The same 16 rows of W_gate (w[0]) and W_up (w[1]); h = y[0] = silu(gate) * up. */
template <int T, int W, bool PL>
__global__ void __launch_bounds__(W * 32) mmq_glu_k(mv_args a, int n_tok)
{
    pdl_trigger();
    __shared__ float red[W * 32 * 8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t nr = a.nr[0], r0 = (int64_t)blockIdx.x * MMQ_ROWS;
    pdl_wait();
    const int64_t rg = r0 + g < nr ? r0 + g : nr - 1, rh = r0 + g + 8 < nr ? r0 + g + 8 : nr - 1;
    const int tg = g < n_tok ? g : n_tok - 1;
    const int u0 = 2 * t < n_tok ? 2 * t : n_tok - 1, u1 = 2 * t + 1 < n_tok ? 2 * t + 1 : n_tok - 1;
    const int8_t *xg = a.xs + (size_t)tg * a.ldq;
    const float2 *xd0 = a.xd + (size_t)u0 * (a.ldq / 32), *xd1 = a.xd + (size_t)u1 * (a.ldq / 32);
    float acc[2][2][2] = {{{0.0f, 0.0f}, {0.0f, 0.0f}}, {{0.0f, 0.0f}, {0.0f, 0.0f}}};
    const int n_sb = a.n_chunks / 8;
    const uint8_t *const ra[2] = {a.w[0] + (size_t)rg * a.rb[0], a.w[1] + (size_t)rg * a.rb[1]};
    const uint8_t *const rb[2] = {a.w[0] + (size_t)rh * a.rb[0], a.w[1] + (size_t)rh * a.rb[1]};
    if (PL)
        mmq_loop<T, 2, W, true>(ra, rb, n_sb, t, T == LMS_TYPE_Q4_K ? a.xp4 : a.xp6, a.xpe, a.xpe,
                                acc);
    else
        mmq_loop<T, 2, W, false>(ra, rb, n_sb, t, xg, xd0, xd1, acc);
    mmq_reduce<W, 2>(acc, red);
    if (warp != 0)
        return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r = r0 + g + 8 * (i >> 1);
        const int u = 2 * t + (i & 1);
        if (r < nr && u < n_tok) {
            const float gv = acc[0][i >> 1][i & 1], uv = acc[1][i >> 1][i & 1];
            a.y[0][(size_t)u * nr + r] = gv / (1.0f + expf(-gv)) * uv;
        }
    }
}

/* ---- activation quantization ------------------------------------------------------ */


/* One warp per 32 values; x is [n_tok][n] flat (n % 32 == 0). */
__global__ void quant_q8_k(const float *__restrict__ x, int8_t *__restrict__ qs,
                           float2 *__restrict__ ds, int64_t n_blk, q8_perm pm)
{
    pdl_trigger();
    pdl_wait();
    const int64_t blk = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (blk >= n_blk)
        return;
    const int64_t i = blk * 32 + (threadIdx.x & 31);
    quant_lane(x[i], qs, ds, i, pm);
}

/* RMSNorm of a row, written as f32 and as q8 (n % 32 == 0). */
__global__ void rms_norm_q8_k(const float *__restrict__ x, const float *__restrict__ w,
                              float *__restrict__ out, int8_t *__restrict__ qs,
                              float2 *__restrict__ ds, int64_t n, float eps, q8_perm pm)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float part[32];
    const float *xr = x + blockIdx.x * n;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        s = fmaf(xr[i], xr[i], s);
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0)
            part[0] = v;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(part[0] / (float)n + eps);
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t b = warp; b < n / 32; b += nw) {
        const int64_t i = b * 32 + (threadIdx.x & 31);
        const float y = xr[i] * scale * (w ? w[i] : 1.0f);
        out[blockIdx.x * n + i] = y;
        quant_lane(y, qs, ds, blockIdx.x * n + i, pm);
    }
}

/* The same in one pass over registers (n % 32 == 0, n <= 4 * 4 * blockDim):
 * each thread holds up to RN_V float4 of the row; a q8 block of 32 values
 * is 8 neighbouring lanes, so its max and sum take 3 shuffles. */
#define RN_V 4
__global__ void __launch_bounds__(1024) rms_norm_q8_reg_k(const float *__restrict__ x,
                                                          const float *__restrict__ w,
                                                          float *__restrict__ out,
                                                          int8_t *__restrict__ qs,
                                                          float2 *__restrict__ ds, int n, float eps,
                                                          q8_perm pm)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float part[32];
    const int n4 = n >> 2;
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * n);
    float4 v[RN_V];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < RN_V; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        v[k] = c < n4 ? xr[c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        s = fmaf(v[k].x, v[k].x, fmaf(v[k].y, v[k].y, fmaf(v[k].z, v[k].z, fmaf(v[k].w, v[k].w, s))));
    }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
        t = warp_sum(t);
        if (threadIdx.x == 0)
            part[0] = t;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(part[0] / (float)n + eps);
#pragma unroll
    for (int k = 0; k < RN_V; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        if (k * blockDim.x >= (unsigned)n4) /* uniform over the block */
            break;
        const bool ok = c < n4;
        float4 y = v[k];
        const float4 wv = (w && ok) ? ((const float4 *)w)[c] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        y.x = y.x * scale * wv.x, y.y = y.y * scale * wv.y;
        y.z = y.z * scale * wv.z, y.w = y.w * scale * wv.w;
        float am = fmaxf(fmaxf(fabsf(y.x), fabsf(y.y)), fmaxf(fabsf(y.z), fabsf(y.w)));
#pragma unroll
        for (int o = 4; o > 0; o >>= 1)
            am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
        const float d = am / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        const int q0 = __float2int_rn(y.x * id), q1 = __float2int_rn(y.y * id);
        const int q2 = __float2int_rn(y.z * id), q3 = __float2int_rn(y.w * id);
        float qs_sum = (float)(q0 + q1 + q2 + q3);
#pragma unroll
        for (int o = 4; o > 0; o >>= 1)
            qs_sum += __shfl_xor_sync(0xffffffffu, qs_sum, o);
        if (ok) {
            const size_t flat = (size_t)blockIdx.x * n + (size_t)c * 4;
            *(float4 *)(out + flat) = y;
            *(char4 *)(qs + flat) = make_char4((signed char)q0, (signed char)q1, (signed char)q2,
                                               (signed char)q3);
            if ((threadIdx.x & 7) == 0)
                ds[flat >> 5] = make_float2(d, d * qs_sum);
            if (pm.p4) {
                /* four neighbours stay neighbours in both orders */
                const char4 q4 = make_char4((signed char)q0, (signed char)q1, (signed char)q2,
                                            (signed char)q3);
                const int64_t u = blockIdx.x, k = (int64_t)c * 4;
                *(char4 *)(pm.p4 + mq::perm4_at(u, k)) = q4;
                *(char4 *)(pm.p6 + mq::perm6_at(u, k)) = q4;
                if ((threadIdx.x & 7) == 0)
                    pm.pe[mq::perme_at(u, k)] = make_float2(d, d * qs_sum);
            }
        }
    }
}

/* ---- host side -------------------------------------------------------------------- */

static inline int8_t *q8_qs(const void *xq)
{
    return (int8_t *)xq;
}
static inline float2 *q8_ds(const void *xq, int64_t n_tok, int64_t n)
{
    return (float2 *)((int8_t *)xq + n_tok * n);
}

/* The row layout of n_tok tokens, then room for the lane-ordered copy of
 * up to LCU_MATVEC_MAX tokens (p4, p6: 8 n bytes each; pe: 8 n / 32
 * float2). */
static size_t q8_row_bytes(int64_t n_tok, int64_t n)
{
    return (size_t)(n_tok * n) + (size_t)(n_tok * (n / 32)) * sizeof(float2);
}

extern "C" size_t lcu_q8_bytes(int64_t n_tok, int64_t n)
{
    return q8_row_bytes(n_tok, n) + (size_t)(2 * LCU_MATVEC_MAX * n) +
           (size_t)(LCU_MATVEC_MAX * (n / 32)) * sizeof(float2);
}

q8_perm lcu_q8_perm(const lcu *g, void *xq, int64_t n_tok, int64_t n)
{
    q8_perm pm = {NULL, NULL, NULL, n};
    if (!g->mma || !g->mmq_perm || n_tok < g->mma || n_tok > LCU_MATVEC_MAX || n % 256 != 0)
        return pm;
    pm.p4 = (int8_t *)xq + q8_row_bytes(n_tok, n);
    pm.p6 = pm.p4 + LCU_MATVEC_MAX * n;
    pm.pe = (float2 *)(pm.p6 + LCU_MATVEC_MAX * n);
    return pm;
}

extern "C" bool lcu_q8_type(int type)
{
    return mq::has_ops(type);
}

extern "C" void lcu_quantize_q8(lcu *g, const float *x, void *xq, int64_t n_tok, int64_t n)
{
    const int64_t nb = n_tok * n / 32;
    if (nb > 0)
        lcu_go(g, quant_q8_k, dim3((unsigned)lcu_cdiv(nb, 8)), dim3(256), x, q8_qs(xq),
               q8_ds(xq, n_tok, n), nb, lcu_q8_perm(g, xq, n_tok, n));
}

extern "C" void lcu_rms_norm_q8(lcu *g, const float *x, const float *w, float *out, void *xq,
                                int64_t n_rows, int64_t n, float eps)
{
    if (!xq || n % 32 != 0) {
        lcu_rms_norm(g, x, w, out, n_rows, n, eps);
        return;
    }
    const unsigned th = lcu_rows_threads(n);
    static int reg = -1;
    if (reg < 0) {
        const char *e = getenv("LMS_CUDA_RMS_REG");
        reg = !e || atoi(e) != 0;
    }
    /* one pass over registers: whole float4 per lane, 8 lanes per q8 block */
    if (n_rows > 0 && reg && n % 32 == 0 && n <= (int64_t)RN_V * 4 * 1024 &&
        ((uintptr_t)x | (uintptr_t)w | (uintptr_t)out) % 16 == 0) {
        /* as many threads as float4 up to 1024: the row's loads all in flight at
         * once. H200, Llama-3-8B Q4_K_M, one-token step (device run 80): 1024
         * threads 2.365-2.389 ms, 512 2.383-2.411, 256 (4 float4 a thread)
         * 2.490-2.512; 128 (run 79) 0.17 ms slower still */
        const int64_t n4 = n / 4;
        unsigned t = (unsigned)(n4 <= 1024 ? (n4 + 31) / 32 * 32 : 1024);
        static int rms_t = -1; /* LMS_CUDA_RMS_THREADS=N: N threads a row, for tuning */
        if (rms_t < 0) {
            const char *e = getenv("LMS_CUDA_RMS_THREADS");
            rms_t = e ? atoi(e) : 0;
        }
        if (rms_t >= 32 && rms_t <= 1024 && rms_t % 32 == 0 && (int64_t)rms_t * 4 * RN_V >= n)
            t = (unsigned)rms_t;
        lcu_go(g, rms_norm_q8_reg_k, dim3((unsigned)n_rows), dim3(t < 32 ? 32 : t), x, w, out,
               q8_qs(xq), q8_ds(xq, n_rows, n), (int)n, eps, lcu_q8_perm(g, xq, n_rows, n));
        return;
    }
    if (n_rows > 0)
        lcu_go(g, rms_norm_q8_k, dim3((unsigned)n_rows), dim3(th), x, w, out, q8_qs(xq),
               q8_ds(xq, n_rows, n), n, eps, lcu_q8_perm(g, xq, n_rows, n));
}

/* Whether the int8 kernels take this product. */
static bool q8_ok(const lcu *g, const lcu_mat *w, int64_t n_tok)
{
    return g->q8 && n_tok >= 1 && n_tok <= LCU_MATVEC_MAX && mq::has_ops(w->type) &&
           w->n_cols % 32 == 0 && w->n_cols / 32 < INT_MAX;
}

/* Whether a launch has IQ4 matrices. Those take kernels compiled with the
 * IQ4 cases, the others kernels without them: the extra cases changed the
 * register allocation of the shared kernels and made them slower (H200,
 * 14336 x 4096, 7-8 tokens: Q4_0, Q8_0, Q5_K 31.1, 38.6, 38.5 us -> 33.3,
 * 41.2, 41.3 us; 4 tokens of Q5_K 28.2 -> 31.2 us). */
static bool has_iq4(const mv_args &a)
{
    for (int m = 0; m < 3; m++)
        if (a.blk0[m] != INT_MAX && (a.type[m] == LMS_TYPE_IQ4_NL || a.type[m] == LMS_TYPE_IQ4_XS))
            return true;
    return false;
}

template <int NT> static void launch_mv(lcu *g, const mv_args &a, int blocks)
{
    if (has_iq4(a))
        lcu_go(g, mmvq_k<NT, (NT <= 2 ? 2 : 4), true>, dim3((unsigned)blocks), dim3(MMVQ_THREADS), a);
    else
        lcu_go(g, mmvq_k<NT, (NT <= 2 ? 2 : 4), false>, dim3((unsigned)blocks), dim3(MMVQ_THREADS), a);
}

template <int NT> static void launch_glu(lcu *g, const mv_args &a, int blocks)
{
    if (has_iq4(a))
        lcu_go(g, mmvq_glu_k<NT, (NT <= 2 ? 1 : 2), true>, dim3((unsigned)blocks), dim3(MMVQ_THREADS), a);
    else
        lcu_go(g, mmvq_glu_k<NT, (NT <= 2 ? 1 : 2), false>, dim3((unsigned)blocks), dim3(MMVQ_THREADS), a);
}

/* The warp-per-row kernels (one or two tokens; glu: the gate/up one). */
template <int NT> static void launch_mw(lcu *g, bool glu, const mv_args &a, unsigned nb)
{
    const bool iq = has_iq4(a);
    if (glu && iq)
        lcu_go(g, mmvw_glu_k<NT, true>, dim3(nb), dim3(MMVQ_THREADS), a);
    else if (glu)
        lcu_go(g, mmvw_glu_k<NT, false>, dim3(nb), dim3(MMVQ_THREADS), a);
    else if (iq)
        lcu_go(g, mmvw_k<NT, true>, dim3(nb), dim3(MMVQ_THREADS), a);
    else
        lcu_go(g, mmvw_k<NT, false>, dim3(nb), dim3(MMVQ_THREADS), a);
}

template <int W, bool PL>
static void mmq_go(lcu *g, bool glu, bool q4, const mv_args &a, unsigned nb, int n_tok)
{
    if (glu && q4)
        lcu_go(g, mmq_glu_k<LMS_TYPE_Q4_K, W, PL>, dim3(nb), dim3(W * 32), a, n_tok);
    else if (glu)
        lcu_go(g, mmq_glu_k<LMS_TYPE_Q6_K, W, PL>, dim3(nb), dim3(W * 32), a, n_tok);
    else if (q4)
        lcu_go(g, mmq_k<LMS_TYPE_Q4_K, W, PL>, dim3(nb), dim3(W * 32), a, n_tok);
    else
        lcu_go(g, mmq_k<LMS_TYPE_Q6_K, W, PL>, dim3(nb), dim3(W * 32), a, n_tok);
}

/* The tensor-core kernel (glu: the fused gate/up one) over nb blocks,
 * reading the lane-ordered activations when their producer wrote them
 * (a.xp4). 4 or 16 warps a block are for tuning only and read the rows. */
static void mmq_run(lcu *g, bool glu, int type, const mv_args &a, unsigned nb, int n_tok)
{
    const bool q4 = type == LMS_TYPE_Q4_K;
    switch (g->mma_warps) {
    case 4: mmq_go<4, false>(g, glu, q4, a, nb, n_tok); break;
    case 16: mmq_go<16, false>(g, glu, q4, a, nb, n_tok); break;
    default:
        if (a.xp4)
            mmq_go<8, true>(g, glu, q4, a, nb, n_tok);
        else
            mmq_go<8, false>(g, glu, q4, a, nb, n_tok);
        break;
    }
}

/* Whether the tensor-core kernel takes this product (g->mma: the fewest
 * tokens it is used for, 0 = never). */
static bool mmq_ok(const lcu *g, const lcu_mat *w, int64_t n_tok)
{
    return g->mma > 0 && n_tok >= g->mma && q8_ok(g, w, n_tok) &&
           (w->type == LMS_TYPE_Q4_K || w->type == LMS_TYPE_Q6_K) && w->n_cols % 256 == 0;
}

/* a's lane-ordered activations (see q8_perm), when the producer of xq wrote them */
static void mmq_perm_args(const lcu *g, mv_args &a, const void *xq, int64_t n_tok, int64_t k)
{
    const q8_perm pm = lcu_q8_perm(g, (void *)xq, n_tok, k);
    a.xp4 = pm.p4;
    a.xp6 = pm.p6;
    a.xpe = pm.pe;
}

/* The arguments of a product of up to three matrices that read the same
 * q8 input; blk0[m] counts groups of `per` rows. Returns the groups. */
static int mv_args_set(mv_args &a, int n_mat, const lcu_mat *const *w, const void *xq,
                       int64_t n_tok, float *const *y, bool acc, int per)
{
    memset(&a, 0, sizeof a);
    int groups = 0;
    for (int m = 0; m < 3; m++) {
        if (m < n_mat) {
            a.w[m] = (const uint8_t *)w[m]->data;
            a.rb[m] = w[m]->row_bytes;
            a.y[m] = y[m];
            a.nr[m] = w[m]->n_rows;
            a.type[m] = w[m]->type;
            a.blk0[m] = groups;
            groups += (int)lcu_cdiv(w[m]->n_rows, per);
        } else {
            a.blk0[m] = INT_MAX;
        }
    }
    const int64_t k = w[0]->n_cols;
    a.n_chunks = (int)(k / 32);
    a.xs = q8_qs(xq);
    a.xd = q8_ds(xq, n_tok, k);
    a.ldq = k;
    a.accumulate = acc;
    return groups;
}

static void mmq_launch(lcu *g, int n_mat, const lcu_mat *const *w, const void *xq, int64_t n_tok,
                       float *const *y, bool acc)
{
    mv_args a;
    const int blocks = mv_args_set(a, n_mat, w, xq, n_tok, y, acc, MMQ_ROWS);
    const int64_t k = w[0]->n_cols;
    mmq_perm_args(g, a, xq, n_tok, k);
    mmq_run(g, false, w[0]->type, a, (unsigned)blocks, (int)n_tok);
}

static bool use_warp(const lcu *g, int64_t n_tok)
{
    return n_tok <= 2 && g->mv_warp;
}

/* Threads per row for the one-token unit kernels, 0 where they are not
 * used. Measured (H200, Llama-3-8B Q4_K_M) only for rows of 4096 columns
 * (64 units, two per lane with 32 threads a row), so by default only rows
 * of 64-96 units take them; LMS_CUDA_MV1_TPR=32|64|128 forces a width for
 * every row length (tuning). */
static int mv1_tpr(int64_t n_cols)
{
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("LMS_CUDA_MV1_TPR");
        env = e ? atoi(e) : 0;
    }
    if (env == 32 || env == 64 || env == 128)
        return env;
    const int64_t units = n_cols / 64;
    return units >= 64 && units <= 96 ? 32 : 0;
}

/* Which launches take the unit kernels: LMS_CUDA_MV1=1 (default) those whose
 * matrices are all Q4_K, 2 any types (Q6_K units measured slower), 0 none. */
static bool mv1_types(const lcu_mat *const *w, int n_mat)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LMS_CUDA_MV1");
        v = e ? atoi(e) : 1;
    }
    if (v == 0)
        return false;
    for (int m = 0; m < n_mat; m++)
        if (v == 1 && w[m]->type != LMS_TYPE_Q4_K)
            return false;
    return true;
}

template <int TY>
static void mv1_go_t(lcu *g, bool glu, int tpr, const mv_args &a, unsigned nb)
{
    const dim3 th(MMVQ_THREADS);
    if (glu)
        switch (tpr) {
        case 32: lcu_go(g, mv1_glu_k<32, TY>, dim3(nb), th, a); break;
        case 64: lcu_go(g, mv1_glu_k<64, TY>, dim3(nb), th, a); break;
        default: lcu_go(g, mv1_glu_k<128, TY>, dim3(nb), th, a); break;
        }
    else
        switch (tpr) {
        case 32: lcu_go(g, mv1_k<32, TY>, dim3(nb), th, a); break;
        case 64: lcu_go(g, mv1_k<64, TY>, dim3(nb), th, a); break;
        default: lcu_go(g, mv1_k<128, TY>, dim3(nb), th, a); break;
        }
}

static void mv1_go(lcu *g, bool glu, int tpr, const mv_args &a, int64_t rows)
{
    const unsigned nb = (unsigned)lcu_cdiv(rows, MMVQ_THREADS / tpr);
    int ty = a.type[0];
    for (int m = 1; m < 3; m++)
        if (a.blk0[m] != INT_MAX && a.type[m] != ty)
            ty = -1;
    if (ty == LMS_TYPE_Q4_K)
        mv1_go_t<LMS_TYPE_Q4_K>(g, glu, tpr, a, nb);
    else if (ty == LMS_TYPE_Q6_K)
        mv1_go_t<LMS_TYPE_Q6_K>(g, glu, tpr, a, nb);
    else
        mv1_go_t<-1>(g, glu, tpr, a, nb);
}

static void mv_launch(lcu *g, int n_mat, const lcu_mat *const *w, const void *xq, int64_t n_tok,
                      float *const *y, bool acc)
{
    const int tpr = n_tok == 1 && mv1_types(w, n_mat) ? mv1_tpr(w[0]->n_cols) : 0;
    if (tpr) {
        mv_args a;
        const int rows = mv_args_set(a, n_mat, w, xq, 1, y, acc, 1);
        mv1_go(g, false, tpr, a, rows);
        return;
    }
    const bool wk = use_warp(g, n_tok);
    mv_args a;
    const int blocks = mv_args_set(a, n_mat, w, xq, n_tok, y, acc, wk ? 1 : (n_tok <= 2 ? 2 : 4));
    if (wk) {
        const unsigned nb = (unsigned)lcu_cdiv(blocks, MMVQ_WARPS);
        if (n_tok == 1)
            launch_mw<1>(g, false, a, nb);
        else
            launch_mw<2>(g, false, a, nb);
        return;
    }
    switch (n_tok) {
    case 1: launch_mv<1>(g, a, blocks); break;
    case 2: launch_mv<2>(g, a, blocks); break;
    case 3: launch_mv<3>(g, a, blocks); break;
    case 4: launch_mv<4>(g, a, blocks); break;
    case 5: launch_mv<5>(g, a, blocks); break;
    case 6: launch_mv<6>(g, a, blocks); break;
    case 7: launch_mv<7>(g, a, blocks); break;
    default: launch_mv<8>(g, a, blocks); break;
    }
}

extern "C" int lcu_qkv_rope(lcu *g, const lcu_mat *const *w, const void *xq, float *q,
                            const lcu_batch *b, const lcu_attn_shape *s, uint16_t *kc,
                            uint16_t *vc)
{
    if (!xq || b->n_tok != 1 || s->rope_neox || s->n_rot <= 0 || s->n_rot % 2 ||
        s->n_rot > s->head_dim || s->head_dim % 2 || use_warp(g, 1) || mmq_ok(g, w[0], 1))
        return 1;
    for (int m = 0; m < 3; m++)
        if (!q8_ok(g, w[m], 1) || w[m]->n_cols != w[0]->n_cols || w[m]->n_rows % 2)
            return 1;
    const int tpr = mv1_types(w, 3) ? mv1_tpr(w[0]->n_cols) : 0;
    if (tpr == MMVQ_THREADS) /* a row a block: its RoPE partner is in another */
        return 1;
    float *y[3] = {q, NULL, NULL};
    mv_args a;
    /* mv1_k numbers rows across the matrices (Q's and K's counts are even,
     * so pairs stay aligned); mmvq_k starts each matrix at a block */
    const int n = mv_args_set(a, 3, w, xq, 1, y, false, tpr ? 1 : 2);
    a.rope = mv_rope{*b, *s, kc, vc, 1};
    if (tpr)
        mv1_go(g, false, tpr, a, n);
    else
        launch_mv<1>(g, a, n);
    return 0;
}

/* lcu_matmul's decode path for int8-capable types: quantize x into the
 * lcu's scratch, then the int8 kernel. Returns 1 when it did not apply. */
int lcu_matmul_q8_auto(lcu *g, const lcu_mat *w, const float *x, int64_t n_tok, float *y, bool acc)
{
    if (!q8_ok(g, w, n_tok) || !g->xq || n_tok * w->n_cols * 5 / 4 > (int64_t)g->xq_bytes)
        return 1;
    lcu_quantize_q8(g, x, g->xq, n_tok, w->n_cols);
    if (mmq_ok(g, w, n_tok))
        mmq_launch(g, 1, &w, g->xq, n_tok, &y, acc);
    else
        mv_launch(g, 1, &w, g->xq, n_tok, &y, acc);
    return 0;
}

extern "C" int lcu_matmul_q8(lcu *g, int n_mat, const lcu_mat *const *w, const float *x,
                             const void *xq, int64_t n_tok, float *const *y, bool accumulate)
{
    if (xq != NULL && n_mat >= 1 && n_mat <= 3 && mmq_ok(g, w[0], n_tok)) {
        /* the tensor-core kernel takes the matrices of w[0]'s type and width
         * in one launch; the others go on as a smaller group */
        const lcu_mat *wm[3], *wr[3];
        float *ym[3], *yr[3];
        int nm = 0, nrest = 0;
        for (int m = 0; m < n_mat; m++) {
            if (mmq_ok(g, w[m], n_tok) && w[m]->n_cols == w[0]->n_cols &&
                w[m]->type == w[0]->type)
                wm[nm] = w[m], ym[nm++] = y[m];
            else
                wr[nrest] = w[m], yr[nrest++] = y[m];
        }
        mmq_launch(g, nm, wm, xq, n_tok, ym, accumulate);
        return nrest > 0 ? lcu_matmul_q8(g, nrest, wr, x, xq, n_tok, yr, accumulate) : 0;
    }
    bool all = xq != NULL && n_mat >= 1 && n_mat <= 3;
    for (int m = 0; all && m < n_mat; m++)
        all = q8_ok(g, w[m], n_tok) && w[m]->n_cols == w[0]->n_cols;
    if (all) {
        mv_launch(g, n_mat, w, xq, n_tok, y, accumulate);
        return 0;
    }
    /* the products share x: its f16 copy is made once (gemm) */
    int rc = 0;
    g->x16_keep = true;
    g->x16_kind = 0;
    for (int m = 0; m < n_mat; m++) {
        if (xq && q8_ok(g, w[m], n_tok))
            mv_launch(g, 1, &w[m], xq, n_tok, &y[m], accumulate);
        else
            rc |= lcu_matmul(g, w[m], x, n_tok, y[m], accumulate);
    }
    g->x16_keep = false;
    return rc;
}

extern "C" int lcu_ffn_gate_up(lcu *g, const lcu_mat *wg, const lcu_mat *wu, const float *x,
                               const void *xq, int64_t n_tok, float *h, float *up, void *hq)
{
    const int64_t f = wg->n_rows;
    const lcu_mat *ws[2] = {wg, wu};
    float *ys[2] = {h, up};
    if (xq && q8_ok(g, wg, n_tok) && q8_ok(g, wu, n_tok) && wg->type == wu->type &&
        wg->n_cols == wu->n_cols && wg->n_rows == wu->n_rows) {
        /* the glu kernels read w[0..1], rb[0..1], nr[0], type[0] and write y[0] = h */
        mv_args a;
        mv_args_set(a, 2, ws, xq, n_tok, ys, false, 1);
        const int rh = n_tok <= 2 ? 1 : 2, blocks = (int)lcu_cdiv(f, rh);
        const int tpr = n_tok == 1 && mv1_types(ws, 2) ? mv1_tpr(wg->n_cols) : 0;
        if (mmq_ok(g, wg, n_tok) && mmq_ok(g, wu, n_tok)) {
            mmq_perm_args(g, a, xq, n_tok, wg->n_cols);
            mmq_run(g, true, wg->type, a, (unsigned)lcu_cdiv(f, MMQ_ROWS), (int)n_tok);
        } else if (tpr) {
            mv1_go(g, true, tpr, a, f);
        } else if (use_warp(g, n_tok)) {
            const unsigned nb = (unsigned)lcu_cdiv(f, MMVQ_WARPS);
            if (n_tok == 1)
                launch_mw<1>(g, true, a, nb);
            else
                launch_mw<2>(g, true, a, nb);
        } else
            switch (n_tok) {
            case 1: launch_glu<1>(g, a, blocks); break;
            case 2: launch_glu<2>(g, a, blocks); break;
            case 3: launch_glu<3>(g, a, blocks); break;
            case 4: launch_glu<4>(g, a, blocks); break;
            case 5: launch_glu<5>(g, a, blocks); break;
            case 6: launch_glu<6>(g, a, blocks); break;
            case 7: launch_glu<7>(g, a, blocks); break;
            default: launch_glu<8>(g, a, blocks); break;
            }
    } else {
        int rc = lcu_matmul_q8(g, 2, ws, x, xq, n_tok, ys, false);
        if (rc)
            return rc;
        lcu_swiglu(g, h, up, n_tok * f);
    }
    if (hq && f % 32 == 0)
        lcu_quantize_q8(g, h, hq, n_tok, f);
    return 0;
}
