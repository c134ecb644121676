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

void lms_matmul(const lms_mat *w, const float *x, int64_t n_tok, float *y, void *scratch)
{
    const lms_kernel_table *k = lms_kernels_get();
    const lms_type_traits *tt = lms_type_get(w->type);
    const int vt = tt->vec_dot_type;
    const int64_t nc = w->n_cols, nr = w->n_rows;
    const size_t xrow = (lms_row_size(vt, nc) + 63) / 64 * 64;
    const lms_vec_dot_fn dot = k->vec_dot[w->type];
    const uint8_t *xq = x ? (const uint8_t *)x : NULL;

    if (vt != LMS_TYPE_F32) {
        uint8_t *q = scratch;
        lms_from_float_fn conv = k->from_float[vt];
#pragma omp parallel for schedule(static) if (n_tok > 4)
        for (int64_t t = 0; t < n_tok; t++)
            conv(x + t * nc, q + (size_t)t * xrow, nc);
        xq = q;
    }
    const size_t xstride = vt == LMS_TYPE_F32 ? (size_t)nc * sizeof(float) : xrow;
    const int64_t n_tiles = (nr + TILE_ROWS - 1) / TILE_ROWS;
    const bool par = (double)nr * (double)nc * (double)n_tok >= PARALLEL_MIN_MACS;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t tile = 0; tile < n_tiles; tile++) {
        int64_t r0 = tile * TILE_ROWS, r1 = r0 + TILE_ROWS < nr ? r0 + TILE_ROWS : nr;
        for (int64_t t = 0; t < n_tok; t++) {
            const void *xr = xq + (size_t)t * xstride;
            float *yr = y + t * nr;
            for (int64_t r = r0; r < r1; r++)
                dot(nc, &yr[r], (const uint8_t *)w->data + (size_t)r * w->row_bytes, xr);
        }
    }
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
