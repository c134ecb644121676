/*
 * kernels.h - the CPU kernel interface: type traits and one table of
 * function pointers per instruction set.
 *
 * Central idea: a matrix product W·x with W of type T first converts x to
 * T's companion "vec_dot type" (F16 for F16, BF16 for BF16, Q8_0 for
 * Q4_0/Q5_0/Q8_0/IQ4_NL, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants and
 * IQ4_XS, F32 for F32)
 * once per activation row, then takes dot products of whole rows. This is
 * what llama.cpp does, so logits match it to within summation order.
 *
 * The scalar table (`_ref` kernels, kernels/cpu/quant_ref.c) is the
 * reference every SIMD table is tested against. lms_kernels_get() picks the
 * best table for the running CPU once; the LMS_ISA environment variable
 * (scalar|avx2|avx512|neon) forces one.
 */
#ifndef LMS_KERNELS_H
#define LMS_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/qtypes.h"

typedef struct lms_type_traits {
    const char *name;    /* "q4_K", "f16", ... (lower case as ggml) */
    int64_t blck_size;   /* elements per block (1 for plain types) */
    size_t type_size;    /* bytes per block */
    bool is_quantized;
    int vec_dot_type;    /* activation type for dot products; -1 if none */
} lms_type_traits;

/* Traits of a type id; NULL for an id that is not a known type. */
const lms_type_traits *lms_type_get(int type);
/* Type id for a name ("q8_0", "Q4_K", case-insensitive); -1 if unknown. */
int lms_type_from_name(const char *name);
/* Bytes of a row of n elements, or 0 if n is not a multiple of the block
 * size or the size overflows. */
size_t lms_row_size(int type, int64_t n);

/* Dot product of one weight row (type T) with one activation row already in
 * T's vec_dot type; n elements, a multiple of the block size. */
typedef void (*lms_vec_dot_fn)(int64_t n, float *s, const void *w, const void *x);
/* A tile of dot products: s[t * lds + r] = vec_dot(n, W row r, x row t) for
 * r < n_rows, t < n_tok. W rows are ldw bytes apart, x rows (in the vec_dot
 * type) ldx bytes apart. Each weight block is unpacked once for several
 * tokens, each activation block loaded once for several rows: this is the
 * prompt (matrix-matrix) path. Any n_rows, n_tok >= 1; the caller picks
 * tile sizes that keep the tile's rows and tokens in L1/L2. Results equal
 * vec_dot's within float rounding (integer parts exact). */
typedef void (*lms_gemm_fn)(int64_t n, int64_t n_rows, int64_t n_tok, const void *w, size_t ldw,
                            const void *x, size_t ldx, float *s, size_t lds);
/* Decode (one token): s[r] = vec_dot(n, W row r, x) for r < n_rows, W rows
 * ldw bytes apart. Several rows share each activation load and one
 * horizontal reduction; any n_rows >= 1. Results equal vec_dot's within
 * float rounding (integer parts exact). */
typedef void (*lms_gemv_fn)(int64_t n, int64_t n_rows, const void *w, size_t ldw, const void *x,
                            float *s);
/* Convert n floats to a type (activation quantization, or quantize). */
typedef void (*lms_from_float_fn)(const float *x, void *y, int64_t n);
/* Convert n elements of a type to floats. */
typedef void (*lms_to_float_fn)(const void *x, float *y, int64_t n);

typedef struct lms_kernel_table {
    const char *isa;                              /* "scalar", "avx2", ... */
    lms_vec_dot_fn vec_dot[LMS_TYPE_COUNT];       /* by weight type */
    lms_from_float_fn from_float[LMS_TYPE_COUNT]; /* by destination type */
    lms_to_float_fn to_float[LMS_TYPE_COUNT];     /* by source type */
    lms_gemm_fn gemm[LMS_TYPE_COUNT];             /* by weight type; NULL: none,
                                                     matmul loops over vec_dot */
    lms_gemv_fn gemv[LMS_TYPE_COUNT];             /* by weight type; NULL: none,
                                                     decode loops over vec_dot */
} lms_kernel_table;

/* The scalar reference table (always complete for every supported type). */
const lms_kernel_table *lms_kernels_ref(void);
/* The table for this CPU (or LMS_ISA's choice); entries a SIMD table lacks
 * are filled from the reference table, so every vec_dot, from_float and
 * to_float entry is non-NULL for every supported type (gemm and gemv
 * entries stay NULL where the ISA has none). Thread-safe after the first call. */
const lms_kernel_table *lms_kernels_get(void);

#endif
