/*
 * test_sampler.c - the sampling chain and the stop-string matcher.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "engine/sampler.h"
#include "engine/stopstr.h"
#include "testutil.h"

#define NV 64

static void fill(float *l, uint64_t seed)
{
    for (int i = 0; i < NV; i++)
        l[i] = tu_rand_f32(&seed, -4.0f, 4.0f);
}

static lms_sampler_params greedy(void)
{
    lms_sampler_params p = lms_sampler_defaults();
    p.temperature = 0;
    return p;
}

static void test_greedy_and_prob(void **state)
{
    float l[NV];
    fill(l, 7);
    l[13] = 10.0f;
    lms_sampler_params p = greedy();
    lms_sampler *s = lms_sampler_create(&p, NV);
    float prob;
    assert_int_equal(lms_sampler_sample(s, l, &prob), 13);
    double z = 0;
    for (int i = 0; i < NV; i++)
        z += exp(l[i]);
    assert_float_equal(prob, exp(10.0) / z, 1e-5);
    lms_token_prob top[3];
    assert_int_equal(lms_sampler_top(s, top, 3), 3);
    assert_int_equal(top[0].id, 13);
    assert_true(top[0].logprob >= top[1].logprob && top[1].logprob >= top[2].logprob);
    /* ties go to the lowest id */
    for (int i = 0; i < NV; i++)
        l[i] = 1.0f;
    assert_int_equal(lms_sampler_sample(s, l, NULL), 0);
    lms_sampler_destroy(s);
}

static void test_seed_reproducible(void **state)
{
    float l[NV];
    fill(l, 11);
    lms_sampler_params p = lms_sampler_defaults();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 99;
    int32_t a[50], b[50];
    lms_sampler *s1 = lms_sampler_create(&p, NV), *s2 = lms_sampler_create(&p, NV);
    int distinct = 0;
    for (int i = 0; i < 50; i++) {
        a[i] = lms_sampler_sample(s1, l, NULL);
        b[i] = lms_sampler_sample(s2, l, NULL);
        distinct += i > 0 && a[i] != a[i - 1];
    }
    assert_memory_equal(a, b, sizeof a);
    assert_true(distinct > 5); /* it really samples */
    lms_sampler_destroy(s1);
    lms_sampler_destroy(s2);
}

/* p(i) proportional to 2^-i: entropy 2 bits */
static void geometric(float *l)
{
    for (int i = 0; i < NV; i++)
        l[i] = -(float)i * 0.6931472f;
}

