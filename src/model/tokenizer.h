/*
 * tokenizer.h - text <-> token ids for the vocabularies stored in GGUF
 * metadata (tokenizer.ggml.*), and a streaming detokenizer.
 *
 * Algorithms, chosen by tokenizer.ggml.model:
 *
 *   "llama"  SentencePiece BPE: merges chosen by token score, spaces
 *            written as U+2581, byte fallback to <0xNN> tokens
 *            (tokenizer_spm.c).
 *   "gpt2"   byte-level BPE: a regex pre-tokenizer picked by
 *            tokenizer.ggml.pre, bytes mapped to printable code points,
 *            merges chosen by rank (tokenizer_bpe.c).
 *   "bert"   WordPiece: lower-cased, accents stripped, split at spaces and
 *            punctuation, greedy longest match (tokenizer_wpm.c; needs
 *            utf8proc, else such vocabs load as LMS_ERR_UNSUPPORTED).
 *
 * Control, unknown and user-defined tokens ("special" tokens) are split out
 * of the text before the algorithm runs, leftmost-longest: user-defined ones
 * always, control and unknown ones only with parse_special. As llama.cpp
 * does, a token spelled like an end-of-turn or fill-in-the-middle marker
 * (</s>, <|endoftext|>, <|fim_prefix|>, ...) counts as control whatever
 * its type in the file (so lms_token_type says control). As in llama.cpp,
 * SentencePiece puts its space prefix on every piece of text between
 * special tokens, and Phi-3's chat tokens (<|user|>, <|end|>, ...) swallow
 * the whitespace after them (Hugging Face's rstrip, which GGUF does not
 * store: recognised by general.name).
 *
 * Input that is not valid UTF-8 never fails: byte-level BPE encodes every
 * byte it has a symbol for and drops the others (most vocabs lack the
 * bytes C0, C1, F5..FF that UTF-8 never uses); SentencePiece takes each
 * invalid byte as a one-byte character, which byte fallback encodes exactly
 * (or as the unknown token when the vocab has no byte tokens); WordPiece
 * drops invalid bytes. So concatenating lms_token_to_piece over the tokens
 * of a text gives the text back byte for byte (minus the SPM space prefix,
 * and minus bytes a BPE vocab cannot spell) for every SPM and BPE vocab.
 *
 * A loaded tokenizer is immutable: every function below may be called from
 * any number of threads at once. It owns copies of everything it needs; the
 * gguf_file may be closed after lms_tokenizer_load.
 */
#ifndef LMS_TOKENIZER_H
#define LMS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct lms_tokenizer lms_tokenizer;

/* Values of tokenizer.ggml.token_type (0 in a file is read as NORMAL). */
enum lms_token_type {
    LMS_TOKEN_TYPE_NORMAL = 1,
    LMS_TOKEN_TYPE_UNKNOWN = 2,
    LMS_TOKEN_TYPE_CONTROL = 3,
    LMS_TOKEN_TYPE_USER_DEFINED = 4,
    LMS_TOKEN_TYPE_UNUSED = 5,
    LMS_TOKEN_TYPE_BYTE = 6,
};

/* ---- loading ------------------------------------------------------------ */

/* Builds a tokenizer from f's tokenizer.ggml.* keys. On failure returns < 0
 * (LMS_ERR_FORMAT for bad metadata, LMS_ERR_UNSUPPORTED for an unknown
 * model or pre-tokenizer, LMS_ERR_NOTFOUND when the file has no vocab),
 * writes a message naming the key and the bad value, leaves *out untouched.
 * A special id (bos, eos, ...) of 0xFFFFFFFF or -1 means "none"; another
 * value outside the vocab is an error for bos/eos/unk/eot and ignored for
 * the rest (pad, sep, eom, fim ids). */
int lms_tokenizer_load(const gguf_file *f, lms_tokenizer **out, char *err, size_t errsz);
void lms_tokenizer_destroy(lms_tokenizer *t); /* NULL is a no-op */

/* ---- text -> tokens ----------------------------------------------------- */

/* Tokenizes text[0..len) (any bytes; NULs included).
 * add_special: add BOS (and EOS) where the vocab asks for them; WordPiece
 * always frames the text as [CLS] ... [SEP], as llama.cpp does.
 * parse_special: control and unknown tokens spelled in the text become
 * those tokens (user-defined tokens always do).
 * Writes at most cap ids to out and returns how many the text needs, which
 * may be more than cap (call again with a bigger buffer); < 0 on error
 * (LMS_ERR_INVAL, LMS_ERR_NOMEM, LMS_ERR_LIMIT for text over 256 MiB). */
int64_t lms_tokenize(const lms_tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t *out, int64_t cap);

/* ---- vocabulary --------------------------------------------------------- */

