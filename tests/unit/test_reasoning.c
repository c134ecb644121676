/*
 * test_reasoning.c - thoughts apart from the answer (serve/reasoning): the
 * written forms, a prompt that opens the thoughts, cut replies, and the
 * streaming release giving exactly the whole reply's parts at every split.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/reasoning.h"
#include "serve/reply.h"
#include "testutil.h"

typedef struct parts {
    char thoughts[256];
    char answer[256];
} parts;

static void whole(const char *t, bool open, parts *p)
{
    reasoning rs;
    reasoning_init(&rs, open);
    size_t n = strlen(t);
    reasoning_feed(&rs, t, n, true);
    snprintf(p->thoughts, sizeof p->thoughts, "%.*s", (int)(rs.r1 - rs.r0), t + rs.r0);
    size_t a = reasoning_answer(&rs, n);
    snprintf(p->answer, sizeof p->answer, "%s", t + a);
}

/* Fed one byte more each time, as a stream: what is released adds up to
 * the whole reply's parts, and nothing released is ever taken back. */
static void streamed(const char *t, bool open, parts *p)
{
    reasoning rs;
    reasoning_init(&rs, open);
    size_t n = strlen(t), r_sent = 0, a_sent = 0;
    p->thoughts[0] = p->answer[0] = 0;
    for (size_t len = 0; len <= n; len++) {
        reasoning_feed(&rs, t, len, len == n);
        size_t from = r_sent > rs.r0 ? r_sent : rs.r0;
        if (rs.r1 > from) {
            strncat(p->thoughts, t + from, rs.r1 - from);
            r_sent = rs.r1;
        }
        size_t a = reasoning_answer(&rs, len);
        from = a_sent > a ? a_sent : a;
        if (len > from) {
            assert_true(a <= from);
            strncat(p->answer, t + from, len - from);
            a_sent = len;
        }
    }
}

static void check(const char *t, bool open, const char *thoughts, const char *answer)
{
    parts w, s;
    whole(t, open, &w);
    streamed(t, open, &s);
    assert_string_equal(w.thoughts, thoughts);
    assert_string_equal(w.answer, answer);
    assert_string_equal(s.thoughts, thoughts);
    assert_string_equal(s.answer, answer);
}

static void test_forms(void **state)
{
    (void)state;
    /* Qwen3 / SmolLM3: the reply opens the thoughts */
    check("<think>\nThe user greets.\nSo  greet back.\n</think>\n\nHello!", false,
          "The user greets.\nSo  greet back.", "Hello!");
    check("  <think>x</think>y", false, "x", "y");
    /* DeepSeek-R1, Qwen3.5: the prompt opened them */
    check("Paris, surely.\n</think>\n\nThe capital is Paris.", true, "Paris, surely.",
          "The capital is Paris.");
    /* empty thoughts (thinking switched off in the reply itself) */
    check("<think>\n\n</think>\n\nHi there", false, "", "Hi there");
    /* no thoughts: the answer byte for byte, leading whitespace kept */
    check("  Hello <think> world", false, "", "  Hello <think> world");
    check("<thin", false, "", "<thin");
    check("<thinking>x", false, "", "<thinking>x");
    check("", false, "", "");
    check(" \n ", false, "", " \n ");
    /* cut before the closing tag: all thoughts */
    check("<think>\nstill thinking  \n", false, "still thinking", "");
    check("still </thi", true, "still </thi", "");
    check("", true, "", "");
    /* the closing tag split anywhere, a '<' inside the thoughts */
    check("<think>a < b </ c</think>d", false, "a < b </ c", "d");
    check("a</think", true, "a</think", "");
    /* only the first closing tag counts */
    check("a</think>b</think>c", true, "a", "b</think>c");
    /* UTF-8 passes through */
    check("<think>caf\xc3\xa9</think>\xe2\x9c\x93", false, "caf\xc3\xa9", "\xe2\x9c\x93");
}

/* Cohere's Command R7B / Command A: the plan between <|START_THINKING|>
 * and <|END_THINKING|>; each opening closes with its own closing tag only. */
