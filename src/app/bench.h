/*
 * bench.h - options shared by the two halves of `lmserv bench`
 * (cmd_bench.c: pp/tg; bench_par.c: concurrent requests).
 */
#ifndef LMS_APP_BENCH_H
#define LMS_APP_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

typedef struct bench_opts {
    const char *model;
    int64_t pp, tg, threads, reps, depth, batch;
    int par[16];     /* --parallel levels */
    int n_par;
    bool json;
} bench_opts;

/* Aggregate decode speed and TTFT of N concurrent requests (128 prompt +
 * 64 generated tokens each) through the scheduler, for each level. */
int bench_parallel(lms_model *m, const bench_opts *o);

#endif
