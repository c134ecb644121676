/*
 * test_tokenizer.c - tokenizer behaviour beyond the reference vectors:
 *
 *   - streaming detokenizer: characters split over byte tokens are held
 *     back, never emitted broken; invalid bytes become U+FFFD, checked
 *     against a slow reference sanitiser written here;
 *   - round trips: the pieces of tokenize(s) give s back byte for byte,
 *     for every vocab, for valid and invalid UTF-8, NULs, long runs;
 *   - special tokens, EOG set, BOS/EOS, cap handling, threads;
 *   - bad metadata (GGUF files written here with gguf_writer): each gives
 *     a clear error naming the key or value, never a crash.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "base/err.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "testutil.h"

/* BPE / SPM vocabs that round-trip exactly (WordPiece lower-cases). */
static const char *const exact_vocabs[] = {
    "deepseek-coder", "deepseek-llm", "falcon", "gpt-2",     "llama-bpe", "llama-spm", "mpt",
    "phi-3",          "qwen2",        "refact", "starcoder",
};
#define N_EXACT (int)(sizeof exact_vocabs / sizeof exact_vocabs[0])

typedef struct vocab {
    gguf_file *f;
    lms_tokenizer *t;
    bool spell_known; /* spell[] is filled (on first use) */
    bool spell[256];  /* the tokenizer can spell this byte */
} vocab;

static vocab open_vocab(const char *name)
{
    char rel[256], err[256] = "";
    vocab v = {0};
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    int rc = gguf_open(tu_data_path(rel), &v.f, err, sizeof err);
    if (rc == 0 && (rc = lms_tokenizer_load(v.f, &v.t, err, sizeof err)) < 0)
        gguf_close(v.f);
    if (rc < 0)
        fprintf(stderr, "%s: %s\n", rel, err);
    assert_int_equal(rc, 0);
    return v;
}

static void close_vocab(vocab *v)
{
    lms_tokenizer_destroy(v->t);
    gguf_close(v->f);
}

/* Tokenizes into a malloc'd array (sized by a first counting call). */
static int32_t *tokenize_all(const lms_tokenizer *t, const char *s, size_t n, bool add_special,
                             bool parse_special, int64_t *n_out)
{
    int64_t k = lms_tokenize(t, s, n, add_special, parse_special, NULL, 0);
    assert_true(k >= 0);
    int32_t *ids = malloc(sizeof *ids * (size_t)(k + 1));
    assert_non_null(ids);
    assert_int_equal(lms_tokenize(t, s, n, add_special, parse_special, ids, k), k);
    *n_out = k;
    return ids;
}

/* ==== reference UTF-8 sanitiser (the slow twin of the detokenizer) ======= */

/* Length of the longest prefix of s[0..n) that starts a well-formed
 * character, by decoding and checking the code point's range. */
static size_t ref_prefix(const unsigned char *s, size_t n, bool *complete)
{
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    int need = s[0] < 0x80             ? 1
               : (s[0] & 0xE0) == 0xC0 ? 2
               : (s[0] & 0xF0) == 0xE0 ? 3
               : (s[0] & 0xF8) == 0xF0 ? 4
                                       : 0;
    *complete = false;
    if (need == 0)
        return 0;
    uint32_t cp = s[0] & (0xFF >> (need + 1));
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= n || (s[i] & 0xC0) != 0x80)
            return (size_t)i;
        cp = cp << 6 | (s[i] & 0x3F);
        /* a prefix that can no longer give a valid code point stops here */
        int rest = 6 * (need - 1 - i);
        uint32_t lo = cp << rest, hi = (cp << rest) | ((1u << rest) - 1);
        if (hi < min_cp[need] || lo > 0x10FFFF || (lo >= 0xD800 && hi <= 0xDFFF))
            return (size_t)i;
    }
    *complete = true;
    return (size_t)need;
}

/* Writes s with each maximal invalid subpart replaced by U+FFFD. */
static size_t ref_sanitize(const char *in, size_t n, char *out)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        bool complete;
        size_t len = ref_prefix(s + i, n - i, &complete);
        if (complete) {
            memcpy(out + k, s + i, len);
            k += len;
        } else {
            memcpy(out + k, "\xEF\xBF\xBD", 3);
            k += 3;
            len = len ? len : 1;
        }
        i += len;
    }
    return k;
}

static bool is_valid_utf8(const char *s, size_t n)
{
    char *tmp = malloc(3 * n + 1);
    bool ok = ref_sanitize(s, n, tmp) == n && memcmp(tmp, s, n) == 0;
    free(tmp);
    return ok;
}

/* ==== round trips ========================================================== */

/* Streams ids through a detokenizer; every chunk must be valid UTF-8. */
static char *detok_all(const lms_tokenizer *t, const int32_t *ids, int64_t n, bool strip,
                       size_t *len)
{
    size_t cap = lms_detok_max_out(t), k = 0;
    char *out = malloc(cap * (size_t)(n + 1) + 3), *chunk = malloc(cap);
    lms_detok d;
    lms_detok_init(&d, t, strip);
    for (int64_t i = 0; i < n; i++) {
        int m = lms_detok_push(&d, ids[i], chunk, cap);
        assert_true(m >= 0);
        assert_true(is_valid_utf8(chunk, (size_t)m));
        memcpy(out + k, chunk, (size_t)m);
        k += (size_t)m;
    }
    int m = lms_detok_flush(&d, out + k, 3);
    assert_true(m >= 0);
    *len = k + (size_t)m;
    free(chunk);
    return out;
}

