/*
 * test_quantize_weights.c - the weight quantizers (kernels/quantize_weights.c).
 *
 * - RMS error of a round trip on Gaussian data for every type, printed, with
 *   bounds and the ordering the bit rates imply;
 * - the same relative error at other scales, zero and constant rows, and
 *   inputs that must not crash (NaN, inf, huge values);
 * - against llama.cpp: the shared synthetic models were quantized by
 *   llama-quantize from llama-synth-f32.gguf, so quantizing the same F32
 *   tensors here must give Q8_0 blocks identical byte for byte, and for
 *   Q4_0 and the K-quants an RMS error no worse than llama.cpp's (printed).
 *   Skipped when the test data is absent.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/kernels.h"
#include "kernels/quantize_weights.h"
#include "model/gguf.h"
#include "testutil.h"

#define N_GAUSS (256 * 1024)

static void gaussian(float *x, int64_t n, float sigma, uint64_t seed)
{
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = tu_rand_f32(&seed, 1e-7f, 1.0f), u2 = tu_rand_f32(&seed, 0.0f, 1.0f);
        double r = sqrt(-2.0 * log(u1)) * sigma;
        x[i] = (float)(r * cos(6.283185307179586 * u2));
        if (i + 1 < n)
            x[i + 1] = (float)(r * sin(6.283185307179586 * u2));
    }
}

static const struct {
    int type;
    double max_rms; /* bound for N(0, 1) data: 1.1 x what we measured */
} k_types[] = {
    {LMS_TYPE_Q8_0, 0.0059}, {LMS_TYPE_Q6_K, 0.0185}, {LMS_TYPE_Q5_1, 0.0370},
    {LMS_TYPE_Q5_0, 0.0440}, {LMS_TYPE_Q5_K, 0.0380}, {LMS_TYPE_Q4_1, 0.0760},
    {LMS_TYPE_Q4_0, 0.0890}, {LMS_TYPE_Q4_K, 0.0770}, {LMS_TYPE_Q3_K, 0.1580},
    {LMS_TYPE_Q2_K, 0.2890},
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static double rms_of(int type, const float *x, int64_t n)
{
    double rms = -1.0;
    assert_int_equal(lms_quantize_rms_error(type, x, n, &rms), LMS_OK);
    return rms;
}

static void test_rms_gaussian(void **state)
{
    (void)state;
    float *x = malloc(N_GAUSS * sizeof *x);
    double rms[LMS_TYPE_COUNT] = {0};
    assert_non_null(x);
    gaussian(x, N_GAUSS, 1.0f, 42);
    print_message("RMS error of quantize -> dequantize, N(0, 1), %d values:\n", N_GAUSS);
    for (size_t i = 0; i < N_TYPES; i++) {
        const lms_type_traits *tt = lms_type_get(k_types[i].type);
        rms[k_types[i].type] = rms_of(k_types[i].type, x, N_GAUSS);
        print_message("  %-5s %5.2f bits/weight  rms %.5f\n", tt->name,
                      8.0 * (double)tt->type_size / (double)tt->blck_size, rms[k_types[i].type]);
        assert_true(rms[k_types[i].type] < k_types[i].max_rms);
    }
    /* More bits, less error. */
    static const int order[] = {LMS_TYPE_Q2_K, LMS_TYPE_Q3_K, LMS_TYPE_Q4_K,
                                LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, LMS_TYPE_Q8_0};
    for (size_t i = 0; i + 1 < sizeof order / sizeof order[0]; i++)
        assert_true(rms[order[i]] > rms[order[i + 1]]);
    assert_true(rms[LMS_TYPE_Q4_0] > rms[LMS_TYPE_Q4_1]);
    assert_true(rms[LMS_TYPE_Q4_1] > rms[LMS_TYPE_Q5_1]);
    assert_true(rms[LMS_TYPE_Q4_0] > rms[LMS_TYPE_Q5_0]);
    assert_true(rms[LMS_TYPE_Q5_0] > rms[LMS_TYPE_Q5_1]);
    free(x);
}

/* The relative error does not depend on the scale of the data, within the
 * range where the f16 block scales stay normal numbers. */
static void test_rms_scale_invariant(void **state)
{
    (void)state;
    const int64_t n = 16 * 1024;
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < N_TYPES; i++) {
        gaussian(x, n, 1.0f, 7);
        const double base = rms_of(k_types[i].type, x, n);
        for (int k = 0; k < 2; k++) {
            const float sigma = k ? 50.0f : 0.05f;
            gaussian(x, n, sigma, 7);
            const double r = rms_of(k_types[i].type, x, n) / sigma;
            assert_true(r < base * 1.05 && r > base * 0.95);
        }
    }
    free(x);
}

