/*
 * quant_avx2.c - the AVX2 kernel table (AVX2 + FMA + F16C + BMI2, i.e.
 * Haswell / Zen 1 and later).
 *
 * The kernels themselves live in quant_x86.h, shared with the AVX-512 file;
 * compiled here they use vpmaddubsw/vpmaddwd for the int8 products. This
 * file only lists them, with the Q4_K/Q6_K tile kernels of gemm_avx2.c, the
 * IQ4_XS one of iq4_avx2.c and the Q8_0 decode kernel (four rows at a time)
 * of gemv_avx2.c.
 * Chosen by kernels.c when lms_cpu_has_avx2() and no better table is
 * usable, or with LMS_ISA=avx2.
 */
#include "kernels/cpu/x86/gemm_x86.h"
#include "kernels/cpu/x86/gemv_avx2.h"
#include "kernels/cpu/x86/iq4_x86.h"
#include "kernels/cpu/x86/quant_x86.h"
#include "kernels/kernels_impl.h"

/* clang-format off */
static const lms_kernel_table k_avx2 = {
    .isa = "avx2",
    .vec_dot = {
        [LMS_TYPE_F32] = vec_dot_f32_x86,
        [LMS_TYPE_F16] = vec_dot_f16_x86,
        [LMS_TYPE_BF16] = vec_dot_bf16_x86,
        [LMS_TYPE_Q4_0] = vec_dot_q4_0_q8_0,
        [LMS_TYPE_Q5_0] = vec_dot_q5_0_q8_0,
        [LMS_TYPE_Q8_0] = vec_dot_q8_0_q8_0,
        [LMS_TYPE_Q4_1] = vec_dot_q4_1_q8_1,
        [LMS_TYPE_Q5_1] = vec_dot_q5_1_q8_1,
        [LMS_TYPE_Q2_K] = vec_dot_q2_K_q8_K,
        [LMS_TYPE_Q3_K] = vec_dot_q3_K_q8_K,
        [LMS_TYPE_Q4_K] = vec_dot_q4_K_q8_K,
        [LMS_TYPE_Q5_K] = vec_dot_q5_K_q8_K,
        [LMS_TYPE_Q6_K] = vec_dot_q6_K_q8_K,
        [LMS_TYPE_IQ4_NL] = vec_dot_iq4_nl_q8_0,
        [LMS_TYPE_IQ4_XS] = vec_dot_iq4_xs_q8_K,
    },
    X86_CONVERSIONS
    .gemm = {
        [LMS_TYPE_Q4_K] = gemm_q4_K_q8_K_avx2,
        [LMS_TYPE_Q6_K] = gemm_q6_K_q8_K_avx2,
        [LMS_TYPE_IQ4_XS] = gemm_iq4_xs_q8_K_avx2,
    },
    .gemv = {
        [LMS_TYPE_Q8_0] = gemv_q8_0_q8_0_avx2,
    },
};
/* clang-format on */

const lms_kernel_table *lms_kernels_avx2(void) { return &k_avx2; }
