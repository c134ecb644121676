/*
 * spec.h - speculative decoding: proposers of the next few tokens of a
 * sequence, which the target model then checks in one forward batch.
 *
 * Two proposers:
 *   - prompt lookup (n-gram): the sequence's last n tokens (n from
 *     ngram_max down to ngram_min) found earlier in the same sequence
 *     (prompt + output, the most recent match), and the tokens that
 *     followed them there;
 *   - a draft model with the same vocabulary as the target, run on its own
 *     context (CPU), greedily, k tokens ahead; it stops early when its top
 *     probability falls below p_min.
 *
 * Both proposals are deterministic given the sequence (the draft takes its
 * argmax), so the proposal distribution q is a point mass. Verification
 * (sched.c, generate.c) then draws each position from the target with the
 * sequence's own sampler, one draw per emitted token, and goes on while
 * the draw equals the proposal: that is speculative sampling for a point
 * mass q (a proposal x is accepted with probability p(x), a rejection
 * draws from p without x), and it gives the very tokens plain decoding
 * would, with the same seed, greedy or not (up to the float differences of
 * a batched forward pass).
 *
 * Owner: one thread (the scheduler's, or the CLI's).
 */
#ifndef LMS_SPEC_H
#define LMS_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/forward.h"

enum lms_spec_mode {
    LMS_SPEC_NONE = 0,
    LMS_SPEC_DRAFT = 1,  /* a draft model */
    LMS_SPEC_NGRAM = 2,  /* prompt lookup */
};

#define LMS_SPEC_MAX 32          /* proposals per step at most */
#define LMS_SPEC_DRAFT_MAX_DEFAULT 8
#define LMS_SPEC_NGRAM_MAX_DEFAULT 4
#define LMS_SPEC_P_MIN_DEFAULT 0.75f

typedef struct lms_spec_params {
    int mode;              /* enum lms_spec_mode */
    int32_t n_max;         /* proposals per step at most (0: the mode's default) */
    int32_t n_min;         /* fewer proposals than this: none that step */
    float p_min;           /* draft: stop proposing below this top probability */
    int32_t ngram_max;     /* prompt lookup: longest n-gram matched (0: 3) */
    int32_t ngram_min;     /* shortest (0: 1) */
} lms_spec_params;

/* Fills the defaults (n_max by mode, ngram lengths) and checks ranges. */
int lms_spec_params_fix(lms_spec_params *p, char *err, size_t errsz);

/* Prompt lookup: up to k tokens that followed the most recent earlier
 * occurrence of the last n tokens of t[0 .. n_tok), for the largest n in
 * [ngram_min, ngram_max] that occurs; returns how many went to out. */
int32_t lms_spec_ngram(const int32_t *t, int32_t n_tok, int32_t ngram_max, int32_t ngram_min,
                       int32_t k, int32_t *out);

/* Whether draft and target share a vocabulary: the same token count and
 * the same text for every token; < 0 with a message naming the first
 * difference otherwise. */
int lms_spec_vocab_check(const lms_model *target, const lms_model *draft, char *err, size_t errsz);

/* ---- draft model ---------------------------------------------------------- */

typedef struct lms_drafter lms_drafter;

/* One sequence's state in the draft context: the tokens its cache holds. */
typedef struct lms_draft_seq {
    lms_kv_seq kv;
    int32_t *toks;
    int32_t n_toks, cap;
    bool ready;            /* blocks reserved */
} lms_draft_seq;

/* Where the draft model's layers run: gpu_layers as lms_ctx_params (0:
 * the CPU; auto plans from the VRAM the target's context left free), the
 * margin and budget as the target's. With a budget, the draft gets what the
 * target's context (target_ctx) did not take of it. */
typedef struct lms_draft_place {
    int32_t gpu_layers;
    int32_t vram_margin_mb, vram_budget_mb;
    const lms_ctx *target_ctx; /* or NULL */
} lms_draft_place;

/* Loads the draft model at path and checks it against target; its context
 * runs n_seq sequences of up to n_ctx positions, n_batch rows a pass,
 * n_threads threads, over a pool of kv_blocks blocks (0: n_seq whole
 * contexts), placed by `place` (NULL: the CPU). */
int lms_drafter_create(const lms_model *target, const char *path, int32_t n_ctx, int32_t n_batch,
                       int32_t n_seq, int32_t kv_blocks, int32_t n_threads,
                       const lms_draft_place *place, lms_drafter **out, char *err, size_t errsz);
/* The draft context's GPU placement, or NULL when it runs on the CPU. */
const lms_gpu_plan *lms_drafter_gpu_plan(const lms_drafter *d);
void lms_drafter_destroy(lms_drafter *d); /* NULL: no-op */
const lms_model *lms_drafter_model(const lms_drafter *d);
/* Blocks of the draft pool held by sequences (tests). */
int32_t lms_drafter_blocks_used(lms_drafter *d);

/* Reserves n_pos positions for ds (once); LMS_ERR_LIMIT when the draft
 * pool is short (the sequence then goes without proposals). */
int lms_draft_seq_reserve(lms_drafter *d, lms_draft_seq *ds, int32_t n_pos);
void lms_draft_seq_release(lms_drafter *d, lms_draft_seq *ds);

typedef struct lms_draft_job {
    lms_draft_seq *ds;     /* reserved for at least n_tokens + k - 1 positions */
    const int32_t *tokens; /* the sequence so far */
    int32_t n_tokens;
    int32_t k;             /* proposals wanted (>= 1) */
    float p_min;
    int32_t *out;          /* [k] */
    int32_t n_out;         /* proposals made */
} lms_draft_job;

/* Proposes for n sequences at once: brings each draft cache up to its
 * sequence (keeping the common prefix, so rejected proposals of the last
 * step are dropped), then up to k greedy tokens each, one batched pass per
 * token. */
int lms_drafter_propose(lms_drafter *d, lms_draft_job *jobs, int n);

#endif
