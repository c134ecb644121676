/*
 * tokenizer_bpe.c - byte-level BPE (tokenizer.ggml.model = "gpt2"): GPT-2,
 * Llama 3, Qwen 1.5-3, DeepSeek, Falcon, StarCoder, MPT, Refact, ...
 *
 * 1. Pre-tokenizer: the regexes that tokenizer.ggml.pre names split the
 *    text into words. With several regexes, each one splits every piece the
 *    previous one left, and the text between matches stays a piece of its
 *    own (Hugging Face's Split with behaviour "Isolated").
 * 2. Each byte of a word is one symbol: the token of the printable code
 *    point GPT-2 maps that byte to (table below).
 * 3. The adjacent pair with the lowest merge rank (tokenizer.ggml.merges
 *    order) merges, leftmost first, until no pair has a rank. Llama 3 sets
 *    ignore_merges: a word that is itself a token is emitted whole.
 *
 * Only normal tokens serve as byte symbols. Some vocabs lack a few (most
 * miss C0, C1, F5..FF, which UTF-8 never uses; Falcon also some ASCII
 * controls; DeepSeek has them only as user-defined tokens): such a byte is
 * dropped, as Hugging Face's BPE without an unknown token does.
 *
 * Byte <-> code point map of GPT-2 (bytes_to_unicode): bytes that are
 * printable Latin-1 keep their value, the other 68 take 256, 257, ... in
 * byte order:
 *
 *   bytes 0x21..0x7E, 0xA1..0xAC, 0xAE..0xFF   ->  same code point
 *   bytes 0x00..0x20                           ->  U+0100..U+0120
 *   bytes 0x7F..0xA0                           ->  U+0121..U+0142
 *   byte  0xAD                                 ->  U+0143
 *
 * Regexes run in PCRE2 (UTF + UCP, so \s \p{L} \p{N} are Unicode-aware,
 * and as llama.cpp's: \s spelled out, \p{..} widened, see bpe_expand;
 * MATCH_INVALID_UTF, so bytes that are not UTF-8 simply never match and
 * stay pieces of their own, which byte-level BPE encodes like any byte).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/tokenizer_int.h"

#ifdef LMS_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

#define BPE_MAX_MERGES (1 << 24) /* ranks stay exact in a float priority */
#define BPE_JIT_STACK_MAX (64u << 20)

/* ==== pre-tokenizers ======================================================= */

/* GPT-2's own pattern (Hugging Face ByteLevel with use_regex). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* cl100k-style, Llama 3 (digits in threes) and Qwen2 (single digits). */
#define RE_CL100K_HEAD "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_CL100K_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3 RE_CL100K_HEAD "\\p{N}{1,3}" RE_CL100K_TAIL
#define RE_QWEN2 RE_CL100K_HEAD "\\p{N}" RE_CL100K_TAIL
/* DeepSeek: CJK runs (U+4E00..U+9FA5, U+0800..U+4E00, Hangul).
 * llama.cpp, the reference, runs the regexes without \p{..} on text whose
 * non-ASCII whitespace became \v, so no character class of theirs ever
 * matches a space: U+3000 and the U+2000 spaces inside these ranges are
 * left out here ((?!\s), and U+3000 off the punctuation range) to split
 * the same: "  \u3000" stays one piece for "\s+$". */
#define RE_DEEPSEEK_CJK "(?:(?!\\s)[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}])+"
/* DeepSeek LLM: letters are the cased letters (Lu, Ll, Lt) as listed in
 * its tokenizer.json, and a set of ASCII / full-width punctuation. */
#define RE_DEEPSEEK_LETTERS                                                                        \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"            \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"         \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}" \
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"  \
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"                 \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"                 \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"         \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"        \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"                 \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"         \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"                   \
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"         \
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"                  \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"                 \
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"                 \
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"           \
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+"
#define RE_DEEPSEEK_PUNCT                                                                          \
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3001}\\x{3002}]+"
/* GPT-2's pattern without the final \s+ (the same splits: what it would
 * match is left between matches and becomes a piece anyway). */
#define RE_GPT2_SHORT                                                                              \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

