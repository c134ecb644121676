/*
 * test_kernels_dispatch.c - the choice of kernel table (kernels.c).
 *
 * Runs with LMS_ISA set to a name no build has, so the dispatcher must warn
 * and fall back to the best table for this CPU; every entry a supported
 * type needs must be present; concurrent first calls agree.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels.h"
#include "kernels/kernels_impl.h"
#include "testutil.h"

static void *get_table(void *arg)
{
    (void)arg;
    return (void *)lms_kernels_get();
}

static void test_concurrent_first_call(void **state)
{
    (void)state;
    pthread_t th[8];
    void *got[8];
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_create(&th[i], NULL, get_table, NULL), 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_join(th[i], &got[i]), 0);
    for (int i = 1; i < 8; i++)
        assert_ptr_equal(got[i], got[0]);
    assert_ptr_equal(got[0], lms_kernels_get());
}

/* Every type with a vec_dot type needs its dot product, the conversion of
 * activations to that type, and a dequantizer; so does every activation
 * type. */
static void expect_complete(const lms_kernel_table *k)
{
    for (int t = 0; t < LMS_TYPE_COUNT; t++) {
        const lms_type_traits *tt = lms_type_get(t);
        if (!tt || tt->vec_dot_type < 0)
            continue;
        assert_non_null(k->vec_dot[t]);
        assert_non_null(k->to_float[t]);
        assert_non_null(k->from_float[t]);
        assert_non_null(k->from_float[tt->vec_dot_type]);
        assert_non_null(k->to_float[tt->vec_dot_type]);
    }
}

static void test_tables_complete(void **state)
{
    (void)state;
    expect_complete(lms_kernels_ref());
    expect_complete(lms_kernels_get());
    assert_string_equal(lms_kernels_ref()->isa, "scalar");
}

static void test_bogus_isa_falls_back(void **state)
{
    (void)state;
    const lms_kernel_table *k = lms_kernels_get();
    assert_non_null(k);
    /* The default is the first registered ISA the CPU has. */
    assert_ptr_equal(k, lms_kernels_for_isa(k->isa));
    assert_null(lms_kernels_for_isa("no-such-isa"));
    assert_null(lms_kernels_for_isa(NULL));
}

static void test_scalar_table_by_name(void **state)
{
    (void)state;
    const lms_kernel_table *s = lms_kernels_for_isa("scalar");
    assert_non_null(s);
    assert_ptr_equal(lms_kernels_for_isa("SCALAR"), s);
    assert_memory_equal(s->vec_dot, lms_kernels_ref()->vec_dot, sizeof s->vec_dot);
    assert_memory_equal(s->to_float, lms_kernels_ref()->to_float, sizeof s->to_float);
    assert_memory_equal(s->from_float, lms_kernels_ref()->from_float, sizeof s->from_float);
    assert_ptr_equal(s->vec_dot[LMS_TYPE_Q4_K], lms_vec_dot_q4_K_q8_K_ref);
}

int main(void)
{
    setenv("LMS_ISA", "no-such-isa", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_first_call),
        cmocka_unit_test(test_tables_complete),
        cmocka_unit_test(test_bogus_isa_falls_back),
        cmocka_unit_test(test_scalar_table_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
