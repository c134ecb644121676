/*
 * test_gemma.c - the gemma2 and gemma3 architectures (model.c's read_gemma,
 * forward.c, attention.c's windows and soft-capping) on tiny synthetic
 * models written here (lms_synth_write_ex), checked against properties that
 * hold whatever the weights (the logits themselves were compared with
 * llama.cpp outside the tree):
 *
 *   - the loader's reading of the keys: local layers, RoPE bases, scales;
 *   - one-token decode steps (every attention path and schedule) agree with
 *     the prompt run in one batch, and sequences decoded together with
 *     each decoded alone;
 *   - sliding window: in a one-layer model (layer 0 is local), a token more
 *     than the window behind a position does not change its logits at all;
 *     a window at least as long as the context gives full attention;
 *   - final soft-capping bounds the logits to [-cap, cap];
 *   - the scalar, AVX2 and AVX-512 kernels agree (this test runs itself
 *     again under LMS_ISA for each one the CPU has);
 *   - LoRA adapters still apply per sequence;
 *   - a CPU-only build refuses an explicit --gpu-layers (CUDA builds: see
 *     tests/cuda/test_gemma_cuda.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/forward.h"
#include "engine/forward_int.h"
#include "engine/kv_cache.h"
#include "kernels/kernels.h"
#include "kernels/kernels_impl.h" /* lms_kernels_for_isa */
#include "model/lora.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#define N_TOK 40 /* past the tiny shapes' window of 16 */
#define N_CTX 64

/* ---- models ------------------------------------------------------------------- */

/* Writes shape s (extras x, NULL: the table's) as `type` and loads it. */
static lms_model *make_model(const lms_synth_shape *s, const lms_synth_extra *x, const char *type)
{
    char path[128], err[256];
    snprintf(path, sizeof path, "/tmp/lms_test_gemma_%d.gguf", (int)getpid());
    assert_int_equal(lms_synth_write_ex(s, x, type, 7, path, err, sizeof err), 0);
    lms_model *m = NULL;
    int rc = lms_model_load(path, &m, err, sizeof err);
    if (rc < 0)
        fail_msg("%s", err);
    unlink(path); /* the mapping stays */
    return m;
}

static lms_model *make_table_model(const char *name, const char *type)
{
    const lms_synth_shape *s = lms_synth_find(name);
    assert_non_null(s);
    return make_model(s, NULL, type);
}

static void fill_tokens(int32_t *toks, int32_t n, int32_t n_vocab, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++)
        toks[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)n_vocab);
}

/* ---- runs ---------------------------------------------------------------------- */

static int g_kv_type; /* the cache type of the contexts made (0: f16) */
static int32_t g_n_ctx = N_CTX; /* their context size */
static int32_t g_decode_from;   /* run_decode: positions before it in one batch */

static lms_ctx *make_ctx(const lms_model *m, int impl, int n_threads)
{
    lms_ctx_params p = {.n_ctx = g_n_ctx, .n_batch = 3 * g_n_ctx, .n_seq = 3, .n_threads = n_threads,
                        .kv_type = g_kv_type};
    char err[256];
    lms_ctx *c = NULL;
    assert_int_equal(lms_ctx_create(m, &p, &c, err, sizeof err), 0);
    if (impl != FWD_ATT_AUTO && fwd_set_attention(c, impl) < 0) {
        lms_ctx_destroy(c);
        return NULL;
    }
    return c;
}

/* Logits of every position of toks[0, n), the prompt in one batch. */
static void run_prefill(const lms_model *m, const int32_t *toks, int32_t n, int impl, float *out)
{
    lms_ctx *c = make_ctx(m, impl, 2);
    assert_non_null(c);
    lms_kv_seq s = {0};
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &s, n), 0);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    lms_kv_seq **seqs = malloc((size_t)n * sizeof *seqs);
    bool *want = malloc((size_t)n * sizeof *want);
    for (int32_t i = 0; i < n; i++)
        pos[i] = i, seqs[i] = &s, want[i] = true;
    lms_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .logits = want};
    assert_int_equal(lms_forward(c, &b, out), 0);
    free(pos);
    free(seqs);
    free(want);
    lms_kv_seq_release(lms_ctx_kv(c), &s);
    lms_ctx_destroy(c);
}

/* The same, a token per step, n_par sequences (same tokens) stepping
 * together; sequence 0's logits to out, each other's checked equal to it
 * within tol. sets: the sequences' adapters (NULL: none). false when impl
 * cannot run here. */
static bool run_decode(const lms_model *m, const int32_t *toks, int32_t n, int impl, int n_threads,
                       int n_par, const lms_lora_set *const *sets, float *out)
{
    lms_ctx *c = make_ctx(m, impl, n_threads);
    if (!c)
        return false;
    const int32_t nv = m->hp.n_vocab;
    lms_kv_seq s[3] = {{0}};
    lms_kv_seq *seqs[3];
    for (int i = 0; i < n_par; i++) {
        assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &s[i], n), 0);
        seqs[i] = &s[i];
    }
    float *lg = malloc((size_t)n_par * nv * sizeof *lg);
    bool want[3] = {true, true, true};
    const int32_t p0 = g_decode_from < n ? g_decode_from : 0;
    if (p0 > 0) { /* every sequence's first p0 tokens in one batch */
        const int32_t nb = n_par * p0;
        int32_t *pos = malloc((size_t)nb * sizeof *pos), *tk = malloc((size_t)nb * sizeof *tk);
        lms_kv_seq **sq = malloc((size_t)nb * sizeof *sq);
        bool *wb = malloc((size_t)nb * sizeof *wb);
        float *all = malloc((size_t)nb * nv * sizeof *all);
        for (int32_t i = 0; i < nb; i++)
            pos[i] = i % p0, tk[i] = toks[i % p0], sq[i] = seqs[i / p0], wb[i] = true;
        lms_batch b = {.n_tokens = nb, .tokens = tk, .pos = pos, .seq = sq, .logits = wb};
        assert_int_equal(lms_forward(c, &b, all), 0);
        memcpy(out, all, (size_t)p0 * nv * sizeof *out);
        free(pos);
        free(tk);
        free(sq);
        free(wb);
        free(all);
    }
    for (int32_t p = p0; p < n; p++) {
        int32_t pos[3] = {p, p, p}, tk[3] = {toks[p], toks[p], toks[p]};
        lms_batch b = {.n_tokens = n_par, .tokens = tk, .pos = pos, .seq = seqs, .logits = want,
                       .lora = sets};
        assert_int_equal(lms_forward(c, &b, lg), 0);
        memcpy(out + (size_t)p * nv, lg, (size_t)nv * sizeof *lg);
        if (!sets)
            for (int i = 1; i < n_par; i++)
                assert_true(tu_max_diff(lg, lg + (size_t)i * nv, (size_t)nv) <= 1e-5f);
    }
    free(lg);
    for (int i = 0; i < n_par; i++)
        lms_kv_seq_release(lms_ctx_kv(c), &s[i]);
    lms_ctx_destroy(c);
    return true;
}

/* ---- the loader ------------------------------------------------------------------ */

static void test_hparams(void **state)
{
    (void)state;
    lms_model *g3 = make_table_model("gemma3-tiny", "F32");
    const lms_hparams *hp = &g3->hp;
    assert_string_equal(hp->arch, "gemma3");
    assert_int_equal(hp->ffn_act, LMS_FFN_GELU_TANH);
    assert_true(fabsf(hp->embd_scale - sqrtf(192.0f)) < 1e-6f);
    assert_true(fabsf(hp->q_scale - 0.125f) < 1e-7f); /* 1/sqrt(head_dim 64) */
    assert_true(hp->attn_softcap == 0.0f && hp->final_softcap == 0.0f);
    for (int il = 0; il < 6; il++) { /* pattern 6: five local layers, then a global one */
        const lms_layer *l = &g3->layers[il];
        assert_int_equal(l->n_swa, il < 5 ? 16 : 0);
        assert_true(l->rope_base == (il < 5 ? 10000.0f : 1000000.0f));
        assert_non_null(l->attn_post_norm.data);
        assert_non_null(l->ffn_post_norm.data);
        assert_non_null(l->q_norm.data);
    }
    assert_ptr_equal(g3->output.data, g3->tok_embd.data); /* tied */
    lms_model_free(g3);

    lms_model *g2 = make_table_model("gemma2-tiny", "F32");
    hp = &g2->hp;
    assert_true(hp->attn_softcap == 4.0f && hp->final_softcap == 2.0f);
    for (int il = 0; il < 4; il++) { /* pattern 2: even layers local, one RoPE base */
        assert_int_equal(g2->layers[il].n_swa, il % 2 == 0 ? 16 : 0);
        assert_true(g2->layers[il].rope_base == 10000.0f);
        assert_null(g2->layers[il].q_norm.data);
    }
    lms_model_free(g2);
}

