/*
 * tokenizer.c - the vocabulary shared by every tokenizer algorithm: loading
 * tokenizer.ggml.* metadata, string -> id hashing, special ids and the
 * end-of-generation set, splitting special tokens out of a text, the merge
 * loop that SentencePiece and BPE share, and tokens -> text.
 *
 * Called by the model loader (lms_tokenizer_load), the chat path
 * (lms_tokenize) and the engine (lms_token_is_eog, lms_detok_*).
 * The algorithms live in tokenizer_spm.c, tokenizer_bpe.c, tokenizer_wpm.c;
 * the streaming detokenizer in tokenizer_detok.c.
 *
 * Key names and token type codes follow the GGUF spec (ggml docs/gguf.md).
 */
#include "model/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ckd.h"
#include "base/err.h"
#include "model/tokenizer_int.h"

#define TOK_MAX_VOCAB (1 << 24)
#define TOK_MAX_TOKEN (1 << 20) /* bytes of one token text */
#define TOK_MAX_TEXT ((size_t)256 << 20)

/* Texts that mark the end of a turn or of a document in the chat formats we
 * know; such a token counts as end-of-generation when it is not a normal
 * token (so Qwen's ordinary BPE token "</s>" is not). */
/* clang-format off */
static const char *const eog_texts[] = {
    "</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
    "<|end|>", "<end_of_turn>", "<|return|>", "<EOT>", "_<EOT>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<fim_pad>", "<fim-pad>",
    "<\xef\xbd\234end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", /* DeepSeek's */
};
/* clang-format on */

/* ==== hashing ============================================================== */

uint64_t tok_hash_step(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull; /* FNV-1a */
    }
    return h;
}

uint32_t tok_hash_final(uint64_t h)
{
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return (uint32_t)(h ^ (h >> 32));
}

uint32_t tok_hash(const char *s, size_t n)
{
    return tok_hash_final(tok_hash_step(TOK_HASH_SEED, s, n));
}

static uint32_t pow2_slots(size_t n)
{
    uint32_t c = 16;
    while (c < 2 * n)
        c <<= 1;
    return c;
}

static int strmap_init(tok_strmap *m, size_t n)
{
    uint32_t c = pow2_slots(n);
    m->slots = malloc(sizeof *m->slots * c);
    if (!m->slots)
        return LMS_ERR_NOMEM;
    for (uint32_t i = 0; i < c; i++)
        m->slots[i] = (tok_strslot){.hash = 0, .id = -1};
    m->mask = c - 1;
    return 0;
}

static bool slot_is(const lms_tokenizer *t, const tok_strslot *e, uint32_t h, const char *s,
                    size_t n)
{
    return e->hash == h && tok_len(t, e->id) == n && memcmp(tok_text(t, e->id), s, n) == 0;
}

/* Inserts id, whose text hashes to h; an equal text already there is
 * replaced. */
static void strmap_put(const lms_tokenizer *t, tok_strmap *m, int32_t id, uint32_t h)
{
    const char *s = tok_text(t, id);
    size_t n = tok_len(t, id);
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        tok_strslot *e = &m->slots[i];
        if (e->id < 0 || slot_is(t, e, h, s, n)) {
            *e = (tok_strslot){.hash = h, .id = id};
            return;
        }
    }
}

int32_t tok_strmap_find_hashed(const lms_tokenizer *t, const tok_strmap *m, uint32_t h,
                               const char *s, size_t n)
{
    if (!m->slots)
        return -1;
    for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const tok_strslot *e = &m->slots[i];
        if (e->id < 0)
            return -1;
        if (slot_is(t, e, h, s, n))
            return e->id;
    }
}

int32_t tok_strmap_find(const lms_tokenizer *t, const tok_strmap *m, const char *s, size_t n)
{
    return tok_strmap_find_hashed(t, m, tok_hash(s, n), s, n);
}

/* ==== UTF-8 ================================================================ */

int tok_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/*
 * Well-formed sequences (Unicode 15, table 3-7):
 *
 *   lead      2nd byte   3rd      4th
 *   00..7F
 *   C2..DF    80..BF
 *   E0        A0..BF     80..BF
 *   E1..EC    80..BF     80..BF
 *   ED        80..9F     80..BF
 *   EE..EF    80..BF     80..BF
 *   F0        90..BF     80..BF   80..BF
 *   F1..F3    80..BF     80..BF   80..BF
 *   F4        80..8F     80..BF   80..BF
 */
int tok_utf8_check(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c < 0xC2 || c > 0xF4)
        return -1;
    len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return 0;
        if (s[i] < lo || s[i] > hi)
            return -i;
        lo = 0x80;
        hi = 0xBF;
    }
    return len;
}

