/*
 * cu_device.cu - device selection, error messages, memory, copies, scratch
 * reservation and CUDA graphs of the CUDA backend (see cuda_backend.h).
 *
 * Errors from the runtime are turned into messages a user can act on:
 * no device or no driver, a driver older than the CUDA runtime we were
 * built with, out of device memory (with the size asked for).
 */
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/cu_int.cuh"

static int fail(char *err, size_t errsz, const char *fmt, ...)
{
    if (err && errsz) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errsz, fmt, ap);
        va_end(ap);
    }
    return -9; /* LMS_ERR_DEVICE */
}

/* The message for a runtime error, with what to do about the common ones. */
static const char *explain(cudaError_t e)
{
    switch (e) {
    case cudaErrorNoDevice:
        return "no CUDA device found";
    case cudaErrorInsufficientDriver:
        return "the NVIDIA driver is older than this build's CUDA runtime: update the driver";
    case cudaErrorMemoryAllocation:
        return "out of device memory";
    case cudaErrorInitializationError:
        return "the CUDA driver could not be initialised (is the driver loaded?)";
    case cudaErrorNoKernelImageForDevice:
        return "this build has no kernels for the device's architecture";
    default:
        return cudaGetErrorString(e);
    }
}

extern "C" int lcu_create(int device, lcu **out, lcu_info *info, char *err, size_t errsz)
{
    int n = 0, drv0 = 0;
    if (cudaDriverGetVersion(&drv0) != cudaSuccess || drv0 == 0)
        return fail(err, errsz, "cuda: no NVIDIA driver found (no GPU on this machine?)");
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return fail(err, errsz, "cuda: %s", explain(e));
    if (n == 0)
        return fail(err, errsz, "cuda: no CUDA device found");
    if (device < 0)
        device = 0;
    if (device >= n)
        return fail(err, errsz, "cuda: device %d requested, %d present", device, n);
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    if (drv < rt)
        return fail(err, errsz,
                    "cuda: the driver supports CUDA %d.%d but this build needs %d.%d: update the "
                    "NVIDIA driver",
                    drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    if ((e = cudaSetDevice(device)) != cudaSuccess)
        return fail(err, errsz, "cuda: device %d: %s", device, explain(e));
    lcu *g = (lcu *)calloc(1, sizeof *g);
    if (!g)
        return fail(err, errsz, "cuda: out of host memory");
    g->device = device;
    const char *mv = getenv("LMS_CUDA_MV_ROWS");
    g->mv_rows = mv ? atoi(mv) : 0;
    const char *q8 = getenv("LMS_CUDA_MMVQ");
    g->q8 = q8 ? atoi(q8) != 0 : 1;
    const char *mw = getenv("LMS_CUDA_MV_WARP");
    g->mv_warp = mw ? atoi(mw) != 0 : 0;
    int cc = 0;
    cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, device);
    const char *mm = getenv("LMS_CUDA_MMA");
    g->mma = cc >= 8 ? (mm ? atoi(mm) : 3) : 0;
    g->mma = g->mma < 0 ? 0 : g->mma;
    const char *mw8 = getenv("LMS_CUDA_MMA_WARPS");
    g->mma_warps = mw8 && (atoi(mw8) == 4 || atoi(mw8) == 16) ? atoi(mw8) : 8;
    const char *pd = getenv("LMS_CUDA_PDL");
    g->pdl = cc >= 9 ? (pd ? atoi(pd) : 1) : 0;
    const char *mp = getenv("LMS_CUDA_MMQ_PERM");
    g->mmq_perm = !mp || atoi(mp) != 0;
    const char *ad = getenv("LMS_CUDA_ATTN_DEC");
    g->att_dec = !ad || atoi(ad) != 0;
    const char *fa = getenv("LMS_CUDA_FA");
    g->fa = cc >= 8 && (!fa || atoi(fa) != 0);
    if ((e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(g);
        return fail(err, errsz, "cuda: cannot create a stream: %s", explain(e));
    }
    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) {
        cudaStreamDestroy(g->stream);
        free(g);
        return fail(err, errsz, "cuda: cannot initialise cuBLAS (out of device memory?)");
    }
    cublasSetStream(g->blas, g->stream);
    cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH);
    if (info) {
        cudaDeviceProp p;
        memset(info, 0, sizeof *info);
        if (cudaGetDeviceProperties(&p, device) == cudaSuccess) {
            snprintf(info->name, sizeof info->name, "%s", p.name);
            info->cc_major = p.major;
            info->cc_minor = p.minor;
            info->n_sm = p.multiProcessorCount;
        }
        info->driver_version = drv;
        info->runtime_version = rt;
        cudaMemGetInfo(&info->free_bytes, &info->total_bytes);
    }
    *out = g;
    return 0;
}