/* Concatenated pieces of ids; returns a malloc'd buffer. */
static char *pieces(const lms_tokenizer *t, const int32_t *ids, int64_t n, size_t *len)
{
    size_t cap = lms_tokenizer_max_piece(t), k = 0;
    char *out = malloc(cap * (size_t)n + 1);
    for (int64_t i = 0; i < n; i++) {
        int m = lms_token_to_piece(t, ids[i], false, out + k, cap);
        assert_true(m >= 0);
        k += (size_t)m;
    }
    *len = k;
    return out;
}

/* s as the tokenizer can spell it: without the bytes a BPE vocab has no
 * symbol for (found once per vocab by tokenizing each byte alone). */
static size_t spellable(vocab *v, const char *s, size_t n, char *out)
{
    size_t pre = lms_tokenizer_add_space_prefix(v->t), k = 0;
    for (int b = 0; b < 256 && !v->spell_known; b++) {
        char c = (char)b;
        int64_t m;
        size_t len;
        int32_t *ids = tokenize_all(v->t, &c, 1, false, false, &m);
        char *p = pieces(v->t, ids, m, &len);
        v->spell[b] = len == 1 + pre && p[pre] == c;
        free(p);
        free(ids);
    }
    v->spell_known = true;
    for (size_t i = 0; i < n; i++)
        if (v->spell[(unsigned char)s[i]])
            out[k++] = s[i];
    return k;
}

/* pieces(tokenize(s)) == s exactly (but for bytes the vocab cannot spell);
 * streaming detok == sanitize(s). */
static void check_round_trip(vocab *v, const char *s, size_t n)
{
    const lms_tokenizer *t = v->t;
    int64_t k;
    size_t len, n_got;
    int32_t *ids = tokenize_all(t, s, n, false, false, &k);
    char *back = pieces(t, ids, k, &len), *want = malloc(3 * n + 1), *raw = malloc(n + 1);
    size_t n_raw = spellable(v, s, n, raw);
    size_t skip = lms_tokenizer_add_space_prefix(t) && n > 0; /* SPM's space in front */
    if (len != n_raw + skip || memcmp(back + skip, raw, n_raw) != 0) {
        fprintf(stderr, "round trip failed (%s, %zu bytes): got %zu bytes\n", lms_tokenizer_pre(t),
                n, len);
        fail();
    }
    size_t n_want = ref_sanitize(raw, n_raw, want);
    char *got = detok_all(t, ids, k, lms_tokenizer_add_space_prefix(t), &n_got);
    assert_int_equal(n_got, n_want);
    assert_memory_equal(got, want, n_want);
    free(got);
    free(raw);
    free(want);
    free(back);
    free(ids);
}

static const char *const round_trip_texts[] = {
    "Hello world",
    " leading",
    "trailing  ",
    "   ",
    "\t\n\r\n",
    "a\nb\n\n\nc",
    "I've been 'told he's there, 'RE you sure?",
    "3.14159 1234567890 ١٢٣",
    "\xf0\x9f\xa6\x99\xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f",
    "Việt Nam 日本語 한국어",
    "\xe1\x9e\x80\xe1\x9e\xb6\xe1\x9e\x93",
    "def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\n<think>x</think><|im_end|>",
    "<s>[INST] hi [/INST]</s>",
    "\xff\xfe invalid",
    "a\x80z",
    "cut \xe2\x82",
    "\xe2\x82\xf0\x9f\xa6",
    "\xed\xa0\x80 surrogate",
    "\xc0\xaf overlong",
    "\xf4\x90\x80\x80 too big",
};

static void test_round_trip_all_vocabs(void **state)
{
    (void)state;
    for (int v = 0; v < N_EXACT; v++) {
        vocab voc = open_vocab(exact_vocabs[v]);
        for (size_t i = 0; i < sizeof round_trip_texts / sizeof round_trip_texts[0]; i++)
            check_round_trip(&voc, round_trip_texts[i], strlen(round_trip_texts[i]));
        check_round_trip(&voc, "nul \0 inside", sizeof "nul \0 inside" - 1);
        close_vocab(&voc);
    }
}

/* Random bytes (mostly invalid UTF-8) and long runs: never a crash, still
 * an exact round trip. */
static void test_round_trip_random_and_long(void **state)
{
    (void)state;
    const char *names[] = {"llama-spm", "qwen2", "deepseek-llm", "falcon"};
    uint64_t seed = 42;
    size_t big = 1 << 16;
    char *buf = malloc(big);
    for (size_t v = 0; v < sizeof names / sizeof names[0]; v++) {
        vocab voc = open_vocab(names[v]);
        for (int r = 0; r < 50; r++) {
            size_t n = 1 + tu_rand_u64(&seed) % 64;
            for (size_t i = 0; i < n; i++)
                buf[i] = (char)tu_rand_u64(&seed);
            check_round_trip(&voc, buf, n);
        }
        const char fills[] = {' ', 'a', '\n', '7', '!'};
        for (size_t f = 0; f < sizeof fills; f++) {
            memset(buf, fills[f], big);
            check_round_trip(&voc, buf, big);
        }
        for (size_t i = 0; i + 4 <= big; i += 4)
            memcpy(buf + i, "\xf0\x9f\xa6\x99", 4);
        check_round_trip(&voc, buf, big);
        close_vocab(&voc);
    }
    free(buf);
}

/* ==== streaming detokenizer =============================================== */

/* Pushes one token, returns what came out as a NUL-terminated string. */
static const char *push(lms_detok *d, int32_t id)
{
    static char out[4096];
    int n = lms_detok_push(d, id, out, sizeof out - 1);
    assert_true(n >= 0);
    out[n] = 0;
    return out;
}

