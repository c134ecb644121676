/*
 * test_phi3.c - the phi3 architecture (model.c's fused views and LongRoPE,
 * forward.c's LongRoPE factors) on tiny synthetic models (synth.c's
 * phi3-tiny and phi3-tiny-128k); the logits themselves were compared with
 * llama.cpp outside the tree. Checked here:
 *
 *   - the loader: hyper-parameters, q/k/v and gate/up as row ranges of the
 *     fused tensors, the sliding-window key left unapplied (as llama.cpp);
 *   - the same weights written un-fused (a qwen2 file: NEOX RoPE like phi3,
 *     with zero biases) give bit-identical logits, for f32 and quantized
 *     files, and so does a phi3 file with separate attn_q/k/v;
 *   - one-token decode steps agree with the prompt run in one batch;
 *   - malformed fused tensors and LongRoPE parts are refused by name;
 *   - LongRoPE: the short factors up to original_context_length positions
 *     per sequence, the long ones beyond, and the attention factor equal to
 *     scaling the query and key rows by it.
 * The GPU's phi3 layers, with LongRoPE: tests/cuda/test_phi3_cuda.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#define N_TOK 40 /* past phi3-tiny's (unapplied) window of 16 */

/* ---- files
 * --------------------------------------------------------------------- */

static void tmp_path(char *buf, size_t n, const char *tag)
{
    snprintf(buf, n, "/tmp/lms_test_phi3_%d_%s.gguf", (int)getpid(), tag);
}

static void write_shape(const char *shape, const char *type, const char *path)
{
    char err[256];
    const lms_synth_shape *s = lms_synth_find(shape);
    assert_non_null(s);
    if (lms_synth_write(s, type, 7, path, err, sizeof err) < 0)
        fail_msg("%s", err);
}

static lms_model *load_ok(const char *path)
{
    char err[256];
    lms_model *m = NULL;
    if (lms_model_load(path, &m, err, sizeof err) < 0)
        fail_msg("%s: %s", path, err);
    return m;
}

/* Loads path expecting failure; the message must contain want and want2. */
static void load_fails(const char *path, const char *want, const char *want2)
{
    char err[256] = "";
    lms_model *m = NULL;
    assert_true(lms_model_load(path, &m, err, sizeof err) < 0);
    if (!strstr(err, want) || (want2 && !strstr(err, want2)))
        fail_msg("error '%s' does not name '%s'%s%s", err, want, want2 ? " / " : "",
                 want2 ? want2 : "");
}

/* Rewrites of a phi3 file (rewrite below). */
enum edit {
    EDIT_SPLIT_QWEN2,   /* un-fused, as a qwen2 file with zero biases */
    EDIT_SPLIT_QKV,     /* phi3 with separate attn_q/k/v (ffn_up stays fused) */
    EDIT_QKV_SHORT,     /* blk.0.attn_qkv.weight without its v rows */
    EDIT_QKV_BIAS_BAD,  /* a blk.0.attn_qkv.bias one value short */
    EDIT_UP_UNFUSED,    /* blk.0: ffn_gate and ffn_up of n_ff rows each */
    EDIT_NO_QKV,        /* blk.1.attn_qkv.weight dropped */
    EDIT_NO_SHORT,      /* rope_factors_short.weight dropped */
    EDIT_ZERO_FACTOR,   /* rope_factors_long.weight with a 0 */
    EDIT_LONG_IS_SHORT, /* rope_factors_long.weight = the short factors */
    EDIT_QK_SCALED,     /* attn_factor 1, q and k rows times the file's one (f32) */
    EDIT_ATTN_FACTOR_1, /* attn_factor 1 */
};

static bool skip_arch_keys(const char *key)
{
    return !strncmp(key, "phi3.", 5) || !strcmp(key, "general.architecture");
}

static bool skip_attn_factor(const char *key)
{
    return !strcmp(key, "phi3.rope.scaling.attn_factor");
}

/* Adds rows [r0, r0 + n) of matrix t as `name`. */
static void add_rows(gguf_writer *w, const gguf_tensor *t, const char *name, int64_t r0, int64_t n)
{
    const size_t rb = lms_row_size(t->type, t->ne[0]);
    const int64_t ne[2] = {t->ne[0], n};
    assert_int_equal(gguf_writer_add_tensor(w, name, t->type, 2, ne,
                                            (const uint8_t *)t->data + (size_t)r0 * rb,
                                            (size_t)n * rb, true),
                     0);
}