static void test_cohere(void **state)
{
    (void)state;
    check("<|START_THINKING|>I will look up the weather.<|END_THINKING|>"
          "<|START_RESPONSE|>Sunny.<|END_RESPONSE|>",
          false, "I will look up the weather.", "<|START_RESPONSE|>Sunny.<|END_RESPONSE|>");
    check(" \n<|START_THINKING|>\n plan \xc3\xa9\n<|END_THINKING|>\n\n<|START_ACTION|>[]", false,
          "plan \xc3\xa9", "<|START_ACTION|>[]");
    check("<|START_THINKING|><|END_THINKING|>Hi", false, "", "Hi");
    /* the other pair's closing tag is text */
    check("<|START_THINKING|>a </think> b<|END_THINKING|>c", false, "a </think> b", "c");
    check("<think>a <|END_THINKING|> b</think>c", false, "a <|END_THINKING|> b", "c");
    check("<|START_THINKING|>a</think>", false, "a</think>", "");
    /* a prompt that opened <think> is closed by </think> only */
    check("plan<|END_THINKING|>x", true, "plan<|END_THINKING|>x", "");
    /* only the first closing tag counts */
    check("<|START_THINKING|>a<|END_THINKING|>b<|END_THINKING|>c", false, "a",
          "b<|END_THINKING|>c");
    /* unclosed, or closed only in part: all thoughts */
    check("<|START_THINKING|>still planning  ", false, "still planning", "");
    check("<|START_THINKING|>still <|END_THINK", false, "still <|END_THINK", "");
    check("<|START_THINKING|>", false, "", "");
    /* not an opening tag: all answer, as written */
    check("<|START_THINK", false, "", "<|START_THINK");
    check("<|START_THINKING", false, "", "<|START_THINKING");
    check("<|START_RESPONSE|>Hi", false, "", "<|START_RESPONSE|>Hi");
    check("<|", false, "", "<|");
    check("Ok <|START_THINKING|>x<|END_THINKING|>", false, "",
          "Ok <|START_THINKING|>x<|END_THINKING|>");
}

static void test_prompt_open(void **state)
{
    (void)state;
    const char *r1 = "<\xef\xbd\x9cUser\xef\xbd\x9c>Hi<\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\n";
    assert_true(reasoning_prompt_open(r1, strlen(r1)));
    const char *q35 = "<|im_start|>assistant\n<think>\n";
    assert_true(reasoning_prompt_open(q35, strlen(q35)));
    /* Qwen3 with enable_thinking false: an empty block closed in the prompt */
    const char *off = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_false(reasoning_prompt_open(off, strlen(off)));
    const char *plain = "<|im_start|>assistant\n";
    assert_false(reasoning_prompt_open(plain, strlen(plain)));
    assert_false(reasoning_prompt_open("", 0));
    assert_false(reasoning_prompt_open("think>", 6));
}

/* reply_cut streamed a byte at a time: the content that a partial "<think"
 * held back is released once it is known not to be the tag, and content
 * before a call keeps no trailing whitespace (as the whole reply's). */
static void test_reply_stream(void **state)
{
    (void)state;
    static const char *const texts[] = {"<thinking>x", "<thi", "  <think>a</think> b <tool_call>\n"
                                        "{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
                                        "Hi  \n<tool_call>{\"name\": \"g\"}"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        const char *t = texts[k];
        const size_t n = strlen(t);
        reply_cut w, s;
        reply_part p;
        toolcalls tw, ts;
        reply_cut_init(&w, true, false, true, NULL);
        reply_cut_next(&w, t, n, &p, &tw);
        char whole[256] = "", streamed[256] = "";
        strncat(whole, t + p.c_from, p.c_n);
        reply_cut_init(&s, true, false, true, NULL);
        for (size_t len = 1; len <= n; len++) {
            reply_cut_next(&s, t, len, &p, len == n ? &ts : NULL);
            strncat(streamed, t + p.c_from, p.c_n);
        }
        assert_string_equal(streamed, whole);
        assert_int_equal(ts.n, tw.n);
        toolcalls_free(&tw);
        toolcalls_free(&ts);
    }
}

