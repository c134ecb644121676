/*
 * thermal.c - thermal protection state machine; see thermal.h for the
 * transition and output tables.
 */
#include "ops/thermal.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "base/err.h"
#include "ops/log.h"

/* ---- the pure part ------------------------------------------------------ */

void lms_thermal_params_default(lms_thermal_params *p, double limit_c)
{
    p->limit_c = limit_c;
    p->hard_limit_c = limit_c + 10.0;
    p->resume_c = limit_c - 5.0;
    p->hard_resume_c = p->hard_limit_c - 5.0;
    p->slow_delay_ms = 20;
    p->slow_delay_max_ms = 200;
    p->slow_token_factor = 0.5;
    p->paused_recheck_ms = 1000;
    p->stale_ms = 10000;
}

int lms_thermal_params_check(const lms_thermal_params *p)
{
    bool ok = isfinite(p->limit_c) && isfinite(p->hard_limit_c) && isfinite(p->resume_c) &&
              isfinite(p->hard_resume_c) && p->resume_c < p->limit_c &&
              p->limit_c < p->hard_limit_c && p->resume_c <= p->hard_resume_c &&
              p->hard_resume_c < p->hard_limit_c && p->slow_delay_ms >= 0 &&
              p->slow_delay_max_ms >= p->slow_delay_ms && p->slow_token_factor > 0 &&
              p->slow_token_factor <= 1 && p->paused_recheck_ms > 0 && p->stale_ms > 0;
    return ok ? LMS_OK : LMS_ERR_INVAL;
}

lms_thermal_state lms_thermal_next(const lms_thermal_params *p, lms_thermal_state s, double t)
{
    if (isnan(t))
        return s;
    switch (s) {
    case LMS_THERMAL_NORMAL:
        if (t >= p->hard_limit_c)
            return LMS_THERMAL_PAUSED;
        if (t >= p->limit_c)
            return LMS_THERMAL_SLOW;
        return s;
    case LMS_THERMAL_SLOW:
        if (t >= p->hard_limit_c)
            return LMS_THERMAL_PAUSED;
        if (t < p->resume_c)
            return LMS_THERMAL_NORMAL;
        return s;
    case LMS_THERMAL_PAUSED:
        if (t < p->resume_c)
            return LMS_THERMAL_NORMAL;
        if (t < p->hard_resume_c)
            return LMS_THERMAL_SLOW;
        return s;
    }
    return s;
}

void lms_thermal_outputs(const lms_thermal_params *p, lms_thermal_state s, double t,
                         lms_thermal_out *out)
{
    out->state = s;
    switch (s) {
    case LMS_THERMAL_NORMAL:
        out->step_delay_ms = 0;
        out->token_factor = 1.0;
        break;
    case LMS_THERMAL_SLOW: {
        /* The hotter, the longer the pause: linear from limit to hard_limit. */
        double x = isnan(t) ? 0.0 : (t - p->limit_c) / (p->hard_limit_c - p->limit_c);
        x = x < 0 ? 0 : x > 1 ? 1 : x;
        double d = p->slow_delay_ms + x * (p->slow_delay_max_ms - p->slow_delay_ms);
        out->step_delay_ms = (int)lround(d);
        out->token_factor = p->slow_token_factor;
        break;
    }
    case LMS_THERMAL_PAUSED:
        out->step_delay_ms = p->paused_recheck_ms;
        out->token_factor = 0.0;
        break;
    }
}

const char *lms_thermal_state_name(lms_thermal_state s)
{
    switch (s) {
    case LMS_THERMAL_NORMAL: return "normal";
    case LMS_THERMAL_SLOW: return "slow";
    case LMS_THERMAL_PAUSED: return "paused";
    }
    return "?";
}

/* ---- the shared object -------------------------------------------------- */

struct lms_thermal {
    pthread_mutex_t mu; /* guards everything below params */
    lms_thermal_params p;
    lms_thermal_change_fn on_change;
    void *ud;
    lms_thermal_out out;  /* what lms_thermal_get returns */
    double last_valid_ms; /* time of the last non-NAN reading; NAN: never */
    double last_update_ms;
};

lms_thermal *lms_thermal_create(const lms_thermal_params *p, lms_thermal_change_fn on_change,
                                void *ud)
{
    lms_thermal_params def;
    if (!p) {
        lms_thermal_params_default(&def, 80.0);
        p = &def;
    }
    if (lms_thermal_params_check(p) != LMS_OK)
        return NULL;
    lms_thermal *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    pthread_mutex_init(&t->mu, NULL);
    t->p = *p;
    t->on_change = on_change;
    t->ud = ud;
    lms_thermal_outputs(&t->p, LMS_THERMAL_NORMAL, NAN, &t->out);
    t->out.temp_c = NAN;
    t->last_valid_ms = NAN;
    t->last_update_ms = NAN;
    return t;
}

void lms_thermal_destroy(lms_thermal *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static void log_change(lms_thermal_state from, lms_thermal_state to, double temp_c, bool blind)
{
    lms_log(to == LMS_THERMAL_NORMAL ? LMS_LOG_INFO : LMS_LOG_WARN, "thermal_state", "from",
            LMS_LOG_STR(lms_thermal_state_name(from)), "to",
            LMS_LOG_STR(lms_thermal_state_name(to)), "temp_c", LMS_LOG_F64(temp_c), "stale",
            LMS_LOG_BOOL(blind));
}

lms_thermal_state lms_thermal_update(lms_thermal *t, double temp_c, double now_ms)
{
    pthread_mutex_lock(&t->mu);
    lms_thermal_state from = t->out.state;
    if (!isnan(t->last_update_ms) && now_ms > t->last_update_ms) {
        double dt = now_ms - t->last_update_ms;
        if (from == LMS_THERMAL_SLOW)
            t->out.slow_ms += dt;
        else if (from == LMS_THERMAL_PAUSED)
            t->out.paused_ms += dt;
    }
    t->last_update_ms = now_ms;

    lms_thermal_state to = from;
    bool blind = false;
    if (!isnan(temp_c)) {
        t->last_valid_ms = now_ms;
        t->out.temp_c = temp_c;
        to = lms_thermal_next(&t->p, from, temp_c);
    } else if (from != LMS_THERMAL_NORMAL && !isnan(t->last_valid_ms) &&
               now_ms - t->last_valid_ms >= t->p.stale_ms) {
        to = LMS_THERMAL_NORMAL;
        blind = true;
        t->out.temp_c = NAN; /* the last reading is too old to show */
    }
    lms_thermal_outputs(&t->p, to, t->out.temp_c, &t->out);
    if (to != from)
        t->out.n_changes++;
    double shown = t->out.temp_c;
    pthread_mutex_unlock(&t->mu);

    if (to != from) {
        log_change(from, to, shown, blind);
        if (t->on_change)
            t->on_change(t->ud, from, to, shown);
    }
    return to;
}

void lms_thermal_get(lms_thermal *t, lms_thermal_out *out)
{
    pthread_mutex_lock(&t->mu);
    *out = t->out;
    pthread_mutex_unlock(&t->mu);
}
