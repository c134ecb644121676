/*
 * test_gemma_cuda.c - gemma2 and gemma3 layers on the GPU against the CPU
 * path (forward.c, whose gemma logits were checked against llama.cpp's).
 *
 * Two synthetic models written here (lms_synth_write_ex), each with a
 * window of 16 positions, far shorter than the prompt:
 *
 *   gemma2  head_dim 64 (prompts take the tensor-core attention), local
 *           and global layers alternating, attention scores capped at 4
 *           and logits at 8
 *   gemma3  head_dim 256 (prompts take the per-token attention), q = 512
 *           wider than n_embd, five local layers with their RoPE base and
 *           a global one, q/k norms
 *
 * in F32, F16, Q8_0 and Q4_K_M. For each, the logits of every position of
 * a 72-token prompt and of 8 teacher-forced decode steps (CUDA graphs) on
 * the GPU against the CPU's, with the golden test's tolerances per type:
 *
 *   all     every layer and the head on the GPU (decode: norm + head in
 *           the graph), the prompt in one call and in two (27 + 45: the
 *           second call's windows reach into cached positions)
 *   split   2 layers on the GPU, the rest and the norm on the CPU, the
 *           head on the GPU
 *   nofa    gemma2 F32 with the tensor-core attention off (LMS_CUDA_FA=0)
 *
 * Then three sequences decoded in one step and a mixed prompt + decode
 * step; and the window itself: in one-layer models (a local layer), token
 * 0 changed must leave the GPU logits of every position past the window
 * bit for bit as they were, and change the earlier ones.
 *
 * Exits 77 (skipped) without a CUDA build or without a device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"
#include "cuda/cuda_test.h"
#ifdef LMS_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

#define N_PROMPT 72
#define N_DEC 8
#define N_ALL (N_PROMPT + N_DEC)
#define N_SPLIT 27 /* the prompt in two calls: this many, then the rest */
#define WINDOW 16

static const lms_synth_shape shapes[2] = {
    {"gemma2-gpu", "gemma2", 256, 4, 4, 2, 64, 512, 1024, 1024, 10000.0f, 1e-6f, 1, 0},
    {"gemma3-gpu", "gemma3", 256, 6, 2, 1, 256, 512, 1024, 1024, 1000000.0f, 1e-6f, 1, 0},
};
static const lms_synth_extra extras[2] = {
    {WINDOW, 4.0f, 8.0f, 0.08f},
    {WINDOW, 0.0f, 0.0f, 0.08f},
};

typedef struct gcase {
    int arch; /* index into shapes */
    const char *type;
    float tol; /* the golden test's for the type */
} gcase;

static const gcase cases[] = {
    {0, "F32", 1e-2f}, {0, "F16", 2e-2f}, {0, "Q8_0", 0.25f}, {0, "Q4_K_M", 0.25f},
    {1, "F32", 1e-2f}, {1, "F16", 2e-2f}, {1, "Q8_0", 0.25f}, {1, "Q4_K_M", 0.25f},
};

static lms_model *make_model(const lms_synth_shape *s, const lms_synth_extra *x, const char *type)
{
    char path[128], err[256];
    snprintf(path, sizeof path, "/tmp/lms_test_gemma_cuda_%d.gguf", (int)getpid());
    if (lms_synth_write_ex(s, x, type, 7, path, err, sizeof err) < 0)
        fail_msg("synth %s %s: %s", s->name, type, err);
    lms_model *m = NULL;
    int rc = lms_model_load(path, &m, err, sizeof err);
    unlink(path); /* the mapping stays */
    if (rc < 0)
        fail_msg("%s %s: %s", s->name, type, err);
    return m;
}

/* A context with gpu_layers layers on the GPU (0: the CPU), checked to
 * have that many there. */
static lms_ctx *make_ctx(const lms_model *m, int32_t gpu_layers, int32_t n_seq)
{
    lms_ctx_params p = {.n_ctx = 128, .n_batch = 80, .n_seq = n_seq, .gpu_layers = gpu_layers};
    char err[512];
    lms_ctx *c = NULL;
    if (lms_ctx_create(m, &p, &c, err, sizeof err) < 0)
        fail_msg("%s: context with %d GPU layers: %s", m->hp.arch, gpu_layers, err);
    if (gpu_layers != 0) {
        const lms_gpu_plan *pl = lms_ctx_gpu_plan(c);
        assert_non_null(pl);
        int32_t want = gpu_layers == LMS_GPU_LAYERS_ALL ? m->hp.n_layer : gpu_layers;
        assert_int_equal(pl->n_layer_gpu, want);
        assert_true(pl->output_gpu);
    }
    return c;
}