typedef struct bpe_pre {
    const char *names; /* tokenizer.ggml.pre values, space separated */
    const char *regex[TOK_MAX_REGEX];
    bool ignore_merges;
    bool add_bos; /* when the file has no add_bos_token key */
} bpe_pre;

/* clang-format off */
static const bpe_pre bpe_pres[] = {
    {"default",
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2_SHORT, "\\p{N}+", "[0-9][0-9][0-9]"}, false, false},
    {"llama3 llama-v3 llama-bpe falcon3 pixtral", {RE_LLAMA3}, true, true},
    {"dbrx smaug-bpe", {RE_LLAMA3}, false, false},
    {"qwen2 stablelm2 deepseek-r1-qwen megrez hunyuan", {RE_QWEN2}, false, false},
    {"gpt-2 phi-2 mpt olmo jais roberta-bpe jina-es jina-de jina-v1-en jina-v2-es jina-v2-de "
     "jina-v2-code",
     {RE_GPT2}, false, false},
    {"starcoder refact command-r smollm codeshell exaone minerva-7b",
     {"\\p{N}", RE_GPT2}, false, false},
    {"falcon",
     {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2_SHORT, "[0-9][0-9][0-9]"}, false, false},
    {"deepseek-llm",
     {"[\\r\\n]", RE_DEEPSEEK_LETTERS, RE_DEEPSEEK_PUNCT, "\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"},
     false, true},
    {"deepseek-coder",
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"}, false, true},
};
/* clang-format on */

static bool name_in_list(const char *name, const char *list)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, " ");
        if (k == n && memcmp(p, name, n) == 0)
            return true;
        p += k + (p[k] == ' ');
    }
    return false;
}

/* Unicode White_Space, what llama.cpp's \s matches. PCRE2's \s (UCP) also
 * takes U+180E, a format character since Unicode 6.3, which would split
 * "b\u180e/K" differently; so each \s is spelled out, \S negated. */
#define BPE_SPACE_SET                                                                              \
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}" \
    "\\x{3000}"

/* PCRE2 knows the Unicode version it was built with, often older than
 * llama.cpp's tables: a letter or digit added since (Kawi, CJK extension
 * H, ...) would not be \p{L} / \p{N} there. utf8proc, also used by
 * WordPiece, is usually newer: the code points it puts in L, N or P that
 * PCRE2 does not are added to each \p{L}, \p{N}, \p{P} (found once, by
 * running \P{..} over all of utf8proc's members of the class). */
static const char bpe_classes[] = "LNP";
static char *bpe_class_extra[3]; /* "\x{A}-\x{B}..." or NULL; set once */

#ifdef LMS_HAVE_UTF8PROC
static pthread_once_t bpe_extra_once = PTHREAD_ONCE_INIT;

/* 0, 1, 2 for a code point in L, N, P (as bpe_classes), else -1. */
static int bpe_class_of(int32_t cp)
{
    utf8proc_category_t c = utf8proc_category(cp);
    if (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO)
        return 0;
    if (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO)
        return 1;
    if (c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO)
        return 2;
    return -1;
}

/* Appends "\x{first}" or "\x{first}-\x{last}" to a growing string. */
static bool bpe_add_range(char **s, size_t *n, size_t *cap, int32_t first, int32_t last)
{
    if (*n + 32 > *cap) {
        size_t c = *cap ? 2 * *cap : 256;
        char *p = realloc(*s, c);
        if (!p)
            return false;
        *s = p;
        *cap = c;
    }
    int w = first == last
                ? snprintf(*s + *n, 32, "\\x{%X}", (unsigned)first)
                : snprintf(*s + *n, 32, "\\x{%X}-\\x{%X}", (unsigned)first, (unsigned)last);
    *n += (size_t)w;
    return true;
}

