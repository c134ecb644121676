/*
 * cu_int.cuh - internal to the CUDA backend: the lcu object, error checks
 * and small device helpers shared by the .cu files.
 */
#ifndef LMS_CU_INT_CUH
#define LMS_CU_INT_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cu_mmvq.cuh"
#include "kernels/cuda/cuda_backend.h"

#define LCU_GRAPH_SLOTS LCU_GRAPH_MAX
#define LCU_STAGE_SLOTS 4

struct lcu {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    size_t allocated;        /* bytes of device memory held through lcu_alloc */
    /* scratch, sized by lcu_reserve */
    __half *w16;             /* dequantized weight tile */
    size_t w16_bytes;
    __half *x16;             /* activations converted to f16 */
    size_t x16_bytes;
    bool x16_keep;           /* lcu_matmul_q8's products of one input run: x16 may be reused */
    int x16_kind;            /* then: that input is in x16 as f16 (1) or bf16 (2), 0 not yet */
    void *blas_ws;           /* cuBLAS workspace (so it never allocates) */
    size_t blas_ws_bytes;
    float *attn_part;        /* [n_tok][n_head][max_split][head_dim + 2], then attn_cnt */
    size_t attn_part_bytes;
    int *attn_cnt;           /* [LCU_MATVEC_MAX][n_head]: splits done per (token, KV head) of
                                attn_dec_k, back to 0 after each launch */
    int att_dec;             /* attn_dec_k for decode attention (LMS_CUDA_ATTN_DEC=0: off) */
    int64_t max_tok;
    int mv_rows;             /* rows per warp of the decode kernels; 0 = by size
                                (LMS_CUDA_MV_ROWS=1|2|4 forces one, for tuning) */
    int q8;                  /* int8 decode kernels on (LMS_CUDA_MMVQ=0 turns them off) */
    int mv_warp;             /* LMS_CUDA_MV_WARP=1: warp-per-row int8 kernels for 1-2 tokens
                                (measured slower on H200: 234 vs 250 t/s tg128) */
    int mma;                 /* tensor-core int8 kernels for Q4_K/Q6_K batches of at least this
                                many tokens (up to 8); 0 = off. Default 3 on cc >= 8.0;
                                LMS_CUDA_MMA=N sets it (0 = off) */
    int mma_warps;           /* warps per 16-row block of those kernels: 8, or 4 / 16
                                (LMS_CUDA_MMA_WARPS; H100 B=8 step 4 warps 5.05, 8 4.87 ms) */
    int pdl;                 /* programmatic dependent launch usable: cc >= 9.0 and not
                                LMS_CUDA_PDL=0 */
    int mmq_perm;            /* producers write the lane-ordered q8 copy (LMS_CUDA_MMQ_PERM) */
    int fa;                  /* tensor-core attention for prompt batches: cc >= 8.0 and not
                                LMS_CUDA_FA=0 */
    bool pdl_on;             /* launches carry the PDL attribute now (lcu_pdl) */
    void *xq;                /* q8 activations of lcu_matmul's decode path */
    size_t xq_bytes;
    /* weight staging (lcu_stage): slots, a copy stream, per-slot events */
    cudaStream_t copy;
    void *stage[LCU_STAGE_SLOTS];
    cudaEvent_t staged[LCU_STAGE_SLOTS], freed[LCU_STAGE_SLOTS];
    size_t stage_slot_bytes;
    int n_stage, stage_next;
    cudaGraph_t graph[LCU_GRAPH_SLOTS];
    cudaGraphExec_t exec[LCU_GRAPH_SLOTS];
};

/* cu_mmvq.cu: lcu_matmul's int8 path (quantizes x into g->xq); 1 if it
 * does not apply to this product. */
int lcu_matmul_q8_auto(lcu *g, const lcu_mat *w, const float *x, int64_t n_tok, float *y, bool acc);

/* Programmatic dependent launch (sm_90+). Every kernel starts with
 * pdl_trigger(), which lets the next kernel in the stream be scheduled as
 * soon as all of this grid's blocks run, and pdl_wait() before it reads
 * anything an earlier kernel wrote (or writes anything an earlier kernel
 * reads): that waits until the previous grid has finished and its writes
 * are visible. So the next kernel's launch, block setup and constant
 * weight loads overlap the tail of the previous one. Waits chain: each
 * grid finishes only after its own wait, so a kernel that waited has every
 * earlier kernel behind it. Without the launch attribute (older cards,
 * prompt batches, LMS_CUDA_PDL=0) both are no-ops. */
__device__ __forceinline__ void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Every kernel of the backend is launched through this: with g->pdl_on
 * it carries the programmatic-serialization attribute. */
template <typename... P, typename... A>
static inline void lcu_go_smem(lcu *g, void (*k)(P...), dim3 grid, dim3 block, size_t smem,
                               A... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = g->stream;
    cudaLaunchAttribute at[1];
    if (g->pdl_on) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
    }
    cudaLaunchKernelEx(&cfg, k, args...);
}

template <typename... P, typename... A>
static inline void lcu_go(lcu *g, void (*k)(P...), dim3 grid, dim3 block, A... args)
{
    lcu_go_smem(g, k, grid, block, 0, args...);
}

