/*
 * test_serve_reqparse.c - the server's request parsing without a socket:
 * JSON bodies (errors with line and column), typed fields that name the
 * field they refuse, the shared generation parameters, the OpenAI error
 * object, chat message normalization, and the UTF-8 scrubber; plus hostile
 * bodies (every truncation of a valid request, random bytes) that must be
 * refused cleanly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_int.h"
#include "testutil.h"

static json_t *parse_ok(const char *text)
{
    reqerr e;
    json_t *j = NULL;
    assert_int_equal(reqparse_body(text, strlen(text), &j, &e), 0);
    assert_non_null(j);
    return j;
}

static void test_body_errors(void **state)
{
    reqerr e;
    json_t *j = NULL;
    assert_int_equal(reqparse_body("{\"a\": [1,}", 10, &j, &e), -1);
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.msg, "line 1, column 10"));
    assert_int_equal(reqparse_body("[1, 2]", 6, &j, &e), -1);
    assert_non_null(strstr(e.msg, "JSON object"));
    assert_int_equal(reqparse_body("", 0, &j, &e), -1);
    assert_int_equal(reqparse_body("{} trailing", 11, &j, &e), -1);
    /* NUL in a string: named as such, not by the JSON library's option */
    assert_int_equal(reqparse_body("{\"a\": \"x\\u0000y\"}", 17, &j, &e), -1);
    assert_non_null(strstr(e.msg, "\\u0000 (NUL)"));
    assert_null(strstr(e.msg, "JSON_ALLOW_NUL"));
    assert_null(j);
}

static void test_typed_fields(void **state)
{
    json_t *o = parse_ok("{\"t\":\"hot\",\"n\":5,\"f\":2.5,\"b\":1,\"s\":3,\"nul\":null,\"i\":4.0}");
    reqerr e;
    double d;
    int64_t x;
    bool b;
    const char *s;
    assert_int_equal(reqparse_num(o, "t", 0, 2, &d, &e), -1);
    assert_string_equal(e.param, "t");
    assert_non_null(strstr(e.msg, "must be a number"));
    assert_int_equal(reqparse_num(o, "f", 0, 2, &d, &e), -1);
    assert_non_null(strstr(e.msg, "between 0 and 2"));
    assert_int_equal(reqparse_int(o, "n", 0, 10, &x, &e), 1);
    assert_int_equal(x, 5);
    assert_int_equal(reqparse_int(o, "i", 0, 10, &x, &e), 1); /* 4.0 is an integer */
    assert_int_equal(reqparse_int(o, "f", 0, 10, &x, &e), -1);
    assert_int_equal(reqparse_bool(o, "b", &b, &e), -1);
    assert_string_equal(e.param, "b");
    assert_int_equal(reqparse_str(o, "s", &s, &e), -1);
    assert_int_equal(reqparse_str(o, "nul", &s, &e), 0);     /* null = absent */
    assert_int_equal(reqparse_str(o, "missing", &s, &e), 0);
    json_decref(o);
}

static void test_genparams(void **state)
{
    json_t *o = parse_ok("{\"temp\":0.5,\"top_k\":7,\"top_p\":0.9,\"seed\":42,\"max_tokens\":9,"
                         "\"stop\":[\"a\",\"\",\"bc\"],\"ignore_eos\":true,\"unknown\":{},"
                         "\"typical_p\":0.7,\"mirostat\":2,\"mirostat_tau\":3,\"mirostat_eta\":0.2}");
    genparams gp;
    reqerr e;
    genparams_init(&gp, 1);
    assert_int_equal(reqparse_gen(o, &gp, &e), 0);
    assert_true(gp.sp.temperature == 0.5f);
    assert_int_equal(gp.sp.top_k, 7);
    assert_int_equal(gp.sp.seed, 42);
    assert_true(gp.has_seed);
    assert_int_equal(gp.max_tokens, 9);
    assert_int_equal(gp.n_stop, 2); /* the empty one is dropped */
    assert_string_equal(gp.stop[1], "bc");
    assert_true(gp.ignore_eos);
    assert_true(gp.sp.typical_p == 0.7f && gp.sp.mirostat == 2);
    assert_true(gp.sp.mirostat_tau == 3.0f && gp.sp.mirostat_eta == 0.2f);
    genparams_deinit(&gp);
    json_decref(o);

    const char *bad[][2] = {
        {"{\"max_tokens\":0}", "max_tokens"},
        {"{\"max_tokens\":\"9\"}", "max_tokens"},
        {"{\"stop\":[1]}", "stop"},
        {"{\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}", "stop"},
        {"{\"top_p\":1.5}", "top_p"},
        {"{\"temperature\":-1}", "temperature"},
        {"{\"top_k\":-3}", "top_k"},
        {"{\"presence_penalty\":5}", "presence_penalty"},
        {"{\"mirostat\":3}", "mirostat"},
        {"{\"typical_p\":0}", "typical_p"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = parse_ok(bad[i][0]);
        genparams_init(&gp, 1);
        assert_int_equal(reqparse_gen(o, &gp, &e), -1);
        assert_string_equal(e.param, bad[i][1]);
        assert_int_equal(e.status, 400);
        genparams_deinit(&gp);
        json_decref(o);
    }
}

static void test_error_json(void **state)
{
    reqerr e;
    reqerr_set(&e, 404, "model", "no model '%s'", "x");
    e.code = "model_not_found";
    json_t *j = reqerr_json(&e);
    json_t *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "no model 'x'");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "model");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "model_not_found");
    assert_string_equal(json_string_value(json_object_get(err, "type")), "not_found_error");
    json_decref(j);
    reqerr_set(&e, 429, NULL, "busy");
    j = reqerr_json(&e);
    err = json_object_get(j, "error");
    assert_true(json_is_null(json_object_get(err, "param")));
    assert_true(json_is_null(json_object_get(err, "code")));
    json_decref(j);
}

