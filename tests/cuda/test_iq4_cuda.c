/*
 * test_iq4_cuda.c - the CUDA kernels of the IQ4_NL and IQ4_XS weight types
 * against the CPU.
 *
 * kernels  random matrices of each type (odd row counts; an odd number of
 *          blocks a row, so IQ4_XS rows are 8-byte aligned only) through
 *          lcu_matmul:
 *          - the generic path (an lcu made with LMS_CUDA_MMVQ=0: matvec_k
 *            over deq_unit) with one-hot activations, so that every output
 *            is one dequantized weight: it must equal the CPU reference
 *            dequantization (to_float ref) exactly, for every weight;
 *          - the int8 decode path (mmvq, q8 activations) for 1..8 tokens,
 *            the generic path for 1..8 tokens and the cuBLAS path (f16
 *            tiles) for 20 tokens, with integer activations of max 127 per
 *            32 (which q8 represents exactly), against the reference dot
 *            product in double;
 * model    a small Llama with random weights (model/synth.c, so no test
 *          data is needed) written with the IQ4_NL and IQ4_XS plans
 *          (every layer matrix of that type, the head Q6_K), run on the
 *          CPU and on the GPU with every layer there (int8 decode kernels,
 *          then LMS_CUDA_MMVQ=0 for the generic ones) and with a split
 *          (2 of 4 layers): a 21-token prompt (cuBLAS), 6 one-token steps
 *          and a 5-token chunk (matrix-vector kernels); every logit row is
 *          compared with the CPU's. The plan must put the asked layers on
 *          the GPU.
 *
 * Exits 77 (skipped) without a CUDA build or without a device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/quant_plan.h"
#include "model/synth.h"
#include "testutil.h"
#ifdef LMS_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

/* GPU against CPU logits of the same IQ4 model (logits RMS printed).
 * The sides differ in activation rounding: the GPU's decode products
 * take q8 per 32 values (the CPU IQ4_XS kernel q8_K per 256), its prompt
 * products f16 activations and weights. */
#define MODEL_TOL 0.25f /* absolute, as test_golden_cuda's for quantized models */
#define MODEL_REL 2.0f  /* at most this times the Q4_0 model's GPU - CPU difference, */
#define MODEL_ABS 0.05f /* or this */
#define MMVQ_REL 1e-5 /* |y - ref| / sum |w x|: exact integer sums, float scaling */
#define GEMM_REL 2e-3 /* f16 weights: 2^-11 relative per weight */

#ifdef LMS_HAVE_CUDA

static const int k_types[2] = {LMS_TYPE_IQ4_NL, LMS_TYPE_IQ4_XS};
static const char *k_names[2] = {"IQ4_NL", "IQ4_XS"};

/* ---- kernels ---------------------------------------------------------------------- */

typedef struct dev_mat {
    lcu_mat m;
    void *dev;
    size_t bytes;
    float *ref; /* [n_rows][n_cols]: the CPU reference dequantization */
} dev_mat;

static lcu *open_lcu(bool mmvq, int64_t max_cols, int64_t max_rows)
{
    char err[256];
    lcu *g;
    setenv("LMS_CUDA_MMVQ", mmvq ? "1" : "0", 1);
    const int rc = lcu_create(-1, &g, NULL, err, sizeof err);
    unsetenv("LMS_CUDA_MMVQ");
    if (rc < 0)
        fail_msg("%s", err);
    if (lcu_reserve(g, max_cols, max_rows, 32, 1, 64, err, sizeof err) < 0)
        fail_msg("%s", err);
    return g;
}

/* A random n_rows x n_cols matrix of `type` on the device. */
static void make_mat(lcu *g, dev_mat *d, int type, int64_t n_cols, int64_t n_rows, uint64_t *rs)
{
    char err[256];
    float *w = malloc((size_t)(n_cols * n_rows) * sizeof *w);
    for (int64_t i = 0; i < n_cols * n_rows; i++)
        w[i] = tu_rand_f32(rs, -1.0f, 1.0f) * (i % 13 == 0 ? 4.0f : 1.0f);
    size_t nb;
    void *q = lms_quant_rows(w, n_cols, n_rows, type, &nb, NULL);
    assert_non_null(q);
    free(w);
    d->ref = malloc((size_t)(n_cols * n_rows) * sizeof *d->ref);
    lms_kernels_ref()->to_float[type](q, d->ref, n_cols * n_rows);
    /* padded as forward_cuda's weight allocations are: the int8 kernels read
     * 2-byte aligned blocks (IQ4_NL) as whole aligned words, up to 2 bytes
     * past a matrix's end */
    d->bytes = nb + 16;
    d->dev = lcu_alloc(g, d->bytes, err, sizeof err);
    if (!d->dev)
        fail_msg("%s", err);
    assert_int_equal(lcu_upload(g, d->dev, q, nb), 0);
    d->m = (lcu_mat){d->dev, type, n_cols, n_rows, nb / (size_t)n_rows};
    free(q);
}

