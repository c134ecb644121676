/*
 * test_kv_prefault.c - the KV pool's background pre-fault (kv_cache.c):
 * a pool larger than the part faulted in at reservation ends up resident
 * (mincore) without a row written; rows written meanwhile keep their
 * contents; a pool torn down while the thread runs stops it at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#include "engine/kv_cache.h"
#include "kernels/kernels.h"
#include "testutil.h"

/* 4 layers of f16 rows of 1024 values: 32 MiB a layer's region, 256 MiB */
#define N_LAYER 4
#define N_DIM 1024
#define N_BLOCKS 1024

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
static bool resident(const uint8_t *p)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char v = 0;
    void *a = (void *)((uintptr_t)p & ~(uintptr_t)(page - 1));
    return mincore(a, 1, &v) == 0 && (v & 1);
}
#endif

static void test_background(void **state)
{
    (void)state;
    lms_kv_cache c;
    assert_int_equal(lms_kv_cache_init(&c, N_LAYER, N_DIM, N_BLOCKS, LMS_TYPE_F16), 0);
    /* a row written while the thread runs: its bytes stay */
    uint8_t *row = c.k + 3 * c.layer_stride + c.layer_stride / 2;
    memset(row, 0x5a, c.row_bytes);
    const double t0 = now_s();
    while (lms_kv_prefault_busy(&c) && now_s() - t0 < 30)
        usleep(10000);
    assert_false(lms_kv_prefault_busy(&c));
    for (size_t i = 0; i < c.row_bytes; i++)
        assert_int_equal(row[i], 0x5a);
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    /* where the kernel has MADV_POPULATE_WRITE (5.14+), every region's end
     * (the last block, never written) is resident */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *probe = aligned_alloc(page, page);
    const bool has_populate = probe && madvise(probe, page, MADV_POPULATE_WRITE) == 0;
    free(probe);
    for (int il = 0; has_populate && il < N_LAYER; il++) {
        assert_true(resident(c.k + (size_t)il * c.layer_stride + c.layer_stride - 1));
        assert_true(resident(c.v + (size_t)il * c.layer_stride + c.layer_stride - 1));
    }
    printf("pre-fault of %zu MiB: %.0f ms%s\n", 2 * N_LAYER * c.layer_stride >> 20,
           (now_s() - t0) * 1e3, has_populate ? "" : " (no MADV_POPULATE_WRITE: not checked)");
#endif
    lms_kv_cache_deinit(&c);
}

static void test_teardown_while_running(void **state)
{
    (void)state;
    lms_kv_cache c;
    assert_int_equal(lms_kv_cache_init(&c, N_LAYER, N_DIM, N_BLOCKS, LMS_TYPE_F16), 0);
    lms_kv_cache_deinit(&c); /* stops and joins the thread after its current round */
    assert_null(c.k);
    assert_null(c.bg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_background),
        cmocka_unit_test(test_teardown_while_running),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