static void test_messages(void **state)
{
    reqerr e;
    json_t *in = parse_ok("{\"m\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                          "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                          "{\"type\":\"text\",\"text\":\"b\"}]},"
                          "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
                          "{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
                          "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}},"
                          "{\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}}]}]}");
    json_t *m = chatfmt_messages(json_object_get(in, "m"), "messages", &e);
    assert_non_null(m);
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 0), "role")), "system");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 1), "content")), "a\nb");
    assert_non_null(json_object_get(json_array_get(m, 2), "tool_calls"));
    /* a call's arguments given as a JSON string become the object; other strings stay */
    const json_t *calls = json_object_get(json_array_get(m, 3), "tool_calls");
    const json_t *a0 = json_object_get(json_object_get(json_array_get(calls, 0), "function"),
                                       "arguments");
    const json_t *a1 = json_object_get(json_object_get(json_array_get(calls, 1), "function"),
                                       "arguments");
    assert_int_equal(json_integer_value(json_object_get(a0, "a")), 1);
    assert_string_equal(json_string_value(a1), "not json");
    json_decref(m);
    json_decref(in);

    const char *bad[] = {
        "{\"m\":\"hi\"}", "{\"m\":[]}", "{\"m\":[1]}", "{\"m\":[{\"content\":\"x\"}]}",
        "{\"m\":[{\"role\":\"user\",\"content\":5}]}",
        "{\"m\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
        "{\"m\":[{\"role\":\"user\",\"content\":[7]}]}", "{}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        in = parse_ok(bad[i]);
        assert_null(chatfmt_messages(json_object_get(in, "m"), "messages", &e));
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "messages");
        json_decref(in);
    }
}

static void test_utf8(void **state)
{
    sbuf b = {0};
    sbuf_add_utf8(&b, "a\xff" "b\xe2\x82" "c\xe2\x82\xac", 9);
    assert_string_equal(b.p, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD" "c\xe2\x82\xac");
    sbuf_free(&b);
    json_t *s = json_string_lossy("x\xc0\xaf", 3);
    assert_non_null(s);
    assert_string_equal(json_string_value(s), "x\xEF\xBF\xBD\xEF\xBF\xBD");
    json_decref(s);
    json_t *r = json_real_safe(-1.0 / 0.0);
    assert_non_null(r);
    json_decref(r);
}

/* Every prefix of a valid request and random bytes: refused or parsed,
 * never a crash (ASan checks the rest). */
static void test_hostile_bodies(void **state)
{
    const char *good = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9\"}],"
                       "\"temperature\":0.2,\"stop\":[\"x\"],\"max_tokens\":3}";
    size_t n = strlen(good);
    reqerr e;
    for (size_t k = 0; k <= n; k++) {
        json_t *j = NULL;
        int rc = reqparse_body(good, k, &j, &e);
        assert_true(rc == 0 ? k == n : e.status == 400);
        json_decref(j);
    }
    uint64_t seed = 7;
    char buf[256];
    for (int it = 0; it < 2000; it++) {
        size_t len = (size_t)(tu_rand_u64(&seed) % sizeof buf);
        for (size_t i = 0; i < len; i++)
            buf[i] = (char)(tu_rand_u64(&seed) & 0xff);
        if (len)
            buf[0] = '{';
        json_t *j = NULL;
        if (reqparse_body(buf, len, &j, &e) == 0) {
            genparams gp;
            genparams_init(&gp, 1);
            reqparse_gen(j, &gp, &e);
            genparams_deinit(&gp);
            json_decref(chatfmt_messages(json_object_get(j, "messages"), "messages", &e));
            json_decref(j);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_body_errors),  cmocka_unit_test(test_typed_fields),
        cmocka_unit_test(test_genparams),    cmocka_unit_test(test_error_json),
        cmocka_unit_test(test_messages),     cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_hostile_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
