/*
 * test_remote.c - the pure parts of remote experts (src/route/remote.c,
 * config.c) without a network: the Server-Sent Events reader fed in
 * every split, OpenAI stream payloads (chat deltas, completion text,
 * finish reasons, usage, errors), error bodies, and the configuration
 * of an expert with an "endpoint" (accepted forms, errors naming the
 * field, the key never in a message).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "route/config.h"
#include "route/remote.h"
#include "testutil.h"

/* ---- SSE reader ------------------------------------------------------------------------ */

typedef struct events {
    char got[16][256];
    bool overflow[16];
    int n;
} events;

static void collect(void *ud, const char *data, size_t n, bool overflow)
{
    events *e = ud;
    if (e->n < 16) {
        snprintf(e->got[e->n], sizeof e->got[0], "%.*s", (int)n, data);
        e->overflow[e->n] = overflow;
        e->n++;
    }
}

static const char k_stream[] = ": keep-alive\r\n"
                               "data: {\"a\":1}\r\n\r\n"
                               "event: message\n"
                               "id: 7\n"
                               "data:two\n"
                               "data: lines\n\n"
                               "retry: 100\n"
                               "data\n\n"
                               "data: [DONE]\r\r"
                               "data: cut off"; /* no blank line: never dispatched */

static void expect_stream(const events *e)
{
    assert_int_equal(e->n, 4);
    assert_string_equal(e->got[0], "{\"a\":1}");
    assert_string_equal(e->got[1], "two\nlines");
    assert_string_equal(e->got[2], "");
    assert_string_equal(e->got[3], "[DONE]");
    for (int i = 0; i < e->n; i++)
        assert_false(e->overflow[i]);
}

static void test_sse_whole(void **state)
{
    (void)state;
    lms_sse p;
    events e = {0};
    lms_sse_init(&p);
    assert_int_equal(lms_sse_feed(&p, k_stream, sizeof k_stream - 1, collect, &e), 0);
    expect_stream(&e);
    lms_sse_deinit(&p);
}

/* Every split into two feeds, and byte by byte, gives the same events
 * (CRLF split between feeds included). */
static void test_sse_splits(void **state)
{
    (void)state;
    size_t n = sizeof k_stream - 1;
    for (size_t cut = 0; cut <= n; cut++) {
        lms_sse p;
        events e = {0};
        lms_sse_init(&p);
        assert_int_equal(lms_sse_feed(&p, k_stream, cut, collect, &e), 0);
        assert_int_equal(lms_sse_feed(&p, k_stream + cut, n - cut, collect, &e), 0);
        expect_stream(&e);
        lms_sse_deinit(&p);
    }
    lms_sse p;
    events e = {0};
    lms_sse_init(&p);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(lms_sse_feed(&p, k_stream + i, 1, collect, &e), 0);
    expect_stream(&e);
    lms_sse_deinit(&p);
}

/* An event over LMS_SSE_MAX is flagged, and the next one is whole again. */
static void test_sse_overflow(void **state)
{
    (void)state;
    size_t big = LMS_SSE_MAX + 100;
    char *buf = malloc(big + 64);
    assert_non_null(buf);
    memcpy(buf, "data: ", 6);
    memset(buf + 6, 'x', big);
    memcpy(buf + 6 + big, "\n\ndata: ok\n\n", 12);
    lms_sse p;
    events e = {0};
    lms_sse_init(&p);
    assert_int_equal(lms_sse_feed(&p, buf, 6 + big + 12, collect, &e), 0);
    assert_int_equal(e.n, 2);
    assert_true(e.overflow[0]);
    assert_false(e.overflow[1]);
    assert_string_equal(e.got[1], "ok");
    lms_sse_deinit(&p);
    free(buf);
}

/* ---- payloads ---------------------------------------------------------------------------- */

static void test_chunks(void **state)
{
    (void)state;
    lms_remote_delta d;
    const char *s = "{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
                    "\"delta\":{\"content\":\" Hel\\u00e9\"},\"finish_reason\":null}]}";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), true, &d), 0);
    assert_int_equal(d.n_text, strlen(" Hel\xc3\xa9"));
    assert_string_equal(d.text, " Hel\xc3\xa9");
    assert_null(d.finish);
    assert_int_equal(d.n_prompt, -1);
    lms_remote_delta_free(&d);

    s = "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), true, &d), 0);
    assert_null(d.text); /* an empty piece is no piece */
    lms_remote_delta_free(&d);

    s = "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), true, &d), 0);
    assert_string_equal(d.finish, "length");
    lms_remote_delta_free(&d);

    s = "{\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":34,"
        "\"total_tokens\":46}}";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), true, &d), 0);
    assert_int_equal(d.n_prompt, 12);
    assert_int_equal(d.n_gen, 34);
    assert_null(d.text);
    lms_remote_delta_free(&d);

    s = "{\"object\":\"text_completion\",\"choices\":[{\"text\":\" dog\",\"index\":0,"
        "\"finish_reason\":\"weird\"}]}";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), false, &d), 0);
    assert_string_equal(d.text, " dog");
    assert_string_equal(d.finish, "stop"); /* unknown reasons read as stop */
    lms_remote_delta_free(&d);

    s = " [DONE] ";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), true, &d), 0);
    assert_true(d.done);
    lms_remote_delta_free(&d);

    s = "{\"error\":{\"message\":\"model overloaded\",\"type\":\"server_error\"}}";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), true, &d), 0);
    assert_string_equal(d.error, "model overloaded");
    lms_remote_delta_free(&d);

    s = "{\"choices\":[{\"delta\":{\"content\":";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), true, &d), LMS_ERR_FORMAT);
    s = "[1,2]";
    assert_int_equal(lms_remote_parse_chunk(s, strlen(s), true, &d), LMS_ERR_FORMAT);
}

