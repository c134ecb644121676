/*
 * test_attention.c - the forward pass's attention paths against each other
 * (attention.c): the per-row path in portable C and in AVX-512 (where the CPU
 * and head size allow) against the reference tiled path, for f16, q8_0 and
 * q4_0 caches; and, within each path, a decode step of single-token tiles
 * scheduled by chunk (threads sharing each tile), by heads (threads taking
 * whole KV heads of the tiles: the default below LMS_ATT_HEADS_MAX cached
 * bytes, which the runs here set to 0 or leave alone) or by group (a tile
 * per thread, with at least two tiles a thread) bit-identical to the same
 * rows scheduled by head (a step that also holds a multi-token tile), which
 * is what keeps batched generation equal to solo generation. The AVX-512
 * path's quantized-cache scores are also checked equal with and without
 * AVX512-VNNI (LMS_ATT_NO_VNNI).
 *
 * Contexts are long enough that the prompts cross several ATT_CHUNKs.
 * Token ids are random (fixed seed); the models are the synthetic ones of
 * the shared test data, and one written here (lms_synth_write) with the
 * head size of the benchmark models (128; the shared ones have 64 and 8),
 * for the AVX-512 kernels specialized per head size (f16, q8_0 and q4_0
 * caches). The q8_0 and q4_0 caches need head sizes of a multiple of 32
 * (not stories260K's 8).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "engine/forward_int.h"
#include "engine/kv_cache.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#define N_CTX 400
#define P0 300 /* seq 0's prompt: past two chunks */
#define P1 45  /* seq 1's prompt */
#define N_ROWS 6

typedef struct att_case {
    const char *model;
    int kv_type;
    const lms_synth_shape *shape; /* written to a temporary file when set */
} att_case;

/* Qwen3's layout (GQA groups of 2, 128-wide heads), small */
static const lms_synth_shape hd128 = {"qwen3-hd128", "qwen3", 256, 2, 4, 2, 128, 512, 512,
                                      N_CTX, 1000000.0f, 1e-6f, 1, 0};

static const att_case cases[] = {
    {"llama-synth-f32", 0, NULL},          {"llama-synth-f32", LMS_TYPE_Q8_0, NULL},
    {"llama-synth-f32", LMS_TYPE_Q4_0, NULL}, {"qwen3-synth-f16", 0, NULL},
    {"qwen3-synth-f16", LMS_TYPE_Q8_0, NULL}, {"qwen3-synth-f16", LMS_TYPE_Q4_0, NULL},
    {"stories260K", 0, NULL},              {"qwen3-hd128", 0, &hd128},
    {"qwen3-hd128", LMS_TYPE_Q8_0, &hd128}, {"qwen3-hd128", LMS_TYPE_Q4_0, &hd128},
};

#define N_CASES (sizeof cases / sizeof cases[0])

/* "f16", "q8_0", "q4_0" */
static const char *kv_name(int kv_type)
{
    return lms_type_get(kv_type ? kv_type : LMS_TYPE_F16)->name;
}

static uint32_t rng_next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* One forward call of n tokens: (seq, pos) pairs; logits of every row, or
 * of the last alone (last_only). */
static void step_rows(lms_ctx *c, lms_kv_seq **seqs, const int32_t *pos, const int32_t *toks,
                      int32_t n, float *logits, bool last_only)
{
    bool want[64];
    for (int32_t i = 0; i < n; i++)
        want[i] = !last_only || i == n - 1;
    lms_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .logits = want};
    assert_int_equal(lms_forward(c, &b, logits), 0);
}

static void step(lms_ctx *c, lms_kv_seq **seqs, const int32_t *pos, const int32_t *toks,
                 int32_t n, float *logits)
{
    step_rows(c, seqs, pos, toks, n, logits, false);
}

/* Prefill of seq s over [from, to) in chunks of 64; logits of the last
 * (the head runs for each chunk's last row alone: the other rows' logits
 * were never compared, and under the sanitizers the head over every row of
 * a 50257-token vocabulary was most of this test's time). */
