/*
 * args.h - small helpers for the subcommands' option parsing: numbers with
 * range checks and messages that name the flag.
 */
#ifndef LMS_ARGS_H
#define LMS_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/spec.h"

/* Value of flag argv[*i] (advances *i); prints an error and returns NULL
 * when the value is missing. */
const char *args_value(int argc, char **argv, int *i);
/* Parse helpers: print "lmserv: FLAG: ..." and return false on bad input. */
bool args_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
bool args_float(const char *flag, const char *s, double lo, double hi, double *out);
/* A layer count for the GPU: auto, all or N (lms_ctx_params.gpu_layers). */
bool args_gpu_layers(const char *flag, const char *s, int32_t *out);

/* Speculative decoding options of run, serve and bench. */
typedef struct args_spec_opts {
    const char *draft;    /* --draft / --model-draft / -md MODEL */
    lms_spec_params spec; /* p_min < 0: not given */
    bool given;
    int32_t draft_gpu;    /* --gpu-layers-draft auto|all|N, when draft_gpu_set */
    bool draft_gpu_set;   /* else the draft is placed as the target (--gpu-layers) */
} args_spec_opts;

#define ARGS_SPEC_USAGE                                                                            \
    "[--draft MODEL] [--spec ngram|draft] [--draft-max N] [--draft-min N] [--draft-p-min P] "    \
    "[--spec-ngram N] [--gpu-layers-draft auto|all|N]"

/* Parses argv[*i] when it is one of them: 1 (consumed), 0 (not one), -1
 * (bad value, printed). */
int args_spec(int argc, char **argv, int *i, args_spec_opts *o);
/* Fills the mode and defaults once parsing is done; -1 (printed, naming
 * cmd) when they do not fit. */
int args_spec_finish(args_spec_opts *o, const char *cmd);

#endif
