/*
 * test_simd.c - every SIMD kernel table against the scalar reference.
 *
 * For each ISA table this build has and this CPU runs (scalar, avx2,
 * avx512, neon) and each weight type:
 *   vec_dot    random blocks (every bit pattern of codes and sub-block
 *              scales; super-block scales drawn from normal values, 0,
 *              +-65504, subnormal halves and negatives), odd block counts,
 *              activations of tiny to large magnitude and all-zero blocks,
 *              must agree with the _ref kernel within 1e-5 of the sum of
 *              the magnitudes of the terms (the float rounding the two
 *              summation orders may differ by);
 *   from_float the activation types' blocks must be identical byte for
 *              byte, over ties, saturation, subnormals, inf and NaN;
 *   gemv       each row of 1 to 17 rows (padded row strides) against the
 *              _ref vec_dot, with vec_dot's tolerance;
 *   to_float   identical floats.
 * Runs under qemu for the NEON table (tools/check-neon).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp16.h"
#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels.h"
#include "kernels/kernels_impl.h"
#include "testutil.h"

static const char *const k_isa_names[] = {"scalar", "avx2", "avx512", "neon"};

static const int k_weight_types[] = {
    LMS_TYPE_F32,  LMS_TYPE_F16,  LMS_TYPE_BF16, LMS_TYPE_Q4_0, LMS_TYPE_Q4_1,
    LMS_TYPE_Q5_0, LMS_TYPE_Q5_1, LMS_TYPE_Q8_0, LMS_TYPE_Q2_K, LMS_TYPE_Q3_K,
    LMS_TYPE_Q4_K, LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, LMS_TYPE_IQ4_NL, LMS_TYPE_IQ4_XS,
};
#define N_WEIGHT_TYPES (int)(sizeof k_weight_types / sizeof k_weight_types[0])

/* Where a block keeps its f16 super-block scales (-1: none). */
typedef struct scale_fields {
    int type;
    int d, m; /* byte offsets of d and of m / dmin */
} scale_fields;

static const scale_fields k_scales[] = {
    {LMS_TYPE_Q4_0, offsetof(lms_block_q4_0, d), -1},
    {LMS_TYPE_Q4_1, offsetof(lms_block_q4_1, d), offsetof(lms_block_q4_1, m)},
    {LMS_TYPE_Q5_0, offsetof(lms_block_q5_0, d), -1},
    {LMS_TYPE_Q5_1, offsetof(lms_block_q5_1, d), offsetof(lms_block_q5_1, m)},
    {LMS_TYPE_Q8_0, offsetof(lms_block_q8_0, d), -1},
    {LMS_TYPE_Q2_K, offsetof(lms_block_q2_K, d), offsetof(lms_block_q2_K, dmin)},
    {LMS_TYPE_Q3_K, offsetof(lms_block_q3_K, d), -1},
    {LMS_TYPE_Q4_K, offsetof(lms_block_q4_K, d), offsetof(lms_block_q4_K, dmin)},
    {LMS_TYPE_Q5_K, offsetof(lms_block_q5_K, d), offsetof(lms_block_q5_K, dmin)},
    {LMS_TYPE_Q6_K, offsetof(lms_block_q6_K, d), -1},
    {LMS_TYPE_IQ4_NL, offsetof(lms_block_iq4_nl, d), -1},
    {LMS_TYPE_IQ4_XS, offsetof(lms_block_iq4_xs, d), -1},
};

static const scale_fields *scales_of(int type)
{
    for (size_t i = 0; i < sizeof k_scales / sizeof k_scales[0]; i++)
        if (k_scales[i].type == type)
            return &k_scales[i];
    return NULL;
}

/* ---- random data --------------------------------------------------------------- */

/* A finite half: mostly ordinary values, sometimes the extremes. `mode`
 * 0 = ordinary, 1 = any extreme, 2 = zero. */