static void free_mat(lcu *g, dev_mat *d)
{
    lcu_free(g, d->dev, d->bytes);
    free(d->ref);
}

/* y [n_tok][n_rows] = W x for host x [n_tok][n_cols]. */
static void matmul(lcu *g, const dev_mat *d, const float *x, int64_t n_tok, float *y)
{
    char err[256];
    const size_t xb = (size_t)(n_tok * d->m.n_cols) * sizeof(float);
    const size_t yb = (size_t)(n_tok * d->m.n_rows) * sizeof(float);
    float *dx = lcu_alloc(g, xb, err, sizeof err), *dy = lcu_alloc(g, yb, err, sizeof err);
    assert_true(dx && dy);
    assert_int_equal(lcu_upload(g, dx, x, xb), 0);
    assert_int_equal(lcu_matmul(g, &d->m, dx, n_tok, dy, false), 0);
    assert_int_equal(lcu_download(g, y, dy, yb), 0);
    if (lcu_sync(g, err, sizeof err) < 0)
        fail_msg("%s", err);
    lcu_free(g, dx, xb);
    lcu_free(g, dy, yb);
}

/* Generic path, one-hot activations: every weight read back exactly. */
static void check_dequant_exact(lcu *g, const dev_mat *d, const char *name)
{
    const int64_t nc = d->m.n_cols, nr = d->m.n_rows;
    float *x = calloc((size_t)(8 * nc), sizeof *x), *y = malloc((size_t)(8 * nr) * sizeof *y);
    int64_t bad = 0;
    for (int64_t c0 = 0; c0 < nc; c0 += 8) {
        const int64_t nt = nc - c0 < 8 ? nc - c0 : 8;
        memset(x, 0, (size_t)(8 * nc) * sizeof *x);
        for (int64_t t = 0; t < nt; t++)
            x[t * nc + c0 + t] = 1.0f;
        matmul(g, d, x, nt, y);
        for (int64_t t = 0; t < nt; t++)
            for (int64_t r = 0; r < nr; r++) {
                const float want = d->ref[r * nc + c0 + t], got = y[t * nr + r];
                if (got != want && bad++ < 5)
                    printf("  %s row %lld col %lld: GPU %.9g, CPU reference %.9g\n", name,
                           (long long)r, (long long)(c0 + t), got, want);
            }
    }
    printf("cuda iq4 %-6s %lldx%lld generic dequantization: %lld of %lld weights differ\n", name,
           (long long)nr, (long long)nc, (long long)bad, (long long)(nr * nc));
    if (bad)
        fail_msg("%s: %lld dequantized weights differ from the CPU reference", name,
                 (long long)bad);
    free(x);
    free(y);
}

/* Random activations, integers with max |x| = 127 in every 32 (exact in
 * q8 and f16); the worst |y - ref| / sum |w x| over all outputs. */
static double matmul_err(lcu *g, const dev_mat *d, int64_t n_tok, uint64_t *rs)
{
    const int64_t nc = d->m.n_cols, nr = d->m.n_rows;
    float *x = calloc((size_t)(n_tok * nc), sizeof *x), *y = malloc((size_t)(n_tok * nr) * sizeof *y);
    for (int64_t i = 0; i < n_tok * nc; i++)
        x[i] = i % 32 == (i / 32) % 32 ? (i & 32 ? 127.0f : -127.0f)
                                       : (float)(int)tu_rand_f32(rs, -127.0f, 127.0f);
    matmul(g, d, x, n_tok, y);
    double worst = 0;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < nr; r++) {
            double ref = 0, mag = 0;
            for (int64_t c = 0; c < nc; c++) {
                ref += (double)d->ref[r * nc + c] * x[t * nc + c];
                mag += fabs((double)d->ref[r * nc + c] * x[t * nc + c]);
            }
            const double e = fabs(y[t * nr + r] - ref) / (mag + 1e-30);
            worst = e > worst ? e : worst;
        }
    free(x);
    free(y);
    return worst;
}

