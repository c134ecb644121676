/*
 * test_toolcall.c - function calls found in model replies (serve/toolcall):
 * each written form, text before the calls, malformed calls left as
 * content, the streaming hold-back never releasing part of a call, and
 * reply_cut streamed and whole giving the same content.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/reply.h"
#include "serve/toolcall.h"
#include "testutil.h"

/* names: the request's function names (NULL-terminated), or NULL */
static toolcalls parse_names(const char *text, const char *const *names)
{
    toolcalls tc;
    assert_int_equal(toolcall_parse(text, strlen(text), names, &tc), 0);
    return tc;
}

static toolcalls parse(const char *text)
{
    return parse_names(text, NULL);
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

/* Texts that must not be read as calls: each stays content, all of it. */
static void expect_content(const char *const *texts, size_t n_texts, const char *form)
{
    for (size_t i = 0; i < n_texts; i++) {
        toolcalls tc = parse(texts[i]);
        if (tc.n != 0 || tc.content_from != 0 || tc.content_len != strlen(texts[i]))
            fail_msg("%s text %zu read as %d calls, content [%zu, +%zu)", form, i, tc.n,
                     tc.content_from, tc.content_len);
        toolcalls_free(&tc);
    }
}

/* Parses text and checks that its content is want (from content_from on). */
static void expect_content_is(const char *text, const char *want, int n_calls)
{
    toolcalls tc = parse(text);
    assert_int_equal(tc.n, n_calls);
    if (tc.content_len != strlen(want) || tc.content_from + tc.content_len > strlen(text) ||
        memcmp(text + tc.content_from, want, tc.content_len))
        fail_msg("'%s': content '%.*s', not '%s'", text, (int)tc.content_len,
                 text + tc.content_from, want);
    toolcalls_free(&tc);
}

/* Functionary v3.1, Llama 3.1's custom form: <function=NAME>{...}</function> */
static void test_function_tags(void **state)
{
    (void)state;
    expect_calls("<function=get_weather>{\"city\": \"Paris\"}</function>", 0,
                 (const char *const[]){"get_weather", "{\"city\":\"Paris\"}", NULL});
    expect_calls("Let me check.\n<function=a>{\"x\": \"\xc3\xa9\"}</function>\n"
                 "<function=b.c>{}</function><|eom_id|>",
                 strlen("Let me check."),
                 (const char *const[]){"a", "{\"x\":\"\xc3\xa9\"}", "b.c", "{}", NULL});
    /* the last closing tag missing at the end of the reply */
    expect_calls("<function=f>{\"a\": [1, 2]} ", 0,
                 (const char *const[]){"f", "{\"a\":[1,2]}", NULL});
    static const char *const bad[] = {
        "<function=f>{\"a\": 1</function>",           /* broken JSON */
        "<function=>{}</function>",                    /* no name */
        "<function=f g>{}</function>",                 /* not a name */
        "<function=f>[1]</function>",                  /* not an object */
        "<function=f>{} x</function>",                 /* text after the arguments */
        "<function=f>",                                /* no arguments */
        "<function=f",                                 /* cut in the tag */
        "<function=a>{}</function><function=b>{\"x\"", /* the second call cut */
        "See <function=f>: {}",
    };
    expect_content(bad, sizeof bad / sizeof bad[0], "<function=");
}

/* Functionary v3.2: >>>NAME\n{...} blocks, "all" for the content */
static void test_functionary(void **state)
{
    (void)state;
    const char *t = ">>>all\nLet me look.>>>get_weather\n{\"city\": \"Paris\"}>>>now\n{}";
    expect_calls(t, strlen("Let me look."),
                 (const char *const[]){"get_weather", "{\"city\":\"Paris\"}", "now", "{}", NULL});
    expect_content_is(t, "Let me look.", 2);
    /* the generation prompt ended with ">>>": the first block without it */
    expect_content_is("all\nSure.\n>>>f\n{\"a\": [1, 2]}\n", "Sure.", 1);
    expect_calls("get_weather\n{\"city\": \"Paris\"}\n>>>now\n{}", 0,
                 (const char *const[]){"get_weather", "{\"city\":\"Paris\"}", "now", "{}", NULL});
    expect_calls(">>>f\n{\"q\": \"a>>>b\\n\"}", 0,
                 (const char *const[]){"f", "{\"q\":\"a>>>b\\n\"}", NULL});
    /* an "all" block or other text after the calls is dropped */
    expect_calls(">>>f\n{}>>>all\nDone.", 0, (const char *const[]){"f", "{}", NULL});
    expect_calls(">>>f\n{} text >>>g\n{\"a\": 1", 0, (const char *const[]){"f", "{}", NULL});
    /* content only: without the "all" header */
    expect_content_is("all\nJust text, >>> and all.", "Just text, >>> and all.", 0);
    expect_content_is(">>>all\n\xc3\xa9", "\xc3\xa9", 0);
    static const char *const bad[] = {
        "f\n{\"a\": 1}",                  /* one call without ">>>": the tools are not known */
        ">>>f\n{\"a\": ",                 /* cut */
        ">>>f\n{\"a\" 1}",                /* broken JSON */
        ">>>f\nnot json",
        ">>>f\n[1]",
        ">>>f\n",
        ">>>f",
        "x>>>f\n{}>>>g\n{",               /* the second call cut */
        "Python:\n>>> print(1)\n1\n>>>",  /* no block header */
        "a\n{} b>>>f\n{x}",             /* not "NAME\\n{...}" before: content, then broken */
    };
    expect_content(bad, sizeof bad / sizeof bad[0], "Functionary");
    /* a broken call after "all": the text after the header stays content */
    expect_content_is("all\nx>>>f\n{", "x>>>f\n{", 0);
}

/* Cohere Command R7B / Command A */
#define CO_ACT(calls) "<|START_ACTION|>" calls "<|END_ACTION|>"
static void test_cohere(void **state)
{
    (void)state;
    const char *t = "<|START_THINKING|>I will look up the weather, then the time.<|END_THINKING|>"
                    CO_ACT("[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
                           "\"parameters\": {\"city\": \"Paris\"}},\n    {\"tool_call_id\": \"1\", "
                           "\"tool_name\": \"now\", \"parameters\": {}}\n]");
    /* the plan is content as written here: serve/reasoning takes it apart
     * first where thoughts are (test_reply_stream, test_reasoning) */
    const char *plan = "<|START_THINKING|>I will look up the weather, then the time."
                       "<|END_THINKING|>";
    expect_calls(t, strlen(plan),
                 (const char *const[]){"get_weather", "{\"city\":\"Paris\"}", "now", "{}", NULL});
    expect_content_is(t, plan, 2);
    expect_content_is("Sure. " CO_ACT("[{\"tool_call_id\": \"0\", \"tool_name\": \"f\"}]"),
                      "Sure.", 1);
    /* the closing marker missing at the end; several action blocks */
    expect_calls(CO_ACT("[{\"tool_name\": \"a\", \"parameters\": {\"x\": 1}}]")
                 "\n<|START_ACTION|>[{\"tool_name\": \"b\", \"parameters\": {}}]",
                 0, (const char *const[]){"a", "{\"x\":1}", "b", "{}", NULL});
    /* answers: the content is inside the response markers */
    expect_content_is("<|START_RESPONSE|>Hello there.<|END_RESPONSE|>", "Hello there.", 0);
    expect_content_is("<|START_RESPONSE|>Cut \xc3\xa9", "Cut \xc3\xa9", 0);
    static const char *const bad[] = {
        CO_ACT("[]"),
        CO_ACT("{\"tool_name\": \"f\", \"parameters\": {}}"), /* not an array */
        CO_ACT("[{\"tool_name\": 5}]"),
        CO_ACT("[{\"tool_name\": \"\"}]"),
        CO_ACT("[{\"tool_name\": \"f\", \"parameters\": 3}]"),
        CO_ACT("[{\"name\": \"f\", \"parameters\": {}}]"), /* not Cohere's keys */
        CO_ACT("[{\"tool_name\": \"f\"}] junk"),
        "<|START_ACTION|>[{\"tool_name\": \"f\", \"parameters\": {",
        "<|START_THINKING|>a plan that never ends",
        "<|START_THINKING|>plan <|START_RESPONSE|>x",
        /* a plan before the answer, thoughts not taken apart: all as written */
        "<|START_THINKING|>plan<|END_THINKING|>\n<|START_RESPONSE|>Hi<|END_RESPONSE|>",
        "<|START_THINKING|>plan<|END_THINKING|>\nThe answer.",
    };
    expect_content(bad, sizeof bad / sizeof bad[0], "Cohere");
    /* a plan never closed before a call: kept as content, the call read */
    expect_content_is("<|START_THINKING|>plan " CO_ACT("[{\"tool_name\": \"f\"}]"),
                      "<|START_THINKING|>plan", 1);
}

/* The function names of the requests below that give them. */
static const char *const NAMES[] = {"get_weather", "f", NULL};

/* reply_cut (serve/reply.h) streamed a byte at a time gives the same
 * content and calls as the whole reply, the wrappers left out, with
 * thoughts taken apart or not (reasoning_format "none": left as written),
 * the request's function names known or not. */
static void test_reply_stream(void **state)
{
    (void)state;
    static const struct {
        const char *text, *content;
        int n_calls;
        bool thoughts, named;
    } cases[] = {
        {"<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>Hi \xc3\xa9<|END_RESPONSE|>x",
         "Hi \xc3\xa9", 0, true, false},
        {"<|START_THINKING|>plan<|END_THINKING|>" CO_ACT("[{\"tool_name\": \"f\"}]"), "", 1, true,
         false},
        {"all\nLook: >>>f\n{\"a\": 1}", "Look:", 1, true, false},
        {">>>all\n\xc3\xa9t\xc3\xa9", "\xc3\xa9t\xc3\xa9", 0, true, false},
        {"f\n{\"a\": 1}>>>g\n{}", "", 2, true, false},
        {"Ok <function=f>{}</function>", "Ok", 1, true, false},
        {"<think>\nhm\n</think>\n\nall\nSo >>>f\n{}", "So", 1, true, false},
        {"all\nx>>>f\n{", "x>>>f\n{", 0, true, false},
        /* thoughts not taken apart: either plan stays in the content as written */
        {"<|START_THINKING|>plan<|END_THINKING|>" CO_ACT("[{\"tool_name\": \"f\"}]"),
         "<|START_THINKING|>plan<|END_THINKING|>", 1, false, false},
        {"<think>plan</think><tool_call>{\"name\": \"f\"}</tool_call>", "<think>plan</think>", 1,
         false, false},
        {"<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>Hi<|END_RESPONSE|>",
         "<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>Hi<|END_RESPONSE|>", 0, false,
         false},
        /* Functionary v3.2's lone call without ">>>": read where the names say so */
        {"get_weather\n{\"city\": \"Paris\"}\n", "", 1, true, true},
        {"<think>hm</think>\nf\n{}", "", 1, true, true},
        {"get_weather\n{\"city\": \"Paris\"}", "get_weather\n{\"city\": \"Paris\"}", 0, true,
         false},
        {"other\n{\"a\": 1}", "other\n{\"a\": 1}", 0, true, true},
        {"Hello there", "Hello there", 0, true, true},
        {"x\n{}\n>>>f\n{}", "x\n{}", 1, true, true}, /* x is not a name: content */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *t = cases[c].text;
        const char *const *names = cases[c].named ? NAMES : NULL;
        const bool th = cases[c].thoughts;
        const size_t n = strlen(t);
        char got[256];
        size_t n_got = 0;
        reply_cut w, st;
        reply_part p;
        toolcalls tw, ts;
        reply_cut_init(&w, th, false, true, names);
        reply_cut_next(&w, t, n, &p, &tw);
        if (p.c_n != strlen(cases[c].content) || memcmp(t + p.c_from, cases[c].content, p.c_n))
            fail_msg("case %zu whole: '%.*s'", c, (int)p.c_n, t + p.c_from);
        if (tw.n != cases[c].n_calls)
            fail_msg("case %zu whole: %d calls, not %d", c, tw.n, cases[c].n_calls);
        reply_cut_init(&st, th, false, true, names);
        for (size_t len = 0; len <= n; len++) {
            reply_cut_next(&st, t, len, &p, len == n ? &ts : NULL);
            assert_true(n_got + p.c_n < sizeof got);
            memcpy(got + n_got, t + p.c_from, p.c_n);
            n_got += p.c_n;
        }
        if (n_got != strlen(cases[c].content) || memcmp(got, cases[c].content, n_got))
            fail_msg("case %zu streamed: '%.*s'", c, (int)n_got, got);
        assert_int_equal(ts.n, tw.n);
        for (int k = 0; k < ts.n; k++) {
            assert_string_equal(ts.v[k].name, tw.v[k].name);
            assert_string_equal(ts.v[k].arguments, tw.v[k].arguments);
        }
        reply_cut_whole(&st, n, &p);
        assert_int_equal(p.c_n, n_got);
        assert_memory_equal(t + p.c_from, got, n_got);
        toolcalls_free(&tw);
        toolcalls_free(&ts);
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

/* Streaming: appended one byte at a time, the safe span [from, safe) never
 * shrinks, its start never passes the whole reply's content start (nor
 * moves once content went out), and it never reaches past the whole
 * reply's content, into a call. */
static void check_stream_names(const char *text, const char *const *names, size_t want_final)
{
    size_t n = strlen(text), prev = 0, prev_from = 0;
    toolcalls whole = parse_names(text, names);
    const size_t w_from = whole.content_from, w_end = w_from + whole.content_len;
    toolcalls_free(&whole);
    for (size_t k = 0; k <= n; k++) {
        size_t from = 0;
        size_t safe = toolcall_safe_len(text, k, names, &from);
        if (safe < prev || safe > k || from < prev_from || from > safe || from > w_from ||
            (safe > from && (from != w_from || safe > w_end)) ||
            (prev > prev_from && from != prev_from))
            fail_msg("'%.*s': [%zu, %zu) after [%zu, %zu); whole [%zu, %zu)", (int)k, text, from,
                     safe, prev_from, prev, w_from, w_end);
        prev = safe;
        prev_from = from;
    }
    assert_int_equal(prev, want_final);
}

static void check_stream(const char *text, size_t want_final)
{
    check_stream_names(text, NULL, want_final);
}

/* Functionary v3.2's first call without ">>>" (the generation prompt ends
 * with it), told from text by the request's function names */
static void test_functionary_names(void **state)
{
    (void)state;
    toolcalls tc = parse_names("get_weather\n{\"city\": \"Paris\"}\n", NAMES);
    assert_int_equal(tc.n, 1);
    assert_int_equal(tc.content_len, 0);
    assert_string_equal(tc.v[0].name, "get_weather");
    assert_string_equal(tc.v[0].arguments, "{\"city\":\"Paris\"}");
    toolcalls_free(&tc);
    tc = parse_names("  f\n{}", NAMES);
    assert_int_equal(tc.n, 1);
    toolcalls_free(&tc);
    /* followed by ">>>" blocks: the first is read only with a listed name */
    tc = parse_names("f\n{\"a\": 1}\n>>>get_weather\n{}", NAMES);
    assert_int_equal(tc.n, 2);
    assert_string_equal(tc.v[0].name, "f");
    toolcalls_free(&tc);
    tc = parse_names("x\n{\"a\": 1}\n>>>get_weather\n{}", NAMES);
    assert_int_equal(tc.n, 1);
    assert_string_equal(tc.v[0].name, "get_weather");
    assert_int_equal(tc.content_len, strlen("x\n{\"a\": 1}"));
    toolcalls_free(&tc);
    /* not a listed name, not a whole call, or no list: all content */
    static const char *const bad[] = {
        "other\n{\"a\": 1}",     "get_weathe\n{}",  "get_weather_now\n{}",
        "get_weather\n{\"a\": ", "f\n{} and more", "f\n[1]",
        "f\nnot json",            "f\n",             "f",
        "get_weather {}",         "F\n{}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tc = parse_names(bad[i], NAMES);
        if (tc.n != 0 || tc.content_from != 0 || tc.content_len != strlen(bad[i]))
            fail_msg("'%s' read as %d calls, content [%zu, +%zu)", bad[i], tc.n, tc.content_from,
                     tc.content_len);
        toolcalls_free(&tc);
    }
    static const char *const none[] = {NULL};
    tc = parse_names("f\n{}", none);
    assert_int_equal(tc.n, 0);
    tc = parse_names("f\n{}", NULL);
    assert_int_equal(tc.n, 0);
    /* streaming: only what may still become a listed name's call is held */
    check_stream_names("get_weather\n{\"a\": 1}", NAMES, 0);
    check_stream_names("get_wea", NAMES, 0);
    check_stream_names("f", NAMES, 0);
    check_stream_names("Hello", NAMES, 5);
    check_stream_names("Hello\n{\"a\": 1}", NAMES, 14);
    check_stream_names("get_weathers", NAMES, 12);
    check_stream_names("x\n{}\n>>>f\n{}", NAMES, 4);
    check_stream_names("Hello", none, 5);
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
    check_stream("ok " DS(SP "calls") "!", 24); /* no marker (a last ">" may open ">>>") */
    check_stream("ok \xef\xbd\x9c", 6);  /* a fullwidth bar outside a marker is text */
    /* Functionary v3.1 and v3.2 */
    check_stream("ok <function=f>{\"a\": 1}</function>", 2);
    check_stream("\xc3\xa9 <functi", 2); /* a partial marker after a two-byte character */
    check_stream("all\nHi >>>f\n{}", 6);
    check_stream("all\nHi >>", 6);
    check_stream(">>>all\n\xc3\xa9t\xc3\xa9 >>>ab", 12);
    check_stream("Python:\n>>> print(1)", 20); /* no block header: all of it goes */
    check_stream("a -> b", 6);
    check_stream("get_weather\n{\"a\": 1}", 0);  /* perhaps the first call: held */
    check_stream("get_weather\n{\"a\": 1}>>>now\n{}", 0);
    check_stream("Hello", 0);                    /* perhaps a call's name */
    check_stream("Hello\nthere", 11);
    check_stream("all", 0);
    /* Cohere */
    check_stream("<|START_RESPONSE|>Hi there<|END_RESPONSE|>", 26);
    check_stream("<|START_RESPONSE|>Hi \xc3\xa9<|END_RESP", 23);
    /* the plan, where it comes here (thoughts not taken apart), is text */
    check_stream("<|START_THINKING|>plan<|END_THINKING|>Hi", 40);
    check_stream("<|START_THINKING|>plan<|END_THINKING|>\n<|START_AC", 38);
    check_stream("<|START_THINKING|>pl", 20);
    check_stream("Sure. " CO_ACT("[{\"tool_name\": \"f\"}]"), 5);
    check_stream("\xc3\xa9 <|START_AC", 2);
}

/* toolcall_names on tools as clients send them, garbage included: entries
 * that are no object, name no string, an empty name or none are left out,
 * never an error; a tools value that is no array gives no list. */
static void test_names_garbage(void **state)
{
    (void)state;
    static const char *const not_arrays[] = {"null", "{\"name\": \"f\"}", "\"f\"", "3"};
    for (size_t k = 0; k < sizeof not_arrays / sizeof not_arrays[0]; k++) {
        json_t *t = json_loads(not_arrays[k], JSON_DECODE_ANY, NULL);
        assert_non_null(t);
        assert_null(toolcall_names(t));
        json_decref(t);
    }
    assert_null(toolcall_names(NULL));
    json_t *t = json_loads("[1, null, \"f\", [], {}, {\"name\": 7}, {\"name\": \"\"},"
                           " {\"function\": {\"name\": [\"x\"]}},"
                           " {\"function\": 5, \"name\": \"top\"},"
                           " {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}},"
                           " {\"name\": \"anth\", \"input_schema\": {}}]",
                           0, NULL);
    assert_non_null(t);
    char **v = toolcall_names(t);
    assert_non_null(v);
    assert_string_equal(v[0], "top");
    assert_string_equal(v[1], "get_weather");
    assert_string_equal(v[2], "anth");
    assert_null(v[3]);
    free(v);
    json_decref(t);
    t = json_array(); /* no names at all: an empty list, not a failure */
    v = toolcall_names(t);
    assert_non_null(v);
    assert_null(v[0]);
    free(v);
    json_decref(t);
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
        cmocka_unit_test(test_function_tags),
        cmocka_unit_test(test_functionary),
        cmocka_unit_test(test_cohere),
        cmocka_unit_test(test_reply_stream),
        cmocka_unit_test(test_functionary_names),
        cmocka_unit_test(test_bare_json),
        cmocka_unit_test(test_not_calls),
        cmocka_unit_test(test_stream_hold),
        cmocka_unit_test(test_names_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
