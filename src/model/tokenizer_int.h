/*
 * tokenizer_int.h - what tokenizer.c shares with the algorithm files
 * (tokenizer_spm.c, tokenizer_bpe.c, tokenizer_wpm.c). Not for other
 * modules: they use tokenizer.h.
 *
 * Shape of a tokenize call:
 *
 *   lms_tokenize -> split out special tokens (tokenizer.c)
 *                -> each raw fragment -> spm_ / bpe_ / wpm_tokenize
 *                   -> tok_merge (the shared merge loop) -> tok_out_push
 */
#ifndef LMS_TOKENIZER_INT_H
#define LMS_TOKENIZER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/tokenizer.h"

#define TOK_MAX_REGEX 8
#define TOK_ATTR_TYPE 0x0f   /* low bits of attr: enum lms_token_type */
#define TOK_ATTR_EOG 0x10    /* end-of-generation token */
#define TOK_ATTR_RSTRIP 0x20 /* special token that eats the whitespace after it */

enum tok_kind { TOK_KIND_SPM, TOK_KIND_BPE, TOK_KIND_WPM };

/* Open-addressing map from a string to a token id. The strings live in
 * the tokenizer's text pool; a slot holds the id (-1 = empty) and the
 * string's hash, so a probe rarely touches the pool for a wrong string. */
typedef struct tok_strslot {
    uint32_t hash;
    int32_t id;
} tok_strslot;

typedef struct tok_strmap {
    tok_strslot *slots; /* [mask + 1] */
    uint32_t mask;
} tok_strmap;

/* BPE merge table: (left id, right id) -> rank and merged id. */
typedef struct tok_merge_entry {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank; /* index in tokenizer.ggml.merges: lower merges first */
    int32_t id;   /* token of left+right */
} tok_merge_entry;

typedef struct tok_pairmap {
    tok_merge_entry *slots; /* [mask + 1] */
    uint32_t mask;
} tok_pairmap;

/* Special tokens that may be split out of the text, for one mode (user-
 * defined only, or all special types). */
typedef struct tok_special_set {
    uint8_t first[32]; /* bitmap of the first bytes of the tokens */
    uint32_t *lens;    /* distinct token lengths, longest first */
    int n_lens;
} tok_special_set;

struct lms_tokenizer {
    enum tok_kind kind;
    char model[16];
    char pre[48];
    int32_t n_vocab;
    char *pool;                 /* every token text, each followed by a NUL */
    uint32_t *off;              /* [n_vocab + 1] token i is pool[off[i] .. off[i+1]-1) */
    float *scores;              /* [n_vocab] SPM merge scores (0 when absent) */
    uint8_t *attr;              /* [n_vocab] TOK_ATTR_* */
    tok_strmap vocab;           /* all tokens, the last of equal texts wins */
    tok_strmap special_map;     /* control, unknown, user-defined tokens */
    tok_special_set special[2]; /* [0] user-defined, [1] + control/unknown */
    size_t max_len;             /* longest token text */

    int32_t bos, eos, eot, eom, unk, pad;
    int32_t sep; /* WPM: ends every text (add_special) */
    bool add_bos, add_eos, add_space_prefix;

    int32_t byte_tok[256]; /* SPM: <0xNN>; BPE: the byte's code point */
    /* BPE */
    tok_pairmap merges;
    bool ignore_merges;         /* a whole word in the vocab skips merging */
    void *regex[TOK_MAX_REGEX]; /* pcre2_code *, applied in order */
    int n_regex;
    /* WPM: tokenizer.ggml.normalizer.* */
    bool wpm_lowercase, wpm_strip_accents;
};

/* ---- helpers from tokenizer.c -------------------------------------------- */

static inline const char *tok_text(const lms_tokenizer *t, int32_t id)
{
    return t->pool + t->off[id];
}

static inline size_t tok_len(const lms_tokenizer *t, int32_t id)
{
    return t->off[id + 1] - t->off[id] - 1;
}

static inline int tok_type(const lms_tokenizer *t, int32_t id)
{
    return t->attr[id] & TOK_ATTR_TYPE;
}

/* String hash: tok_hash(s, n) == tok_hash_final(tok_hash_step(TOK_HASH_SEED,
 * s, n)), and steps chain, so the hash of a concatenation needs no copy. */
#define TOK_HASH_SEED 0xcbf29ce484222325ull
#define TOK_BATCH 16 /* lookups prefetched together when loading */
uint64_t tok_hash_step(uint64_t h, const char *s, size_t n);
uint32_t tok_hash_final(uint64_t h);
uint32_t tok_hash(const char *s, size_t n);