static void test_error_bodies(void **state)
{
    (void)state;
    static const struct {
        const char *body, *want;
    } cases[] = {
        {"{\"error\":{\"message\":\"Invalid API key\",\"code\":401}}", "Invalid API key"},
        {"{\"error\":\"model 'x' not found\"}", "model 'x' not found"}, /* Ollama */
        {"{\"detail\":\"Not Found\"}", "Not Found"},                    /* FastAPI (vLLM) */
        {"{\"message\":\"bad\"}", "bad"},
        {"{\"error\":{\"code\":500}}", "(no message)"},
        {"<html>502 Bad Gateway</html>", NULL},
        {"{\"ok\":true}", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *m = lms_remote_error_message(cases[i].body, strlen(cases[i].body));
        if (cases[i].want)
            assert_string_equal(m, cases[i].want);
        else
            assert_null(m);
        free(m);
    }
}

/* ---- configuration -------------------------------------------------------------------------- */

static int parse(const char *text, lms_route_cfg *c, char *err, size_t errsz)
{
    return lms_route_cfg_parse(text, strlen(text), "cfg.json", "/tmp", c, err, errsz);
}

static void expect_err(const char *text, const char *want)
{
    lms_route_cfg c;
    char err[512] = "";
    assert_true(parse(text, &c, err, sizeof err) < 0);
    if (strcmp(err, want) != 0)
        fail_msg("got '%s'\nwant '%s'", err, want);
    assert_null(strstr(err, "s3cret")); /* the key never shows */
}

static void test_config_remote(void **state)
{
    (void)state;
    lms_route_cfg c;
    char err[512] = "";
    setenv("LMS_TEST_REMOTE_KEY", "s3cret-from-env", 1);
    const char *ok = "{\"experts\":["
                     "{\"expert_id\":\"far\",\"endpoint\":\"http://10.0.0.2:8080/v1//\","
                     "\"api_key\":\"s3cret\",\"domain\":\"far\",\"timeout_s\":5.5},"
                     "{\"expert_id\":\"oai\",\"endpoint\":\"https://api.example.com/v1\","
                     "\"api_key_env\":\"LMS_TEST_REMOTE_KEY\",\"remote_model\":\"gpt-x\"}],"
                     "\"router\":{\"default\":\"far\"}}";
    if (parse(ok, &c, err, sizeof err) < 0)
        fail_msg("unexpected error: %s", err);
    assert_int_equal(c.n_experts, 2);
    assert_null(c.experts[0].path);
    assert_string_equal(c.experts[0].endpoint, "http://10.0.0.2:8080/v1");
    assert_string_equal(c.experts[0].api_key, "s3cret");
    assert_string_equal(c.experts[0].remote_model, "far"); /* default: the id */
    assert_true(c.experts[0].timeout_s == 5.5);
    assert_string_equal(c.experts[1].api_key, "s3cret-from-env");
    assert_string_equal(c.experts[1].remote_model, "gpt-x");
    assert_true(c.experts[1].timeout_s == 600);
    lms_route_cfg_free(&c);

    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h/v1\","
               "\"model_path\":\"x.gguf\"}]}",
               "cfg.json: experts[0].model_path: cannot be given with endpoint (an expert is "
               "local or remote)");
    expect_err("{\"experts\":[{\"expert_id\":\"a\"}]}",
               "cfg.json: experts[0].model_path: is missing (or give 'endpoint' for an expert "
               "served elsewhere)");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"ftp://h/v1\"}]}",
               "cfg.json: experts[0].endpoint: must start with http:// or https://");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http:///v1\"}]}",
               "cfg.json: experts[0].endpoint: names no host");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://u:s3cret@h/v1\"}]}",
               "cfg.json: experts[0].endpoint: must not hold credentials (use api_key or "
               "api_key_env)");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h/v1 x\"}]}",
               "cfg.json: experts[0].endpoint: must be printable ASCII without spaces");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h/v1?k=s3cret\"}]}",
               "cfg.json: experts[0].endpoint: must not hold a query or fragment");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":7}]}",
               "cfg.json: experts[0].endpoint: must be a string");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h\",\"api_key\":\"s3cret\","
               "\"api_key_env\":\"HOME\"}]}",
               "cfg.json: experts[0].api_key_env: cannot be given with api_key");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h\","
               "\"api_key_env\":\"LMS_TEST_UNSET_VARIABLE\"}]}",
               "cfg.json: experts[0].api_key_env: the environment variable "
               "'LMS_TEST_UNSET_VARIABLE' is not set");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h\","
               "\"api_key\":\"s3cret\\r\\nX-Evil: 1\"}]}",
               "cfg.json: experts[0].api_key: contains a control character");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h\","
               "\"api_key\":\"s3cret\\tx\"}]}",
               "cfg.json: experts[0].api_key: the key contains a control character");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h\",\"timeout_s\":0}]}",
               "cfg.json: experts[0].timeout_s: must be between 0.1 and 86400");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h\",\"lora\":[]}]}",
               "cfg.json: experts[0].endpoint: an expert with an endpoint takes no 'lora'");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"model_path\":\"x.gguf\","
               "\"remote_model\":\"m\"}]}",
               "cfg.json: experts[0].remote_model: is only for an expert with 'endpoint'");
    expect_err("{\"experts\":[{\"expert_id\":\"a\",\"endpoint\":\"http://h\"}],"
               "\"router\":{\"embedding_model\":\"a\"}}",
               "cfg.json: router.embedding_model: 'a' is a remote expert; the router embeds "
               "with a local model");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_whole),
        cmocka_unit_test(test_sse_splits),
        cmocka_unit_test(test_sse_overflow),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_error_bodies),
        cmocka_unit_test(test_config_remote),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