/* Launch check: a launch error is remembered by the runtime and reported
 * at the next lcu_sync, so kernels need no error path of their own. */
static inline int64_t lcu_cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Threads of a one-block-per-row reduction over n values: about four
 * values a thread, a multiple of 32, at most 1024 (the single block of a
 * decode row is latency-bound: wide blocks cut its serial loop). */
static inline unsigned lcu_rows_threads(int64_t n)
{
    int64_t t = (n / 4 + 31) / 32 * 32;
    return (unsigned)(t < 64 ? 64 : (t > 1024 ? 1024 : t));
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The tensor-core kernels' copy of a batch of up to 8 tokens' q8 values,
 * ordered by the lane that loads them, so that a warp reads each
 * super-block's activations as four 512-byte runs of one 128-bit load per
 * lane (the row layout took eight or sixteen loads of 4-8 bytes from eight
 * rows per super-block: with the weights' loads it kept the L1 busy while
 * DRAM idled). Lane (g, t) serves token g; per super-block sb:
 *   p4 (Q4_K's order): [sb][i < 4][lane][16 bytes] = the token's bytes
 *       32s + 8t .. + 8 of sub-blocks s = 2i, 2i + 1;
 *   p6 (Q6_K's order): [sb][i < 4][lane][4 words], word w = 4i + j < 16 =
 *       the token's bytes 128n + 32gq + 16h + 4t .. + 4 with w = 8n + 4h + gq;
 *   pe: [sb][c < 8][t < 4][2 float2]: the scales (d, d * sum) of sub-blocks
 *       2(c % 4), 2(c % 4) + 1 of token 2t + c / 4.
 * Token slots past the batch hold stale (or never written) values: their
 * columns are dropped. The positions are mq::perm4_at, perm6_at and
 * perme_at (cu_mmvq.cuh), shared with the host check. */
struct q8_perm {
    int8_t *p4, *p6;
    float2 *pe;
    int64_t n; /* values per token row */
};

/* Value v at index flat of a q8 buffer (see cu_mmvq.cuh) of rows of pm.n
 * values, quantized with its 32-value block: each warp holds one block,
 * lane i its value i; into the lane-ordered copy too where pm has one. */
__device__ __forceinline__ void quant_lane(float v, int8_t *qs, float2 *ds, int64_t flat,
                                           const q8_perm &pm)
{
    const float am = warp_max(fabsf(v));
    const float d = am / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    const int q = __float2int_rn(v * id);
    const float s = warp_sum((float)q);
    qs[flat] = (int8_t)q;
    if ((threadIdx.x & 31) == 0)
        ds[flat >> 5] = make_float2(d, d * s);
    if (pm.p4) {
        const int64_t u = flat / pm.n, k = flat % pm.n;
        pm.p4[mq::perm4_at(u, k)] = (int8_t)q;
        pm.p6[mq::perm6_at(u, k)] = (int8_t)q;
        if ((threadIdx.x & 31) == 0)
            pm.pe[mq::perme_at(u, k)] = make_float2(d, d * s);
    }
}

/* RoPE of pair i (elements 2i, 2i+1, or i, i + n_rot/2 for NeoX) at
 * position pos: its cosine and sine (times LongRoPE's attention factor, 1
 * for other models: exact), as forward.c computes them. Shared by
 * qkv_post_k and the Q/K/V products' fused epilogue so that both rotate
 * alike. */
__device__ __forceinline__ void rope_cs(const lcu_attn_shape &s, int32_t pos, int i, float *c,
                                        float *sn)
{
    const float theta_scale = powf(s.rope_base, -2.0f / (float)s.n_rot);
    const float ff = s.freq_factors ? s.freq_factors[i] : 1.0f;
    const float theta = (float)pos * powf(theta_scale, (float)i);
    const float a = s.rope_freq_scale * (theta / ff);
    *c = cosf(a) * s.rope_mscale;
    *sn = sinf(a) * s.rope_mscale;
}

/* The pair (x0, x1) rotated by the angle of cosine c and sine sn, each
 * product rounded on its own (no contraction into an FMA, which the
 * compiler might do differently in each kernel): the same bits in
 * qkv_post_k and in the products' fused epilogue. */
__device__ __forceinline__ float rope_x0(float x0, float x1, float c, float sn)
{
    return __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
}

__device__ __forceinline__ float rope_x1(float x0, float x1, float c, float sn)
{
    return __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
}

/* The cache row (n_head_kv * head_dim values) of token t of b. */
__device__ __forceinline__ size_t kv_cell(const lcu_batch &b, const lcu_attn_shape &s, int t)
{
    const int32_t pos = b.pos[t];
    const int32_t blk = b.tbl[b.tbl_off[t] + pos / 16];
    return ((size_t)blk * 16 + (size_t)(pos % 16)) * (size_t)(s.n_head_kv * s.head_dim);
}

/* cu_mmvq.cu: the lane-ordered copy's place in a q8 buffer xq of n_tok
 * rows of n values, or none (p4 NULL): batches the tensor-core kernels do
 * not take (fewer than g->mma tokens or more than LCU_MATVEC_MAX), rows not
 * of whole super-blocks, or LMS_CUDA_MMQ_PERM=0. */
q8_perm lcu_q8_perm(const lcu *g, void *xq, int64_t n_tok, int64_t n);

#endif
