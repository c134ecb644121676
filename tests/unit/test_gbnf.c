/*
 * test_gbnf.c - GBNF grammars (engine/gbnf.h): texts the grammar produces
 * are accepted and done, every prefix of them accepted (byte by byte, so
 * characters split across feeds too), and texts it does not produce
 * refused at the first byte that leaves it; literals, classes (ranges,
 * negation, escapes), the any-character dot, groups, alternatives,
 * repetitions (* + ? {m} {m,} {m,n}), recursion (balanced brackets),
 * multi-byte characters, comments and line rules; the grammars the
 * compiler refuses, with the line and column and what is wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gbnf.h"
#include "testutil.h"

static lms_gbnf *compile_ok(const char *s)
{
    char err[256];
    lms_gbnf *g = lms_gbnf_compile(s, strlen(s), err, sizeof err);
    if (!g)
        fail_msg("grammar refused: %s\n%s", err, s);
    return g;
}

/* Feeds text byte by byte: -1 when all of it is taken, else the index of
 * the byte refused. Done/closed afterwards through the pointers. */
static int feed_bytes(const lms_gbnf *g, const char *text, bool *done, bool *closed)
{
    lms_gbnf_chk *c = malloc(sizeof *c);
    assert_non_null(c);
    assert_true(lms_gbnf_init(c, g));
    int bad = -1;
    for (size_t i = 0; text[i]; i++) {
        const bool allowed = lms_gbnf_allows(c, text + i, 1);
        const bool fed = lms_gbnf_feed(c, text + i, 1);
        if (allowed != fed)
            fail_msg("allows and feed disagree at byte %zu of '%s'", i, text);
        if (!fed) {
            bad = (int)i;
            break;
        }
    }
    if (done)
        *done = bad < 0 && lms_gbnf_done(c);
    if (closed)
        *closed = bad < 0 && lms_gbnf_closed(c);
    free(c);
    return bad;
}

/* The whole text in one feed, as a token would come */
static bool feed_whole(const lms_gbnf *g, const char *text)
{
    lms_gbnf_chk *c = malloc(sizeof *c);
    assert_non_null(c);
    assert_true(lms_gbnf_init(c, g));
    const bool ok = lms_gbnf_feed(c, text, strlen(text)) && lms_gbnf_done(c);
    free(c);
    return ok;
}

static void yes(const lms_gbnf *g, const char *text)
{
    bool done;
    const int bad = feed_bytes(g, text, &done, NULL);
    if (bad >= 0)
        fail_msg("'%s' refused at byte %d", text, bad);
    if (!done)
        fail_msg("'%s' accepted but not done", text);
    if (!feed_whole(g, text))
        fail_msg("'%s' refused when fed whole", text);
}

/* text is refused at byte `at`, or (at -1) taken but not a whole text */
static void no(const lms_gbnf *g, const char *text, int at)
{
    bool done;
    const int bad = feed_bytes(g, text, &done, NULL);
    if (bad != at)
        fail_msg("'%s': refused at %d, expected %d", text, bad, at);
    if (at < 0 && done)
        fail_msg("'%s' is done but should not be", text);
}

static void test_literals_and_classes(void **state)
{
    (void)state;
    lms_gbnf *g = compile_ok("root ::= \"yes\" | \"no\"\n");
    yes(g, "yes");
    yes(g, "no");
    no(g, "ye", -1);
    no(g, "nope", 2);
    no(g, "maybe", 0);
    bool closed;
    feed_bytes(g, "yes", NULL, &closed);
    assert_true(closed);
    free(g);

    g = compile_ok("root ::= [a-c] [^0-9\\n] [\\x41\\u00e9\\]\\-] .\n");
    yes(g, "a!A.");
    yes(g, "cz\xc3\xa9\xe2\x82\xac");  /* é then a three-byte character (the dot) */
    yes(g, "bb]x");
    yes(g, "bb-x");
    no(g, "d", 0);
    no(g, "a5", 1);
    no(g, "a\n", 1);
    no(g, "abB", 2);
    free(g);
}