static void add_f32(gguf_writer *w, const char *name, int n_dims, const int64_t *ne, const float *v)
{
    size_t n = (size_t)ne[0] * (n_dims > 1 ? (size_t)ne[1] : 1);
    assert_int_equal(gguf_writer_add_tensor(w, name, LMS_TYPE_F32, n_dims, ne, v, n * 4, false), 0);
}

static void set_qwen2_keys(gguf_writer *w, const gguf_file *f)
{
    static const char *const u32s[] = {
        "context_length",       "embedding_length",       "block_count",
        "feed_forward_length",  "attention.head_count",   "attention.head_count_kv",
        "attention.key_length", "attention.value_length", "rope.dimension_count"};
    static const char *const f32s[] = {"rope.freq_base", "attention.layer_norm_rms_epsilon"};
    char key[96];
    assert_int_equal(gguf_writer_set_str(w, "general.architecture", "qwen2"), 0);
    for (size_t i = 0; i < sizeof u32s / sizeof u32s[0]; i++) {
        uint32_t v;
        snprintf(key, sizeof key, "phi3.%s", u32s[i]);
        assert_int_equal(gguf_get_u32(f, key, &v), 0);
        snprintf(key, sizeof key, "qwen2.%s", u32s[i]);
        assert_int_equal(gguf_writer_set_u32(w, key, v), 0);
    }
    for (size_t i = 0; i < sizeof f32s / sizeof f32s[0]; i++) {
        float v;
        snprintf(key, sizeof key, "phi3.%s", f32s[i]);
        assert_int_equal(gguf_get_f32(f, key, &v), 0);
        snprintf(key, sizeof key, "qwen2.%s", f32s[i]);
        assert_int_equal(gguf_writer_set_f32(w, key, v), 0);
    }
}

/* The tensor t of the rewrite of src by edit e. */
static void rewrite_tensor(gguf_writer *w, const gguf_file *f, const gguf_tensor *t, enum edit e,
                           const lms_hparams *hp)
{
    const int64_t q = (int64_t)hp->n_head * hp->head_dim,
                  kv = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t ff = hp->n_ff;
    int il = -1;
    char sfx[64] = "", name[96];
    sscanf(t->name.p, "blk.%d.%63s", &il, sfx);
    const bool split = e == EDIT_SPLIT_QWEN2 || e == EDIT_SPLIT_QKV;
    if (!strcmp(sfx, "attn_qkv.weight") && (split || (il == 1 && e == EDIT_NO_QKV))) {
        if (!split)
            return;
        const char *parts[3] = {"attn_q", "attn_k", "attn_v"};
        const int64_t r0[3] = {0, q, q + kv}, n[3] = {q, kv, kv};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", il, parts[i]);
            add_rows(w, t, name, r0[i], n[i]);
            if (e != EDIT_SPLIT_QWEN2)
                continue;
            float *zero = calloc((size_t)n[i], sizeof *zero);
            snprintf(name, sizeof name, "blk.%d.%s.bias", il, parts[i]);
            add_f32(w, name, 1, &n[i], zero);
            free(zero);
        }
        return;
    }
    if (!strcmp(sfx, "attn_qkv.weight") && il == 0 && e == EDIT_QKV_SHORT) {
        add_rows(w, t, t->name.p, 0, q + kv);
        return;
    }
    if (!strcmp(sfx, "attn_qkv.weight") && e == EDIT_QK_SCALED) {
        float af;
        assert_int_equal(gguf_get_f32(f, "phi3.rope.scaling.attn_factor", &af), 0);
        assert_int_equal(t->type, LMS_TYPE_F32);
        const size_t n = (size_t)t->ne[0] * (size_t)t->ne[1];
        float *v = malloc(n * sizeof *v);
        memcpy(v, t->data, n * sizeof *v);
        for (size_t i = 0; i < (size_t)t->ne[0] * (size_t)(q + kv); i++)
            v[i] *= af;
        add_f32(w, t->name.p, 2, t->ne, v);
        free(v);
        return;
    }
    if (!strcmp(sfx, "ffn_up.weight") &&
        (e == EDIT_SPLIT_QWEN2 || (il == 0 && e == EDIT_UP_UNFUSED))) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", il);
        add_rows(w, t, name, 0, ff);
        add_rows(w, t, t->name.p, ff, ff);
        return;
    }
    if (!strcmp(t->name.p, "rope_factors_short.weight") && e == EDIT_NO_SHORT)
        return;
    if (!strcmp(t->name.p, "rope_factors_long.weight") &&
        (e == EDIT_ZERO_FACTOR || e == EDIT_LONG_IS_SHORT)) {
        const gguf_tensor *sh = gguf_find_tensor(f, "rope_factors_short.weight");
        float v[256];
        assert_true(t->ne[0] <= 256);
        memcpy(v, e == EDIT_ZERO_FACTOR ? t->data : sh->data, (size_t)t->ne[0] * 4);
        if (e == EDIT_ZERO_FACTOR)
            v[3] = 0.0f;
        add_f32(w, t->name.p, 1, t->ne, v);
        return;
    }
    assert_int_equal(
        gguf_writer_add_tensor(w, t->name.p, t->type, t->n_dims, t->ne, t->data, t->n_bytes, true),
        0);
    if (!strcmp(sfx, "attn_output.weight") && il == 0 && e == EDIT_QKV_BIAS_BAD) {
        const int64_t n = q + 2 * kv - 1;
        float *zero = calloc((size_t)n, sizeof *zero);
        add_f32(w, "blk.0.attn_qkv.bias", 1, &n, zero);
        free(zero);
    }
}

/* Writes dst: the phi3 file src changed by e. */
static void rewrite(const char *src, const char *dst, enum edit e)
{
    char err[256];
    lms_model *m = load_ok(src);
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(src, &f, err, sizeof err), 0);
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    if (e == EDIT_SPLIT_QWEN2) {
        assert_int_equal(gguf_writer_copy_kv(w, f, skip_arch_keys), 0);
        set_qwen2_keys(w, f);
    } else if (e == EDIT_QK_SCALED || e == EDIT_ATTN_FACTOR_1) {
        assert_int_equal(gguf_writer_copy_kv(w, f, skip_attn_factor), 0);
        assert_int_equal(gguf_writer_set_f32(w, "phi3.rope.scaling.attn_factor", 1.0f), 0);
    } else {
        assert_int_equal(gguf_writer_copy_kv(w, f, NULL), 0);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        rewrite_tensor(w, f, &f->tensors[i], e, &m->hp);
    if (gguf_writer_write(w, dst, err, sizeof err) < 0)
        fail_msg("%s", err);
    gguf_writer_destroy(w);
    gguf_close(f);
    lms_model_free(m);
}

/* ---- runs
 * ------------------------------------------------------------------------ */

static void fill_tokens(int32_t *toks, int32_t n, int32_t n_vocab, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++)
        toks[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)n_vocab);
}

/* Logits of every position of toks[0, n) in a context of n_ctx positions:
 * the prompt in one batch, or (decode) a token per step. */
static float *run(const lms_model *m, const int32_t *toks, int32_t n, int32_t n_ctx, bool decode)
{
    lms_ctx_params p = {.n_ctx = n_ctx, .n_batch = n, .n_seq = 1, .n_threads = 2};
    char err[256];
    lms_ctx *c = NULL;
    if (lms_ctx_create(m, &p, &c, err, sizeof err) < 0)
        fail_msg("%s", err);
    const int32_t nv = m->hp.n_vocab;
    float *out = malloc((size_t)n * nv * sizeof *out);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    lms_kv_seq s = {0}, **seqs = malloc((size_t)n * sizeof *seqs);
    bool *want = malloc((size_t)n * sizeof *want);
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &s, n), 0);
    for (int32_t i = 0; i < n; i++)
        pos[i] = i, seqs[i] = &s, want[i] = true;
    if (!decode) {
        lms_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .logits = want};
        assert_int_equal(lms_forward(c, &b, out), 0);
    }
    for (int32_t i = 0; decode && i < n; i++) {
        lms_batch b = {
            .n_tokens = 1, .tokens = toks + i, .pos = pos + i, .seq = seqs, .logits = want};
        assert_int_equal(lms_forward(c, &b, out + (size_t)i * nv), 0);
    }
    lms_kv_seq_release(lms_ctx_kv(c), &s);
    lms_ctx_destroy(c);
    free(pos);
    free(seqs);
    free(want);
    return out;
}

/* ---- tests
 * ------------------------------------------------------------------------- */