static void test_kernels(void **state)
{
    (void)state;
    /* IQ4_NL: 7 blocks a row; IQ4_XS: 3 super-blocks (408-byte rows) */
    const int64_t cols[2] = {7 * 32, 3 * 256}, rows = 37;
    lcu *gq = open_lcu(true, 3 * 256, rows), *gg = open_lcu(false, 3 * 256, rows);
    uint64_t rs = 0x1234;
    for (int k = 0; k < 2; k++) {
        assert_true(lcu_type_supported(k_types[k]));
        assert_true(lcu_q8_type(k_types[k]));
        dev_mat dq, dg;
        uint64_t r0 = rs;
        make_mat(gq, &dq, k_types[k], cols[k], rows, &rs);
        make_mat(gg, &dg, k_types[k], cols[k], rows, &r0); /* the same matrix */
        check_dequant_exact(gg, &dg, k_names[k]);
        double wq = 0, wg = 0;
        for (int64_t nt = 1; nt <= 8; nt++) {
            const double eq = matmul_err(gq, &dq, nt, &rs), eg = matmul_err(gg, &dg, nt, &rs);
            wq = eq > wq ? eq : wq;
            wg = eg > wg ? eg : wg;
        }
        const double e20 = matmul_err(gq, &dq, 20, &rs);
        printf("cuda iq4 %-6s %lldx%lld worst |y - ref| / sum |w x|: int8 1-8 tokens %.2e, "
               "generic 1-8 tokens %.2e, cuBLAS 20 tokens %.2e\n",
               k_names[k], (long long)rows, (long long)cols[k], wq, wg, e20);
        if (!(wq <= MMVQ_REL && wg <= MMVQ_REL && e20 <= GEMM_REL))
            fail_msg("%s: products differ from the reference (int8 %g, generic %g, cuBLAS %g)",
                     k_names[k], wq, wg, e20);
        free_mat(gq, &dq);
        free_mat(gg, &dg);
    }
    lcu_destroy(gq);
    lcu_destroy(gg);
}

/* ---- model ------------------------------------------------------------------------- */

#define N_PROMPT 21
#define N_STEPS 6
#define N_CHUNK 5
#define N_ROWS (N_PROMPT + N_STEPS + N_CHUNK)

/* Logits of the fixed token script, [N_ROWS][n_vocab]; plan checked. */
static float *run_script(const char *path, int type, int32_t gpu_layers, bool mmvq, int32_t *nv,
                         int32_t *n_gpu)
{
    char err[512];
    lms_model *m;
    lms_ctx *c;
    if (lms_model_load(path, &m, err, sizeof err) < 0)
        fail_msg("%s: %s", path, err);
    for (int32_t l = 0; type >= 0 && l < m->hp.n_layer; l++) {
        const lms_layer *ly = &m->layers[l];
        const lms_weight *ws[7] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w_gate, &ly->w_up, &ly->w_down};
        for (int i = 0; i < 7; i++)
            assert_int_equal(ws[i]->type, type);
    }
    if (!mmvq)
        setenv("LMS_CUDA_MMVQ", "0", 1);
    lms_ctx_params p = {.n_ctx = 128, .n_batch = 64, .n_seq = 1, .gpu_layers = gpu_layers};
    const int rc = lms_ctx_create(m, &p, &c, err, sizeof err);
    unsetenv("LMS_CUDA_MMVQ");
    if (rc < 0)
        fail_msg("%s: %s", path, err);
    *n_gpu = 0;
    if (gpu_layers != 0) {
        const lms_gpu_plan *pl = lms_ctx_gpu_plan(c);
        assert_non_null(pl);
        const int32_t want = gpu_layers == LMS_GPU_LAYERS_ALL ? m->hp.n_layer : gpu_layers;
        if (pl->n_layer_gpu != want)
            fail_msg("%s: the plan put %d of %d layers on the GPU, %d asked", path,
                     pl->n_layer_gpu, m->hp.n_layer, want);
        *n_gpu = pl->n_layer_gpu;
    }
    *nv = m->hp.n_vocab;
    float *lg = malloc((size_t)N_ROWS * (size_t)*nv * sizeof *lg);
    int32_t toks[N_ROWS], pos[N_ROWS];
    lms_kv_seq seq = {0}, *seqs[N_ROWS];
    bool want[N_ROWS];
    for (int32_t i = 0; i < N_ROWS; i++) {
        toks[i] = (int32_t)((i * 37 + 11) % *nv);
        pos[i] = i;
        seqs[i] = &seq;
        want[i] = true;
    }
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &seq, N_ROWS), 0);
    /* the prompt, the single steps, the chunk */
    const int32_t calls[3][2] = {{0, N_PROMPT}, {N_PROMPT, 1}, {N_PROMPT + N_STEPS, N_CHUNK}};
    for (int k = 0; k < 3; k++) {
        const int32_t reps = k == 1 ? N_STEPS : 1;
        for (int32_t s = 0; s < reps; s++) {
            const int32_t i0 = calls[k][0] + s, n = calls[k][1];
            lms_batch b = {.n_tokens = n, .tokens = toks + i0, .pos = pos + i0, .seq = seqs + i0,
                           .logits = want + i0};
            assert_int_equal(lms_forward(c, &b, lg + (size_t)i0 * (size_t)*nv), 0);
        }
    }
    lms_kv_seq_release(lms_ctx_kv(c), &seq);
    lms_ctx_destroy(c);
    lms_model_free(m);
    return lg;
}

