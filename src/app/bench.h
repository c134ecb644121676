/*
 * bench.h - options shared by the two halves of `lmserv bench`
 * (cmd_bench.c: pp/tg; bench_par.c: concurrent requests).
 */
#ifndef LMS_APP_BENCH_H
#define LMS_APP_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "app/args.h"
#include "app/common.h"
#include "model/model.h"

typedef struct bench_opts {
    const char *model;
    int64_t pp, tg, threads, reps, depth, batch;
    int par[16];     /* --parallel levels */
    int n_par;
    int64_t prefix;  /* --prefix N: TTFT with and without a cached N-token prefix */
    bool json;
    app_gpu_opts gpu;
    args_spec_opts spec; /* speculative decoding for --parallel */
    bool repeat_prompt;  /* --parallel prompts: a 16-token pattern repeated */
} bench_opts;

/* Read bandwidth of a 1 GiB buffer with the OpenMP team of the calling
 * thread, GB/s (the ceiling of a CPU decode; it drifts from run to run). */
double bench_bandwidth(void);

/* Aggregate decode speed and TTFT of N concurrent requests (128 prompt +
 * 64 generated tokens each) through the scheduler, for each level; on the
 * CPU, with the bandwidth measured just before it. */
int bench_parallel(lms_model *m, const bench_opts *o);

/* TTFT of a request whose o->prefix-token prefix is not cached, then of
 * one that shares it (prefix cache hit). */
int bench_prefix(lms_model *m, const bench_opts *o);

#endif
