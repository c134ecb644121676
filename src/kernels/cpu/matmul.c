/*
 * matmul.c - batched matrix product over the per-ISA kernel table.
 *
 * Activations are converted once (one row per token) to the weights'
 * vec_dot type. Then:
 *   - decode (one token): a matrix-vector product, memory bound (nothing
 *     to reuse), streamed once through the ISA's multi-row gemv kernel where
 *     it has one for the type, else vec_dot row by row. The rows of all
 *     matrices of the call are cut into jobs of about DECODE_JOB_BYTES and
 *     the job list into one contiguous segment per thread holding an equal
 *     share of the bytes (a Q6_K row costs more than a Q4_K row). Each thread
 *     streams its own segment front to back and then takes the jobs left in
 *     the others' from their back ends (see decode_par): two threads of a
 *     VM rarely stream at the same speed, and with equal static shares the
 *     faster one waited ~15% of each product at the join. Job bounds depend
 *     on the shapes only, so which thread runs a job never changes a result;
 *   - prompt (n_tok >= GEMM_MIN_TOK): jobs of a block of rows of one
 *     matrix (sized to stay in L2) times every token, taken dynamically;
 *     each job calls the ISA's tile kernel (kernels.h, lms_gemm_fn), which
 *     unpacks each weight block once per few tokens and keeps a few
 *     tokens' activations in L1 while the job's rows pass. Types without a
 *     tile kernel take vec_dot over the same jobs.
 */
#include "kernels/matmul.h"

#include <stdalign.h>
#include <stdbool.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) { return 1; }
static int omp_get_thread_num(void) { return 0; }
#endif

#include "kernels/kernels.h"

/* Decode: weight bytes of a job (rows rounded to a multiple of
 * DECODE_ROW_ALIGN, which keeps the gemv kernels' row groups whole), and
 * the most threads that get a segment of their own. 48 KiB rather than 24:
 * whole-model decode on 2 threads with the two sizes alternating token by
 * token in one process, Qwen3-0.6B and Llama-3.2-1B Q4_K_M 4-5% faster a
 * token while the memory ran fast (~40 GB/s), the same within 0.3% while
 * it ran slow (~28 GB/s); 32 KiB was ~1% slower than 48, 96 the same. */
#define DECODE_JOB_BYTES (48 * 1024)
#define DECODE_ROW_ALIGN 16
#define DECODE_MAX_SEGS 64
/* Below this many multiply-adds a product runs on the calling thread: the
 * team's wake-up would cost more than the work. */
#define PARALLEL_MIN_MACS 65536
/* From this many tokens the ISA's tile (gemm) kernels take over. */
#define GEMM_MIN_TOK 2
/* Weight bytes of one prompt job (kept in L2 while all tokens pass), its
 * cap in rows, and the jobs per thread wanted for an even finish. Up to
 * GEMM_FEW_TOK tokens (batched decode) the tile kernels pass over a job's
 * rows once or twice, so there is little to keep: jobs may fill the L2
 * (GEMM_FEW_L2_BYTES), which halves the per-job setup (the K-quant
 * kernels permute every chunk of activations once per job; kbench -b
 * -k 8192 -m 16384 q4_K/q6_K, ffn_down: 32-48 -> 128-row jobs, ~5-9% less
 * time). */
#define GEMM_L2_BYTES (256 * 1024)
#define GEMM_FEW_TOK 16
#define GEMM_FEW_L2_BYTES (1024 * 1024)
#define GEMM_MAX_ROWS 256
#define JOBS_PER_THREAD 8

size_t lms_matmul_scratch(int type, int64_t n_cols, int64_t n_tok)
{
    const lms_type_traits *tt = lms_type_get(type);
    if (!tt)
        return 0;
    int vt = tt->vec_dot_type;
    size_t row = lms_row_size(vt, n_cols);
    return (row + 63) / 64 * 64 * (size_t)n_tok;
}

/* Converts x once per distinct vec_dot type among ws; prep[i] points at
 * the rows matrix i reads, stride[i] is their byte stride. */
