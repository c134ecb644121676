/*
 * test_log.c - the JSON-lines logger and its escaper: every line parses as
 * JSON (checked with jansson), hostile bytes are escaped or replaced,
 * over-long lines are cut but stay valid, the level filter, size-based
 * rotation keeps exactly `keep` old files under max_bytes, SIGHUP-style
 * reopen, and lines from many threads never interleave.
 */
#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "ops/jsonw.h"
#include "ops/log.h"
#include "testutil.h"

static char dir[256];
static char log_path[300];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/lms_test_log_XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(log_path, sizeof log_path, "%s/lmserv.log", dir);
    return 0;
}

static int teardown(void **state)
{
    lms_log_close();
    lms_log_set_level(LMS_LOG_INFO);
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[600];
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    return 0;
}

static void open_file(uint64_t max_bytes, int keep)
{
    lms_log_config cfg = {
        .level = LMS_LOG_DEBUG, .path = log_path, .max_bytes = max_bytes, .keep = keep};
    assert_int_equal(lms_log_open(&cfg), LMS_OK);
}

/* Parses every line of a file; returns them as a JSON array (caller frees).
 * Fails the test on a line that is not a JSON object. */
static json_t *read_lines(const char *path)
{
    size_t n = 0;
    char *text = tu_read_file(path, &n);
    assert_non_null(text);
    json_t *arr = json_array();
    char *line = text;
    for (char *nl; (nl = memchr(line, '\n', n - (size_t)(line - text))) != NULL; line = nl + 1) {
        json_error_t err;
        json_t *obj = json_loadb(line, (size_t)(nl - line), JSON_ALLOW_NUL, &err);
        if (!obj)
            fail_msg("line does not parse (%s): %.*s", err.text, (int)(nl - line), line);
        assert_true(json_is_object(obj));
        json_array_append_new(arr, obj);
    }
    assert_ptr_equal(line, text + n); /* the file ends with a newline */
    free(text);
    return arr;
}

static const char *str_field(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    assert_non_null(v);
    assert_true(json_is_string(v));
    return json_string_value(v);
}

/* ---- line format -------------------------------------------------------- */

static void test_line_fields(void **state)
{
    open_file(0, 0);
    lms_log(LMS_LOG_INFO, "request_end", "req_id", LMS_LOG_U64(1ull << 62), "delta",
            LMS_LOG_I64(-42), "ttft_ms", LMS_LOG_F64(45.25), "ok", LMS_LOG_BOOL(true), "model",
            LMS_LOG_STR("qwen"), "none", LMS_LOG_STR(NULL), "nan", LMS_LOG_F64(0.0 / 0.0));
    json_t *lines = read_lines(log_path);
    assert_int_equal(json_array_size(lines), 1);
    json_t *o = json_array_get(lines, 0);

    const char *ts = str_field(o, "ts"); /* 2026-11-26T01:02:03.456Z */
    assert_int_equal(strlen(ts), 24);
    assert_int_equal(ts[10], 'T');
    assert_int_equal(ts[19], '.');
    assert_int_equal(ts[23], 'Z');
    assert_string_equal(str_field(o, "level"), "info");
    assert_string_equal(str_field(o, "event"), "request_end");
    assert_true(json_integer_value(json_object_get(o, "req_id")) == (json_int_t)(1ull << 62));
    assert_true(json_integer_value(json_object_get(o, "delta")) == -42);
    assert_true(json_real_value(json_object_get(o, "ttft_ms")) == 45.25);
    assert_true(json_is_true(json_object_get(o, "ok")));
    assert_string_equal(str_field(o, "model"), "qwen");
    assert_true(json_is_null(json_object_get(o, "none")));
    assert_true(json_is_null(json_object_get(o, "nan")));
    assert_null(json_object_get(o, "truncated"));
    json_decref(lines);

    /* Keys keep the caller's order, after ts, level and event; all 64 bits
     * of a u64 are printed (jansson itself stops at INT64_MAX). */
    lms_log(LMS_LOG_INFO, "max", "u", LMS_LOG_U64(UINT64_MAX), "i", LMS_LOG_I64(INT64_MIN));
    char *text = tu_read_file(log_path, NULL);
    assert_non_null(strstr(text, "{\"ts\":"));
    assert_true(strstr(text, "\"event\"") < strstr(text, "\"req_id\":"));
    assert_non_null(strstr(text, "\"u\":18446744073709551615,\"i\":-9223372036854775808}\n"));
    free(text);
}

