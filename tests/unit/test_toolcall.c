/*
 * test_toolcall.c - function calls found in model replies (serve/toolcall):
 * each written form, text before the calls, malformed calls left as
 * content, and the streaming hold-back never releasing part of a call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/toolcall.h"
#include "testutil.h"

static toolcalls parse(const char *text)
{
    toolcalls tc;
    assert_int_equal(toolcall_parse(text, strlen(text), &tc), 0);
    return tc;
}

static void test_tags(void **state)
{
    (void)state;
    toolcalls tc = parse("Let me look.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                         "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n"
                         "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>");
    assert_int_equal(tc.n, 2);
    assert_int_equal(tc.content_len, strlen("Let me look."));
    assert_string_equal(tc.v[0].name, "get_weather");
    assert_string_equal(tc.v[0].arguments, "{\"city\":\"Paris\",\"days\":2}");
    assert_string_equal(tc.v[1].name, "now");
    assert_string_equal(tc.v[1].arguments, "{}");
    toolcalls_free(&tc);
    /* no closing tag at the end of the reply; arguments given as a string */
    tc = parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}");
    assert_int_equal(tc.n, 1);
    assert_int_equal(tc.content_len, 0);
    assert_string_equal(tc.v[0].arguments, "{\"a\": 1}");
    toolcalls_free(&tc);
}

/* Qwen3-Coder / Qwen3.5: <function=...> with <parameter=...> inside the tags */
static void test_xml(void **state)
{
    (void)state;
    toolcalls tc = parse("I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                         "New York\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
                         "<parameter=opts>\n{\"unit\": \"C\", \"hourly\": true}\n</parameter>\n"
                         "<parameter=note>\nline one\nline two\n</parameter>\n</function>\n"
                         "</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>");
    assert_int_equal(tc.n, 2);
    assert_int_equal(tc.content_len, strlen("I'll check."));
    assert_string_equal(tc.v[0].name, "get_weather");
    assert_string_equal(tc.v[0].arguments, "{\"city\":\"New York\",\"days\":3,\"opts\":{\"unit\":"
                                           "\"C\",\"hourly\":true},\"note\":\"line one\\nline two\"}");
    assert_string_equal(tc.v[1].name, "now");
    assert_string_equal(tc.v[1].arguments, "{}");
    toolcalls_free(&tc);
    /* the reply ended before </function> and </tool_call>: the call stands */
    tc = parse("<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n");
    assert_int_equal(tc.n, 1);
    assert_string_equal(tc.v[0].arguments, "{\"a\":\"x\"}");
    toolcalls_free(&tc);
    /* a parameter cut mid-way, or stray text: no call, all content */
    tc = parse("<tool_call>\n<function=f>\n<parameter=a>\nx");
    assert_int_equal(tc.n, 0);
    tc = parse("<tool_call>\n<function=f>\nhello\n</function>\n</tool_call>");
    assert_int_equal(tc.n, 0);
    tc = parse("<tool_call>\n<function=>\n</function>\n</tool_call>");
    assert_int_equal(tc.n, 0);
}

/* the marker forms: Mistral's newer [TOOL_CALLS]NAME[ARGS]{...}, Llama's
 * <|python_tag|>, Granite's <|tool_call|>; text before a marker is content */