static uint16_t rand_scale(uint64_t *seed, int mode)
{
    static const float extremes[] = {65504.0f,      -65504.0f, 5.9604645e-8f, -5.9604645e-8f,
                                     6.1035156e-5f, 1e-5f,     0.0f,          -1.0f};
    if (mode == 2)
        return 0;
    if (mode == 1) {
        const int k = (int)(tu_rand_u64(seed) % (sizeof extremes / sizeof extremes[0]));
        return lms_f32_to_f16(extremes[k]);
    }
    const float mag = tu_rand_f32(seed, -10.0f, 0.0f);
    const float v = exp2f(mag) * (tu_rand_u64(seed) & 1 ? -1.0f : 1.0f);
    return lms_f32_to_f16(v);
}

/* A half whose bits are random but never a signalling NaN (F16C and NEON
 * quiet those on conversion, as documented). */
static uint16_t rand_half_bits(uint64_t *seed)
{
    uint16_t h = (uint16_t)tu_rand_u64(seed);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
        h |= 0x200;
    return h;
}

/* n elements of a weight type: random bytes, then sane or extreme scales
 * (mode as rand_scale; -1 picks per block). */
static void rand_weights(uint64_t *seed, int type, void *buf, int64_t n, int mode)
{
    const lms_type_traits *tt = lms_type_get(type);
    const size_t bytes = lms_row_size(type, n);
    uint8_t *p = buf;
    if (type == LMS_TYPE_F32) {
        float *f = buf;
        for (int64_t i = 0; i < n; i++)
            f[i] = tu_rand_f32(seed, -2.0f, 2.0f);
        return;
    }
    if (type == LMS_TYPE_F16 || type == LMS_TYPE_BF16) {
        uint16_t *h = buf;
        for (int64_t i = 0; i < n; i++) {
            const float v = tu_rand_f32(seed, -2.0f, 2.0f);
            h[i] = type == LMS_TYPE_F16 ? lms_f32_to_f16(v) : lms_f32_to_bf16(v);
        }
        return;
    }
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)tu_rand_u64(seed);
    const scale_fields *sf = scales_of(type);
    for (int64_t b = 0; b < n / tt->blck_size; b++) {
        uint8_t *blk = p + (size_t)b * tt->type_size;
        const int md = mode >= 0 ? mode : (int)(tu_rand_u64(seed) % 8 == 0);
        const uint16_t d = rand_scale(seed, md);
        memcpy(blk + sf->d, &d, 2);
        if (sf->m >= 0) {
            const uint16_t m = rand_scale(seed, md);
            memcpy(blk + sf->m, &m, 2);
        }
    }
}


/* ---- vec_dot ------------------------------------------------------------------------ */

static int g_reported;