static void test_detok_byte_tokens(void **state)
{
    (void)state;
    vocab v = open_vocab("llama-spm");
    int32_t byte0 = lms_token_find(v.t, "<0x00>");
    int32_t a = lms_token_find(v.t, "a");
    assert_true(byte0 >= 0 && a >= 0);
    lms_detok d;
    char out[16];

    /* an emoji as four byte tokens: nothing until the last one */
    lms_detok_init(&d, v.t, false);
    assert_string_equal(push(&d, byte0 + 0xF0), "");
    assert_string_equal(push(&d, byte0 + 0x9F), "");
    assert_string_equal(push(&d, byte0 + 0xA6), "");
    assert_string_equal(push(&d, byte0 + 0x99), "\xf0\x9f\xa6\x99");
    assert_int_equal(lms_detok_flush(&d, out, sizeof out), 0);

    /* a byte that can never start a character comes out at once */
    assert_string_equal(push(&d, byte0 + 0xFF), "\xEF\xBF\xBD");
    /* a lead byte broken by an ASCII token: U+FFFD, then the letter */
    assert_string_equal(push(&d, byte0 + 0xE2), "");
    assert_string_equal(push(&d, a), "\xEF\xBF\xBD"
                                     "a");
    /* a broken sequence followed by the start of a new one */
    assert_string_equal(push(&d, byte0 + 0xE2), "");
    assert_string_equal(push(&d, byte0 + 0x82), "");
    assert_string_equal(push(&d, byte0 + 0xF0), "\xEF\xBF\xBD");
    assert_string_equal(push(&d, byte0 + 0x9F), "");
    /* ended early: the held bytes are one U+FFFD */
    assert_int_equal(lms_detok_flush(&d, out, sizeof out), 3);
    assert_memory_equal(out, "\xEF\xBF\xBD", 3);
    assert_int_equal(lms_detok_flush(&d, out, sizeof out), 0);

    /* too small a buffer: an error, and the detokenizer is unchanged */
    lms_detok_init(&d, v.t, false);
    assert_string_equal(push(&d, byte0 + 0xC3), "");
    assert_int_equal(lms_detok_push(&d, byte0 + 0xA9, out, 1), LMS_ERR_LIMIT);
    assert_string_equal(push(&d, byte0 + 0xA9), "\xc3\xa9");
    assert_int_equal(lms_detok_push(&d, -1, out, sizeof out), LMS_ERR_RANGE);
    close_vocab(&v);
}

static void test_detok_strip_and_special(void **state)
{
    (void)state;
    vocab v = open_vocab("llama-spm");
    int64_t n;
    int32_t *ids = tokenize_all(v.t, "Hello world", 11, true, false, &n);
    assert_int_equal(ids[0], lms_tokenizer_bos(v.t));
    size_t len;
    char *s = detok_all(v.t, ids, n, true, &len);
    assert_int_equal(len, 11);
    assert_memory_equal(s, "Hello world", 11);
    free(s);
    /* control tokens only with d.special */
    lms_detok d;
    lms_detok_init(&d, v.t, false);
    assert_string_equal(push(&d, lms_tokenizer_eos(v.t)), "");
    d.special = true;
    assert_string_equal(push(&d, lms_tokenizer_eos(v.t)), "</s>");
    free(ids);
    close_vocab(&v);
}

/* Characters split inside BPE tokens: every streamed chunk stays valid. */
static void test_detok_bpe_split_chars(void **state)
{
    (void)state;
    vocab v = open_vocab("qwen2");
    const char *s = "\xf0\x9d\x94\x98\xf0\x9d\x94\x99 \xe1\x9e\x80\xe1\x9e\xb6 "
                    "\xf0\x9f\xa7\x8c\xf0\x9f\xa7\x8c";
    int64_t n;
    int32_t *ids = tokenize_all(v.t, s, strlen(s), false, false, &n);
    int partial = 0;
    for (int64_t i = 0; i < n; i++) {
        char piece[64];
        int m = lms_token_to_piece(v.t, ids[i], false, piece, sizeof piece);
        assert_true(m >= 0);
        partial += !is_valid_utf8(piece, (size_t)m);
    }
    assert_true(partial > 0); /* the text does split characters */
    check_round_trip(&v, s, strlen(s));
    free(ids);
    close_vocab(&v);
}

/* ==== special tokens, ids, caps ============================================ */

static void expect_ids(const lms_tokenizer *t, const char *s, bool add_special, bool parse_special,
                       const int32_t *want, int64_t n_want)
{
    int64_t n;
    int32_t *ids = tokenize_all(t, s, strlen(s), add_special, parse_special, &n);
    assert_int_equal(n, n_want);
    assert_memory_equal(ids, want, sizeof *ids * (size_t)n_want);
    free(ids);
}

static void test_special_tokens(void **state)
{
    (void)state;
    vocab v = open_vocab("qwen2");
    int32_t im_start = lms_token_find(v.t, "<|im_start|>"), think = lms_token_find(v.t, "<think>");
    assert_int_equal(im_start, 151644);
    assert_int_equal(think, 151667);
    /* control tokens only with parse_special; user-defined always */
    expect_ids(v.t, "<|im_start|>", false, true, &im_start, 1);
    int64_t n;
    int32_t *ids = tokenize_all(v.t, "<|im_start|>", 12, false, false, &n);
    assert_true(n > 1);
    free(ids);
    expect_ids(v.t, "<think>", false, false, &think, 1);
    /* "x</s>y": </s> is an ordinary BPE token in Qwen, but llama.cpp makes
     * every "</s>" control (reference_cases): only parse_special splits it */
    const int32_t xsy[] = {87, 522, 82, 82244}, xsy_special[] = {87, 128247, 88};
    expect_ids(v.t, "x</s>y", false, false, xsy, 4);
    expect_ids(v.t, "x</s>y", false, true, xsy_special, 3);
    /* no BOS for qwen2; add_special adds nothing */
    assert_false(lms_tokenizer_add_bos(v.t));
    expect_ids(v.t, "<think>", true, false, &think, 1);
    close_vocab(&v);

    v = open_vocab("llama-spm");
    const int32_t bos_hello[] = {1, 15043}; /* "Hello" -> ▁Hello */
    expect_ids(v.t, "Hello", true, false, bos_hello, 2);
    const int32_t s_parsed[] = {1, 15043}, s_text[] = {529, 29879, 29958, 10994};
    expect_ids(v.t, "<s>Hello", false, true, s_parsed, 2);
    expect_ids(v.t, "<s>Hello", false, false, s_text, 4);
    close_vocab(&v);
}

