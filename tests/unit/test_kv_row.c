/*
 * test_kv_row.c - the KV cache's row writers (kv_cache.c,
 * lms_kv_row_writer): f16 and q8_0 are the kernels' converters; q4_0's own
 * round-to-nearest writer is checked here against its rule, decoded by the
 * reference q4_0 converter: the block's value of largest magnitude comes
 * back exactly (code 0, d = m / -8 in f16), every value within half a step
 * (|d| / 2) or, past code 15, within a step; zero blocks and NaN give
 * finite codes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache.h"
#include "kernels/kernels.h"
#include "testutil.h"

#define N 256

static void test_q4_0_rule(void **state)
{
    (void)state;
    const lms_from_float_fn w = lms_kv_row_writer(LMS_TYPE_Q4_0);
    const lms_to_float_fn dec = lms_kernels_ref()->to_float[LMS_TYPE_Q4_0];
    float x[N], y[N];
    lms_block_q4_0 q[N / 32];
    uint32_t s = 99;
    for (int rep = 0; rep < 200; rep++) {
        for (int i = 0; i < N; i++) {
            s = s * 1664525u + 1013904223u;
            x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (rep % 7 + 0.01f);
        }
        if (rep % 5 == 0)
            x[rep % N] *= 40.0f; /* an outlier */
        w(x, q, N);
        dec(q, y, N);
        for (int b = 0; b < N / 32; b++) {
            float m = 0.0f;
            for (int i = 0; i < 32; i++)
                m = fabsf(x[b * 32 + i]) > fabsf(m) ? x[b * 32 + i] : m;
            /* a step is |d|; d's f16 rounding moves a code's value by at
             * most 8 * 2^-11 of a step */
            const float step = fabsf(m) / 8.0f;
            for (int i = 0; i < 32; i++) {
                const float xi = x[b * 32 + i], e = fabsf(y[b * 32 + i] - xi);
                const bool past_15 = xi / (m / -8.0f) + 8.0f > 15.5f;
                if (xi == m)
                    assert_true(e <= fabsf(m) * 1e-3f);
                else
                    assert_true(e <= step * (past_15 ? 1.005f : 0.505f));
            }
        }
    }
    /* zeros and a NaN: finite codes, zeros decode to zeros */
    memset(x, 0, sizeof x);
    w(x, q, N);
    dec(q, y, N);
    for (int i = 0; i < N; i++)
        assert_true(y[i] == 0.0f);
    x[3] = NAN;
    w(x, q, N);
    dec(q, y, N);
    for (int i = 32; i < N; i++)
        assert_true(y[i] == 0.0f);
}

static void test_same_converters(void **state)
{
    (void)state;
    const int types[] = {LMS_TYPE_F16, LMS_TYPE_Q8_0};
    for (int t = 0; t < 2; t++)
        assert_ptr_equal(lms_kv_row_writer(types[t]), lms_kernels_get()->from_float[types[t]]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4_0_rule),
        cmocka_unit_test(test_same_converters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
