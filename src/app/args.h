/*
 * args.h - small helpers for the subcommands' option parsing: numbers with
 * range checks and messages that name the flag.
 */
#ifndef LMS_ARGS_H
#define LMS_ARGS_H

#include <stdbool.h>
#include <stdint.h>

/* Value of flag argv[*i] (advances *i); prints an error and returns NULL
 * when the value is missing. */
const char *args_value(int argc, char **argv, int *i);
/* Parse helpers: print "lmserv: FLAG: ..." and return false on bad input. */
bool args_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
bool args_float(const char *flag, const char *s, double lo, double hi, double *out);

#endif