/* Overlapping special tokens split as llama.cpp does: longest token first
 * over the whole text, not leftmost-longest. Falcon's >>TITLE<< and
 * <|endoftext|> share a "<"; ids from llama.cpp d32676d (parse_special,
 * no add_special) on the same vocab file. */
static void test_special_overlap_order(void **state)
{
    (void)state;
    vocab v = open_vocab("falcon");
    /* the longer <|endoftext|> (11) wins: ">>TITLE<" is plain text */
    const int32_t title_eot[] = {500, 6539, 39, 11};
    expect_ids(v.t, ">>TITLE<<|endoftext|>", false, true, title_eot, 4);
    /* the longer >>INTRODUCTION<< (2) wins over an earlier <|endoftext|> */
    const int32_t eot_intro[] = {39, 103, 415, 1487, 2164, 103, 2};
    expect_ids(v.t, "<|endoftext|>>INTRODUCTION<<", false, true, eot_intro, 7);
    /* here the longer one is also the leftmost */
    const int32_t intro_eot[] = {2, 103, 415, 1487, 2164, 54146};
    expect_ids(v.t, ">>INTRODUCTION<<|endoftext|>", false, true, intro_eot, 6);
    const int32_t chain[] = {99, 500, 30029, 39, 11, 41, 6539, 503, 100};
    expect_ids(v.t, "x>>QUESTION<<|endoftext|>>TITLE<<y", false, true, chain, 9);
    /* every occurrence, left to right */
    const int32_t rep[] = {500, 6539, 39, 11, 500, 6539, 39, 11, 500, 6539, 39, 11};
    expect_ids(v.t, ">>TITLE<<|endoftext|>>>TITLE<<|endoftext|>>>TITLE<<|endoftext|>", false,
               true, rep, 12);
    /* without parse_special neither is split (both control) */
    const int32_t plain[] = {500, 6539, 503, 103, 415, 1487, 2164, 54146};
    expect_ids(v.t, ">>TITLE<<|endoftext|>", false, false, plain, 8);
    close_vocab(&v);
}

/* Phi-3's chat tokens eat the whitespace after them (rstrip); <s> does not. */
static void test_phi3_rstrip(void **state)
{
    (void)state;
    vocab v = open_vocab("phi-3");
    int64_t n_hi, n;
    int32_t *hi = tokenize_all(v.t, "Hi", 2, false, false, &n_hi);
    const char *chat = "<|user|>\n  Hi<|end|>\n<|assistant|>\n";
    int32_t *ids = tokenize_all(v.t, chat, strlen(chat), false, true, &n);
    assert_int_equal(n, n_hi + 3);
    assert_int_equal(ids[0], lms_token_find(v.t, "<|user|>"));
    assert_memory_equal(ids + 1, hi, sizeof *hi * (size_t)n_hi);
    assert_int_equal(ids[n - 2], lms_token_find(v.t, "<|end|>"));
    assert_int_equal(ids[n - 1], lms_token_find(v.t, "<|assistant|>"));
    free(ids);
    ids = tokenize_all(v.t, "<s>\n", 4, false, true, &n);
    assert_int_equal(n, 3); /* <s> ▁ <0x0A> */
    free(ids);
    free(hi);
    close_vocab(&v);
}

static void test_eog_and_ids(void **state)
{
    (void)state;
    vocab v = open_vocab("qwen2");
    const int32_t eog[] = {151643, 151645, 151662, 151663, 151664};
    for (size_t i = 0; i < sizeof eog / sizeof eog[0]; i++)
        assert_true(lms_token_is_eog(v.t, eog[i]));
    assert_false(lms_token_is_eog(v.t, 128247)); /* the ordinary "</s>" */
    assert_false(lms_token_is_eog(v.t, 151644));
    assert_false(lms_token_is_eog(v.t, -1));
    assert_false(lms_token_is_eog(v.t, 1 << 30));
    assert_int_equal(lms_tokenizer_eos(v.t), 151645);
    assert_int_equal(lms_tokenizer_pad(v.t), 151643);
    assert_int_equal(lms_token_type(v.t, 151667), LMS_TOKEN_TYPE_USER_DEFINED);
    assert_int_equal(lms_token_type(v.t, 999999), LMS_ERR_RANGE);
    assert_string_equal(lms_token_text(v.t, 151645), "<|im_end|>");
    assert_string_equal(lms_token_text(v.t, -5), "");
    assert_int_equal(lms_token_find(v.t, "no such token here"), -1);
    close_vocab(&v);

    v = open_vocab("llama-bpe");
    assert_true(lms_token_is_eog(v.t, lms_token_find(v.t, "<|eot_id|>")));
    assert_true(lms_token_is_eog(v.t, 128001));
    assert_true(lms_tokenizer_add_bos(v.t));
    close_vocab(&v);
}

