/*
 * fault.h - TEST-ONLY fault injection hooks.
 *
 * These exist so tests can make the server misbehave on purpose (a hung
 * scheduler step, to check that the watchdog fails the request and restarts
 * the worker). Production code only asks the question; with no fault set
 * the answer costs two atomic loads.
 *
 * Faults, set by the environment (read once, at the first call of any
 * function here) or by lms_fault_set():
 *
 *   name         env                   value
 *   hang_step    LMS_FAULT_HANG_STEP   N > 0: the N-th call of
 *                                      lms_fault_should_hang() (counted
 *                                      process-wide from when the fault was
 *                                      set) returns true, once. 0: off.
 *
 * The scheduler calls lms_fault_should_hang() once per step; on true it
 * simulates a stuck step: it stops beating and blocks (on its own condition
 * variable, no spinning) until the watchdog's restart asks it to give up.
 * With several schedulers the count is shared: tests use one model.
 */
#ifndef LMS_OPS_FAULT_H
#define LMS_OPS_FAULT_H

#include <stdbool.h>
#include <stdint.h>

/* Sets a fault by name (see the table). Returns LMS_OK or LMS_ERR_INVAL for
 * an unknown name or a negative value. Thread-safe. */
int lms_fault_set(const char *name, int64_t value);

/* The current value of a fault; 0 for unknown names. */
int64_t lms_fault_get(const char *name);

/* Once per scheduler step: true exactly on the step the hang_step fault
 * names. Thread-safe, lock-free. */
bool lms_fault_should_hang(void);

#endif
