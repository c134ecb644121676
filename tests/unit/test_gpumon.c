/*
 * test_gpumon.c - the GPU monitor against a fake NVML (tests/unit/
 * fake_nvml.c, built as a shared library; CTest passes its path in
 * LMS_NVML_LIB, the monitor's documented override): snapshot values, the
 * JSON and Prometheus renderings, unsupported fields, missing or broken
 * NVML (one info line, no crash), and thermal slow/pause/resume with
 * hysteresis driven by the fake's temperatures.
 */
#include <dlfcn.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "ops/gpumon.h"
#include "ops/log.h"
#include "ops/thermal.h"
#include "testutil.h"

static char log_path[256];

/* Fake NVML defaults for each test; logs go to a file we can count in. */
static int setup(void **state)
{
    if (!getenv("LMS_NVML_LIB")) {
        print_message("LMS_NVML_LIB is not set (run through ctest)\n");
        return -1;
    }
    unsetenv("FAKE_NVML_INIT_FAIL");
    unsetenv("FAKE_NVML_NO_FAN");
    setenv("FAKE_NVML_COUNT", "2", 1);
    setenv("FAKE_NVML_TEMP", "63", 1);
    setenv("FAKE_NVML_THROTTLE", "24", 1); /* sw_power_cap | sw_thermal_slowdown */
    snprintf(log_path, sizeof log_path, "/tmp/lms_test_gpumon_%d.log", (int)getpid());
    unlink(log_path);
    lms_log_config cfg = {.level = LMS_LOG_DEBUG, .path = log_path};
    return lms_log_open(&cfg) == LMS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    lms_log_close();
    unlink(log_path);
    return 0;
}

static int count_substr(const char *text, const char *s)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, s)) != NULL; p++)
        n++;
    return n;
}

/* Lines of the log file that carry "event":"<event>". */
static int count_events(const char *event)
{
    char needle[128];
    snprintf(needle, sizeof needle, "\"event\":\"%s\"", event);
    char *text = tu_read_file(log_path, NULL);
    int n = text ? count_substr(text, needle) : 0;
    free(text);
    return n;
}

/* A counter exported by the fake (see fake_nvml.c); -1 if not loaded. */
static int fake_counter(const char *fn_name)
{
    void *dl = dlopen(getenv("LMS_NVML_LIB"), RTLD_NOW | RTLD_NOLOAD);
    if (!dl)
        return -1;
    int (*fn)(void) = (int (*)(void))dlsym(dl, fn_name);
    int n = fn ? fn() : -2;
    dlclose(dl);
    return n;
}

/* nvmlInit_v2 calls not yet matched by nvmlShutdown. */
static int fake_init_count(void)
{
    int n = fake_counter("fake_nvml_init_count");
    return n == -1 ? 0 : n; /* not loaded at all: nothing open either */
}

static void test_snapshot_values(void **state)
{
    lms_gpumon *mon = lms_gpumon_create(NULL);
    assert_non_null(mon);
    assert_true(lms_gpumon_available(mon));
    assert_int_equal(fake_init_count(), 1);
    lms_gpu_snapshot snap;
    lms_gpumon_snapshot(mon, &snap);
    assert_int_equal(snap.n_polls, 0); /* nothing read yet */
    assert_int_equal(lms_gpumon_poll(mon), 2);
    lms_gpumon_snapshot(mon, &snap);
    assert_true(snap.available);
    assert_int_equal(snap.n_gpus, 2);
    assert_int_equal(snap.n_polls, 1);

    const lms_gpu_info *g = &snap.gpus[1];
    assert_int_equal(g->index, 1);
    assert_string_equal(g->name, "Fake GPU 1");
    assert_int_equal(g->fields, 0x1FF); /* every LMS_GPU_HAS_* */
    assert_int_equal(g->temp_c, 62);
    assert_int_equal(g->mem_total_bytes, 8ull << 30);
    assert_int_equal(g->mem_used_bytes, 2ull << 30);
    assert_int_equal(g->mem_free_bytes, 6ull << 30);
    assert_true(g->power_w == 150.5);
    assert_int_equal(g->fan_pct, 40);
    assert_int_equal(g->util_gpu_pct, 42);
    assert_int_equal(g->util_mem_pct, 17);
    assert_int_equal(g->clock_graphics_mhz, 1500);
    assert_int_equal(g->clock_sm_mhz, 1600);
    assert_int_equal(g->clock_mem_mhz, 7000);
    assert_int_equal(g->throttle_reasons, 0x24);
    double t;
    assert_true(lms_gpu_snapshot_max_temp(&snap, &t));
    assert_true(t == 63);

    lms_gpumon_destroy(mon);
    assert_int_equal(fake_init_count(), 0); /* shut down (or unloaded) */
    assert_int_equal(count_events("gpu_found"), 2);
    assert_int_equal(count_events("gpumon_ready"), 1);
}

