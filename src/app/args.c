/*
 * args.c - option value parsing for the subcommands.
 */
#include "app/args.h"

#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *args_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "lmserv: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

bool args_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "lmserv: %s: '%s' is not an integer in [%lld, %lld]\n", flag, s,
                (long long)lo, (long long)hi);
        return false;
    }
    *out = v;
    return true;
}

bool args_float(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "lmserv: %s: '%s' is not a number in [%g, %g]\n", flag, s, lo, hi);
        return false;
    }
    *out = v;
    return true;
}

bool args_gpu_layers(const char *flag, const char *s, int32_t *out)
{
    int64_t v;
    if (!strcmp(s, "auto"))
        *out = LMS_GPU_LAYERS_AUTO;
    else if (!strcmp(s, "all"))
        *out = LMS_GPU_LAYERS_ALL;
    else if (args_int(flag, s, 0, 1 << 20, &v))
        *out = (int32_t)v;
    else
        return false;
    return true;
}

int args_spec(int argc, char **argv, int *i, args_spec_opts *o)
{
    const char *a = argv[*i];
    int64_t v;
    double d;
    if (!o->given) {
        o->spec.p_min = -1;
        o->given = true;
    }
    if (!strcmp(a, "--draft") || !strcmp(a, "--model-draft") || !strcmp(a, "-md"))
        return (o->draft = args_value(argc, argv, i)) ? 1 : -1;
    if (!strcmp(a, "--gpu-layers-draft")) {
        const char *s = args_value(argc, argv, i);
        if (!s || !args_gpu_layers(a, s, &o->draft_gpu))
            return -1;
        o->draft_gpu_set = true;
        return 1;
    }
    if (!strcmp(a, "--spec")) {
        const char *m = args_value(argc, argv, i);
        if (!m)
            return -1;
        if (!strcmp(m, "ngram") || !strcmp(m, "draft") || !strcmp(m, "none")) {
            o->spec.mode = m[0] == 'n' && m[1] == 'g' ? LMS_SPEC_NGRAM
                           : m[0] == 'd'               ? LMS_SPEC_DRAFT
                                                       : LMS_SPEC_NONE;
            return 1;
        }
        fprintf(stderr, "lmserv: --spec: '%s' is not ngram, draft or none\n", m);
        return -1;
    }
    static const struct { const char *flag; int64_t lo, hi; size_t off; } ints[] = {
        {"--draft-max", 0, LMS_SPEC_MAX, offsetof(lms_spec_params, n_max)},
        {"--draft-min", 0, LMS_SPEC_MAX, offsetof(lms_spec_params, n_min)},
        {"--spec-ngram", 1, 64, offsetof(lms_spec_params, ngram_max)},
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        if (strcmp(a, ints[k].flag))
            continue;
        const char *s = args_value(argc, argv, i);
        if (!s || !args_int(a, s, ints[k].lo, ints[k].hi, &v))
            return -1;
        *(int32_t *)((char *)&o->spec + ints[k].off) = (int32_t)v;
        if (k == 2 && o->spec.mode == LMS_SPEC_NONE)
            o->spec.mode = LMS_SPEC_NGRAM;
        return 1;
    }
    if (!strcmp(a, "--draft-p-min")) {
        const char *s = args_value(argc, argv, i);
        if (!s || !args_float(a, s, 0, 1, &d))
            return -1;
        o->spec.p_min = (float)d;
        return 1;
    }
    return 0;
}

int args_spec_finish(args_spec_opts *o, const char *cmd)
{
    if (!o->given)
        o->spec.p_min = -1;
    if (o->draft && o->spec.mode == LMS_SPEC_NONE)
        o->spec.mode = LMS_SPEC_DRAFT;
    if (o->spec.mode == LMS_SPEC_DRAFT && !o->draft) {
        fprintf(stderr, "lmserv %s: --spec draft needs the draft model (--draft MODEL)\n", cmd);
        return -1;
    }
    if (o->draft && o->spec.mode != LMS_SPEC_DRAFT) {
        fprintf(stderr, "lmserv %s: --draft is for --spec draft\n", cmd);
        return -1;
    }
    if (o->draft_gpu_set && !o->draft) {
        fprintf(stderr, "lmserv %s: --gpu-layers-draft is for a draft model (--draft MODEL)\n",
                cmd);
        return -1;
    }
    if (o->spec.p_min < 0)
        o->spec.p_min = LMS_SPEC_P_MIN_DEFAULT;
    char err[256];
    if (lms_spec_params_fix(&o->spec, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv %s: %s\n", cmd, err);
        return -1;
    }
    return 0;
}