uint32_t tok_utf8_decode(const unsigned char *s, int len)
{
    static const unsigned char lead_mask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
    uint32_t cp = s[0] & lead_mask[len];
    for (int i = 1; i < len; i++)
        cp = (cp << 6) | (s[i] & 0x3F);
    return cp;
}

/* ==== loading ============================================================== */

int tok_str_array(const gguf_file *f, const char *key, const gguf_kv **out, char *err, size_t errsz)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv)
        return lms_errf(err, errsz, LMS_ERR_NOTFOUND, "tokenizer: key '%s' is missing", key);
    if (kv->type != GGUF_VT_ARRAY || kv->arr_type != GGUF_VT_STRING || !kv->strs)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tokenizer: '%s' is %s of %s, not an array of strings", key,
                        gguf_vtype_name(kv->type), gguf_vtype_name(kv->arr_type));
    *out = kv;
    return 0;
}

/* An optional numeric array with one entry per token: *out stays NULL
 * when the key is absent. */
static int per_token_array(const lms_tokenizer *t, const gguf_file *f, const char *key,
                           const gguf_kv **out, char *err, size_t errsz)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    *out = NULL;
    if (!kv)
        return 0;
    if (kv->type != GGUF_VT_ARRAY || !kv->arr || gguf_vtype_size(kv->arr_type) == 0)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "tokenizer: '%s' is not a numeric array", key);
    if (kv->n != (uint64_t)t->n_vocab)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tokenizer: '%s' has %llu entries, the vocab %d", key,
                        (unsigned long long)kv->n, t->n_vocab);
    *out = kv;
    return 0;
}

static int load_tokens(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    const char *key = "tokenizer.ggml.tokens";
    const gguf_kv *kv;
    int rc = tok_str_array(f, key, &kv, err, errsz);
    if (rc < 0)
        return rc;
    if (kv->n == 0 || kv->n > TOK_MAX_VOCAB)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tokenizer: '%s' has %llu entries (1 to %d allowed)", key,
                        (unsigned long long)kv->n, TOK_MAX_VOCAB);
    t->n_vocab = (int32_t)kv->n;
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (kv->strs[i].n > TOK_MAX_TOKEN)
            return lms_errf(err, errsz, LMS_ERR_FORMAT,
                            "tokenizer: token %d is %zu bytes long (at most %d)", i, kv->strs[i].n,
                            TOK_MAX_TOKEN);
        if (lms_ckd_add(&total, total, kv->strs[i].n + 1) || total > UINT32_MAX)
            return lms_errf(err, errsz, LMS_ERR_LIMIT,
                            "tokenizer: token texts exceed 4 GiB at token %d", i);
    }
    t->pool = malloc(total);
    t->off = malloc(sizeof *t->off * ((size_t)t->n_vocab + 1));
    t->attr = malloc((size_t)t->n_vocab);
    t->scores = calloc((size_t)t->n_vocab, sizeof *t->scores);
    if (!t->pool || !t->off || !t->attr || !t->scores)
        return LMS_ERR_NOMEM;
    uint32_t at = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t n = kv->strs[i].n;
        t->off[i] = at;
        memcpy(t->pool + at, kv->strs[i].p, n);
        t->pool[at + n] = 0;
        at += (uint32_t)n + 1;
        if (n > t->max_len)
            t->max_len = n;
    }
    t->off[t->n_vocab] = at;
    return 0;
}

static int load_scores(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    const gguf_kv *kv;
    int rc = per_token_array(t, f, "tokenizer.ggml.scores", &kv, err, errsz);
    for (int32_t i = 0; rc == 0 && kv && i < t->n_vocab; i++) {
        t->scores[i] = (float)gguf_arr_f64(kv, (uint64_t)i);
        if (isnan(t->scores[i]))
            rc = lms_errf(err, errsz, LMS_ERR_FORMAT, "tokenizer: score of token %d is NaN", i);
    }
    return rc;
}

static int load_types(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    const gguf_kv *kv;
    int rc = per_token_array(t, f, "tokenizer.ggml.token_type", &kv, err, errsz);
    memset(t->attr, LMS_TOKEN_TYPE_NORMAL, (size_t)t->n_vocab);
    if (rc < 0 || !kv)
        return rc;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int64_t v = gguf_arr_i64(kv, (uint64_t)i);
        if (v < 0 || v > LMS_TOKEN_TYPE_BYTE)
            return lms_errf(err, errsz, LMS_ERR_FORMAT,
                            "tokenizer: token %d '%.40s' has type %lld (0 to 6 allowed)", i,
                            tok_text(t, i), (long long)v);
        t->attr[i] = v == 0 ? LMS_TOKEN_TYPE_NORMAL : (uint8_t)v;
    }
    return 0;
}

