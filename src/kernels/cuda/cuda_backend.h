/*
 * cuda_backend.h - the CUDA backend as a plain C API: device set-up and
 * errors, device and pinned memory, and the kernels one transformer layer
 * needs. No CUDA type appears here, so engine code in C includes it.
 *
 * Central idea: one `lcu` per execution context owns a CUDA stream, a
 * cuBLAS handle and every scratch buffer the kernels use; all of it is
 * allocated when the context is made (lcu_reserve), so a forward step
 * never allocates device memory and cannot run out of it. Every kernel
 * call below is asynchronous on that stream; lcu_sync waits and turns a
 * deferred device error into a message.
 *
 * Matrices follow the CPU convention (kernels/matmul.h): W is row-major
 * [n_rows][n_cols] in its GGUF type, x is [n_tok][n_cols] f32, y is
 * [n_tok][n_rows] f32. Products of up to LCU_MATVEC_MAX tokens run as
 * matrix-vector kernels that dequantize each weight once into registers
 * and use it for every token (decode); larger batches dequantize tiles of
 * W to f16 and multiply on the tensor cores through cuBLAS (prefill).
 *
 * Called by engine/forward_cuda.c only. Built when LMS_CUDA is ON.
 */
#ifndef LMS_CUDA_BACKEND_H
#define LMS_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LCU_MATVEC_MAX 8 /* batches up to this many tokens use matrix-vector kernels */
#define LCU_HEAD_DIM_MAX 256
#define LCU_GRAPH_MAX 64 /* graph slots */

typedef struct lcu lcu;

typedef struct lcu_info {
    char name[96];
    int cc_major, cc_minor;
    int n_sm;
    int driver_version;  /* CUDA version the driver supports, e.g. 13000 */
    int runtime_version; /* CUDA runtime we were built with */
    size_t free_bytes, total_bytes;
} lcu_info;

/* A weight matrix on the device (data is a device pointer). */
typedef struct lcu_mat {
    const void *data;
    int type; /* enum lms_type */
    int64_t n_cols, n_rows;
    size_t row_bytes;
} lcu_mat;

/* ---- device, errors, memory ------------------------------------------------- */

/* Opens device `device` (-1: the first). Errors name the cause: no device
 * or driver, a driver older than the runtime, out of memory. */
int lcu_create(int device, lcu **out, lcu_info *info, char *err, size_t errsz);
void lcu_destroy(lcu *g);
int lcu_mem_info(lcu *g, size_t *free_bytes, size_t *total_bytes);
/* Measured memory bandwidth of device `device` (-1: the first), GB/s: the
 * best of several device-to-device copies of a 512 MiB buffer, counting the
 * bytes read plus the bytes written (so comparable with a mat-vec's weight
 * reads). 0 when it cannot be measured (no device, too little free memory). */
double lcu_peak_gbs(int device);

/* Device memory; NULL with a message on failure. lcu_allocated() is the sum
 * of what this lcu holds (for the plan report). */
void *lcu_alloc(lcu *g, size_t bytes, char *err, size_t errsz);
void lcu_free(lcu *g, void *p, size_t bytes);
size_t lcu_allocated(const lcu *g);
/* Page-locked host memory for transfers (NULL on failure). */
void *lcu_host_alloc(size_t bytes);
void lcu_host_free(void *p);
/* Whether p lies in page-locked host memory (lcu_host_alloc's, or a
 * registered range): copies into it need no staging copy on the host. */
bool lcu_host_pinned(const void *p);

/* Page-locks an existing host range (rounded out to whole pages) so that
 * copies from it are asynchronous DMA; read_only for mapped weight files.
 * < 0 when the driver refuses (copies then still work, synchronously). */
int lcu_host_register(const void *p, size_t bytes, bool read_only);
void lcu_host_unregister(const void *p);

/* Copies on the stream (asynchronous when host memory is pinned). */
int lcu_upload(lcu *g, void *dst_dev, const void *src_host, size_t bytes);
int lcu_download(lcu *g, void *dst_host, const void *src_dev, size_t bytes);
/* Waits for the stream; < 0 with a message if any queued work failed. */
int lcu_sync(lcu *g, char *err, size_t errsz);

/* Scratch the kernels need for batches of up to n_tok tokens over the
 * given matrices (largest n_cols, n_rows), attention of n_tok queries
 * with `n_head` heads of `head_dim`; lcu_reserve allocates it. */
size_t lcu_scratch_bytes(int64_t max_cols, int64_t max_rows, int64_t n_tok, int n_head,
                         int head_dim);
int lcu_reserve(lcu *g, int64_t max_cols, int64_t max_rows, int64_t n_tok, int n_head,
                int head_dim, char *err, size_t errsz);

