/*
 * matmul.c - batched matrix product over the per-ISA kernel table.
 *
 * Loop order: activations are converted once (one row per token), then the
 * OpenMP team takes tiles of TILE_ROWS weight rows; for each tile every
 * token's dot products are taken while the tile is hot in L1/L2. For one
 * token (decode) this is a plain matrix-vector product streaming W once.
 */
#include "kernels/matmul.h"

#include <string.h>

#include "kernels/kernels.h"

#define TILE_ROWS 16
/* Below this many multiply-adds a product runs on the calling thread: the
 * team's wake-up would cost more than the work. */
#define PARALLEL_MIN_MACS 65536

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

void lms_matmul_n(const lms_mat *const *ws, float *const *ys, int n, const float *x, int64_t n_tok,
                  void *scratch)
{
    const uint8_t *prep[LMS_MATMUL_MAX];
    size_t stride[LMS_MATMUL_MAX];
    int64_t first_tile[LMS_MATMUL_MAX + 1];
    lms_vec_dot_fn dot[LMS_MATMUL_MAX];
    double macs = 0;
    prepare(ws, n, x, n_tok, scratch, prep, stride);
    first_tile[0] = 0;
    for (int i = 0; i < n; i++) {
        dot[i] = lms_kernels_get()->vec_dot[ws[i]->type];
        first_tile[i + 1] = first_tile[i] + (ws[i]->n_rows + TILE_ROWS - 1) / TILE_ROWS;
        macs += (double)ws[i]->n_rows * (double)ws[i]->n_cols * (double)n_tok;
    }
    const int64_t nc = ws[0]->n_cols;
#pragma omp parallel for schedule(static) if (macs >= PARALLEL_MIN_MACS)
    for (int64_t tile = 0; tile < first_tile[n]; tile++) {
        int m = 0;
        while (tile >= first_tile[m + 1])
            m++;
        const lms_mat *w = ws[m];
        int64_t r0 = (tile - first_tile[m]) * TILE_ROWS;
        int64_t r1 = r0 + TILE_ROWS < w->n_rows ? r0 + TILE_ROWS : w->n_rows;
        for (int64_t t = 0; t < n_tok; t++) {
            const void *xr = prep[m] + (size_t)t * stride[m];
            float *yr = ys[m] + t * w->n_rows;
            for (int64_t r = r0; r < r1; r++)
                dot[m](nc, &yr[r], (const uint8_t *)w->data + (size_t)r * w->row_bytes, xr);
        }
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
