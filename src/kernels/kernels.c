/*
 * kernels.c - tensor type traits, row sizes, and the choice of kernel table.
 *
 * Central idea: everything that varies by type is data (k_traits, and one
 * lms_kernel_table of function pointers per instruction set). The scalar
 * table is complete and constant; a SIMD table may be partial, and the
 * dispatcher merges it over the scalar one once (pthread_once), so callers
 * see one table with no NULL entry for a supported type.
 *
 * Called by everything that touches tensor data: the GGUF reader (type ids,
 * row sizes), matmul and the engine (kernels), the quantize command.
 */
#include "kernels/kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "base/ckd.h"
#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels_impl.h"
#include "kernels/quantize_weights.h"

/* ---- type traits -------------------------------------------------------------- */

/* Names are ggml's (they appear in tools' output and in file-type names). */
static const lms_type_traits k_traits[LMS_TYPE_COUNT] = {
    [LMS_TYPE_F32] = {"f32", 1, 4, false, LMS_TYPE_F32},
    [LMS_TYPE_F16] = {"f16", 1, 2, false, LMS_TYPE_F16},
    [LMS_TYPE_BF16] = {"bf16", 1, 2, false, LMS_TYPE_BF16},
    [LMS_TYPE_Q4_0] = {"q4_0", LMS_QK4_0, sizeof(lms_block_q4_0), true, LMS_TYPE_Q8_0},
    [LMS_TYPE_Q4_1] = {"q4_1", LMS_QK4_1, sizeof(lms_block_q4_1), true, LMS_TYPE_Q8_1},
    [LMS_TYPE_Q5_0] = {"q5_0", LMS_QK5_0, sizeof(lms_block_q5_0), true, LMS_TYPE_Q8_0},
    [LMS_TYPE_Q5_1] = {"q5_1", LMS_QK5_1, sizeof(lms_block_q5_1), true, LMS_TYPE_Q8_1},
    [LMS_TYPE_Q8_0] = {"q8_0", LMS_QK8_0, sizeof(lms_block_q8_0), true, LMS_TYPE_Q8_0},
    [LMS_TYPE_Q8_1] = {"q8_1", LMS_QK8_1, sizeof(lms_block_q8_1), true, -1},
    [LMS_TYPE_Q2_K] = {"q2_K", LMS_QK_K, sizeof(lms_block_q2_K), true, LMS_TYPE_Q8_K},
    [LMS_TYPE_Q3_K] = {"q3_K", LMS_QK_K, sizeof(lms_block_q3_K), true, LMS_TYPE_Q8_K},
    [LMS_TYPE_Q4_K] = {"q4_K", LMS_QK_K, sizeof(lms_block_q4_K), true, LMS_TYPE_Q8_K},
    [LMS_TYPE_Q5_K] = {"q5_K", LMS_QK_K, sizeof(lms_block_q5_K), true, LMS_TYPE_Q8_K},
    [LMS_TYPE_Q6_K] = {"q6_K", LMS_QK_K, sizeof(lms_block_q6_K), true, LMS_TYPE_Q8_K},
    [LMS_TYPE_Q8_K] = {"q8_K", LMS_QK_K, sizeof(lms_block_q8_K), true, -1},
    [LMS_TYPE_IQ4_NL] = {"iq4_nl", LMS_QK4_NL, sizeof(lms_block_iq4_nl), true, LMS_TYPE_Q8_0},
    [LMS_TYPE_IQ4_XS] = {"iq4_xs", LMS_QK_K, sizeof(lms_block_iq4_xs), true, LMS_TYPE_Q8_K},
    [LMS_TYPE_I8] = {"i8", 1, 1, false, -1},
    [LMS_TYPE_I16] = {"i16", 1, 2, false, -1},
    [LMS_TYPE_I32] = {"i32", 1, 4, false, -1},
    [LMS_TYPE_I64] = {"i64", 1, 8, false, -1},
    [LMS_TYPE_F64] = {"f64", 1, 8, false, -1},
};

const lms_type_traits *lms_type_get(int type)
{
    if (type < 0 || type >= LMS_TYPE_COUNT || !k_traits[type].name)
        return NULL;
    return &k_traits[type];
}

int lms_type_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int t = 0; t < LMS_TYPE_COUNT; t++)
        if (k_traits[t].name && strcasecmp(k_traits[t].name, name) == 0)
            return t;
    return -1;
}

size_t lms_row_size(int type, int64_t n)
{
    const lms_type_traits *tt = lms_type_get(type);
    size_t bytes;
    if (!tt || n < 0 || n % tt->blck_size != 0)
        return 0;
    if (lms_ckd_mul(&bytes, (uint64_t)(n / tt->blck_size), tt->type_size))
        return 0;
    return bytes;
}

/* ---- the scalar table ------------------------------------------------------------ */