static void test_markers(void **state)
{
    (void)state;
    toolcalls tc = parse("Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}"
                         "[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}");
    assert_int_equal(tc.n, 2);
    assert_int_equal(tc.content_len, strlen("Checking."));
    assert_string_equal(tc.v[0].name, "get_weather");
    assert_string_equal(tc.v[0].arguments, "{\"city\":\"Paris\"}");
    assert_string_equal(tc.v[1].name, "now");
    assert_string_equal(tc.v[1].arguments, "{}");
    toolcalls_free(&tc);
    tc = parse("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
    assert_int_equal(tc.n, 1);
    assert_int_equal(tc.content_len, 0);
    toolcalls_free(&tc);
    tc = parse("<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}");
    assert_int_equal(tc.n, 1);
    assert_string_equal(tc.v[0].arguments, "{\"q\":\"x\"}");
    toolcalls_free(&tc);
    tc = parse("Sure. <|tool_call|>[{\"name\": \"g\", \"arguments\": {}}]");
    assert_int_equal(tc.n, 1);
    assert_int_equal(tc.content_len, strlen("Sure."));
    toolcalls_free(&tc);
    /* incomplete or stray: content */
    tc = parse("[TOOL_CALLS]get_weather[ARGS]{\"city\": ");
    assert_int_equal(tc.n, 0);
    tc = parse("[TOOL_CALLS][ARGS]{}");
    assert_int_equal(tc.n, 0);
    tc = parse("[TOOL_CALLS]f[ARGS]{} and then text");
    assert_int_equal(tc.n, 0);
    tc = parse("<|python_tag|>print(1)");
    assert_int_equal(tc.n, 0);
}

static void test_bare_json(void **state)
{
    (void)state;
    /* Llama 3.x: "parameters", several calls separated by ';' */
    toolcalls tc = parse(" {\"name\": \"a\", \"parameters\": {\"x\": \"\xc3\xa9\"}}; "
                         "{\"name\": \"b\", \"parameters\": {}}\n");
    assert_int_equal(tc.n, 2);
    assert_string_equal(tc.v[0].name, "a");
    assert_string_equal(tc.v[0].arguments, "{\"x\":\"\xc3\xa9\"}");
    assert_string_equal(tc.v[1].name, "b");
    toolcalls_free(&tc);
    /* Mistral: an array, with or without its marker; OpenAI's nested shape */
    tc = parse("[TOOL_CALLS] [{\"name\": \"m\", \"arguments\": {\"q\": 1}}]");
    assert_int_equal(tc.n, 1);
    assert_string_equal(tc.v[0].name, "m");
    toolcalls_free(&tc);
    tc = parse("[{\"type\": \"function\", \"function\": {\"name\": \"n\", \"arguments\": {}}}]");
    assert_int_equal(tc.n, 1);
    assert_string_equal(tc.v[0].name, "n");
    toolcalls_free(&tc);
}

static void test_not_calls(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "",
        "Plain answer.",
        "{\"answer\": 42}",                                    /* JSON without a name */
        "{\"name\": \"f\", \"parameters\": {}} and more text", /* trailing prose */
        "[1, 2, 3]",
        "[]",
        "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>", /* broken JSON */
        "<tool_call>not json</tool_call>",
        "{\"name\": 5, \"arguments\": {}}",
        "{\"name\": \"f\", \"arguments\": 7}",
        "The tag <tool_call is not closed",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        toolcalls tc = parse(texts[i]);
        if (tc.n != 0)
            fail_msg("'%s' read as %d calls", texts[i], tc.n);
        toolcalls_free(&tc);
    }
}

/* Streaming: appended one byte at a time, the safe length never shrinks and
 * never reaches into a call. */
static void check_stream(const char *text, size_t want_final)
{
    size_t n = strlen(text), prev = 0;
    for (size_t k = 0; k <= n; k++) {
        size_t safe = toolcall_safe_len(text, k);
        if (safe < prev || safe > k)
            fail_msg("'%.*s': safe %zu after %zu", (int)k, text, safe, prev);
        prev = safe;
    }
    assert_int_equal(prev, want_final);
}

static void test_stream_hold(void **state)
{
    (void)state;
    check_stream("Hello there", 11);
    /* whitespace before a call is held: the call trims it from the content */
    check_stream("Hello there \n", 11);
    check_stream("Sure.\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>", 5);
    check_stream("  {\"name\": \"f\", \"parameters\": {}}", 0);
    check_stream("[TOOL_CALLS][{\"name\": \"f\"}]", 0);
    check_stream("a < b and <tool", 9);
    check_stream("x <tool_cal", 1);
    check_stream("<tool", 0);
    check_stream("ok [TOOL_CALLS]f[ARGS]{}", 2);
    check_stream("ok [TOOL_", 2);
    check_stream("ok <|python", 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tags),
        cmocka_unit_test(test_xml),
        cmocka_unit_test(test_markers),
        cmocka_unit_test(test_bare_json),
        cmocka_unit_test(test_not_calls),
        cmocka_unit_test(test_stream_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