static void report(const char *fmt, ...)
{
    if (g_reported++ >= 20)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

/* One weight type, one ISA, one row length; returns the number of bad rows. */
static int check_vec_dot(const lms_kernel_table *k, int type, int64_t n, int mode, uint64_t *seed)
{
    const lms_type_traits *tt = lms_type_get(type);
    const int vt = tt->vec_dot_type;
    void *w = malloc(lms_row_size(type, n)); /* exact: ASan sees over-reads */
    void *xq = malloc(lms_row_size(vt, n));
    float *x = malloc((size_t)n * sizeof *x);
    int bad = 0;
    for (int rep = 0; rep < 4; rep++) {
        rand_weights(seed, type, w, n, mode);
        tu_rand_acts(seed, x, n);
        lms_kernels_ref()->from_float[vt](x, xq, n);
        float got = NAN, want = NAN;
        k->vec_dot[type](n, &got, w, xq);
        lms_kernels_ref()->vec_dot[type](n, &want, w, xq);
        const double mag = tu_dot_magnitude(type, n, w, xq);
        const double err = fabs((double)got - (double)want);
        const bool ok = isfinite(mag) ? err <= 1e-5 * mag + 1e-37 : got == want;
        if (!ok) {
            report("vec_dot %s/%s n=%lld mode=%d: got %.9g want %.9g (|terms| %.3g)\n", k->isa,
                   tt->name, (long long)n, mode, got, want, mag);
            bad++;
        }
    }
    free(w);
    free(xq);
    free(x);
    return bad;
}

static void test_vec_dot(void **state)
{
    (void)state;
    static const int64_t nblk[] = {1, 2, 3, 5, 8, 17, 33};
    static const int64_t nplain[] = {1, 5, 8, 15, 16, 17, 31, 33, 64, 100, 127, 129, 1000, 4099};
    uint64_t seed = 0x5eed1234;
    int bad = 0, runs = 0;
    for (size_t i = 0; i < sizeof k_isa_names / sizeof k_isa_names[0]; i++) {
        const lms_kernel_table *k = lms_kernels_for_isa(k_isa_names[i]);
        if (!k)
            continue;
        for (int t = 0; t < N_WEIGHT_TYPES; t++) {
            const int type = k_weight_types[t];
            const lms_type_traits *tt = lms_type_get(type);
            if (tt->blck_size == 1) {
                for (size_t j = 0; j < sizeof nplain / sizeof nplain[0]; j++, runs++)
                    bad += check_vec_dot(k, type, nplain[j], 0, &seed);
                continue;
            }
            for (size_t j = 0; j < sizeof nblk / sizeof nblk[0]; j++) {
                const int64_t n = nblk[j] * tt->blck_size;
                for (int mode = -1; mode <= 2; mode++, runs++)
                    bad += check_vec_dot(k, type, n, mode, &seed);
            }
        }
    }
    fprintf(stderr, "vec_dot: %d row sets checked, %d bad rows\n", runs, bad);
    assert_int_equal(bad, 0);
}

/* ---- gemv (decode: several rows against one activation row) ------------------------- */

/* n_rows rows of one type, `pad` spare bytes between rows, against the
 * reference vec_dot of each row; returns the number of bad rows. */
static int check_gemv(const lms_kernel_table *k, int type, int64_t n, int64_t n_rows, int mode,
                      uint64_t *seed)
{
    const lms_type_traits *tt = lms_type_get(type);
    const int vt = tt->vec_dot_type;
    const size_t rb = lms_row_size(type, n), ldw = rb + 16 * (size_t)(n_rows % 3);
    uint8_t *w = malloc(ldw * (size_t)n_rows);
    void *xq = malloc(lms_row_size(vt, n));
    float *x = malloc((size_t)n * sizeof *x);
    float *got = malloc((size_t)n_rows * sizeof *got);
    int bad = 0;
    memset(w, 0xA5, ldw * (size_t)n_rows);
    for (int64_t r = 0; r < n_rows; r++)
        rand_weights(seed, type, w + (size_t)r * ldw, n, mode);
    tu_rand_acts(seed, x, n);
    lms_kernels_ref()->from_float[vt](x, xq, n);
    k->gemv[type](n, n_rows, w, ldw, xq, got);
    for (int64_t r = 0; r < n_rows; r++) {
        float want = NAN;
        lms_kernels_ref()->vec_dot[type](n, &want, w + (size_t)r * ldw, xq);
        const double mag = tu_dot_magnitude(type, n, w + (size_t)r * ldw, xq);
        const double err = fabs((double)got[r] - (double)want);
        const bool ok = isfinite(mag) ? err <= 1e-5 * mag + 1e-37 : got[r] == want;
        if (!ok) {
            report("gemv %s/%s n=%lld rows=%lld row=%lld mode=%d: got %.9g want %.9g\n", k->isa,
                   tt->name, (long long)n, (long long)n_rows, (long long)r, mode, got[r], want);
            bad++;
        }
    }
    free(w);
    free(xq);
    free(x);
    free(got);
    return bad;
}

static void test_gemv(void **state)
{
    (void)state;
    /* 17 and 33 blocks: rows past the Q6_K multi-row kernel's limit; 67:
     * past the Q4_K kernel's 64-block activation chunk */
    static const int64_t nblk[] = {1, 2, 3, 8, 17, 33, 67};
    static const int64_t nrows[] = {1, 2, 3, 4, 5, 7, 8, 11, 16, 17};
    uint64_t seed = 0x6e3f5;
    int bad = 0, runs = 0;
    for (size_t i = 0; i < sizeof k_isa_names / sizeof k_isa_names[0]; i++) {
        const lms_kernel_table *k = lms_kernels_for_isa(k_isa_names[i]);
        if (!k)
            continue;
        for (int t = 0; t < N_WEIGHT_TYPES; t++) {
            const int type = k_weight_types[t];
            if (!k->gemv[type])
                continue;
            const int64_t bs = lms_type_get(type)->blck_size;
            for (size_t j = 0; j < sizeof nblk / sizeof nblk[0]; j++)
                for (size_t r = 0; r < sizeof nrows / sizeof nrows[0]; r++)
                    for (int mode = -1; mode <= 2; mode++, runs++)
                        bad += check_gemv(k, type, nblk[j] * (bs > 1 ? bs : 32), nrows[r], mode,
                                          &seed);
        }
    }
    fprintf(stderr, "gemv: %d row sets checked, %d bad rows\n", runs, bad);
    assert_int_equal(bad, 0);
}

/* ---- from_float ------------------------------------------------------------------- */

/* Inputs that exercise rounding and saturation: ties after scaling, huge,
 * subnormal, signed zeros, inf, NaN, a single nonzero, equal magnitudes of
 * both signs (Q8_K must keep the first). `kind` picks one. */
static void special_acts(uint64_t *seed, float *x, int64_t n, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        const float r = tu_rand_f32(seed, -1.0f, 1.0f);
        switch (kind) {
        case 0:
            x[i] = r;
            break;
        case 1:
            x[i] = (float)((int)(r * 127.0f)) + 0.5f;
            break; /* ties near amax 127 */
        case 2:
            x[i] = r * 1e-39f;
            break; /* subnormal floats */
        case 3:
            x[i] = r * 3e38f;
            break;
        case 4:
            x[i] = i % 7 == 3 ? INFINITY : r;
            break;
        case 5:
            x[i] = i % 5 == 1 ? NAN : r;
            break;
        case 6:
            x[i] = i % 32 == 9 ? r : 0.0f * r;
            break;
        case 7:
            x[i] = i % 3 == 0 ? -2.0f : (i % 3 == 1 ? 2.0f : r);
            break;
        case 8:
            x[i] = r * 1e-30f;
            break;
        default:
            x[i] = (float)i * 1e-3f - 0.5f;
            break;
        }
    }
    if (kind == 1 && n > 0)
        x[0] = 127.0f; /* amax 127: id = 1, so every .5 is a tie */
    if (kind == 4 && n > 5)
        x[5] = -INFINITY;
}