/* Reads a special id; -1 / 0xFFFFFFFF mean none. Out of range: an error if
 * `strict`, else none. An absent key leaves *id as it was (the default). */
static int load_id(lms_tokenizer *t, const gguf_file *f, const char *name, bool strict, int32_t *id,
                   char *err, size_t errsz)
{
    char key[96];
    int64_t v;
    snprintf(key, sizeof key, "tokenizer.ggml.%s", name);
    int rc = gguf_get_i64(f, key, &v);
    if (rc == LMS_ERR_NOTFOUND)
        return 0;
    if (rc < 0)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "tokenizer: '%s' is not an integer", key);
    if (v == -1 || v == 0xFFFFFFFFll) {
        *id = -1;
    } else if (v < 0 || v >= t->n_vocab) {
        if (strict)
            return lms_errf(err, errsz, LMS_ERR_FORMAT,
                            "tokenizer: '%s' = %lld, the vocab has %d tokens", key, (long long)v,
                            t->n_vocab);
        *id = -1;
    } else {
        *id = (int32_t)v;
    }
    return 0;
}

static int load_flag(const gguf_file *f, const char *name, bool *flag, char *err, size_t errsz)
{
    char key[96];
    snprintf(key, sizeof key, "tokenizer.ggml.%s", name);
    int rc = gguf_get_bool(f, key, flag);
    if (rc < 0 && rc != LMS_ERR_NOTFOUND)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "tokenizer: '%s' is not a boolean", key);
    return 0;
}

/* Defaults by algorithm, then the file's keys over them. */
static int load_specials(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    int32_t sep = -1, cls = -1;
    int rc = 0;
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = -1;
    if (t->kind == TOK_KIND_SPM) {
        t->unk = 0;
        t->bos = t->n_vocab > 1 ? 1 : -1;
        t->eos = t->n_vocab > 2 ? 2 : -1;
        t->add_bos = t->add_space_prefix = true;
    } else if (t->kind == TOK_KIND_WPM) {
        t->add_bos = t->add_eos = true;
    }
    if ((rc = load_id(t, f, "bos_token_id", true, &t->bos, err, errsz)) < 0 ||
        (rc = load_id(t, f, "eos_token_id", true, &t->eos, err, errsz)) < 0 ||
        (rc = load_id(t, f, "unknown_token_id", true, &t->unk, err, errsz)) < 0 ||
        (rc = load_id(t, f, "eot_token_id", true, &t->eot, err, errsz)) < 0 ||
        (rc = load_id(t, f, "eom_token_id", false, &t->eom, err, errsz)) < 0 ||
        (rc = load_id(t, f, "padding_token_id", false, &t->pad, err, errsz)) < 0 ||
        (rc = load_id(t, f, "seperator_token_id", false, &sep, err, errsz)) < 0 ||
        (rc = load_id(t, f, "cls_token_id", false, &cls, err, errsz)) < 0)
        return rc;
    if ((rc = load_flag(f, "add_bos_token", &t->add_bos, err, errsz)) < 0 ||
        (rc = load_flag(f, "add_eos_token", &t->add_eos, err, errsz)) < 0 ||
        (rc = load_flag(f, "add_space_prefix", &t->add_space_prefix, err, errsz)) < 0)
        return rc;
    t->sep = -1;
    if (t->kind == TOK_KIND_WPM) {
        /* BERT frames every text as [CLS] ... [SEP] whatever add_bos_token /
         * add_eos_token say, and misses the ids as llama.cpp does: [CLS]
         * 101, [SEP] 102, [UNK] 100 (the cls key before 101) */
        int32_t dflt_cls = t->n_vocab > 101 ? 101 : -1, dflt_sep = t->n_vocab > 102 ? 102 : -1;
        t->bos = t->bos >= 0 ? t->bos : cls >= 0 ? cls : dflt_cls;
        t->sep = sep >= 0 ? sep : dflt_sep;
        t->eos = t->eos >= 0 ? t->eos : t->sep;
        if (t->unk < 0 && !gguf_find_kv(f, "tokenizer.ggml.unknown_token_id"))
            t->unk = t->n_vocab > 100 ? 100 : -1;
        t->add_bos = t->add_eos = true;
    }
    return 0;
}

static void mark_eog(lms_tokenizer *t)
{
    const int32_t ids[] = {t->eos, t->eot, t->eom};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i] >= 0)
            t->attr[ids[i]] |= TOK_ATTR_EOG;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = tok_strmap_find(t, &t->vocab, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && tok_type(t, id) != LMS_TOKEN_TYPE_NORMAL &&
            tok_type(t, id) != LMS_TOKEN_TYPE_BYTE)
            t->attr[id] |= TOK_ATTR_EOG;
    }
}

