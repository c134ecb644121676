/*
 * test_thermal.c - the thermal protection state machine: every transition
 * of the table in thermal.h, hysteresis (no flapping around a limit), the
 * outputs per state, parameter checks, time-in-state counters, the change
 * callback, and the return to NORMAL when readings stop.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/err.h"
#include "ops/log.h"
#include "ops/thermal.h"
#include "testutil.h"

static lms_thermal_params defaults(void)
{
    lms_thermal_params p;
    lms_thermal_params_default(&p, 80.0);
    return p;
}

static void test_defaults_and_checks(void **state)
{
    lms_thermal_params p = defaults();
    assert_true(p.limit_c == 80 && p.hard_limit_c == 90 && p.resume_c == 75 &&
                p.hard_resume_c == 85);
    assert_int_equal(lms_thermal_params_check(&p), LMS_OK);

    lms_thermal_params bad = p;
    bad.resume_c = 80; /* resume must be under the limit */
    assert_int_equal(lms_thermal_params_check(&bad), LMS_ERR_INVAL);
    bad = p;
    bad.hard_limit_c = 79;
    assert_int_equal(lms_thermal_params_check(&bad), LMS_ERR_INVAL);
    bad = p;
    bad.slow_token_factor = 0;
    assert_int_equal(lms_thermal_params_check(&bad), LMS_ERR_INVAL);
    bad = p;
    bad.limit_c = NAN;
    assert_int_equal(lms_thermal_params_check(&bad), LMS_ERR_INVAL);
    assert_null(lms_thermal_create(&bad, NULL, NULL));
}

static void test_transition_table(void **state)
{
    const lms_thermal_params p = defaults();
    static const struct {
        lms_thermal_state from;
        double t;
        lms_thermal_state to;
    } cases[] = {
        {LMS_THERMAL_NORMAL, 79.9, LMS_THERMAL_NORMAL},
        {LMS_THERMAL_NORMAL, 80.0, LMS_THERMAL_SLOW},
        {LMS_THERMAL_NORMAL, 95.0, LMS_THERMAL_PAUSED},
        {LMS_THERMAL_SLOW, 89.9, LMS_THERMAL_SLOW},
        {LMS_THERMAL_SLOW, 78.0, LMS_THERMAL_SLOW}, /* under the limit, above resume */
        {LMS_THERMAL_SLOW, 75.0, LMS_THERMAL_SLOW},
        {LMS_THERMAL_SLOW, 74.9, LMS_THERMAL_NORMAL},
        {LMS_THERMAL_SLOW, 90.0, LMS_THERMAL_PAUSED},
        {LMS_THERMAL_PAUSED, 89.0, LMS_THERMAL_PAUSED}, /* under hard, above hard_resume */
        {LMS_THERMAL_PAUSED, 85.0, LMS_THERMAL_PAUSED},
        {LMS_THERMAL_PAUSED, 84.9, LMS_THERMAL_SLOW},
        {LMS_THERMAL_PAUSED, 74.0, LMS_THERMAL_NORMAL},
        {LMS_THERMAL_PAUSED, NAN, LMS_THERMAL_PAUSED},
        {LMS_THERMAL_SLOW, NAN, LMS_THERMAL_SLOW},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lms_thermal_state got = lms_thermal_next(&p, cases[i].from, cases[i].t);
        if (got != cases[i].to)
            fail_msg("case %zu: %s at %.1f -> %s, want %s", i,
                     lms_thermal_state_name(cases[i].from), cases[i].t, lms_thermal_state_name(got),
                     lms_thermal_state_name(cases[i].to));
    }
}

static void test_outputs(void **state)
{
    const lms_thermal_params p = defaults();
    lms_thermal_out o;
    lms_thermal_outputs(&p, LMS_THERMAL_NORMAL, 85, &o);
    assert_int_equal(o.step_delay_ms, 0);
    assert_true(o.token_factor == 1.0);
    lms_thermal_outputs(&p, LMS_THERMAL_SLOW, 80, &o);
    assert_int_equal(o.step_delay_ms, 20);
    assert_true(o.token_factor == 0.5);
    lms_thermal_outputs(&p, LMS_THERMAL_SLOW, 85, &o); /* halfway: 20 + 90 */
    assert_int_equal(o.step_delay_ms, 110);
    lms_thermal_outputs(&p, LMS_THERMAL_SLOW, 77, &o); /* hysteresis band: the minimum */
    assert_int_equal(o.step_delay_ms, 20);
    lms_thermal_outputs(&p, LMS_THERMAL_SLOW, 99, &o);
    assert_int_equal(o.step_delay_ms, 200);
    lms_thermal_outputs(&p, LMS_THERMAL_PAUSED, 91, &o);
    assert_int_equal(o.step_delay_ms, 1000);
    assert_true(o.token_factor == 0.0);
    assert_string_equal(lms_thermal_state_name(LMS_THERMAL_PAUSED), "paused");
}

struct changes {
    int n;
    lms_thermal_state from[16], to[16];
};

static void on_change(void *ud, lms_thermal_state from, lms_thermal_state to, double temp_c)
{
    struct changes *c = ud;
    if (c->n < 16) {
        c->from[c->n] = from;
        c->to[c->n] = to;
    }
    c->n++;
}