static void prepare(const lms_mat *const *ws, int n, const float *x, int64_t n_tok,
                    uint8_t *scratch, const uint8_t **prep, size_t *stride)
{
    const lms_kernel_table *k = lms_kernels_get();
    int done_type[LMS_MATMUL_MAX];
    const uint8_t *done_buf[LMS_MATMUL_MAX];
    int n_done = 0;
    size_t used = 0;
    const int64_t nc = ws[0]->n_cols;
    for (int i = 0; i < n; i++) {
        const int vt = lms_type_get(ws[i]->type)->vec_dot_type;
        const size_t xrow = (lms_row_size(vt, nc) + 63) / 64 * 64;
        stride[i] = vt == LMS_TYPE_F32 ? (size_t)nc * sizeof(float) : xrow;
        prep[i] = (const uint8_t *)x;
        if (vt == LMS_TYPE_F32)
            continue;
        int d = 0;
        while (d < n_done && done_type[d] != vt)
            d++;
        if (d == n_done) {
            uint8_t *q = scratch + used;
            used += xrow * (size_t)n_tok;
            lms_from_float_fn conv = k->from_float[vt];
            /* a few rows stay out of OpenMP: even a `parallel if (0)`
             * region costs ~0.3 us, and decode converts several a layer */
            if (n_tok <= 4) {
                for (int64_t t = 0; t < n_tok; t++)
                    conv(x + t * nc, q + (size_t)t * xrow, nc);
            } else {
#pragma omp parallel for schedule(static)
                for (int64_t t = 0; t < n_tok; t++)
                    conv(x + t * nc, q + (size_t)t * xrow, nc);
            }
            done_type[n_done] = vt;
            done_buf[n_done++] = q;
        }
        prep[i] = done_buf[d];
    }
}

/* One lms_matmul_n call: its matrices, their converted activations and
 * kernels, and its jobs (a block of rows of one matrix, for every token). */
typedef struct mm_call {
    int n;                                /* matrices */
    const lms_mat *const *ws;
    float *const *ys;
    int64_t n_tok;
    const uint8_t *prep[LMS_MATMUL_MAX];  /* x in matrix i's vec_dot type */
    size_t stride[LMS_MATMUL_MAX];        /* bytes between its token rows */
    lms_vec_dot_fn dot[LMS_MATMUL_MAX];
    lms_gemm_fn gemm[LMS_MATMUL_MAX];     /* NULL for decode */
    lms_gemv_fn gemv[LMS_MATMUL_MAX];     /* NULL for prompts */
    int64_t first[LMS_MATMUL_MAX + 1];    /* first job of each matrix; first[n] = total */
    int64_t rows_per_job[LMS_MATMUL_MAX];
} mm_call;

/* Rows per job. Prompts: a multiple of 16 (the gemm kernels' micro tiles
 * divide it) small enough that the job's rows stay in L2 (GEMM_L2_BYTES)
 * while every token passes, and that there are at least JOBS_PER_THREAD
 * jobs a thread, so that dynamic scheduling leaves the threads at most one
 * small job apart. Decode (one token) streams rows once: jobs of about
 * DECODE_JOB_BYTES, whatever the thread count. */
static int64_t job_rows(const lms_mat *w, int64_t total_rows, int64_t n_tok, int n_threads)
{
    const int64_t rb = (int64_t)(w->row_bytes ? w->row_bytes : 1);
    if (n_tok < GEMM_MIN_TOK) {
        const int64_t r = DECODE_JOB_BYTES / rb;
        return r < DECODE_ROW_ALIGN ? DECODE_ROW_ALIGN : r / DECODE_ROW_ALIGN * DECODE_ROW_ALIGN;
    }
    int64_t r = (n_tok <= GEMM_FEW_TOK ? GEMM_FEW_L2_BYTES : GEMM_L2_BYTES) / rb;
    const int64_t balance = total_rows / ((int64_t)n_threads * JOBS_PER_THREAD);
    if (balance < r)
        r = balance;
    r = r / 16 * 16;
    return r < 16 ? 16 : r > GEMM_MAX_ROWS ? GEMM_MAX_ROWS : r;
}

/* Job j's matrix and rows [*r0, *r1). */
static int job_span(const mm_call *mc, int64_t j, int64_t *r0, int64_t *r1)
{
    int m = 0;
    while (j >= mc->first[m + 1])
        m++;
    const int64_t n_rows = mc->ws[m]->n_rows;
    *r0 = (j - mc->first[m]) * mc->rows_per_job[m];
    *r1 = *r0 + mc->rows_per_job[m] < n_rows ? *r0 + mc->rows_per_job[m] : n_rows;
    return m;
}