int32_t lms_tokenizer_n_vocab(const lms_tokenizer *t);
const char *lms_tokenizer_model(const lms_tokenizer *t); /* "llama", "gpt2", "bert" */
const char *lms_tokenizer_pre(const lms_tokenizer *t);   /* tokenizer.ggml.pre or "default" */
/* Special ids, -1 when the vocab has none. */
int32_t lms_tokenizer_bos(const lms_tokenizer *t);
int32_t lms_tokenizer_eos(const lms_tokenizer *t);
int32_t lms_tokenizer_eot(const lms_tokenizer *t);
int32_t lms_tokenizer_unk(const lms_tokenizer *t);
int32_t lms_tokenizer_pad(const lms_tokenizer *t);
bool lms_tokenizer_add_bos(const lms_tokenizer *t);
bool lms_tokenizer_add_eos(const lms_tokenizer *t);
/* True when tokenize puts a space before the text (SentencePiece); a
 * detokenizer then strips one leading space (see lms_detok_init). */
bool lms_tokenizer_add_space_prefix(const lms_tokenizer *t);

/* End of generation: EOS, EOT, EOM and every control or user-defined token
 * spelled <|endoftext|>, <|im_end|>, <|eot_id|>, <|end|>, </s>, ... (a
 * normal token with such a text, like Qwen's ordinary "</s>", is not; nor
 * is <|end|> in a vocab with <|return|> and <|call|>, gpt-oss's). */
bool lms_token_is_eog(const lms_tokenizer *t, int32_t id);
/* enum lms_token_type, or LMS_ERR_RANGE for an id outside the vocab. */
int lms_token_type(const lms_tokenizer *t, int32_t id);
/* Raw vocab string (NUL-terminated; "" for an id outside the vocab). */
const char *lms_token_text(const lms_tokenizer *t, int32_t id);
/* Exact vocab lookup of a NUL-terminated / counted string; -1 if absent. */
int32_t lms_token_find(const lms_tokenizer *t, const char *text);
int32_t lms_token_find_n(const lms_tokenizer *t, const char *text, size_t len);

/* The tokenizer.ggml.pre name of the byte-level BPE pre-tokenizer that
 * splits with exactly the n regexes given (Hugging Face Split patterns, in
 * order), preferring one with the same ignore_merges; LMS_ERR_NOTFOUND
 * when no supported one does. For reading tokenizer.json (model/hf.c). */
int lms_tokenizer_bpe_pre_find(const char *const *regex, int n, bool ignore_merges, char *name,
                               size_t namesz);

/* ---- tokens -> text ----------------------------------------------------- */

/* Writes the bytes token id stands for: SPM U+2581 -> space, <0xNN> -> that
 * byte; BPE code points -> bytes; user-defined tokens as written; control
 * and unknown tokens only when `special` is true (else nothing); unused
 * tokens never. Not NUL-terminated. Returns the length (0 allowed);
 * LMS_ERR_RANGE for a bad id; LMS_ERR_LIMIT when cap is too small (nothing
 * useful written; a cap of lms_tokenizer_max_piece() is always enough). */
int lms_token_to_piece(const lms_tokenizer *t, int32_t id, bool special, char *buf, size_t cap);
size_t lms_tokenizer_max_piece(const lms_tokenizer *t);

/* ---- streaming detokenizer ---------------------------------------------
 * Turns token ids into text that is always valid UTF-8: a character split
 * across tokens (byte tokens of an emoji, ...) is held back until complete;
 * bytes that can no longer form a character are written as U+FFFD, one per
 * maximal invalid subpart (the Unicode / WHATWG rule). Caller's storage,
 * one per stream, single-threaded. */
typedef struct lms_detok {
    const lms_tokenizer *t;
    bool special;     /* render control tokens; false after init, set it by hand */
    bool strip_space; /* drop one leading space of the first non-empty piece */
    uint8_t n_pend;   /* held-back bytes of an incomplete character */
    unsigned char pend[4];
} lms_detok;

/* strip_leading_space_once: pass lms_tokenizer_add_space_prefix(t) when
 * the stream starts at the beginning of a tokenized text. */
void lms_detok_init(lms_detok *d, const lms_tokenizer *t, bool strip_leading_space_once);
/* Adds one token; writes the bytes now ready to out and returns their
 * count (often 0). LMS_ERR_RANGE for a bad id; LMS_ERR_LIMIT when cap is
 * too small, with the detokenizer unchanged (cap >= lms_detok_max_out(t)
 * always suffices). */
int lms_detok_push(lms_detok *d, int32_t id, char *out, size_t cap);
/* Ends the stream: held-back bytes come out as one U+FFFD. Needs cap >= 3. */
int lms_detok_flush(lms_detok *d, char *out, size_t cap);
size_t lms_detok_max_out(const lms_tokenizer *t);

#endif