/* ---- decode against prefill --------------------------------------------------------- */

static void check_decode_paths(const char *shape, const char *type, float tol)
{
    lms_model *m = make_table_model(shape, type);
    const int32_t nv = m->hp.n_vocab;
    int32_t toks[N_TOK];
    fill_tokens(toks, N_TOK, nv, 11);
    float *ref = malloc((size_t)N_TOK * nv * sizeof *ref);
    float *got = malloc((size_t)N_TOK * nv * sizeof *got);
    run_prefill(m, toks, N_TOK, FWD_ATT_REF, ref);
    const int impls[] = {FWD_ATT_REF, FWD_ATT_C, FWD_ATT_AVX512};
    /* heads max "0": decode by chunk; unset: by heads at these depths;
     * 3 sequences on 1 thread: by group */
    const char *heads[] = {"0", NULL};
    for (size_t i = 0; i < 3; i++) {
        for (size_t h = 0; h < 2; h++) {
            if (heads[h])
                setenv("LMS_ATT_HEADS_MAX", heads[h], 1);
            else
                unsetenv("LMS_ATT_HEADS_MAX");
            for (int n_par = 1; n_par <= 3; n_par += 2) {
                if (!run_decode(m, toks, N_TOK, impls[i], n_par == 3 ? 1 : 2, n_par, NULL, got))
                    continue;
                float d = tu_max_diff(ref, got, (size_t)N_TOK * nv);
                if (d > tol)
                    fail_msg("%s %s: attention path %d, heads max %s, %d sequences: decode "
                             "differs from prefill by %g", shape, type, impls[i],
                             heads[h] ? heads[h] : "default", n_par, d);
            }
        }
        /* the prompt in one batch on this path too */
        lms_ctx *c = make_ctx(m, impls[i], 2);
        if (c) {
            lms_ctx_destroy(c);
            run_prefill(m, toks, N_TOK, impls[i], got);
            assert_true(tu_max_diff(ref, got, (size_t)N_TOK * nv) <= tol);
        }
    }
    unsetenv("LMS_ATT_HEADS_MAX");
    free(ref);
    free(got);
    lms_model_free(m);
}

static void test_decode_gemma3(void **state)
{
    (void)state;
    check_decode_paths("gemma3-tiny", "F32", 5e-3f);
    /* q8_0 activations: a batch's rounding can flip a value (see the test
     * data README); its golden tolerance */
    check_decode_paths("gemma3-tiny", "Q8_0", 0.25f);
}

static void test_decode_gemma2(void **state)
{
    (void)state;
    check_decode_paths("gemma2-tiny", "F32", 5e-3f);
    check_decode_paths("gemma2-tiny", "F16", 5e-3f);
}

/* ---- the sliding window ------------------------------------------------------------ */

/* A one-layer model of the tiny shape: its only layer is local. Token 0
 * changed: positions >= window see no difference at all, earlier ones do;
 * with each cache type. */