static const lms_kernel_table k_ref = {
    .isa = "scalar",
    .vec_dot = {
        [LMS_TYPE_F32] = lms_vec_dot_f32_ref,
        [LMS_TYPE_F16] = lms_vec_dot_f16_ref,
        [LMS_TYPE_BF16] = lms_vec_dot_bf16_ref,
        [LMS_TYPE_Q4_0] = lms_vec_dot_q4_0_q8_0_ref,
        [LMS_TYPE_Q5_0] = lms_vec_dot_q5_0_q8_0_ref,
        [LMS_TYPE_Q8_0] = lms_vec_dot_q8_0_q8_0_ref,
        [LMS_TYPE_Q4_1] = lms_vec_dot_q4_1_q8_1_ref,
        [LMS_TYPE_Q5_1] = lms_vec_dot_q5_1_q8_1_ref,
        [LMS_TYPE_Q2_K] = lms_vec_dot_q2_K_q8_K_ref,
        [LMS_TYPE_Q3_K] = lms_vec_dot_q3_K_q8_K_ref,
        [LMS_TYPE_Q4_K] = lms_vec_dot_q4_K_q8_K_ref,
        [LMS_TYPE_Q5_K] = lms_vec_dot_q5_K_q8_K_ref,
        [LMS_TYPE_Q6_K] = lms_vec_dot_q6_K_q8_K_ref,
        [LMS_TYPE_IQ4_NL] = lms_vec_dot_iq4_nl_q8_0_ref,
        [LMS_TYPE_IQ4_XS] = lms_vec_dot_iq4_xs_q8_K_ref,
    },
    /* Activation types convert activations; weight types run the quantizer. */
    .from_float = {
        [LMS_TYPE_F32] = lms_from_float_f32_ref,
        [LMS_TYPE_F16] = lms_from_float_f16_ref,
        [LMS_TYPE_BF16] = lms_from_float_bf16_ref,
        [LMS_TYPE_Q8_0] = lms_from_float_q8_0_ref,
        [LMS_TYPE_Q8_1] = lms_from_float_q8_1_ref,
        [LMS_TYPE_Q8_K] = lms_from_float_q8_K_ref,
        [LMS_TYPE_Q4_0] = lms_quantize_row_q4_0,
        [LMS_TYPE_Q4_1] = lms_quantize_row_q4_1,
        [LMS_TYPE_Q5_0] = lms_quantize_row_q5_0,
        [LMS_TYPE_Q5_1] = lms_quantize_row_q5_1,
        [LMS_TYPE_Q2_K] = lms_quantize_row_q2_K,
        [LMS_TYPE_Q3_K] = lms_quantize_row_q3_K,
        [LMS_TYPE_Q4_K] = lms_quantize_row_q4_K,
        [LMS_TYPE_Q5_K] = lms_quantize_row_q5_K,
        [LMS_TYPE_Q6_K] = lms_quantize_row_q6_K,
        [LMS_TYPE_IQ4_NL] = lms_quantize_row_iq4_nl,
        [LMS_TYPE_IQ4_XS] = lms_quantize_row_iq4_xs,
    },
    .to_float = {
        [LMS_TYPE_F32] = lms_to_float_f32_ref,
        [LMS_TYPE_F16] = lms_to_float_f16_ref,
        [LMS_TYPE_BF16] = lms_to_float_bf16_ref,
        [LMS_TYPE_Q4_0] = lms_to_float_q4_0_ref,
        [LMS_TYPE_Q4_1] = lms_to_float_q4_1_ref,
        [LMS_TYPE_Q5_0] = lms_to_float_q5_0_ref,
        [LMS_TYPE_Q5_1] = lms_to_float_q5_1_ref,
        [LMS_TYPE_Q8_0] = lms_to_float_q8_0_ref,
        [LMS_TYPE_Q8_1] = lms_to_float_q8_1_ref,
        [LMS_TYPE_Q2_K] = lms_to_float_q2_K_ref,
        [LMS_TYPE_Q3_K] = lms_to_float_q3_K_ref,
        [LMS_TYPE_Q4_K] = lms_to_float_q4_K_ref,
        [LMS_TYPE_Q5_K] = lms_to_float_q5_K_ref,
        [LMS_TYPE_Q6_K] = lms_to_float_q6_K_ref,
        [LMS_TYPE_Q8_K] = lms_to_float_q8_K_ref,
        [LMS_TYPE_IQ4_NL] = lms_to_float_iq4_nl_ref,
        [LMS_TYPE_IQ4_XS] = lms_to_float_iq4_xs_ref,
    },
};

const lms_kernel_table *lms_kernels_ref(void)
{
    return &k_ref;
}

/* ---- CPU features ------------------------------------------------------------------ */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* CPUID feature bits plus the OS's consent (XGETBV) to save the vector
 * state; read directly so that gcc and clang builds agree. */