extern "C" void lcu_destroy(lcu *g)
{
    if (!g)
        return;
    cudaStreamSynchronize(g->stream);
    for (int i = 0; i < LCU_GRAPH_SLOTS; i++) {
        if (g->exec[i])
            cudaGraphExecDestroy(g->exec[i]);
        if (g->graph[i])
            cudaGraphDestroy(g->graph[i]);
    }
    cudaFree(g->w16);
    cudaFree(g->x16);
    cudaFree(g->blas_ws);
    cudaFree(g->attn_part);
    cudaFree(g->xq);
    for (int i = 0; i < g->n_stage; i++) {
        cudaFree(g->stage[i]);
        cudaEventDestroy(g->staged[i]);
        cudaEventDestroy(g->freed[i]);
    }
    if (g->copy)
        cudaStreamDestroy(g->copy);
    cublasDestroy(g->blas);
    cudaStreamDestroy(g->stream);
    free(g);
}

extern "C" int lcu_mem_info(lcu *g, size_t *free_bytes, size_t *total_bytes)
{
    (void)g;
    return cudaMemGetInfo(free_bytes, total_bytes) == cudaSuccess ? 0 : -9;
}

extern "C" double lcu_peak_gbs(int device)
{
    const size_t bytes = (size_t)512 << 20;
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(device < 0 ? 0 : device) != cudaSuccess ||
        cudaMemGetInfo(&fr, &tot) != cudaSuccess || fr < 3 * bytes) {
        cudaGetLastError();
        return 0.0;
    }
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0.0;
    if (cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
        cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess &&
        cudaMemset(a, 1, bytes) == cudaSuccess) {
        for (int rep = 0; rep < 6; rep++) { /* the first copy warms up */
            cudaEventRecord(e0, 0);
            cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
            cudaEventRecord(e1, 0);
            float ms = 0.0f;
            if (cudaEventSynchronize(e1) != cudaSuccess ||
                cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess || ms <= 0.0f)
                break;
            const double gbs = 2.0 * (double)bytes / (ms * 1e6);
            best = rep > 0 && gbs > best ? gbs : best;
        }
    }
    cudaGetLastError(); /* a failure here only means no figure */
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return best;
}

extern "C" void *lcu_alloc(lcu *g, size_t bytes, char *err, size_t errsz)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* clear it: an OOM here is reported, not sticky */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        fail(err, errsz, "cuda: cannot allocate %.1f MiB of device memory (%.1f MiB free): %s",
             (double)bytes / (1 << 20), (double)fr / (1 << 20), explain(e));
        return NULL;
    }
    g->allocated += bytes;
    return p;
}

extern "C" void lcu_free(lcu *g, void *p, size_t bytes)
{
    if (!p)
        return;
    cudaFree(p);
    g->allocated -= bytes;
}

extern "C" size_t lcu_allocated(const lcu *g)
{
    return g->allocated + g->w16_bytes + g->x16_bytes + g->blas_ws_bytes + g->attn_part_bytes +
           g->xq_bytes + (size_t)g->n_stage * g->stage_slot_bytes;
}

extern "C" int lcu_host_register(const void *p, size_t bytes, bool read_only)
{
    if (!p || !bytes)
        return -2;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p / page * page;
    const size_t n = ((uintptr_t)p + bytes - a + page - 1) / page * page;
    unsigned flags = read_only ? cudaHostRegisterReadOnly : cudaHostRegisterDefault;
    if (cudaHostRegister((void *)a, n, flags) != cudaSuccess) {
        cudaGetLastError();
        return -9;
    }
    return 0;
}

extern "C" void lcu_host_unregister(const void *p)
{
    if (!p)
        return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (cudaHostUnregister((void *)((uintptr_t)p / page * page)) != cudaSuccess)
        cudaGetLastError();
}

extern "C" void *lcu_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

extern "C" void lcu_host_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}

