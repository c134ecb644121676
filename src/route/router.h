/*
 * router.h - the semantic router: which expert should answer a text when
 * the request names no model. A pure function of the configuration and the
 * text (no I/O, no threads), so it is unit-tested directly
 * (tests/unit/test_router.c).
 *
 * Lexical similarity: every expert's examples and its domain are documents
 * of TF-IDF vectors over two kinds of terms, lower-cased word tokens
 * (weight 1) and character trigrams of each word with boundary marks
 * (weight 0.5, so "python" still meets "pythonic" and small typos). The
 * score of an expert is the best cosine similarity between the text and one
 * of its documents. The best expert wins when its score reaches the
 * threshold; ties (within 1e-9) go to the higher priority, then to the
 * earlier expert. Below the threshold the router gives the default: the
 * configured router.default, else the highest-priority expert.
 *
 * Embedding similarity (router.embedding_model) scores the same documents
 * by the cosine of mean-pooled embeddings instead; the server computes
 * them (route/embed.h) and calls lms_router_pick_vec.
 */
#ifndef LMS_ROUTE_ROUTER_H
#define LMS_ROUTE_ROUTER_H

#include <stddef.h>

#include "route/config.h"

typedef struct lms_router lms_router;

typedef struct lms_route_pick {
    int expert;        /* index in the configuration */
    double score;      /* best similarity in [0, 1] (of the chosen expert, or the best one) */
    int best;          /* the best-scoring expert, even when under the threshold (-1: none) */
    bool fallback;     /* the score was under the threshold: the default was taken */
} lms_route_pick;

/* Builds the document vectors. The configuration is borrowed (it must
 * outlive the router). Returns < 0 when out of memory. */
int lms_router_create(const lms_route_cfg *cfg, lms_router **out);
void lms_router_destroy(lms_router *r);
/* Scores text (n bytes, any content) against every expert. */
lms_route_pick lms_router_pick(const lms_router *r, const char *text, size_t n);
/* The expert taken when nothing matches. */
int lms_router_default(const lms_router *r);

/* Embedding mode (router.embedding_model): the documents in the order the
 * router scores them (each expert's domain, then its examples), to be
 * embedded once; then lms_router_pick_vec scores a text's embedding q
 * against their embeddings docs ([n_docs][n_embd], unit length) by cosine
 * similarity, with the same best-document, threshold, priority and
 * default rules as the lexical mode. Pure. */
int lms_router_n_docs(const lms_router *r);
const char *lms_router_doc_text(const lms_router *r, int i);
lms_route_pick lms_router_pick_vec(const lms_router *r, const float *docs, int n_embd,
                                   const float *q);

#endif