static const int k_act_types[] = {LMS_TYPE_F16,  LMS_TYPE_BF16, LMS_TYPE_Q8_0,
                                  LMS_TYPE_Q8_1, LMS_TYPE_Q8_K, LMS_TYPE_F32};

static void test_from_float(void **state)
{
    (void)state;
    uint64_t seed = 0xf00d;
    int bad = 0, runs = 0;
    for (size_t i = 0; i < sizeof k_isa_names / sizeof k_isa_names[0]; i++) {
        const lms_kernel_table *k = lms_kernels_for_isa(k_isa_names[i]);
        if (!k)
            continue;
        for (size_t t = 0; t < sizeof k_act_types / sizeof k_act_types[0]; t++) {
            const int type = k_act_types[t];
            const lms_type_traits *tt = lms_type_get(type);
            for (int64_t nb = 1; nb <= 40; nb += nb < 4 ? 1 : 9) {
                const int64_t n = tt->blck_size == 1 ? nb * 7 + 3 : nb * tt->blck_size;
                const size_t bytes = lms_row_size(type, n);
                float *x = malloc((size_t)n * sizeof *x);
                uint8_t *got = malloc(bytes), *want = malloc(bytes);
                for (int kind = 0; kind < 10; kind++, runs++) {
                    special_acts(&seed, x, n, kind);
                    memset(got, 0xAA, bytes);
                    memset(want, 0x55, bytes);
                    k->from_float[type](x, got, n);
                    lms_kernels_ref()->from_float[type](x, want, n);
                    if (memcmp(got, want, bytes) != 0) {
                        size_t at = 0;
                        while (got[at] == want[at])
                            at++;
                        report("from_float %s/%s n=%lld kind=%d: differs at byte %zu\n", k->isa,
                               tt->name, (long long)n, kind, at);
                        bad++;
                    }
                }
                free(x);
                free(got);
                free(want);
            }
        }
    }
    fprintf(stderr, "from_float: %d rows checked, %d differ\n", runs, bad);
    assert_int_equal(bad, 0);
}

