/*
 * test_jsonschema.c - JSON mode held to a schema (engine/jsonschema.h):
 * objects the schema allows are accepted and done, every proper prefix
 * accepted, and each kind of violation refused at the byte where it
 * begins: property order and required properties, types, integers, enums,
 * array bounds, maps, anyOf, $ref (recursive), string lengths, numeric
 * bounds (every prefix must still reach an allowed number), allOf of one;
 * schemas the compiler refuses, with the keyword named.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jsonschema.h"
#include "testutil.h"

static const char *schema_a =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
    "\"maxItems\":2},\"kind\":{\"enum\":[\"cat\",\"dog\"]},\"nick\":{\"type\":[\"string\",\"null\"]}},"
    "\"required\":[\"name\",\"age\"]}";

static const char *schema_b =
    "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},"
    "\"y\":{\"type\":\"number\"}},\"required\":[\"x\",\"y\"]}},"
    "\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/pt\"},"
    "\"q\":{\"anyOf\":[{\"$ref\":\"#/$defs/pt\"},{\"type\":\"null\"}]},"
    "\"m\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}},\"any\":{}},"
    "\"required\":[\"p\"]}";

static const char *schema_list =
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
    "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/n\"},{\"type\":\"null\"}]}},\"required\":[\"v\"]}},"
    "\"$ref\":\"#/$defs/n\"}";

static lms_jschema *compile_ok(const char *s)
{
    char err[256];
    lms_jschema *sc = lms_jschema_compile(s, strlen(s), err, sizeof err);
    if (!sc)
        fail_msg("schema refused: %s", err);
    return sc;
}

/* bytes of t accepted, and whether it is then done */
static size_t accepted(const lms_jschema *sc, const char *t, bool *done)
{
    lms_jschk k;
    lms_jschk_init(&k, sc);
    size_t i = 0;
    for (; t[i]; i++)
        if (!lms_jschk_feed(&k, t + i, 1))
            break;
    *done = lms_jschk_done(&k);
    return i;
}

static void check_valid(const lms_jschema *sc, const char *t)
{
    bool done;
    size_t n = strlen(t), at = accepted(sc, t, &done);
    if (at != n || !done)
        fail_msg("valid text refused after %zu of %zu bytes (done %d): %s", at, n, done, t);
    for (size_t cut = 0; cut < n; cut++) { /* every proper prefix, not done */
        lms_jschk k;
        lms_jschk_init(&k, sc);
        assert_true(lms_jschk_feed(&k, t, cut));
        assert_false(lms_jschk_done(&k));
    }
}

/* t is refused right after its first `at` bytes */
static void check_refused(const lms_jschema *sc, const char *t, size_t at)
{
    bool done;
    size_t got = accepted(sc, t, &done);
    if (got != at)
        fail_msg("\"%s\": refused after %zu bytes, expected %zu", t, got, at);
}

static void test_properties(void **state)
{
    (void)state;
    lms_jschema *sc = compile_ok(schema_a);
    check_valid(sc, "{\"name\":\"Bo\",\"age\":3}");
    check_valid(sc, "{\"name\":\"Bo\",\"age\":3,\"tags\":[\"a\",\"b\"],\"kind\":\"dog\",\"nick\":null}");
    check_valid(sc, "{\"name\": \"\", \"age\": -12, \"nick\": \"x\"}");
    check_valid(sc, "{\"name\":\"a\\\"b\",\"age\":0,\"tags\":[]}");
    check_refused(sc, "{\"age\":3,\"name\":\"Bo\"}", 2);           /* name comes first */
    check_refused(sc, "{\"name\":\"Bo\"}", 12);                     /* age is required */
    check_refused(sc, "{\"name\":\"Bo\",\"age\":3.5}", 20);          /* an integer */
    check_refused(sc, "{\"name\":\"Bo\",\"age\":\"3\"}", 19);        /* a number */
    check_refused(sc, "{\"name\":\"Bo\",\"age\":3,\"tags\":[\"a\",\"b\",\"c\"]}", 36); /* max 2 */
    check_refused(sc, "{\"name\":\"Bo\",\"age\":3,\"kind\":\"cow\"}", 30); /* not in the enum */
    check_refused(sc, "{\"name\":\"Bo\",\"age\":3,\"kind\":\"do\"}", 31);  /* a whole value */
    check_refused(sc, "{\"name\":\"Bo\",\"age\":3,\"color\":1}", 22);      /* no such property */
    check_refused(sc, "{\"name\":\"Bo\",\"age\":3,\"nick\":null,\"tags\":[]}", 32); /* none after */
    check_refused(sc, "{\"name\":\"Bo\",\"age\":3,\"nick\":true}", 28);    /* string or null */
    free(sc);
}

