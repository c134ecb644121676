/*
 * test_tokenizer_vectors.c - the tokenizers against reference token ids:
 *
 *   1. llama.cpp's vectors: every ggml-vocab-NAME.gguf of
 *      $LMS_TESTDATA/tokenizer with NAME.gguf.inp / .out, tokenized with
 *      add_special = false, parse_special = false (tokenizer/README.md);
 *   2. the chat vectors NAME.gguf.chat.inp / .out with parse_special = true;
 *   3. the golden prompts: each case of golden/NAME/manifest.json, prompt
 *      tokenized with add_special = true must give `tokens`.
 *
 * Prints one line per vocab with its pass count; any failure prints the
 * input and both id lists and fails the test.
 */
#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "testutil.h"

#define SEP "\n__ggml_vocab_test__\n"
#define MAX_TESTS 256

typedef struct vec_test {
    const char *text; /* into the .inp buffer, not NUL-terminated */
    size_t len;
} vec_test;

typedef struct vec_result {
    int n_pass, n_total;
} vec_result;

/* Splits an .inp file as README.md says: every test is followed by the
 * separator; no empty test after the last one. */
static int split_inp(const char *buf, size_t n, vec_test *tests, int max)
{
    size_t sep_len = strlen(SEP), pos = 0;
    int k = 0;
    while (pos < n && k < max) {
        const char *hit = memmem(buf + pos, n - pos, SEP, sep_len);
        size_t end = hit ? (size_t)(hit - buf) : n;
        tests[k].text = buf + pos;
        tests[k].len = end - pos;
        k++;
        pos = hit ? end + sep_len : n;
    }
    return k;
}

/* Parses one .out line (" 12 34") into ids; returns the count. */
static int parse_ids(const char *line, size_t n, int32_t *ids, int max)
{
    int k = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && (line[i] == ' ' || line[i] == '\r'))
            i++;
        if (i >= n)
            break;
        char *end;
        long v = strtol(line + i, &end, 10);
        if (k < max)
            ids[k] = (int32_t)v;
        k++;
        i = (size_t)(end - line);
        if (end == line)
            break;
    }
    return k;
}

static void print_escaped(const char *s, size_t n)
{
    for (size_t i = 0; i < n && i < 160; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            fputc(c, stderr);
        else
            fprintf(stderr, "\\x%02x", c);
    }
}

static void print_ids(const char *what, const int32_t *ids, int64_t n)
{
    fprintf(stderr, "    %s:", what);
    for (int64_t i = 0; i < n && i < 64; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 64 ? " ...\n" : "\n");
}

/* Tokenizes text and compares with want[0..n_want); prints on mismatch. */
static bool check_one(const lms_tokenizer *t, const char *text, size_t len, bool add_special,
                      bool parse_special, const int32_t *want, int n_want)
{
    int32_t got[4096];
    int64_t n = lms_tokenize(t, text, len, add_special, parse_special, got, 4096);
    bool ok = n == n_want && n <= 4096 && memcmp(got, want, sizeof *got * (size_t)n_want) == 0;
    if (!ok) {
        fprintf(stderr, "  FAIL \"");
        print_escaped(text, len);
        fprintf(stderr, "\"\n");
        print_ids("want", want, n_want);
        print_ids("got ", got, n < 0 ? 0 : n > 4096 ? 4096 : n);
    }
    return ok;
}

/* Runs VOCAB.<suffix>.inp/.out against a loaded tokenizer. */
static vec_result run_file(const lms_tokenizer *t, const char *vocab, const char *suffix,
                           bool parse_special)
{
    char path[512];
    size_t n_inp, n_out;
    vec_result r = {0, 0};
    vec_test tests[MAX_TESTS];
    snprintf(path, sizeof path, "tokenizer/%s%s.inp", vocab, suffix);
    char *inp = tu_read_file(tu_data_path(path), &n_inp);
    snprintf(path, sizeof path, "tokenizer/%s%s.out", vocab, suffix);
    char *out = tu_read_file(tu_data_path(path), &n_out);
    assert_non_null(inp);
    assert_non_null(out);
    int n_tests = split_inp(inp, n_inp, tests, MAX_TESTS);
    const char *line = out;
    for (int i = 0; i < n_tests; i++) {
        const char *nl = memchr(line, '\n', (size_t)(out + n_out - line));
        size_t line_len = nl ? (size_t)(nl - line) : (size_t)(out + n_out - line);
        int32_t want[4096];
        int n_want = parse_ids(line, line_len, want, 4096);
        r.n_total++;
        r.n_pass += check_one(t, tests[i].text, tests[i].len, false, parse_special, want, n_want);
        line = nl ? nl + 1 : out + n_out;
    }
    free(inp);
    free(out);
    return r;
}