/* Job j: rows [r0, r1) of one matrix times every token, through the tile
 * kernel where the ISA has one for the type (prompts), the gemv kernel
 * (decode), else vec_dot row by row. */
static void run_job(const mm_call *mc, int64_t j)
{
    int64_t r0, r1;
    const int m = job_span(mc, j, &r0, &r1);
    const lms_mat *w = mc->ws[m];
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    const uint8_t *xq = mc->prep[m];
    float *y = mc->ys[m];
    if (mc->gemv[m] && mc->n_tok == 1) {
        mc->gemv[m](w->n_cols, r1 - r0, wr, w->row_bytes, xq, y + r0);
        return;
    }
    if (mc->gemm[m] && mc->n_tok >= GEMM_MIN_TOK) {
        mc->gemm[m](w->n_cols, r1 - r0, mc->n_tok, wr, w->row_bytes, xq, mc->stride[m], y + r0,
                    (size_t)w->n_rows);
        return;
    }
    for (int64_t t = 0; t < mc->n_tok; t++) {
        const void *xr = xq + (size_t)t * mc->stride[m];
        float *yr = y + t * w->n_rows;
        for (int64_t r = r0; r < r1; r++)
            mc->dot[m](w->n_cols, &yr[r], (const uint8_t *)w->data + (size_t)r * w->row_bytes, xr);
    }
}

/* A thread's share of the decode jobs, [next, end) packed in one word
 * (end in the high half; a decode job is at least DECODE_ROW_ALIGN rows,
 * so job indices fit 32 bits) so that its owner can claim from the front
 * and the others from the back with one compare-and-swap each; a cache
 * line each so that owners do not contend. */
typedef struct decode_seg {
    alignas(64) uint64_t range;
} decode_seg;

#define SEG_PACK(next, end) ((uint64_t)(end) << 32 | (uint64_t)(next))

/* Claims the front job of sg (front) or its back job (!front); -1 when
 * none is left. Relaxed: the jobs' inputs were published before the
 * parallel region and their outputs are read after its closing barrier. */