static void test_refs_maps_alternatives(void **state)
{
    (void)state;
    lms_jschema *sc = compile_ok(schema_b);
    check_valid(sc, "{\"p\":{\"x\":1,\"y\":2.5},\"q\":null,\"m\":{\"a\":true,\"b\":false},"
                    "\"any\":[1,{\"z\":\"w\"},null]}");
    check_valid(sc, "{\"p\":{\"x\":-1e3,\"y\":0},\"q\":{\"x\":1,\"y\":1}}");
    check_valid(sc, "{\"p\":{\"x\":0,\"y\":0},\"m\":{}}");
    check_refused(sc, "{\"p\":{\"x\":1}}", 11);                          /* y is required */
    check_refused(sc, "{\"p\":{\"x\":1,\"y\":2},\"m\":{\"a\":1}}", 28); /* booleans */
    check_refused(sc, "{\"p\":{\"x\":1,\"y\":2},\"q\":\"no\"}", 23);    /* a point or null */
    free(sc);
    sc = compile_ok(schema_list);
    check_valid(sc, "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":null}}}");
    check_refused(sc, "{\"v\":1,\"next\":{\"next\":null}}", 16);
    free(sc);
}

static const char *schema_limits =
    "{\"$defs\":{\"d\":{\"type\":\"boolean\"}},\"type\":\"object\",\"properties\":{"
    "\"s\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":3},"
    "\"i\":{\"type\":\"integer\",\"minimum\":10,\"maximum\":20},"
    "\"x\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":1.5},"
    "\"n\":{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":0},"
    "\"w\":{\"allOf\":[{\"$ref\":\"#/$defs/d\"}],\"description\":\"a described ref\"}},"
    "\"required\":[\"s\",\"i\"]}";

