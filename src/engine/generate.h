/*
 * generate.h - one conversation's generation loop on an engine context:
 * prompt evaluation (reusing the cached prefix of the previous turn),
 * sampling, end-of-generation and stop strings, streamed UTF-8-safe text.
 *
 * Used by `lmserv run` and `lmserv chat`; the server's scheduler runs many
 * sequences at once with the same pieces (sampler, detokenizer, stop
 * matcher) instead.
 */
#ifndef LMS_GENERATE_H
#define LMS_GENERATE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/forward.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "engine/stopstr.h"

typedef struct lms_session {
    lms_ctx *ctx;       /* borrowed */
    lms_kv_seq seq;
    int32_t *toks;      /* tokens whose K/V are in seq */
    int32_t n_toks, cap;
    lms_lora_set lora;  /* adapters of the conversation (lms_session_set_lora) */
} lms_session;

typedef struct lms_gen_params {
    lms_sampler_params sp;
    int32_t n_predict;               /* max generated tokens (< 0: until context) */
    const char *const *stop;         /* stop strings */
    int n_stop;
    bool ignore_eos;                 /* keep going past end-of-generation tokens */
    volatile sig_atomic_t *cancel;   /* set non-zero to stop (may be NULL) */
    /* Speculative decoding (spec.h): spec.mode LMS_SPEC_NGRAM, or
     * LMS_SPEC_DRAFT with a drafter and a draft_seq of this session (both
     * borrowed); spec.n_max proposals a step at most. */
    lms_spec_params spec;
    lms_drafter *drafter;
    lms_draft_seq *draft_seq;
    /* The output held to one JSON object (json; schema: to that schema) or
     * to a GBNF grammar (constrain.h); both borrowed. A generation that can
     * go no further in it ends with finish "stop". */
    bool json;
    const struct lms_jschema *schema;
    const struct lms_gbnf *grammar;
} lms_gen_params;

/* Called with each piece of text ready to show; return false to stop. */
typedef bool (*lms_gen_piece_fn)(void *ud, const char *text, size_t n, int32_t token, float prob);

typedef struct lms_gen_stats {
    int32_t n_prompt;     /* prompt tokens */
    int32_t n_cached;     /* of which reused from the previous turn */
    int32_t n_gen;        /* generated tokens */
    double prompt_ms;     /* prompt evaluation */
    double ttft_ms;       /* start to first generated token */
    double total_ms;
    double gen_tps;       /* generated tokens / second after the first */
    const char *finish;   /* "stop", "length", "canceled" */
    int32_t n_drafted;    /* speculative decoding: tokens proposed */
    int32_t n_accepted;   /* of which the target took */
} lms_gen_stats;

void lms_session_init(lms_session *s, lms_ctx *ctx);
void lms_session_deinit(lms_session *s);
void lms_session_reset(lms_session *s);
/* Applies these adapters from the next generate on (a copy of the set is
 * kept; the adapters are borrowed and must outlive their use). A set with
 * another id than the current one drops the cached conversation. */
void lms_session_set_lora(lms_session *s, const lms_lora_set *set);

int lms_session_generate(lms_session *s, const int32_t *prompt, int32_t n_prompt,
                         const lms_gen_params *gp, lms_gen_piece_fn cb, void *ud,
                         lms_gen_stats *st, char *err, size_t errsz);

#endif