static void test_zero_and_constant_rows(void **state)
{
    (void)state;
    float x[512], y[512];
    uint8_t q[2 * 292];
    for (size_t i = 0; i < N_TYPES; i++) {
        const int type = k_types[i].type;
        memset(x, 0, sizeof x);
        assert_int_equal(lms_quantize_row(type, x, q, 512), LMS_OK);
        lms_kernels_ref()->to_float[type](q, y, 512);
        for (int j = 0; j < 512; j++)
            assert_true(y[j] == 0.0f);
        for (int j = 0; j < 512; j++)
            x[j] = j < 256 ? 0.3f : -7.0f;
        assert_true(rms_of(type, x, 512) < 0.004 * 7.0);
    }
}

/* NaN, infinities and values whose scales overflow f16 must not crash (run
 * this under the sanitizer build); finite huge values give finite output. */
static void test_hostile_inputs(void **state)
{
    (void)state;
    float x[512], y[512];
    uint8_t q[2 * 292];
    uint64_t seed = 3;
    for (size_t i = 0; i < N_TYPES; i++) {
        const int type = k_types[i].type;
        for (int j = 0; j < 512; j++)
            x[j] = tu_rand_f32(&seed, -1.0f, 1.0f);
        x[3] = NAN;
        x[40] = INFINITY;
        x[300] = -INFINITY;
        x[301] = 3e38f;
        assert_int_equal(lms_quantize_row(type, x, q, 512), LMS_OK);
        for (int j = 0; j < 512; j++)
            x[j] = tu_rand_f32(&seed, -1e6f, 1e6f);
        assert_int_equal(lms_quantize_row(type, x, q, 512), LMS_OK);
        lms_kernels_ref()->to_float[type](q, y, 512);
        for (int j = 0; j < 512; j++)
            assert_true(isfinite(y[j]));
    }
}

static void test_api_errors(void **state)
{
    (void)state;
    float x[64] = {0};
    uint8_t q[64 * 4];
    double rms;
    assert_true(lms_quantize_supported(LMS_TYPE_Q4_K));
    assert_true(lms_quantize_supported(LMS_TYPE_F16));
    assert_false(lms_quantize_supported(LMS_TYPE_Q8_K));
    assert_false(lms_quantize_supported(LMS_TYPE_Q8_1));
    assert_false(lms_quantize_supported(LMS_TYPE_I32));
    assert_false(lms_quantize_supported(-1));
    assert_int_equal(lms_quantize_row(LMS_TYPE_Q8_K, x, q, 256), LMS_ERR_UNSUPPORTED);
    assert_int_equal(lms_quantize_row(LMS_TYPE_Q4_0, x, q, 33), LMS_ERR_INVAL);
    assert_int_equal(lms_quantize_row(LMS_TYPE_Q4_0, x, q, -32), LMS_ERR_INVAL);
    assert_int_equal(lms_quantize_row(LMS_TYPE_F16, x, q, 64), LMS_OK);
    assert_int_equal(lms_quantize_rms_error(LMS_TYPE_Q4_0, x, 0, &rms), LMS_ERR_INVAL);
    assert_int_equal(lms_quantize_rms_error(LMS_TYPE_Q4_K, x, 64, &rms), LMS_ERR_INVAL);
    assert_int_equal(lms_quantize_rms_error(LMS_TYPE_Q8_1, x, 64, &rms), LMS_ERR_UNSUPPORTED);
    /* The scalar table's from_float for weight types is the quantizer. */
    assert_ptr_equal(lms_kernels_ref()->from_float[LMS_TYPE_Q4_K], lms_quantize_row_q4_K);
    assert_ptr_equal(lms_kernels_ref()->from_float[LMS_TYPE_Q2_K], lms_quantize_row_q2_K);
}

/* ---- against llama.cpp's quantizations of the shared models ----------------------- */

typedef struct cmp_stats {
    double se_llama, se_ours, ss;
    int64_t n, rows, rows_identical;
} cmp_stats;

/* Quantizes every row of `src` (F32) into `type` and compares with llama's
 * tensor `q` of that type. */
