/*
 * cu_matmul.cu - y = W·x on the device for every weight type.
 *
 *   n_tok <= LCU_MATVEC_MAX   matvec_k: each warp owns R rows; every lane
 *                             takes 32-element units (cu_quant.cuh) in turn,
 *                             dequantizes the unit of its R rows into
 *                             registers once and uses it for all NT tokens;
 *                             the row sums are reduced across the warp.
 *                             The weight bytes are read exactly once, and
 *                             each activation load serves R rows.
 *   larger batches            tiles of W dequantized to f16, activations
 *                             converted to f16, product on the tensor cores
 *                             through cuBLAS with f32 accumulation (F32
 *                             weights: plain SGEMM; F16: no dequantization).
 *
 * Rows whose length is not a multiple of 32 (only plain types allow it,
 * e.g. stories260K's 172-wide FFN) take matvec_plain_k, one element at a
 * time.
 */
#include "kernels/cuda/cu_int.cuh"
#include "kernels/cuda/cu_quant.cuh"

#define MV_WARPS 4

template <int T, int NT, int R>
__global__ void __launch_bounds__(32 * MV_WARPS)
    matvec_k(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_rows, int64_t n_units,
             const float *__restrict__ x, int64_t ldx, float *__restrict__ y, int accumulate)
{
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t r0 = ((int64_t)blockIdx.x * MV_WARPS + warp) * R;
    if (r0 >= n_rows)
        return;
    const uint8_t *rows[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        rows[r] = W + (size_t)(r0 + r < n_rows ? r0 + r : n_rows - 1) * row_bytes;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;
    for (int64_t u = lane; u < n_units; u += 32) {
        float w[R][32];
#pragma unroll
        for (int r = 0; r < R; r++)
            deq_unit<T>(rows[r], u, w[r]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xp = (const float4 *)(x + t * ldx + u * 32);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 xv = __ldg(xp + i);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float a = acc[r][t];
                    a = fmaf(w[r][4 * i], xv.x, a);
                    a = fmaf(w[r][4 * i + 1], xv.y, a);
                    a = fmaf(w[r][4 * i + 2], xv.z, a);
                    a = fmaf(w[r][4 * i + 3], xv.w, a);
                    acc[r][t] = a;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[r][t]);
            if (lane == 0 && r0 + r < n_rows) {
                float *dst = y + t * n_rows + r0 + r;
                *dst = accumulate ? *dst + v : v;
            }
        }
}

template <int T> __device__ __forceinline__ float plain_elem(const uint8_t *row, int64_t c)
{
    if (T == LMS_TYPE_F32)
        return __ldg((const float *)row + c);
    if (T == LMS_TYPE_F16)
        return h2f(__ldg((const uint16_t *)row + c));
    return bf2f(__ldg((const uint16_t *)row + c));
}

/* One warp per row, any row length; plain types only. */
template <int T>
__global__ void matvec_plain_k(const uint8_t *__restrict__ W, size_t row_bytes, int64_t n_rows,
                               int64_t n_cols, int64_t n_tok, const float *__restrict__ x,
                               float *__restrict__ y, int accumulate)
{
    pdl_trigger();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    if (r >= n_rows)
        return;
    const uint8_t *row = W + (size_t)r * row_bytes;
    for (int64_t t = 0; t < n_tok; t++) {
        float a = 0.0f;
        for (int64_t c = lane; c < n_cols; c += 32)
            a = fmaf(plain_elem<T>(row, c), x[t * n_cols + c], a);
        a = warp_sum(a);
        if (lane == 0) {
            float *dst = y + t * n_rows + r;
            *dst = accumulate ? *dst + a : a;
        }
    }
}

/* Rows [r0, r0 + nr) of W to f16 [nr][n_cols]; one thread per unit. */
template <int T>
__global__ void dequant_f16_k(const uint8_t *__restrict__ W, size_t row_bytes, int64_t r0,
                              int64_t nr, int64_t n_units, __half *__restrict__ out)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nr * n_units)
        return;
    const int64_t r = i / n_units, u = i % n_units;
    float w[32];
    deq_unit<T>(W + (size_t)(r0 + r) * row_bytes, u, w);
    uint4 *dst = (uint4 *)(out + r * n_units * 32 + u * 32);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        __half2 h[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            h[j] = __floats2half2_rn(w[8 * k + 2 * j], w[8 * k + 2 * j + 1]);
        dst[k] = *(uint4 *)h;
    }
}

