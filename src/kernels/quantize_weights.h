/*
 * quantize_weights.h - float weight rows to the GGUF weight types, for the
 * `quantize` command (app/cmd_quantize.c) and for tests, and the error of a
 * quantize -> dequantize round trip.
 *
 * Types: F32, F16, BF16 (plain conversions), Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS. Any float input is accepted: zero blocks
 * give zero blocks, scales too large for f16 saturate at 65504, and NaN or
 * infinite inputs give garbage blocks but never a crash.
 */
#ifndef LMS_QUANTIZE_WEIGHTS_H
#define LMS_QUANTIZE_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

/* True when lms_quantize_row can produce `type`. */
bool lms_quantize_supported(int type);

/* Quantizes n floats into y (lms_row_size(type, n) bytes). Returns 0,
 * LMS_ERR_UNSUPPORTED for a type it cannot produce, or LMS_ERR_INVAL when
 * n is negative or not a multiple of the block size. */
int lms_quantize_row(int type, const float *x, void *y, int64_t n);

/* Sets *rms to sqrt(mean((x - dequant(quant(x)))^2)) over n elements.
 * Returns 0, or the errors of lms_quantize_row, or LMS_ERR_NOMEM. */
int lms_quantize_rms_error(int type, const float *x, int64_t n, double *rms);

/* The per-type quantizers, with the lms_from_float_fn signature (they are
 * the weight types' from_float entries of the kernel tables); n must be a
 * multiple of the block size (asserted).
 *
 * Q8_0 is llama-quantize's own rule, so its output is byte-identical:
 * d = f16(amax / 127), q = x * (1 / d) rounded half away from zero. (The
 * activation converter lms_from_float_q8_0_ref rounds half to even.) The
 * others search for the codes and scales of least squared error; see
 * quantize_weights.c. */
void lms_quantize_row_q8_0(const float *x, void *y, int64_t n);
void lms_quantize_row_q4_0(const float *x, void *y, int64_t n);
void lms_quantize_row_q4_1(const float *x, void *y, int64_t n);
void lms_quantize_row_q5_0(const float *x, void *y, int64_t n);
void lms_quantize_row_q5_1(const float *x, void *y, int64_t n);
void lms_quantize_row_q2_K(const float *x, void *y, int64_t n);
void lms_quantize_row_q3_K(const float *x, void *y, int64_t n);
void lms_quantize_row_q4_K(const float *x, void *y, int64_t n);
void lms_quantize_row_q5_K(const float *x, void *y, int64_t n);
void lms_quantize_row_q6_K(const float *x, void *y, int64_t n);
void lms_quantize_row_iq4_nl(const float *x, void *y, int64_t n);
void lms_quantize_row_iq4_xs(const float *x, void *y, int64_t n);

#endif