int32_t tok_strmap_find(const lms_tokenizer *t, const tok_strmap *m, const char *s, size_t n);
int32_t tok_strmap_find_hashed(const lms_tokenizer *t, const tok_strmap *m, uint32_t h,
                               const char *s, size_t n);

static inline void tok_strmap_prefetch(const tok_strmap *m, uint32_t h)
{
    __builtin_prefetch(&m->slots[h & m->mask]);
}

/* The string array under key: LMS_ERR_NOTFOUND if absent, LMS_ERR_FORMAT
 * if of another type (both with a message). */
int tok_str_array(const gguf_file *f, const char *key, const gguf_kv **out, char *err,
                  size_t errsz);

/* UTF-8 of one code point (up to 4 bytes); returns its length. */
int tok_utf8_encode(uint32_t cp, char *out);
/* Looks at s[0..n), n >= 1:
 *   > 0  a complete, valid character of that many bytes;
 *   0    a valid but incomplete start of a character (more bytes needed);
 *   < 0  -k: the first k bytes are a maximal invalid subpart (one U+FFFD).
 * Valid means well-formed per Unicode table 3-7 (no overlongs, surrogates
 * or code points past U+10FFFF). */
int tok_utf8_check(const unsigned char *s, size_t n);
/* Decodes the valid character at s (length from tok_utf8_check > 0). */
uint32_t tok_utf8_decode(const unsigned char *s, int len);

/* Output of a tokenize call: ids past cap are counted, not stored. */
typedef struct tok_out {
    int32_t *ids;
    int64_t cap;
    int64_t n;
} tok_out;

static inline void tok_out_push(tok_out *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n] = id;
    o->n++;
}

/* ---- the merge loop shared by SPM and BPE --------------------------------
 * Symbols are byte ranges of one fragment in a doubly linked list; merging
 * a pair keeps the left symbol and unlinks the right one, so the list head
 * is always symbol 0. Candidate pairs wait in a binary heap ordered by
 * (prio, left index): the lowest priority, then the leftmost, merges first.
 * A popped pair is used only if both symbols are still adjacent and the
 * same size as when it was queued. */
typedef struct tok_sym {
    int32_t prev, next; /* -1 at the ends */
    uint32_t start, n;  /* bytes of the fragment; n = 0 once merged away */
    int32_t id;         /* token of these bytes, -1 if none */
} tok_sym;

typedef struct tok_pair {
    float prio;
    int32_t left, right;
    uint32_t n; /* left.n + right.n when queued */
    int32_t id; /* token the merge produces */
} tok_pair;

/* Per-call scratch, grown as needed and freed by tok_work_free. */
typedef struct tok_work {
    tok_sym *sym;
    size_t cap_sym;
    tok_pair *heap;
    size_t n_heap, cap_heap;
    char *buf; /* fragment text after escaping / mapping */
    size_t cap_buf;
    void *match_data; /* pcre2_match_data * */
    void *match_ctx;  /* pcre2_match_context * with a big JIT stack, on demand */
    void *jit_stack;
} tok_work;

/* Decides whether symbols l and r (adjacent, in that order) may merge:
 * true with the priority (lower first) and the resulting token. */
typedef bool (*tok_pair_fn)(const lms_tokenizer *t, const char *s, const tok_sym *l,
                            const tok_sym *r, float *prio, int32_t *id);

int tok_work_reserve(tok_work *w, size_t n_sym, size_t n_buf);
void tok_work_free(tok_work *w);
/* Runs the merges over w->sym[0..n) (already linked) of fragment s. */
int tok_merge(const lms_tokenizer *t, tok_work *w, const char *s, int32_t n, tok_pair_fn fn);

/* ---- per-algorithm entry points ------------------------------------------ */

/* Each turns one raw fragment (no special tokens in it) into ids. */
int spm_tokenize(const lms_tokenizer *t, tok_work *w, const char *s, size_t n, bool prefix_space,
                 tok_out *o);
int bpe_tokenize(const lms_tokenizer *t, tok_work *w, const char *s, size_t n, tok_out *o);
int wpm_tokenize(const lms_tokenizer *t, tok_work *w, const char *s, size_t n, tok_out *o);

/* Load-time setup after the common vocab is in place. */
int spm_setup(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz);
int bpe_setup(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz);
int wpm_setup(lms_tokenizer *t, const gguf_file *f, char *err, size_t errsz);
void bpe_teardown(lms_tokenizer *t);
void bpe_work_free(tok_work *w); /* the PCRE2 match state in w */

/* Bytes of a normal or byte token's text as shown to a user (WordPiece
 * spells spaces like SentencePiece and uses spm_piece). */
int spm_piece(const lms_tokenizer *t, int32_t id, char *buf, size_t cap);
int bpe_piece(const lms_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif
