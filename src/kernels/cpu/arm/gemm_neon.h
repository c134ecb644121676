/*
 * gemm_neon.h - the AArch64 multi-row kernels that the NEON table in
 * quant_neon.c lists under `gemv` (decode) and `gemm` (prompt tiles); see
 * lms_gemv_fn / lms_gemm_fn in kernels.h for the contracts. Defined in
 * gemm_neon.c. Not a public header; include only from cpu/arm/.
 */
#ifndef LMS_GEMM_NEON_H
#define LMS_GEMM_NEON_H

#include <stddef.h>
#include <stdint.h>

void gemv_q4_K_q8_K_neon(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                         float *s);
void gemv_q6_K_q8_K_neon(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                         float *s);
void gemv_q8_0_q8_0_neon(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                         float *s);

void gemm_q4_K_q8_K_neon(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds);
void gemm_q6_K_q8_K_neon(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds);
void gemm_q8_0_q8_0_neon(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds);

#endif