/* The members of class k (buf[0..len), UTF-8) that PCRE2 does not count. */
static char *bpe_find_extra(int k, const char *buf, size_t len)
{
    size_t n = 0, cap = 0;
    char pat[] = "\\P{L}";
    pat[3] = bpe_classes[k];
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &code, &at, NULL);
    pcre2_match_data *md = re ? pcre2_match_data_create(1, NULL) : NULL;
    char *extra = NULL;
    int32_t first = -1, last = -2;
    bool ok = md != NULL;
    for (size_t pos = 0;
         ok && pcre2_match(re, (PCRE2_SPTR)buf, len, pos, PCRE2_NO_UTF_CHECK, md, NULL) > 0;) {
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        int32_t cp =
            (int32_t)tok_utf8_decode((const unsigned char *)buf + ov[0], (int)(ov[1] - ov[0]));
        if (cp != last + 1) {
            ok = first < 0 || bpe_add_range(&extra, &n, &cap, first, last);
            first = cp;
        }
        last = cp;
        pos = ov[1];
    }
    if (ok && first >= 0)
        ok = bpe_add_range(&extra, &n, &cap, first, last);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (!ok) { /* out of memory: PCRE2's classes as they are */
        free(extra);
        return NULL;
    }
    return extra;
}

static void bpe_extra_init(void)
{
    char *buf[3];
    size_t len[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++)
        buf[k] = malloc((size_t)5 << 20); /* every code point, UTF-8: 4.3 MB at most */
    for (int32_t cp = 0; cp <= 0x10FFFF && buf[0] && buf[1] && buf[2]; cp++) {
        int k = cp < 0xD800 || cp > 0xDFFF ? bpe_class_of(cp) : -1;
        if (k >= 0)
            len[k] += (size_t)tok_utf8_encode((uint32_t)cp, buf[k] + len[k]);
    }
    for (int k = 0; k < 3; k++) {
        if (buf[0] && buf[1] && buf[2])
            bpe_class_extra[k] = bpe_find_extra(k, buf[k], len[k]);
        free(buf[k]);
    }
}
#endif

/* Writes (when out is not NULL) regex re with \s / \S spelled out and the
 * extra code points added to \p{L} \p{N} \p{P}; returns the length, or 0
 * for a \S inside a class (none of our regexes has one). */
static size_t bpe_expand(const char *re, char *out)
{
    size_t n = strlen(re), k = 0;
    bool in_class = false;
#define PUT(str, len)                                                                              \
    do {                                                                                           \
        if (out)                                                                                   \
            memcpy(out + k, str, len);                                                             \
        k += len;                                                                                  \
    } while (0)
    for (size_t i = 0; i < n; i++) {
        const char *cls = i + 4 < n && !strncmp(re + i, "\\p{", 3) && re[i + 4] == '}'
                              ? strchr(bpe_classes, re[i + 3])
                              : NULL;
        const char *extra = cls ? bpe_class_extra[cls - bpe_classes] : NULL;
        bool space = re[i] == '\\' && i + 1 < n && (re[i + 1] == 's' || re[i + 1] == 'S');
        if (space || extra) {
            bool neg = space && re[i + 1] == 'S';
            if (in_class && neg)
                return 0;
            if (!in_class)
                PUT(neg ? "[^" : "[", neg ? 2u : 1u);
            if (space)
                PUT(BPE_SPACE_SET, strlen(BPE_SPACE_SET));
            else
                PUT(re + i, 5u);
            if (extra)
                PUT(extra, strlen(extra));
            if (!in_class)
                PUT("]", 1u);
            i += space ? 1 : 4;
            continue;
        }
        PUT(re + i, 1u);
        if (re[i] == '\\' && i + 1 < n) {
            i++;
            PUT(re + i, 1u);
        } else if (re[i] == '[' && !in_class) {
            in_class = true;
        } else if (re[i] == ']' && in_class) {
            in_class = false;
        }
    }
#undef PUT
    if (out)
        out[k] = 0;
    return k;
}

/* bpe_expand into a malloc'd string; NULL when out of memory or on a \S
 * inside a class. */
static char *bpe_expand_alloc(const char *re)
{
#ifdef LMS_HAVE_UTF8PROC
    pthread_once(&bpe_extra_once, bpe_extra_init);
#endif
    size_t n = bpe_expand(re, NULL);
    char *out = n ? malloc(n + 1) : NULL;
    if (out)
        bpe_expand(re, out);
    return out;
}

