/*
 * testutil.h - helpers shared by the C tests: locating the shared test data,
 * reading whole files, random data.
 */
#ifndef LMS_TESTUTIL_H
#define LMS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Path of a file under the shared test data folder (static buffer, rotates
 * among 8 slots so a few may be held at once). */
const char *tu_data_path(const char *rel);

/* Reads a whole file; returns malloc'd bytes (NUL-terminated) or NULL. */
char *tu_read_file(const char *path, size_t *n_out);

/* Deterministic xorshift random numbers for test data. */
uint64_t tu_rand_u64(uint64_t *state);
float tu_rand_f32(uint64_t *state, float lo, float hi);

#endif