static void test_caps_and_pieces(void **state)
{
    (void)state;
    vocab v = open_vocab("gpt-2");
    const char *s = "Hello world, this is a test";
    int32_t few[2];
    int64_t n = lms_tokenize(v.t, s, strlen(s), false, false, few, 2);
    assert_true(n > 2);
    int64_t k;
    int32_t *all = tokenize_all(v.t, s, strlen(s), false, false, &k);
    assert_int_equal(k, n);
    assert_memory_equal(few, all, sizeof few);
    assert_int_equal(lms_tokenize(v.t, NULL, 3, false, false, few, 2), LMS_ERR_INVAL);
    assert_int_equal(lms_tokenize(v.t, s, 1, false, false, NULL, 2), LMS_ERR_INVAL);
    assert_int_equal(lms_tokenize(v.t, "", 0, true, false, few, 2), 0);

    char piece[8];
    assert_int_equal(lms_token_to_piece(v.t, all[0], false, piece, 1), LMS_ERR_LIMIT);
    assert_int_equal(lms_token_to_piece(v.t, all[0], false, piece, sizeof piece), 5);
    assert_memory_equal(piece, "Hello", 5);
    assert_int_equal(lms_token_to_piece(v.t, 50256, false, piece, sizeof piece), 0);
    assert_int_equal(lms_token_to_piece(v.t, -1, false, piece, sizeof piece), LMS_ERR_RANGE);
    free(all);
    close_vocab(&v);
}

typedef struct thread_arg {
    const lms_tokenizer *t;
    const char *text;
    int64_t n;
    int32_t ids[4096];
} thread_arg;

static void *thread_main(void *p)
{
    thread_arg *a = p;
    for (int i = 0; i < 20; i++)
        a->n = lms_tokenize(a->t, a->text, strlen(a->text), true, true, a->ids, 4096);
    return NULL;
}

/* A loaded tokenizer is read-only: threads tokenizing at once agree. */
static void test_threads(void **state)
{
    (void)state;
    vocab v = open_vocab("qwen2");
    size_t len;
    char *text = tu_read_file(tu_data_path("tokenizer/ggml-vocab-qwen2.gguf.chat.inp"), &len);
    assert_non_null(text);
    text[len < 6000 ? len : 6000] = 0;
    thread_arg *a = calloc(4, sizeof *a);
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thread_arg){.t = v.t, .text = text};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(a[i].n, a[0].n);
        assert_memory_equal(a[i].ids, a[0].ids, sizeof(int32_t) * (size_t)a[0].n);
    }
    free(a);
    free(text);
    close_vocab(&v);
}

/* ==== bad metadata ========================================================= */

static const char *skip_key; /* the key copy_kv leaves out */

static bool skip_one(const char *key)
{
    return skip_key && strcmp(key, skip_key) == 0;
}

/* Loads a tokenizer from a file built by `build` (on a fresh writer);
 * returns the load's result and its message. */
static int load_built(void (*build)(gguf_writer *w), char *err, size_t errsz)
{
    char path[] = "/tmp/lms_tok_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    gguf_writer *w = gguf_writer_create();
    build(w);
    assert_int_equal(gguf_writer_write(w, path, err, errsz), 0);
    gguf_writer_destroy(w);
    gguf_file *f;
    assert_int_equal(gguf_open(path, &f, err, errsz), 0);
    lms_tokenizer *t = NULL;
    err[0] = 0;
    int rc = lms_tokenizer_load(f, &t, err, errsz);
    assert_true(rc < 0 || t != NULL);
    lms_tokenizer_destroy(t);
    gguf_close(f);
    unlink(path);
    return rc;
}

/* The llama-spm vocab with skip_key left out, then `edit` applied. */
static void (*spm_edit)(gguf_writer *w);

/* Copies the keys of test vocab `rel` (but skip_key) to w. */
static void copy_vocab(gguf_writer *w, const char *rel)
{
    gguf_file *src;
    char err[256];
    assert_int_equal(gguf_open(tu_data_path(rel), &src, err, sizeof err), 0);
    assert_int_equal(gguf_writer_copy_kv(w, src, skip_one), 0);
    gguf_close(src);
}

static void build_spm(gguf_writer *w)
{
    copy_vocab(w, "tokenizer/ggml-vocab-llama-spm.gguf");
    if (spm_edit)
        spm_edit(w);
}

static int load_spm_variant(const char *skip, void (*edit)(gguf_writer *w), char *err, size_t errsz)
{
    skip_key = skip;
    spm_edit = edit;
    int rc = load_built(build_spm, err, errsz);
    skip_key = NULL;
    spm_edit = NULL;
    return rc;
}

static void short_scores(gguf_writer *w)
{
    const float s[3] = {0, 0, 0};
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_VT_F32, s, 3);
}

static void bad_type(gguf_writer *w)
{
    int32_t *ty = malloc(sizeof *ty * 32000);
    for (int i = 0; i < 32000; i++)
        ty[i] = i == 7 ? 9 : 1;
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, ty, 32000);
    free(ty);
}

static void bos_out_of_range(gguf_writer *w)
{
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 99999);
}
static void bos_none(gguf_writer *w)
{
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);
}
static void pad_out_of_range(gguf_writer *w)
{
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 77777);
}
static void model_t5(gguf_writer *w)
{
    gguf_writer_set_str(w, "tokenizer.ggml.model", "t5");
}
static void tokens_not_strings(gguf_writer *w)
{
    const int32_t v[2] = {1, 2};
    gguf_writer_set_arr(w, "tokenizer.ggml.tokens", GGUF_VT_I32, v, 2);
}

/* One broken variant of the llama-spm vocab and what loading it must say. */
typedef struct spm_case {
    const char *skip;             /* key left out */
    void (*edit)(gguf_writer *w); /* then applied */
    int rc;
    const char *msg[2]; /* substrings of the message */
} spm_case;