/* ---- weights streamed from host memory ---------------------------------------
 * A layer whose weights stay in host memory can still run a big batch's
 * products on the GPU: lcu_stage copies a matrix into the next of n_slots
 * device buffers on a second stream and makes the main stream wait for
 * that copy, so the copy of the next matrix overlaps the product of the
 * current one. lcu_stage_done(slot pointer) is called once the work that
 * reads the slot is queued; the slot is overwritten only after that work
 * has run. Slots are taken round-robin, so at most n_slots - 1 may be held
 * while staging another. */
int lcu_stage_reserve(lcu *g, size_t slot_bytes, int n_slots, char *err, size_t errsz);
/* Device pointer of the staged copy, NULL when it does not fit or fails. */
const void *lcu_stage(lcu *g, const void *host, size_t bytes);
void lcu_stage_done(lcu *g, const void *slot);

/* Whether the matrix kernels take this weight type. */
bool lcu_type_supported(int type);

/* ---- kernels (asynchronous on the lcu's stream) -------------------------------- */

/* y = W·x, or y += W·x when `accumulate`. */
int lcu_matmul(lcu *g, const lcu_mat *w, const float *x, int64_t n_tok, float *y, bool accumulate);

/* ---- int8 decode path ----------------------------------------------------------
 * For batches of up to LCU_MATVEC_MAX tokens, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K,
 * IQ4_NL and IQ4_XS weights are multiplied with int8 activations ("q8": per 32 values, int8
 * values and a float scale and sum; layout in cu_mmvq.cuh) by __dp4a
 * kernels, or for Q4_K/Q6_K batches of 3+ tokens on sm_80+ by tensor-core
 * (mma.sync int8) kernels, that read each weight byte once per step for all
 * tokens. The
 * functions below take an input both as f32 (x) and as q8 (xq): types
 * without int8 kernels, batches over LCU_MATVEC_MAX, xq == NULL or
 * LMS_CUDA_MMVQ=0 use x. lcu_matmul on its own quantizes x itself. */

/* Bytes of q8 for n_tok rows of n values (n % 32 == 0). */
size_t lcu_q8_bytes(int64_t n_tok, int64_t n);
bool lcu_q8_type(int type);
/* xq = q8 of x [n_tok][n]. */
void lcu_quantize_q8(lcu *g, const float *x, void *xq, int64_t n_tok, int64_t n);
/* lcu_rms_norm, also writing q8 of out to xq (skipped when xq is NULL). */
void lcu_rms_norm_q8(lcu *g, const float *x, const float *w, float *out, void *xq,
                     int64_t n_rows, int64_t n, float eps);
/* y[m] = W[m]·x (or +=) for n_mat <= 3 matrices with the same input, in
 * one launch where all take the int8 path. */
int lcu_matmul_q8(lcu *g, int n_mat, const lcu_mat *const *w, const float *x, const void *xq,
                  int64_t n_tok, float *const *y, bool accumulate);
/* h = silu(Wg·x) * (Wu·x) [n_tok][n_ff]; `up` is scratch of the same size
 * for the fallback path; hq (may be NULL) receives q8 of h. */
int lcu_ffn_gate_up(lcu *g, const lcu_mat *wg, const lcu_mat *wu, const float *x, const void *xq,
                    int64_t n_tok, float *h, float *up, void *hq);

/* out[r] = x[r] / rms(x[r]) * w (w may be NULL), n_rows rows of n. */
void lcu_rms_norm(lcu *g, const float *x, const float *w, float *out, int64_t n_rows, int64_t n,
                  float eps);
/* y[t][i] += b[i]. */
void lcu_add_bias(lcu *g, float *y, const float *b, int64_t n_tok, int64_t n);
/* x[i] += y[i]. */
void lcu_add(lcu *g, float *x, const float *y, int64_t n);
/* ga[i] = silu(ga[i]) * up[i]. */
void lcu_swiglu(lcu *g, float *ga, const float *up, int64_t n);
/* ga[i] = gelu(ga[i]) * up[i], GELU's tanh form with forward.c's f16
 * rounding of its input and result (gemma's GeGLU). */
void lcu_geglu(lcu *g, float *ga, const float *up, int64_t n);
/* x[r] += y[r] / rms(y[r]) * w for n_rows rows of n (gemma's post-attention
 * and post-FFN norms before the residual add). */
void lcu_norm_add(lcu *g, float *x, const float *y, const float *w, int64_t n_rows, int64_t n,
                  float eps);
/* x[i] = cap * tanh(x[i] / cap) (gemma2's final-logit soft-capping). */
void lcu_softcap(lcu *g, float *x, int64_t n, float cap);

/* Per-step batch description on the device: for token t its position and
 * the offset in `tbl` of its sequence's block table. */
typedef struct lcu_batch {
    int32_t n_tok;
    const int32_t *pos;     /* device [n_tok] */
    const int32_t *tbl_off; /* device [n_tok] */
    const int32_t *tbl;     /* device block ids */
} lcu_batch;