static void prefill(lms_ctx *c, lms_kv_seq *s, const int32_t *toks, int32_t from, int32_t to,
                    float *last, int32_t nv)
{
    int32_t pos[64];
    lms_kv_seq *seqs[64];
    float *lg = malloc((size_t)nv * sizeof *lg);
    for (int32_t p = from; p < to; p += 64) {
        int32_t n = to - p < 64 ? to - p : 64;
        for (int32_t i = 0; i < n; i++) {
            pos[i] = p + i;
            seqs[i] = s;
        }
        step_rows(c, seqs, pos, toks + p, n, lg, true);
        if (p + n == to)
            memcpy(last, lg, (size_t)nv * sizeof *lg);
    }
    free(lg);
}

/* Rows: seq 0's prompt end; a decode step of seqs 0 and 1 (single-token
 * tiles: by chunk or by heads, or by group with one thread); then a step
 * with seq 0's next token and seq 1's next, plus (split: false) seq 1's one
 * after, a two-token tile that sends the whole step by head, or (split:
 * true) seq 2's first, so the step goes by chunk, by heads or by group; then
 * seq 0's next token alone (one tile: by chunk or by heads). */
static void run(const lms_model *m, int kv_type, int impl, bool split, int n_threads, float *rows)
{
    const int32_t nv = m->hp.n_vocab;
    lms_ctx_params p = {.n_ctx = N_CTX, .n_batch = 64, .n_seq = 3, .n_threads = n_threads,
                        .kv_type = kv_type};
    char err[256];
    lms_ctx *c;
    assert_int_equal(lms_ctx_create(m, &p, &c, err, sizeof err), 0);
    assert_int_equal(fwd_set_attention(c, impl), 0);
    lms_kv_cache *kv = lms_ctx_kv(c);
    lms_kv_seq s0 = {0}, s1 = {0}, s2 = {0};
    assert_int_equal(lms_kv_seq_reserve(kv, &s0, P0 + 3), 0);
    assert_int_equal(lms_kv_seq_reserve(kv, &s1, P1 + 3), 0);
    assert_int_equal(lms_kv_seq_reserve(kv, &s2, 1), 0);
    int32_t toks[P0 + 3];
    uint32_t rs = 12345;
    for (int32_t i = 0; i < P0 + 3; i++)
        toks[i] = (int32_t)(rng_next(&rs) % (uint32_t)nv);
    prefill(c, &s0, toks, 0, P0, rows, nv);
    prefill(c, &s1, toks, 0, P1, rows + nv, nv); /* overwritten below */
    float *lg = malloc((size_t)3 * nv * sizeof *lg);
    {
        lms_kv_seq *seqs[2] = {&s0, &s1};
        int32_t pos[2] = {P0, P1}, tk[2] = {toks[P0], toks[P1]};
        step(c, seqs, pos, tk, 2, rows + nv);
    }
    /* the same batch size both ways, so the matrix products match too */
    lms_kv_seq *seqs[3] = {&s0, &s1, split ? &s2 : &s1};
    int32_t pos[3] = {P0 + 1, P1 + 1, split ? 0 : P1 + 2};
    int32_t tk[3] = {toks[P0 + 1], toks[P1 + 1], toks[P1 + 2]};
    step(c, seqs, pos, tk, 3, lg);
    memcpy(rows + (size_t)3 * nv, lg, (size_t)2 * nv * sizeof *lg);
    free(lg);
    {
        int32_t p2 = P0 + 2;
        step(c, seqs, &p2, toks + P0 + 2, 1, rows + (size_t)5 * nv);
    }
    lms_kv_seq_release(kv, &s0);
    lms_kv_seq_release(kv, &s1);
    lms_kv_seq_release(kv, &s2);
    lms_ctx_destroy(c);
}

/*
 * End to end: the logits of a quantized cache (reference path, rows q)
 * against the f16 cache's (into f): finite, and their mean difference a
 * small part of the logits' spread. The error follows the cache's step:
 * q8_0 rounds each value to 1/127 of its block's largest, q4_0 to 1/8 of
 * it (nearly 16 times coarser). Measured on these random-weight models:
 * mean |diff| 0.5-0.9% of the logits' standard deviation with q8_0 (top-1
 * unchanged), 7-12% with q4_0. The bounds are about twice the worst of
 * those (2% and 25%); a cache read wrongly (a swapped nibble half, a
 * wrong scale) gives differences as large as the logits themselves.
 */