static const spm_case spm_cases[] = {
    {"tokenizer.ggml.tokens", NULL, LMS_ERR_NOTFOUND, {"tokenizer.ggml.tokens", "missing"}},
    {"tokenizer.ggml.tokens",
     tokens_not_strings,
     LMS_ERR_FORMAT,
     {"not an array of strings", "i32"}},
    {"tokenizer.ggml.scores",
     short_scores,
     LMS_ERR_FORMAT,
     {"'tokenizer.ggml.scores' has 3 entries, the vocab 32000", ""}},
    {"tokenizer.ggml.token_type", bad_type, LMS_ERR_FORMAT, {"token 7", "type 9"}},
    {"tokenizer.ggml.bos_token_id",
     bos_out_of_range,
     LMS_ERR_FORMAT,
     {"bos_token_id' = 99999", "32000"}},
    {"tokenizer.ggml.model", model_t5, LMS_ERR_UNSUPPORTED, {"'t5'", ""}},
    /* "none" ids, ignorable ones and absent scores load fine */
    {"tokenizer.ggml.bos_token_id", bos_none, 0, {"", ""}},
    {"tokenizer.ggml.padding_token_id", pad_out_of_range, 0, {"", ""}},
    {"tokenizer.ggml.scores", NULL, 0, {"", ""}},
};

static void test_bad_spm_metadata(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof spm_cases / sizeof spm_cases[0]; i++) {
        const spm_case *c = &spm_cases[i];
        char err[256];
        int rc = load_spm_variant(c->skip, c->edit, err, sizeof err);
        if (rc != c->rc || !strstr(err, c->msg[0]) || !strstr(err, c->msg[1]))
            fprintf(stderr, "case %zu: rc %d, message \"%s\"\n", i, rc, err);
        assert_int_equal(rc, c->rc);
        assert_non_null(strstr(err, c->msg[0]));
        assert_non_null(strstr(err, c->msg[1]));
    }
}

/* A tiny byte-level BPE vocab: the byte symbols a..d, "ab", plus whatever
 * merges bpe_merges names. */
static const char *const *bpe_merges;
static uint64_t n_bpe_merges;
static const char *bpe_pre_name = "gpt-2";

static void build_bpe(gguf_writer *w)
{
    const char *tokens[] = {"a", "b", "c", "d", "ab", "<|endoftext|>"};
    const int32_t types[] = {1, 1, 1, 1, 1, 3};
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", bpe_pre_name);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 6);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, 6);
    if (bpe_merges)
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", bpe_merges, n_bpe_merges);
}

static int load_bpe_variant(const char *const *merges, uint64_t n, const char *pre, char *err,
                            size_t errsz)
{
    bpe_merges = merges;
    n_bpe_merges = n;
    bpe_pre_name = pre;
    return load_built(build_bpe, err, errsz);
}

static void test_bad_bpe_metadata(void **state)
{
    (void)state;
    static const char *const good[] = {"a b"}, *const unknown[] = {"a b", "a x"},
                             *const no_space[] = {"a b", "ab"}, *const no_result[] = {"c d"};
    static const struct {
        const char *const *merges;
        uint64_t n;
        const char *pre;
        int rc;
        const char *msg;
    } cases[] = {
        {good, 1, "gpt-2", 0, ""},
        {unknown, 2, "gpt-2", LMS_ERR_FORMAT, "merge 1 'a x': 'x' is not in the vocab"},
        {no_space, 2, "gpt-2", LMS_ERR_FORMAT, "merge 1 'ab' is not two tokens"},
        {no_result, 1, "gpt-2", LMS_ERR_FORMAT, "merge 0 'c d': 'cd' is not in the vocab"},
        {NULL, 0, "gpt-2", LMS_ERR_FORMAT, "'tokenizer.ggml.merges' is missing"},
        {good, 1, "no-such-pre", LMS_ERR_UNSUPPORTED, "pre-tokenizer 'no-such-pre'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256];
        assert_int_equal(
            load_bpe_variant(cases[i].merges, cases[i].n, cases[i].pre, err, sizeof err),
            cases[i].rc);
        assert_non_null(strstr(err, cases[i].msg));
    }
}

/* The tiny vocab tokenizes by its merges and survives bytes it lacks. */
static void test_tiny_bpe(void **state)
{
    (void)state;
    const char *merges[] = {"a b"};
    gguf_file *f;
    lms_tokenizer *t;
    char err[256], path[] = "/tmp/lms_tok_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    bpe_merges = merges;
    n_bpe_merges = 1;
    bpe_pre_name = "gpt-2";
    gguf_writer *w = gguf_writer_create();
    build_bpe(w);
    assert_int_equal(gguf_writer_write(w, path, err, sizeof err), 0);
    gguf_writer_destroy(w);
    assert_int_equal(gguf_open(path, &f, err, sizeof err), 0);
    assert_int_equal(lms_tokenizer_load(f, &t, err, sizeof err), 0);
    const int32_t want[] = {4, 2, 4, 3}; /* ab c ab d; the space (no token) is dropped */
    expect_ids(t, "abc abd", false, false, want, 4);
    lms_tokenizer_destroy(t);
    gguf_close(f);
    unlink(path);
}

/* Writes the file `build` makes to path (a mkstemp template) and loads
 * it; close_built undoes it. */
static lms_tokenizer *open_built(void (*build)(gguf_writer *w), char *path, gguf_file **f)
{
    char err[256];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    gguf_writer *w = gguf_writer_create();
    build(w);
    assert_int_equal(gguf_writer_write(w, path, err, sizeof err), 0);
    gguf_writer_destroy(w);
    lms_tokenizer *t;
    assert_int_equal(gguf_open(path, f, err, sizeof err), 0);
    assert_int_equal(lms_tokenizer_load(*f, &t, err, sizeof err), 0);
    return t;
}

static void close_built(lms_tokenizer *t, gguf_file *f, const char *path)
{
    lms_tokenizer_destroy(t);
    gguf_close(f);
    unlink(path);
}

/* Tokens spelled like llama.cpp's end-of-turn and FIM markers are control
 * whatever the file says; gpt-oss's channel markers user-defined; one FIM
 * marker per role, none when the file names the role's token. */
static bool fim_key; /* build_marked writes tokenizer.ggml.fim_pre_token_id */

static void build_marked(gguf_writer *w)
{
    /* clang-format off */
    const char *tokens[] = {"a", "b", "</s>", "<|end|>", "<|return|>", "<|call|>", "<|channel|>",
                            "<|fim_prefix|>", "<fim_prefix>", "<|fim_pad|>", "<|file_sep|>",
                            "<|im_end|>"};
    /* clang-format on */
    const int32_t types[] = {1, 1, 4, 3, 3, 3, 3, 1, 1, 1, 1, 1};
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, 12);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, types, 12);
    const char *merges[] = {"a b"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 0);
    if (fim_key)
        gguf_writer_set_u32(w, "tokenizer.ggml.fim_pre_token_id", 8);
}

