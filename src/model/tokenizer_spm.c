/*
 * tokenizer_spm.c - SentencePiece BPE (tokenizer.ggml.model = "llama"):
 * Llama 1/2, Mistral, Phi-3, TinyLlama, the llama2.c stories models.
 *
 * The text is normalised the SentencePiece way for these models: an
 * optional space in front (add_space_prefix), then every ' ' written as
 * U+2581 "▁". It starts as one symbol per UTF-8 character; repeatedly the
 * adjacent pair whose concatenation is the vocab token with the highest
 * score merges (ties: leftmost). A character left without a token of its
 * own is written as its bytes, <0xNN> tokens (byte fallback), or as the
 * unknown token when the vocab has no byte tokens.
 *
 * Only normal and user-defined tokens take part in merges: a text spelling
 * "<s>" or "<0x41>" never becomes those tokens here (control ones may be
 * split out earlier by lms_tokenize with parse_special).
 */
#include <stdio.h>
#include <string.h>

#include "base/ckd.h"
#include "base/err.h"
#include "model/tokenizer_int.h"

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's visible space */
#define SPM_SPACE_LEN 3

int spm_setup(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    (void)f;
    (void)err;
    (void)errsz;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_tok[b] = tok_strmap_find(t, &t->vocab, name, 6);
    }
    return 0;
}

static bool spm_usable(const lms_tokenizer *t, int32_t id)
{
    int type = tok_type(t, id);
    return type == LMS_TOKEN_TYPE_NORMAL || type == LMS_TOKEN_TYPE_USER_DEFINED;
}

static bool spm_pair(const lms_tokenizer *t, const char *s, const tok_sym *l, const tok_sym *r,
                     float *prio, int32_t *id)
{
    if (l->n + r->n > t->max_len)
        return false;
    int32_t m = tok_strmap_find(t, &t->vocab, s + l->start, l->n + r->n);
    if (m < 0 || !spm_usable(t, m))
        return false;
    *prio = -t->scores[m]; /* highest score first */
    *id = m;
    return true;
}

/* Writes the normalised text to w->buf; returns its length. */
static size_t spm_escape(tok_work *w, const char *s, size_t n, bool prefix_space)
{
    size_t k = 0;
    if (prefix_space) {
        memcpy(w->buf, SPM_SPACE, SPM_SPACE_LEN);
        k = SPM_SPACE_LEN;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(w->buf + k, SPM_SPACE, SPM_SPACE_LEN);
            k += SPM_SPACE_LEN;
        } else {
            w->buf[k++] = s[i];
        }
    }
    return k;
}

/* One symbol per character; an invalid byte is a character of its own. */
static int32_t spm_symbols(const lms_tokenizer *t, tok_work *w, const char *s, size_t n)
{
    int32_t k = 0;
    for (size_t i = 0; i < n;) {
        int len = tok_utf8_check((const unsigned char *)s + i, n - i);
        if (len <= 0)
            len = 1;
        int32_t id = tok_strmap_find(t, &t->vocab, s + i, (size_t)len);
        tok_sym *y = &w->sym[k];
        y->prev = k - 1;
        y->next = i + (size_t)len < n ? k + 1 : -1;
        y->start = (uint32_t)i;
        y->n = (uint32_t)len;
        y->id = id >= 0 && spm_usable(t, id) ? id : -1;
        k++;
        i += (size_t)len;
    }
    return k;
}

static void spm_byte_fallback(const lms_tokenizer *t, const char *s, uint32_t n, tok_out *o)
{
    for (uint32_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[(unsigned char)s[i]];
        if (id < 0)
            id = t->unk;
        if (id >= 0)
            tok_out_push(o, id);
    }
}

int spm_tokenize(const lms_tokenizer *t, tok_work *w, const char *s, size_t n, bool prefix_space,
                 tok_out *o)
{
    size_t cap;
    if (lms_ckd_mul(&cap, n + 1, (size_t)SPM_SPACE_LEN))
        return LMS_ERR_LIMIT;
    int rc = tok_work_reserve(w, cap, cap);
    if (rc < 0)
        return rc;
    size_t m = spm_escape(w, s, n, prefix_space);
    int32_t n_sym = spm_symbols(t, w, w->buf, m);
    if ((rc = tok_merge(t, w, w->buf, n_sym, spm_pair)) < 0)
        return rc;
    for (int32_t i = n_sym > 0 ? 0 : -1; i >= 0; i = w->sym[i].next) {
        const tok_sym *y = &w->sym[i];
        if (y->id >= 0)
            tok_out_push(o, y->id);
        else
            spm_byte_fallback(t, w->buf + y->start, y->n, o);
    }
    return 0;
}

/* "<0xNN>" -> NN, or -1 when the text has another shape. */
static int spm_byte_value(const char *s, size_t n)
{
    unsigned v = 0;
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                            : 16;
        if (d > 15)
            return -1;
        v = v * 16 + d;
    }
    return (int)v;
}

int spm_piece(const lms_tokenizer *t, int32_t id, char *buf, size_t cap)
{
    const char *s = tok_text(t, id);
    size_t n = tok_len(t, id), k = 0;
    if (tok_type(t, id) == LMS_TOKEN_TYPE_BYTE) {
        int b = spm_byte_value(s, n);
        if (b >= 0) {
            if (cap < 1)
                return LMS_ERR_LIMIT;
            buf[0] = (char)b;
            return 1;
        }
    }
    for (size_t i = 0; i < n; k++) {
        if (k >= cap)
            return LMS_ERR_LIMIT;
        if (n - i >= SPM_SPACE_LEN && memcmp(s + i, SPM_SPACE, SPM_SPACE_LEN) == 0) {
            buf[k] = ' ';
            i += SPM_SPACE_LEN;
        } else {
            buf[k] = s[i++];
        }
    }
    return (int)k;
}
