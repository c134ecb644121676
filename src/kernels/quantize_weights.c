/*
 * quantize_weights.c - float rows to weight quantization blocks.
 *
 * Central idea: every format stores integer codes times a scale, some plus
 * an offset, so two least-squares fitters do all the numerical work:
 *
 *   fit_scale   x ~ s * L       L integer in [lo, hi]   Q4_0 Q5_0 blocks, Q3_K
 *                                                       Q6_K sub-blocks, and the
 *                                                       grids of sub-block scales
 *   fit_affine  x ~ a * L + b   L integer in [0, nmax]  Q4_1 Q5_1 blocks, Q2_K
 *                               (K-quants: b <= 0)      Q4_K Q5_K sub-blocks
 *
 * Each tries a fan of candidate scales around the one that maps the block's
 * extreme values onto the ends of the code range, solves the least-squares
 * scale (and offset) for each candidate's codes, keeps the best, then
 * improves it (code by code for fit_scale, alternating re-rounding and
 * re-solving for fit_affine).
 *
 * A K-quant super-block is done in three steps: fit every sub-block; fit
 * the super-block scale (and min scale) to the sub-blocks' scales (mins) on
 * their integer grid; then, per sub-block, try the integer scale and min
 * codes next to the rounded ones, measuring the error the decoder will
 * really give (with the f16 super-block scales), and keep the best. Every
 * element is finally re-rounded against the stored scales, so the codes are
 * the nearest ones for what the decoder sees.
 *
 * IQ4_NL and IQ4_XS code each element as an index into a fixed table of 16
 * non-uniform values (lms_iq4_values), so rounding is "nearest table value"
 * (a lookup, iq4_nearest) and the block fitter is fit_iq4: a fan of
 * candidate scales mapping the extreme value near either end of the table,
 * the least-squares scale for each candidate's indices, then re-rounding
 * and re-solving while that helps. IQ4_XS then fits its super-block scale
 * to the sub-block scales on the 6-bit grid and picks each sub-block's
 * code as the K-quants do.
 *
 * The error minimised is the plain squared error: for activations of equal
 * variance the error of a dot product is proportional to it. (Importance
 * weights from activation statistics would enter as the `w` arrays.)
 *
 * Packing into the GGUF layouts is lms_pack_* (cpu/quant_ref.c). Called by
 * the quantize command (app/cmd_quantize.c) and through the weight types'
 * from_float entries of the kernel tables.
 */
#include "kernels/quantize_weights.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/ckd.h"
#include "base/err.h"
#include "base/fp16.h"
#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels.h"

#define FIT_MAX 32          /* longest run a fitter sees: one 32-element block */
#define F16_MAX 65504.0f
#define TINY 1e-30f         /* blocks with no value above this are all zero */
#define FAN 5               /* candidate scales: the anchor moved by k * 0.2 codes, |k| <= FAN */

/* Element weights: all equal (see the file comment). */
static const float k_ones[LMS_QK_K] = {[0 ... LMS_QK_K - 1] = 1.0f};

/* ---- helpers -------------------------------------------------------------------- */

/* v as the f16 value it will be stored as, finite (saturating at 65504). */
static float f16_value(float v)
{
    v = fminf(fmaxf(v, -F16_MAX), F16_MAX);
    return lms_f16_to_f32(lms_f32_to_f16(v));
}

static void codes_copy(int8_t *dst, const int8_t *src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = src[i];
}

/* The value of largest magnitude (the first one on ties). */
static float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            m = x[i];
        }
    }
    return m;
}

/* Codes x against the decoder's grid dl * L - ml (dl and ml computed as the
 * decoder computes them), nearest L in [lo, hi]; returns the weighted
 * squared error of the decoded values. */