/* A monitor on the fake, polled once, and its snapshot. */
static lms_gpumon *polled(lms_gpu_snapshot *snap)
{
    lms_gpumon *mon = lms_gpumon_create(NULL);
    assert_non_null(mon);
    assert_int_equal(lms_gpumon_poll(mon), 2);
    lms_gpumon_snapshot(mon, snap);
    return mon;
}

static void test_json(void **state)
{
    lms_gpu_snapshot snap;
    lms_gpumon *mon = polled(&snap);
    char buf[4096];
    int n = lms_gpu_snapshot_json(&snap, buf, sizeof buf);
    assert_true(n > 0 && (size_t)n == strlen(buf));

    json_error_t err;
    json_t *o = json_loads(buf, 0, &err);
    assert_non_null(o);
    assert_true(json_is_true(json_object_get(o, "available")));
    json_t *gpus = json_object_get(o, "gpus");
    assert_int_equal(json_array_size(gpus), 2);
    json_t *g = json_array_get(gpus, 0);
    assert_string_equal(json_string_value(json_object_get(g, "name")), "Fake GPU 0");
    assert_int_equal(json_integer_value(json_object_get(g, "temp_c")), 63);
    assert_true(json_integer_value(json_object_get(g, "vram_used_bytes")) == 1ll << 30);
    assert_true(json_real_value(json_object_get(g, "power_w")) == 150.5);
    assert_int_equal(json_integer_value(json_object_get(g, "clock_mem_mhz")), 7000);
    json_t *tr = json_object_get(g, "throttle_reasons");
    assert_int_equal(json_array_size(tr), 2);
    assert_string_equal(json_string_value(json_array_get(tr, 0)), "sw_power_cap");
    assert_string_equal(json_string_value(json_array_get(tr, 1)), "sw_thermal_slowdown");
    json_decref(o);

    assert_int_equal(lms_gpu_snapshot_json(&snap, buf, 100), LMS_ERR_LIMIT);
    assert_string_equal(buf, "");
    lms_gpumon_destroy(mon);
}

static void expect_line(const char *text, const char *line)
{
    char needle[256];
    snprintf(needle, sizeof needle, "\n%s\n", line);
    if (!strstr(text, needle))
        fail_msg("missing line: %s", line);
}

static void test_prometheus(void **state)
{
    lms_gpu_snapshot snap;
    lms_gpumon *mon = polled(&snap);
    char buf[16384];
    int n = lms_gpu_snapshot_prometheus(&snap, buf, sizeof buf);
    assert_true(n > 0);
    expect_line(buf, "lmserv_gpu_monitor_available 1");
    expect_line(buf, "lmserv_gpu_info{gpu=\"1\",name=\"Fake GPU 1\"} 1");
    expect_line(buf, "lmserv_gpu_temperature_celsius{gpu=\"0\"} 63");
    expect_line(buf, "lmserv_gpu_temperature_celsius{gpu=\"1\"} 62");
    expect_line(buf, "lmserv_gpu_memory_total_bytes{gpu=\"0\"} 8589934592");
    expect_line(buf, "lmserv_gpu_memory_used_bytes{gpu=\"1\"} 2147483648");
    expect_line(buf, "lmserv_gpu_memory_free_bytes{gpu=\"0\"} 7516192768");
    expect_line(buf, "lmserv_gpu_power_watts{gpu=\"0\"} 150.5");
    expect_line(buf, "lmserv_gpu_fan_speed_percent{gpu=\"0\"} 40");
    expect_line(buf, "lmserv_gpu_utilization_percent{gpu=\"0\"} 42");
    expect_line(buf, "lmserv_gpu_clock_mhz{gpu=\"0\",clock=\"sm\"} 1600");
    expect_line(buf, "lmserv_gpu_throttle_reasons{gpu=\"0\"} 36");
    expect_line(buf, "lmserv_gpu_throttled{gpu=\"0\",reason=\"sw_power_cap\"} 1");
    expect_line(buf, "lmserv_gpu_throttled{gpu=\"0\",reason=\"gpu_idle\"} 0");
    expect_line(buf, "# TYPE lmserv_gpu_temperature_celsius gauge");
    /* One HELP/TYPE per family, even for the three clock samples. */
    assert_int_equal(count_substr(buf, "# TYPE lmserv_gpu_clock_mhz "), 1);
    assert_int_equal(count_substr(buf, "lmserv_gpu_clock_mhz{"), 6);
    assert_int_equal(buf[n - 1], '\n');
    assert_int_equal(lms_gpu_snapshot_prometheus(&snap, buf, 500), LMS_ERR_LIMIT);
    lms_gpumon_destroy(mon);
}