static int bpe_compile(lms_tokenizer *t, const bpe_pre *pre, char *err, size_t errsz)
{
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
    for (int i = 0; i < TOK_MAX_REGEX && pre->regex[i]; i++) {
        int code;
        PCRE2_SIZE at;
        char *src = bpe_expand_alloc(pre->regex[i]);
        if (!src)
            return lms_errf(err, errsz, LMS_ERR_NOMEM,
                            "tokenizer: regex %d of pre-tokenizer '%s': out of memory (or a \\S "
                            "inside a class)",
                            i, t->pre);
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, opts, &code, &at, NULL);
        free(src);
        if (!re) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(code, msg, sizeof msg);
            return lms_errf(err, errsz, LMS_ERR_INVAL,
                            "tokenizer: regex %d of pre-tokenizer '%s' at %zu: %s", i, t->pre,
                            (size_t)at, (const char *)msg);
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* interpreter if JIT is unavailable */
        t->regex[t->n_regex++] = re;
    }
    return 0;
}

/* ==== byte <-> code point ================================================== */

static uint32_t bpe_byte_to_cp(unsigned b)
{
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x121 + (b - 0x7F);
    if (b == 0xAD)
        return 0x143;
    return b;
}

/* The byte a code point stands for, or -1 when it is outside the map. */
static int bpe_cp_to_byte(uint32_t cp)
{
    if (cp < 0x100)
        return bpe_byte_to_cp(cp) == cp ? (int)cp : -1;
    if (cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp <= 0x142)
        return (int)(cp - 0x121 + 0x7F);
    if (cp == 0x143)
        return 0xAD;
    return -1;
}

/* Writes the mapped text of s[0..n) (at most 2n bytes); returns its length. */
static size_t bpe_map_bytes(const char *s, size_t n, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (size_t)tok_utf8_encode(bpe_byte_to_cp((unsigned char)s[i]), out + k);
    return k;
}

/* ==== merges =============================================================== */

static uint32_t pair_hash(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(key >> 32);
}

static const tok_merge_entry *pairmap_find(const tok_pairmap *m, uint64_t key)
{
    for (uint32_t i = pair_hash(key) & m->mask;; i = (i + 1) & m->mask) {
        const tok_merge_entry *e = &m->slots[i];
        if (e->key == key)
            return e;
        if (e->key == UINT64_MAX)
            return NULL;
    }
}

/* Keeps the first (lowest) rank of a pair listed twice. */
static void pairmap_put(tok_pairmap *m, uint64_t key, int32_t rank, int32_t id)
{
    for (uint32_t i = pair_hash(key) & m->mask;; i = (i + 1) & m->mask) {
        tok_merge_entry *e = &m->slots[i];
        if (e->key == key)
            return;
        if (e->key == UINT64_MAX) {
            *e = (tok_merge_entry){.key = key, .rank = rank, .id = id};
            return;
        }
    }
}

/* One merge being loaded, "left right": split, hashed, then looked up. */
typedef struct bpe_job {
    const gguf_str *m;
    size_t nl;     /* bytes of left; right starts at m->p + nl + 1 */
    uint32_t h[3]; /* hashes of left, right, left+right */
    uint64_t key;  /* left id << 32 | right id */
    int32_t id;    /* token of left+right */
} bpe_job;

static int bpe_split_merge(bpe_job *j, int32_t rank, char *err, size_t errsz)
{
    const gguf_str *m = j->m;
    const char *sp = m->n > 1 ? memchr(m->p + 1, ' ', m->n - 1) : NULL;
    if (!sp)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tokenizer: merge %d '%.40s' is not two tokens separated by a space", rank,
                        m->p);
    j->nl = (size_t)(sp - m->p);
    uint64_t left = tok_hash_step(TOK_HASH_SEED, m->p, j->nl);
    j->h[0] = tok_hash_final(left);
    j->h[1] = tok_hash(sp + 1, m->n - j->nl - 1);
    j->h[2] = tok_hash_final(tok_hash_step(left, sp + 1, m->n - j->nl - 1));
    return 0;
}

/* Looks up the three tokens of a split merge; cat is scratch of at least
 * the merge's length. */
