/*
 * gemm_x86.h - the x86 multi-row (tile) kernels that the per-ISA tables in
 * quant_avx2.c / quant_avx512.c list under `gemm` (see lms_gemm_fn in
 * kernels.h for the contract). Defined in gemm_avx512.c (and gemm_avx2.c).
 * Not a public header; include only from cpu/x86/.
 */
#ifndef LMS_GEMM_X86_H
#define LMS_GEMM_X86_H

#include <stddef.h>
#include <stdint.h>

void gemm_q4_K_q8_K_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds);
void gemm_q5_K_q8_K_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds);
void gemm_q6_K_q8_K_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds);
void gemm_q8_0_q8_0_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds);
void gemm_q4_0_q8_0_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds);
void gemm_iq4_nl_q8_0_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                             const void *x, size_t ldx, float *s, size_t lds);
void gemm_q4_K_q8_K_avx2(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds);
void gemm_q6_K_q8_K_avx2(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds);
void gemm_f16_f16_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                         const void *x, size_t ldx, float *s, size_t lds);

#endif