static double code_fixed(int n, const float *x, const float *w, float dl, float ml, int lo,
                         int hi, int8_t *L)
{
    double err = 0.0;
    for (int i = 0; i < n; i++) {
        int c = dl != 0.0f ? lms_round_clamp((x[i] + ml) / dl, lo, hi) : (lo > 0 ? lo : 0);
        L[i] = (int8_t)c;
        double diff = (double)(dl * c - ml) - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

/* ---- fit_scale: x ~ s * L ---------------------------------------------------------
 *
 * For codes L the best s is sxl / sll (sxl = sum w x L, sll = sum w L^2) and
 * the error is sum w x^2 - sxl^2 / sll: the larger the "gain" sxl^2 / sll,
 * the better the codes. */

typedef struct ls_sums {
    double xl, ll;
} ls_sums;

static double gain(ls_sums s)
{
    return s.ll > 0.0 ? s.xl * s.xl / s.ll : 0.0;
}

static ls_sums round_codes(int n, const float *x, const float *w, float iscale, int lo, int hi,
                           int8_t *L)
{
    float xl = 0.0f, ll = 0.0f; /* at most 32 terms: float is plenty */
    for (int i = 0; i < n; i++) {
        const int c = lms_round_clamp(iscale * x[i], lo, hi);
        L[i] = (int8_t)c;
        xl += w[i] * x[i] * (float)c;
        ll += w[i] * (float)(c * c);
    }
    return (ls_sums){xl, ll};
}

/* Moves single codes to the nearest for the current best scale while that
 * raises the gain (coordinate descent; converges in a few passes). */
static ls_sums refine_codes(int n, const float *x, const float *w, int lo, int hi, int8_t *L,
                            ls_sums s)
{
    for (int pass = 0; pass < 8; pass++) {
        bool changed = false;
        for (int i = 0; i < n; i++) {
            if (s.ll <= 0.0 || s.xl == 0.0)
                return s;
            int c = lms_round_clamp(x[i] * (float)(s.ll / s.xl), lo, hi);
            if (c == L[i])
                continue;
            ls_sums t = {s.xl + (double)w[i] * x[i] * (c - L[i]),
                         s.ll + (double)w[i] * (c * c - L[i] * L[i])};
            if (gain(t) > gain(s)) {
                L[i] = (int8_t)c;
                s = t;
                changed = true;
            }
        }
        if (!changed)
            break;
    }
    return s;
}

/* Least-squares x ~ s * L with L in [lo, hi] (lo <= 0 <= hi, n <= FIT_MAX).
 * Candidates: scales mapping the value of largest magnitude to each nonzero
 * end of the range, moved by up to one code in steps of 0.2. Returns s, and
 * 0 with L = 0 for a block of zeros. */
static float fit_scale(int n, const float *x, const float *w, int lo, int hi, int8_t *L)
{
    assert(n <= FIT_MAX && lo <= 0 && hi >= 0);
    const float m = signed_absmax(x, n);
    const int ends[2] = {lo, hi};
    int8_t t[FIT_MAX];
    ls_sums best = {0.0, 0.0};

    for (int i = 0; i < n; i++)
        L[i] = 0;
    if (!(fabsf(m) >= TINY))
        return 0.0f;
    for (int e = 0; e < 2; e++) {
        if (ends[e] == 0)
            continue;
        for (int k = -FAN; k <= FAN; k++) {
            ls_sums s = round_codes(n, x, w, (ends[e] + 0.2f * k) / m, lo, hi, t);
            if (gain(s) > gain(best)) {
                best = s;
                codes_copy(L, t, n);
            }
        }
    }
    best = refine_codes(n, x, w, lo, hi, L, best);
    return best.ll > 0.0 ? (float)(best.xl / best.ll) : 0.0f;
}

/* ---- fit_affine: x ~ a * L + b ------------------------------------------------------- */

typedef struct affine {
    float a, b;
    double err; /* weighted squared error */
} affine;

/* Weighted least squares for (a, b) given the codes; b is kept <= 0 when
 * b_nonpos (the K-quants store -b as an unsigned min). */
static affine solve_affine(int n, const float *x, const float *w, const int8_t *L, bool b_nonpos)
{
    float fw = 0, fl = 0, fll = 0, fx = 0, fxl = 0; /* at most 32 terms */
    for (int i = 0; i < n; i++) {
        fw += w[i];
        fl += w[i] * (float)L[i];
        fll += w[i] * (float)(L[i] * L[i]);
        fx += w[i] * x[i];
        fxl += w[i] * x[i] * (float)L[i];
    }
    const double sw = fw, sl = fl, sll = fll, sx = fx, sxl = fxl;
    const double det = sw * sll - sl * sl;
    double a = 0.0, b = sw > 0.0 ? sx / sw : 0.0;
    if (det > 0.0) {
        a = (sw * sxl - sx * sl) / det;
        b = (sll * sx - sl * sxl) / det;
    }
    if (b_nonpos && b > 0.0) {
        b = 0.0;
        a = sll > 0.0 ? sxl / sll : 0.0;
    }
    affine r = {(float)a, (float)b, 0.0};
    float err = 0.0f;
    for (int i = 0; i < n; i++) {
        const float diff = r.a * (float)L[i] + r.b - x[i];
        err += w[i] * diff * diff;
    }
    r.err = err;
    return r;
}

/* Least-squares x ~ a * L + b, L in [0, nmax] (n <= FIT_MAX). Candidates:
 * scales spanning [min, max] with nmax - 1 .. nmax + 1 steps; then the best
 * is improved by re-rounding the codes and re-solving until no gain. */
static affine fit_affine(int n, const float *x, const float *w, int nmax, bool b_nonpos,
                         int8_t *L)
{
    assert(n <= FIT_MAX);
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (b_nonpos && lo > 0.0f)
        lo = 0.0f;
    for (int i = 0; i < n; i++)
        L[i] = 0;
    affine best = solve_affine(n, x, w, L, b_nonpos);
    if (!(hi - lo >= TINY))
        return best;

    int8_t t[FIT_MAX];
    for (int k = -FAN; k <= FAN; k++) {
        const float iscale = (nmax + 0.2f * k) / (hi - lo);
        for (int i = 0; i < n; i++)
            t[i] = (int8_t)lms_round_clamp((x[i] - lo) * iscale, 0, nmax);
        affine r = solve_affine(n, x, w, t, b_nonpos);
        if (r.err < best.err) {
            best = r;
            codes_copy(L, t, n);
        }
    }
    for (int it = 0; it < 8 && best.a > 0.0f; it++) {
        for (int i = 0; i < n; i++)
            t[i] = (int8_t)lms_round_clamp((x[i] - best.b) / best.a, 0, nmax);
        affine r = solve_affine(n, x, w, t, b_nonpos);
        if (!(r.err < best.err))
            break;
        best = r;
        codes_copy(L, t, n);
    }
    return best;
}

/* ---- 32-element formats ------------------------------------------------------------ */

typedef struct lq_spec {
    int lo, hi;  /* code range */
    bool affine; /* has an offset m (Q4_1, Q5_1) */
    size_t blk_bytes;
    void (*pack)(const lms_lq_block *in, void *blk);
} lq_spec;

static const lq_spec k_q4_0 = {-8, 7, false, sizeof(lms_block_q4_0), lms_pack_q4_0};
static const lq_spec k_q5_0 = {-16, 15, false, sizeof(lms_block_q5_0), lms_pack_q5_0};
static const lq_spec k_q4_1 = {0, 15, true, sizeof(lms_block_q4_1), lms_pack_q4_1};
static const lq_spec k_q5_1 = {0, 31, true, sizeof(lms_block_q5_1), lms_pack_q5_1};

static void quantize_lq(const lq_spec *spec, const float *x, lms_lq_block *b)
{
    const float *w = k_ones;
    if (spec->affine) {
        affine f = fit_affine(32, x, w, spec->hi, false, b->q);
        b->d = f16_value(f.a);
        b->m = f16_value(f.b);
    } else {
        b->d = f16_value(fit_scale(32, x, w, spec->lo, spec->hi, b->q));
        b->m = 0.0f;
    }
    /* The decoder computes q * d + m, which is d * q - (-m) exactly. */
    code_fixed(32, x, w, b->d, -b->m, spec->lo, spec->hi, b->q);
}

static void quantize_lq_row(const lq_spec *spec, const float *x, void *y, int64_t n)
{
    assert(n % 32 == 0);
    for (int64_t i = 0; i < n / 32; i++) {
        lms_lq_block b;
        quantize_lq(spec, x + i * 32, &b);
        spec->pack(&b, (uint8_t *)y + (size_t)i * spec->blk_bytes);
    }
}

void lms_quantize_row_q8_0(const float *x, void *vy, int64_t n)
{
    assert(n % LMS_QK8_0 == 0);
    lms_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / LMS_QK8_0; i++) {
        const float *xb = x + i * LMS_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < LMS_QK8_0; j++)
            amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = lms_f32_to_f16(fminf(d, F16_MAX));
        for (int j = 0; j < LMS_QK8_0; j++) {
            float r = roundf(xb[j] * id);
            y[i].qs[j] = (int8_t)(r == r ? fminf(fmaxf(r, -127.0f), 127.0f) : 0.0f);
        }
    }
}

