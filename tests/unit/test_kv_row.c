/*
 * test_kv_row.c - the KV cache's row writers (kv_cache.c,
 * lms_kv_row_writer): f16 and q8_0 are the kernels' converters; q4_0's own
 * round-to-nearest writer is checked here against its rule, decoded by the
 * reference q4_0 converter: the block's value of largest magnitude comes
 * back exactly (code 0, d = m / -8 in f16), every value within half a step
 * (|d| / 2) or, past code 15, within a step; zero blocks and NaN give
 * finite codes. A q4_0 cache's tiled K (lms_kv_put_k): every position's
 * blocks read back (lms_kv_tile_get) as the writer made them, and a write
 * touches no other position's bytes.
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

static void test_q4_0_tiles(void **state)
{
    (void)state;
    enum { LAYERS = 2, DIM = 128, POS = 40 }; /* three blocks, the last partial */
    lms_kv_cache c;
    lms_kv_seq seq = {0};
    assert_int_equal(lms_kv_cache_init(&c, LAYERS, DIM, 8, LMS_TYPE_Q4_0), 0);
    assert_true(lms_kv_k_tiled(c.type));
    assert_int_equal(lms_kv_seq_reserve(&c, &seq, POS), 0);
    const lms_from_float_fn w = lms_kv_row_writer(LMS_TYPE_Q4_0);
    const size_t pool = (size_t)LAYERS * c.layer_stride;
    uint8_t *before = malloc(pool);
    float x[DIM];
    uint32_t r = 7;
    for (int il = 0; il < LAYERS; il++)
        for (int32_t p = 0; p < POS; p++) {
            for (int i = 0; i < DIM; i++) {
                r = r * 1664525u + 1013904223u;
                x[i] = (float)(int32_t)r / 2147483648.0f * (float)(p % 5 + 1);
            }
            memcpy(before, c.k, pool);
            lms_kv_put_k(&c, &seq, il, p, x);
            /* the bytes that changed are this position's: its scale and words */
            const uint8_t *blk = lms_kv_k_block(&c, &seq, il, p);
            for (size_t o = 0; o < pool; o++) {
                if (c.k[o] == before[o])
                    continue;
                const ptrdiff_t in = c.k + o - blk;
                assert_true(in >= 0 && in < (ptrdiff_t)(LMS_KV_BLOCK * c.row_bytes));
                const size_t t = (size_t)in % LMS_KV_Q4_TILE, slot = p % LMS_KV_BLOCK;
                assert_true(t / 2 == slot || (t >= 32 && (t - 32) % 64 / 4 == slot));
            }
            lms_block_q4_0 want[DIM / 32], got;
            w(x, want, DIM);
            for (int g = 0; g < DIM / 32; g++) {
                lms_kv_tile_get(blk, p % LMS_KV_BLOCK, g, &got);
                assert_memory_equal(&got, &want[g], sizeof got);
            }
        }
    free(before);
    lms_kv_seq_release(&c, &seq);
    lms_kv_cache_deinit(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4_0_rule),
        cmocka_unit_test(test_same_converters),
        cmocka_unit_test(test_q4_0_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
