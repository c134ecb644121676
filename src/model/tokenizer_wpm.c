/*
 * tokenizer_wpm.c - WordPiece (tokenizer.ggml.model = "bert"): BERT-style
 * embedding models such as bge-small.
 *
 * Normalisation and word split follow Hugging Face's BertNormalizer and
 * BertPreTokenizer with lower-casing on:
 *   - NUL, U+FFFD and other-category code points (controls, format
 *     characters like ZWJ, private use) are dropped; bytes that are not
 *     UTF-8 are dropped too;
 *   - whitespace (space, \t, \n, \r, Zs) ends a word;
 *   - each code point is decomposed (NFD), non-spacing marks are removed
 *     (accents: "Äpfel" -> "apfel"), the rest is lower-cased;
 *   - punctuation (Unicode P*, ASCII symbols) and CJK ideographs are words
 *     of one character.
 * A word is then covered greedily by the longest vocab token from the left.
 * In GGUF a word-initial token carries a "▁" prefix and a continuation has
 * none (the converter rewrote BERT's "##"), so the word is looked up with
 * "▁" in front. A word that cannot be covered, or that has more than 100
 * characters, becomes one unknown token.
 *
 * Unicode data (decomposition, case, categories) comes from utf8proc; when
 * lmserv is built without it (no LMS_HAVE_UTF8PROC), "bert" vocabs are
 * reported as unsupported.
 */
#include "base/err.h"
#include "model/tokenizer_int.h"

#ifdef LMS_HAVE_UTF8PROC

#include <string.h>
#include <utf8proc.h>

#define WPM_MAX_WORD_CHARS 100
#define WPM_PREFIX "\xe2\x96\x81"
#define WPM_PREFIX_LEN 3

typedef struct wpm_word {
    char buf[WPM_PREFIX_LEN + 4 * (WPM_MAX_WORD_CHARS + 1)];
    size_t n;    /* bytes in buf, prefix included */
    int n_chars; /* may exceed WPM_MAX_WORD_CHARS (then buf is not complete) */
} wpm_word;

int wpm_setup(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    (void)t;
    (void)f;
    (void)err;
    (void)errsz;
    return 0;
}

static bool wpm_is_chinese(int32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool wpm_is_punct(int32_t c)
{
    if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
        (c >= 123 && c <= 126))
        return true;
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

static bool wpm_is_space(int32_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
           utf8proc_category(c) == UTF8PROC_CATEGORY_ZS;
}

static bool wpm_is_dropped(int32_t c)
{
    if (c == 0 || c == 0xFFFD)
        return true;
    if (c == '\t' || c == '\n' || c == '\r')
        return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CN || k >= UTF8PROC_CATEGORY_CC;
}

/* Covers the word greedily with vocab tokens, or writes the unknown one. */
static void wpm_emit(const lms_tokenizer *t, wpm_word *w, tok_out *o)
{
    if (w->n_chars == 0)
        return;
    int64_t start = o->n;
    bool ok = w->n_chars <= WPM_MAX_WORD_CHARS;
    for (size_t i = 0; ok && i < w->n;) {
        size_t j = w->n - i > t->max_len ? i + t->max_len : w->n;
        int32_t id = -1;
        while (j > i && (id = tok_strmap_find(t, &t->vocab, w->buf + i, j - i)) < 0)
            j--;
        ok = id >= 0;
        if (ok)
            tok_out_push(o, id);
        i = j;
    }
    if (!ok) {
        o->n = start;
        if (t->unk >= 0)
            tok_out_push(o, t->unk);
    }
    w->n = WPM_PREFIX_LEN;
    w->n_chars = 0;
}

static void wpm_append(wpm_word *w, int32_t c)
{
    if (++w->n_chars <= WPM_MAX_WORD_CHARS)
        w->n += (size_t)tok_utf8_encode((uint32_t)c, w->buf + w->n);
}

/* Feeds one input code point through normalisation and the word split. */
static void wpm_feed(const lms_tokenizer *t, wpm_word *w, int32_t c, tok_out *o)
{
    utf8proc_int32_t parts[32];
    int boundclass = 0;
    if (wpm_is_dropped(c))
        return;
    if (wpm_is_space(c)) {
        wpm_emit(t, w, o);
        return;
    }
    utf8proc_ssize_t n = utf8proc_decompose_char(c, parts, 32, UTF8PROC_DECOMPOSE, &boundclass);
    if (n < 1 || n > 32) {
        parts[0] = c;
        n = 1;
    }
    for (utf8proc_ssize_t i = 0; i < n; i++) {
        int32_t d = parts[i];
        if (utf8proc_category(d) == UTF8PROC_CATEGORY_MN)
            continue;
        d = utf8proc_tolower(d);
        if (wpm_is_punct(d) || wpm_is_chinese(d)) {
            wpm_emit(t, w, o);
            wpm_append(w, d);
            wpm_emit(t, w, o);
        } else {
            wpm_append(w, d);
        }
    }
}

int wpm_tokenize(const lms_tokenizer *t, tok_work *work, const char *s, size_t n, tok_out *o)
{
    (void)work;
    wpm_word w;
    memcpy(w.buf, WPM_PREFIX, WPM_PREFIX_LEN);
    w.n = WPM_PREFIX_LEN;
    w.n_chars = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int len = tok_utf8_check(u + i, n - i);
        if (len <= 0) { /* not UTF-8: dropped */
            i++;
            continue;
        }
        wpm_feed(t, &w, (int32_t)tok_utf8_decode(u + i, len), o);
        i += (size_t)len;
    }
    wpm_emit(t, &w, o);
    return 0;
}

#else /* !LMS_HAVE_UTF8PROC */

int wpm_setup(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    (void)t;
    (void)f;
    return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                    "tokenizer: model 'bert' needs utf8proc, which this build lacks");
}

int wpm_tokenize(const lms_tokenizer *t, tok_work *work, const char *s, size_t n, tok_out *o)
{
    (void)t;
    (void)work;
    (void)s;
    (void)n;
    (void)o;
    return LMS_ERR_UNSUPPORTED;
}

#endif