static void test_repetitions(void **state)
{
    (void)state;
    lms_gbnf *g = compile_ok("root ::= [0-9]{3}\n");
    yes(g, "123");
    no(g, "12", -1);
    no(g, "1234", 3);
    free(g);

    g = compile_ok("root ::= \"a\"{2,4} \"b\"\n");
    no(g, "ab", 1);
    yes(g, "aab");
    yes(g, "aaaab");
    no(g, "aaaaab", 4);
    free(g);

    g = compile_ok("root ::= \"x\"{2,} \"!\"? digits\ndigits ::= [0-9]+ | \"-\"*\n");
    yes(g, "xx");
    yes(g, "xxxx!");
    yes(g, "xxx12");
    yes(g, "xx!--");
    no(g, "x", -1);
    no(g, "xx!!", 3);
    no(g, "xx1-", 3);
    free(g);

    /* a group repeated, and {m} on a group */
    g = compile_ok("root ::= (\"ab\" | \"c\")* (\"-\" [0-9]){2}\n");
    yes(g, "-1-2");
    yes(g, "abcab-0-9");
    no(g, "ac", 1);
    no(g, "ab-1", -1);
    free(g);
}

static void test_rules_and_recursion(void **state)
{
    (void)state;
    /* balanced brackets: recursion in the middle of a rule */
    lms_gbnf *g = compile_ok("# nested lists\n"
                             "root ::= list\n"
                             "list ::= \"[\" ( item ( \",\" item )* )? \"]\"\n"
                             "item ::= list | [0-9]+   # a number or a list\n");
    yes(g, "[]");
    yes(g, "[1,[2,[]],34]");
    no(g, "[1,]", 3);
    no(g, "[[1]", -1);
    no(g, "[1]]", 3);
    free(g);

    /* alternatives over lines after '|', groups over lines */
    g = compile_ok("root ::= greeting \" \" name |\n"
                   "         \"bye\"\n"
                   "greeting ::= (\n"
                   "  \"hi\" |\n"
                   "  \"hello\"\n"
                   ")\n"
                   "name ::= [A-Z] [a-z]*\n");
    yes(g, "hi Bo");
    yes(g, "hello Alice");
    yes(g, "bye");
    no(g, "hey", 2);
    no(g, "hi bo", 3);
    free(g);

    /* ambiguity: 2^24 ways to the same stack; the start gives up (bounded
     * work) instead of walking them */
    char amb[1024] = "root ::= r0\n";
    for (int i = 0; i < 24; i++)
        snprintf(amb + strlen(amb), sizeof amb - strlen(amb), "r%d ::= r%d | r%d\n", i, i + 1,
                 i + 1);
    strcat(amb, "r24 ::= \"a\"\n");
    g = compile_ok(amb);
    lms_gbnf_chk *c = malloc(sizeof *c);
    assert_false(lms_gbnf_init(c, g));
    free(c);
    free(g);
    /* a few levels of it are fine */
    g = compile_ok("root ::= r0\nr0 ::= r1 | r1\nr1 ::= r2 | r2\nr2 ::= \"a\" | \"a\"\n");
    yes(g, "a");
    free(g);

    /* right recursion deeper than any fixed stack: taken in constant depth */
    g = compile_ok("root ::= \"a\" root | \"\"\n");
    char text[3001];
    memset(text, 'a', 3000);
    text[3000] = '\0';
    yes(g, text);
    free(g);
}

