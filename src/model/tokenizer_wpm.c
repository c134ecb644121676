/*
 * tokenizer_wpm.c - WordPiece (tokenizer.ggml.model = "bert"): BERT-style
 * embedding models such as bge-small.
 *
 * Normalisation and word split follow llama.cpp's WordPiece, which is
 * close to, but not quite, Hugging Face's BertNormalizer +
 * BertPreTokenizer. Lower-casing and accent stripping are on unless
 * tokenizer.ggml.normalizer.lowercase / .strip_accents say otherwise
 * (stripping follows lower-casing when only that key is there; pre-tokenizer
 * "whitespace" turns lower-casing off). Per code point:
 *   - when stripping accents, it is first replaced by the first code point
 *     of its canonical decomposition ("é" -> "e", a Hangul syllable -> its
 *     leading jamo: a one-to-one map, unlike a true NFD);
 *   - whitespace (\t..\r, space, U+0085, Zs, U+2028/9) ends a word;
 *   - NUL, U+FFFD, controls (Cc, Cf, Cs, Co), bytes that are not UTF-8 and,
 *     when stripping accents, marks (M*) are dropped; unassigned code
 *     points are kept;
 *   - the rest is lower-cased if asked (simple case mapping); punctuation
 *     (P*), ASCII symbols and CJK ideographs are words of one character.
 * A word is then covered greedily by the longest vocab token from the left.
 * In GGUF a word-initial token carries a "▁" prefix and a continuation has
 * none (the converter rewrote BERT's "##"), so the word is looked up with
 * "▁" in front. A word that cannot be covered becomes one unknown token.
 * Unlike Hugging Face, a word of more than 100 characters is still covered
 * (llama.cpp has no such limit).
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

#define WPM_PREFIX "\xe2\x96\x81"
#define WPM_PREFIX_LEN 3

/* The word being built, in the caller's tok_work buffer (the "▁" prefix,
 * then at most 4 bytes for each input byte). */
typedef struct wpm_word {
    char *buf;
    size_t n; /* bytes in buf, prefix included */
} wpm_word;

static int wpm_flag(const gguf_file *f, const char *key, bool *flag, char *err, size_t errsz)
{
    int rc = gguf_get_bool(f, key, flag);
    if (rc < 0 && rc != LMS_ERR_NOTFOUND)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "tokenizer: '%s' is not a boolean", key);
    return 0;
}

/* Lower-casing is on but for pre-tokenizer "whitespace"; accent stripping
 * follows lower-casing; the file's keys override both. */
int wpm_setup(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    t->wpm_lowercase = strcmp(t->pre, "whitespace") != 0;
    int rc = wpm_flag(f, "tokenizer.ggml.normalizer.lowercase", &t->wpm_lowercase, err, errsz);
    t->wpm_strip_accents = t->wpm_lowercase;
    if (rc == 0)
        rc = wpm_flag(f, "tokenizer.ggml.normalizer.strip_accents", &t->wpm_strip_accents, err,
                      errsz);
    return rc;
}

static bool wpm_is_chinese(int32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Unicode White_Space: what \s matches in the BPE pre-tokenizers too. */
static bool wpm_is_space(int32_t c)
{
    return (c >= '\t' && c <= '\r') || c == ' ' || c == 0x85 || c == 0x2028 || c == 0x2029 ||
           utf8proc_category(c) == UTF8PROC_CATEGORY_ZS;
}

static bool wpm_is_dropped(int32_t c, bool strip_accents)
{
    if (c == 0 || c == 0xFFFD)
        return true;
    utf8proc_category_t k = utf8proc_category(c);
    return (strip_accents && k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) ||
           (k >= UTF8PROC_CATEGORY_CC && k <= UTF8PROC_CATEGORY_CO);
}

/* A word of its own: punctuation, an ASCII symbol, a CJK ideograph. */
static bool wpm_is_alone(int32_t c)
{
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO) ||
           (c < 0x7F && k >= UTF8PROC_CATEGORY_SM && k <= UTF8PROC_CATEGORY_SO) ||
           wpm_is_chinese(c);
}

/* Covers the word greedily with vocab tokens, or writes the unknown one. */
static void wpm_emit(const lms_tokenizer *t, wpm_word *w, tok_out *o)
{
    if (w->n == WPM_PREFIX_LEN)
        return;
    int64_t start = o->n;
    bool ok = true;
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
}

/* Feeds one input code point through normalisation and the word split. */
static void wpm_feed(const lms_tokenizer *t, wpm_word *w, int32_t c, tok_out *o)
{
    utf8proc_int32_t parts[32];
    int boundclass = 0;
    if (t->wpm_strip_accents &&
        utf8proc_decompose_char(c, parts, 32, UTF8PROC_DECOMPOSE, &boundclass) >= 1)
        c = parts[0];
    if (wpm_is_space(c)) {
        wpm_emit(t, w, o);
        return;
    }
    if (wpm_is_dropped(c, t->wpm_strip_accents))
        return;
    bool alone = wpm_is_alone(c);
    if (alone)
        wpm_emit(t, w, o);
    w->n += (size_t)tok_utf8_encode((uint32_t)(t->wpm_lowercase ? utf8proc_tolower(c) : c),
                                    w->buf + w->n);
    if (alone)
        wpm_emit(t, w, o);
}

int wpm_tokenize(const lms_tokenizer *t, tok_work *work, const char *s, size_t n, tok_out *o)
{
    int rc = tok_work_reserve(work, 0, WPM_PREFIX_LEN + 4 * n);
    if (rc < 0)
        return rc;
    wpm_word w = {.buf = work->buf, .n = WPM_PREFIX_LEN};
    memcpy(w.buf, WPM_PREFIX, WPM_PREFIX_LEN);
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
