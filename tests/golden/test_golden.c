/*
 * test_golden.c - logits and greedy tokens against llama.cpp's golden
 * outputs in the shared test data (testdata/README.md §2-3).
 *
 * For every model folder: the prompt of each case goes through one forward
 * call with logits at every position (compared with all_logits, or
 * last_logits where only that exists); then the golden greedy ids are fed
 * back one at a time (teacher forcing) and each step's logits and argmax
 * are checked with the README's rule. stories260K must also reproduce the
 * greedy story free-running. The kernel table in use follows LMS_ISA.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/forward.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "testutil.h"

typedef struct golden_model {
    const char *name;
    float tol;
    int kv_type; /* 0: the default f16 cache */
} golden_model;

static const golden_model models[] = {
    {"stories260K", 2e-2f, 0},        {"stories260K-q8_0", 0.5f, 0},   {"llama-synth-f32", 1e-2f, 0},
    {"llama-synth-f16", 2e-2f, 0},    {"llama-synth-bf16", 5e-2f, 0},  {"llama-synth-q8_0", 0.25f, 0},
    {"llama-synth-q4_0", 0.25f, 0},   {"llama-synth-q4_k_m", 0.25f, 0}, {"llama-synth-q5_k_m", 0.25f, 0},
    {"llama-synth-q6_k", 0.25f, 0},   {"qwen2-synth-f16", 2e-2f, 0},   {"qwen2-synth-q4_k_m", 0.25f, 0},
    {"qwen3-synth-f16", 2e-2f, 0},    {"qwen3-synth-q4_k_m", 0.25f, 0},
    /* Q8_0 K/V cache: tolerance of the 8-bit files (the cache adds one more
     * 8-bit rounding of K and V) */
    {"llama-synth-f32", 0.25f, LMS_TYPE_Q8_0}, {"qwen3-synth-q4_k_m", 0.25f, LMS_TYPE_Q8_0},
};

typedef struct runner {
    lms_model *m;
    lms_ctx *c;
    lms_kv_seq seq;
    int32_t nv;
} runner;





/* Forward of tokens [0, n) at positions from..; logits of all rows. */
static void run(runner *r, const int32_t *toks, int32_t n, int32_t from, float *logits)
{
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    lms_kv_seq **seqs = malloc((size_t)n * sizeof *seqs);
    bool *want = malloc((size_t)n * sizeof *want);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = from + i;
        seqs[i] = &r->seq;
        want[i] = true;
    }
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(r->c), &r->seq, from + n), 0);
    lms_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .logits = want};
    assert_int_equal(lms_forward(r->c, &b, logits), 0);
    free(pos);
    free(seqs);
    free(want);
}

/* One step of the greedy rule: argmax must be the golden id when the
 * golden margin is large; else the golden id's logit must be within tol of
 * our maximum. */
static void check_greedy_step(const float *lg, int32_t nv, int32_t gold, float margin, float tol,
                              const char *what, int step)
{
    int32_t am = tu_argmax(lg, nv);
    if (margin > 2 * tol) {
        if (am != gold)
            fail_msg("%s step %d: argmax %d, golden %d (margin %g)", what, step, am, gold, margin);
    } else if (lg[am] - lg[gold] > tol) {
        fail_msg("%s step %d: golden id %d is %g below our max", what, step, gold, lg[am] - lg[gold]);
    }
}


