/*
 * gemv_avx2.h - the AVX2 multi-row decode kernels that the AVX2 table in
 * quant_avx2.c lists under `gemv` (see lms_gemv_fn in kernels.h for the
 * contract). Defined in gemv_avx2.c. Not a public header; include only
 * from cpu/x86/.
 */
#ifndef LMS_GEMV_AVX2_H
#define LMS_GEMV_AVX2_H

#include <stddef.h>
#include <stdint.h>

void gemv_q8_0_q8_0_avx2(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                         float *s);

#endif
