/*
 * test_gemm.c - the tile (gemm) kernels and lms_matmul against vec_dot.
 *
 * For each ISA table this build has and this CPU runs, and each weight
 * type with a gemm entry: random weight blocks (every bit pattern of codes
 * and sub-block scales; super-block scales ordinary, zero or extreme),
 * activations from tiny to large and all-zero, row lengths with odd block
 * counts, n_rows and n_tok from 1 up past the kernels' micro tiles and an
 * output stride wider than n_rows. Every s[t][r] must agree with vec_dot of
 * the same table within 1e-5 of the sum of the magnitudes of the terms
 * (the two sum in different orders; the integer parts are exact in both).
 *
 * Then lms_matmul / lms_matmul_n (the scheduler: conversion, tiling, the
 * parallel split, the decode path) against a plain loop over vec_dot.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp16.h"
#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels.h"
#include "kernels/kernels_impl.h"
#include "kernels/matmul.h"
#include "testutil.h"

static const char *const k_isa_names[] = {"scalar", "avx2", "avx512", "neon"};

static const int k_types[] = {
    LMS_TYPE_F32,  LMS_TYPE_F16,  LMS_TYPE_BF16, LMS_TYPE_Q4_0, LMS_TYPE_Q4_1, LMS_TYPE_Q5_0,
    LMS_TYPE_Q5_1, LMS_TYPE_Q8_0, LMS_TYPE_Q2_K, LMS_TYPE_Q3_K, LMS_TYPE_Q4_K, LMS_TYPE_Q5_K,
    LMS_TYPE_Q6_K, LMS_TYPE_IQ4_NL, LMS_TYPE_IQ4_XS,
};
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])

/* ---- random data --------------------------------------------------------------- */

/* An f16 scale: ordinary (mode 0), extreme (1) or zero (2). */
static uint16_t rand_scale(uint64_t *seed, int mode)
{
    static const float extremes[] = {65504.0f, -65504.0f, 5.9604645e-8f, 6.1035156e-5f,
                                     1e-5f,    0.0f,      -1.0f};
    if (mode == 2)
        return 0;
    if (mode == 1)
        return lms_f32_to_f16(extremes[tu_rand_u64(seed) % (sizeof extremes / sizeof extremes[0])]);
    const float v = exp2f(tu_rand_f32(seed, -10.0f, 0.0f));
    return lms_f32_to_f16(tu_rand_u64(seed) & 1 ? -v : v);
}

/* Byte offsets of a block's f16 scale d and offset/dmin m (-1: none). */
static void scale_offsets(int type, int *d, int *m)
{
    *m = -1;
    switch (type) {
    case LMS_TYPE_Q4_1: *d = 0, *m = 2; break;
    case LMS_TYPE_Q5_1: *d = 0, *m = 2; break;
    case LMS_TYPE_Q2_K: *d = 80, *m = 82; break;
    case LMS_TYPE_Q3_K: *d = 108; break;
    case LMS_TYPE_Q4_K: *d = 0, *m = 2; break;
    case LMS_TYPE_Q5_K: *d = 0, *m = 2; break;
    case LMS_TYPE_Q6_K: *d = 208; break;
    default: *d = 0; break; /* Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS */
    }
}

/* n elements of a weight type: random bytes with finite scales; one block
 * in eight gets an extreme scale, one in sixteen a zero one. */
static void rand_weights(uint64_t *seed, int type, void *buf, int64_t n)
{
    const lms_type_traits *tt = lms_type_get(type);
    if (type == LMS_TYPE_F32) {
        for (int64_t i = 0; i < n; i++)
            ((float *)buf)[i] = tu_rand_f32(seed, -2.0f, 2.0f);
        return;
    }
    if (type == LMS_TYPE_F16 || type == LMS_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            const float v = tu_rand_f32(seed, -2.0f, 2.0f);
            ((uint16_t *)buf)[i] = type == LMS_TYPE_F16 ? lms_f32_to_f16(v) : lms_f32_to_bf16(v);
        }
        return;
    }
    uint8_t *p = buf;
    for (size_t i = 0; i < lms_row_size(type, n); i++)
        p[i] = (uint8_t)tu_rand_u64(seed);
    int od, om;
    scale_offsets(type, &od, &om);
    for (int64_t b = 0; b < n / tt->blck_size; b++) {
        uint8_t *blk = p + (size_t)b * tt->type_size;
        const uint64_t r = tu_rand_u64(seed) % 16;
        const int mode = r == 0 ? 2 : r < 3 ? 1 : 0;
        const uint16_t d = rand_scale(seed, mode), m = rand_scale(seed, mode);
        memcpy(blk + od, &d, 2);
        if (om >= 0)
            memcpy(blk + om, &m, 2);
    }
}