static void check_case(runner *r, const golden_model *gm, const char *cs, float *worst)
{
    char rel[256];
    int32_t n, n_gen;
    size_t n_ref = 0;
    snprintf(rel, sizeof rel, "golden/%s/%s.tokens.txt", gm->name, cs);
    int32_t *toks = tu_read_ids(tu_data_path(rel), &n);
    snprintf(rel, sizeof rel, "golden/%s/%s.greedy_ids.txt", gm->name, cs);
    int32_t *gen = tu_read_ids(tu_data_path(rel), &n_gen);
    assert_non_null(toks);
    assert_non_null(gen);
    float *lg = malloc((size_t)(n + 1) * (size_t)r->nv * sizeof *lg);
    run(r, toks, n, 0, lg);
    snprintf(rel, sizeof rel, "golden/%s/%s.all_logits.f32", gm->name, cs);
    float *ref = tu_read_f32(tu_data_path(rel), &n_ref);
    float d;
    if (ref) {
        assert_int_equal(n_ref, (size_t)n * r->nv);
        d = tu_max_diff(lg, ref, n_ref);
    } else {
        snprintf(rel, sizeof rel, "golden/%s/%s.last_logits.f32", gm->name, cs);
        ref = tu_read_f32(tu_data_path(rel), &n_ref);
        assert_non_null(ref);
        assert_int_equal(n_ref, (size_t)r->nv);
        d = tu_max_diff(lg + (size_t)(n - 1) * r->nv, ref, n_ref);
    }
    free(ref);
    *worst = d > *worst ? d : *worst;
    if (!(d <= gm->tol))
        fail_msg("%s %s: prompt logits differ by %g (tolerance %g)", gm->name, cs, d, gm->tol);

    /* teacher forcing over the golden greedy ids */
    float margin[64];
    tu_read_margins(gm->name, cs, margin, n_gen);
    snprintf(rel, sizeof rel, "golden/%s/%s.gen_logits.f32", gm->name, cs);
    float *gref = tu_read_f32(tu_data_path(rel), &n_ref);
    float *step = malloc((size_t)r->nv * sizeof *step);
    memcpy(step, lg + (size_t)(n - 1) * r->nv, (size_t)r->nv * sizeof *step);
    for (int32_t s = 0; s < n_gen; s++) {
        if (s > 0)
            run(r, &gen[s - 1], 1, n + s - 1, step);
        if (gref) {
            float ds = tu_max_diff(step, gref + (size_t)s * r->nv, (size_t)r->nv);
            *worst = ds > *worst ? ds : *worst;
            if (!(ds <= gm->tol))
                fail_msg("%s %s: step %d logits differ by %g (tolerance %g)", gm->name, cs, s, ds,
                         gm->tol);
        }
        check_greedy_step(step, r->nv, gen[s], margin[s], gm->tol, gm->name, s);
    }
    free(step);
    free(gref);
    free(lg);
    free(toks);
    free(gen);
    lms_kv_seq_release(lms_ctx_kv(r->c), &r->seq);
}

/* stories260K: free-running greedy must reproduce llama.cpp's 32 tokens. */
static void check_free_greedy(runner *r, const golden_model *gm, const char *cs)
{
    char rel[256];
    int32_t n, n_gen;
    snprintf(rel, sizeof rel, "golden/%s/%s.tokens.txt", gm->name, cs);
    int32_t *toks = tu_read_ids(tu_data_path(rel), &n);
    snprintf(rel, sizeof rel, "golden/%s/%s.greedy_ids.txt", gm->name, cs);
    int32_t *gen = tu_read_ids(tu_data_path(rel), &n_gen);
    float *lg = malloc((size_t)n * (size_t)r->nv * sizeof *lg);
    run(r, toks, n, 0, lg);
    int32_t tok = tu_argmax(lg + (size_t)(n - 1) * r->nv, r->nv);
    for (int32_t s = 0; s < n_gen; s++) {
        if (tok != gen[s])
            fail_msg("%s %s: free greedy step %d gave %d, golden %d", gm->name, cs, s, tok, gen[s]);
        run(r, &tok, 1, n + s, lg);
        tok = tu_argmax(lg, r->nv);
    }
    free(lg);
    free(toks);
    free(gen);
    lms_kv_seq_release(lms_ctx_kv(r->c), &r->seq);
}

static void test_model(void **state)
{
    const golden_model *gm = *state;
    char rel[256], err[512];
    snprintf(rel, sizeof rel, "models/%s.gguf", gm->name);
    runner r = {0};
    if (lms_model_load(tu_data_path(rel), &r.m, err, sizeof err) < 0)
        fail_msg("%s: %s", gm->name, err);
    lms_ctx_params p = {.n_ctx = 128, .n_batch = 64, .n_seq = 1, .n_threads = 0,
                        .kv_type = gm->kv_type};
    assert_int_equal(lms_ctx_create(r.m, &p, &r.c, err, sizeof err), 0);
    r.nv = r.m->hp.n_vocab;
    float worst = 0;
    check_case(&r, gm, "case0", &worst);
    check_case(&r, gm, "case1", &worst);
    if (!strncmp(gm->name, "stories260K", 11)) {
        check_free_greedy(&r, gm, "case0");
        check_free_greedy(&r, gm, "case1");
    }
    printf("golden %-20s isa %-7s kv %-4s max |logit diff| %.3g (tolerance %g)\n", gm->name,
           lms_kernels_get()->isa, gm->kv_type ? "q8_0" : "f16", worst, gm->tol);
    lms_ctx_destroy(r.c);
    lms_model_free(r.m);
}

int main(void)
{
    struct CMUnitTest tests[sizeof models / sizeof models[0]];
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        tests[i] = (struct CMUnitTest){.name = models[i].kv_type ? "q8_0 KV cache" : models[i].name,
                                       .test_func = test_model,
                                       .initial_state = (void *)&models[i]};
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