/* ---- to_float ---------------------------------------------------------------------- */

static void test_to_float(void **state)
{
    (void)state;
    uint64_t seed = 0xbeef;
    int bad = 0, runs = 0;
    for (size_t i = 0; i < sizeof k_isa_names / sizeof k_isa_names[0]; i++) {
        const lms_kernel_table *k = lms_kernels_for_isa(k_isa_names[i]);
        if (!k)
            continue;
        for (int type = 0; type < LMS_TYPE_COUNT; type++) {
            const lms_type_traits *tt = lms_type_get(type);
            if (!tt || !k->to_float[type] || !lms_kernels_ref()->to_float[type])
                continue;
            for (int64_t nb = 1; nb <= 40; nb += 13) {
                const int64_t n = tt->blck_size == 1 ? nb * 9 + 2 : nb * tt->blck_size;
                const size_t bytes = lms_row_size(type, n);
                uint8_t *src = malloc(bytes);
                float *got = malloc((size_t)n * sizeof *got),
                      *want = malloc((size_t)n * sizeof *want);
                if (type == LMS_TYPE_F16 || type == LMS_TYPE_BF16) {
                    uint16_t *h = (uint16_t *)src;
                    for (int64_t e = 0; e < n; e++)
                        h[e] = rand_half_bits(&seed);
                } else if (type == LMS_TYPE_F32 || tt->vec_dot_type < 0) {
                    /* F32 and the activation-only types: from real values */
                    float *x = malloc((size_t)n * sizeof *x);
                    tu_rand_acts(&seed, x, n);
                    lms_kernels_ref()->from_float[type](x, src, n);
                    free(x);
                } else {
                    rand_weights(&seed, type, src, n, -1);
                }
                runs++;
                k->to_float[type](src, got, n);
                lms_kernels_ref()->to_float[type](src, want, n);
                if (memcmp(got, want, (size_t)n * sizeof *got) != 0) {
                    report("to_float %s/%s n=%lld differs\n", k->isa, tt->name, (long long)n);
                    bad++;
                }
                free(src);
                free(got);
                free(want);
            }
        }
    }
    fprintf(stderr, "to_float: %d rows checked, %d differ\n", runs, bad);
    assert_int_equal(bad, 0);
}

/* ---- which tables ran ------------------------------------------------------------------ */

static void test_isas_present(void **state)
{
    (void)state;
    fprintf(stderr, "kernel tables on this CPU:");
    for (size_t i = 0; i < sizeof k_isa_names / sizeof k_isa_names[0]; i++)
        if (lms_kernels_for_isa(k_isa_names[i]))
            fprintf(stderr, " %s", k_isa_names[i]);
    fprintf(stderr, " (default %s)\n", lms_kernels_get()->isa);
    assert_non_null(lms_kernels_for_isa("scalar"));
#if defined(LMS_HAVE_X86_KERNELS)
    if (lms_cpu_has_avx2())
        assert_non_null(lms_kernels_for_isa("avx2"));
    if (lms_cpu_has_avx512())
        assert_non_null(lms_kernels_for_isa("avx512"));
#endif
#if defined(LMS_HAVE_ARM_KERNELS)
    if (lms_cpu_has_neon_dotprod())
        assert_non_null(lms_kernels_for_isa("neon"));
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isas_present),
        cmocka_unit_test(test_vec_dot),
        cmocka_unit_test(test_gemv),
        cmocka_unit_test(test_from_float),
        cmocka_unit_test(test_to_float),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