void lms_quantize_row_q4_0(const float *x, void *y, int64_t n)
{
    quantize_lq_row(&k_q4_0, x, y, n);
}

void lms_quantize_row_q4_1(const float *x, void *y, int64_t n)
{
    quantize_lq_row(&k_q4_1, x, y, n);
}

void lms_quantize_row_q5_0(const float *x, void *y, int64_t n)
{
    quantize_lq_row(&k_q5_0, x, y, n);
}

void lms_quantize_row_q5_1(const float *x, void *y, int64_t n)
{
    quantize_lq_row(&k_q5_1, x, y, n);
}

/* ---- K-quants ------------------------------------------------------------------------ */

/* How a K-quant format codes a super-block (see lms_kq_block). */
typedef struct kq_spec {
    int sub;          /* sub-block width */
    int q_lo, q_hi;   /* element codes */
    int sc_lo, sc_hi; /* sub-block scale codes */
    int mn_hi;        /* sub-block min codes are [0, mn_hi]; 0: no mins */
    size_t blk_bytes;
    void (*pack)(const lms_kq_block *in, void *blk);
} kq_spec;

static const kq_spec k_q2_K = {16, 0, 3, 0, 15, 15, sizeof(lms_block_q2_K), lms_pack_q2_K};
static const kq_spec k_q3_K = {16, -4, 3, -32, 31, 0, sizeof(lms_block_q3_K), lms_pack_q3_K};
static const kq_spec k_q4_K = {32, 0, 15, 0, 63, 63, sizeof(lms_block_q4_K), lms_pack_q4_K};
static const kq_spec k_q5_K = {32, 0, 31, 0, 63, 63, sizeof(lms_block_q5_K), lms_pack_q5_K};
static const kq_spec k_q6_K = {16, -32, 31, -128, 127, 0, sizeof(lms_block_q6_K), lms_pack_q6_K};