static void test_hostile_strings(void **state)
{
    static const char hostile[] = "q\"b\\s/\x01\x1f\x7f\n\t\r nul:\0:"
                                  "bad:\xff\xc0\x80\xed\xa0\x80\xe2\x82:ok:\xc3\xbc\xe2\x82\xac"
                                  "\xf0\x9d\x84\x9e:ls:\xe2\x80\xa8";
    static const char expect[] = "q\"b\\s/\x01\x1f\x7f\n\t\r nul:\0:"
                                 "bad:\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                                 "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd:ok:\xc3\xbc\xe2\x82\xac"
                                 "\xf0\x9d\x84\x9e:ls:\xe2\x80\xa8";
    open_file(0, 0);
    lms_log(LMS_LOG_WARN, "evil\n\"event", "k\"ey\x02", LMS_LOG_STRN(hostile, sizeof hostile - 1));

    size_t n;
    char *raw = tu_read_file(log_path, &n);
    for (size_t i = 0; i + 1 < n; i++) /* no raw control byte before the newline */
        assert_true((unsigned char)raw[i] >= 0x20 && raw[i] != 0x7f);
    assert_int_equal(raw[n - 1], '\n');
    free(raw);

    json_t *lines = read_lines(log_path); /* jansson rejects invalid UTF-8 */
    json_t *o = json_array_get(lines, 0);
    assert_string_equal(str_field(o, "event"), "evil\n\"event");
    json_t *v = json_object_get(o, "k\"ey\x02");
    assert_non_null(v);
    assert_int_equal(json_string_length(v), sizeof expect - 1);
    assert_memory_equal(json_string_value(v), expect, sizeof expect - 1);
    json_decref(lines);
}

static void test_long_line_truncated(void **state)
{
    size_t big = 3 * LMS_LOG_LINE_MAX;
    char *s = malloc(big);
    assert_non_null(s);
    for (size_t i = 0; i < big; i++) /* multi-byte characters: cut at a boundary */
        s[i] = "\xe2\x82\xac"[i % 3];
    open_file(0, 0);
    lms_log(LMS_LOG_ERROR, "huge", "a", LMS_LOG_I64(1), "prompt", LMS_LOG_STRN(s, big), "after",
            LMS_LOG_I64(2));
    lms_log_rec r;
    assert_true(lms_log_begin(&r, LMS_LOG_INFO, "huge_f"));
    lms_log_addf(&r, "fmt", "%s", "x");
    lms_log_addf(&r, "fmt_big", "%0*d", 2 * LMS_LOG_LINE_MAX, 7);
    lms_log_end(&r);
    free(s);

    struct stat st;
    assert_int_equal(stat(log_path, &st), 0);
    assert_true(st.st_size <= 2 * LMS_LOG_LINE_MAX);
    json_t *lines = read_lines(log_path);
    assert_int_equal(json_array_size(lines), 2);
    json_t *o = json_array_get(lines, 0);
    assert_true(json_is_true(json_object_get(o, "truncated")));
    assert_true(json_string_length(json_object_get(o, "prompt")) > LMS_LOG_LINE_MAX / 2);
    assert_null(json_object_get(o, "after")); /* no room left for it */
    o = json_array_get(lines, 1);
    assert_string_equal(str_field(o, "fmt"), "x");
    assert_true(json_is_true(json_object_get(o, "truncated")));
    json_decref(lines);
}

static void test_level_filter(void **state)
{
    open_file(0, 0);
    lms_log_set_level(LMS_LOG_WARN);
    assert_false(lms_log_enabled(LMS_LOG_INFO));
    assert_true(lms_log_enabled(LMS_LOG_ERROR));
    lms_log(LMS_LOG_DEBUG, "dropped");
    lms_log(LMS_LOG_INFO, "dropped");
    lms_log(LMS_LOG_WARN, "kept");
    lms_log_rec r;
    assert_false(lms_log_begin(&r, LMS_LOG_INFO, "dropped"));
    lms_log_add(&r, "k", LMS_LOG_I64(1)); /* harmless no-ops */
    lms_log_end(&r);
    lms_log_set_level(LMS_LOG_OFF);
    lms_log(LMS_LOG_ERROR, "dropped");
    json_t *lines = read_lines(log_path);
    assert_int_equal(json_array_size(lines), 1);
    assert_string_equal(str_field(json_array_get(lines, 0), "event"), "kept");
    json_decref(lines);

    lms_log_level lv = LMS_LOG_DEBUG;
    assert_int_equal(lms_log_level_parse("warning", &lv), LMS_OK);
    assert_int_equal(lv, LMS_LOG_WARN);
    assert_int_equal(lms_log_level_parse("loud", &lv), LMS_ERR_INVAL);
    assert_int_equal(lv, LMS_LOG_WARN);
    assert_string_equal(lms_log_level_name(LMS_LOG_ERROR), "error");
}

/* ---- rotation and reopen ------------------------------------------------ */