static void check_window_one_layer(const char *name)
{
    lms_synth_shape s = *lms_synth_find(name);
    lms_synth_extra x = {16, 0.0f, 0.0f, 0.08f};
    s.n_layer = 1;
    lms_model *m = make_model(&s, &x, "F32");
    assert_int_equal(m->layers[0].n_swa, 16);
    const int32_t nv = m->hp.n_vocab;
    int32_t a[N_TOK], b[N_TOK];
    fill_tokens(a, N_TOK, nv, 5);
    memcpy(b, a, sizeof a);
    b[0] = (a[0] + 1) % nv;
    float *la = malloc((size_t)N_TOK * nv * sizeof *la);
    float *lb = malloc((size_t)N_TOK * nv * sizeof *lb);
    const int impls[] = {FWD_ATT_REF, FWD_ATT_C, FWD_ATT_AVX512};
    const int kv_types[] = {0, LMS_TYPE_Q8_0, LMS_TYPE_Q4_0};
    for (size_t i = 0; i < 9; i++) {
        g_kv_type = kv_types[i / 3];
        if (!run_decode(m, a, N_TOK, impls[i % 3], 2, 1, NULL, la))
            continue;
        assert_true(run_decode(m, b, N_TOK, impls[i % 3], 2, 1, NULL, lb));
        for (int32_t p = 0; p < N_TOK; p++) {
            float d = tu_max_diff(la + (size_t)p * nv, lb + (size_t)p * nv, (size_t)nv);
            if (p >= 16 && d != 0.0f)
                fail_msg("%s path %d cache %d: position %d, 16 past the changed token, moved "
                         "by %g", name, impls[i % 3], g_kv_type, p, d);
            if (p < 16 && d < 1e-4f)
                fail_msg("%s path %d cache %d: position %d does not see token 0 (%g)", name,
                         impls[i % 3], g_kv_type, p, d);
        }
        run_prefill(m, b, N_TOK, impls[i % 3], la);
        assert_true(tu_max_diff(la, lb, (size_t)N_TOK * nv) <= (g_kv_type ? 0.1f : 5e-3f));
    }
    g_kv_type = 0;
    free(la);
    free(lb);
    lms_model_free(m);
}

static void test_window_one_layer(void **state)
{
    (void)state;
    check_window_one_layer("gemma2-tiny");
    check_window_one_layer("gemma3-tiny");
}

/* Contexts past the window by several attention chunks (ATT_CHUNK): the
 * per-row paths leave out the chunks before a local layer's window, the
 * reference path still scores every position. Every path and decode
 * schedule, one batch and a token per step, on each cache type, against
 * the reference's logits; and token 0 changed leaves every position past
 * the window as it was. */
