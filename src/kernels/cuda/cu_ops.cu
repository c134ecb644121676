/*
 * cu_ops.cu - the element-wise and per-row kernels of a layer: RMSNorm,
 * bias and residual adds, SwiGLU, gemma's GeGLU, post-norms and logit
 * soft-capping, and the Q/K/V epilogue (per-head norms, RoPE, K/V written
 * to the paged f16 cache).
 *
 * Formulas are forward.c's (llama.cpp's): RMSNorm x * 1/sqrt(mean(x^2) +
 * eps) * w; RoPE angle pos * base^(-2i/n_rot) * freq_scale / factor[i],
 * pairs (2i, 2i+1) for "norm" and (i, i + n_rot/2) for "neox".
 */
#include "kernels/cuda/cu_int.cuh"

/* 1 / rms(xr) over n values, summed by the whole block (every thread
 * gets it). */
__device__ __forceinline__ float row_inv_rms(const float *__restrict__ xr, int64_t n, float eps)
{
    __shared__ float part[32];
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
    return 1.0f / sqrtf(part[0] / (float)n + eps);
}

__global__ void rms_norm_k(const float *__restrict__ x, const float *__restrict__ w,
                           float *__restrict__ out, int64_t n, float eps)
{
    pdl_trigger();
    pdl_wait();
    const float *xr = x + blockIdx.x * n;
    float *yr = out + blockIdx.x * n;
    const float scale = row_inv_rms(xr, n, eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}

extern "C" void lcu_rms_norm(lcu *g, const float *x, const float *w, float *out, int64_t n_rows,
                             int64_t n, float eps)
{
    if (n_rows > 0)
        lcu_go(g, rms_norm_k, dim3((unsigned)n_rows), dim3(lcu_rows_threads(n)), x, w, out, n, eps);
}

__global__ void add_bias_k(float *y, const float *b, int64_t n_tok, int64_t n)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_tok * n)
        y[i] += b[i % n];
}

extern "C" void lcu_add_bias(lcu *g, float *y, const float *b, int64_t n_tok, int64_t n)
{
    if (b && n_tok * n > 0)
        lcu_go(g, add_bias_k, dim3((unsigned)lcu_cdiv(n_tok * n, 256)), dim3(256), y, b, n_tok, n);
}

__global__ void add_k(float *x, const float *y, int64_t n)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += y[i];
}

extern "C" void lcu_add(lcu *g, float *x, const float *y, int64_t n)
{
    if (n > 0)
        lcu_go(g, add_k, dim3((unsigned)lcu_cdiv(n, 256)), dim3(256), x, y, n);
}

__global__ void swiglu_k(float *ga, const float *up, int64_t n)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float a = ga[i];
        ga[i] = a / (1.0f + expf(-a)) * up[i];
    }
}

extern "C" void lcu_swiglu(lcu *g, float *ga, const float *up, int64_t n)
{
    if (n > 0)
        lcu_go(g, swiglu_k, dim3((unsigned)lcu_cdiv(n, 256)), dim3(256), ga, up, n);
}

/* GELU (tanh form) as forward.c's gelu_tanh: the input rounded to f16,
 * the formula in float, the result rounded to f16; -10 and below give 0,
 * 10 and above the input. The products and sums are kept from fusing into
 * FMAs so that they round as the CPU's do. */
__device__ __forceinline__ float gelu_f16(float x)
{
    if (x <= -10.0f)
        return 0.0f;
    if (x >= 10.0f)
        return x;
    const float h = __half2float(__float2half_rn(x));
    const float in = __fmul_rn(__fmul_rn(0.79788456080286535588f, h),
                               __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, h), h)));
    const float gl = __fmul_rn(__fmul_rn(0.5f, h), __fadd_rn(1.0f, tanhf(in)));
    return __half2float(__float2half_rn(gl));
}

__global__ void geglu_k(float *ga, const float *up, int64_t n)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        ga[i] = gelu_f16(ga[i]) * up[i];
}

extern "C" void lcu_geglu(lcu *g, float *ga, const float *up, int64_t n)
{
    if (n > 0)
        lcu_go(g, geglu_k, dim3((unsigned)lcu_cdiv(n, 256)), dim3(256), ga, up, n);
}

