/*
 * test_watchdog.c - the heartbeat watchdog (a busy component that stops
 * beating fires on_stall exactly once per stall; one that beats never does;
 * idle components never do; the thread does not wake while all are idle),
 * the decode-speed supervisor, and the test-only fault hook.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/err.h"
#include "ops/fault.h"
#include "ops/supervisor.h"
#include "ops/watchdog.h"
#include "testutil.h"

#define CHECK_MS 20 /* fast checks keep the test short */
#define LIMIT_MS 100

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

struct stalls {
    atomic_int n;
    char last_name[64];
    double last_ms;
};

static void on_stall(void *ud, const char *name, double stalled_ms)
{
    struct stalls *s = ud;
    snprintf(s->last_name, sizeof s->last_name, "%s", name);
    s->last_ms = stalled_ms;
    atomic_fetch_add(&s->n, 1);
}

/* ---- watchdog ----------------------------------------------------------- */

static void test_stall_fires_once(void **state)
{
    lms_watchdog *wd = lms_watchdog_create(CHECK_MS);
    assert_non_null(wd);
    struct stalls st = {0};
    lms_watchdog_comp *c = lms_watchdog_register(wd, "sched:qwen", LIMIT_MS, on_stall, &st);
    assert_non_null(c);

    lms_watchdog_busy(c, true); /* a step starts ... and never beats again */
    sleep_ms(LIMIT_MS * 6);
    assert_int_equal(atomic_load(&st.n), 1);
    assert_string_equal(st.last_name, "sched:qwen");
    assert_true(st.last_ms > LIMIT_MS);
    assert_true(lms_watchdog_is_stalled(c));

    lms_watchdog_beat(c); /* it recovers: the stall is over */
    assert_false(lms_watchdog_is_stalled(c));
    sleep_ms(LIMIT_MS * 6); /* and hangs again: a new stall, one more report */
    assert_int_equal(atomic_load(&st.n), 2);
    assert_int_equal(lms_watchdog_n_stalls(c), 2);

    lms_watchdog_busy(c, false);
    assert_false(lms_watchdog_is_stalled(c));
    lms_watchdog_unregister(c);
    lms_watchdog_destroy(wd);
}

struct beater {
    lms_watchdog_comp *c;
    atomic_int stop;
};

static void *beat_thread(void *arg)
{
    struct beater *b = arg;
    while (!atomic_load(&b->stop)) {
        lms_watchdog_busy(b->c, true); /* one scheduler step of 5 ms */
        sleep_ms(5);
        lms_watchdog_beat(b->c);
        lms_watchdog_busy(b->c, false);
    }
    return NULL;
}

static void test_beating_and_idle_never_fire(void **state)
{
    lms_watchdog *wd = lms_watchdog_create(CHECK_MS);
    struct stalls st_beat = {0}, st_idle = {0}, st_done = {0};
    struct beater b = {.c = lms_watchdog_register(wd, "beats", LIMIT_MS, on_stall, &st_beat)};
    lms_watchdog_comp *idle = lms_watchdog_register(wd, "idle", LIMIT_MS, on_stall, &st_idle);
    assert_non_null(idle); /* registered, never busy */
    lms_watchdog_comp *done = lms_watchdog_register(wd, "done", LIMIT_MS, on_stall, &st_done);
    lms_watchdog_busy(done, true); /* busy once, then idle for good */
    lms_watchdog_busy(done, false);

    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, beat_thread, &b), 0);
    sleep_ms(LIMIT_MS * 8);
    atomic_store(&b.stop, 1);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&st_beat.n), 0);
    assert_int_equal(atomic_load(&st_idle.n), 0);
    assert_int_equal(atomic_load(&st_done.n), 0);
    lms_watchdog_destroy(wd); /* frees the three components */
}

/* Voluntary context switches of the thread named lms-watchdog, or -1. */
static long watchdog_switches(void)
{
    long n = -1;
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], line[256] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        bool ours = f && fgets(line, sizeof line, f) && strcmp(line, "lms-watchdog\n") == 0;
        if (f)
            fclose(f);
        if (!ours)
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            if (strncmp(line, "voluntary_ctxt_switches:", 24) == 0)
                n = atol(line + 24);
        if (f)
            fclose(f);
    }
    closedir(d);
    return n;
}

static void test_idle_thread_sleeps(void **state)
{
    lms_watchdog *wd = lms_watchdog_create(CHECK_MS);
    struct stalls st = {0};
    lms_watchdog_comp *c = lms_watchdog_register(wd, "idle", LIMIT_MS, on_stall, &st);
    sleep_ms(50); /* let the thread reach its untimed wait */
    long before = watchdog_switches();
    if (before < 0)
        skip();
    sleep_ms(500); /* 25 check periods: a polling thread would switch 25 times */
    long woke = watchdog_switches() - before;
    print_message("idle watchdog: %ld wake-ups in 500 ms\n", woke);
    assert_int_equal(woke, 0);

    lms_watchdog_busy(c, true); /* busy: the checks start again */
    sleep_ms(LIMIT_MS * 4);
    assert_int_equal(atomic_load(&st.n), 1);
    lms_watchdog_destroy(wd);
}