static void test_retype_by_text(void **state)
{
    (void)state;
    for (int pass = 0; pass < 2; pass++) {
        char path[] = "/tmp/lms_tok_XXXXXX";
        gguf_file *f;
        fim_key = pass == 1;
        lms_tokenizer *t = open_built(build_marked, path, &f);
        const int want[] = {1, 1, 3, 4, 3, 3, 4, pass ? 1 : 3, 1, 3, 3, 3};
        for (int32_t id = 0; id < 12; id++)
            assert_int_equal(lms_token_type(t, id), want[id]);
        /* </s> (user-defined in the file) is no longer split without
         * parse_special; <|channel|> (control in the file) now is */
        const int32_t s_text[] = {2}, chan[] = {6};
        int32_t ids[8]; /* without it: < / s > have no symbols here, dropped */
        assert_int_equal(lms_tokenize(t, "</s>", 4, false, false, ids, 8), 0);
        expect_ids(t, "</s>", false, true, s_text, 1);
        expect_ids(t, "<|channel|>", false, false, chan, 1);
        /* gpt-oss: <|end|> ends a message, not the reply; </s> and the
         * normal <|im_end|> stay as mark_eog found them */
        assert_false(lms_token_is_eog(t, 3));
        assert_true(lms_token_is_eog(t, 2));
        assert_false(lms_token_is_eog(t, 11));
        close_built(t, f, path);
    }
    fim_key = false;
}

/* WordPiece honours tokenizer.ggml.normalizer.lowercase / .strip_accents:
 * the bert-bge vocab (uncased) with them set; ids from llama.cpp d32676d
 * on the same files. */
static int wpm_lower = -1, wpm_strip = -1; /* -1: key absent */
static const char *wpm_bad_key;            /* written as a string */

static void build_wpm(gguf_writer *w)
{
    copy_vocab(w, "tokenizer/ggml-vocab-bert-bge.gguf");
    if (wpm_lower >= 0)
        gguf_writer_set_bool(w, "tokenizer.ggml.normalizer.lowercase", wpm_lower);
    if (wpm_strip >= 0)
        gguf_writer_set_bool(w, "tokenizer.ggml.normalizer.strip_accents", wpm_strip);
    if (wpm_bad_key)
        gguf_writer_set_str(w, wpm_bad_key, "yes");
    if (skip_key) /* the key left out is written again, false */
        gguf_writer_set_bool(w, skip_key, false);
}