/* Max |GPU - CPU| of the script's logits for the model written with `plan`
 * in each GPU mode: [0] all layers, [1] all with the generic kernels,
 * [2] split; per mode the prompt (cuBLAS) and the steps + chunk (mat-vec)
 * apart. */
#define N_MODES 3
static void model_diffs(const char *plan, int type, float (*d)[2])
{
    /* 4 layers; n_embd 256 (IQ4_XS rows of one 136-byte super-block), n_ff
     * 768 (three); separate Q6_K head */
    const lms_synth_shape shape = {.name = "iq4-test", .arch = "llama", .n_embd = 256,
                                   .n_layer = 4, .n_head = 4, .n_head_kv = 2, .head_dim = 64,
                                   .n_ff = 768, .n_vocab = 1024, .n_ctx = 512,
                                   .rope_base = 10000.0f, .rms_eps = 1e-5f};
    const lms_synth_extra extra = {.w_sd = 0.05f};
    char path[] = "/tmp/lms_test_iq4_cuda_XXXXXX", err[512];
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    if (lms_synth_write_ex(&shape, &extra, plan, 7, path, err, sizeof err) < 0)
        fail_msg("%s", err);
    int32_t nv, ng;
    float *cpu = run_script(path, type, 0, true, &nv, &ng);
    const size_t cnt = (size_t)N_ROWS * (size_t)nv, np = (size_t)N_PROMPT * (size_t)nv;
    double ss = 0;
    for (size_t i = 0; i < cnt; i++)
        ss += (double)cpu[i] * cpu[i];
    const int32_t modes[N_MODES] = {LMS_GPU_LAYERS_ALL, LMS_GPU_LAYERS_ALL, 2};
    const char *names[N_MODES] = {"all", "all-generic", "split"};
    for (int i = 0; i < N_MODES; i++) {
        float *gpu = run_script(path, type, modes[i], i != 1, &nv, &ng);
        d[i][0] = tu_max_diff(gpu, cpu, np);
        d[i][1] = tu_max_diff(gpu + np, cpu + np, cnt - np);
        printf("cuda iq4 %-6s %-11s (%d/%d layers + head on GPU): max |GPU - CPU| prompt %.3g, "
               "steps + chunk %.3g (logits rms %.3g)\n",
               plan, names[i], ng, shape.n_layer, d[i][0], d[i][1], sqrt(ss / (double)cnt));
        free(gpu);
    }
    free(cpu);
    unlink(path);
}

static void test_model(void **state)
{
    (void)state;
    float base[N_MODES][2], d[2][N_MODES][2];
    model_diffs("Q4_0", -1, base);
    for (int k = 0; k < 2; k++)
        model_diffs(k_names[k], k_types[k], d[k]);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N_MODES; i++)
            for (int j = 0; j < 2; j++) {
                const float lim = fmaxf(MODEL_REL * base[i][j], MODEL_ABS);
                if (!(d[k][i][j] <= lim && d[k][i][j] <= MODEL_TOL))
                    fail_msg("%s mode %d %s: GPU logits differ from the CPU's by %g (Q4_0's: %g; "
                             "limit %g)",
                             k_names[k], i, j ? "steps" : "prompt", d[k][i][j], base[i][j],
                             fminf(lim, MODEL_TOL));
            }
}

#endif

int main(void)
{
#ifdef LMS_HAVE_CUDA
    lcu *g;
    char err[256];
    if (lcu_create(-1, &g, NULL, err, sizeof err) < 0) {
        printf("SKIP: %s\n", err);
        return 77;
    }
    lcu_destroy(g);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    printf("SKIP: built without CUDA\n");
    return 77;
#endif
}