static void test_no_flapping(void **state)
{
    struct changes ch = {0};
    lms_thermal *t = lms_thermal_create(NULL, on_change, &ch);
    assert_non_null(t);
    /* Hovering around the limit enters SLOW once and stays there. */
    static const double temps[] = {79, 81, 79, 81, 78, 80, 76, 79, 75};
    for (size_t i = 0; i < sizeof temps / sizeof temps[0]; i++)
        lms_thermal_update(t, temps[i], 1000.0 * (double)i);
    assert_int_equal(ch.n, 1);
    assert_int_equal(ch.to[0], LMS_THERMAL_SLOW);
    assert_int_equal(lms_thermal_update(t, 74, 9000), LMS_THERMAL_NORMAL);
    assert_int_equal(ch.n, 2);
    lms_thermal_out o;
    lms_thermal_get(t, &o);
    assert_int_equal(o.n_changes, 2);
    assert_true(o.temp_c == 74);
    assert_true(fabs(o.slow_ms - 8000) < 1e-9); /* SLOW from t=1000 to t=9000 */
    lms_thermal_destroy(t);
}

static void test_pause_and_resume(void **state)
{
    struct changes ch = {0};
    lms_thermal *t = lms_thermal_create(NULL, on_change, &ch);
    assert_int_equal(lms_thermal_update(t, 92, 0), LMS_THERMAL_PAUSED);
    assert_int_equal(lms_thermal_update(t, 86, 500), LMS_THERMAL_PAUSED);
    assert_int_equal(lms_thermal_update(t, 84, 1500), LMS_THERMAL_SLOW);
    assert_int_equal(lms_thermal_update(t, 91, 2000), LMS_THERMAL_PAUSED);
    assert_int_equal(lms_thermal_update(t, 60, 3000), LMS_THERMAL_NORMAL);
    assert_int_equal(ch.n, 4);
    assert_int_equal(ch.from[0], LMS_THERMAL_NORMAL);
    assert_int_equal(ch.to[0], LMS_THERMAL_PAUSED);
    assert_int_equal(ch.to[1], LMS_THERMAL_SLOW);
    assert_int_equal(ch.to[2], LMS_THERMAL_PAUSED);
    assert_int_equal(ch.to[3], LMS_THERMAL_NORMAL);
    lms_thermal_out o;
    lms_thermal_get(t, &o);
    assert_true(fabs(o.paused_ms - 2500) < 1e-9 && fabs(o.slow_ms - 500) < 1e-9);
    lms_thermal_destroy(t);
}

static void test_stale_readings(void **state)
{
    struct changes ch = {0};
    lms_thermal *t = lms_thermal_create(NULL, on_change, &ch);
    lms_thermal_update(t, NAN, 0); /* no reading at all: stays NORMAL quietly */
    assert_int_equal(ch.n, 0);
    assert_int_equal(lms_thermal_update(t, 85, 1000), LMS_THERMAL_SLOW);
    assert_int_equal(lms_thermal_update(t, NAN, 5000), LMS_THERMAL_SLOW);
    assert_int_equal(lms_thermal_update(t, NAN, 10999), LMS_THERMAL_SLOW);
    assert_int_equal(lms_thermal_update(t, NAN, 11000), LMS_THERMAL_NORMAL); /* blind 10 s */
    lms_thermal_out o;
    lms_thermal_get(t, &o);
    assert_true(isnan(o.temp_c));
    assert_int_equal(ch.n, 2);
    assert_int_equal(lms_thermal_update(t, 95, 12000), LMS_THERMAL_PAUSED);
    lms_thermal_destroy(t);
}

/* Scheduler threads read while the I/O thread updates: outputs are always
 * one of the consistent (state, delay, factor) triples. */
static lms_thermal *shared;
static atomic_int stop_readers;

static void *reader(void *arg)
{
    int *bad = arg;
    while (!atomic_load(&stop_readers)) {
        lms_thermal_out o;
        lms_thermal_get(shared, &o);
        if ((o.state == LMS_THERMAL_NORMAL) != (o.token_factor == 1.0) ||
            (o.state == LMS_THERMAL_PAUSED) != (o.token_factor == 0.0))
            (*bad)++;
    }
    return NULL;
}

static void test_concurrent_get(void **state)
{
    shared = lms_thermal_create(NULL, NULL, NULL);
    int bad = 0;
    pthread_t th;
    atomic_store(&stop_readers, 0);
    lms_log_set_level(LMS_LOG_OFF); /* thousands of state changes */
    assert_int_equal(pthread_create(&th, NULL, reader, &bad), 0);
    for (int i = 0; i < 20000; i++)
        lms_thermal_update(shared, (i % 3) ? 70 + (i % 25) : 95, (double)i);
    atomic_store(&stop_readers, 1);
    pthread_join(th, NULL);
    lms_log_set_level(LMS_LOG_INFO);
    assert_int_equal(bad, 0);
    lms_thermal_destroy(shared);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_checks),
        cmocka_unit_test(test_transition_table),
        cmocka_unit_test(test_outputs),
        cmocka_unit_test(test_no_flapping),
        cmocka_unit_test(test_pause_and_resume),
        cmocka_unit_test(test_stale_readings),
        cmocka_unit_test(test_concurrent_get),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
