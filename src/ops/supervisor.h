/*
 * supervisor.h - decode-speed supervisor: notices a worker that has become
 * slow (thermal throttling it cannot escape, a leak, a degraded GPU) and
 * asks for it to be restarted.
 *
 * The scheduler records the decode speed of every finished request. Once
 * `window` requests are in the window and their mean tokens/s is under
 * floor_tps, on_slow fires (on the recording thread, no lock held) and the
 * window is cleared, so the next report needs `window` new slow requests.
 * Requests with fewer than min_tokens decoded tokens are ignored: their
 * rate is noise. floor_tps = 0 disables the check.
 *
 * Thread-safe. on_slow must not block: post a restart request to the I/O
 * thread rather than restarting from inside the callback.
 */
#ifndef LMS_OPS_SUPERVISOR_H
#define LMS_OPS_SUPERVISOR_H

#include <stdbool.h>
#include <stdint.h>

typedef struct lms_supervisor lms_supervisor;

typedef void (*lms_supervisor_slow_fn)(void *ud, double avg_tps, double floor_tps);

typedef struct lms_supervisor_params {
    double floor_tps; /* mean decode tokens/s below which on_slow fires; 0: off */
    int window;       /* requests averaged, 1..1024 (default 8) */
    int min_tokens;   /* ignore requests that decoded fewer tokens (default 16) */
} lms_supervisor_params;

/* NULL on bad params (floor < 0, window out of range, min_tokens < 1) or
 * out of memory. on_slow may be NULL (then only the return value of
 * lms_supervisor_record tells). */
lms_supervisor *lms_supervisor_create(const lms_supervisor_params *p,
                                      lms_supervisor_slow_fn on_slow, void *ud);
void lms_supervisor_destroy(lms_supervisor *s);

/* One finished request: n_tokens decoded in decode_ms (first token to last).
 * Returns true when this record made on_slow fire. */
bool lms_supervisor_record(lms_supervisor *s, int64_t n_tokens, double decode_ms);

/* Mean tokens/s over the window now (0 when empty); *n_out gets the count. */
double lms_supervisor_mean(lms_supervisor *s, int *n_out);

/* Empties the window (after the worker was restarted for another reason). */
void lms_supervisor_reset(lms_supervisor *s);

#endif
