/*
 * sampler.h - turns logits into the next token: penalties, top-k, top-p,
 * min-p, temperature, seeded random choice (or greedy at temperature 0).
 *
 * The chain runs in llama.cpp's default order (after any logit bias): repetition / frequency /
 * presence penalties over the last `penalty_last_n` tokens, then top-k,
 * typical-p, top-p, min-p, temperature, and a draw. With Mirostat the
 * chain is penalties, temperature, Mirostat (v1: a top-k from the
 * estimated Zipf exponent; v2: tokens with surprise above mu cut), whose
 * mu (starting at 2 tau) follows the observed surprise of each draw. The probability of the chosen
 * token under the model's (penalised, untempered) distribution is returned
 * for the protocols that report it.
 *
 * Owner: one sequence (not thread-safe; each sequence has its own).
 */
#ifndef LMS_SAMPLER_H
#define LMS_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* OpenAI's logit_bias: added to a token's logit before everything else;
 * -100 or less bans the token. */
#define LMS_MAX_LOGIT_BIAS 300
typedef struct lms_logit_bias {
    int32_t id;
    float bias;
} lms_logit_bias;

typedef struct lms_sampler_params {
    float temperature;       /* <= 0: greedy */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float typical_p;         /* locally typical sampling; >= 1: off */
    int32_t mirostat;        /* 0 off; 1 or 2: Mirostat v1 / v2 replaces top-k, top-p,
                              * min-p and typical-p (as llama.cpp's chain does) */
    float mirostat_tau;      /* target surprise (bits) */
    float mirostat_eta;      /* learning rate */
    float repeat_penalty;    /* 1: off */
    float frequency_penalty; /* 0: off */
    float presence_penalty;  /* 0: off */
    int32_t penalty_last_n;  /* window of recent tokens for penalties */
    uint64_t seed;
    int32_t n_bias;          /* entries of bias in use */
    lms_logit_bias bias[LMS_MAX_LOGIT_BIAS];
} lms_sampler_params;

typedef struct lms_token_prob {
    int32_t id;
    float logprob;
} lms_token_prob;

typedef struct lms_sampler lms_sampler;

/* Defaults a user of llama.cpp would expect: temp 0.8, top-k 40,
 * top-p 0.95, min-p 0.05, no typical-p, no Mirostat (tau 5, eta 0.1 when
 * turned on), no penalties, last_n 64. */
lms_sampler_params lms_sampler_defaults(void);
/* Checks ranges; returns < 0 with a message naming the parameter. */
int lms_sampler_params_check(const lms_sampler_params *p, char *err, size_t errsz);

lms_sampler *lms_sampler_create(const lms_sampler_params *p, int32_t n_vocab);
void lms_sampler_destroy(lms_sampler *s);

/* Picks a token from logits[n_vocab] (logits are not modified). *prob gets
 * the chosen token's probability (may be NULL). */
int32_t lms_sampler_sample(lms_sampler *s, const float *logits, float *prob);
/* Records a token of the sequence (prompt or generated) for penalties. */
void lms_sampler_accept(lms_sampler *s, int32_t token);
/* The n most likely tokens of the last sampled distribution (model
 * log-probabilities, penalised, untempered); returns how many were written. */
int lms_sampler_top(const lms_sampler *s, lms_token_prob *out, int n);

#endif