/* reply_cut with Cohere's plan: taken apart as thoughts (every dialect's
 * reasoning output) or, with reasoning_format "none", left in the content
 * as <think> is; streamed a byte at a time equal to the whole reply. */
static void cut_check(const char *t, bool thoughts, bool tools, const char *want_th,
                      const char *want_ct, int n_calls)
{
    const size_t n = strlen(t);
    reply_cut w, s;
    reply_part p;
    toolcalls tw, ts;
    reply_cut_init(&w, thoughts, false, tools, NULL);
    reply_cut_next(&w, t, n, &p, &tw);
    char wth[256] = "", wct[256] = "", sth[256] = "", sct[256] = "";
    strncat(wth, t + p.r_from, p.r_n);
    strncat(wct, t + p.c_from, p.c_n);
    reply_cut_init(&s, thoughts, false, tools, NULL);
    for (size_t len = 0; len <= n; len++) {
        reply_cut_next(&s, t, len, &p, len == n ? &ts : NULL);
        strncat(sth, t + p.r_from, p.r_n);
        strncat(sct, t + p.c_from, p.c_n);
    }
    assert_string_equal(wth, want_th);
    assert_string_equal(wct, want_ct);
    assert_string_equal(sth, want_th);
    assert_string_equal(sct, want_ct);
    assert_int_equal(tw.n, n_calls);
    assert_int_equal(ts.n, n_calls);
    reply_cut_whole(&s, n, &p);
    assert_int_equal(p.r_n, strlen(want_th));
    assert_int_equal(p.c_n, strlen(want_ct));
    toolcalls_free(&tw);
    toolcalls_free(&ts);
}

static void test_reply_cohere(void **state)
{
    (void)state;
    const char *act = "<|START_THINKING|>Look it up.<|END_THINKING|>"
                      "<|START_ACTION|>[{\"tool_name\": \"f\", \"parameters\": {}}]<|END_ACTION|>";
    cut_check(act, true, true, "Look it up.", "", 1);
    cut_check(act, false, true, "", "<|START_THINKING|>Look it up.<|END_THINKING|>", 1);
    const char *ans = "<|START_THINKING|>plan<|END_THINKING|><|START_RESPONSE|>Hi<|END_RESPONSE|>";
    cut_check(ans, true, true, "plan", "Hi", 0);
    cut_check(ans, true, false, "plan", "<|START_RESPONSE|>Hi<|END_RESPONSE|>", 0);
    cut_check(ans, false, true, "", ans, 0);
    cut_check("<|START_THINKING|>plan<|END_THINKING|>\nDone.", true, false, "plan", "Done.", 0);
    /* as <think> with "none": the same */
    cut_check("<think>plan</think>\nDone.", false, true, "", "<think>plan</think>\nDone.", 0);
    /* a plan never closed: all thoughts, nothing called */
    cut_check("<|START_THINKING|>plan <|START_ACTION|>[{\"tool_name\": \"f\"}]", true, true,
              "plan <|START_ACTION|>[{\"tool_name\": \"f\"}]", "", 0);
}

static void test_formats(void **state)
{
    (void)state;
    assert_int_equal(reasoning_format_parse("none"), REASONING_NONE);
    assert_int_equal(reasoning_format_parse("auto"), REASONING_DEEPSEEK);
    assert_int_equal(reasoning_format_parse("deepseek"), REASONING_DEEPSEEK);
    assert_int_equal(reasoning_format_parse("deepseek-legacy"), REASONING_LEGACY);
    assert_int_equal(reasoning_format_parse("DeepSeek"), -1);
    assert_int_equal(reasoning_format_parse(""), -1);
    assert_int_equal(reasoning_format_parse(NULL), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_cohere),
        cmocka_unit_test(test_reply_cohere),
        cmocka_unit_test(test_prompt_open),
        cmocka_unit_test(test_reply_stream),
        cmocka_unit_test(test_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