/* Four values a thread (n % 4 == 0, 16-byte aligned x). */
__global__ void to_f16_k(const float *__restrict__ x, __half *__restrict__ out, int64_t n)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i < n) {
        const float4 v = *(const float4 *)(x + i);
        __half2 h[2] = {__floats2half2_rn(v.x, v.y), __floats2half2_rn(v.z, v.w)};
        *(uint2 *)(out + i) = *(uint2 *)h;
    }
}

__global__ void to_f16_1_k(const float *__restrict__ x, __half *__restrict__ out, int64_t n)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = __float2half_rn(x[i]);
}

__global__ void to_bf16_k(const float *__restrict__ x, __nv_bfloat16 *__restrict__ out, int64_t n)
{
    pdl_trigger();
    pdl_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = __float2bfloat16_rn(x[i]);
}

/* ---- dispatch ------------------------------------------------------------------ */

template <int T, int NT>
static void launch_mv(lcu *g, const lcu_mat *w, const float *x, float *y, bool acc)
{
    const int64_t n_units = w->n_cols / 32;
    const int rows = g->mv_rows ? g->mv_rows : (w->n_rows >= 4096 ? 4 : 2);
    if (NT <= 2 && rows == 4) {
        const int R = 4;
        dim3 grid((unsigned)lcu_cdiv(w->n_rows, (int64_t)MV_WARPS * R));
        lcu_go(g, matvec_k<T, NT, R>, dim3(grid), dim3(32 * MV_WARPS), (const uint8_t *)w->data,
               w->row_bytes, w->n_rows, n_units, x, w->n_cols, y, acc);
    } else if (NT <= 2 && rows == 1) {
        const int R = 1;
        dim3 grid((unsigned)lcu_cdiv(w->n_rows, (int64_t)MV_WARPS * R));
        lcu_go(g, matvec_k<T, NT, R>, dim3(grid), dim3(32 * MV_WARPS), (const uint8_t *)w->data,
               w->row_bytes, w->n_rows, n_units, x, w->n_cols, y, acc);
    } else {
        const int R = 2;
        dim3 grid((unsigned)lcu_cdiv(w->n_rows, (int64_t)MV_WARPS * R));
        lcu_go(g, matvec_k<T, NT, R>, dim3(grid), dim3(32 * MV_WARPS), (const uint8_t *)w->data,
               w->row_bytes, w->n_rows, n_units, x, w->n_cols, y, acc);
    }
}

template <int T>
static void matvec_type(lcu *g, const lcu_mat *w, const float *x, int64_t n_tok, float *y, bool acc)
{
    if (w->n_cols % 32 != 0) {
        if (T == LMS_TYPE_F32 || T == LMS_TYPE_F16 || T == LMS_TYPE_BF16) {
            dim3 grid((unsigned)lcu_cdiv(w->n_rows, MV_WARPS));
            lcu_go(g, matvec_plain_k<T>, dim3(grid), dim3(32 * MV_WARPS), (const uint8_t *)w->data,
                   w->row_bytes, w->n_rows, w->n_cols, n_tok, x, y, acc);
        }
        return;
    }
    switch (n_tok) {
    case 1: launch_mv<T, 1>(g, w, x, y, acc); break;
    case 2: launch_mv<T, 2>(g, w, x, y, acc); break;
    case 3: launch_mv<T, 3>(g, w, x, y, acc); break;
    case 4: launch_mv<T, 4>(g, w, x, y, acc); break;
    case 5: launch_mv<T, 5>(g, w, x, y, acc); break;
    case 6: launch_mv<T, 6>(g, w, x, y, acc); break;
    case 7: launch_mv<T, 7>(g, w, x, y, acc); break;
    default: launch_mv<T, 8>(g, w, x, y, acc); break;
    }
}

template <int T>
static void dequant_tile(lcu *g, const lcu_mat *w, int64_t r0, int64_t nr)
{
    const int64_t n_units = w->n_cols / 32, n = nr * n_units;
    lcu_go(g, dequant_f16_k<T>, dim3((unsigned)lcu_cdiv(n, 256)), dim3(256),
           (const uint8_t *)w->data, w->row_bytes, r0, nr, n_units, g->w16);
}