typedef struct x86_features {
    bool avx2, fma, f16c, bmi2, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
} x86_features;

static x86_features x86_detect(void)
{
    x86_features f = {0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE */
        return f;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    bool ymm = (xlo & 0x6) == 0x6, zmm = ymm && (xlo & 0xe0) == 0xe0;
    f.fma = ymm && (c & (1u << 12));
    f.f16c = ymm && (c & (1u << 29));
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return f;
    f.avx2 = ymm && (b & (1u << 5));
    f.bmi2 = b & (1u << 8);
    f.avx512f = zmm && (b & (1u << 16));
    f.avx512dq = zmm && (b & (1u << 17));
    f.avx512bw = zmm && (b & (1u << 30));
    f.avx512vl = zmm && (b & (1u << 31));
    f.avx512vnni = zmm && (c & (1u << 11));
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        f.avx512bf16 = zmm && (a & (1u << 5));
    return f;
}
#endif

bool lms_cpu_has_avx2(void)
{
#if defined(__x86_64__) || defined(__i386__)
    x86_features f = x86_detect();
    return f.avx2 && f.fma && f.f16c && f.bmi2;
#else
    return false;
#endif
}

bool lms_cpu_has_avx512(void)
{
#if defined(__x86_64__) || defined(__i386__)
    x86_features f = x86_detect();
    return lms_cpu_has_avx2() && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq &&
           f.avx512vnni && f.avx512bf16;
#else
    return false;
#endif
}

bool lms_cpu_has_neon_dotprod(void)
{
#if defined(__aarch64__) && defined(__linux__) && defined(HWCAP_ASIMDDP)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return false;
#endif
}

/* ---- dispatch -------------------------------------------------------------------------- */

typedef struct isa_entry {
    const char *name;
    const lms_kernel_table *(*table)(void);
    bool (*cpu_has)(void);
} isa_entry;

static bool cpu_has_scalar(void)
{
    return true;
}

/* Registered ISAs, best first; the first the CPU supports is the default.
 * Scalar stays last. A new table: its getter in kernels_impl.h, a line here
 * under the build guard of its files. */
static const isa_entry k_isas[] = {
#ifdef LMS_HAVE_X86_KERNELS
    {"avx512", lms_kernels_avx512, lms_cpu_has_avx512},
    {"avx2", lms_kernels_avx2, lms_cpu_has_avx2},
#endif
#ifdef LMS_HAVE_ARM_KERNELS
    {"neon", lms_kernels_neon, lms_cpu_has_neon_dotprod},
#endif
    {"scalar", lms_kernels_ref, cpu_has_scalar},
};

#define N_ISAS (sizeof k_isas / sizeof k_isas[0])

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static lms_kernel_table g_tables[N_ISAS]; /* merged over k_ref; written once */
static bool g_usable[N_ISAS];             /* registered and supported by the CPU */
static const lms_kernel_table *g_chosen;

/* dst = src with every NULL entry taken from the scalar table. */
static void merge_over_ref(lms_kernel_table *dst, const lms_kernel_table *src)
{
    *dst = *src;
    for (int t = 0; t < LMS_TYPE_COUNT; t++) {
        if (!dst->vec_dot[t])
            dst->vec_dot[t] = k_ref.vec_dot[t];
        if (!dst->from_float[t])
            dst->from_float[t] = k_ref.from_float[t];
        if (!dst->to_float[t])
            dst->to_float[t] = k_ref.to_float[t];
    }
}

static int isa_index(const char *name)
{
    for (size_t i = 0; i < N_ISAS; i++)
        if (strcasecmp(k_isas[i].name, name) == 0)
            return (int)i;
    return -1;
}

static void kernels_init(void)
{
    int best = -1;
    for (size_t i = 0; i < N_ISAS; i++) {
        g_usable[i] = k_isas[i].cpu_has();
        if (!g_usable[i])
            continue;
        merge_over_ref(&g_tables[i], k_isas[i].table());
        if (best < 0)
            best = (int)i;
    }
    const char *want = getenv("LMS_ISA");
    if (want && *want) {
        int i = isa_index(want);
        if (i >= 0 && g_usable[i])
            best = i;
        else
            fprintf(stderr, "lmserv: LMS_ISA=%s is not available in this build or on this "
                            "CPU; using %s kernels\n", want, k_isas[best].name);
    }
    g_chosen = &g_tables[best];
}

const lms_kernel_table *lms_kernels_get(void)
{
    pthread_once(&g_once, kernels_init);
    return g_chosen;
}

const lms_kernel_table *lms_kernels_for_isa(const char *isa)
{
    pthread_once(&g_once, kernels_init);
    int i = isa ? isa_index(isa) : -1;
    return i >= 0 && g_usable[i] ? &g_tables[i] : NULL;
}
