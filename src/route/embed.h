/*
 * embed.h - mean-pooled text embeddings from a model's scheduler, waited
 * for on the calling thread. The router's embedding mode uses it on the
 * registry's loader thread to embed every expert's examples once, when the
 * embedding model has loaded (requests' texts are embedded asynchronously
 * by the server, through its tasks, so that the event loop never waits).
 */
#ifndef LMS_ROUTE_EMBED_H
#define LMS_ROUTE_EMBED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/sched.h"
#include "model/model.h"

/* Embeds texts[0..n) (each cut to the scheduler's context) into out,
 * n rows of m->hp.n_embd floats of unit length (a text without tokens
 * gets a zero row). Blocks until every request ended; never call it from
 * the event loop. Returns < 0 with a message when a request fails. */
int lms_embed_texts(lms_sched *s, const lms_model *m, const char *const *texts, int n, float *out,
                    char *err, size_t errsz);
/* The tokens an embedding of text uses: BOS where the vocabulary wants
 * it, at most n_ctx - 1. Returns < 0 when out of memory or untokenizable. */
int lms_embed_tokens(const lms_model *m, const char *text, size_t len, int32_t n_ctx,
                     int32_t **out, int32_t *n_out);
/* Scales v to unit length (a zero vector stays zero). */
void lms_vec_normalize(float *v, int32_t n);

#endif