/* toks[0, n) of one sequence at positions from, from + 1, ...: every row's
 * logits into out. */
static void run(lms_ctx *c, lms_kv_seq *seq, const int32_t *toks, int32_t n, int32_t from,
                float *out)
{
    int32_t pos[N_ALL];
    lms_kv_seq *seqs[N_ALL];
    bool want[N_ALL];
    for (int32_t i = 0; i < n; i++)
        pos[i] = from + i, seqs[i] = seq, want[i] = true;
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), seq, from + n), 0);
    lms_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .logits = want};
    assert_int_equal(lms_forward(c, &b, out), 0);
}

/* Logits of the prompt's N_PROMPT positions (one call, or two split at
 * `split`), then of N_DEC one-token steps: out [N_ALL][n_vocab]. */
static void sequence(lms_ctx *c, const int32_t *toks, int32_t split, float *out)
{
    const size_t nv = (size_t)lms_ctx_model(c)->hp.n_vocab;
    lms_kv_seq s = {0};
    if (split > 0) {
        run(c, &s, toks, split, 0, out);
        run(c, &s, toks + split, N_PROMPT - split, split, out + (size_t)split * nv);
    } else {
        run(c, &s, toks, N_PROMPT, 0, out);
    }
    for (int32_t i = N_PROMPT; i < N_ALL; i++)
        run(c, &s, &toks[i], 1, i, out + (size_t)i * nv);
    lms_kv_seq_release(lms_ctx_kv(c), &s);
}

static void fill_tokens(int32_t *toks, int32_t n, int32_t n_vocab, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++)
        toks[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)n_vocab);
}

/* max |a - b| over the prompt rows and over the decode rows. */
static void diffs(const float *a, const float *b, size_t nv, float *d_prompt, float *d_dec)
{
    *d_prompt = tu_max_diff(a, b, (size_t)N_PROMPT * nv);
    *d_dec = tu_max_diff(a + (size_t)N_PROMPT * nv, b + (size_t)N_PROMPT * nv, (size_t)N_DEC * nv);
}

static void check_mode(const gcase *gc, const lms_model *m, const float *ref, const int32_t *toks,
                       const char *mode, int32_t gpu_layers, int32_t split)
{
    const size_t nv = (size_t)m->hp.n_vocab;
    float *got = malloc((size_t)N_ALL * nv * sizeof *got);
    lms_ctx *c = make_ctx(m, gpu_layers, 1);
    sequence(c, toks, split, got);
    lms_ctx_destroy(c);
    float dp, dd;
    diffs(ref, got, nv, &dp, &dd);
    printf("cuda %-10s %-6s %-9s max |GPU - CPU|: prompt %.3g, decode %.3g (tol %g)\n",
           shapes[gc->arch].name, gc->type, mode, dp, dd, gc->tol);
    for (size_t i = 0; i < (size_t)N_ALL * nv; i++)
        if (!isfinite(got[i]))
            fail_msg("%s %s [%s]: logit %zu is %g", shapes[gc->arch].name, gc->type, mode, i,
                     got[i]);
    if (!(dp <= gc->tol) || !(dd <= gc->tol))
        fail_msg("%s %s [%s]: GPU logits differ from the CPU's by %g (prompt) / %g (decode), "
                 "tolerance %g", shapes[gc->arch].name, gc->type, mode, dp, dd, gc->tol);
    free(got);
}

static void test_logits(void **state)
{
    const gcase *gc = *state;
    lms_model *m = make_model(&shapes[gc->arch], &extras[gc->arch], gc->type);
    const size_t nv = (size_t)m->hp.n_vocab;
    int32_t toks[N_ALL];
    fill_tokens(toks, N_ALL, (int32_t)nv, 11);
    float *ref = malloc((size_t)N_ALL * nv * sizeof *ref);
    lms_ctx *c = make_ctx(m, 0, 1);
    sequence(c, toks, 0, ref);
    lms_ctx_destroy(c);
    check_mode(gc, m, ref, toks, "all", LMS_GPU_LAYERS_ALL, 0);
    check_mode(gc, m, ref, toks, "all+2call", LMS_GPU_LAYERS_ALL, N_SPLIT);
    check_mode(gc, m, ref, toks, "split", 2, 0);
    if (gc->arch == 0 && !strcmp(gc->type, "F32")) {
        setenv("LMS_CUDA_FA", "0", 1);
        check_mode(gc, m, ref, toks, "nofa", LMS_GPU_LAYERS_ALL, 0);
        check_mode(gc, m, ref, toks, "nofa+2call", LMS_GPU_LAYERS_ALL, N_SPLIT);
        unsetenv("LMS_CUDA_FA");
    }
    free(ref);
    lms_model_free(m);
}