static void compare_tensor(const gguf_tensor *src, const gguf_tensor *q, int type, cmp_stats *st)
{
    const int64_t ne0 = src->ne[0], rows = src->n_bytes / (size_t)ne0 / sizeof(float);
    const size_t row_bytes = lms_row_size(type, ne0);
    uint8_t *ours = malloc(row_bytes);
    float *back_llama = malloc((size_t)ne0 * sizeof(float));
    float *back_ours = malloc((size_t)ne0 * sizeof(float));
    assert_true(ours && back_llama && back_ours);
    assert_int_equal(q->n_bytes, row_bytes * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        const float *x = (const float *)src->data + r * ne0;
        const uint8_t *theirs = (const uint8_t *)q->data + (size_t)r * row_bytes;
        assert_int_equal(lms_quantize_row(type, x, ours, ne0), LMS_OK);
        lms_kernels_ref()->to_float[type](theirs, back_llama, ne0);
        lms_kernels_ref()->to_float[type](ours, back_ours, ne0);
        for (int64_t i = 0; i < ne0; i++) {
            st->se_llama += ((double)back_llama[i] - x[i]) * ((double)back_llama[i] - x[i]);
            st->se_ours += ((double)back_ours[i] - x[i]) * ((double)back_ours[i] - x[i]);
            st->ss += (double)x[i] * x[i];
        }
        st->n += ne0;
        st->rows++;
        st->rows_identical += memcmp(ours, theirs, row_bytes) == 0;
    }
    free(ours), free(back_llama), free(back_ours);
}

static void compare_file(const char *f32_name, const char *q_name, int type, cmp_stats *st)
{
    char err[256];
    gguf_file *base = NULL, *qf = NULL;
    memset(st, 0, sizeof *st);
    if (gguf_open(tu_data_path(f32_name), &base, err, sizeof err) < 0 ||
        gguf_open(tu_data_path(q_name), &qf, err, sizeof err) < 0) {
        gguf_close(base);
        print_message("skipping %s: %s\n", q_name, err);
        return;
    }
    for (uint64_t i = 0; i < qf->n_tensors; i++) {
        const gguf_tensor *q = &qf->tensors[i];
        const gguf_tensor *src = gguf_find_tensor(base, q->name.p);
        if (q->type != type || !src || src->type != LMS_TYPE_F32)
            continue;
        compare_tensor(src, q, type, st);
    }
    gguf_close(qf);
    gguf_close(base);
}

static void test_vs_llama_cpp(void **state)
{
    (void)state;
    static const struct {
        const char *base, *quant;
        int type;
    } cases[] = {
        {"models/llama-synth-f32.gguf", "models/llama-synth-q8_0.gguf", LMS_TYPE_Q8_0},
        {"models/stories260K.gguf", "models/stories260K-q8_0.gguf", LMS_TYPE_Q8_0},
        {"models/llama-synth-f32.gguf", "models/llama-synth-q4_0.gguf", LMS_TYPE_Q4_0},
        {"models/llama-synth-f32.gguf", "models/llama-synth-q4_k_m.gguf", LMS_TYPE_Q4_K},
        {"models/llama-synth-f32.gguf", "models/llama-synth-q5_k_m.gguf", LMS_TYPE_Q5_K},
        {"models/llama-synth-f32.gguf", "models/llama-synth-q6_k.gguf", LMS_TYPE_Q6_K},
        {"models/llama-synth-f32.gguf", "models/llama-synth-q4_k_m.gguf", LMS_TYPE_Q6_K},
    };
    int n_done = 0;
    print_message("RMS error relative to the weights' RMS, same F32 tensors:\n");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cmp_stats st;
        compare_file(cases[c].base, cases[c].quant, cases[c].type, &st);
        if (!st.n)
            continue;
        n_done++;
        const double llama = sqrt(st.se_llama / st.ss), ours = sqrt(st.se_ours / st.ss);
        print_message("  %-28s %-5s llama.cpp %.5f  lmserv %.5f  (%.3fx)  identical rows "
                      "%lld/%lld\n", cases[c].quant + 7, lms_type_get(cases[c].type)->name,
                      llama, ours, ours / llama, (long long)st.rows_identical,
                      (long long)st.rows);
        if (cases[c].type == LMS_TYPE_Q8_0)
            assert_int_equal(st.rows_identical, st.rows);
        else
            assert_true(ours <= llama * 1.001);
    }
    if (!n_done)
        skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rms_gaussian),
        cmocka_unit_test(test_rms_scale_invariant),
        cmocka_unit_test(test_zero_and_constant_rows),
        cmocka_unit_test(test_hostile_inputs),
        cmocka_unit_test(test_api_errors),
        cmocka_unit_test(test_vs_llama_cpp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