static int bpe_resolve_merge(const lms_tokenizer *t, bpe_job *j, int32_t rank, char *cat, char *err,
                             size_t errsz)
{
    const char *part[3] = {j->m->p, j->m->p + j->nl + 1, cat};
    size_t len[3] = {j->nl, j->m->n - j->nl - 1, j->m->n - 1};
    int32_t id[3];
    memcpy(cat, part[0], len[0]);
    memcpy(cat + len[0], part[1], len[1]);
    for (int k = 0; k < 3; k++) {
        id[k] = tok_strmap_find_hashed(t, &t->vocab, j->h[k], part[k], len[k]);
        if (id[k] < 0)
            return lms_errf(err, errsz, LMS_ERR_FORMAT,
                            "tokenizer: merge %d '%.40s': '%.*s' is not in the vocab", rank,
                            j->m->p, (int)(len[k] < 40 ? len[k] : 40), part[k]);
    }
    j->key = (uint64_t)id[0] << 32 | (uint32_t)id[1];
    j->id = id[2];
    return 0;
}

/* Loads merges first .. first+n-1 (n <= TOK_BATCH) in three passes, with
 * the hash slots of each pass prefetched by the one before. */
static int bpe_load_batch(lms_tokenizer *t, const gguf_kv *kv, uint64_t first, int n, char *cat,
                          char *err, size_t errsz)
{
    bpe_job jobs[TOK_BATCH];
    int rc;
    for (int k = 0; k < n; k++) {
        jobs[k].m = &kv->strs[first + (uint64_t)k];
        if ((rc = bpe_split_merge(&jobs[k], (int32_t)first + k, err, errsz)) < 0)
            return rc;
        for (int p = 0; p < 3; p++)
            tok_strmap_prefetch(&t->vocab, jobs[k].h[p]);
    }
    for (int k = 0; k < n; k++) {
        if ((rc = bpe_resolve_merge(t, &jobs[k], (int32_t)first + k, cat, err, errsz)) < 0)
            return rc;
        __builtin_prefetch(&t->merges.slots[pair_hash(jobs[k].key) & t->merges.mask]);
    }
    for (int k = 0; k < n; k++)
        pairmap_put(&t->merges, jobs[k].key, (int32_t)first + k, jobs[k].id);
    return 0;
}

static int bpe_load_merges(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    const char *key = "tokenizer.ggml.merges";
    const gguf_kv *kv;
    int rc = tok_str_array(f, key, &kv, err, errsz);
    if (rc == LMS_ERR_NOTFOUND)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tokenizer: key '%s' is missing (model gpt2 needs it)", key);
    if (rc < 0)
        return rc;
    if (kv->n > BPE_MAX_MERGES)
        return lms_errf(err, errsz, LMS_ERR_LIMIT, "tokenizer: '%s' has %llu entries (at most %d)",
                        key, (unsigned long long)kv->n, BPE_MAX_MERGES);
    size_t longest = 1;
    for (uint64_t i = 0; i < kv->n; i++)
        longest = kv->strs[i].n > longest ? kv->strs[i].n : longest;
    uint32_t c = 16;
    while (c < 2 * kv->n)
        c <<= 1;
    t->merges.slots = malloc(sizeof *t->merges.slots * c);
    char *cat = malloc(longest);
    if (!t->merges.slots || !cat)
        rc = LMS_ERR_NOMEM;
    if (rc == 0) {
        memset(t->merges.slots, 0xff, sizeof *t->merges.slots * c);
        t->merges.mask = c - 1;
    }
    for (uint64_t i = 0; i < kv->n && rc == 0; i += TOK_BATCH)
        rc = bpe_load_batch(t, kv, i, kv->n - i < TOK_BATCH ? (int)(kv->n - i) : TOK_BATCH, cat,
                            err, errsz);
    free(cat);
    return rc;
}

/* ==== lookup by regexes ==================================================== */