static void check_vs_f16(const lms_model *m, int kv_type, const float *q, float *f)
{
    const int32_t nv = m->hp.n_vocab;
    run(m, 0, FWD_ATT_REF, false, 2, f);
    double sum = 0, sum2 = 0, mean_diff = 0;
    float max_diff = 0;
    int top1 = 0;
    for (int r = 0; r < N_ROWS; r++) {
        const float *qr = q + (size_t)r * nv, *fr = f + (size_t)r * nv;
        int aq = 0, af = 0;
        for (int32_t i = 0; i < nv; i++) {
            if (!isfinite(qr[i]))
                fail_msg("kv %s: logit %d of row %d is %g", kv_name(kv_type), i, r, qr[i]);
            const float d = fabsf(qr[i] - fr[i]);
            max_diff = d > max_diff ? d : max_diff;
            mean_diff += d;
            sum += fr[i];
            sum2 += (double)fr[i] * fr[i];
            aq = qr[i] > qr[aq] ? i : aq;
            af = fr[i] > fr[af] ? i : af;
        }
        top1 += aq == af;
    }
    const double n = (double)N_ROWS * nv, sd = sqrt(sum2 / n - (sum / n) * (sum / n));
    mean_diff /= n;
    printf("kv %-4s vs f16 cache (%s): max |logit diff| %.3g, mean %.3g, logit sd %.3g, "
           "same top-1 %d/%d\n",
           kv_name(kv_type), m->hp.arch, max_diff, mean_diff, sd, top1, N_ROWS);
    const double bound = (kv_type == LMS_TYPE_Q4_0 ? 0.25 : 0.02) * sd;
    if (!(mean_diff <= bound))
        fail_msg("kv %s: mean |logit diff| %g from the f16 cache's, over %g", kv_name(kv_type),
                 mean_diff, bound);
    if (kv_type == LMS_TYPE_Q8_0 && top1 != N_ROWS)
        fail_msg("kv q8_0: top-1 token differs from the f16 cache's in %d rows", N_ROWS - top1);
}