typedef struct lcu_attn_shape {
    int n_head, n_head_kv, head_dim;
    int n_rot, rope_neox;
    float rope_base, rope_freq_scale, rms_eps;
    const float *freq_factors; /* device [n_rot/2] or NULL */
    float rope_mscale;         /* cosines and sines times this: LongRoPE's attention
                                  factor (phi3 128k), else 1 */
    /* gemma's layers (all 0 for the others, whose kernels never read them) */
    float q_scale;   /* 0: scores scaled by 1/sqrt(head_dim); else by this */
    float softcap;   /* 0: none; else scores = softcap * tanh(scores / softcap) */
    int32_t n_swa;   /* 0: none; else a query at p sees positions (p - n_swa, p] */
} lcu_attn_shape;

/* Optional per-head RMSNorm of q and k (q_norm/k_norm device or NULL),
 * RoPE of q (in place) and k, and k, v stored as f16 into the paged cache
 * layer `kc`/`vc` ([n_blocks][16][n_head_kv*head_dim]). */
void lcu_qkv_post(lcu *g, const lcu_batch *b, const lcu_attn_shape *s, float *q, const float *k,
                  const float *v, const float *q_norm, const float *k_norm, uint16_t *kc,
                  uint16_t *vc);
/* The Q/K/V products of a one-token step fused with lcu_qkv_post's RoPE
 * and cache stores, for layers without Q/K norms, biases or adapters and
 * with pairwise (not NeoX) RoPE: w = {W_q, W_k, W_v} on q8 activations xq;
 * q gets the rotated queries, the cache layer kc/vc the token's K and V.
 * Returns 1, having done nothing, where it does not apply (the caller runs
 * the products and lcu_qkv_post), 0 when done. */
int lcu_qkv_rope(lcu *g, const lcu_mat *const *w, const void *xq, float *q, const lcu_batch *b,
                 const lcu_attn_shape *s, uint16_t *kc, uint16_t *vc);
/* out[t][h] = softmax(q·K / sqrt(hd)) V over positions [0, pos[t]] of the
 * token's sequence; the positions are split over `n_split` blocks per
 * head (flash-decoding) and merged. n_split <= lcu_attn_max_split().
 * outq (may be NULL) also receives q8 of out. A shape with q_scale,
 * softcap or n_swa set runs kernels built with those (scale by q_scale,
 * soft-capped scores, positions before the window skipped); one without
 * runs the kernels built without them. */
void lcu_attention(lcu *g, const lcu_batch *b, const lcu_attn_shape *s, const float *q,
                   const uint16_t *kc, const uint16_t *vc, float *out, int n_split, void *outq);
int lcu_attn_max_split(int64_t n_tok);
/* Whether decode batches (up to LCU_MATVEC_MAX tokens) of this shape take
 * the tiled kernel (attn_dec_k: head_dim 64 or 128, up to 8 query heads
 * per KV head, none of gemma's extras; LMS_CUDA_ATTN_DEC=0 turns it off). */
bool lcu_attn_dec_takes(const lcu *g, const lcu_attn_shape *s);

/* ---- LoRA adapters (cu_lora.cu) -------------------------------------------------- */

/* Rounding of a LoRA product's input (forward.c's lora_round): none, or
 * through f16, bf16 or q8_0 (32-value blocks; n_in / rank multiples of 32). */
enum { LCU_LORA_F32 = 0, LCU_LORA_F16, LCU_LORA_BF16, LCU_LORA_Q8_0 };

/* One adapted weight's pair in device memory (model/lora.h's lms_lora_pair). */
typedef struct lcu_lora_pair {
    const float *a;  /* [rank][n_in] */
    const float *bt; /* [rank][n_out] */
    int32_t rank;
    int64_t n_in, n_out;
    float factor;    /* alpha / rank */
    int a_vt, b_vt;  /* LCU_LORA_* */
} lcu_lora_pair;

/* y[rows[i]] += scales[i] * factor * B (A round(x[rows[i]])) for i < m
 * (rows distinct; x rows of n_in, y rows of n_out, all f32 on the device).
 * Scratch: xr [m][n_in], t [m][rank]. In f32, each output summed by one
 * thread in the CPU's order. */
void lcu_lora_apply(lcu *g, const lcu_lora_pair *p, const float *x, float *y, const int32_t *rows,
                    const float *scales, int32_t m, float *xr, float *t);

/* ---- CUDA graphs for repeated steps -------------------------------------------- */

/* Starts capturing the stream's work; lcu_graph_end instantiates it into
 * slot `slot` (0..LCU_GRAPH_MAX-1). lcu_graph_launch replays a slot. Returns < 0 if
 * capture is not possible (the caller then runs the kernels directly). */
int lcu_graph_begin(lcu *g);
int lcu_graph_end(lcu *g, int slot);
bool lcu_graph_ready(const lcu *g, int slot);
int lcu_graph_launch(lcu *g, int slot);

/* Programmatic dependent launch for the kernels launched from now on
 * (decode steps; a no-op before sm_90 or with LMS_CUDA_PDL=0). */
void lcu_pdl(lcu *g, bool on);

#ifdef __cplusplus
}
#endif

#endif