static void test_wpm_normalizer_keys(void **state)
{
    (void)state;
    static const struct {
        int lower, strip;
        const char *text;
        int32_t ids[8];
        int n;
    } cases[] = {
        {0, -1, "Hello WORLD caf\xc3\xa9 \xc3\x84", {100, 100, 100, 100}, 4},
        {1, 0, "Hello WORLD caf\xc3\xa9 \xc3\x84pfel e\xcc\x81", {7592, 2088, 100, 100, 100}, 5},
        {-1, -1, "Hello WORLD caf\xc3\xa9 \xc3\x84pfel", {7592, 2088, 7668, 9706, 7959, 2140}, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[] = "/tmp/lms_tok_XXXXXX";
        gguf_file *f;
        wpm_lower = cases[i].lower;
        wpm_strip = cases[i].strip;
        lms_tokenizer *t = open_built(build_wpm, path, &f);
        expect_ids(t, cases[i].text, false, false, cases[i].ids, cases[i].n);
        close_built(t, f, path);
    }
    wpm_lower = wpm_strip = -1;
    /* add_bos_token / add_eos_token false: still [CLS] a [SEP] (llama.cpp) */
    static const char *const no_add[] = {"tokenizer.ggml.add_bos_token",
                                         "tokenizer.ggml.add_eos_token"};
    for (int i = 0; i < 2; i++) {
        char path[] = "/tmp/lms_tok_XXXXXX";
        gguf_file *f;
        skip_key = no_add[i];
        lms_tokenizer *t = open_built(build_wpm, path, &f);
        const int32_t framed[] = {101, 1037, 102};
        expect_ids(t, " a ", true, false, framed, 3);
        close_built(t, f, path);
    }
    skip_key = NULL;
    wpm_bad_key = "tokenizer.ggml.normalizer.strip_accents";
    char err[256];
    assert_int_equal(load_built(build_wpm, err, sizeof err), LMS_ERR_FORMAT);
    assert_non_null(strstr(err, "'tokenizer.ggml.normalizer.strip_accents' is not a boolean"));
    wpm_bad_key = NULL;
}

/* ==== ids from the reference =============================================
 * Inputs where lmserv once differed from llama.cpp. Every expected id list
 * was produced by llama.cpp d32676d: llama_tokenize() on the vocab loaded
 * with vocab_only, add_special and parse_special as in the case. */
typedef struct ref_case {
    const char *vocab, *text;
    bool add_special, parse_special;
    int32_t ids[24];
    int n;
} ref_case;

/* clang-format off */
static const ref_case ref_cases[] = {
    /* WordPiece: \v \f U+0085 U+2028 are whitespace; Hangul syllables and
     * accented letters map to their first decomposed code point; an
     * unassigned code point is kept (so the word is unknown); a spacing
     * mark (Mc) is stripped like a non-spacing one */
    {"bert-bge", "a\v\vb", false, false, {1037, 1038}, 2},
    {"bert-bge", "hello\fhello\xc2\x85x", true, false, {101, 7592, 7592, 1060, 102}, 5},
    {"bert-bge", "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8", false,
     false, {1469, 29991, 29999, 1467, 29997, 30003}, 6},
    {"bert-bge", "cafe\xcc\x81 caf\xc3\xa9 \xc7\x84", false, false, {7668, 7668, 100}, 3},
    {"bert-bge", "a\xcd\xb8" "b", false, false, {100}, 1},
    {"bert-bge", "\xe0\xa4\x95\xe0\xa5\x8d\xe0\xa4\xb7\xe0\xa4\xbf", false, false, {1315, 29873}, 2},
    {"bert-bge", "ABC\xe2\x80\xa8" "def", false, false, {5925, 13366}, 2},
    /* DeepSeek LLM: U+3000 is whitespace, never in a character class */
    {"deepseek-llm", "  \xe3\x80\x80", false, false, {243, 88946}, 2},
    {"deepseek-llm", "\t\t\xe3\x80\x80", true, false, {100000, 486, 88946}, 3},
    {"deepseek-llm", "'llx   \xe3\x80\x80", false, false, {6, 647, 87, 300, 88946}, 5},
    /* U+180E (a format character) is no whitespace for \s */
    {"llama-bpe", "b\xe1\xa0\x8e/K \xe1\xa0\x8e\xe1\xa0\x8ex", false, false,
     {65, 157, 254, 236, 14, 42, 87189, 254, 236, 157, 254, 236, 87}, 13},
    /* "</s>" is control whatever its type: Qwen2's normal one splits with
     * parse_special, Phi-3's user-defined one only then */
    {"qwen2", "<|im_start|></s> </s>", false, true, {151644, 128247, 220, 128247}, 4},
    {"qwen2", "<|im_start|></s> </s>", false, false,
     {27, 91, 318, 4906, 91, 1472, 82, 29, 690, 82, 29}, 11},
    {"phi-3", "a</s>  b", true, false, {1, 263, 829, 29879, 29958, 29871, 289}, 7},
    {"phi-3", "a</s>  b", false, true, {263, 2, 289}, 3},
    /* Phi-3's unknown-type [PAD...] tokens eat the whitespace after them */
    {"phi-3", "[PAD32011]  x</s> \n y", false, true, {32011, 921, 2, 343}, 4},
};
/* clang-format on */

static void check_ref_case(const ref_case *c)
{
    vocab v = open_vocab(c->vocab);
    int64_t n;
    int32_t *ids =
        tokenize_all(v.t, c->text, strlen(c->text), c->add_special, c->parse_special, &n);
    bool same = n == c->n && memcmp(ids, c->ids, sizeof *ids * (size_t)n) == 0;
    if (!same) {
        fprintf(stderr, "%s (%s): got", c->vocab, c->text);
        for (int64_t k = 0; k < n; k++)
            fprintf(stderr, " %d", ids[k]);
        fprintf(stderr, "\n");
    }
    assert_true(same);
    free(ids);
    close_vocab(&v);
}

static void test_reference_cases(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof ref_cases / sizeof ref_cases[0]; i++)
        check_ref_case(&ref_cases[i]);
    /* Digits new in Unicode 15 (Kawi U+11F53, Kaktovik U+1D2C7) are \p{N}
     * as in llama.cpp, though PCRE2 may predate them: the classes borrow
     * utf8proc's data when that is new enough (llama.cpp d32676d ids) */
    if (atoi(utf8proc_unicode_version()) >= 15) {
        /* clang-format off */
        static const ref_case new_digits[] = {
            {"llama-bpe", " \xf0\x91\xbd\x93" "2", false, false, {220, 172, 239, 121, 241, 17}, 6},
            {"qwen2", " \xf0\x9d\x8b\x87\xf0\x9d\x8b\x87", false, false,
             {220, 56252, 233, 229, 56252, 233, 229}, 7},
        };
        /* clang-format on */
        for (size_t i = 0; i < 2; i++)
            check_ref_case(&new_digits[i]);
    }
    /* WordPiece has no 100-character limit on a word: "x" * 150 is ▁xx then
     * 74 times xx (llama.cpp d32676d) */
    vocab v = open_vocab("bert-bge");
    char xs[150];
    memset(xs, 'x', sizeof xs);
    int64_t n;
    int32_t *ids = tokenize_all(v.t, xs, sizeof xs, false, false, &n);
    assert_int_equal(n, 75);
    assert_int_equal(ids[0], 22038);
    for (int64_t k = 1; k < n; k++)
        assert_int_equal(ids[k], 20348);
    free(ids);
    close_vocab(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detok_byte_tokens),
        cmocka_unit_test(test_detok_strip_and_special),
        cmocka_unit_test(test_detok_bpe_split_chars),
        cmocka_unit_test(test_round_trip_all_vocabs),
        cmocka_unit_test(test_round_trip_random_and_long),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_special_overlap_order),
        cmocka_unit_test(test_phi3_rstrip),
        cmocka_unit_test(test_eog_and_ids),
        cmocka_unit_test(test_caps_and_pieces),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_bad_spm_metadata),
        cmocka_unit_test(test_bad_bpe_metadata),
        cmocka_unit_test(test_tiny_bpe),
        cmocka_unit_test(test_reference_cases),
        cmocka_unit_test(test_retype_by_text),
        cmocka_unit_test(test_wpm_normalizer_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