static lms_sampler_params plain(void)
{
    lms_sampler_params p = lms_sampler_defaults();
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

/* typical-p keeps the tokens whose surprise is nearest the entropy: with
 * p = 1/2, 1/4, ... (H = 2 bits) token 1 is exactly typical */
static void test_typical_p(void **state)
{
    (void)state;
    float l[NV];
    geometric(l);
    lms_sampler_params p = plain();
    p.typical_p = 0.2f;
    lms_sampler *s = lms_sampler_create(&p, NV);
    for (int i = 0; i < 100; i++)
        assert_int_equal(lms_sampler_sample(s, l, NULL), 1);
    lms_sampler_destroy(s);
    /* 0.6: tokens 1, then 0 and 2 (tied in distance) join */
    p.typical_p = 0.6f;
    s = lms_sampler_create(&p, NV);
    int seen[NV] = {0};
    for (int i = 0; i < 400; i++)
        seen[lms_sampler_sample(s, l, NULL)]++;
    assert_true(seen[1] > 0 && seen[0] + seen[1] + seen[2] == 400);
    lms_sampler_destroy(s);
}

/* Mirostat drives the draws' surprise toward tau: a tiny tau ends on the
 * best token, a large one spreads; it replaces top-k */
static void test_mirostat(void **state)
{
    (void)state;
    float l[NV];
    geometric(l);
    for (int v = 1; v <= 2; v++) {
        lms_sampler_params p = plain();
        p.mirostat = v;
        p.mirostat_tau = 0.05f;
        p.mirostat_eta = 0.5f;
        lms_sampler *s = lms_sampler_create(&p, NV);
        int best = 0;
        for (int i = 0; i < 500; i++)
            best += lms_sampler_sample(s, l, NULL) == 0;
        lms_sampler_destroy(s);
        if (best < 450)
            fail_msg("mirostat v%d, tau 0.05: token 0 drawn %d of 500 times", v, best);
        p.mirostat_tau = 6.0f;
        p.top_k = 1; /* not applied under Mirostat */
        s = lms_sampler_create(&p, NV);
        int seen[NV] = {0}, distinct = 0;
        for (int i = 0; i < 500; i++)
            seen[lms_sampler_sample(s, l, NULL)]++;
        for (int i = 0; i < NV; i++)
            distinct += seen[i] > 0;
        lms_sampler_destroy(s);
        if (distinct < 5)
            fail_msg("mirostat v%d, tau 6: only %d distinct tokens", v, distinct);
    }
    lms_sampler_params p = plain();
    char err[128];
    p.mirostat = 3;
    assert_true(lms_sampler_params_check(&p, err, sizeof err) < 0);
    p.mirostat = 0;
    p.typical_p = 0.0f;
    assert_true(lms_sampler_params_check(&p, err, sizeof err) < 0);
}

static void test_top_k_top_p_min_p(void **state)
{
    float l[NV];
    for (int i = 0; i < NV; i++)
        l[i] = (float)i * 0.1f; /* the best is 63, then 62, ... */
    lms_sampler_params p = lms_sampler_defaults();
    p.temperature = 5.0f; /* flat: without filters anything could come */
    p.top_k = 3;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    lms_sampler *s = lms_sampler_create(&p, NV);
    for (int i = 0; i < 200; i++)
        assert_true(lms_sampler_sample(s, l, NULL) >= 61);
    lms_sampler_destroy(s);
    /* top-p: one token holds 99% of the mass */
    l[5] = 20.0f;
    p.top_k = 0;
    p.top_p = 0.9f;
    s = lms_sampler_create(&p, NV);
    for (int i = 0; i < 100; i++)
        assert_int_equal(lms_sampler_sample(s, l, NULL), 5);
    lms_sampler_destroy(s);
    /* min-p: keep tokens within 1/10 of the best's probability */
    for (int i = 0; i < NV; i++)
        l[i] = i < 4 ? 0.0f : -10.0f;
    p.top_p = 1.0f;
    p.min_p = 0.1f;
    s = lms_sampler_create(&p, NV);
    for (int i = 0; i < 200; i++)
        assert_true(lms_sampler_sample(s, l, NULL) < 4);
    lms_sampler_destroy(s);
}

static void test_penalties(void **state)
{
    float l[NV] = {0};
    l[1] = 2.0f;
    l[2] = 1.9f;
    lms_sampler_params p = greedy();
    p.repeat_penalty = 1.5f; /* 2.0 / 1.5 < 1.9 */
    lms_sampler *s = lms_sampler_create(&p, NV);
    lms_sampler_accept(s, 1);
    assert_int_equal(lms_sampler_sample(s, l, NULL), 2);
    lms_sampler_destroy(s);
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.06f; /* twice seen: 2.0 - 0.12 < 1.9 */
    s = lms_sampler_create(&p, NV);
    lms_sampler_accept(s, 1);
    assert_int_equal(lms_sampler_sample(s, l, NULL), 1);
    lms_sampler_accept(s, 1);
    assert_int_equal(lms_sampler_sample(s, l, NULL), 2);
    lms_sampler_destroy(s);
    /* the window forgets old tokens */
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.5f;
    p.penalty_last_n = 2;
    s = lms_sampler_create(&p, NV);
    lms_sampler_accept(s, 1);
    lms_sampler_accept(s, 7);
    lms_sampler_accept(s, 8);
    assert_int_equal(lms_sampler_sample(s, l, NULL), 1);
    lms_sampler_destroy(s);
}

static void test_logit_bias(void **state)
{
    float l[NV];
    fill(l, 11);
    l[13] = 10.0f;
    lms_sampler_params p = greedy();
    p.bias[p.n_bias++] = (lms_logit_bias){13, -100.0f}; /* banned */
    p.bias[p.n_bias++] = (lms_logit_bias){40, 50.0f};   /* pushed to the top */
    lms_sampler *s = lms_sampler_create(&p, NV);
    assert_int_equal(lms_sampler_sample(s, l, NULL), 40);
    lms_token_prob top[NV];
    assert_int_equal(lms_sampler_top(s, top, NV), NV);
    assert_true(isinf(top[NV - 1].logprob) && top[NV - 1].id == 13);
    lms_sampler_destroy(s);
    /* sampling with temperature never draws a banned token */
    p = lms_sampler_defaults();
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    for (int i = 0; i < NV - 1; i++)
        p.bias[p.n_bias++] = (lms_logit_bias){i, -100.0f};
    s = lms_sampler_create(&p, NV);
    for (int k = 0; k < 50; k++)
        assert_int_equal(lms_sampler_sample(s, l, NULL), NV - 1);
    lms_sampler_destroy(s);
    char err[128];
    p.bias[0].bias = 101.0f;
    assert_int_equal(lms_sampler_params_check(&p, err, sizeof err), LMS_ERR_INVAL);
    assert_non_null(strstr(err, "logit bias"));
}

static void test_param_checks(void **state)
{
    char err[128];
    lms_sampler_params p = lms_sampler_defaults();
    assert_int_equal(lms_sampler_params_check(&p, err, sizeof err), 0);
    p.temperature = NAN;
    assert_int_equal(lms_sampler_params_check(&p, err, sizeof err), LMS_ERR_INVAL);
    assert_non_null(strstr(err, "temperature"));
    p = lms_sampler_defaults();
    p.top_p = 1.5f;
    assert_int_equal(lms_sampler_params_check(&p, err, sizeof err), LMS_ERR_INVAL);
    assert_non_null(strstr(err, "top_p"));
    p = lms_sampler_defaults();
    p.top_k = -1;
    assert_int_equal(lms_sampler_params_check(&p, err, sizeof err), LMS_ERR_INVAL);
    p = lms_sampler_defaults();
    p.repeat_penalty = 0;
    assert_int_equal(lms_sampler_params_check(&p, err, sizeof err), LMS_ERR_INVAL);
}

/* Feeds pieces; returns what was released, and whether a stop hit. */
static bool feed_all(lms_stopstr *m, const char *const *pieces, int n, char *out)
{
    size_t len = 0;
    bool hit = false;
    for (int i = 0; i < n && !hit; i++) {
        const char *o;
        size_t no;
        hit = lms_stopstr_feed(m, pieces[i], strlen(pieces[i]), &o, &no);
        memcpy(out + len, o, no);
        len += no;
    }
    if (!hit) {
        const char *o;
        size_t no;
        lms_stopstr_flush(m, &o, &no);
        memcpy(out + len, o, no);
        len += no;
    }
    out[len] = 0;
    return hit;
}

static void test_stop_strings(void **state)
{
    const char *stops[] = {"</end>", "STOP"};
    char out[256];
    lms_stopstr m;
    /* a stop split over pieces is never shown, not even its first half */
    assert_int_equal(lms_stopstr_init(&m, stops, 2), 0);
    const char *p1[] = {"Hello <", "/en", "d> more"};
    assert_true(feed_all(&m, p1, 3, out));
    assert_string_equal(out, "Hello ");
    lms_stopstr_deinit(&m);
    /* a false start is released once it cannot be a stop */
    assert_int_equal(lms_stopstr_init(&m, stops, 2), 0);
    const char *p2[] = {"a </e", "x> b ST", "OR"};
    assert_false(feed_all(&m, p2, 3, out));
    assert_string_equal(out, "a </ex> b STOR");
    lms_stopstr_deinit(&m);
    /* no stops: pass through */
    assert_int_equal(lms_stopstr_init(&m, NULL, 0), 0);
    const char *p3[] = {"x", "y"};
    assert_false(feed_all(&m, p3, 2, out));
    assert_string_equal(out, "xy");
    lms_stopstr_deinit(&m);
    /* too many stops is an error */
    const char *many[LMS_MAX_STOP + 1];
    for (int i = 0; i <= LMS_MAX_STOP; i++)
        many[i] = "s";
    assert_int_equal(lms_stopstr_init(&m, many, LMS_MAX_STOP + 1), LMS_ERR_LIMIT);
}

/* ---- the whole-vocabulary path against a reference ---------------------- */

/* The chain without top-k as it reads in sampler.h, over the whole
 * vocabulary sorted (best first, ties by id): top-p, min-p, temperature,
 * one splitmix64 draw per sample (the sampler's random source). */
typedef struct ref_cand {
    int32_t id;
    float logit;
} ref_cand;

static int ref_desc(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

/* Sorts the vocabulary into c (once per logits). */
static void ref_sort(const float *l, int32_t n, ref_cand *c)
{
    for (int32_t i = 0; i < n; i++)
        c[i] = (ref_cand){i, l[i]};
    qsort(c, (size_t)n, sizeof *c, ref_desc);
}

static int32_t ref_sample(const lms_sampler_params *p, const ref_cand *c, int32_t n, uint64_t *rng,
                          double *probs)
{
    uint64_t z = (*rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    double u = (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
    double sum = 0;
    for (int32_t i = 0; i < n; i++)
        sum += probs[i] = exp((double)c[i].logit - c[0].logit);
    int32_t keep = n;
    double acc = 0;
    for (int32_t i = 0; i < n && p->top_p < 1.0f; i++)
        if ((acc += probs[i] / sum) >= p->top_p) {
            keep = i + 1;
            break;
        }
    for (int32_t i = 1; i < keep && p->min_p > 0.0f; i++)
        if (probs[i] < p->min_p) {
            keep = i;
            break;
        }
    double sum_t = 0;
    for (int32_t i = 0; i < keep; i++)
        sum_t += probs[i] = exp(((double)c[i].logit - c[0].logit) / p->temperature);
    u *= sum_t;
    for (int32_t i = 0; i < keep; i++) {
        if (u < probs[i])
            return c[i].id;
        u -= probs[i];
    }
    return c[keep - 1].id;
}

/* Without top-k the sampler sorts only the best part of the vocabulary
 * and falls back to a full sort when a cut or the draw goes past it; its
 * tokens must be the reference's (sums are added in another order, so a
 * draw within rounding of a boundary may differ: allow a few in 1000s).
 * The shapes: flat logits around 0 (most within the sorted span), peaked
 * ones (few), a best token far above a crowd (the draw and the top-p cut
 * fall past the sorted part: the fallback), and banned (-inf) tokens. */
static void test_whole_vocab_matches_reference(void **state)
{
    enum { N = 8000, DRAWS = 40 };
    float *l = malloc(N * sizeof *l);
    ref_cand *c = malloc(N * sizeof *c);
    double *probs = malloc(N * sizeof *probs);
    assert_non_null(l);
    assert_non_null(c);
    assert_non_null(probs);
    static const float temps[] = {0.3f, 1.0f, 3.0f};
    static const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.9999f};
    static const float min_ps[] = {0.0f, 0.05f, 1e-9f};
    int n_draws = 0, n_diff = 0;
    uint64_t seed = 1234;
    for (int shape = 0; shape < 4; shape++)
        for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++)
            for (size_t pi = 0; pi < sizeof top_ps / sizeof top_ps[0]; pi++)
                for (size_t mi = 0; mi < sizeof min_ps / sizeof min_ps[0]; mi++) {
                    for (int i = 0; i < N; i++) {
                        const float r = tu_rand_f32(&seed, 0.0f, 1.0f);
                        l[i] = shape == 0   ? r * 8.0f - 4.0f
                               : shape == 1 ? r * r * r * 40.0f
                               : shape == 2 ? r
                                            : (i % 3 ? r * 30.0f : -INFINITY);
                    }
                    if (shape == 2)
                        l[N / 2] = 17.5f; /* alone within the span of 16 */
                    ref_sort(l, N, c);
                    lms_sampler_params p = lms_sampler_defaults();
                    p.top_k = 0;
                    p.temperature = temps[ti];
                    p.top_p = top_ps[pi];
                    p.min_p = min_ps[mi];
                    p.seed = seed;
                    lms_sampler *s = lms_sampler_create(&p, N);
                    assert_non_null(s);
                    uint64_t rng = p.seed;
                    for (int d = 0; d < DRAWS; d++) {
                        const int32_t a = lms_sampler_sample(s, l, NULL);
                        const int32_t b = ref_sample(&p, c, N, &rng, probs);
                        assert_true(a >= 0 && a < N && l[a] > -INFINITY);
                        n_diff += a != b;
                        n_draws++;
                    }
                    lms_sampler_destroy(s);
                }
    fprintf(stderr, "whole vocabulary: %d of %d draws differ from the reference\n", n_diff,
            n_draws);
    assert_true(n_diff * 1000 <= n_draws);
    free(l);
    free(c);
    free(probs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_prob), cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_top_k_top_p_min_p), cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_typical_p), cmocka_unit_test(test_mirostat),
        cmocka_unit_test(test_param_checks), cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_logit_bias), cmocka_unit_test(test_whole_vocab_matches_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
