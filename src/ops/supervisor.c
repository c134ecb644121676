/*
 * supervisor.c - moving average of per-request decode speed; see
 * supervisor.h. The window is a ring of the last `window` rates.
 */
#include "ops/supervisor.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "ops/log.h"

struct lms_supervisor {
    pthread_mutex_t mu; /* guards the ring */
    lms_supervisor_params p;
    lms_supervisor_slow_fn on_slow;
    void *ud;
    int n;       /* rates in the ring (<= p.window) */
    int head;    /* next slot to write */
    double sum;  /* sum of the rates in the ring */
    double *tps; /* [p.window] */
};

lms_supervisor *lms_supervisor_create(const lms_supervisor_params *p,
                                      lms_supervisor_slow_fn on_slow, void *ud)
{
    if (!p || !(p->floor_tps >= 0) || p->window < 1 || p->window > 1024 || p->min_tokens < 1)
        return NULL;
    lms_supervisor *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->tps = calloc((size_t)p->window, sizeof *s->tps);
    if (!s->tps) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    s->p = *p;
    s->on_slow = on_slow;
    s->ud = ud;
    return s;
}

void lms_supervisor_destroy(lms_supervisor *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->mu);
    free(s->tps);
    free(s);
}

static void clear(lms_supervisor *s)
{
    s->n = 0;
    s->head = 0;
    s->sum = 0;
}

bool lms_supervisor_record(lms_supervisor *s, int64_t n_tokens, double decode_ms)
{
    if (n_tokens < s->p.min_tokens || !(decode_ms > 0) || !isfinite(decode_ms))
        return false;
    double tps = (double)n_tokens * 1000.0 / decode_ms;
    bool fire = false;
    double mean = 0;

    pthread_mutex_lock(&s->mu);
    if (s->n == s->p.window)
        s->sum -= s->tps[s->head];
    else
        s->n++;
    s->tps[s->head] = tps;
    s->sum += tps;
    s->head = (s->head + 1) % s->p.window;
    mean = s->sum / s->n;
    if (s->p.floor_tps > 0 && s->n == s->p.window && mean < s->p.floor_tps) {
        fire = true;
        clear(s);
    }
    pthread_mutex_unlock(&s->mu);

    if (fire) {
        lms_log(LMS_LOG_WARN, "supervisor_slow", "mean_tps", LMS_LOG_F64(mean), "floor_tps",
                LMS_LOG_F64(s->p.floor_tps), "window", LMS_LOG_I64(s->p.window));
        if (s->on_slow)
            s->on_slow(s->ud, mean, s->p.floor_tps);
    }
    return fire;
}

double lms_supervisor_mean(lms_supervisor *s, int *n_out)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n;
    double mean = n ? s->sum / n : 0.0;
    pthread_mutex_unlock(&s->mu);
    if (n_out)
        *n_out = n;
    return mean;
}

void lms_supervisor_reset(lms_supervisor *s)
{
    pthread_mutex_lock(&s->mu);
    clear(s);
    pthread_mutex_unlock(&s->mu);
}
