/*
 * thermal.h - thermal protection policy: a small state machine that turns
 * GPU temperature readings into how hard the scheduler may push.
 *
 *   state    first condition that holds    next state
 *   -------  ----------------------------  ----------
 *   NORMAL   t >= hard_limit               PAUSED
 *            t >= limit                    SLOW
 *   SLOW     t >= hard_limit               PAUSED
 *            t <  resume                   NORMAL
 *   PAUSED   t <  resume                   NORMAL
 *            t <  hard_resume              SLOW
 *   (otherwise the state stays)
 *
 * Between a limit and its resume mark nothing changes (hysteresis), so a
 * GPU hovering around 80 °C does not flap. Defaults for limit L = 80:
 * hard_limit L+10 = 90, resume L-5 = 75, hard_resume hard-5 = 85.
 *
 *   state    step_delay_ms                            token_factor
 *   NORMAL   0                                        1
 *   SLOW     slow_delay_ms at limit, rising linearly   slow_token_factor
 *            to slow_delay_max_ms at hard_limit
 *   PAUSED   paused_recheck_ms (run no step; sleep     0
 *            this long, then look again)
 *
 * A missing reading (NAN: NVML absent or the sensor failed) keeps the
 * state; after stale_ms without any reading the machine returns to NORMAL
 * and logs it, because a monitor that went blind must not pause service
 * forever.
 *
 * The transition and output functions are pure (lms_thermal_next,
 * lms_thermal_outputs). lms_thermal wraps them with a mutex, a change
 * callback, a log line per change and time-in-state counters: the I/O
 * thread feeds it once a second (lms_thermal_update) and scheduler threads
 * read it before every step (lms_thermal_get).
 */
#ifndef LMS_OPS_THERMAL_H
#define LMS_OPS_THERMAL_H

#include <stdbool.h>
#include <stdint.h>

typedef enum lms_thermal_state {
    LMS_THERMAL_NORMAL = 0,
    LMS_THERMAL_SLOW = 1,
    LMS_THERMAL_PAUSED = 2,
} lms_thermal_state;

typedef struct lms_thermal_params {
    double limit_c;           /* enter SLOW at or above (default 80) */
    double hard_limit_c;      /* enter PAUSED at or above (limit + 10) */
    double resume_c;          /* back to NORMAL below (limit - 5) */
    double hard_resume_c;     /* PAUSED -> SLOW below (hard_limit - 5) */
    int slow_delay_ms;        /* SLOW: sleep before each step at limit_c (20) */
    int slow_delay_max_ms;    /* ... rising to this at hard_limit_c (200) */
    double slow_token_factor; /* SLOW: multiply the step token budget (0.5) */
    int paused_recheck_ms;    /* PAUSED: sleep between looks (1000) */
    int stale_ms;             /* no reading this long -> NORMAL (10000) */
} lms_thermal_params;

/* What the scheduler should do now. */
typedef struct lms_thermal_out {
    lms_thermal_state state;
    int step_delay_ms;   /* sleep this long before the next step */
    double token_factor; /* scale the step's token budget (0: run no step) */
    double temp_c;       /* last reading, NAN if none yet */
    uint64_t n_changes;  /* state changes so far */
    double slow_ms;      /* total time spent in SLOW (as of the last update) */
    double paused_ms;    /* total time spent in PAUSED */
} lms_thermal_out;

/* Defaults derived from one limit (the --thermal-limit flag). */
void lms_thermal_params_default(lms_thermal_params *p, double limit_c);

/* LMS_OK, or LMS_ERR_INVAL unless resume < limit < hard_limit,
 * resume <= hard_resume < hard_limit, delays >= 0, 0 < factor <= 1. */
int lms_thermal_params_check(const lms_thermal_params *p);

/* Pure: the state after a reading (NAN readings keep the state). */
lms_thermal_state lms_thermal_next(const lms_thermal_params *p, lms_thermal_state s, double temp_c);

/* Pure: delay and factor for a state at a temperature; fills state,
 * step_delay_ms and token_factor of *out only. */
void lms_thermal_outputs(const lms_thermal_params *p, lms_thermal_state s, double temp_c,
                         lms_thermal_out *out);

const char *lms_thermal_state_name(lms_thermal_state s); /* "normal", "slow", "paused" */

/* ---- the shared, thread-safe object ------------------------------------- */

typedef struct lms_thermal lms_thermal;

/* Called on the updating thread, outside the lock, after each change. */
typedef void (*lms_thermal_change_fn)(void *ud, lms_thermal_state from, lms_thermal_state to,
                                      double temp_c);

/* p is copied; NULL means defaults for 80 °C. on_change may be NULL.
 * Returns NULL on bad params or out of memory. */
lms_thermal *lms_thermal_create(const lms_thermal_params *p, lms_thermal_change_fn on_change,
                                void *ud);
void lms_thermal_destroy(lms_thermal *t);

/* Feeds one reading (NAN: none) taken at now_ms (monotonic, lms_now_ms);
 * returns the new state. Call from one thread (the I/O thread's timer). */
lms_thermal_state lms_thermal_update(lms_thermal *t, double temp_c, double now_ms);

/* Current outputs; any thread, cheap (one uncontended mutex). */
void lms_thermal_get(lms_thermal *t, lms_thermal_out *out);

#endif
