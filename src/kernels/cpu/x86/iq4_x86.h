/*
 * iq4_x86.h - the 512-bit IQ4_XS kernels (row, decode and prompt tile) that
 * the AVX-512 table in quant_avx512.c lists, defined in iq4_avx512.c, and
 * the AVX2 prompt tile kernel of quant_avx2.c's table (iq4_avx2.c).
 * Contracts: lms_vec_dot_fn, lms_gemv_fn, lms_gemm_fn in kernels.h. Not a
 * public header; include only from cpu/x86/.
 */
#ifndef LMS_IQ4_X86_H
#define LMS_IQ4_X86_H

#include <stddef.h>
#include <stdint.h>

void vec_dot_iq4_xs_q8_K_avx512(int64_t n, float *s, const void *w, const void *x);
void gemv_iq4_xs_q8_K_avx512(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                             float *s);
void gemm_iq4_xs_q8_K_avx512(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                             const void *x, size_t ldx, float *s, size_t lds);
void gemv_iq4_nl_q8_0_avx512(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                             float *s);
void gemm_iq4_xs_q8_K_avx2(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                           const void *x, size_t ldx, float *s, size_t lds);

#endif