/* The test's reach: on the CPU, each gemma feature changes these models'
 * logits by well over the F32 tolerance, so a GPU path that dropped one
 * would fail the comparisons above. Variants of the F32 models: gemma2
 * without its score cap (capped at 1000), without its logit cap (1000),
 * without the window (4096); gemma3 without local layers. */
static void test_reach(void **state)
{
    (void)state;
    int32_t toks[N_PROMPT];
    fill_tokens(toks, N_PROMPT, shapes[0].n_vocab, 11);
    const size_t n = (size_t)N_PROMPT * (size_t)shapes[0].n_vocab;
    float *base = malloc(n * sizeof *base), *var = malloc(n * sizeof *var);
    const char *what[4] = {"gemma2 score cap", "gemma2 logit cap", "gemma2 window",
                           "gemma3 local layers"};
    for (int k = 0; k < 4; k++) {
        const int a = k < 3 ? 0 : 1;
        lms_synth_extra x = extras[a];
        if (k == 0)
            x.attn_softcap = 1000.0f;
        else if (k == 1)
            x.final_softcap = 1000.0f;
        else if (k == 2)
            x.n_swa = 4096;
        else
            x.n_swa = 0;
        float *outs[2] = {base, var};
        for (int v = 0; v < 2; v++) {
            if (v == 0 && (k == 1 || k == 2)) /* base already holds gemma2's */
                continue;
            lms_model *m = make_model(&shapes[a], v ? &x : &extras[a], "F32");
            lms_ctx *c = make_ctx(m, 0, 1);
            lms_kv_seq s = {0};
            run(c, &s, toks, N_PROMPT, 0, outs[v]);
            lms_kv_seq_release(lms_ctx_kv(c), &s);
            lms_ctx_destroy(c);
            lms_model_free(m);
        }
        const float d = tu_max_diff(base, var, n);
        printf("cuda reach  %-20s without it the CPU logits move by %.3g\n", what[k], d);
        if (!(d > 1.0f)) /* 4x the widest tolerance below */
            fail_msg("%s: changes the logits by only %g, too little for the GPU comparisons to "
                     "see it missing", what[k], d);
    }
    free(base);
    free(var);
}

/* Three sequences prefilled separately (5, 22 and 39 tokens: the longer
 * two past the window), one decode step for all three in one batch, then
 * a mixed step of 14 tokens (a decode token of the first, 12 prompt
 * tokens of the second, a decode token of the third), whose attention on
 * the prompt path sees rows of three sequences and windows in one tile.
 * GPU logits against the CPU's. */
#define MIX_N 14
static void multi_seq(lms_ctx *c, float *out3, float *mix)
{
    const int32_t nv = lms_ctx_model(c)->hp.n_vocab;
    lms_kv_seq seqs[3] = {{0}};
    float *lg = malloc(40 * (size_t)nv * sizeof *lg);
    int32_t toks[40];
    for (int s = 0; s < 3; s++) {
        int32_t len = 5 + 17 * s;
        for (int32_t i = 0; i < len; i++)
            toks[i] = (int32_t)((i * 31 + s * 7 + 1) % nv);
        run(c, &seqs[s], toks, len, 0, lg);
    }
    int32_t tk[3] = {3, 4, 5}, pos[3] = {5, 22, 39};
    lms_kv_seq *sp[3] = {&seqs[0], &seqs[1], &seqs[2]};
    bool want[MIX_N];
    for (int32_t i = 0; i < MIX_N; i++)
        want[i] = true;
    for (int s = 0; s < 3; s++)
        assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &seqs[s], pos[s] + 1), 0);
    lms_batch b = {.n_tokens = 3, .tokens = tk, .pos = pos, .seq = sp, .logits = want};
    assert_int_equal(lms_forward(c, &b, out3), 0);
    int32_t mt[MIX_N], mp[MIX_N];
    lms_kv_seq *ms[MIX_N];
    for (int32_t i = 0; i < MIX_N; i++) {
        const int s = i == 0 ? 0 : (i == MIX_N - 1 ? 2 : 1);
        mt[i] = (int32_t)((i * 13 + 2) % nv);
        mp[i] = s == 0 ? 6 : (s == 2 ? 40 : 23 + i - 1);
        ms[i] = &seqs[s];
    }
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &seqs[0], 7), 0);
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &seqs[1], 23 + MIX_N - 2), 0);
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &seqs[2], 41), 0);
    lms_batch bm = {.n_tokens = MIX_N, .tokens = mt, .pos = mp, .seq = ms, .logits = want};
    assert_int_equal(lms_forward(c, &bm, mix), 0);
    for (int s = 0; s < 3; s++)
        lms_kv_seq_release(lms_ctx_kv(c), &seqs[s]);
    free(lg);
}