static void test_utf8(void **state)
{
    (void)state;
    lms_gbnf *g = compile_ok("root ::= \"\xc3\xa9t\xc3\xa9\" [\xe3\x81\x81-\xe3\x82\x9f]+\n");
    yes(g, "\xc3\xa9t\xc3\xa9\xe3\x81\x82\xe3\x81\x84"); /* été あい */
    no(g, "ete", 0);
    /* a katakana character (U+30A2, outside the class) is refused at its
     * last byte: its first two (E3 82: U+3080-30BF) may still start one the
     * class holds; E3 83 (U+30C0-30FF) may not */
    no(g, "\xc3\xa9t\xc3\xa9\xe3\x82\xa2", 7);
    no(g, "\xc3\xa9t\xc3\xa9\xe3\x83", 6);
    free(g);
    /* a lead byte is refused where no character of its length can come:
     * F0 starts U+10000 and above, E3 U+3000-3FFF, C3 U+00C0-00FF */
    g = compile_ok("root ::= \"[\" [\u00e0-\u00ff] [\U0001F600-\U0001F64F]\n");
    no(g, "\xf0", 0);
    no(g, "[\xe3", 1);
    yes(g, "[\xc3\xa9\xf0\x9f\x98\x80"); /* [é😀 */
    no(g, "[\xc3\xa9\xf0\x9f\x99\x90", 6); /* U+1F650 */
    no(g, "[\xc3\xa9\xf0\x9f\x9a", 5); /* U+1F680-1F6BF */
    free(g);
    g = compile_ok("root ::= \"\xc3\xa9t\xc3\xa9\" [\xe3\x81\x81-\xe3\x82\x9f]+\n");
    /* a character split across two feeds */
    lms_gbnf_chk *c = malloc(sizeof *c);
    assert_true(lms_gbnf_init(c, g));
    assert_true(lms_gbnf_feed(c, "\xc3", 1));
    assert_false(lms_gbnf_done(c));
    assert_true(lms_gbnf_feed(c, "\xa9t\xc3\xa9\xe3\x81", 6));
    assert_false(lms_gbnf_allows(c, "\x41", 1)); /* not a continuation byte */
    assert_true(lms_gbnf_feed(c, "\x81", 1));
    assert_true(lms_gbnf_done(c));
    free(c);
    free(g);
}

static void test_state_compare(void **state)
{
    (void)state;
    lms_gbnf *g = compile_ok("root ::= (\"ab\")+\n");
    lms_gbnf_chk *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    assert_true(lms_gbnf_init(a, g));
    assert_true(lms_gbnf_init(b, g));
    assert_true(lms_gbnf_same(a, b));
    assert_true(lms_gbnf_feed(a, "ab", 2));
    assert_false(lms_gbnf_same(a, b));
    assert_true(lms_gbnf_feed(b, "abab", 4));
    assert_true(lms_gbnf_same(a, b)); /* the same continuations */
    lms_gbnf_copy(b, a);
    assert_true(lms_gbnf_same(a, b));
    /* a refused feed leaves the state as it was */
    assert_false(lms_gbnf_feed(a, "ac", 2));
    assert_true(lms_gbnf_same(a, b));
    free(a);
    free(b);
    free(g);
}

static void refused(const char *text, const char *want)
{
    char err[256] = "";
    lms_gbnf *g = lms_gbnf_compile(text, strlen(text), err, sizeof err);
    if (g)
        fail_msg("grammar accepted, expected '%s':\n%s", want, text);
    if (!strstr(err, want))
        fail_msg("error '%s' does not say '%s'", err, want);
}

static void test_refused(void **state)
{
    (void)state;
    refused("rot ::= \"a\"\n", "no 'root' rule");
    refused("root ::= a\n", "line 1, column 10: rule 'a' is never defined");
    refused("root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: rule 'root' is defined twice");
    refused("root = \"a\"\n", "expected '::='");
    refused("root ::= \"abc\n", "unterminated literal");
    refused("root ::= [ab\n", "unterminated character class");
    refused("root ::= [z-a]\n", "runs backwards");
    refused("root ::= (\"a\" \"b\"\n", "unclosed '('");
    refused("root ::= \"a\" )\n", "unexpected ')'");
    refused("root ::= * \"a\"\n", "nothing before it to repeat");
    refused("root ::= \"a\"{3,1}\n", "maximum is below the minimum");
    refused("root ::= \"a\"{5000}\n", "repetition bound over 1000");
    refused("root ::= \"a\"{2\n", "expected '}'");
    refused("root ::= \"\\q\"\n", "unknown escape");
    refused("root ::= \"\\x4\"\n", "expected a hex digit");
    refused("root ::= root \"a\" | \"b\"\n", "left recursion: rule 'root'");
    refused("root ::= x\nx ::= y? \"a\"\ny ::= x\n", "left recursion");
    refused("root ::= (\"a\"?)*\n", "left recursion");
    refused("root ::= <[1000]>\n", "not supported");
    refused("root ::= \"\xff\"\n", "invalid UTF-8");
    refused("\"a\"\n", "expected a rule name");
    /* not every grammar error is at the end: the column counts characters */
    refused("root ::= \"\xc3\xa9\" ?? \n", "line 1, column 15");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_literals_and_classes),
        cmocka_unit_test(test_repetitions),
        cmocka_unit_test(test_rules_and_recursion),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_state_compare),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
