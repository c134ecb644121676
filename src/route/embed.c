/*
 * embed.c - blocking embeddings over a scheduler (embed.h): every text is
 * one embedding request (LMS_POOL_MEAN); their callbacks (on the
 * scheduler thread) copy the vector into the caller's row and count down
 * under a mutex; the caller sleeps on a condition variable until all
 * requests have ended.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/tokenizer.h"
#include "route/embed.h"

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;
    int rc;
    char msg[256];
} waiter;

typedef struct slot {
    waiter *w;
    float *row;
    int32_t n_embd;
} slot;

void lms_vec_normalize(float *v, int32_t n)
{
    double s = 0;
    for (int32_t i = 0; i < n; i++)
        s += (double)v[i] * v[i];
    if (s <= 0 || !isfinite(s))
        return;
    float k = (float)(1.0 / sqrt(s));
    for (int32_t i = 0; i < n; i++)
        v[i] *= k;
}

int lms_embed_tokens(const lms_model *m, const char *text, size_t len, int32_t n_ctx,
                     int32_t **out, int32_t *n_out)
{
    int64_t n = lms_tokenize(m->tok, text, len, true, false, NULL, 0);
    if (n < 0)
        return (int)n;
    int32_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v)
        return LMS_ERR_NOMEM;
    lms_tokenize(m->tok, text, len, true, false, v, n);
    if (n > n_ctx - 1)
        n = n_ctx - 1 > 0 ? n_ctx - 1 : 0;
    *out = v;
    *n_out = (int32_t)n;
    return 0;
}

/* Scheduler thread. */
static void on_event(void *user, lms_event *ev)
{
    slot *sl = user;
    waiter *w = sl->w;
    pthread_mutex_lock(&w->mu);
    if (ev->type == LMS_EV_EMBD && ev->embd && ev->n_embd == sl->n_embd) {
        memcpy(sl->row, ev->embd, (size_t)sl->n_embd * sizeof(float));
    } else if (ev->type == LMS_EV_ERROR && w->rc == 0) {
        w->rc = ev->err < 0 ? ev->err : LMS_ERR_INVAL;
        snprintf(w->msg, sizeof w->msg, "%s", ev->message);
    }
    if (ev->type == LMS_EV_END || ev->type == LMS_EV_ERROR) {
        if (--w->pending == 0)
            pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    lms_event_free(ev);
}

int lms_embed_texts(lms_sched *s, const lms_model *m, const char *const *texts, int n, float *out,
                    char *err, size_t errsz)
{
    int32_t n_embd = m->hp.n_embd, n_ctx = lms_sched_params_of(s)->n_ctx;
    memset(out, 0, (size_t)n * (size_t)n_embd * sizeof(float));
    slot *slots = calloc((size_t)(n > 0 ? n : 1), sizeof *slots);
    if (!slots)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    waiter w = {.rc = 0};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int32_t *toks = NULL, n_tok = 0;
        slots[i] = (slot){&w, out + (size_t)i * (size_t)n_embd, n_embd};
        rc = lms_embed_tokens(m, texts[i], strlen(texts[i]), n_ctx, &toks, &n_tok);
        if (rc < 0) {
            lms_errf(err, errsz, rc, "cannot tokenize text %d: %s", i, lms_strerror(rc));
            break;
        }
        if (n_tok > 0) {
            lms_request r = {.tokens = toks, .n_tokens = n_tok, .sp = lms_sampler_defaults(),
                             .embedding = true, .pooling = LMS_POOL_MEAN, .cb = on_event,
                             .user = &slots[i]};
            uint64_t id;
            char msg[256];
            pthread_mutex_lock(&w.mu);
            w.pending++;
            pthread_mutex_unlock(&w.mu);
            rc = lms_sched_submit(s, &r, &id, msg, sizeof msg);
            if (rc < 0) {
                pthread_mutex_lock(&w.mu);
                w.pending--;
                pthread_mutex_unlock(&w.mu);
                lms_errf(err, errsz, rc, "embedding text %d: %s", i, msg);
            }
        }
        free(toks);
    }
    pthread_mutex_lock(&w.mu);
    while (w.pending > 0)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    if (rc == 0 && w.rc < 0)
        rc = lms_errf(err, errsz, w.rc, "embedding failed: %s", w.msg);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    free(slots);
    for (int i = 0; rc == 0 && i < n; i++)
        lms_vec_normalize(out + (size_t)i * (size_t)n_embd, n_embd);
    return rc;
}