static void test_window_long(void **state)
{
    (void)state;
    const int32_t n = ATT_CHUNK + 56; /* positions from 144 leave chunk 0 out */
    lms_synth_shape s = *lms_synth_find("gemma3-tiny");
    lms_synth_extra x = {16, 0.0f, 0.0f, 0.08f};
    lms_model *m = make_model(&s, &x, "F32");
    const int32_t nv = m->hp.n_vocab;
    g_n_ctx = n;
    g_decode_from = n - 48; /* the batch path is checked on its own below */
    int32_t *toks = malloc((size_t)n * sizeof *toks), *other = malloc((size_t)n * sizeof *other);
    fill_tokens(toks, n, nv, 23);
    memcpy(other, toks, (size_t)n * sizeof *toks);
    other[0] = (toks[0] + 1) % nv;
    float *ref = malloc((size_t)n * nv * sizeof *ref), *got = malloc((size_t)n * nv * sizeof *got);
    float *moved = malloc((size_t)n * nv * sizeof *moved);
    const int impls[] = {FWD_ATT_C, FWD_ATT_AVX512};
    const int kv_types[] = {0, LMS_TYPE_Q8_0, LMS_TYPE_Q4_0};
    const char *heads[] = {"0", NULL}; /* by chunk; by heads */
    for (size_t k = 0; k < 3; k++) {
        g_kv_type = kv_types[k];
        const float tol = g_kv_type ? 0.1f : 5e-3f;
        run_prefill(m, toks, n, FWD_ATT_REF, ref);
        for (size_t i = g_kv_type ? 1 : 0; i < 2; i++) { /* portable C: f16 only */
            run_prefill(m, toks, n, impls[i], got);
            float d = tu_max_diff(ref, got, (size_t)n * nv);
            if (d > tol)
                fail_msg("cache %d path %d: the prompt in one batch differs from the reference "
                         "by %g", g_kv_type, impls[i], d);
            for (size_t h = 0; h < 2; h++) {
                if (heads[h])
                    setenv("LMS_ATT_HEADS_MAX", heads[h], 1);
                else
                    unsetenv("LMS_ATT_HEADS_MAX");
                /* 3 sequences on 1 thread: by group (once a cache type) */
                for (int n_par = 1; n_par <= (i == 1 && h == 1 ? 3 : 1); n_par += 2) {
                    if (!run_decode(m, toks, n, impls[i], n_par == 3 ? 1 : 2, n_par, NULL, got))
                        continue;
                    d = tu_max_diff(ref, got, (size_t)n * nv);
                    if (d > tol)
                        fail_msg("cache %d path %d heads max %s, %d sequences: decode differs "
                                 "from the reference by %g", g_kv_type, impls[i],
                                 heads[h] ? heads[h] : "default", n_par, d);
                    if (n_par == 3 || i != 1 || h != 1)
                        continue;
                    assert_true(run_decode(m, other, n, impls[i], 2, 1, NULL, moved));
                    /* gemma3-tiny's last layer is global: token 0 still
                     * reaches positions far past the local window */
                    for (int32_t p = n - 48; p < n; p += 7)
                        assert_true(tu_max_diff(got + (size_t)p * nv, moved + (size_t)p * nv,
                                                (size_t)nv) > 0.0f);
                }
            }
        }
    }
    unsetenv("LMS_ATT_HEADS_MAX");
    g_kv_type = 0;
    g_n_ctx = N_CTX;
    g_decode_from = 0;
    free(toks);
    free(other);
    free(ref);
    free(got);
    free(moved);
    lms_model_free(m);
}

/* gemma2-tiny (one RoPE base for all layers) with window 16, N_TOK and
 * 4096: the same logits where the window covers the context. */
static void test_window_full(void **state)
{
    (void)state;
    const lms_synth_shape *s = lms_synth_find("gemma2-tiny");
    lms_synth_extra x16 = {16, 4.0f, 2.0f, 0.08f}, xn = x16, xbig = x16;
    xn.n_swa = N_TOK;
    xbig.n_swa = 4096;
    lms_model *m16 = make_model(s, &x16, "F32"), *mn = make_model(s, &xn, "F32");
    lms_model *mbig = make_model(s, &xbig, "F32");
    const int32_t nv = m16->hp.n_vocab;
    int32_t toks[N_TOK];
    fill_tokens(toks, N_TOK, nv, 9);
    const size_t sz = (size_t)N_TOK * nv;
    float *l16 = malloc(sz * sizeof(float)), *ln = malloc(sz * sizeof(float));
    float *lbig = malloc(sz * sizeof(float));
    run_prefill(m16, toks, N_TOK, FWD_ATT_AUTO, l16);
    run_prefill(mn, toks, N_TOK, FWD_ATT_AUTO, ln);
    run_prefill(mbig, toks, N_TOK, FWD_ATT_AUTO, lbig);
    assert_true(tu_max_diff(ln, lbig, sz) == 0.0f);          /* window = context: full */
    assert_true(tu_max_diff(l16, lbig, (size_t)16 * nv) == 0.0f); /* first 16: same */
    assert_true(tu_max_diff(l16 + (size_t)16 * nv, lbig + (size_t)16 * nv, sz - (size_t)16 * nv) >
                1e-3f); /* later: the window matters */
    free(l16), free(ln), free(lbig);
    lms_model_free(m16), lms_model_free(mn), lms_model_free(mbig);
}

/* ---- soft-capping -------------------------------------------------------------------- */

