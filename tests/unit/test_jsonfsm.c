/*
 * test_jsonfsm.c - the JSON-mode checker (engine/jsonfsm.h): complete
 * objects are accepted and done, every proper prefix accepted and not
 * done (whole and in pieces of every size), and each kind of invalid text
 * refused at the byte where it goes wrong.
 */
#include <stdio.h>
#include <string.h>

#include "engine/jsonfsm.h"
#include "testutil.h"

static const char *const valid[] = {
    "{}",
    "{\"a\":1}",
    "{\"a\": [1, -2.5e+3, 0, 0.25, 1E9, 7e-2, true, false, null, \"x\\\"\\\\\\u00e9\\n\"],\n"
    "  \"b\": {\"c\": {}, \"d\": []}, \"\": \"caf\xc3\xa9\"}",
    "{\"k\":[[[]],[{}]],\"n\":-0}",
    "{\"s\":\"\\/\\b\\f\\r\\t\"}",
};

/* the byte count of s accepted (strlen(s) when all of it) */
static size_t accepted(const char *s, bool *done)
{
    lms_jsonfsm f;
    lms_jsonfsm_init(&f);
    size_t i = 0;
    for (; s[i]; i++)
        if (!lms_jsonfsm_feed(&f, s + i, 1))
            break;
    *done = lms_jsonfsm_done(&f);
    return i;
}

static void test_valid(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof valid / sizeof valid[0]; k++) {
        const char *s = valid[k];
        const size_t n = strlen(s);
        for (size_t cut = 0; cut <= n; cut++) { /* every prefix, whole */
            lms_jsonfsm f;
            lms_jsonfsm_init(&f);
            if (!lms_jsonfsm_feed(&f, s, cut))
                fail_msg("valid text %zu refused within its first %zu bytes", k, cut);
            if (lms_jsonfsm_done(&f) != (cut == n))
                fail_msg("valid text %zu: done after %zu of %zu bytes", k, cut, n);
        }
        for (size_t piece = 1; piece <= 7; piece++) { /* in pieces */
            lms_jsonfsm f;
            lms_jsonfsm_init(&f);
            for (size_t i = 0; i < n; i += piece)
                assert_true(lms_jsonfsm_feed(&f, s + i, i + piece <= n ? piece : n - i));
            assert_true(lms_jsonfsm_done(&f));
        }
    }
}

static void test_invalid(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t at; /* bytes accepted before the refusal */
    } bad[] = {
        {"[1]", 0},              /* the top-level value must be an object */
        {"\"x\"", 0},
        {"{a:1}", 1},            /* keys are strings */
        {"{\"a\" 1}", 5},        /* a colon after the key */
        {"{\"a\":01}", 6},       /* no leading zeros */
        {"{\"a\":1,}", 7},       /* no trailing comma */
        {"{\"a\":.5}", 5},
        {"{\"a\":1.}", 7},
        {"{\"a\":-}", 6},
        {"{\"a\":1e}", 7},
        {"{\"a\":tru}", 8},
        {"{\"a\":nul1}", 8},
        {"{\"a\":\"\x01\"}", 6}, /* control characters are escaped in strings */
        {"{\"a\":\"\\q\"}", 7},
        {"{\"a\":\"\\u12G4\"}", 10},
        {"{\"a\":[1}", 7},       /* brackets match */
        {"{\"a\":{]}", 6},
        {"{}}", 2},              /* nothing after the object */
        {"{} ", 2},
        {"{\"a\":1 2}", 7},
        {" {}", 0},              /* the object comes first */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        bool done;
        size_t at = accepted(bad[k].s, &done);
        if (at != bad[k].at)
            fail_msg("\"%s\": refused after %zu bytes, expected %zu", bad[k].s, at, bad[k].at);
        assert_int_equal(done, bad[k].s[0] == '{' && bad[k].s[1] == '}'); /* only "{}..." */
    }
}

/* whitespace runs and nesting are bounded */
static void test_limits(void **state)
{
    (void)state;
    char s[256];
    bool done;
    snprintf(s, sizeof s, "{%*s\"a\":1}", LMS_JSON_WS_MAX, "");
    assert_int_equal(accepted(s, &done), strlen(s));
    assert_true(done);
    snprintf(s, sizeof s, "{%*s\"a\":1}", LMS_JSON_WS_MAX + 1, "");
    assert_int_equal(accepted(s, &done), 1 + LMS_JSON_WS_MAX);
    /* one newline a run, no carriage return */
    assert_int_equal(accepted("{\n  \"a\":1}", &done), 10);
    assert_int_equal(accepted("{\n\n\"a\":1}", &done), 2);
    assert_int_equal(accepted("{\r\n\"a\":1}", &done), 1);
    /* runs, not totals, are bounded */
    snprintf(s, sizeof s, "{\"a\":%*s1,%*s\"b\":2}", LMS_JSON_WS_MAX, "", LMS_JSON_WS_MAX, "");
    assert_int_equal(accepted(s, &done), strlen(s));
    char deep[2 * LMS_JSON_DEPTH_MAX + 16];
    size_t n = 0;
    deep[n++] = '{';
    memcpy(deep + n, "\"a\":", 4);
    n += 4;
    for (int d = 1; d < LMS_JSON_DEPTH_MAX; d++)
        deep[n++] = '[';
    deep[n] = 0;
    assert_int_equal(accepted(deep, &done), n); /* 64 levels */
    deep[n++] = '[';
    deep[n] = 0;
    assert_int_equal(accepted(deep, &done), n - 1); /* the 65th is refused */
}

/* the cache key: equal states, and states that differ only in bits left
 * from closed containers */
static void test_same(void **state)
{
    (void)state;
    lms_jsonfsm a, b;
    lms_jsonfsm_init(&a);
    lms_jsonfsm_init(&b);
    assert_true(lms_jsonfsm_feed(&a, "{\"x\":[{}],\"y\":\"", 15));
    assert_true(lms_jsonfsm_feed(&b, "{\"q\":\"", 6));
    assert_true(lms_jsonfsm_same(&a, &b)); /* both in a value string at depth 1 */
    assert_true(lms_jsonfsm_feed(&b, "\\", 1));
    assert_false(lms_jsonfsm_same(&a, &b)); /* b after a backslash */
    lms_jsonfsm c;
    lms_jsonfsm_init(&c);
    assert_true(lms_jsonfsm_feed(&c, "{\"q\":[\"", 7));
    assert_false(lms_jsonfsm_same(&a, &c)); /* a string in an array, at depth 2 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
