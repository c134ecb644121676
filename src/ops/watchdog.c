/*
 * watchdog.c - heartbeat watchdog; see watchdog.h.
 *
 * Hot path (scheduler thread, every step): beat and busy touch only the
 * component's atomics. Every beat or busy change bumps `epoch`; the watchdog
 * thread remembers the epoch at which it reported a stall, so it reports a
 * stall once and again only after the epoch moved (the component lived, then
 * stalled again).
 *
 * The watchdog thread owns `fired_epoch`; everything else shared is atomic
 * or guarded by wd->mu (the component list, in_cb, stop).
 */
#include "ops/watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ops/log.h"

#define DEFAULT_CHECK_MS 250

struct lms_watchdog_comp {
    lms_watchdog *wd;
    char name[64];
    int limit_ms;
    lms_watchdog_stall_fn on_stall;
    void *ud;
    _Atomic int64_t last_beat_us; /* monotonic */
    atomic_bool busy;
    _Atomic uint64_t epoch; /* bumped by every beat and busy change */
    uint64_t fired_epoch;   /* watchdog thread: epoch of the last report */
    bool has_fired;         /* watchdog thread: fired_epoch is valid */
    atomic_bool stalled;
    _Atomic uint64_t n_stalls;
    lms_watchdog_comp *next; /* wd->mu */
};

struct lms_watchdog {
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* the thread sleeps here */
    pthread_cond_t cb_done; /* unregister waits here for a running callback */
    pthread_t thread;
    int check_ms;
    bool stop;                /* mu */
    lms_watchdog_comp *comps; /* mu */
    lms_watchdog_comp *in_cb; /* mu: component whose callback is running */
    atomic_int n_busy;        /* components currently busy */
};

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- the watchdog thread ------------------------------------------------ */

/* First component due for a report, marked as reported; NULL if none. */
static lms_watchdog_comp *take_stalled(lms_watchdog *wd, double *stalled_ms)
{
    int64_t now = now_us();
    for (lms_watchdog_comp *c = wd->comps; c; c = c->next) {
        uint64_t epoch = atomic_load(&c->epoch);
        if (!atomic_load(&c->busy) || (c->has_fired && c->fired_epoch == epoch))
            continue;
        int64_t idle_us = now - atomic_load(&c->last_beat_us);
        if (idle_us <= (int64_t)c->limit_ms * 1000)
            continue;
        c->fired_epoch = epoch;
        c->has_fired = true;
        atomic_store(&c->stalled, true);
        atomic_fetch_add(&c->n_stalls, 1);
        *stalled_ms = (double)idle_us / 1000.0;
        return c;
    }
    return NULL;
}

/* Reports every due stall; called and returns with wd->mu held. */
static void check_all(lms_watchdog *wd)
{
    double stalled_ms;
    lms_watchdog_comp *c;
    while ((c = take_stalled(wd, &stalled_ms)) != NULL) {
        wd->in_cb = c;
        pthread_mutex_unlock(&wd->mu);
        lms_log(LMS_LOG_ERROR, "watchdog_stall", "component", LMS_LOG_STR(c->name), "stalled_ms",
                LMS_LOG_F64(stalled_ms), "limit_ms", LMS_LOG_I64(c->limit_ms));
        c->on_stall(c->ud, c->name, stalled_ms);
        pthread_mutex_lock(&wd->mu);
        wd->in_cb = NULL;
        pthread_cond_broadcast(&wd->cb_done);
    }
}

static void *watchdog_main(void *arg)
{
    lms_watchdog *wd = arg;
    pthread_setname_np(pthread_self(), "lms-watchdog"); /* for top -H, gdb */
    pthread_mutex_lock(&wd->mu);
    while (!wd->stop) {
        if (atomic_load(&wd->n_busy) == 0) {
            /* Nothing can stall: sleep until a component turns busy. */
            pthread_cond_wait(&wd->wake, &wd->mu);
            continue;
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(wd->check_ms % 1000) * 1000000L;
        until.tv_sec += wd->check_ms / 1000 + until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&wd->wake, &wd->mu, &until);
        if (!wd->stop)
            check_all(wd);
    }
    pthread_mutex_unlock(&wd->mu);
    return NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

static int init_sync(lms_watchdog *wd)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return -1;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&wd->wake, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0)
        return -1;
    pthread_cond_init(&wd->cb_done, NULL);
    pthread_mutex_init(&wd->mu, NULL);
    return 0;
}