/* string lengths in characters, numeric bounds on every prefix, allOf */
static void test_limits(void **state)
{
    (void)state;
    lms_jschema *sc = compile_ok(schema_limits);
    check_valid(sc, "{\"s\":\"ab\",\"i\":10}");
    check_valid(sc, "{\"s\":\"a\\u00e9c\",\"i\":20,\"x\":1.5}");
    check_valid(sc, "{\"s\":\"\xc3\xa9\xf0\x9f\x98\x80\",\"i\":15,\"x\":0.001,\"n\":-5,\"w\":true}");
    check_valid(sc, "{\"s\":\"\\ud83d\\ude00ab\",\"i\":12,\"n\":-1}"); /* a pair is one */
    check_valid(sc, "{\"s\":\"\\n\\\"\",\"i\":19,\"x\":0.75}");
    check_refused(sc, "{\"s\":\"a\"", 7);                 /* minLength 2 */
    check_refused(sc, "{\"s\":\"abcd\"", 9);              /* maxLength 3 */
    check_refused(sc, "{\"s\":\"abc\\n\"", 9);            /* an escape is a character */
    check_refused(sc, "{\"s\":\"ab\",\"i\":9", 14);       /* 9, 9x, 9xx...: none in 10..20 */
    check_refused(sc, "{\"s\":\"ab\",\"i\":1,", 15);      /* 1 could have become 1x */
    check_refused(sc, "{\"s\":\"ab\",\"i\":21", 15);
    check_refused(sc, "{\"s\":\"ab\",\"i\":-1", 14);
    check_refused(sc, "{\"s\":\"ab\",\"i\":10,\"x\":0}", 22);  /* exclusive */
    check_refused(sc, "{\"s\":\"ab\",\"i\":10,\"x\":1.6", 23);
    check_refused(sc, "{\"s\":\"ab\",\"i\":10,\"x\":2", 21);
    check_refused(sc, "{\"s\":\"ab\",\"i\":10,\"x\":1e0", 22); /* no exponent */
    check_refused(sc, "{\"s\":\"ab\",\"i\":10,\"n\":0", 21);
    check_refused(sc, "{\"s\":\"ab\",\"i\":10,\"n\":-6", 22);
    check_refused(sc, "{\"s\":\"ab\",\"i\":10,\"w\":1", 21);  /* allOf's boolean */
    free(sc);
    sc = compile_ok("{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\",\"maximum\":0.3,"
                    "\"minimum\":-0.3}}}");
    check_valid(sc, "{\"v\":0.3}"); /* the digits' value, not a sum of tenths */
    check_valid(sc, "{\"v\":-0.3}");
    check_valid(sc, "{\"v\":-0}");
    check_refused(sc, "{\"v\":0.31", 8);
    check_refused(sc, "{\"v\":-0.31", 9);
    check_refused(sc, "{\"v\":1", 5);
    free(sc);
    /* a bound state is part of the cache key */
    sc = compile_ok(schema_limits);
    lms_jschk a, b;
    lms_jschk_init(&a, sc);
    lms_jschk_init(&b, sc);
    assert_true(lms_jschk_feed(&a, "{\"s\":\"a", 7));
    assert_true(lms_jschk_feed(&b, "{\"s\":\"ab", 8));
    assert_false(lms_jschk_same(&a, &b));
    free(sc);
}

/* patterns: a ^-anchored one checked on every prefix, an unanchored one
 * at the closing quote; escapes decoded before matching */
static void test_patterns(void **state)
{
    (void)state;
    lms_jschema *sc = compile_ok(
        "{\"type\":\"object\",\"properties\":{"
        "\"d\":{\"type\":\"string\",\"pattern\":\"^[0-9]{4}-[0-9]{2}-[0-9]{2}$\"},"
        "\"e\":{\"type\":\"string\",\"pattern\":\"@\"},"
        "\"u\":{\"type\":\"string\",\"pattern\":\"^\\u00e9+\\\\n?$\"}},\"required\":[\"d\"]}");
    check_valid(sc, "{\"d\":\"2024-01-31\"}");
    check_valid(sc, "{\"d\":\"2024-01-31\",\"e\":\"a@b\"}");
    check_valid(sc, "{\"d\":\"1999-12-01\",\"e\":\"@\",\"u\":\"\\u00e9\xc3\xa9\\n\"}");
    check_refused(sc, "{\"d\":\"2024-1-", 12);          /* two digits of month */
    check_refused(sc, "{\"d\":\"2024-01-31x\"}", 16);   /* anchored at the end too */
    check_refused(sc, "{\"d\":\"x", 6);                 /* at once, not at the quote */
    check_refused(sc, "{\"d\":\"2024-01-31\",\"e\":\"ab\"}", 25); /* no @: at the quote */
    check_refused(sc, "{\"d\":\"2024-01-31\",\"u\":\"\\u00e8", 28); /* at its last digit */
    /* a whole token (several bytes) is judged once, by its last byte */
    lms_jschk k;
    lms_jschk_init(&k, sc);
    assert_true(lms_jschk_feed(&k, "{\"d\":\"20", 8));
    assert_false(lms_jschk_feed(&k, "24-0x", 5));
    free(sc);
    char err[256] = "";
    const char *bad = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"([\"}}}";
    assert_null(lms_jschema_compile(bad, strlen(bad), err, sizeof err));
    assert_non_null(strstr(err, "does not compile"));
}

/* numbers written at random against random bounds: an in-bounds number
 * and every prefix of it accepted, an out-of-bounds one refused */