static void test_unsupported_field(void **state)
{
    lms_gpumon *mon = lms_gpumon_create(NULL);
    assert_int_equal(lms_gpumon_poll(mon), 2); /* fan reads at first ... */
    setenv("FAKE_NVML_NO_FAN", "1", 1);        /* ... then is not supported */
    int fan_calls = fake_counter("fake_nvml_fan_calls");
    for (int i = 0; i < 5; i++)
        lms_gpumon_poll(mon);
    assert_int_equal(fake_counter("fake_nvml_fan_calls"), fan_calls + 2); /* once per GPU */
    lms_gpu_snapshot snap;
    lms_gpumon_snapshot(mon, &snap);
    assert_false(snap.gpus[0].fields & LMS_GPU_HAS_FAN);
    assert_true(snap.gpus[0].fields & LMS_GPU_HAS_TEMP);
    assert_int_equal(count_events("gpu_read_failed"), 2); /* once per GPU, not per poll */
    assert_int_equal(count_events("gpu_unsupported"), 2);

    char buf[16384];
    assert_true(lms_gpu_snapshot_json(&snap, buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, "\"fan_pct\":null"));
    assert_true(lms_gpu_snapshot_prometheus(&snap, buf, sizeof buf) > 0);
    assert_null(strstr(buf, "lmserv_gpu_fan_speed_percent{"));
    lms_gpumon_destroy(mon);
}

static void test_unsupported_from_start(void **state)
{
    setenv("FAKE_NVML_NO_FAN", "1", 1); /* a passively cooled card */
    lms_gpumon *mon = lms_gpumon_create(NULL);
    int fan_calls = fake_counter("fake_nvml_fan_calls");
    for (int i = 0; i < 5; i++)
        lms_gpumon_poll(mon);
    assert_int_equal(fake_counter("fake_nvml_fan_calls"), fan_calls + 2);
    assert_int_equal(count_events("gpu_unsupported"), 2); /* info, once per GPU */
    assert_int_equal(count_events("gpu_read_failed"), 0); /* never read: nothing lost */
    lms_gpumon_destroy(mon);
}

static void test_poll_if_older(void **state)
{
    lms_gpumon *mon = lms_gpumon_create(NULL);
    lms_gpu_snapshot snap;
    assert_int_equal(lms_gpumon_poll_if_older(mon, 60000), 2); /* no data yet: polls */
    assert_int_equal(lms_gpumon_poll_if_older(mon, 60000), 2); /* fresh: does not */
    lms_gpumon_snapshot(mon, &snap);
    assert_int_equal(snap.n_polls, 1);
    assert_int_equal(lms_gpumon_poll_if_older(mon, 0), 2);
    lms_gpumon_snapshot(mon, &snap);
    assert_int_equal(snap.n_polls, 2);
    lms_gpumon_destroy(mon);
    assert_int_equal(lms_gpumon_poll_if_older(NULL, 0), LMS_ERR_UNSUPPORTED);
}