/* Step 1: fits each sub-block alone. scale[j], min[j] (value = scale * L -
 * min), and the weights of their errors: an error e in scale[j] costs about
 * e^2 * sum w L^2, one in min[j] about e^2 * sum w. */
static void kq_fit_subs(const kq_spec *spec, const float *x, float *scale, float *min,
                        float *w_scale, float *w_min)
{
    const float *w = k_ones;
    int8_t L[FIT_MAX];
    for (int j = 0, s0 = 0; s0 < LMS_QK_K; j++, s0 += spec->sub) {
        if (spec->mn_hi) {
            affine f = fit_affine(spec->sub, x + s0, w, spec->q_hi, true, L);
            scale[j] = f.a;
            min[j] = -f.b;
        } else {
            scale[j] = fit_scale(spec->sub, x + s0, w, spec->q_lo, spec->q_hi, L);
            min[j] = 0.0f;
        }
        w_scale[j] = w_min[j] = 0.0f;
        for (int i = 0; i < spec->sub; i++) {
            w_scale[j] += w[i] * L[i] * L[i];
            w_min[j] += w[i];
        }
    }
}

/* Step 3 for one sub-block: the scale and min codes within one step of the
 * rounded ones that give the least decoded error; fills the element codes. */
static void kq_pick_codes(const kq_spec *spec, const float *x, float d, float dmin, float scale,
                          float min, int16_t *sc_out, int16_t *mn_out, int8_t *q)
{
    const int sc0 = d != 0.0f ? lms_round_clamp(scale / d, spec->sc_lo, spec->sc_hi) : 0;
    const int mn0 = dmin != 0.0f ? lms_round_clamp(min / dmin, 0, spec->mn_hi) : 0;
    const int mn_step = spec->mn_hi && dmin != 0.0f ? 1 : 0;
    double best = INFINITY;
    int8_t t[FIT_MAX];

    for (int sc = sc0 - 1; sc <= sc0 + 1; sc++) {
        for (int mn = mn0 - mn_step; mn <= mn0 + mn_step; mn++) {
            if (sc < spec->sc_lo || sc > spec->sc_hi || mn < 0 || mn > spec->mn_hi)
                continue;
            double err = code_fixed(spec->sub, x, k_ones, d * sc, dmin * mn, spec->q_lo,
                                    spec->q_hi, t);
            if (err < best || (sc == sc0 && mn == mn0 && err == best)) {
                best = err;
                *sc_out = (int16_t)sc;
                *mn_out = (int16_t)mn;
                codes_copy(q, t, spec->sub);
            }
        }
    }
}