extern "C" bool lcu_host_pinned(const void *p)
{
    cudaPointerAttributes at;
    if (!p || cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return at.type == cudaMemoryTypeHost;
}

extern "C" int lcu_upload(lcu *g, void *dst, const void *src, size_t bytes)
{
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream) == cudaSuccess ? 0
                                                                                             : -9;
}

extern "C" int lcu_download(lcu *g, void *dst, const void *src, size_t bytes)
{
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream) == cudaSuccess ? 0
                                                                                             : -9;
}

extern "C" int lcu_sync(lcu *g, char *err, size_t errsz)
{
    cudaError_t e = cudaStreamSynchronize(g->stream);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    if (e != cudaSuccess)
        return fail(err, errsz, "cuda: %s", explain(e));
    return 0;
}

/* ---- scratch ------------------------------------------------------------------ */

#define LCU_W16_TILE ((size_t)32 << 20) /* bytes of one dequantized f16 weight tile */
#define LCU_BLAS_WS ((size_t)32 << 20)

static size_t w16_bytes(int64_t max_cols, int64_t max_rows, int64_t n_tok)
{
    if (n_tok <= LCU_MATVEC_MAX)
        return 0;
    size_t full = (size_t)max_cols * (size_t)max_rows * 2;
    size_t min_tile = (size_t)max_cols * 2 * 256; /* at least 256 rows per tile */
    size_t b = full < LCU_W16_TILE ? full : LCU_W16_TILE;
    return b > min_tile ? b : (min_tile < full ? min_tile : full);
}

/* The decode attention's split counters, at the end of the partials. */
static size_t cnt_bytes(int n_head)
{
    return (size_t)LCU_MATVEC_MAX * (size_t)n_head * sizeof(int);
}

/* Attention partials: the most (tokens x splits) any batch up to n_tok
 * uses; then the counters. */
static size_t part_bytes(int64_t n_tok, int n_head, int head_dim)
{
    int64_t small = n_tok < LCU_MATVEC_MAX ? n_tok : LCU_MATVEC_MAX;
    int64_t a = small * lcu_attn_max_split(small), b = n_tok * lcu_attn_max_split(n_tok);
    return (size_t)(a > b ? a : b) * (size_t)n_head * (size_t)(head_dim + 2) * sizeof(float) +
           cnt_bytes(n_head);
}

/* q8 activations of lcu_matmul's decode path. */
static size_t xq_bytes(int64_t max_cols, int64_t n_tok)
{
    int64_t n = n_tok < LCU_MATVEC_MAX ? n_tok : LCU_MATVEC_MAX;
    return max_cols % 32 == 0 ? lcu_q8_bytes(n, max_cols) : 0;
}

extern "C" size_t lcu_scratch_bytes(int64_t max_cols, int64_t max_rows, int64_t n_tok, int n_head,
                                    int head_dim)
{
    size_t x16 = n_tok > LCU_MATVEC_MAX ? (size_t)n_tok * (size_t)max_cols * 2 : 0;
    size_t ws = n_tok > LCU_MATVEC_MAX ? LCU_BLAS_WS : 0;
    return w16_bytes(max_cols, max_rows, n_tok) + x16 + ws + part_bytes(n_tok, n_head, head_dim) +
           xq_bytes(max_cols, n_tok);
}

extern "C" int lcu_reserve(lcu *g, int64_t max_cols, int64_t max_rows, int64_t n_tok, int n_head,
                           int head_dim, char *err, size_t errsz)
{
    g->max_tok = n_tok;
    size_t sz[5] = {w16_bytes(max_cols, max_rows, n_tok),
                    n_tok > LCU_MATVEC_MAX ? (size_t)n_tok * (size_t)max_cols * 2 : 0,
                    n_tok > LCU_MATVEC_MAX ? LCU_BLAS_WS : 0, part_bytes(n_tok, n_head, head_dim),
                    xq_bytes(max_cols, n_tok)};
    void **dst[5] = {(void **)&g->w16, (void **)&g->x16, &g->blas_ws, (void **)&g->attn_part,
                     &g->xq};
    size_t *rec[5] = {&g->w16_bytes, &g->x16_bytes, &g->blas_ws_bytes, &g->attn_part_bytes,
                      &g->xq_bytes};
    for (int i = 0; i < 5; i++) {
        if (!sz[i])
            continue;
        cudaError_t e = cudaMalloc(dst[i], sz[i]);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return fail(err, errsz, "cuda: cannot allocate %.1f MiB of scratch: %s",
                        (double)sz[i] / (1 << 20), explain(e));
        }
        *rec[i] = sz[i];
    }
    if (g->attn_part) {
        g->attn_cnt = (int *)((char *)g->attn_part + g->attn_part_bytes - cnt_bytes(n_head));
        if (cudaMemset(g->attn_cnt, 0, cnt_bytes(n_head)) != cudaSuccess) {
            cudaGetLastError();
            g->attn_cnt = NULL; /* the split kernels then */
        }
    }
    if (g->blas_ws)
        cublasSetWorkspace(g->blas, g->blas_ws, g->blas_ws_bytes);
    return 0;
}

