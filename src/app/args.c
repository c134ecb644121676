/*
 * args.c - option value parsing for the subcommands.
 */
#include "app/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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