static void check_unavailable(lms_gpumon *mon)
{
    assert_non_null(mon);
    assert_false(lms_gpumon_available(mon));
    for (int i = 0; i < 5; i++)
        assert_int_equal(lms_gpumon_poll(mon), LMS_ERR_UNSUPPORTED);
    lms_gpu_snapshot snap;
    lms_gpumon_snapshot(mon, &snap);
    assert_false(snap.available);
    double t;
    assert_false(lms_gpu_snapshot_max_temp(&snap, &t));
    char buf[1024];
    assert_true(lms_gpu_snapshot_json(&snap, buf, sizeof buf) > 0);
    assert_string_equal(buf, "{\"available\":false,\"gpus\":[]}");
    assert_true(lms_gpu_snapshot_prometheus(&snap, buf, sizeof buf) > 0);
    assert_non_null(strstr(buf, "\nlmserv_gpu_monitor_available 0\n"));
    assert_null(strstr(buf, "lmserv_gpu_temperature"));
    lms_gpumon_destroy(mon);
}

static void test_missing_nvml(void **state)
{
    check_unavailable(lms_gpumon_create("/nonexistent/libnvidia-ml.so.1"));
    assert_int_equal(count_events("gpumon_unavailable"), 1); /* one line, no spam */

    /* The same through the environment override. */
    char *saved = strdup(getenv("LMS_NVML_LIB"));
    setenv("LMS_NVML_LIB", "/nonexistent/libnvidia-ml.so.1", 1);
    check_unavailable(lms_gpumon_create(NULL));
    setenv("LMS_NVML_LIB", saved, 1);
    free(saved);

    /* A library without NVML's symbols. */
    check_unavailable(lms_gpumon_create("libm.so.6"));

    /* The library is there but the driver is not. */
    setenv("FAKE_NVML_INIT_FAIL", "1", 1);
    check_unavailable(lms_gpumon_create(NULL));
    assert_int_equal(count_events("gpumon_unavailable"), 4);
    assert_int_equal(count_events("gpu_read_failed"), 0);
}

/* Thermal protection fed from the monitor, as the server's timer does:
 * poll, take the hottest GPU, update the state machine. */
static void test_thermal_from_fake(void **state)
{
    static const struct {
        int temp;
        lms_thermal_state want;
    } steps[] = {
        {60, LMS_THERMAL_NORMAL}, {79, LMS_THERMAL_NORMAL}, {80, LMS_THERMAL_SLOW},
        {84, LMS_THERMAL_SLOW},   {78, LMS_THERMAL_SLOW}, /* hysteresis: still hot */
        {76, LMS_THERMAL_SLOW},   {86, LMS_THERMAL_SLOW},   {90, LMS_THERMAL_PAUSED},
        {88, LMS_THERMAL_PAUSED}, {85, LMS_THERMAL_PAUSED}, {84, LMS_THERMAL_SLOW},
        {80, LMS_THERMAL_SLOW},   {75, LMS_THERMAL_SLOW},   {74, LMS_THERMAL_NORMAL},
        {70, LMS_THERMAL_NORMAL},
    };
    lms_gpumon *mon = lms_gpumon_create(NULL);
    lms_thermal *th = lms_thermal_create(NULL, NULL, NULL);
    assert_non_null(th);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        char temp[16];
        snprintf(temp, sizeof temp, "%d", steps[i].temp);
        setenv("FAKE_NVML_TEMP", temp, 1);
        lms_gpumon_poll(mon);
        lms_gpu_snapshot snap;
        lms_gpumon_snapshot(mon, &snap);
        double hottest;
        assert_true(lms_gpu_snapshot_max_temp(&snap, &hottest));
        assert_true(hottest == steps[i].temp); /* GPU 1 reads one degree less */
        lms_thermal_state s = lms_thermal_update(th, hottest, 1000.0 * (double)i);
        if (s != steps[i].want)
            fail_msg("step %zu at %d C: %s, want %s", i, steps[i].temp, lms_thermal_state_name(s),
                     lms_thermal_state_name(steps[i].want));
        lms_thermal_out o;
        lms_thermal_get(th, &o);
        assert_true((s == LMS_THERMAL_PAUSED) == (o.token_factor == 0.0));
    }
    lms_thermal_out o;
    lms_thermal_get(th, &o);
    assert_int_equal(o.n_changes, 4); /* slow, paused, slow, normal */
    assert_int_equal(count_events("thermal_state"), 4);
    lms_thermal_destroy(th);
    lms_gpumon_destroy(mon);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_snapshot_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prometheus, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsupported_field, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsupported_from_start, setup, teardown),
        cmocka_unit_test_setup_teardown(test_poll_if_older, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_nvml, setup, teardown),
        cmocka_unit_test_setup_teardown(test_thermal_from_fake, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
