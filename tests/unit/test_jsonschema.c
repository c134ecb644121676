/*
 * test_jsonschema.c - JSON mode held to a schema (engine/jsonschema.h):
 * objects the schema allows are accepted and done, every proper prefix
 * accepted, and each kind of violation refused at the byte where it
 * begins: property order and required properties, types, integers, enums,
 * array bounds, maps, anyOf, $ref (recursive); schemas the compiler
 * refuses, with the keyword named.
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

static void test_refused_schemas(void **state)
{
    (void)state;
    static const struct {
        const char *schema, *says;
    } bad[] = {
        {"{\"type\":\"string\"}", "top-level"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}",
         "'pattern'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"string\"},"
         "{\"enum\":[\"a\"]}]}}}",
         "start differently"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/nope\"}}}", "$ref"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"strin\"}}}", "unknown type"},
        {"{\"type\":", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        lms_jschema *sc = lms_jschema_compile(bad[i].schema, strlen(bad[i].schema), err, sizeof err);
        if (sc || !strstr(err, bad[i].says))
            fail_msg("schema %zu: %s (wanted a refusal saying %s)", i, sc ? "accepted" : err,
                     bad[i].says);
    }
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
        cmocka_unit_test(test_refused_schemas),
        cmocka_unit_test(test_plain_and_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
