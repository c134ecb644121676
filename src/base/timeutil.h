/*
 * timeutil.h - monotonic and wall clocks in milliseconds.
 */
#ifndef LMS_TIMEUTIL_H
#define LMS_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

static inline double lms_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline int64_t lms_wall_s(void)
{
    return (int64_t)time(NULL);
}

#endif