static void quantize_kq(const kq_spec *spec, const float *x, lms_kq_block *out)
{
    const int n_sub = LMS_QK_K / spec->sub;
    float scale[16], min[16], w_scale[16], w_min[16];
    int8_t codes[16];

    memset(out, 0, sizeof *out);
    out->sub = spec->sub;
    kq_fit_subs(spec, x, scale, min, w_scale, w_min);
    /* Step 2: the super-block scales, on the integer grids of the codes. */
    out->d = f16_value(fit_scale(n_sub, scale, w_scale, spec->sc_lo, spec->sc_hi, codes));
    if (spec->mn_hi)
        out->dmin = f16_value(fit_scale(n_sub, min, w_min, 0, spec->mn_hi, codes));
    for (int j = 0; j < n_sub; j++)
        kq_pick_codes(spec, x + j * spec->sub, out->d, out->dmin, scale[j], min[j],
                      &out->sc[j], &out->mn[j], out->q + j * spec->sub);
}

static void quantize_kq_row(const kq_spec *spec, const float *x, void *y, int64_t n)
{
    assert(n % LMS_QK_K == 0);
    for (int64_t i = 0; i < n / LMS_QK_K; i++) {
        lms_kq_block b;
        quantize_kq(spec, x + i * LMS_QK_K, &b);
        spec->pack(&b, (uint8_t *)y + (size_t)i * spec->blk_bytes);
    }
}

void lms_quantize_row_q2_K(const float *x, void *y, int64_t n)
{
    quantize_kq_row(&k_q2_K, x, y, n);
}

void lms_quantize_row_q3_K(const float *x, void *y, int64_t n)
{
    quantize_kq_row(&k_q3_K, x, y, n);
}

void lms_quantize_row_q4_K(const float *x, void *y, int64_t n)
{
    quantize_kq_row(&k_q4_K, x, y, n);
}

void lms_quantize_row_q5_K(const float *x, void *y, int64_t n)
{
    quantize_kq_row(&k_q5_K, x, y, n);
}

void lms_quantize_row_q6_K(const float *x, void *y, int64_t n)
{
    quantize_kq_row(&k_q6_K, x, y, n);
}

/* ---- IQ4_NL / IQ4_XS ------------------------------------------------------------------
 *
 * Nearest table value of t: the midpoints between neighbouring values are
 * multiples of 0.5, so every half-unit interval [k/2, (k+1)/2) lies on one
 * side of each midpoint and one lookup by k = floor(2t) finds the index.
 * (At a midpoint itself both neighbours are equally near.) */

#define IQ4_LUT_LO (-256) /* floor(2t) below -127 * 2 ... */
#define IQ4_LUT_N 512     /* ... and above 113 * 2 clamp to the ends */
#define IQ4_FAN 7         /* candidates: the anchor moved by up to 7 table units */

static uint8_t g_iq4_lut[IQ4_LUT_N];
static pthread_once_t g_iq4_once = PTHREAD_ONCE_INIT;

static void iq4_lut_init(void)
{
    for (int k = 0; k < IQ4_LUT_N; k++) {
        const float t = (float)(k + IQ4_LUT_LO) * 0.5f + 0.25f; /* inside the interval */
        int best = 0;
        for (int i = 1; i < 16; i++)
            if (fabsf(t - lms_iq4_values[i]) < fabsf(t - lms_iq4_values[best]))
                best = i;
        g_iq4_lut[k] = (uint8_t)best;
    }
}

/* Index of the table value nearest t (NaN gives the lowest). lms_round_clamp
 * of 2t - 0.5 is floor(2t) but at integers, where it may name the interval
 * below: the same index, or at a midpoint an equally near one. */
