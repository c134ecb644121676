/*
 * kernels_impl.h - internal to the kernels layer: how per-ISA kernel tables
 * are registered with the dispatcher in kernels.c, and the CPU feature
 * tests that decide which of them may run.
 *
 * A SIMD kernel file set (cpu/x86/ *_avx2.c, ...) provides one getter that
 * returns its table; entries it leaves NULL are filled from the scalar
 * table by the dispatcher, so a table may start with a single kernel.
 * To register one, add its line to k_isas[] in kernels.c (marked there).
 */
#ifndef LMS_KERNELS_IMPL_H
#define LMS_KERNELS_IMPL_H

#include <stdbool.h>

#include "kernels/kernels.h"

/* ---- per-ISA tables (defined by the SIMD files, when they exist) ---------- */

#ifdef LMS_HAVE_X86_KERNELS
const lms_kernel_table *lms_kernels_avx2(void);
const lms_kernel_table *lms_kernels_avx512(void);
#endif
#ifdef LMS_HAVE_ARM_KERNELS
const lms_kernel_table *lms_kernels_neon(void);
#endif

/* ---- CPU features (false on other architectures) -------------------------- */

/* AVX2 + FMA + F16C + BMI2: what cpu/x86/ *_avx2.c are compiled for. */
bool lms_cpu_has_avx2(void);
/* The above plus AVX-512 F/BW/VL/DQ/VNNI/BF16 (cpu/x86/ *_avx512.c). */
bool lms_cpu_has_avx512(void);
/* ARMv8.2 dot product (cpu/arm/ *_neon.c). */
bool lms_cpu_has_neon_dotprod(void);

/* ---- lookup ----------------------------------------------------------------- */

/* The complete (ref-filled) table of a named ISA ("scalar", "avx2", ...),
 * or NULL when that ISA is not registered in this build or the CPU lacks
 * it. For tests and benchmarks that compare ISAs; the engine uses
 * lms_kernels_get(). Thread-safe. */
const lms_kernel_table *lms_kernels_for_isa(const char *isa);

#endif