static void test_loader(void **state)
{
    (void)state;
    char path[128];
    tmp_path(path, sizeof path, "load");
    write_shape("phi3-tiny", "Q8_0", path);
    lms_model *m = load_ok(path);
    unlink(path);
    const lms_hparams *hp = &m->hp;
    assert_string_equal(hp->arch, "phi3");
    assert_int_equal(hp->rope_type, LMS_ROPE_NEOX);
    assert_int_equal(hp->n_embd, 192);
    assert_int_equal(hp->head_dim, 48);
    assert_int_equal(hp->n_ff, 512);
    assert_true(hp->rope_attn_factor == 1.0f);
    assert_null(lms_model_rope_factors(m, 1 << 20));
    assert_true(m->output.data != m->tok_embd.data); /* untied head */
    size_t sum = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++)
        sum += m->gguf->tensors[i].n_bytes;
    assert_int_equal(m->weight_bytes, sum); /* each fused tensor counted once */
    const int64_t q = 4 * 48, kv = 2 * 48;
    for (int il = 0; il < hp->n_layer; il++) {
        const lms_layer *l = &m->layers[il];
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
        const gguf_tensor *t = gguf_find_tensor(m->gguf, name);
        assert_non_null(t);
        const uint8_t *d = t->data;
        const size_t rb = lms_row_size(LMS_TYPE_Q8_0, 192);
        assert_int_equal(l->wq.type, LMS_TYPE_Q8_0);
        assert_ptr_equal(l->wq.data, d);
        assert_ptr_equal(l->wk.data, d + (size_t)q * rb);
        assert_ptr_equal(l->wv.data, d + (size_t)(q + kv) * rb);
        assert_int_equal(l->wq.ne[1], q);
        assert_int_equal(l->wk.ne[1], kv);
        assert_int_equal(l->wv.ne[1], kv);
        assert_int_equal(l->wv.row_bytes, rb);
        assert_null(l->bq.data);
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", il);
        t = gguf_find_tensor(m->gguf, name);
        assert_non_null(t);
        assert_ptr_equal(l->w_gate.data, t->data); /* gate: the first half */
        assert_ptr_equal(l->w_up.data, (const uint8_t *)t->data + (size_t)512 * rb);
        assert_int_equal(l->w_gate.ne[1], 512);
        assert_int_equal(l->w_up.ne[1], 512);
        assert_int_equal(l->n_swa, 0); /* sliding_window 16 in the file: not applied */
    }
    lms_model_free(m);
}

/* phi3 against the same weights un-fused: bit-identical logits. */
static void test_split_equal(void **state)
{
    (void)state;
    const char *types[] = {"F32", "F16", "Q8_0", "Q4_0", "Q4_K_M"};
    char pf[128], ps[128], pq[128];
    tmp_path(pf, sizeof pf, "fused");
    tmp_path(ps, sizeof ps, "qwen2");
    tmp_path(pq, sizeof pq, "splitqkv");
    int32_t toks[N_TOK];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        write_shape("phi3-tiny", types[k], pf);
        rewrite(pf, ps, EDIT_SPLIT_QWEN2);
        rewrite(pf, pq, EDIT_SPLIT_QKV);
        lms_model *mf = load_ok(pf), *ms = load_ok(ps), *mq = load_ok(pq);
        assert_string_equal(ms->hp.arch, "qwen2");
        assert_non_null(ms->layers[0].bq.data);
        const size_t n = (size_t)N_TOK * mf->hp.n_vocab;
        fill_tokens(toks, N_TOK, mf->hp.n_vocab, 11 + k);
        float *lf = run(mf, toks, N_TOK, 64, false), *ls = run(ms, toks, N_TOK, 64, false);
        float *lq = run(mq, toks, N_TOK, 64, false);
        float *df = run(mf, toks, N_TOK, 64, true), *ds = run(ms, toks, N_TOK, 64, true);
        if (memcmp(lf, ls, n * sizeof *lf) || memcmp(lf, lq, n * sizeof *lf) ||
            memcmp(df, ds, n * sizeof *df))
            fail_msg("%s: fused and un-fused differ: prefill %g, separate q/k/v %g, "
                     "decode %g",
                     types[k], tu_max_diff(lf, ls, n), tu_max_diff(lf, lq, n),
                     tu_max_diff(df, ds, n));
        /* decode steps against the batch; q8_0 activations: a batch's rounding
         * can flip a value (the test data README's golden tolerance) */
        assert_true(tu_max_diff(lf, df, n) <= (k < 2 ? 5e-3f : 0.25f));
        free(lf), free(ls), free(lq), free(df), free(ds);
        lms_model_free(mf), lms_model_free(ms), lms_model_free(mq);
    }
    unlink(pf), unlink(ps), unlink(pq);
}