static void test_bounds_random(void **state)
{
    (void)state;
    uint64_t r = 0x9e3779b97f4a7c15u;
#define RND() (r ^= r << 13, r ^= r >> 7, r ^= r << 17, r)
    for (int it = 0; it < 300; it++) {
        const bool whole = RND() % 2;
        const int lo = (int)(RND() % 400) - 200, span = (int)(RND() % 300);
        const bool lx = RND() % 3 == 0, hx = RND() % 3 == 0;
        char sch[256];
        snprintf(sch, sizeof sch,
                 "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"%s\",\"%s\":%g,\"%s\":%g}}}",
                 whole ? "integer" : "number", lx ? "exclusiveMinimum" : "minimum", lo / 10.0,
                 hx ? "exclusiveMaximum" : "maximum", (lo + span) / 10.0 + (span == 0 && !lx && !hx ? 0 : 0.05));
        char err[256];
        lms_jschema *sc = lms_jschema_compile(sch, strlen(sch), err, sizeof err);
        if (!sc)
            continue; /* bounds leaving no number */
        const double l = lo / 10.0, h = (lo + span) / 10.0 + (span == 0 && !lx && !hx ? 0 : 0.05);
        for (int j = 0; j < 40; j++) {
            char t[64];
            const int v = (int)(RND() % 6000) - 3000;
            double x;
            if (whole) {
                x = v / 10;
                snprintf(t, sizeof t, "{\"v\":%d}", v / 10);
            } else {
                x = v / 100.0;
                snprintf(t, sizeof t, "{\"v\":%s%d.%02d}", v < 0 ? "-" : "", abs(v) / 100, abs(v) % 100);
            }
            const bool in = (lx ? x > l : x >= l) && (hx ? x < h : x <= h);
            bool done;
            const size_t at = accepted(sc, t, &done);
            if (in)
                check_valid(sc, t);
            else if (at == strlen(t) && done)
                fail_msg("%s accepted under %s", t, sch);
        }
        free(sc);
    }
#undef RND
}

/* minProperties / maxProperties: on maps and on objects of named
 * properties, whose optional ones cannot all be skipped below the minimum */
static void test_member_counts(void **state)
{
    (void)state;
    lms_jschema *m = compile_ok("{\"type\":\"object\",\"additionalProperties\":{\"type\":"
                                "\"integer\"},\"minProperties\":1,\"maxProperties\":2}");
    check_valid(m, "{\"a\":1}");
    check_valid(m, "{\"a\":1,\"b\":2}");
    check_refused(m, "{}", 1);                  /* too few: no closing */
    check_refused(m, "{\"a\":1,\"b\":2,\"c\":3}", 12); /* a third member: no comma */
    free(m);
    lms_jschema *o = compile_ok("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                                "\"integer\"},\"b\":{\"type\":\"integer\"},\"c\":{\"type\":"
                                "\"integer\"}},\"minProperties\":2}");
    check_valid(o, "{\"a\":1,\"c\":3}");
    check_valid(o, "{\"b\":2,\"c\":3}");
    check_refused(o, "{\"c\":3}", 2);          /* c first would leave no second property */
    check_refused(o, "{\"a\":1}", 6);          /* one is too few */
    free(o);
    lms_jschema *z = compile_ok("{\"type\":\"object\",\"properties\":{\"p\":{\"type\":"
                                "\"object\",\"maxProperties\":0}},\"required\":[\"p\"]}");
    check_valid(z, "{\"p\":{}}");
    check_refused(z, "{\"p\":{\"", 6);
    free(z);
}

static void test_refused_schemas(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *says;
    } bad[] = {
        {"{\"type\":\"string\"}", "top-level"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":2}}}",
         "'multipleOf'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"string\"},"
         "{\"enum\":[\"a\"]}]}}}",
         "start differently"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/nope\"}}}", "$ref"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"strin\"}}}", "unknown type"},
        {"{\"type\":", "not JSON"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":3,"
         "\"maxLength\":2}}}",
         "above 'maxLength'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"minimum\":3,\"exclusiveMaximum\":3}}}",
         "no number"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"minLength\":-1}}}", "'minLength'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"allOf\":[{},{}]}}}", "one schema"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"maximum\":\"9\"}}}", "a number"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"minProperties\":2}",
         "more than the 1 properties"},
        {"{\"type\":\"object\",\"minProperties\":3,\"maxProperties\":1}", "min <= max"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\","
         "\"uniqueItems\":true}}}", "'uniqueItems'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        lms_jschema *sc = lms_jschema_compile(bad[i].schema, strlen(bad[i].schema), err, sizeof err);
        if (sc || !strstr(err, bad[i].says))
            fail_msg("schema %zu: %s (wanted a refusal saying %s)", i, sc ? "accepted" : err,
                     bad[i].says);
    }
}