int lms_tokenizer_bpe_pre_find(const char *const *regex, int n, bool ignore_merges, char *name,
                               size_t namesz)
{
    const bpe_pre *found = NULL;
    /* two passes: regexes and ignore_merges both equal, then regexes alone
     * (ignore_merges only matters for a word that is a token its merges
     * would not build) */
    for (int pass = 0; pass < 2 && !found; pass++)
        for (size_t i = 0; i < sizeof bpe_pres / sizeof bpe_pres[0] && !found; i++) {
            const bpe_pre *p = &bpe_pres[i];
            int k = 0;
            while (k < n && k < TOK_MAX_REGEX && p->regex[k] && !strcmp(p->regex[k], regex[k]))
                k++;
            if (k == n && (k == TOK_MAX_REGEX || !p->regex[k]) &&
                (pass == 1 || p->ignore_merges == ignore_merges))
                found = p;
        }
    if (!found)
        return LMS_ERR_NOTFOUND;
    snprintf(name, namesz, "%.*s", (int)strcspn(found->names, " "), found->names);
    return 0;
}

/* ==== setup ================================================================ */

int bpe_setup(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz)
{
    const bpe_pre *pre = NULL;
    for (size_t i = 0; i < sizeof bpe_pres / sizeof bpe_pres[0] && !pre; i++)
        if (name_in_list(t->pre, bpe_pres[i].names))
            pre = &bpe_pres[i];
    if (!pre)
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                        "tokenizer: pre-tokenizer '%s' is not supported", t->pre);
    t->ignore_merges = pre->ignore_merges;
    if (!gguf_find_kv(f, "tokenizer.ggml.add_bos_token"))
        t->add_bos = pre->add_bos;
    for (unsigned b = 0; b < 256; b++) {
        char u[4];
        int n = tok_utf8_encode(bpe_byte_to_cp(b), u);
        int32_t id = tok_strmap_find(t, &t->vocab, u, (size_t)n);
        t->byte_tok[b] = id >= 0 && tok_type(t, id) == LMS_TOKEN_TYPE_NORMAL ? id : -1;
    }
    int rc = bpe_load_merges(t, f, err, errsz);
    if (rc == 0)
        rc = bpe_compile(t, pre, err, errsz);
    return rc;
}

void bpe_teardown(lms_tokenizer *t)
{
    for (int i = 0; i < t->n_regex; i++)
        pcre2_code_free(t->regex[i]);
    t->n_regex = 0;
    free(t->merges.slots);
    t->merges.slots = NULL;
}

void bpe_work_free(tok_work *w)
{
    pcre2_match_data_free(w->match_data);
    pcre2_match_context_free(w->match_ctx);
    pcre2_jit_stack_free(w->jit_stack);
    w->match_data = w->match_ctx = w->jit_stack = NULL;
}

/* ==== tokenize ============================================================= */

/* Gives the JIT a bigger stack after it ran out of the default 32 KiB. */
static int bpe_grow_jit_stack(tok_work *w)
{
    if (w->match_ctx)
        return LMS_ERR_LIMIT;
    w->jit_stack = pcre2_jit_stack_create(32 * 1024, BPE_JIT_STACK_MAX, NULL);
    w->match_ctx = pcre2_match_context_create(NULL);
    if (!w->jit_stack || !w->match_ctx)
        return LMS_ERR_NOMEM;
    pcre2_jit_stack_assign(w->match_ctx, NULL, w->jit_stack);
    return 0;
}

/* Next match of re in s[0..n) at or after pos: 1 and its bounds, 0 if
 * none, < 0 on error. */
static int bpe_match(tok_work *w, const pcre2_code *re, const char *s, size_t n, size_t pos,
                     size_t *ms, size_t *me)
{
    if (!w->match_data && !(w->match_data = pcre2_match_data_create(1, NULL)))
        return LMS_ERR_NOMEM;
    for (;;) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, w->match_data, w->match_ctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
            if ((rc = bpe_grow_jit_stack(w)) < 0)
                return rc;
            continue;
        }
        if (rc == PCRE2_ERROR_NOMATCH)
            return 0;
        if (rc < 0)
            return rc == PCRE2_ERROR_NOMEMORY ? LMS_ERR_NOMEM : LMS_ERR_LIMIT;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->match_data);
        *ms = ov[0];
        *me = ov[1];
        return 1;
    }
}