static inline int iq4_nearest(float t)
{
    const int k = lms_round_clamp(2.0f * t - 0.5f, IQ4_LUT_LO, IQ4_LUT_LO + IQ4_LUT_N - 1);
    return g_iq4_lut[k - IQ4_LUT_LO];
}

/* Indices for x ~ s * value with iscale = 1 / s, and their sums. */
static ls_sums iq4_round(int n, const float *x, const float *w, float iscale, uint8_t *idx)
{
    float xl = 0.0f, ll = 0.0f; /* at most 32 terms */
    for (int i = 0; i < n; i++) {
        idx[i] = (uint8_t)iq4_nearest(iscale * x[i]);
        const float v = lms_iq4_values[idx[i]];
        xl += w[i] * x[i] * v;
        ll += w[i] * v * v;
    }
    return (ls_sums){xl, ll};
}

/* Least-squares x ~ s * value[idx] over n <= FIT_MAX elements. Candidates
 * map the value of largest magnitude to each end of the table (-127, 113)
 * moved by up to IQ4_FAN units; the best is then re-rounded against its own
 * least-squares scale while that raises the gain. Returns s (0, with every
 * index naming the value 1, for a block of zeros) and in *sll the sum of
 * the squared values s multiplies: the weight of an error in s, for the
 * IQ4_XS super-block fit. */
static float fit_iq4(int n, const float *x, const float *w, uint8_t *idx, double *sll)
{
    assert(n <= FIT_MAX);
    pthread_once(&g_iq4_once, iq4_lut_init);
    const float m = signed_absmax(x, n);
    uint8_t t[FIT_MAX];
    ls_sums best = {0.0, 0.0};
    for (int i = 0; i < n; i++)
        idx[i] = 8;
    *sll = 0.0;
    if (!(fabsf(m) >= TINY))
        return 0.0f;
    const float ends[2] = {lms_iq4_values[0], lms_iq4_values[15]};
    for (int e = 0; e < 2; e++) {
        for (int k = -IQ4_FAN; k <= IQ4_FAN; k++) {
            ls_sums s = iq4_round(n, x, w, (ends[e] + (float)k) / m, t);
            if (gain(s) > gain(best)) {
                best = s;
                memcpy(idx, t, (size_t)n);
            }
        }
    }
    for (int it = 0; it < 8 && best.xl != 0.0; it++) {
        ls_sums s = iq4_round(n, x, w, (float)(best.ll / best.xl), t);
        if (!(gain(s) > gain(best)))
            break;
        best = s;
        memcpy(idx, t, (size_t)n);
    }
    *sll = best.ll;
    return best.ll > 0.0 ? (float)(best.xl / best.ll) : 0.0f;
}

/* Indices against the decoder's values dl * value (dl as the decoder
 * computes it); returns the squared error of the decoded values. */
static double iq4_code_fixed(int n, const float *x, float dl, int8_t *q)
{
    double err = 0.0;
    for (int i = 0; i < n; i++) {
        const int k = dl != 0.0f ? iq4_nearest(x[i] / dl) : 8;
        q[i] = lms_iq4_values[k];
        const double diff = (double)(dl * q[i]) - x[i];
        err += diff * diff;
    }
    return err;
}

void lms_quantize_row_iq4_nl(const float *x, void *vy, int64_t n)
{
    assert(n % LMS_QK4_NL == 0);
    lms_block_iq4_nl *y = vy;
    for (int64_t i = 0; i < n / LMS_QK4_NL; i++) {
        const float *xb = x + i * LMS_QK4_NL;
        uint8_t idx[LMS_QK4_NL];
        double sll;
        lms_lq_block b;
        b.d = f16_value(fit_iq4(LMS_QK4_NL, xb, k_ones, idx, &sll));
        b.m = 0.0f;
        iq4_code_fixed(LMS_QK4_NL, xb, b.d, b.q);
        lms_pack_iq4_nl(&b, &y[i]);
    }
}

/* Sub-block scales on the grid d * c, c in -32..31: d fitted to the
 * sub-blocks' own scales (weighted by the squared values each multiplies),
 * then per sub-block the code within one step of the rounded one whose
 * decoded error is least. */
