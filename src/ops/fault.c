/*
 * fault.c - test-only fault injection; see fault.h.
 */
#include "ops/fault.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Atomic int64_t g_hang_step; /* 0: off */
static _Atomic int64_t g_steps;     /* should_hang calls since it was set */

static void read_env(void)
{
    const char *s = getenv("LMS_FAULT_HANG_STEP");
    if (!s || !*s)
        return;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end == '\0' && v > 0)
        atomic_store(&g_hang_step, (int64_t)v);
}

int lms_fault_set(const char *name, int64_t value)
{
    pthread_once(&g_once, read_env);
    if (!name || strcmp(name, "hang_step") != 0 || value < 0)
        return LMS_ERR_INVAL;
    atomic_store(&g_steps, 0);
    atomic_store(&g_hang_step, value);
    return LMS_OK;
}

int64_t lms_fault_get(const char *name)
{
    pthread_once(&g_once, read_env);
    if (name && strcmp(name, "hang_step") == 0)
        return atomic_load(&g_hang_step);
    return 0;
}

bool lms_fault_should_hang(void)
{
    pthread_once(&g_once, read_env);
    int64_t at = atomic_load_explicit(&g_hang_step, memory_order_relaxed);
    if (at <= 0)
        return false;
    return atomic_fetch_add(&g_steps, 1) + 1 == at;
}