static int gemm(lcu *g, const lcu_mat *w, const float *x, int64_t n_tok, float *y, bool acc)
{
    const int m = (int)w->n_rows, n = (int)n_tok, k = (int)w->n_cols;
    const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
    const int64_t nx = n_tok * w->n_cols;
    cublasStatus_t st;
    if (w->type == LMS_TYPE_F32) {
        st = cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, (const float *)w->data,
                         (int)(w->row_bytes / 4), x, k, &beta, y, m);
        return st == CUBLAS_STATUS_SUCCESS ? 0 : -9;
    }
    /* x in f16 (bf16 for bf16 weights) in g->x16, unless an earlier
     * product of the same lcu_matmul_q8 call converted it already */
    const int kind = w->type == LMS_TYPE_BF16 ? 2 : 1;
    const bool have = g->x16_keep && g->x16_kind == kind;
    g->x16_kind = kind;
    if (w->type == LMS_TYPE_BF16) {
        if (!have)
            lcu_go(g, to_bf16_k, dim3((unsigned)lcu_cdiv(nx, 256)), dim3(256), x,
                   (__nv_bfloat16 *)g->x16, nx);
        st = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w->data, CUDA_R_16BF,
                          (int)(w->row_bytes / 2), g->x16, CUDA_R_16BF, k, &beta, y, CUDA_R_32F, m,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        return st == CUBLAS_STATUS_SUCCESS ? 0 : -9;
    }
    if (!have && nx % 4 == 0 && (uintptr_t)x % 16 == 0)
        lcu_go(g, to_f16_k, dim3((unsigned)lcu_cdiv(nx / 4, 256)), dim3(256), x, g->x16, nx);
    else if (!have)
        lcu_go(g, to_f16_1_k, dim3((unsigned)lcu_cdiv(nx, 256)), dim3(256), x, g->x16, nx);
    if (w->type == LMS_TYPE_F16) {
        st = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w->data, CUDA_R_16F,
                          (int)(w->row_bytes / 2), g->x16, CUDA_R_16F, k, &beta, y, CUDA_R_32F, m,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        return st == CUBLAS_STATUS_SUCCESS ? 0 : -9;
    }
    int64_t tile = (int64_t)(g->w16_bytes / ((size_t)w->n_cols * 2));
    if (tile >= 64)
        tile = tile / 64 * 64;
    if (tile <= 0)
        return -9;
    for (int64_t r0 = 0; r0 < w->n_rows; r0 += tile) {
        int64_t nr = w->n_rows - r0 < tile ? w->n_rows - r0 : tile;
        switch (w->type) {
#define X(T)                                                                                       \
    case T:                                                                                        \
        dequant_tile<T>(g, w, r0, nr);                                                             \
        break;
            LCU_TYPES(X)
#undef X
        default:
            return -5;
        }
        st = cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nr, n, k, &one, g->w16, CUDA_R_16F,
                          k, g->x16, CUDA_R_16F, k, &beta, y + r0, CUDA_R_32F, m,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            return -9;
    }
    return 0;
}

extern "C" bool lcu_type_supported(int type)
{
    switch (type) {
#define X(T)                                                                                       \
    case T:                                                                                        \
        return true;
        LCU_TYPES(X)
#undef X
    default:
        return false;
    }
}

extern "C" int lcu_matmul(lcu *g, const lcu_mat *w, const float *x, int64_t n_tok, float *y,
                          bool accumulate)
{
    if (n_tok <= 0)
        return 0;
    if (n_tok > LCU_MATVEC_MAX) {
        if (n_tok > g->max_tok)
            return -2;
        return gemm(g, w, x, n_tok, y, accumulate);
    }
    if (lcu_matmul_q8_auto(g, w, x, n_tok, y, accumulate) == 0)
        return 0;
    switch (w->type) {
#define X(T)                                                                                       \
    case T:                                                                                        \
        matvec_type<T>(g, w, x, n_tok, y, accumulate);                                             \
        return 0;
        LCU_TYPES(X)
#undef X
    default:
        return -5;
    }
}