/* GGUF does not carry Hugging Face's per-token rstrip flag. Phi-3 needs
 * it: its chat tokens (<|user|>, <|end|>, ... and </s>, its unknown-type
 * [PAD...] too) swallow the whitespace that follows them, <unk>, <s> and
 * <|endoftext|> do not. Known by general.name, as llama.cpp does. */
static void mark_rstrip(lms_tokenizer *t, const gguf_file *f)
{
    const char *name = NULL;
    if (gguf_get_str(f, "general.name", &name) < 0 ||
        (!strcasestr(name, "phi3") && !strcasestr(name, "phi-3")))
        return;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const char *s = tok_text(t, i);
        int type = tok_type(t, i);
        if ((type == LMS_TOKEN_TYPE_CONTROL || type == LMS_TOKEN_TYPE_USER_DEFINED ||
             type == LMS_TOKEN_TYPE_UNKNOWN) &&
            strcmp(s, "<unk>") != 0 && strcmp(s, "<s>") != 0 && strcmp(s, "<|endoftext|>") != 0)
            t->attr[i] |= TOK_ATTR_RSTRIP;
    }
}

/* llama.cpp, the reference for token ids, makes a token control when its
 * text is one it takes for an end of turn or a fill-in-the-middle marker,
 * whatever the file's token_type says: Qwen2's ordinary BPE token "</s>"
 * is then split out of a text with parse_special (and no longer renders
 * without `special`), Phi-3's user-defined "</s>" only with parse_special.
 * The end-of-generation set (mark_eog, run before) stays as it was, but
 * for the two tokens at the end that llama.cpp takes out of it. */
/* clang-format off */
static const char *const control_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[",
};
/* Fill-in-the-middle markers by role: only when the file names no token for
 * the role (key), the first one found takes it. */