/* One block per row: x += y / rms(y) * w. */
__global__ void norm_add_k(float *__restrict__ x, const float *__restrict__ y,
                           const float *__restrict__ w, int64_t n, float eps)
{
    pdl_trigger();
    pdl_wait();
    const float *yr = y + blockIdx.x * n;
    float *xr = x + blockIdx.x * n;
    const float scale = row_inv_rms(yr, n, eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        xr[i] += yr[i] * scale * w[i];
}

extern "C" void lcu_norm_add(lcu *g, float *x, const float *y, const float *w, int64_t n_rows,
                             int64_t n, float eps)
{
    if (n_rows > 0)
        lcu_go(g, norm_add_k, dim3((unsigned)n_rows), dim3(lcu_rows_threads(n)), x, y, w, n, eps);
}

/* x = tanh(x * (1 / cap)) * cap, forward.c's softcap (inv = 1 / cap). */
__global__ void softcap_k(float *x, int64_t n, float cap, float inv)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = tanhf(x[i] * inv) * cap;
}

extern "C" void lcu_softcap(lcu *g, float *x, int64_t n, float cap)
{
    if (n > 0)
        lcu_go(g, softcap_k, dim3((unsigned)lcu_cdiv(n, 256)), dim3(256), x, n, cap, 1.0f / cap);
}

/* ---- Q/K/V epilogue -------------------------------------------------------------- */

#define QKV_WARPS 4

/* Grid (token, head group): one warp per head of q, then k, then v (v is
 * only stored), QKV_WARPS heads per block, so a decode step spreads its
 * heads over many SMs instead of walking them in one block. The head is
 * staged in shared memory. */
__global__ void __launch_bounds__(32 * QKV_WARPS)
    qkv_post_k(lcu_batch b, lcu_attn_shape s, float *__restrict__ q, const float *__restrict__ k,
               const float *__restrict__ v, const float *__restrict__ q_norm,
               const float *__restrict__ k_norm, uint16_t *__restrict__ kc,
               uint16_t *__restrict__ vc)
{
    pdl_trigger();
    pdl_wait();
    __shared__ float sh[QKV_WARPS][LCU_HEAD_DIM_MAX];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hd = s.head_dim, kvd = s.n_head_kv * hd;
    const int32_t pos = b.pos[t];
    const size_t cell = kv_cell(b, s, t);
    float *buf = sh[warp];
    {
        const int h = blockIdx.y * QKV_WARPS + warp;
        if (h >= s.n_head + 2 * s.n_head_kv)
            return;
        const bool is_q = h < s.n_head, is_v = h >= s.n_head + s.n_head_kv;
        const int hk = is_q ? h : (is_v ? h - s.n_head - s.n_head_kv : h - s.n_head);
        const float *src = is_q ? q + ((size_t)t * s.n_head + h) * hd
                                : (is_v ? v : k) + (size_t)t * kvd + (size_t)hk * hd;
        if (is_v) {
            for (int d = lane; d < hd; d += 32)
                vc[cell + (size_t)hk * hd + d] = __half_as_ushort(__float2half_rn(src[d]));
            return;
        }
        for (int d = lane; d < hd; d += 32)
            buf[d] = src[d];
        const float *nw = is_q ? q_norm : k_norm;
        if (nw) {
            float ss = 0.0f;
            for (int d = lane; d < hd; d += 32)
                ss = fmaf(buf[d], buf[d], ss);
            ss = warp_sum(ss);
            const float sc = 1.0f / sqrtf(ss / (float)hd + s.rms_eps);
            for (int d = lane; d < hd; d += 32)
                buf[d] = buf[d] * sc * nw[d];
        }
        __syncwarp();
        for (int i = lane; i < s.n_rot / 2; i += 32) {
            float c, sn;
            rope_cs(s, pos, i, &c, &sn);
            const int ia = s.rope_neox ? i : 2 * i, ib = s.rope_neox ? i + s.n_rot / 2 : 2 * i + 1;
            const float x0 = buf[ia], x1 = buf[ib];
            buf[ia] = rope_x0(x0, x1, c, sn);
            buf[ib] = rope_x1(x0, x1, c, sn);
        }
        __syncwarp();
        if (is_q) {
            float *dst = q + ((size_t)t * s.n_head + h) * hd;
            for (int d = lane; d < hd; d += 32)
                dst[d] = buf[d];
        } else {
            for (int d = lane; d < hd; d += 32)
                kc[cell + (size_t)hk * hd + d] = __half_as_ushort(__float2half_rn(buf[d]));
        }
        __syncwarp();
    }
}

extern "C" void lcu_qkv_post(lcu *g, const lcu_batch *b, const lcu_attn_shape *s, float *q,
                             const float *k, const float *v, const float *q_norm,
                             const float *k_norm, uint16_t *kc, uint16_t *vc)
{
    const int heads = s->n_head + 2 * s->n_head_kv;
    dim3 grid((unsigned)b->n_tok, (unsigned)((heads + QKV_WARPS - 1) / QKV_WARPS));
    if (b->n_tok > 0)
        lcu_go(g, qkv_post_k, dim3(grid), dim3(32 * QKV_WARPS), *b, *s, q, k, v, q_norm, k_norm, kc,
               vc);
}