lms_watchdog *lms_watchdog_create(int check_ms)
{
    lms_watchdog *wd = calloc(1, sizeof *wd);
    if (!wd)
        return NULL;
    wd->check_ms = check_ms > 0 ? check_ms : DEFAULT_CHECK_MS;
    if (init_sync(wd) != 0) {
        free(wd);
        return NULL;
    }
    if (pthread_create(&wd->thread, NULL, watchdog_main, wd) != 0) {
        pthread_cond_destroy(&wd->wake);
        pthread_cond_destroy(&wd->cb_done);
        pthread_mutex_destroy(&wd->mu);
        free(wd);
        return NULL;
    }
    return wd;
}

void lms_watchdog_destroy(lms_watchdog *wd)
{
    if (!wd)
        return;
    pthread_mutex_lock(&wd->mu);
    wd->stop = true;
    pthread_cond_signal(&wd->wake);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);
    while (wd->comps) {
        lms_watchdog_comp *c = wd->comps;
        wd->comps = c->next;
        free(c);
    }
    pthread_cond_destroy(&wd->wake);
    pthread_cond_destroy(&wd->cb_done);
    pthread_mutex_destroy(&wd->mu);
    free(wd);
}

lms_watchdog_comp *lms_watchdog_register(lms_watchdog *wd, const char *name, int limit_ms,
                                         lms_watchdog_stall_fn on_stall, void *ud)
{
    if (!wd || limit_ms <= 0 || !on_stall)
        return NULL;
    lms_watchdog_comp *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->wd = wd;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "?");
    c->limit_ms = limit_ms;
    c->on_stall = on_stall;
    c->ud = ud;
    atomic_init(&c->last_beat_us, now_us());
    pthread_mutex_lock(&wd->mu);
    c->next = wd->comps;
    wd->comps = c;
    pthread_mutex_unlock(&wd->mu);
    return c;
}

void lms_watchdog_unregister(lms_watchdog_comp *c)
{
    if (!c)
        return;
    lms_watchdog *wd = c->wd;
    pthread_mutex_lock(&wd->mu);
    for (lms_watchdog_comp **pp = &wd->comps; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    bool on_wd_thread = pthread_equal(pthread_self(), wd->thread);
    while (wd->in_cb == c && !on_wd_thread)
        pthread_cond_wait(&wd->cb_done, &wd->mu);
    if (atomic_exchange(&c->busy, false))
        atomic_fetch_sub(&wd->n_busy, 1);
    pthread_mutex_unlock(&wd->mu);
    free(c);
}

/* ---- the hot path ------------------------------------------------------- */

void lms_watchdog_beat(lms_watchdog_comp *c)
{
    atomic_store(&c->last_beat_us, now_us());
    atomic_fetch_add(&c->epoch, 1); /* after the time: a reader seeing the new
                                       epoch sees the new time too */
    atomic_store(&c->stalled, false);
}

void lms_watchdog_busy(lms_watchdog_comp *c, bool busy)
{
    lms_watchdog_beat(c);
    bool was = atomic_exchange(&c->busy, busy);
    if (was == busy)
        return;
    lms_watchdog *wd = c->wd;
    if (!busy) {
        atomic_fetch_sub(&wd->n_busy, 1);
        return;
    }
    if (atomic_fetch_add(&wd->n_busy, 1) == 0) {
        /* The thread may be in its untimed sleep: wake it to start checking. */
        pthread_mutex_lock(&wd->mu);
        pthread_cond_signal(&wd->wake);
        pthread_mutex_unlock(&wd->mu);
    }
}

bool lms_watchdog_is_stalled(const lms_watchdog_comp *c)
{
    return atomic_load(&c->stalled);
}

uint64_t lms_watchdog_n_stalls(const lms_watchdog_comp *c)
{
    return atomic_load(&c->n_stalls);
}