static int count_files(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Writes lines numbered [from, to), each about 100 bytes. */
static void write_numbered(int from, int to)
{
    for (int i = from; i < to; i++)
        lms_log(LMS_LOG_INFO, "tick", "seq", LMS_LOG_I64(i), "pad",
                LMS_LOG_STR("0123456789012345678901234567890123456789"));
}

static void test_rotation_keeps_files(void **state)
{
    const uint64_t max = 4096;
    const int keep = 3, total = 500;
    open_file(max, keep);
    write_numbered(0, total);
    assert_int_equal(count_files(), keep + 1);

    /* Newest first: lmserv.log, .1, .2, .3 hold the last lines in order. */
    int expect = total - 1;
    for (int k = 0; k <= keep; k++) {
        char p[400];
        if (k == 0)
            snprintf(p, sizeof p, "%s", log_path);
        else
            snprintf(p, sizeof p, "%s.%d", log_path, k);
        struct stat st;
        assert_int_equal(stat(p, &st), 0);
        assert_true((uint64_t)st.st_size <= max);
        if (k > 0) /* rotated files were filled up to the limit */
            assert_true((uint64_t)st.st_size > max - 200);
        json_t *lines = read_lines(p);
        for (size_t j = json_array_size(lines); j-- > 0;) {
            json_t *seq = json_object_get(json_array_get(lines, j), "seq");
            assert_int_equal(json_integer_value(seq), expect--);
        }
        json_decref(lines);
    }
}

static void test_rotation_keep_zero(void **state)
{
    open_file(2048, 0);
    write_numbered(0, 200);
    assert_int_equal(count_files(), 1);
    struct stat st;
    assert_int_equal(stat(log_path, &st), 0);
    assert_true(st.st_size <= 2048);
    json_t *lines = read_lines(log_path);
    json_t *last = json_array_get(lines, json_array_size(lines) - 1);
    assert_int_equal(json_integer_value(json_object_get(last, "seq")), 199);
    json_decref(lines);
}

static void test_reopen(void **state)
{
    char moved[400];
    snprintf(moved, sizeof moved, "%s.moved", log_path);
    open_file(0, 0);
    lms_log(LMS_LOG_INFO, "a");
    assert_int_equal(rename(log_path, moved), 0); /* what logrotate does */
    lms_log(LMS_LOG_INFO, "b");                   /* still the old file */
    lms_log_reopen();                             /* the SIGHUP handler's call */
    lms_log(LMS_LOG_INFO, "c");

    json_t *old = read_lines(moved);
    assert_int_equal(json_array_size(old), 2);
    assert_string_equal(str_field(json_array_get(old, 1), "event"), "b");
    json_t *cur = read_lines(log_path);
    assert_int_equal(json_array_size(cur), 1);
    assert_string_equal(str_field(json_array_get(cur, 0), "event"), "c");
    json_decref(old);
    json_decref(cur);
}

static void test_open_errors(void **state)
{
    lms_log_config cfg = {.level = LMS_LOG_INFO, .path = "/nonexistent/dir/x.log"};
    assert_int_equal(lms_log_open(&cfg), LMS_ERR_IO);
    cfg.path = log_path;
    cfg.keep = -1;
    assert_int_equal(lms_log_open(&cfg), LMS_ERR_INVAL);
}

/* ---- threads ------------------------------------------------------------ */

#define N_THREADS 4
#define N_PER_THREAD 400

static void *log_thread(void *arg)
{
    long id = (long)(intptr_t)arg;
    for (int i = 0; i < N_PER_THREAD; i++)
        lms_log(LMS_LOG_INFO, "mt", "thread", LMS_LOG_I64(id), "i", LMS_LOG_I64(i), "text",
                LMS_LOG_STR("some words to make the line long enough to matter"));
    return NULL;
}

static void test_threads_no_interleave(void **state)
{
    open_file(64 * 1024, 50);
    pthread_t t[N_THREADS];
    for (long i = 0; i < N_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, log_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(t[i], NULL);
    size_t total = 0;
    for (int k = 0; k <= 50; k++) {
        char p[400];
        snprintf(p, sizeof p, k ? "%s.%d" : "%s", log_path, k);
        if (access(p, F_OK) != 0)
            continue;
        json_t *lines = read_lines(p);
        total += json_array_size(lines);
        json_decref(lines);
    }
    assert_int_equal(total, N_THREADS * N_PER_THREAD);
}

/* ---- the writer on its own ---------------------------------------------- */

static void test_jsonw_limits(void **state)
{
    char buf[16];
    lms_jsonw w;
    lms_jsonw_init(&w, buf, sizeof buf, sizeof buf);
    assert_true(lms_jsonw_cstr(&w, "abc"));
    assert_false(lms_jsonw_printf(&w, "%s", "0123456789abcdef")); /* whole or nothing */
    assert_string_equal(buf, "abc");
    assert_true(w.overflow);
    /* 3-byte characters cut at a boundary, quote closed: "abc" + "€€€" + quotes */
    assert_false(lms_jsonw_str(&w, "\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac", 12));
    assert_string_equal(buf, "abc\"\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac\"");
    lms_jsonw_deinit(&w);

    /* Growth onto the heap up to the limit. */
    lms_jsonw_init(&w, buf, sizeof buf, 1000);
    for (int i = 0; i < 99; i++) /* 990 bytes + NUL fit in 1000 */
        assert_true(lms_jsonw_cstr(&w, "0123456789"));
    assert_false(lms_jsonw_cstr(&w, "0123456789"));
    assert_int_equal(w.len, 990);
    assert_true(lms_jsonw_f64(&w, 1.0 / 0.0)); /* JSON has no infinity */
    assert_string_equal(w.p + 990, "null");
    lms_jsonw_deinit(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_line_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostile_strings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_line_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_level_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rotation_keeps_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rotation_keep_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_no_interleave, setup, teardown),
        cmocka_unit_test(test_jsonw_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
