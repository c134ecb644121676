/*
 * test_matmul_decode.c - the decode (one token) schedule of lms_matmul_n:
 * rows of mixed-type matrices cut into jobs of about equal bytes, one
 * segment of jobs per thread, the rest taken by whichever thread is free.
 * Every row must match vec_dot, and the result must not depend on the
 * thread count (job bounds follow the shapes only), so that batching and
 * thread settings never change logits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/kernels.h"
#include "kernels/matmul.h"
#include "kernels/quantize_weights.h"
#include "testutil.h"

#define N_COLS 512
#define N_MATS 3

typedef struct mat_data {
    int type;
    int64_t n_rows;
    void *w;
    size_t row_bytes;
} mat_data;

static void mat_init(mat_data *m, int type, int64_t n_rows, uint64_t *seed)
{
    float row[N_COLS];
    m->type = type;
    m->n_rows = n_rows;
    m->row_bytes = lms_row_size(type, N_COLS);
    m->w = malloc(m->row_bytes * (size_t)n_rows);
    assert_non_null(m->w);
    for (int64_t r = 0; r < n_rows; r++) {
        for (int i = 0; i < N_COLS; i++)
            row[i] = tu_rand_f32(seed, -1.0f, 1.0f);
        assert_int_equal(lms_quantize_row(type, row, (uint8_t *)m->w + (size_t)r * m->row_bytes,
                                          N_COLS),
                         0);
    }
}

/* Row r of m against x through vec_dot (x converted to its vec_dot type). */
static float ref_row(const mat_data *m, const float *x, int64_t r)
{
    const lms_kernel_table *k = lms_kernels_get();
    const int vt = lms_type_get(m->type)->vec_dot_type;
    _Alignas(64) uint8_t xq[N_COLS * 4 + 256];
    const void *xp = x;
    if (vt != LMS_TYPE_F32) {
        k->from_float[vt](x, xq, N_COLS);
        xp = xq;
    }
    float y;
    k->vec_dot[m->type](N_COLS, &y, (const uint8_t *)m->w + (size_t)r * m->row_bytes, xp);
    return y;
}

static void run(const mat_data *md, int n, const float *x, float *const *ys, int n_threads)
{
    lms_mat mats[N_MATS];
    const lms_mat *ws[N_MATS];
    size_t scratch_bytes = 0;
    for (int i = 0; i < n; i++) {
        mats[i] = (lms_mat){md[i].w, md[i].type, N_COLS, md[i].n_rows, md[i].row_bytes};
        ws[i] = &mats[i];
        scratch_bytes += lms_matmul_scratch(md[i].type, N_COLS, 1);
    }
    void *scratch = aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
    assert_non_null(scratch);
#ifdef _OPENMP
    omp_set_num_threads(n_threads);
#else
    (void)n_threads;
#endif
    lms_matmul_n(ws, ys, n, x, 1, scratch);
    free(scratch);
}

/* Q/K/V-like call of three types, row counts off the job and gemv row
 * multiples; 1..5 threads give the same bits, and vec_dot's values. */
static void test_decode_mixed_types(void **state)
{
    (void)state;
    static const int types[N_MATS] = {LMS_TYPE_Q4_K, LMS_TYPE_Q8_0, LMS_TYPE_Q6_K};
    static const int64_t rows[N_MATS] = {1203, 333, 901};
    uint64_t seed = 0xdec0de;
    mat_data md[N_MATS];
    float x[N_COLS];
    for (int i = 0; i < N_MATS; i++)
        mat_init(&md[i], types[i], rows[i], &seed);
    for (int i = 0; i < N_COLS; i++)
        x[i] = tu_rand_f32(&seed, -2.0f, 2.0f);
    float *first[N_MATS], *ys[N_MATS];
    for (int i = 0; i < N_MATS; i++) {
        first[i] = malloc((size_t)rows[i] * sizeof(float));
        ys[i] = malloc((size_t)rows[i] * sizeof(float));
        assert_non_null(first[i]);
        assert_non_null(ys[i]);
    }
    run(md, N_MATS, x, first, 1);
    int bad = 0;
    for (int i = 0; i < N_MATS; i++)
        for (int64_t r = 0; r < rows[i]; r++) {
            const float want = ref_row(&md[i], x, r);
            if (!(fabsf(first[i][r] - want) <= 1e-4f * (1.0f + fabsf(want))) && bad++ < 5)
                fprintf(stderr, "matrix %d row %lld: %g, vec_dot %g\n", i, (long long)r,
                        (double)first[i][r], (double)want);
        }
    assert_int_equal(bad, 0);
    for (int nt = 2; nt <= 5; nt++) {
        for (int rep = 0; rep < 3; rep++) {
            for (int i = 0; i < N_MATS; i++)
                memset(ys[i], 0xff, (size_t)rows[i] * sizeof(float)); /* NaNs: rows left out show */
            run(md, N_MATS, x, ys, nt);
            for (int i = 0; i < N_MATS; i++)
                assert_memory_equal(ys[i], first[i], (size_t)rows[i] * sizeof(float));
        }
    }
    for (int i = 0; i < N_MATS; i++) {
        free(md[i].w);
        free(first[i]);
        free(ys[i]);
    }
}

/* One matrix, fewer rows than a job, and one of many jobs. */
static void test_decode_shapes(void **state)
{
    (void)state;
    static const int64_t rows[] = {1, 17, 130, 4099};
    uint64_t seed = 77;
    float x[N_COLS];
    for (int i = 0; i < N_COLS; i++)
        x[i] = tu_rand_f32(&seed, -2.0f, 2.0f);
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        mat_data md;
        mat_init(&md, LMS_TYPE_Q4_K, rows[k], &seed);
        float *a = malloc((size_t)rows[k] * sizeof(float));
        float *b = malloc((size_t)rows[k] * sizeof(float));
        assert_non_null(a);
        assert_non_null(b);
        run(&md, 1, x, &a, 1);
        run(&md, 1, x, &b, 2);
        assert_memory_equal(a, b, (size_t)rows[k] * sizeof(float));
        for (int64_t r = 0; r < rows[k]; r++) {
            const float want = ref_row(&md, x, r);
            assert_true(fabsf(a[r] - want) <= 1e-4f * (1.0f + fabsf(want)));
        }
        free(a);
        free(b);
        free(md.w);
    }
}

int main(void)
{
#ifndef _OPENMP
    fprintf(stderr, "test_matmul_decode: built without OpenMP (one thread only)\n");
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_mixed_types),
        cmocka_unit_test(test_decode_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
