/*
 * matmul.h - y = W·x for a batch of activation rows, any weight type.
 *
 * W is row-major [n_rows][n_cols] in its own type (a GGUF tensor with
 * ne[0] = n_cols, ne[1] = n_rows). x is [n_tok][n_cols] f32, y is
 * [n_tok][n_rows] f32. Each x row is converted once to W's vec_dot type.
 * One token (decode): rows of W streamed once through the ISA's gemv
 * kernel (several rows a call) or vec_dot, in jobs of about equal bytes:
 * each thread of the OpenMP team streams its own share of the bytes, then
 * helps with the others' (results do not depend on the thread count).
 * Two or more: jobs of rows
 * sized for L2, taken dynamically, each through the ISA's tile kernel
 * (kernels.h, gemm) against every token (details in cpu/matmul.c).
 */
#ifndef LMS_MATMUL_H
#define LMS_MATMUL_H

#include <stddef.h>
#include <stdint.h>

typedef struct lms_mat {
    const void *data;
    int type;
    int64_t n_cols;   /* elements per row (ne[0]) */
    int64_t n_rows;   /* ne[1] */
    size_t row_bytes;
} lms_mat;

/* Most matrices one lms_matmul_n call takes. */
#define LMS_MATMUL_MAX 4

/* Bytes of scratch lms_matmul needs for n_tok rows of n_cols (one
 * conversion; lms_matmul_n needs one per distinct vec_dot type). */
size_t lms_matmul_scratch(int type, int64_t n_cols, int64_t n_tok);

/* y[t][r] = sum_c W[r][c] * x[t][c]. `scratch` holds at least
 * lms_matmul_scratch() bytes, 64-byte aligned. */
void lms_matmul(const lms_mat *w, const float *x, int64_t n_tok, float *y, void *scratch);

/* Several products of the same x (Q/K/V, gate/up) in one parallel pass:
 * ys[i] = ws[i]·x; all ws share n_cols; x is converted once per distinct
 * vec_dot type. scratch: n_mats x lms_matmul_scratch() bytes. */
void lms_matmul_n(const lms_mat *const *ws, float *const *ys, int n_mats, const float *x,
                  int64_t n_tok, void *scratch);

/* Converts one row of W to floats (embedding lookup). */
void lms_mat_get_row(const lms_mat *w, int64_t row, float *out);

#endif