static void check_cap(const lms_synth_extra *x, float cap, bool bites)
{
    lms_model *m = make_model(lms_synth_find("gemma2-tiny"), x, "F32");
    assert_true(m->hp.final_softcap == cap);
    const int32_t nv = m->hp.n_vocab;
    int32_t toks[N_TOK];
    fill_tokens(toks, N_TOK, nv, 3);
    float *lg = malloc((size_t)N_TOK * nv * sizeof *lg);
    run_prefill(m, toks, N_TOK, FWD_ATT_AUTO, lg);
    float mx = 0.0f;
    for (size_t i = 0; i < (size_t)N_TOK * nv; i++) {
        assert_false(isnan(lg[i]));
        mx = fabsf(lg[i]) > mx ? fabsf(lg[i]) : mx;
    }
    assert_true(mx <= cap);
    if (bites)
        assert_true(mx > 0.5f * cap); /* the cap is reached on these weights */
    free(lg);
    lms_model_free(m);
}

static void test_softcap(void **state)
{
    (void)state;
    lms_synth_extra x = {16, 4.0f, 2.0f, 0.08f};
    check_cap(&x, 2.0f, true);
    x.final_softcap = 0.5f;
    x.attn_softcap = 0.25f;
    check_cap(&x, 0.5f, true);
    x.final_softcap = 0.0f; /* gemma2 without the key: llama.cpp's default 30 */
    check_cap(&x, 30.0f, false);
}

/* ---- kernels ISAs ------------------------------------------------------------------------ */

/* The logits this process computes for the ISA comparison (f32 weights,
 * then q8_0): gemma3-tiny prompt, gemma2-tiny decode. */
static float *isa_logits(size_t *n)
{
    lms_model *m3 = make_table_model("gemma3-tiny", "F32");
    lms_model *m2 = make_table_model("gemma2-tiny", "Q8_0");
    const int32_t nv = m3->hp.n_vocab;
    int32_t toks[N_TOK];
    fill_tokens(toks, N_TOK, nv, 21);
    *n = (size_t)2 * N_TOK * nv;
    float *out = malloc(*n * sizeof *out);
    run_prefill(m3, toks, N_TOK, FWD_ATT_AUTO, out);
    assert_true(run_decode(m2, toks, N_TOK, FWD_ATT_AUTO, 2, 1, NULL, out + (size_t)N_TOK * nv));
    lms_model_free(m3);
    lms_model_free(m2);
    return out;
}

static void test_isas(void **state)
{
    (void)state;
    size_t n;
    float *mine = isa_logits(&n);
    const char *isas[] = {"scalar", "avx2", "avx512"};
    char self[512], path[128], cmd[1024];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(k > 0);
    self[k] = 0;
    int runs = 0;
    for (size_t i = 0; i < 3; i++) {
        if (!lms_kernels_for_isa(isas[i]))
            continue;
        snprintf(path, sizeof path, "/tmp/lms_test_gemma_%d_%s.f32", (int)getpid(), isas[i]);
        snprintf(cmd, sizeof cmd, "LMS_ISA=%s LMS_GEMMA_DUMP=%s '%s'", isas[i], path, self);
        assert_int_equal(system(cmd), 0);
        size_t m;
        float *theirs = tu_read_f32(path, &m);
        unlink(path);
        assert_non_null(theirs);
        assert_int_equal(m, n);
        const float d32 = tu_max_diff(mine, theirs, n / 2);
        const float dq = tu_max_diff(mine + n / 2, theirs + n / 2, n / 2);
        if (d32 > 1e-2f || dq > 0.25f) /* the golden tolerances for f32 and q8_0 */
            fail_msg("LMS_ISA=%s: f32 differs by %g, q8_0 by %g", isas[i], d32, dq);
        free(theirs);
        runs++;
    }
    assert_true(runs >= 1);
    free(mine);
}

/* ---- LoRA ------------------------------------------------------------------------------------ */

