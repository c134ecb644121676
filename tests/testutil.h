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

/* Golden data: a file of float32 values (*n of them) / of space-separated
 * token ids (at most 4096); malloc'd, NULL when the file is missing. */
float *tu_read_f32(const char *path, size_t *n);
int32_t *tu_read_ids(const char *path, int32_t *n);
/* The margins (4th column) of golden/<dir>/<cs>.greedy.txt's first n
 * lines ("step id logit margin") into margin[]; fails the test when the
 * file is missing or a line is malformed. */
void tu_read_margins(const char *dir, const char *cs, float *margin, int32_t n);
/* Largest |a[i] - b[i]| (NaN counts as infinitely large). */
float tu_max_diff(const float *a, const float *b, size_t n);
/* Index of the largest value, lowest index on ties. */
int32_t tu_argmax(const float *v, int32_t n);

/* Deterministic xorshift random numbers for test data. */
uint64_t tu_rand_u64(uint64_t *state);
float tu_rand_f32(uint64_t *state, float lo, float hi);

/* The logits of every one of n tokens (n <= 64), positions 0..n-1 of one
 * sequence, through a fresh 2-thread context of m, with the LoRA set
 * `lora` (a const lms_lora_set *, or NULL) on every row; malloc'd
 * [n][n_vocab]. Fails the test on an error. (testutil_engine.c: not in the
 * kernels-only build.) */
struct lms_model;
float *tu_logits_all(const struct lms_model *m, const void *lora, const int32_t *toks, int n);

/* Kernel tests: n activations, each run of 256 at an amplitude from tiny
 * to large, or all zero. */
void tu_rand_acts(uint64_t *seed, float *x, int64_t n);
/* The sum over a dot product's elements of (|scaled code| + |offset|) *
 * |activation|, in double, for weights w of `type` and activations xq in
 * its vec_dot_type: an upper bound on every partial sum a kernel forms. */
double tu_dot_magnitude(int type, int64_t n, const void *w, const void *xq);

#endif