static int64_t seg_claim(decode_seg *sg, bool front)
{
    uint64_t r = __atomic_load_n(&sg->range, __ATOMIC_RELAXED);
    for (;;) {
        const uint32_t next = (uint32_t)r, end = (uint32_t)(r >> 32);
        if (next >= end)
            return -1;
        const uint64_t nr = front ? SEG_PACK(next + 1, end) : SEG_PACK(next, end - 1);
        if (__atomic_compare_exchange_n(&sg->range, &r, nr, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return front ? next : end - 1;
    }
}

/* Index of the job in which byte `at` of the call's weights (matrices in
 * order, each cut into jobs of rows_per_job rows) falls, rounded to the
 * nearest job boundary. */
static int64_t job_at_byte(const mm_call *mc, double at)
{
    for (int i = 0; i < mc->n; i++) {
        const double bytes = (double)mc->ws[i]->n_rows * (double)mc->ws[i]->row_bytes;
        if (at < bytes) {
            const double job = (double)mc->rows_per_job[i] * (double)mc->ws[i]->row_bytes;
            const int64_t j = mc->first[i] + (int64_t)(at / job + 0.5);
            return j < mc->first[i + 1] ? j : mc->first[i + 1];
        }
        at -= bytes;
    }
    return mc->first[mc->n];
}

/* Bytes a thread fetches ahead of a job that does not continue the bytes
 * of its previous one (its first job, a job taken from another's segment,
 * the next matrix): the gemv kernels prefetch ahead of their own progress
 * and, past their rows, into the rows that follow, so only such a start
 * begins cold. 8 KiB as their lead (cpu/x86/quant_avx512.c): whole-model
 * decode, Qwen3-0.6B Q4_K_M on 2 threads, with and without it alternating
 * token by token, 0-1.7% faster a token. */
#define DECODE_LEAD_BYTES 8192

/* Runs job j on the calling thread; *expect: where its previous job's
 * bytes ended (prefetch when j does not start there). */
static void run_decode_job(const mm_call *mc, int64_t j, const uint8_t **expect)
{
    int64_t r0, r1;
    const lms_mat *w = mc->ws[job_span(mc, j, &r0, &r1)];
    const uint8_t *p = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    const size_t bytes = (size_t)(r1 - r0) * w->row_bytes;
    if (p != *expect) {
        const size_t lead = bytes < DECODE_LEAD_BYTES ? bytes : DECODE_LEAD_BYTES;
        for (size_t o = 0; o < lead; o += 64)
            __builtin_prefetch(p + o, 0, 2);
    }
    *expect = p + bytes;
    run_job(mc, j);
}

/* Decode over the team: segment s (of n_seg, equal bytes each) is thread
 * s's work, taken front to back; a thread that finishes its own segment
 * helps with the others', in order, taking their jobs from the back (so
 * that the owner's stream of addresses, and the prefetch ahead of it, go
 * on undisturbed). */
static void decode_par(const mm_call *mc)
{
    const int n_threads = omp_get_max_threads();
    const int n_seg = n_threads < DECODE_MAX_SEGS ? n_threads : DECODE_MAX_SEGS;
    decode_seg seg[DECODE_MAX_SEGS];
    double total = 0;
    for (int i = 0; i < mc->n; i++)
        total += (double)mc->ws[i]->n_rows * (double)mc->ws[i]->row_bytes;
    int64_t from = 0;
    for (int s = 0; s < n_seg; s++) {
        const int64_t to =
            s == n_seg - 1 ? mc->first[mc->n] : job_at_byte(mc, total * (s + 1) / n_seg);
        seg[s].range = SEG_PACK(from, to);
        from = to;
    }
#pragma omp parallel
    {
        const int tid = omp_get_thread_num();
        const uint8_t *expect = NULL;
        for (int k = 0; k < n_seg; k++) {
            decode_seg *sg = &seg[(tid + k) % n_seg];
            for (;;) {
                const int64_t j = seg_claim(sg, k == 0);
                if (j < 0)
                    break;
                run_decode_job(mc, j, &expect);
            }
        }
    }
}

void lms_matmul_n(const lms_mat *const *ws, float *const *ys, int n, const float *x, int64_t n_tok,
                  void *scratch)
{
    const lms_kernel_table *k = lms_kernels_get();
    mm_call mc = {.n = n, .ws = ws, .ys = ys, .n_tok = n_tok};
    double macs = 0;
    int64_t total_rows = 0;
    prepare(ws, n, x, n_tok, scratch, mc.prep, mc.stride);
    for (int i = 0; i < n; i++) {
        total_rows += ws[i]->n_rows;
        macs += (double)ws[i]->n_rows * (double)ws[i]->n_cols * (double)n_tok;
    }
    const bool par = macs >= PARALLEL_MIN_MACS && omp_get_max_threads() > 1;
    const int n_threads = par ? omp_get_max_threads() : 1;
    const bool decode = n_tok < GEMM_MIN_TOK;
    mc.first[0] = 0;
    for (int i = 0; i < n; i++) {
        mc.dot[i] = k->vec_dot[ws[i]->type];
        mc.gemm[i] = decode ? NULL : k->gemm[ws[i]->type];
        mc.gemv[i] = decode ? k->gemv[ws[i]->type] : NULL;
        mc.rows_per_job[i] = job_rows(ws[i], total_rows, n_tok, n_threads);
        mc.first[i + 1] =
            mc.first[i] + (ws[i]->n_rows + mc.rows_per_job[i] - 1) / mc.rows_per_job[i];
    }
    const int64_t n_jobs = mc.first[n];
    if (!par) {
        for (int64_t j = 0; j < n_jobs; j++)
            run_job(&mc, j);
    } else if (decode) {
        decode_par(&mc);
    } else {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t j = 0; j < n_jobs; j++)
            run_job(&mc, j);
    }
}

void lms_matmul(const lms_mat *w, const float *x, int64_t n_tok, float *y, void *scratch)
{
    lms_matmul_n(&w, &y, 1, x, n_tok, scratch);
}

void lms_mat_get_row(const lms_mat *w, int64_t row, float *out)
{
    const uint8_t *src = (const uint8_t *)w->data + (size_t)row * w->row_bytes;
    if (w->type == LMS_TYPE_F32) {
        memcpy(out, src, (size_t)w->n_cols * sizeof(float));
        return;
    }
    lms_kernels_get()->to_float[w->type](src, out, w->n_cols);
}