static void quantize_iq4_xs(const float *x, lms_kq_block *out)
{
    float scale[8], w_scale[8];
    int8_t codes[8];
    memset(out, 0, sizeof *out);
    out->sub = 32;
    for (int j = 0; j < 8; j++) {
        uint8_t idx[32];
        double sll;
        scale[j] = fit_iq4(32, x + 32 * j, k_ones, idx, &sll);
        w_scale[j] = (float)sll;
    }
    out->d = f16_value(fit_scale(8, scale, w_scale, -32, 31, codes));
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        const int c0 = out->d != 0.0f ? lms_round_clamp(scale[j] / out->d, -32, 31) : 0;
        double best = INFINITY;
        int8_t t[32];
        for (int c = c0 - 1; c <= c0 + 1; c++) {
            if (c < -32 || c > 31)
                continue;
            const double err = iq4_code_fixed(32, xs, out->d * (float)c, t);
            /* !(err >= best): a NaN error (NaN input) still stores valid codes */
            if (!(err >= best) || (c == c0 && err == best)) {
                best = err;
                out->sc[j] = (int16_t)c;
                codes_copy(out->q + 32 * j, t, 32);
            }
        }
    }
}

void lms_quantize_row_iq4_xs(const float *x, void *vy, int64_t n)
{
    assert(n % LMS_QK_K == 0);
    lms_block_iq4_xs *y = vy;
    pthread_once(&g_iq4_once, iq4_lut_init);
    for (int64_t i = 0; i < n / LMS_QK_K; i++) {
        lms_kq_block b;
        quantize_iq4_xs(x + i * LMS_QK_K, &b);
        lms_pack_iq4_xs(&b, &y[i]);
    }
}

/* ---- by type ---------------------------------------------------------------------------- */

static lms_from_float_fn quantizer(int type)
{
    switch (type) {
    case LMS_TYPE_F32: return lms_from_float_f32_ref;
    case LMS_TYPE_F16: return lms_from_float_f16_ref;
    case LMS_TYPE_BF16: return lms_from_float_bf16_ref;
    case LMS_TYPE_Q8_0: return lms_quantize_row_q8_0;
    case LMS_TYPE_Q4_0: return lms_quantize_row_q4_0;
    case LMS_TYPE_Q4_1: return lms_quantize_row_q4_1;
    case LMS_TYPE_Q5_0: return lms_quantize_row_q5_0;
    case LMS_TYPE_Q5_1: return lms_quantize_row_q5_1;
    case LMS_TYPE_Q2_K: return lms_quantize_row_q2_K;
    case LMS_TYPE_Q3_K: return lms_quantize_row_q3_K;
    case LMS_TYPE_Q4_K: return lms_quantize_row_q4_K;
    case LMS_TYPE_Q5_K: return lms_quantize_row_q5_K;
    case LMS_TYPE_Q6_K: return lms_quantize_row_q6_K;
    case LMS_TYPE_IQ4_NL: return lms_quantize_row_iq4_nl;
    case LMS_TYPE_IQ4_XS: return lms_quantize_row_iq4_xs;
    default: return NULL;
    }
}

bool lms_quantize_supported(int type)
{
    return quantizer(type) != NULL;
}

int lms_quantize_row(int type, const float *x, void *y, int64_t n)
{
    lms_from_float_fn q = quantizer(type);
    if (!q)
        return LMS_ERR_UNSUPPORTED;
    if (n < 0 || n % lms_type_get(type)->blck_size != 0)
        return LMS_ERR_INVAL;
    q(x, y, n);
    return LMS_OK;
}

int lms_quantize_rms_error(int type, const float *x, int64_t n, double *rms)
{
    size_t row_bytes = lms_row_size(type, n), float_bytes;
    if (!quantizer(type))
        return LMS_ERR_UNSUPPORTED;
    if (n <= 0 || row_bytes == 0 || lms_ckd_mul(&float_bytes, (size_t)n, sizeof(float)))
        return LMS_ERR_INVAL;
    void *blocks = malloc(row_bytes);
    float *back = malloc(float_bytes);
    if (!blocks || !back) {
        free(blocks);
        free(back);
        return LMS_ERR_NOMEM;
    }
    lms_quantize_row(type, x, blocks, n);
    lms_kernels_ref()->to_float[type](blocks, back, n);
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double diff = (double)x[i] - back[i];
        sum += diff * diff;
    }
    free(blocks);
    free(back);
    *rms = sqrt(sum / (double)n);
    return LMS_OK;
}
