/*
 * cu_lora.cu - LoRA deltas on the GPU: y[rows[i]] += s_i * factor * B (A x[rows[i]])
 * for the m rows of one adapter group (see forward.c's LoRA section, which
 * this follows step for step so that GPU and CPU agree):
 *
 *   1. xr[i] = x[rows[i]] rounded through A's companion type (lora_round)
 *   2. t[i][r] = A[r] . xr[i]           one block per (r, i), f32
 *   3. t[i] rounded through B's companion type
 *   4. y[rows[i]][o] += (s_i * factor) * sum_r t[i][r] * bt[r][o]
 *                                        one thread per output, r in order
 *
 * Only batches that carry adapters run these (forward_cuda.c runs such
 * steps eagerly, never in a captured graph). Kernels follow the backend's
 * launch protocol (lcu_go, pdl_trigger / pdl_wait).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cu_int.cuh"
#include "kernels/cuda/cuda_backend.h"

#define LORA_THREADS 256

/* v rounded to nearest even integer, clamped as the CPU's q8 quantizer. */
__device__ __forceinline__ float q8_round(float v)
{
    if (!(v > -128.0f))
        return -128.0f;
    if (!(v < 127.0f))
        return 127.0f;
    return rintf(v);
}

/* out[i] = round_vt(x[rows ? rows[i] : i]) for rows of n values; a block a row.
 * Q8_0 rounds 32-value blocks: amax / 127 as f16 times the rounded
 * integers (n % 32 == 0, as the CPU asserts). In place allowed. */
__global__ void lora_round_k(const float *x, const int32_t *rows, int64_t n, int vt, float *out)
{
    pdl_trigger();
    pdl_wait();
    const int32_t i = blockIdx.x;
    const float *xi = x + (size_t)(rows ? rows[i] : i) * (size_t)n;
    float *oi = out + (size_t)i * (size_t)n;
    if (vt == LCU_LORA_Q8_0) {
        for (int64_t b = threadIdx.x; b < n / 32; b += blockDim.x) {
            const float *xb = xi + b * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(xb[j]));
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            const float d = __half2float(__float2half_rn(amax / 127.0f));
            for (int j = 0; j < 32; j++)
                oi[b * 32 + j] = q8_round(xb[j] * id) * d;
        }
        return;
    }
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        const float v = xi[k];
        float r = v;
        if (vt == LCU_LORA_F16)
            r = __half2float(__float2half_rn(v));
        else if (vt == LCU_LORA_BF16)
            r = isnan(v) ? v : __bfloat162float(__float2bfloat16_rn(v));
        oi[k] = r;
    }
}

/* t[i][r] = A[r] . xr[i]; grid (rank, m). */
__global__ void lora_down_k(const float *a, int64_t n_in, const float *xr, int32_t rank, float *t)
{
    pdl_trigger();
    pdl_wait();
    const int32_t r = blockIdx.x, i = blockIdx.y;
    const float *ar = a + (size_t)r * (size_t)n_in, *xi = xr + (size_t)i * (size_t)n_in;
    float sum = 0.0f;
    for (int64_t k = threadIdx.x; k < n_in; k += blockDim.x)
        sum += ar[k] * xi[k];
    __shared__ float part[LORA_THREADS / 32];
    sum = warp_sum(sum);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < LORA_THREADS / 32; w++)
            s += part[w];
        t[(size_t)i * rank + r] = s;
    }
}

/* y[rows[i]][o] += (scales[i] * factor) * sum_r t[i][r] * bt[r][o]; grid
 * (outputs / threads, m). */
__global__ void lora_up_k(const float *bt, int32_t rank, int64_t n_out, const float *t,
                          const int32_t *rows, const float *scales, float factor, float *y)
{
    pdl_trigger();
    pdl_wait();
    const int32_t i = blockIdx.y;
    const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= n_out)
        return;
    const float *ti = t + (size_t)i * rank;
    float d = 0.0f;
    for (int32_t r = 0; r < rank; r++)
        d += ti[r] * bt[(size_t)r * (size_t)n_out + o];
    y[(size_t)rows[i] * (size_t)n_out + o] += scales[i] * factor * d;
}

extern "C" void lcu_lora_apply(lcu *g, const lcu_lora_pair *p, const float *x, float *y,
                               const int32_t *rows, const float *scales, int32_t m, float *xr,
                               float *t)
{
    if (m <= 0 || p->rank <= 0)
        return;
    lcu_go(g, lora_round_k, dim3((unsigned)m), dim3(LORA_THREADS), x, rows, p->n_in, p->a_vt, xr);
    lcu_go(g, lora_down_k, dim3((unsigned)p->rank, (unsigned)m), dim3(LORA_THREADS), p->a,
           p->n_in, (const float *)xr, p->rank, t);
    if (p->b_vt != LCU_LORA_F32)
        lcu_go(g, lora_round_k, dim3((unsigned)m), dim3(LORA_THREADS), (const float *)t,
               (const int32_t *)NULL, (int64_t)p->rank, p->b_vt, t);
    lcu_go(g, lora_up_k, dim3((unsigned)lcu_cdiv(p->n_out, LORA_THREADS), (unsigned)m),
           dim3(LORA_THREADS), p->bt, p->rank, p->n_out, (const float *)t, rows, scales, p->factor,
           y);
}