static void test_lora(void **state)
{
    (void)state;
    char mpath[128], lpath[128], err[256];
    snprintf(mpath, sizeof mpath, "/tmp/lms_test_gemma_%d_m.gguf", (int)getpid());
    snprintf(lpath, sizeof lpath, "/tmp/lms_test_gemma_%d_l.gguf", (int)getpid());
    assert_int_equal(
        lms_synth_write(lms_synth_find("gemma3-tiny"), "F32", 7, mpath, err, sizeof err), 0);
    lms_synth_lora_params lp = {.rank = 4, .alpha = 8.0f, .seed = 3};
    assert_int_equal(lms_synth_lora_write(mpath, &lp, lpath, err, sizeof err), 0);
    lms_model *m = NULL;
    lms_lora *lo = NULL;
    assert_int_equal(lms_model_load(mpath, &m, err, sizeof err), 0);
    if (lms_lora_load(lpath, m, &lo, err, sizeof err) < 0)
        fail_msg("%s", err);
    unlink(mpath), unlink(lpath);
    const int32_t nv = m->hp.n_vocab, n = 20;
    int32_t toks[20];
    fill_tokens(toks, n, nv, 4);
    lms_lora_set none = {0}, with;
    lms_lora_use use = {lo, 1.0f};
    assert_int_equal(lms_lora_set_make(&with, &use, 1, err, sizeof err), 0);
    const size_t sz = (size_t)n * nv * sizeof(float);
    float *base = malloc(sz), *ad = malloc(sz), *mixed = malloc(sz);
    const lms_lora_set *solo_base[1] = {&none}, *solo_ad[1] = {&with};
    /* sequence 0 with the adapter, 1 without, 2 with: sequence 0's rows */
    const lms_lora_set *mix[3] = {&with, &none, &with};
    assert_true(run_decode(m, toks, n, FWD_ATT_AUTO, 2, 1, solo_base, base));
    assert_true(run_decode(m, toks, n, FWD_ATT_AUTO, 2, 1, solo_ad, ad));
    assert_true(run_decode(m, toks, n, FWD_ATT_AUTO, 2, 3, mix, mixed));
    float *plain = malloc(sz);
    run_prefill(m, toks, n, FWD_ATT_AUTO, plain);
    assert_true(tu_max_diff(base, plain, (size_t)n * nv) <= 5e-3f);
    assert_true(tu_max_diff(ad, base, (size_t)n * nv) > 1e-2f); /* the adapter acts */
    assert_true(tu_max_diff(ad, mixed, (size_t)n * nv) <= 1e-5f);
    free(base), free(ad), free(mixed), free(plain);
    lms_lora_release(lo);
    lms_model_free(m);
}

/* ---- GPU placement -------------------------------------------------------------------------- */

/* A CPU-only build refuses an explicit --gpu-layers for gemma as for any
 * model, and auto stays on the CPU; CUDA builds run gemma's layers on the
 * GPU (tests/cuda/test_gemma_cuda.c). */
static void test_no_gpu(void **state)
{
    (void)state;
#ifdef LMS_HAVE_CUDA
    skip();
#else
    lms_model *m = make_table_model("gemma3-tiny", "F16");
    lms_ctx_params p = {.n_ctx = N_CTX, .n_batch = 8, .n_seq = 1, .n_threads = 1, .gpu_layers = 2};
    char err[256] = "";
    lms_ctx *c = NULL;
    assert_int_equal(lms_ctx_create(m, &p, &c, err, sizeof err), LMS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "without CUDA"));
    p.gpu_layers = LMS_GPU_LAYERS_AUTO; /* auto: everything stays on the CPU */
    assert_int_equal(lms_ctx_create(m, &p, &c, err, sizeof err), 0);
    assert_null(lms_ctx_gpu_plan(c));
    lms_ctx_destroy(c);
    lms_model_free(m);
#endif
}

int main(void)
{
    const char *dump = getenv("LMS_GEMMA_DUMP"); /* a child of test_isas */
    if (dump) {
        size_t n;
        float *v = isa_logits(&n);
        FILE *f = fopen(dump, "wb");
        int ok = f && fwrite(v, sizeof *v, n, f) == n;
        if (f)
            ok &= fclose(f) == 0;
        free(v);
        return ok ? 0 : 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hparams),       cmocka_unit_test(test_decode_gemma3),
        cmocka_unit_test(test_decode_gemma2), cmocka_unit_test(test_window_one_layer),
        cmocka_unit_test(test_window_full),   cmocka_unit_test(test_window_long),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_isas),          cmocka_unit_test(test_lora),
        cmocka_unit_test(test_no_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