static const struct {
    const char *key, *old_key;
    const char *texts[9];
} fim_roles[] = {
    {"fim_pre_token_id", "prefix_token_id", {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>", "\xe2\x96\x81<PRE>",
      "<|code_prefix|>", "<|prefix|>"}},
    {"fim_suf_token_id", "suffix_token_id", {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>",
      "<|code_suffix|>", "<|suffix|>"}},
    {"fim_mid_token_id", "middle_token_id", {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
      "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>", "\xe2\x96\x81<MID>",
      "<|code_middle|>", "<|middle|>"}},
    {"fim_pad_token_id", NULL, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
    {"fim_rep_token_id", NULL, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
    {"fim_sep_token_id", NULL, {"<|file_sep|>"}},
};
/* clang-format on */

static int32_t find_text(const lms_tokenizer *t, const char *s)
{
    return tok_strmap_find(t, &t->vocab, s, strlen(s));
}

static void set_type(lms_tokenizer *t, int32_t id, int type)
{
    if (id >= 0)
        t->attr[id] = (uint8_t)((t->attr[id] & ~TOK_ATTR_TYPE) | type);
}

static bool has_id_key(const lms_tokenizer *t, const gguf_file *f, const char *name)
{
    char key[96];
    int64_t v;
    snprintf(key, sizeof key, "tokenizer.ggml.%s", name);
    return gguf_get_i64(f, key, &v) == 0 && v >= 0 && v < t->n_vocab;
}

static void retype_by_text(lms_tokenizer *t, const gguf_file *f)
{
    /* a user-defined token made control keeps llama.cpp's user-defined bit,
     * which changes nothing it does: control alone here */
    for (size_t i = 0; i < sizeof control_texts / sizeof control_texts[0]; i++)
        set_type(t, find_text(t, control_texts[i]), LMS_TOKEN_TYPE_CONTROL);
    for (size_t r = 0; r < sizeof fim_roles / sizeof fim_roles[0]; r++) {
        if (has_id_key(t, f, fim_roles[r].key) ||
            (fim_roles[r].old_key && has_id_key(t, f, fim_roles[r].old_key)))
            continue;
        for (int k = 0; k < 9 && fim_roles[r].texts[k]; k++) {
            int32_t id = find_text(t, fim_roles[r].texts[k]);
            if (id >= 0) {
                set_type(t, id, LMS_TOKEN_TYPE_CONTROL);
                break;
            }
        }
    }
    /* gpt-oss: channel markers always split and render */
    static const char *const gpt_oss[] = {"<|channel|>", "<|message|>", "<|start|>",
                                          "<|constrain|>"};
    for (size_t i = 0; i < sizeof gpt_oss / sizeof gpt_oss[0]; i++)
        set_type(t, find_text(t, gpt_oss[i]), LMS_TOKEN_TYPE_USER_DEFINED);
    /* o200k_harmony / solar-open: <|end|> closes a message, not the reply */
    int32_t end = find_text(t, "<|end|>");
    if (end >= 0 && ((find_text(t, "<|return|>") >= 0 && find_text(t, "<|call|>") >= 0) ||
                     (find_text(t, "<|calls|>") >= 0 && find_text(t, "<|flush|>") >= 0))) {
        set_type(t, end, LMS_TOKEN_TYPE_USER_DEFINED);
        t->attr[end] &= (uint8_t)~TOK_ATTR_EOG;
    }
    /* Gemma 4: </s> is plain text */
    int32_t s_end = find_text(t, "</s>");
    if (s_end >= 0 && find_text(t, "<|tool_response>") >= 0) {
        set_type(t, s_end, LMS_TOKEN_TYPE_NORMAL);
        t->attr[s_end] &= (uint8_t)~TOK_ATTR_EOG;
    }
}

static bool is_splittable(int type)
{
    return type == LMS_TOKEN_TYPE_CONTROL || type == LMS_TOKEN_TYPE_UNKNOWN ||
           type == LMS_TOKEN_TYPE_USER_DEFINED;
}

/* Adds length n to a set's list if new, keeping it longest first. */
static int special_set_add(tok_special_set *s, const char *text, uint32_t n)
{
    s->first[(unsigned char)text[0] >> 3] |= (uint8_t)(1u << (text[0] & 7));
    int i = 0;
    while (i < s->n_lens && s->lens[i] > n)
        i++;
    if (i < s->n_lens && s->lens[i] == n)
        return 0;
    uint32_t *p = realloc(s->lens, sizeof *p * ((size_t)s->n_lens + 1));
    if (!p)
        return LMS_ERR_NOMEM;
    s->lens = p;
    memmove(p + i + 1, p + i, sizeof *p * (size_t)(s->n_lens - i));
    p[i] = n;
    s->n_lens++;
    return 0;
}

static int build_vocab_map(lms_tokenizer *t)
{
    int rc;
    if ((rc = strmap_init(&t->vocab, (size_t)t->n_vocab)) < 0)
        return rc;
    /* In batches: hash and prefetch the slots, then insert, so the cache
     * misses of a big table overlap. */
    for (int32_t b = 0; b < t->n_vocab; b += TOK_BATCH) {
        uint32_t h[TOK_BATCH];
        int32_t n = t->n_vocab - b < TOK_BATCH ? t->n_vocab - b : TOK_BATCH;
        for (int32_t j = 0; j < n; j++) {
            h[j] = tok_hash(tok_text(t, b + j), tok_len(t, b + j));
            tok_strmap_prefetch(&t->vocab, h[j]);
        }
        for (int32_t j = 0; j < n; j++)
            strmap_put(t, &t->vocab, b + j, h[j]);
    }
    return 0;
}

/* The special tokens split out of a text (after retype_by_text). */
static int build_special_map(lms_tokenizer *t)
{
    int rc;
    int32_t n_special = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        n_special += is_splittable(tok_type(t, i)) && tok_len(t, i) > 0;
    if (n_special == 0)
        return 0;
    if ((rc = strmap_init(&t->special_map, (size_t)n_special)) < 0)
        return rc;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint32_t n = (uint32_t)tok_len(t, i);
        int type = tok_type(t, i);
        if (!is_splittable(type) || n == 0)
            continue;
        strmap_put(t, &t->special_map, i, tok_hash(tok_text(t, i), n));
        if (type == LMS_TOKEN_TYPE_USER_DEFINED &&
            (rc = special_set_add(&t->special[0], tok_text(t, i), n)) < 0)
            return rc;
        if ((rc = special_set_add(&t->special[1], tok_text(t, i), n)) < 0)
            return rc;
    }
    return 0;
}

static int load_kind(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    const char *model = NULL, *pre = "default";
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (rc == LMS_ERR_NOTFOUND)
        return lms_errf(err, errsz, LMS_ERR_NOTFOUND,
                        "tokenizer: key 'tokenizer.ggml.model' is missing");
    if (rc < 0)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tokenizer: 'tokenizer.ggml.model' is not a string");
    if (strcmp(model, "llama") == 0)
        t->kind = TOK_KIND_SPM;
    else if (strcmp(model, "gpt2") == 0)
        t->kind = TOK_KIND_BPE;
    else if (strcmp(model, "bert") == 0)
        t->kind = TOK_KIND_WPM;
    else
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                        "tokenizer: model '%.40s' is not supported (llama, gpt2, bert are)", model);
    rc = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
    if (rc < 0 && rc != LMS_ERR_NOTFOUND)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tokenizer: 'tokenizer.ggml.pre' is not a string");
    snprintf(t->model, sizeof t->model, "%s", model);
    snprintf(t->pre, sizeof t->pre, "%s", rc < 0 ? "default" : pre);
    return 0;
}