static bool close_enough(float got, float want, double mag)
{
    if (!isfinite(mag))
        return got == want || (isnan(got) && isnan(want));
    return fabs((double)got - (double)want) <= 1e-5 * mag + 1e-37;
}

static int g_reported;

/* ---- one product, several ways --------------------------------------------------- */

typedef struct problem {
    int type, vt;
    int64_t n, n_rows, n_tok;
    size_t ldw, ldx;
    uint8_t *w;  /* [n_rows][ldw] */
    float *x;    /* [n_tok][n] */
    uint8_t *xq; /* [n_tok][ldx], x in the vec_dot type */
} problem;

static void problem_init(problem *p, uint64_t *seed, int type, int64_t n, int64_t n_rows,
                         int64_t n_tok)
{
    p->type = type;
    p->vt = lms_type_get(type)->vec_dot_type;
    p->n = n, p->n_rows = n_rows, p->n_tok = n_tok;
    p->ldw = lms_row_size(type, n);
    p->ldx = lms_row_size(p->vt, n);
    p->w = malloc(p->ldw * (size_t)n_rows); /* exact sizes: ASan sees over-reads */
    p->x = malloc((size_t)(n * n_tok) * sizeof(float));
    p->xq = malloc(p->ldx * (size_t)n_tok);
    for (int64_t r = 0; r < n_rows; r++)
        rand_weights(seed, type, p->w + (size_t)r * p->ldw, n);
    for (int64_t t = 0; t < n_tok; t++) {
        tu_rand_acts(seed, p->x + t * n, n);
        lms_kernels_ref()->from_float[p->vt](p->x + t * n, p->xq + (size_t)t * p->ldx, n);
    }
}

static void problem_deinit(problem *p)
{
    free(p->w);
    free(p->x);
    free(p->xq);
}

/* s[t * lds + r] against k's vec_dot; returns the number of bad entries. */
static int check_against_vec_dot(const lms_kernel_table *k, const problem *p, const float *s,
                                 size_t lds, const char *what)
{
    int bad = 0;
    for (int64_t t = 0; t < p->n_tok; t++)
        for (int64_t r = 0; r < p->n_rows; r++) {
            const void *wr = p->w + (size_t)r * p->ldw, *xr = p->xq + (size_t)t * p->ldx;
            float want;
            k->vec_dot[p->type](p->n, &want, wr, xr);
            const float got = s[(size_t)t * lds + r];
            const double mag = tu_dot_magnitude(p->type, p->n, wr, xr);
            if (!close_enough(got, want, mag)) {
                if (g_reported++ < 20)
                    fprintf(stderr, "%s %s/%s n=%lld rows=%lld tok=%lld [t%lld r%lld]: got %.9g "
                                    "want %.9g (|terms| %.3g)\n",
                            what, k->isa, lms_type_get(p->type)->name, (long long)p->n,
                            (long long)p->n_rows, (long long)p->n_tok, (long long)t, (long long)r,
                            got, want, mag);
                bad++;
            }
        }
    return bad;
}

/* ---- the gemm entries ------------------------------------------------------------- */

static void test_gemm_kernels(void **state)
{
    (void)state;
    static const int64_t rows[] = {1, 2, 3, 4, 5, 7, 9, 17};
    /* every partial tile of the 16-token K-quant tiles, a full one, one past */
    static const int64_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17};
    uint64_t seed = 0x6e3a9f21;
    int bad = 0, n_checked = 0;
    for (size_t ii = 0; ii < sizeof k_isa_names / sizeof k_isa_names[0]; ii++) {
        const lms_kernel_table *k = lms_kernels_for_isa(k_isa_names[ii]);
        if (!k)
            continue;
        for (int ti = 0; ti < N_TYPES; ti++) {
            const int type = k_types[ti];
            if (!k->gemm[type])
                continue;
            const int64_t bs = lms_type_get(type)->blck_size;
            /* odd block counts; F16 also lengths that are not a multiple of 16,
             * one over two of the AVX-512 kernel's 1024-column chunks; 17
             * super-blocks: one past the AVX2 K-quant kernels' 16-block chunks */
            const int64_t lens[] = {bs == 1 ? 200 : bs, bs == 1 ? 1000 : 3 * bs,
                                    bs == 256 ? 2048 : bs == 1 ? 2100 : 32 * 37,
                                    bs == 256 ? 17 * 256 : bs == 1 ? 3000 : 32 * 71};
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
                    for (size_t ni = 0; ni < sizeof toks / sizeof toks[0]; ni++) {
                        const int64_t nt = toks[ni];
                        problem p;
                        problem_init(&p, &seed, type, lens[li], rows[ri], nt);
                        const size_t lds = (size_t)rows[ri] + 3;
                        float *s = malloc(lds * (size_t)nt * sizeof *s);
                        for (size_t i = 0; i < lds * (size_t)nt; i++)
                            s[i] = NAN;
                        k->gemm[type](p.n, p.n_rows, p.n_tok, p.w, p.ldw, p.xq, p.ldx, s, lds);
                        bad += check_against_vec_dot(k, &p, s, lds, "gemm");
                        /* the gap between rows of s stays untouched */
                        for (int64_t t = 0; t < nt; t++)
                            for (size_t r = (size_t)rows[ri]; r < lds; r++)
                                bad += !isnan(s[(size_t)t * lds + r]);
                        free(s);
                        problem_deinit(&p);
                        n_checked++;
                    }
        }
    }
    fprintf(stderr, "gemm: %d products checked\n", n_checked);
    assert_int_equal(bad, 0);
}