static void test_case(void **state)
{
    const att_case *ac = *state;
    char rel[256], err[512];
    const char *path = rel;
    if (ac->shape) {
        snprintf(rel, sizeof rel, "/tmp/lms_test_attention_%d.gguf", (int)getpid());
        if (lms_synth_write(ac->shape, "F16", 7, path, err, sizeof err) < 0)
            fail_msg("%s: %s", ac->model, err);
    } else {
        snprintf(rel, sizeof rel, "models/%s.gguf", ac->model);
        path = tu_data_path(rel);
    }
    lms_model *m;
    int rc = lms_model_load(path, &m, err, sizeof err);
    if (ac->shape)
        unlink(path); /* the mapping stays */
    if (rc < 0)
        fail_msg("%s: %s", ac->model, err);
    const size_t n = (size_t)N_ROWS * m->hp.n_vocab;
    float *ref = malloc(n * sizeof *ref), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    run(m, ac->kv_type, FWD_ATT_REF, false, 2, ref);
    float scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmaxf(scale, fabsf(ref[i]));
    const int impls[] = {FWD_ATT_C, FWD_ATT_AVX512};
    float *c_path = NULL; /* the C path's logits, when it ran */
    for (size_t k = 0; k < sizeof impls / sizeof impls[0]; k++) {
        lms_ctx_params p = {.n_ctx = 16, .n_batch = 1, .n_seq = 1, .n_threads = 1};
        lms_ctx *probe;
        assert_int_equal(lms_ctx_create(m, &p, &probe, err, sizeof err), 0);
        bool ok = fwd_set_attention(probe, impls[k]) == 0;
        lms_ctx_destroy(probe);
        if (!ok) {
            printf("attention %-16s kv %-4s hd %3d: %s path not available here\n", ac->model,
                   kv_name(ac->kv_type), m->hp.head_dim, k ? "avx512" : "c");
            continue;
        }
        run(m, ac->kv_type, impls[k], false, 2, a);
        /* by chunk (2 threads: a remainder chunk split by KV heads; 3: given
         * whole), by heads (2 threads; 1: on the calling thread, for the
         * one-tile steps), by group (1 thread) and by head: the same
         * arithmetic */
        const int threads[] = {2, 3, 1, 2, 1};
        const char *heads_max[] = {"0", "0", "0", NULL, NULL};
        for (int i = 0; i < 5; i++) {
            if (heads_max[i])
                setenv("LMS_ATT_HEADS_MAX", heads_max[i], 1);
            else
                unsetenv("LMS_ATT_HEADS_MAX");
            run(m, ac->kv_type, impls[k], true, threads[i], b);
            unsetenv("LMS_ATT_HEADS_MAX");
            if (memcmp(a, b, n * sizeof *a))
                fail_msg("%s: decode by %s (%d threads) differs from by head (max %g)", ac->model,
                         heads_max[i] ? threads[i] > 1 ? "chunk" : "group" : "heads",
                         threads[i], tu_max_diff(a, b, n));
        }
        /* the AVX512BW integer products instead of VNNI's: the same lanes */
        if (k && ac->kv_type) {
            setenv("LMS_ATT_NO_VNNI", "1", 1);
            run(m, ac->kv_type, impls[k], false, 2, b);
            unsetenv("LMS_ATT_NO_VNNI");
            if (memcmp(a, b, n * sizeof *a))
                fail_msg("%s: scores without VNNI differ (max %g)", ac->model,
                         tu_max_diff(a, b, n));
        }
        /* q4_0's tiled scores: the AVX-512 kernel and its portable twin do
         * the same arithmetic, so the whole step matches to the bit where
         * the twins are built per x86 level (attention.c's LMS_CLONES: the
         * x86-64-v4 copy contracts the values' products into FMAs as the
         * AVX-512 kernels do; the f16 and q8_0 score twins sum their lanes
         * in another order) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
        const bool q4 = ac->kv_type == LMS_TYPE_Q4_0;
#else
        const bool q4 = false;
#endif
        if (q4 && k == 0) {
            c_path = malloc(n * sizeof *c_path);
            memcpy(c_path, a, n * sizeof *a);
        } else if (q4 && c_path && memcmp(a, c_path, n * sizeof *a)) {
            fail_msg("%s: the avx512 path differs from the C path (max %g)", ac->model,
                     tu_max_diff(a, c_path, n));
        }
        float d = tu_max_diff(a, ref, n);
        printf("attention %-16s kv %-4s hd %3d %-6s vs reference: max |logit diff| %.3g of %.3g\n",
               ac->model, kv_name(ac->kv_type), m->hp.head_dim, k ? "avx512" : "c", d,
               scale);
        /* The paths agree to float rounding in each layer; a q4_0 cache
         * turns such a difference in a layer's K or V, where a value sits
         * at a rounding boundary, into a whole step (1/8 of its block's
         * largest) for the layers after it: seen up to 1.3e-3 of the
         * logits' scale, against 0.5-1.7 of it for a cache read wrongly. */
        const float tol = ac->kv_type == LMS_TYPE_Q4_0 ? 1e-2f : 1e-3f;
        if (!(d <= tol * scale + 1e-4f))
            fail_msg("%s: %s path differs from the reference by %g", ac->model,
                     k ? "avx512" : "c", d);
    }
    if (ac->kv_type)
        check_vs_f16(m, ac->kv_type, ref, b);
    free(c_path);
    free(ref);
    free(a);
    free(b);
    lms_model_free(m);
}

int main(void)
{
    struct CMUnitTest tests[N_CASES];
    static char names[N_CASES][64];
    for (size_t i = 0; i < N_CASES; i++) {
        snprintf(names[i], sizeof names[i], "%s kv %s", cases[i].model, kv_name(cases[i].kv_type));
        tests[i] = (struct CMUnitTest){
            .name = names[i], .test_func = test_case, .initial_state = (void *)&cases[i]};
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