static void test_multi_seq(void **state)
{
    const gcase *gc = *state;
    lms_model *m = make_model(&shapes[gc->arch], &extras[gc->arch], gc->type);
    const size_t nv = (size_t)m->hp.n_vocab;
    float *out[2], *mix[2];
    for (int k = 0; k < 2; k++) {
        lms_ctx *c = make_ctx(m, k ? LMS_GPU_LAYERS_ALL : 0, 4);
        out[k] = malloc(3 * nv * sizeof(float));
        mix[k] = malloc(MIX_N * nv * sizeof(float));
        multi_seq(c, out[k], mix[k]);
        lms_ctx_destroy(c);
    }
    const float d3 = tu_max_diff(out[0], out[1], 3 * nv);
    const float dm = tu_max_diff(mix[0], mix[1], MIX_N * nv);
    printf("cuda %-10s %-6s batch     3 sequences in one step: max |GPU - CPU| %.3g; mixed "
           "prompt + decode step (%d tokens): %.3g\n",
           shapes[gc->arch].name, gc->type, d3, MIX_N, dm);
    if (!(d3 <= gc->tol) || !(dm <= gc->tol))
        fail_msg("%s %s: batched steps differ from the CPU by %g / %g (tolerance %g)",
                 shapes[gc->arch].name, gc->type, d3, dm, gc->tol);
    for (int k = 0; k < 2; k++)
        free(out[k]), free(mix[k]);
    lms_model_free(m);
}

/* One-layer models (layer 0 is local in both families), all on the GPU:
 * token 0 changed leaves positions >= WINDOW exactly as they were (prompt
 * rows and decode steps), and moves the earlier ones. */
static void test_window_exact(void **state)
{
    (void)state;
    for (int a = 0; a < 2; a++) {
        lms_synth_shape s = shapes[a];
        s.n_layer = 1;
        lms_model *m = make_model(&s, &extras[a], "F32");
        assert_int_equal(m->layers[0].n_swa, WINDOW);
        const size_t nv = (size_t)m->hp.n_vocab;
        int32_t ta[N_ALL], tb[N_ALL];
        fill_tokens(ta, N_ALL, (int32_t)nv, 5);
        memcpy(tb, ta, sizeof ta);
        tb[0] = (ta[0] + 1) % (int32_t)nv;
        float *la = malloc((size_t)N_ALL * nv * sizeof *la);
        float *lb = malloc((size_t)N_ALL * nv * sizeof *lb);
        for (int split = 0; split <= N_SPLIT; split += N_SPLIT) {
            lms_ctx *c = make_ctx(m, LMS_GPU_LAYERS_ALL, 1);
            sequence(c, ta, split, la);
            sequence(c, tb, split, lb);
            lms_ctx_destroy(c);
            for (int32_t p = 0; p < N_ALL; p++) {
                const float d = tu_max_diff(la + (size_t)p * nv, lb + (size_t)p * nv, nv);
                if (p >= WINDOW && d != 0.0f)
                    fail_msg("%s (split %d): position %d, past the window of the changed token "
                             "0, moved by %g", s.arch, split, p, d);
                if (p < WINDOW && !(d > 1e-4f))
                    fail_msg("%s (split %d): position %d does not see token 0 (%g)", s.arch,
                             split, p, d);
            }
        }
        printf("cuda %-10s window: positions past it unchanged by token 0, bit for bit\n",
               s.arch);
        free(la);
        free(lb);
        lms_model_free(m);
    }
}

int main(void)
{
    cuda_test_need_device();
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    struct CMUnitTest tests[N_CASES + 6]; /* reach, logits of each case, 4 batch checks, the window */
    int n = 0;
    tests[n++] = (struct CMUnitTest){.name = "reach", .test_func = test_reach};
    for (int i = 0; i < N_CASES; i++)
        tests[n++] = (struct CMUnitTest){.name = "logits", .test_func = test_logits,
                                         .initial_state = (void *)&cases[i]};
    const int multi[4] = {0, 3, 4, 7}; /* F32 and Q4_K_M of each */
    for (int i = 0; i < 4; i++)
        tests[n++] = (struct CMUnitTest){.name = "multi_seq", .test_func = test_multi_seq,
                                         .initial_state = (void *)&cases[multi[i]]};
    tests[n++] = (struct CMUnitTest){.name = "window_exact", .test_func = test_window_exact};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