static bool bpe_pair(const lms_tokenizer *t, const char *s, const tok_sym *l, const tok_sym *r,
                     float *prio, int32_t *id)
{
    (void)s;
    if (l->id < 0 || r->id < 0)
        return false;
    const tok_merge_entry *e = pairmap_find(&t->merges, (uint64_t)l->id << 32 | (uint32_t)r->id);
    if (!e)
        return false;
    *prio = (float)e->rank;
    *id = e->id;
    return true;
}

static int bpe_word(const lms_tokenizer *t, tok_work *w, const char *s, size_t n, tok_out *o)
{
    int rc = tok_work_reserve(w, n, 2 * n);
    if (rc < 0)
        return rc;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_find(t, &t->vocab, w->buf, bpe_map_bytes(s, n, w->buf));
        if (id >= 0 && tok_type(t, id) == LMS_TOKEN_TYPE_NORMAL) {
            tok_out_push(o, id);
            return 0;
        }
    }
    for (size_t i = 0; i < n; i++) {
        w->sym[i] = (tok_sym){.prev = (int32_t)i - 1,
                              .next = i + 1 < n ? (int32_t)i + 1 : -1,
                              .start = (uint32_t)i,
                              .n = 1,
                              .id = t->byte_tok[(unsigned char)s[i]]};
    }
    if ((rc = tok_merge(t, w, s, (int32_t)n, bpe_pair)) < 0)
        return rc;
    for (int32_t i = 0; i >= 0; i = w->sym[i].next)
        if (w->sym[i].id >= 0) /* else a byte without a symbol: dropped */
            tok_out_push(o, w->sym[i].id);
    return 0;
}

static size_t char_len(const char *s, size_t n)
{
    int k = tok_utf8_check((const unsigned char *)s, n);
    return k > 0 ? (size_t)k : 1;
}

/* Splits s[0..n) with regex k and hands every piece to regex k + 1; after
 * the last regex a piece is a word for BPE. */
static int bpe_split(const lms_tokenizer *t, tok_work *w, const char *s, size_t n, int k,
                     tok_out *o)
{
    if (k == t->n_regex)
        return bpe_word(t, w, s, n, o);
    size_t pos = 0, last = 0, ms, me;
    int rc;
    while (pos < n && (rc = bpe_match(w, t->regex[k], s, n, pos, &ms, &me)) != 0) {
        if (rc < 0)
            return rc;
        if (me == ms) { /* an empty match splits nothing */
            pos = ms + (ms < n ? char_len(s + ms, n - ms) : 1);
            continue;
        }
        if (ms > last && (rc = bpe_split(t, w, s + last, ms - last, k + 1, o)) < 0)
            return rc;
        if ((rc = bpe_split(t, w, s + ms, me - ms, k + 1, o)) < 0)
            return rc;
        last = pos = me;
    }
    return last < n ? bpe_split(t, w, s + last, n - last, k + 1, o) : 0;
}

int bpe_tokenize(const lms_tokenizer *t, tok_work *w, const char *s, size_t n, tok_out *o)
{
    return n > 0 ? bpe_split(t, w, s, n, 0, o) : 0;
}

int bpe_piece(const lms_tokenizer *t, int32_t id, char *buf, size_t cap)
{
    const unsigned char *s = (const unsigned char *)tok_text(t, id);
    size_t n = tok_len(t, id), k = 0;
    for (size_t i = 0; i < n;) {
        int len = tok_utf8_check(s + i, n - i);
        int b = len > 0 ? bpe_cp_to_byte(tok_utf8_decode(s + i, len)) : -1;
        if (len <= 0)
            len = 1;
        if (b >= 0) {
            if (k + 1 > cap)
                return LMS_ERR_LIMIT;
            buf[k++] = (char)b;
        } else { /* not a mapped code point: shown as written */
            if (k + (size_t)len > cap)
                return LMS_ERR_LIMIT;
            memcpy(buf + k, s + i, (size_t)len);
            k += (size_t)len;
        }
        i += (size_t)len;
    }
    return (int)k;
}
