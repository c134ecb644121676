/*
 * common.h - what several subcommands share: loading a model with an
 * engine context, reading token lists.
 */
#ifndef LMS_APP_COMMON_H
#define LMS_APP_COMMON_H

#include <stdint.h>

#include "engine/forward.h"
#include "model/model.h"

/* Loads the model and creates a context (n_ctx <= 0: min(train, 4096)).
 * Prints the error and returns < 0 on failure. */
int app_load(const char *path, int32_t n_ctx, int32_t n_batch, int32_t n_threads, lms_model **m,
             lms_ctx **c);

/* Parses "1 2 3" (spaces, commas or newlines) into a malloc'd array.
 * Prints the error and returns < 0 on a bad list. */
int app_parse_tokens(const char *s, int32_t **out, int32_t *n_out);

#endif
