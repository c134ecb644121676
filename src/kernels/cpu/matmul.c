/*
 * matmul.c - batched matrix product over the per-ISA kernel table.
 *
 * Activations are converted once (one row per token) to the weights'
 * vec_dot type. Then:
 *   - decode (one token): a matrix-vector product; the OpenMP team splits
 *     the rows of all matrices of the call into equal static shares and
 *     streams them once, through the ISA's multi-row gemv kernel where it
 *     has one for the type, else vec_dot row by row (memory bound: nothing
 *     to reuse);
 *   - prompt (n_tok >= GEMM_MIN_TOK): jobs of a block of rows of one
 *     matrix (sized to stay in L2) times every token, taken dynamically;
 *     each job calls the ISA's tile kernel (kernels.h, lms_gemm_fn), which
 *     unpacks each weight block once per few tokens and keeps a few
 *     tokens' activations in L1 while the job's rows pass. Types without a
 *     tile kernel take vec_dot over the same jobs.
 */
#include "kernels/matmul.h"

#include <stdbool.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) { return 1; }
#endif

#include "kernels/kernels.h"

/* Decode: rows per unit of the static split. */
#define TILE_ROWS 16
/* Below this many multiply-adds a product runs on the calling thread: the
 * team's wake-up would cost more than the work. */
#define PARALLEL_MIN_MACS 65536
/* From this many tokens the ISA's tile (gemm) kernels take over. */
#define GEMM_MIN_TOK 2
/* Weight bytes of one prompt job (kept in L2 while all tokens pass), its
 * cap in rows, and the jobs per thread wanted for an even finish. */
#define GEMM_L2_BYTES (256 * 1024)
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
#pragma omp parallel for schedule(static) if (n_tok > 4)
            for (int64_t t = 0; t < n_tok; t++)
                conv(x + t * nc, q + (size_t)t * xrow, nc);
            done_type[n_done] = vt;
            done_buf[n_done++] = q;
        }
        prep[i] = done_buf[d];
    }
}

/* Weight rows of one job: a block of rows of one matrix, for every token. */
typedef struct job_plan {
    int64_t first[LMS_MATMUL_MAX + 1]; /* first job of each matrix; first[n] = total */
    int64_t rows_per_job[LMS_MATMUL_MAX];
} job_plan;

/* Rows per job: a multiple of 16 (the gemm kernels' micro tiles divide
 * it) small enough that the job's rows stay in L2 (GEMM_L2_BYTES) while
 * every token passes, and that there are at least JOBS_PER_THREAD jobs a
 * thread, so that dynamic scheduling leaves the threads at most one small
 * job apart. Decode (one token) streams rows once: fixed TILE_ROWS. */
static int64_t job_rows(const lms_mat *w, int64_t total_rows, int64_t n_tok, int n_threads)
{
    if (n_tok < GEMM_MIN_TOK)
        return TILE_ROWS;
    int64_t r = GEMM_L2_BYTES / (int64_t)(w->row_bytes ? w->row_bytes : 1);
    const int64_t balance = total_rows / ((int64_t)n_threads * JOBS_PER_THREAD);
    if (balance < r)
        r = balance;
    r = r / 16 * 16;
    return r < 16 ? 16 : r > GEMM_MAX_ROWS ? GEMM_MAX_ROWS : r;
}

/* Rows [r0, r1) of w times every token: the tile kernel where the ISA has
 * one for this type (n_tok >= GEMM_MIN_TOK), the gemv kernel for one token
 * (decode callers pass it), else vec_dot row by row. */
static void run_job(const lms_mat *w, lms_vec_dot_fn dot, lms_gemm_fn gemm, lms_gemv_fn gemv,
                    const uint8_t *xq, size_t ldx, int64_t n_tok, float *y, int64_t r0, int64_t r1)
{
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    if (gemv && n_tok == 1) {
        gemv(w->n_cols, r1 - r0, wr, w->row_bytes, xq, y + r0);
        return;
    }
    if (gemm && n_tok >= GEMM_MIN_TOK) {
        gemm(w->n_cols, r1 - r0, n_tok, wr, w->row_bytes, xq, ldx, y + r0, (size_t)w->n_rows);
        return;
    }
    for (int64_t t = 0; t < n_tok; t++) {
        const void *xr = xq + (size_t)t * ldx;
        float *yr = y + t * w->n_rows;
        for (int64_t r = r0; r < r1; r++)
            dot(w->n_cols, &yr[r], (const uint8_t *)w->data + (size_t)r * w->row_bytes, xr);
    }
}

void lms_matmul_n(const lms_mat *const *ws, float *const *ys, int n, const float *x, int64_t n_tok,
                  void *scratch)
{
    const lms_kernel_table *k = lms_kernels_get();
    const uint8_t *prep[LMS_MATMUL_MAX];
    size_t stride[LMS_MATMUL_MAX];
    lms_vec_dot_fn dot[LMS_MATMUL_MAX];
    lms_gemm_fn gemm[LMS_MATMUL_MAX];
    lms_gemv_fn gemv[LMS_MATMUL_MAX];
    job_plan plan;
    double macs = 0;
    int64_t total_rows = 0;
    prepare(ws, n, x, n_tok, scratch, prep, stride);
    for (int i = 0; i < n; i++) {
        total_rows += ws[i]->n_rows;
        macs += (double)ws[i]->n_rows * (double)ws[i]->n_cols * (double)n_tok;
    }
    const bool par = macs >= PARALLEL_MIN_MACS;
    const int n_threads = par ? omp_get_max_threads() : 1;
    plan.first[0] = 0;
    for (int i = 0; i < n; i++) {
        dot[i] = k->vec_dot[ws[i]->type];
        gemm[i] = k->gemm[ws[i]->type];
        gemv[i] = k->gemv[ws[i]->type];
        plan.rows_per_job[i] = job_rows(ws[i], total_rows, n_tok, n_threads);
        plan.first[i + 1] =
            plan.first[i] + (ws[i]->n_rows + plan.rows_per_job[i] - 1) / plan.rows_per_job[i];
    }
    const int64_t n_jobs = plan.first[n];
    if (n_tok < GEMM_MIN_TOK) {
        /* decode: equal shares of rows in order, each thread streams its part */
#pragma omp parallel for schedule(static) if (par)
        for (int64_t j = 0; j < n_jobs; j++) {
            int m = 0;
            while (j >= plan.first[m + 1])
                m++;
            const int64_t r0 = (j - plan.first[m]) * plan.rows_per_job[m];
            const int64_t r1 = r0 + plan.rows_per_job[m] < ws[m]->n_rows
                                   ? r0 + plan.rows_per_job[m] : ws[m]->n_rows;
            run_job(ws[m], dot[m], NULL, gemv[m], prep[m], stride[m], n_tok, ys[m], r0, r1);
        }
        return;
    }
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t j = 0; j < n_jobs; j++) {
        int m = 0;
        while (j >= plan.first[m + 1])
            m++;
        const int64_t r0 = (j - plan.first[m]) * plan.rows_per_job[m];
        const int64_t r1 =
            r0 + plan.rows_per_job[m] < ws[m]->n_rows ? r0 + plan.rows_per_job[m] : ws[m]->n_rows;
        run_job(ws[m], dot[m], gemm[m], NULL, prep[m], stride[m], n_tok, ys[m], r0, r1);
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