/* ---- weight staging ---------------------------------------------------------------- */

extern "C" int lcu_stage_reserve(lcu *g, size_t slot_bytes, int n_slots, char *err, size_t errsz)
{
    if (n_slots < 2 || n_slots > LCU_STAGE_SLOTS || g->n_stage)
        return fail(err, errsz, "cuda: %d staging slots asked (2..%d, once)", n_slots,
                    LCU_STAGE_SLOTS);
    cudaError_t e = cudaStreamCreateWithFlags(&g->copy, cudaStreamNonBlocking);
    for (int i = 0; i < n_slots && e == cudaSuccess; i++) {
        e = cudaMalloc(&g->stage[i], slot_bytes);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&g->staged[i], cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&g->freed[i], cudaEventDisableTiming);
        if (e == cudaSuccess)
            g->n_stage = i + 1;
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return fail(err, errsz, "cuda: cannot allocate %d x %.1f MiB of weight staging: %s",
                    n_slots, (double)slot_bytes / (1 << 20), explain(e));
    }
    g->stage_slot_bytes = slot_bytes;
    return 0;
}

extern "C" const void *lcu_stage(lcu *g, const void *host, size_t bytes)
{
    if (!g->n_stage || bytes > g->stage_slot_bytes)
        return NULL;
    const int s = g->stage_next;
    g->stage_next = (s + 1) % g->n_stage;
    /* the copy waits until the slot's last readers ran (an event never
     * recorded is complete), and the main stream waits for the copy */
    if (cudaStreamWaitEvent(g->copy, g->freed[s], 0) != cudaSuccess ||
        cudaMemcpyAsync(g->stage[s], host, bytes, cudaMemcpyHostToDevice, g->copy) != cudaSuccess ||
        cudaEventRecord(g->staged[s], g->copy) != cudaSuccess ||
        cudaStreamWaitEvent(g->stream, g->staged[s], 0) != cudaSuccess)
        return NULL;
    return g->stage[s];
}

extern "C" void lcu_stage_done(lcu *g, const void *slot)
{
    for (int i = 0; i < g->n_stage; i++)
        if (g->stage[i] == slot)
            cudaEventRecord(g->freed[i], g->stream);
}

/* ---- graphs ------------------------------------------------------------------- */

extern "C" int lcu_graph_begin(lcu *g)
{
    return cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess ? 0
                                                                                              : -9;
}

extern "C" int lcu_graph_end(lcu *g, int slot)
{
    cudaGraph_t graph = NULL;
    if (cudaStreamEndCapture(g->stream, &graph) != cudaSuccess || !graph) {
        cudaGetLastError();
        return -9;
    }
    if (slot < 0 || slot >= LCU_GRAPH_SLOTS) {
        cudaGraphDestroy(graph);
        return -2;
    }
    cudaGraphExec_t exec = NULL;
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(graph);
        return -9;
    }
    if (g->exec[slot])
        cudaGraphExecDestroy(g->exec[slot]);
    if (g->graph[slot])
        cudaGraphDestroy(g->graph[slot]);
    g->graph[slot] = graph;
    g->exec[slot] = exec;
    return 0;
}

extern "C" bool lcu_graph_ready(const lcu *g, int slot)
{
    return slot >= 0 && slot < LCU_GRAPH_SLOTS && g->exec[slot] != NULL;
}

extern "C" void lcu_pdl(lcu *g, bool on)
{
    g->pdl_on = on && g->pdl > 0;
}

extern "C" int lcu_graph_launch(lcu *g, int slot)
{
    return cudaGraphLaunch(g->exec[slot], g->stream) == cudaSuccess ? 0 : -9;
}