static lms_watchdog_comp *self_comp;

static void unregister_self(void *ud, const char *name, double stalled_ms)
{
    on_stall(ud, name, stalled_ms);
    lms_watchdog_unregister(self_comp);
}

static void test_unregister_from_callback(void **state)
{
    lms_watchdog *wd = lms_watchdog_create(CHECK_MS);
    struct stalls st = {0};
    self_comp = lms_watchdog_register(wd, "self", LIMIT_MS, unregister_self, &st);
    lms_watchdog_busy(self_comp, true);
    sleep_ms(LIMIT_MS * 5);
    assert_int_equal(atomic_load(&st.n), 1);
    assert_null(lms_watchdog_register(wd, "bad", 0, on_stall, &st));
    assert_null(lms_watchdog_register(wd, "bad", 10, NULL, &st));
    lms_watchdog_destroy(wd);
}

/* ---- supervisor --------------------------------------------------------- */

struct slow {
    int n;
    double avg;
};

static void on_slow(void *ud, double avg_tps, double floor_tps)
{
    struct slow *s = ud;
    s->n++;
    s->avg = avg_tps;
}

static void test_supervisor(void **state)
{
    struct slow sl = {0};
    lms_supervisor_params p = {.floor_tps = 20, .window = 4, .min_tokens = 16};
    lms_supervisor *s = lms_supervisor_create(&p, on_slow, &sl);
    assert_non_null(s);

    for (int i = 0; i < 10; i++) /* 50 tok/s: healthy */
        assert_false(lms_supervisor_record(s, 100, 2000));
    assert_false(lms_supervisor_record(s, 5, 10000)); /* too short to judge */
    for (int i = 0; i < 3; i++)                       /* 10 tok/s, window not yet slow */
        assert_false(lms_supervisor_record(s, 100, 10000));
    int n;
    assert_true(fabs(lms_supervisor_mean(s, &n) - 20) < 1e-9); /* (50 + 3*10) / 4 */
    assert_int_equal(n, 4);
    assert_true(lms_supervisor_record(s, 100, 10000)); /* four slow ones: fire */
    assert_int_equal(sl.n, 1);
    assert_true(fabs(sl.avg - 10) < 1e-9);
    assert_true(lms_supervisor_mean(s, &n) == 0 && n == 0); /* window cleared */
    for (int i = 0; i < 3; i++)
        assert_false(lms_supervisor_record(s, 100, 10000));
    assert_int_equal(sl.n, 1);
    lms_supervisor_reset(s);
    assert_true(lms_supervisor_mean(s, &n) == 0 && n == 0);
    lms_supervisor_destroy(s);

    p.floor_tps = 0; /* disabled */
    s = lms_supervisor_create(&p, on_slow, &sl);
    for (int i = 0; i < 10; i++)
        assert_false(lms_supervisor_record(s, 100, 1e6));
    lms_supervisor_destroy(s);
    p.window = 0;
    assert_null(lms_supervisor_create(&p, on_slow, &sl));
}

/* ---- fault hook --------------------------------------------------------- */

/* main() sets LMS_FAULT_HANG_STEP=2 before any fault call. */
static void test_fault_from_env(void **state)
{
    assert_int_equal(lms_fault_get("hang_step"), 2);
    assert_false(lms_fault_should_hang());
    assert_true(lms_fault_should_hang());
    assert_false(lms_fault_should_hang());
}

static void test_fault_api(void **state)
{
    assert_int_equal(lms_fault_set("hang_step", 3), LMS_OK);
    assert_false(lms_fault_should_hang());
    assert_false(lms_fault_should_hang());
    assert_true(lms_fault_should_hang());
    for (int i = 0; i < 10; i++)
        assert_false(lms_fault_should_hang());
    assert_int_equal(lms_fault_set("hang_step", 0), LMS_OK);
    assert_false(lms_fault_should_hang());
    assert_int_equal(lms_fault_set("explode", 1), LMS_ERR_INVAL);
    assert_int_equal(lms_fault_set("hang_step", -1), LMS_ERR_INVAL);
    assert_int_equal(lms_fault_get("explode"), 0);
}

int main(void)
{
    setenv("LMS_FAULT_HANG_STEP", "2", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stall_fires_once),
        cmocka_unit_test(test_beating_and_idle_never_fire),
        cmocka_unit_test(test_idle_thread_sleeps),
        cmocka_unit_test(test_unregister_from_callback),
        cmocka_unit_test(test_supervisor),
        cmocka_unit_test(test_fault_from_env),
        cmocka_unit_test(test_fault_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