static void test_malformed(void **state)
{
    (void)state;
    char src[128], bad[128];
    tmp_path(src, sizeof src, "src");
    tmp_path(bad, sizeof bad, "bad");
    write_shape("phi3-tiny", "Q8_0", src);
    rewrite(src, bad, EDIT_QKV_SHORT);
    load_fails(bad, "'blk.0.attn_qkv.weight' has shape [192, 288, 1, 1], expected [192, 384]",
               "q, k, v fused");
    rewrite(src, bad, EDIT_QKV_BIAS_BAD);
    load_fails(bad, "'blk.0.attn_qkv.bias' has shape [383, 1, 1, 1], expected [384, 1]", NULL);
    rewrite(src, bad, EDIT_UP_UNFUSED);
    load_fails(bad, "'blk.0.ffn_up.weight' has shape [192, 512, 1, 1], expected [192, 1024]",
               "gate, up fused");
    rewrite(src, bad, EDIT_NO_QKV);
    load_fails(bad, "'blk.1.attn_qkv.weight' is missing", NULL);
    write_shape("phi3-tiny-128k", "F32", src);
    rewrite(src, bad, EDIT_NO_SHORT);
    load_fails(bad, "'rope_factors_short.weight' is missing", "LongRoPE");
    rewrite(src, bad, EDIT_ZERO_FACTOR);
    load_fails(bad, "'rope_factors_long.weight' value 3 is 0", NULL);
    unlink(src), unlink(bad);
}

static void test_longrope(void **state)
{
    (void)state;
    char p[128], pls[128], pqk[128], p1[128];
    tmp_path(p, sizeof p, "lr");
    tmp_path(pls, sizeof pls, "lr_ls");
    tmp_path(pqk, sizeof pqk, "lr_qk");
    tmp_path(p1, sizeof p1, "lr_1");
    write_shape("phi3-tiny-128k", "F32", p);
    rewrite(p, pls, EDIT_LONG_IS_SHORT);
    rewrite(p, pqk, EDIT_QK_SCALED);
    rewrite(p, p1, EDIT_ATTN_FACTOR_1);
    lms_model *m = load_ok(p), *mls = load_ok(pls), *mqk = load_ok(pqk), *m1 = load_ok(p1);
    assert_int_equal(m->hp.n_ctx_orig, 512);
    /* the converter's sqrt(1 + ln(4096 / 512) / ln(512)) */
    assert_true(fabsf(m->hp.rope_attn_factor - sqrtf(4.0f / 3.0f)) < 1e-6f);
    assert_ptr_equal(lms_model_rope_factors(m, 512), m->rope_short.data);
    assert_ptr_equal(lms_model_rope_factors(m, 513), m->rope_long.data);
    assert_int_equal(m->rope_long.ne[0], 24);
    const int32_t nv = m->hp.n_vocab;
    const size_t n = (size_t)N_TOK * nv;
    int32_t toks[N_TOK];
    fill_tokens(toks, N_TOK, nv, 5);
    float *ls = run(m, toks, N_TOK, 64, false), *ll = run(m, toks, N_TOK, 1024, false);
    float *ls2 = run(mls, toks, N_TOK, 1024, false); /* long factors = short ones */
    float *lqk = run(mqk, toks, N_TOK, 64, false), *ld = run(m, toks, N_TOK, 1024, true);
    float *l1 = run(m1, toks, N_TOK, 64, false);
    /* position 0 has no rotation: only the attention factor, the same both ways
     */
    assert_true(tu_max_diff(ls, ll, (size_t)nv) == 0.0f);
    assert_true(tu_max_diff(ls, ll, n) > 1e-2f);  /* the factors matter */
    assert_true(tu_max_diff(ls, ls2, n) == 0.0f); /* 1024 > 512 took the long ones */
    /* cos and sin times the attention factor = q and k rows times it */
    /* (within the f16 cache's rounding of k) and without either, they differ */
    const float dqk = tu_max_diff(ls, lqk, n), d1 = tu_max_diff(ls, l1, n);
    if (dqk > 5e-3f || d1 < 0.05f)
        fail_msg("attention factor vs scaled q/k rows: %g, vs neither: %g", dqk, d1);
    assert_true(tu_max_diff(ll, ld, n) <= 5e-3f); /* decode steps against the batch */
    free(ls), free(ll), free(ls2), free(lqk), free(ld), free(l1);
    lms_model_free(m), lms_model_free(mls), lms_model_free(mqk), lms_model_free(m1);
    unlink(p), unlink(pls), unlink(pqk), unlink(p1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader),      cmocka_unit_test(test_split_equal),
        cmocka_unit_test(test_malformed),   cmocka_unit_test(test_longrope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
