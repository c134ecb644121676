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

/* DeepSeek's markers: <｜tool▁calls▁begin｜> and so on (U+FF5C, U+2581) */
#define DS(words) "<\xef\xbd\x9ctool" words "\xef\xbd\x9c>"
#define SP "\xe2\x96\x81"
#define CALLS_BEGIN DS(SP "calls" SP "begin")
#define CALLS_END DS(SP "calls" SP "end")
#define CALL_BEGIN DS(SP "call" SP "begin")
#define CALL_END DS(SP "call" SP "end")
#define SEP DS(SP "sep")

/* Parses text and checks what it reads: content_len bytes of content, then
 * the calls in want as name, arguments, name, arguments, ..., NULL. */
static void expect_calls(const char *text, size_t content_len, const char *const *want)
{
    toolcalls tc = parse(text);
    int n = 0;
    while (want[2 * n])
        n++;
    assert_int_equal(tc.n, n);
    assert_int_equal(tc.content_len, content_len);
    for (int i = 0; i < n; i++) {
        assert_string_equal(tc.v[i].name, want[2 * i]);
        assert_string_equal(tc.v[i].arguments, want[2 * i + 1]);
    }
    toolcalls_free(&tc);
}

/* DeepSeek V3 / R1: function<｜tool▁sep｜>NAME, the arguments in a fence */
static void test_deepseek_v3(void **state)
{
    (void)state;
    expect_calls(CALLS_BEGIN CALL_BEGIN "function" SEP "get_weather\n```json\n"
                 "{\"city\": \"Paris\", \"days\": 2}\n```" CALL_END CALLS_END,
                 0, (const char *const[]){"get_weather", "{\"city\":\"Paris\",\"days\":2}", NULL});
    /* text before, two calls on their own lines, one without "function" */
    expect_calls("Let me check.\n\n" CALLS_BEGIN CALL_BEGIN "function" SEP "a\n```json\n"
                 "{\"x\": 1}\n```" CALL_END "\n" CALL_BEGIN SEP "b\n```json\n{}\n```" CALL_END
                     CALLS_END,
                 strlen("Let me check."), (const char *const[]){"a", "{\"x\":1}", "b", "{}", NULL});
    /* no fence; the closing marker of the calls missing at the end */
    expect_calls(CALLS_BEGIN CALL_BEGIN "function" SEP "f\n{\"q\": \"x\"}" CALL_END "\n", 0,
                 (const char *const[]){"f", "{\"q\":\"x\"}", NULL});
}

/* DeepSeek V3.1: NAME<｜tool▁sep｜>{...} */
static void test_deepseek_v31(void **state)
{
    (void)state;
    expect_calls(CALLS_BEGIN CALL_BEGIN "search" SEP "{\"q\": \"\xc3\xa9t\xc3\xa9\"}" CALL_END
                     CALLS_END,
                 0, (const char *const[]){"search", "{\"q\":\"\xc3\xa9t\xc3\xa9\"}", NULL});
    expect_calls("Two lookups. " CALLS_BEGIN CALL_BEGIN "a" SEP "{\"n\": 1}" CALL_END CALL_BEGIN
                 "b" SEP "{\"n\": [2, 3]}" CALL_END CALLS_END " ",
                 strlen("Two lookups."),
                 (const char *const[]){"a", "{\"n\":1}", "b", "{\"n\":[2,3]}", NULL});
}

/* malformed DeepSeek calls: the whole reply stays content */
static void test_deepseek_malformed(void **state)
{
    (void)state;
    static const char *const texts[] = {
        CALLS_BEGIN,                                                 /* no call */
        CALLS_BEGIN CALLS_END,                                       /* no call */
        CALLS_BEGIN CALL_BEGIN "f" SEP "{\"a\": 1}",                 /* call not closed */
        CALLS_BEGIN CALL_BEGIN "f" SEP "{\"a\": 1" CALL_END CALLS_END, /* broken JSON */
        CALLS_BEGIN CALL_BEGIN "f" SEP "[1]" CALL_END CALLS_END,       /* not an object */
        CALLS_BEGIN CALL_BEGIN SEP "{}" CALL_END CALLS_END,            /* empty name */
        CALLS_BEGIN CALL_BEGIN "function" SEP "\n```json\n{}\n```" CALL_END CALLS_END,
        CALLS_BEGIN CALL_BEGIN "function" SEP "f\n```json\n{}" CALL_END CALLS_END, /* fence */
        CALLS_BEGIN CALL_BEGIN "function" SEP "f\n```json\n```" CALL_END CALLS_END,
        CALLS_BEGIN CALL_BEGIN "function" SEP "f\n" CALL_END CALLS_END,  /* no arguments */
        CALLS_BEGIN CALL_BEGIN "tool" SEP "f\n{}" CALL_END CALLS_END,    /* not "function" */
        CALLS_BEGIN CALL_BEGIN "f" SEP "{} extra" CALL_END CALLS_END,     /* text after */
        CALLS_BEGIN CALL_BEGIN "f" CALL_END CALLS_END,                  /* no separator */
        CALLS_BEGIN "f" SEP "{}" CALL_END CALLS_END,                    /* no call begin */
        CALLS_BEGIN CALL_BEGIN "a" SEP "{}" CALL_END " text " CALL_BEGIN "b" SEP "{}" CALL_END,
        CALLS_BEGIN CALL_BEGIN "a" SEP "{}" CALL_END CALL_BEGIN "b" SEP "{}", /* 2nd cut */
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        toolcalls tc = parse(texts[i]);
        if (tc.n != 0)
            fail_msg("DeepSeek text %zu read as %d calls", i, tc.n);
        toolcalls_free(&tc);
    }
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
    check_stream("ok " CALLS_BEGIN CALL_BEGIN "f" SEP "{}" CALL_END CALLS_END, 2);
    check_stream("ok <\xef\xbd", 2);      /* cut inside the first marker character */
    check_stream("ok <\xef\xbd\x9ctool" SP "calls" SP "be", 2); /* a partial marker */
    check_stream("ok " DS(SP "calls"), 23);                   /* no marker after all */
    check_stream("ok \xef\xbd\x9c", 6);  /* a fullwidth bar outside a marker is text */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tags),
        cmocka_unit_test(test_xml),
        cmocka_unit_test(test_markers),
        cmocka_unit_test(test_deepseek_v3),
        cmocka_unit_test(test_deepseek_v31),
        cmocka_unit_test(test_deepseek_malformed),
        cmocka_unit_test(test_bare_json),
        cmocka_unit_test(test_not_calls),
        cmocka_unit_test(test_stream_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