static int load_all(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    int rc;
    if ((rc = load_kind(t, f, err, errsz)) < 0 || (rc = load_tokens(t, f, err, errsz)) < 0 ||
        (rc = load_scores(t, f, err, errsz)) < 0 || (rc = load_types(t, f, err, errsz)) < 0 ||
        (rc = load_specials(t, f, err, errsz)) < 0)
        return rc;
    if ((rc = build_vocab_map(t)) < 0)
        return rc;
    mark_eog(t);
    retype_by_text(t, f);
    if ((rc = build_special_map(t)) < 0)
        return rc;
    mark_rstrip(t, f);
    memset(t->byte_tok, 0xff, sizeof t->byte_tok);
    switch (t->kind) {
    case TOK_KIND_SPM: return spm_setup(t, f, err, errsz);
    case TOK_KIND_BPE: return bpe_setup(t, f, err, errsz);
    case TOK_KIND_WPM: return wpm_setup(t, f, err, errsz);
    }
    return LMS_ERR_INVAL;
}

int lms_tokenizer_load(const gguf_file *f, lms_tokenizer **out, char *err, size_t errsz)
{
    if (!f || !out)
        return LMS_ERR_INVAL;
    lms_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "tokenizer: out of memory");
    int rc = load_all(t, f, err, errsz);
    if (rc < 0) {
        if (rc == LMS_ERR_NOMEM)
            lms_errf(err, errsz, rc, "tokenizer: out of memory loading %d tokens", t->n_vocab);
        lms_tokenizer_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void lms_tokenizer_destroy(lms_tokenizer *t)
{
    if (!t)
        return;
    if (t->kind == TOK_KIND_BPE)
        bpe_teardown(t);
    free(t->special[0].lens);
    free(t->special[1].lens);
    free(t->special_map.slots);
    free(t->vocab.slots);
    free(t->scores);
    free(t->attr);
    free(t->off);
    free(t->pool);
    free(t);
}

/* ==== the merge loop ======================================================= */

int tok_work_reserve(tok_work *w, size_t n_sym, size_t n_buf)
{
    if (n_sym > w->cap_sym) {
        tok_sym *p = realloc(w->sym, sizeof *p * n_sym);
        if (!p)
            return LMS_ERR_NOMEM;
        w->sym = p;
        w->cap_sym = n_sym;
    }
    if (n_buf > w->cap_buf) {
        char *b = realloc(w->buf, n_buf);
        if (!b)
            return LMS_ERR_NOMEM;
        w->buf = b;
        w->cap_buf = n_buf;
    }
    return 0;
}

static bool pair_before(const tok_pair *a, const tok_pair *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

static int heap_push(tok_work *w, const tok_pair *p)
{
    if (w->n_heap == w->cap_heap) {
        size_t c = w->cap_heap ? 2 * w->cap_heap : 64;
        tok_pair *h = realloc(w->heap, sizeof *h * c);
        if (!h)
            return LMS_ERR_NOMEM;
        w->heap = h;
        w->cap_heap = c;
    }
    size_t i = w->n_heap++;
    while (i > 0 && pair_before(p, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = *p;
    return 0;
}

static tok_pair heap_pop(tok_work *w)
{
    tok_pair top = w->heap[0];
    tok_pair last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && pair_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!pair_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n > 0)
        w->heap[i] = last;
    return top;
}

static int try_pair(const lms_tokenizer *t, tok_work *w, const char *s, int32_t left, int32_t right,
                    tok_pair_fn fn)
{
    if (left < 0 || right < 0)
        return 0;
    const tok_sym *l = &w->sym[left], *r = &w->sym[right];
    tok_pair p = {.left = left, .right = right, .n = l->n + r->n};
    if (!fn(t, s, l, r, &p.prio, &p.id))
        return 0;
    return heap_push(w, &p);
}

int tok_merge(const lms_tokenizer *t, tok_work *w, const char *s, int32_t n, tok_pair_fn fn)
{
    int rc = 0;
    w->n_heap = 0;
    for (int32_t i = 1; i < n && rc == 0; i++)
        rc = try_pair(t, w, s, i - 1, i, fn);
    while (w->n_heap > 0 && rc == 0) {
        tok_pair p = heap_pop(w);
        tok_sym *l = &w->sym[p.left], *r = &w->sym[p.right];
        if (l->n == 0 || r->n == 0 || l->next != p.right || l->n + r->n != p.n)
            continue; /* stale: one side merged since */
        l->n += r->n;
        l->id = p.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->sym[r->next].prev = p.left;
        rc = try_pair(t, w, s, l->prev, p.left, fn);
        if (rc == 0)
            rc = try_pair(t, w, s, p.left, l->next, fn);
    }
    return rc;
}

void tok_work_free(tok_work *w)
{
    if (w->match_data || w->match_ctx || w->jit_stack)
        bpe_work_free(w);
    free(w->sym);
    free(w->heap);
    free(w->buf);
    memset(w, 0, sizeof *w);
}

/* ==== text -> tokens ======================================================= */

/* One special token split out of a text: its bytes [at, at + its length),
 * then the whitespace it swallows (rstrip) up to `end`. */
typedef struct tok_split {
    size_t at, end;
    int32_t id;
} tok_split;

static int split_cmp(const void *a, const void *b)
{
    size_t x = ((const tok_split *)a)->at, y = ((const tok_split *)b)->at;
    return (x > y) - (x < y);
}

static bool is_ascii_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

#define BIT_GET(m, i) (((m)[(i) >> 3] >> ((i) & 7)) & 1u)
#define BIT_SET(m, i) ((m)[(i) >> 3] |= (uint8_t)(1u << ((i) & 7)))

/* Finds the special tokens of set `all` (control, unknown, user-defined)
 * or user-defined only in s[0..n), in llama.cpp's order, which is not
 * leftmost-longest: the longest tokens first, each length over the whole
 * text left to right, a match taken only where no earlier one (or the
 * whitespace an earlier one swallowed) holds any of its bytes. So in
 * ">>TITLE<<|endoftext|>" (Falcon) <|endoftext|> wins and ">>TITLE<" is
 * plain text. Among tokens of one length llama.cpp's order is that of its
 * unstable sort; here the leftmost wins.
 * `busy` marks the bytes taken. A run of taken bytes always holds a token
 * at least as long as the length being looked for, so a match is free when
 * its first and last bytes are. Cost: one hash lookup per position and
 * distinct special length (at most; the first-byte filter skips most), n/8
 * bytes and the splits sorted once. *splits is malloc'd, NULL when none. */
static int find_specials(const lms_tokenizer *t, bool all, const char *s, size_t n,
                         tok_split **splits, size_t *n_splits)
{
    const tok_special_set *set = &t->special[all];
    *splits = NULL;
    *n_splits = 0;
    if (set->n_lens == 0 || n == 0)
        return 0;
    uint8_t *busy = calloc(n / 8 + 1, 1);
    if (!busy)
        return LMS_ERR_NOMEM;
    tok_split *v = NULL;
    size_t nv = 0, cap = 0;
    int rc = 0;
    for (int k = 0; k < set->n_lens && rc == 0; k++) {
        size_t len = set->lens[k];
        for (size_t p = 0; len <= n && p <= n - len; p++) {
            if (busy[p >> 3] == 0xff) { /* 8 taken bytes: skip them at once */
                p |= 7;
                continue;
            }
            unsigned char c = (unsigned char)s[p];
            if (!(set->first[c >> 3] & (1u << (c & 7))) || BIT_GET(busy, p) ||
                BIT_GET(busy, p + len - 1))
                continue;
            int32_t id = tok_strmap_find(t, &t->special_map, s + p, len);
            if (id < 0 || !(all || tok_type(t, id) == LMS_TOKEN_TYPE_USER_DEFINED))
                continue;
            if (nv == cap) {
                size_t nc = cap ? cap * 2 : 16;
                tok_split *nvp = realloc(v, nc * sizeof *v);
                if (!nvp) {
                    rc = LMS_ERR_NOMEM;
                    break;
                }
                v = nvp;
                cap = nc;
            }
            size_t end = p + len;
            for (size_t q = p; q < end; q++)
                BIT_SET(busy, q);
            while ((t->attr[id] & TOK_ATTR_RSTRIP) && end < n && !BIT_GET(busy, end) &&
                   is_ascii_space(s[end])) {
                BIT_SET(busy, end);
                end++;
            }
            v[nv++] = (tok_split){.at = p, .end = end, .id = id};
            p = end - 1;
        }
    }
    free(busy);
    if (rc < 0) {
        free(v);
        return rc;
    }
    if (nv > 1)
        qsort(v, nv, sizeof *v, split_cmp);
    *splits = v;
    *n_splits = nv;
    return 0;
}

static int tokenize_raw(const lms_tokenizer *t, tok_work *w, const char *s, size_t n, tok_out *o)
{
    switch (t->kind) {
    case TOK_KIND_SPM: return spm_tokenize(t, w, s, n, t->add_space_prefix, o);
    case TOK_KIND_BPE: return bpe_tokenize(t, w, s, n, o);
    case TOK_KIND_WPM: return wpm_tokenize(t, w, s, n, o);
    }
    return LMS_ERR_INVAL;
}

/* Special tokens first, the algorithm on the raw text between them. Each
 * raw piece starts the text or follows a special token, so SentencePiece
 * puts its space prefix on every one (as llama.cpp does). */
static int tokenize_text(const lms_tokenizer *t, tok_work *w, const char *s, size_t n,
                         bool parse_special, tok_out *o)
{
    tok_split *v;
    size_t nv, raw = 0;
    int rc = find_specials(t, parse_special, s, n, &v, &nv);
    for (size_t i = 0; rc == 0 && i <= nv; i++) {
        size_t at = i < nv ? v[i].at : n;
        if (at > raw && (rc = tokenize_raw(t, w, s + raw, at - raw, o)) < 0)
            break;
        if (i < nv) {
            tok_out_push(o, v[i].id);
            raw = v[i].end;
        }
    }
    free(v);
    return rc;
}

int64_t lms_tokenize(const lms_tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, int64_t cap)
{
    if (!t || (!text && len) || cap < 0 || (!out && cap > 0))
        return LMS_ERR_INVAL;
    if (len > TOK_MAX_TEXT)
        return LMS_ERR_LIMIT;
    tok_out o = {.ids = out, .cap = cap};
    tok_work w = {0};
    if (add_special && t->add_bos && t->bos >= 0)
        tok_out_push(&o, t->bos);
    int rc = tokenize_text(t, &w, text, len, parse_special, &o);
    int32_t last = t->kind == TOK_KIND_WPM ? t->sep : t->eos;
    if (add_special && t->add_eos && last >= 0)
        tok_out_push(&o, last);
    tok_work_free(&w);
    return rc < 0 ? rc : o.n;
}

/* ==== vocabulary =========================================================== */

/* clang-format off */
int32_t lms_tokenizer_n_vocab(const lms_tokenizer *t) { return t->n_vocab; }
const char *lms_tokenizer_model(const lms_tokenizer *t) { return t->model; }
const char *lms_tokenizer_pre(const lms_tokenizer *t) { return t->pre; }
int32_t lms_tokenizer_bos(const lms_tokenizer *t) { return t->bos; }
int32_t lms_tokenizer_eos(const lms_tokenizer *t) { return t->eos; }
int32_t lms_tokenizer_eot(const lms_tokenizer *t) { return t->eot; }
int32_t lms_tokenizer_unk(const lms_tokenizer *t) { return t->unk; }
int32_t lms_tokenizer_pad(const lms_tokenizer *t) { return t->pad; }
bool lms_tokenizer_add_bos(const lms_tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool lms_tokenizer_add_eos(const lms_tokenizer *t) { return t->add_eos && t->eos >= 0; }
size_t lms_tokenizer_max_piece(const lms_tokenizer *t) { return t->max_len; }
/* clang-format on */

bool lms_tokenizer_add_space_prefix(const lms_tokenizer *t)
{
    return t->kind == TOK_KIND_SPM && t->add_space_prefix;
}

static bool valid_id(const lms_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab;
}

bool lms_token_is_eog(const lms_tokenizer *t, int32_t id)
{
    return valid_id(t, id) && (t->attr[id] & TOK_ATTR_EOG);
}

int lms_token_type(const lms_tokenizer *t, int32_t id)
{
    return valid_id(t, id) ? tok_type(t, id) : LMS_ERR_RANGE;
}

const char *lms_token_text(const lms_tokenizer *t, int32_t id)
{
    return valid_id(t, id) ? tok_text(t, id) : "";
}

int32_t lms_token_find_n(const lms_tokenizer *t, const char *text, size_t len)
{
    return text ? tok_strmap_find(t, &t->vocab, text, len) : -1;
}

int32_t lms_token_find(const lms_tokenizer *t, const char *text)
{
    return text ? lms_token_find_n(t, text, strlen(text)) : -1;
}

/* ==== tokens -> text ======================================================= */

int lms_token_to_piece(const lms_tokenizer *t, int32_t id, bool special, char *buf, size_t cap)
{
    if (!valid_id(t, id))
        return LMS_ERR_RANGE;
    size_t n = tok_len(t, id);
    switch (tok_type(t, id)) {
    case LMS_TOKEN_TYPE_CONTROL:
    case LMS_TOKEN_TYPE_UNKNOWN:
        if (!special)
            return 0;
        /* fall through */
    case LMS_TOKEN_TYPE_USER_DEFINED:
        if (n > cap)
            return LMS_ERR_LIMIT;
        memcpy(buf, tok_text(t, id), n);
        return (int)n;
    case LMS_TOKEN_TYPE_UNUSED: return 0;
    }
    switch (t->kind) {
    case TOK_KIND_SPM:
    case TOK_KIND_WPM: return spm_piece(t, id, buf, cap);
    case TOK_KIND_BPE: return bpe_piece(t, id, buf, cap);
    }
    return LMS_ERR_INVAL;
}
