/*
 * watchdog.h - heartbeat watchdog for scheduler steps.
 *
 * Each component (one per scheduler, i.e. per loaded model) registers with a
 * name, a limit and an on_stall callback, then:
 *
 *   lms_watchdog_busy(h, true);     // a step starts (or work was admitted)
 *   ... run the step, calling lms_watchdog_beat(h) as progress is made ...
 *   lms_watchdog_beat(h);           // at least once per step
 *   lms_watchdog_busy(h, false);    // idle: the scheduler is about to sleep
 *
 * A component is stalled when it is busy and has not beaten for more than
 * its limit. on_stall then fires once for that stall, on the watchdog's
 * thread; it fires again only after the component beat or went idle and
 * then stalled anew. Idle components never fire, however long they sleep.
 *
 * The watchdog thread sleeps on a condition variable: with a timeout of
 * check_ms (default 250) while any component is busy, without timeout while
 * none is, so an idle server pays nothing. Detection latency is therefore
 * between limit and limit + check_ms.
 *
 * beat and busy are lock-free except for the idle -> busy transition of the
 * first busy component, which wakes the watchdog thread (one mutex and a
 * condition signal). All functions are thread-safe.
 */
#ifndef LMS_OPS_WATCHDOG_H
#define LMS_OPS_WATCHDOG_H

#include <stdbool.h>
#include <stdint.h>

typedef struct lms_watchdog lms_watchdog;
typedef struct lms_watchdog_comp lms_watchdog_comp;

/* Runs on the watchdog thread, with no watchdog lock held. It may call any
 * watchdog function (unregistering its own component included; `name` is
 * invalid after that). It should not block for long: the other components
 * are not checked meanwhile. Typical body: mark the model unhealthy and
 * post a restart request to the I/O thread. */
typedef void (*lms_watchdog_stall_fn)(void *ud, const char *name, double stalled_ms);

/* Starts the watchdog thread (named "lms-watchdog"). check_ms <= 0 means
 * 250. NULL on failure. */
lms_watchdog *lms_watchdog_create(int check_ms);

/* Stops and joins the thread and frees every component still registered
 * (their handles become invalid). NULL is a no-op. Not from a callback. */
void lms_watchdog_destroy(lms_watchdog *wd);

/* Adds a component (idle, not stalled). name is copied (63 bytes kept).
 * NULL on bad arguments (limit_ms <= 0, no callback) or out of memory. */
lms_watchdog_comp *lms_watchdog_register(lms_watchdog *wd, const char *name, int limit_ms,
                                         lms_watchdog_stall_fn on_stall, void *ud);

/* Removes and frees a component; waits for its callback if one is running
 * on another thread. NULL is a no-op. */
void lms_watchdog_unregister(lms_watchdog_comp *c);

/* Progress: resets the stall clock (and a reported stall). */
void lms_watchdog_beat(lms_watchdog_comp *c);

/* Marks the component busy (checked; also counts as a beat) or idle. */
void lms_watchdog_busy(lms_watchdog_comp *c, bool busy);

/* True from on_stall until the next beat or busy(false): for /health. */
bool lms_watchdog_is_stalled(const lms_watchdog_comp *c);

/* Stalls reported for this component so far. */
uint64_t lms_watchdog_n_stalls(const lms_watchdog_comp *c);

#endif