/* ---- lms_matmul ------------------------------------------------------------------- */

static void test_matmul(void **state)
{
    (void)state;
    static const int64_t toks[] = {1, 2, 3, 4, 5, 8, 9, 33, 70};
    static const int types[] = {LMS_TYPE_F32,  LMS_TYPE_F16,  LMS_TYPE_Q8_0,   LMS_TYPE_Q4_0,
                                LMS_TYPE_Q4_1, LMS_TYPE_Q4_K, LMS_TYPE_Q5_K,   LMS_TYPE_Q6_K,
                                LMS_TYPE_IQ4_NL, LMS_TYPE_IQ4_XS};
    const lms_kernel_table *k = lms_kernels_get();
    uint64_t seed = 0x1234567;
    int bad = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ni = 0; ni < sizeof toks / sizeof toks[0]; ni++) {
            const int type = types[ti];
            const int64_t n = 512, n_rows = 37 + 16 * (int64_t)ni;
            problem p;
            problem_init(&p, &seed, type, n, n_rows, toks[ni]);
            void *scratch = aligned_alloc(64, (lms_matmul_scratch(type, n, p.n_tok) + 63) / 64 * 64 + 64);
            float *y = malloc((size_t)(n_rows * p.n_tok) * sizeof *y);
            const lms_mat m = {p.w, type, n, n_rows, p.ldw};
            lms_matmul(&m, p.x, p.n_tok, y, scratch);
            bad += check_against_vec_dot(k, &p, y, (size_t)n_rows, "matmul");
            free(y);
            free(scratch);
            problem_deinit(&p);
        }
    assert_int_equal(bad, 0);
}

/* Three matrices of mixed types sharing x (the Q/K/V call). */
static void test_matmul_n(void **state)
{
    (void)state;
    const lms_kernel_table *k = lms_kernels_get();
    const int types[3] = {LMS_TYPE_Q4_K, LMS_TYPE_Q8_0, LMS_TYPE_Q6_K};
    const int64_t n = 256, rows[3] = {64, 19, 40};
    uint64_t seed = 99;
    int bad = 0;
    for (int64_t nt = 1; nt <= 40; nt += 13) {
        problem p[3];
        lms_mat m[3];
        const lms_mat *ws[3];
        float *ys[3];
        size_t scratch_bytes = 0;
        for (int i = 0; i < 3; i++) {
            problem_init(&p[i], &seed, types[i], n, rows[i], nt);
            if (i > 0)
                memcpy(p[i].x, p[0].x, (size_t)(n * nt) * sizeof(float));
            for (int64_t t = 0; t < nt; t++)
                lms_kernels_ref()->from_float[p[i].vt](p[i].x + t * n, p[i].xq + (size_t)t * p[i].ldx, n);
            m[i] = (lms_mat){p[i].w, types[i], n, rows[i], p[i].ldw};
            ws[i] = &m[i];
            ys[i] = malloc((size_t)(rows[i] * nt) * sizeof(float));
            scratch_bytes += lms_matmul_scratch(types[i], n, nt);
        }
        void *scratch = aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
        lms_matmul_n(ws, ys, 3, p[0].x, nt, scratch);
        for (int i = 0; i < 3; i++) {
            bad += check_against_vec_dot(k, &p[i], ys[i], (size_t)rows[i], "matmul_n");
            free(ys[i]);
            problem_deinit(&p[i]);
        }
        free(scratch);
    }
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_kernels),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_n),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
