/*
 * constrain.h - an output held to a shape while it is sampled: one JSON
 * object (JSON mode, optionally a schema: jsonschema.h) or the texts of a
 * GBNF grammar (gbnf.h). Each draw is checked against the text so far; a
 * draw that would leave the shape is drawn again among the tokens that
 * keep it (the sampler's chain over the row with every other token
 * masked, as llama.cpp's grammar sampling does). End-of-generation tokens
 * are allowed only where the text may end; tokens without text (control
 * tokens) never.
 *
 * Used by the scheduler (sched.c) for requests and by lms_session_generate
 * (generate.c) for the CLI. Owners: lms_toktexts, one per model and
 * thread that reads it; lms_constraint, one per generation.
 */
#ifndef LMS_CONSTRAIN_H
#define LMS_CONSTRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/gbnf.h"
#include "engine/jsonschema.h"
#include "engine/sampler.h"
#include "model/tokenizer.h"

/* Every token's text (its bytes as generated) and whether it ends generation. */
typedef struct lms_toktexts {
    char *bytes;      /* the pieces back to back */
    uint32_t *off;    /* [n_vocab + 1] token i: [off[i], off[i + 1]) */
    bool *eog;        /* [n_vocab] */
    int32_t n_vocab;
} lms_toktexts;

/* NULL when out of memory. */
lms_toktexts *lms_toktexts_create(const lms_tokenizer *tok);
void lms_toktexts_destroy(lms_toktexts *t); /* NULL is a no-op */

typedef struct lms_constraint lms_constraint;

/* A checker at the empty text: JSON mode held to schema (NULL: any JSON
 * object), or, where grammar is set, that grammar (schema then unused).
 * tt, schema and grammar must outlive it. NULL when out of memory or when
 * the grammar's start is too ambiguous (gbnf.h). */
lms_constraint *lms_constraint_create(const lms_toktexts *tt, const lms_jschema *schema,
                                      const lms_gbnf *grammar);
void lms_constraint_destroy(lms_constraint *c); /* NULL is a no-op */

/* Whether token id may come next. */
bool lms_constraint_allows(const lms_constraint *c, int32_t id);
/* The next token from a logits row through smp (prob: its probability
 * under the chain), drawn again among the allowed tokens when the first
 * draw is not one; -1 when no token is allowed. */
int32_t lms_constraint_sample(lms_constraint *c, lms_sampler *smp, const float *logits,
                              float *prob);
/* Token id (allowed) was taken: the text moves on. */
void lms_constraint_accept(lms_constraint *c, int32_t id);

#endif