static int load_vocab(const char *rel, gguf_file **f, lms_tokenizer **t)
{
    char err[256] = "";
    int rc = gguf_open(tu_data_path(rel), f, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", rel, err);
        return rc;
    }
    rc = lms_tokenizer_load(*f, t, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", rel, err);
        gguf_close(*f);
    }
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names of the vocab files that have test vectors, sorted. */
static int list_vocabs(char **names, int max)
{
    DIR *d = opendir(tu_data_path("tokenizer"));
    int k = 0;
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) && k < max;) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "ggml-vocab-", 11) == 0 && n > 5 &&
            strcmp(e->d_name + n - 5, ".gguf") == 0)
            names[k++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)k, sizeof *names, cmp_str);
    return k;
}

static bool has_file(const char *vocab, const char *suffix)
{
    char path[512];
    snprintf(path, sizeof path, "tokenizer/%s%s", vocab, suffix);
    FILE *f = fopen(tu_data_path(path), "rb");
    if (f)
        fclose(f);
    return f != NULL;
}

/* Runs one kind of vector file over every vocab that has it. */
static void run_all(const char *suffix, bool parse_special)
{
    char *names[64];
    char inp_suffix[64];
    int n = list_vocabs(names, 64), n_bad = 0, n_vocabs = 0;
    snprintf(inp_suffix, sizeof inp_suffix, "%s.inp", suffix);
    for (int i = 0; i < n; i++) {
        char rel[512];
        gguf_file *f;
        lms_tokenizer *t;
        if (!has_file(names[i], inp_suffix)) {
            free(names[i]);
            continue;
        }
        snprintf(rel, sizeof rel, "tokenizer/%s", names[i]);
        int rc = load_vocab(rel, &f, &t);
        if (rc == LMS_ERR_UNSUPPORTED && strstr(names[i], "bert")) {
            printf("%-34s skipped (WordPiece built without utf8proc)\n", names[i]);
            free(names[i]);
            continue;
        }
        assert_int_equal(rc, 0);
        vec_result r = run_file(t, names[i], suffix, parse_special);
        printf("%-34s %s %2d/%2d passed\n", names[i], *suffix ? "chat" : "    ", r.n_pass,
               r.n_total);
        n_bad += r.n_total - r.n_pass;
        n_vocabs++;
        lms_tokenizer_destroy(t);
        gguf_close(f);
        free(names[i]);
    }
    assert_true(n_vocabs > 0);
    assert_int_equal(n_bad, 0);
}

static void test_vocab_vectors(void **state)
{
    (void)state;
    run_all("", false);
}

static void test_chat_vectors(void **state)
{
    (void)state;
    run_all(".chat", true);
}

/* golden/<dir>/manifest.json: prompts with add_special must give tokens. */
static void check_golden(const char *dir)
{
    char rel[512];
    snprintf(rel, sizeof rel, "golden/%s/manifest.json", dir);
    json_error_t jerr;
    json_t *m = json_load_file(tu_data_path(rel), 0, &jerr);
    assert_non_null(m);
    gguf_file *f;
    lms_tokenizer *t;
    assert_int_equal(load_vocab(json_string_value(json_object_get(m, "model_file")), &f, &t), 0);
    size_t i;
    json_t *c;
    int n_pass = 0, n_total = 0;
    json_array_foreach(json_object_get(m, "cases"), i, c)
    {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        json_t *toks = json_object_get(c, "tokens");
        int32_t want[512];
        int n_want = (int)json_array_size(toks);
        assert_true(prompt && n_want <= 512);
        for (int k = 0; k < n_want; k++)
            want[k] = (int32_t)json_integer_value(json_array_get(toks, (size_t)k));
        assert_int_equal(lms_tokenizer_add_bos(t), json_is_true(json_object_get(c, "add_bos")));
        n_total++;
        n_pass += check_one(t, prompt, strlen(prompt), true, false, want, n_want);
    }
    printf("golden/%-27s      %2d/%2d passed\n", dir, n_pass, n_total);
    lms_tokenizer_destroy(t);
    gguf_close(f);
    json_decref(m);
    assert_int_equal(n_pass, n_total);
}

static void test_golden_prompts(void **state)
{
    (void)state;
    check_golden("stories260K");
    check_golden("llama-synth-f32");
    check_golden("qwen2-synth-q4_k_m");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab_vectors),
        cmocka_unit_test(test_chat_vectors),
        cmocka_unit_test(test_golden_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