/* An enum of 300 strings (more than a 64-bit mask held before), listed
 * out of order, some prefixes of others: every value is taken whole, a
 * prefix only where it is a value itself, nothing else; past 4096 values
 * the schema is refused by name. */
static void test_big_enum(void **state)
{
    (void)state;
    enum { N = 300 };
    char *schema = malloc(16 * N + 128), *t = malloc(64);
    int len = sprintf(schema, "{\"type\":\"object\",\"properties\":{\"e\":{\"enum\":[");
    for (int i = N - 1; i >= 0; i--) /* "v299", ..., "v0", and "v1x" after "v1" */
        len += sprintf(schema + len, "\"v%d\",%s", i, i == 1 ? "\"v1x\"," : "");
    len += sprintf(schema + len, "7]}},\"required\":[\"e\"]}");
    lms_jschema *sc = compile_ok(schema);
    for (int i = 0; i < N; i++) {
        sprintf(t, "{\"e\":\"v%d\"}", i);
        check_valid(sc, t);
    }
    check_valid(sc, "{\"e\":\"v1x\"}");
    check_valid(sc, "{\"e\":7}");
    check_refused(sc, "{\"e\":\"v300\"}", 9); /* no value begins with "v300" */
    check_refused(sc, "{\"e\":\"v1y\"}", 8);
    check_refused(sc, "{\"e\":\"w\"}", 6);
    check_refused(sc, "{\"e\":\"v\"}", 7); /* "v" is no value: no closing quote */
    check_refused(sc, "{\"e\":8}", 5);
    free(sc);
    char *big = malloc(16 * 5000 + 128);
    len = sprintf(big, "{\"type\":\"object\",\"properties\":{\"e\":{\"enum\":[");
    for (int i = 0; i < 5000; i++)
        len += sprintf(big + len, "%s%d", i ? "," : "", i);
    sprintf(big + len, "]}}}");
    char err[256] = "";
    assert_null(lms_jschema_compile(big, strlen(big), err, sizeof err));
    assert_non_null(strstr(err, "1 to 4096 values"));
    free(big);
    free(schema);
    free(t);
}

/* without a schema: any object, as lms_jsonfsm; a copy carries the state */
static void test_plain_and_copy(void **state)
{
    (void)state;
    lms_jschk k, c;
    lms_jschk_init(&k, NULL);
    assert_true(lms_jschk_feed(&k, "{\"z\":[1,{\"q\":", 13));
    lms_jschk_copy(&c, &k);
    assert_true(lms_jschk_same(&c, &k));
    assert_true(lms_jschk_feed(&c, "true}]}", 7));
    assert_true(lms_jschk_done(&c));
    assert_false(lms_jschk_same(&c, &k));
    lms_jschema *sc = compile_ok(schema_a);
    lms_jschk a, b;
    lms_jschk_init(&a, sc);
    lms_jschk_init(&b, sc);
    assert_true(lms_jschk_feed(&a, "{\"name\":\"x", 10));
    assert_true(lms_jschk_feed(&b, "{\"name\":\"y", 10));
    assert_true(lms_jschk_same(&a, &b)); /* both inside the name */
    free(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_properties),
        cmocka_unit_test(test_refs_maps_alternatives),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_bounds_random),
        cmocka_unit_test(test_patterns),
        cmocka_unit_test(test_member_counts),
        cmocka_unit_test(test_refused_schemas),
        cmocka_unit_test(test_plain_and_copy),
        cmocka_unit_test(test_big_enum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
