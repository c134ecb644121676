/*
 * test_lora_fused.c - LoRA adapters of phi3's fused matrices.
 *
 * llama.cpp's converter writes a phi3 adapter's q/k/v as one pair on
 * blk.N.attn_qkv.weight and gate/up as one pair on the fused
 * blk.N.ffn_up.weight. lora.c splits such a pair into one pair per part
 * (A shared, B cut by rows). Checked here:
 *   - an adapter written fused gives bit-identical logits to the same
 *     adapter written as separate attn_q/k/v and ffn_gate/ffn_up pairs
 *     (which phi3's row views take as they are), and differs from the
 *     base model;
 *   - the split pairs have the parts' shapes;
 *   - a fused B with the wrong row count, a missing half, and a part
 *     adapted both fused and on its own are refused by name;
 *   - the PEFT form (Phi-3's qkv_proj / gate_up_proj modules) loads to the
 *     same adapter.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#define RANK 4
#define N_TOK 12

static lms_model *g_model;
static char g_dir[64];

static const char *tmp_path(const char *name)
{
    static char buf[4][128];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 128, "%s/%s", g_dir, name);
    return p;
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/test_lora_fused_XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    char err[256];
    const char *path = tmp_path("phi3.gguf");
    assert_int_equal(lms_synth_write(lms_synth_find("phi3-tiny"), "F32", 3, path, err, sizeof err),
                     0);
    if (lms_model_load(path, &g_model, err, sizeof err) < 0)
        fail_msg("%s", err);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lms_model_free(g_model);
    const char *files[] = {"phi3.gguf", "fused.gguf", "split.gguf", "rows.gguf", "nob.gguf",
                           "both.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        unlink(tmp_path(files[i]));
    return rmdir(g_dir) == 0 ? 0 : -1;
}

/* ---- adapters ---------------------------------------------------------------------- */

/* The random A and B of one fused matrix of one layer. */
typedef struct fused_ab {
    int64_t n_in, rows;
    float *a; /* [RANK][n_in] as stored (ne = [n_in, RANK]) */
    float *b; /* [rows][RANK] (ne = [RANK, rows]) */
} fused_ab;

static fused_ab make_ab(int64_t n_in, int64_t rows, uint64_t *seed)
{
    fused_ab f = {n_in, rows, malloc((size_t)n_in * RANK * sizeof(float)),
                  malloc((size_t)rows * RANK * sizeof(float))};
    for (int64_t i = 0; i < n_in * RANK; i++)
        f.a[i] = tu_rand_f32(seed, -0.2f, 0.2f);
    for (int64_t i = 0; i < rows * RANK; i++)
        f.b[i] = tu_rand_f32(seed, -0.2f, 0.2f);
    return f;
}

static void add_pair(gguf_writer *w, const char *base, const fused_ab *f, int64_t row0,
                     int64_t rows)
{
    char name[128];
    const int64_t na[2] = {f->n_in, RANK}, nb[2] = {RANK, rows};
    snprintf(name, sizeof name, "%s.lora_a", base);
    assert_int_equal(gguf_writer_add_tensor(w, name, LMS_TYPE_F32, 2, na, f->a,
                                            (size_t)f->n_in * RANK * sizeof(float), true), 0);
    snprintf(name, sizeof name, "%s.lora_b", base);
    assert_int_equal(gguf_writer_add_tensor(w, name, LMS_TYPE_F32, 2, nb, f->b + row0 * RANK,
                                            (size_t)rows * RANK * sizeof(float), true), 0);
}

enum { WRITE_FUSED, WRITE_SPLIT, WRITE_BAD_ROWS, WRITE_NO_B, WRITE_BOTH };

/* Writes the adapter (qkv and gate/up of every layer from abs) in form
 * `how` and returns the loader's error ("" when it loaded; *out set). */
static const char *write_load(const fused_ab *abs, int how, const char *file, lms_lora **out)
{
    const lms_hparams *hp = &g_model->hp;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "general.type", "adapter");
    gguf_writer_set_str(w, "general.architecture", "phi3");
    gguf_writer_set_str(w, "adapter.type", "lora");
    gguf_writer_set_f32(w, "adapter.lora.alpha", 8.0f);
    char base[96];
    for (int il = 0; il < hp->n_layer; il++) {
        const fused_ab *qkv = &abs[2 * il], *gu = &abs[2 * il + 1];
        if (how == WRITE_SPLIT) {
            const char *parts[3] = {"attn_q", "attn_k", "attn_v"};
            const int64_t r0[3] = {0, q, q + kv}, n[3] = {q, kv, kv};
            for (int k = 0; k < 3; k++) {
                snprintf(base, sizeof base, "blk.%d.%s.weight", il, parts[k]);
                add_pair(w, base, qkv, r0[k], n[k]);
            }
            snprintf(base, sizeof base, "blk.%d.ffn_gate.weight", il);
            add_pair(w, base, gu, 0, hp->n_ff);
            snprintf(base, sizeof base, "blk.%d.ffn_up.weight", il);
            add_pair(w, base, gu, hp->n_ff, hp->n_ff);
            continue;
        }
        snprintf(base, sizeof base, "blk.%d.attn_qkv.weight", il);
        if (how == WRITE_NO_B && il == 1) {
            char name[128];
            const int64_t na[2] = {qkv->n_in, RANK};
            snprintf(name, sizeof name, "%s.lora_a", base);
            gguf_writer_add_tensor(w, name, LMS_TYPE_F32, 2, na, qkv->a,
                                   (size_t)qkv->n_in * RANK * sizeof(float), true);
        } else {
            add_pair(w, base, qkv, 0, how == WRITE_BAD_ROWS && il == 2 ? qkv->rows - 1 : qkv->rows);
        }
        snprintf(base, sizeof base, "blk.%d.ffn_up.weight", il);
        add_pair(w, base, gu, 0, gu->rows);
        if (how == WRITE_BOTH && il == 3) {
            snprintf(base, sizeof base, "blk.%d.attn_k.weight", il);
            add_pair(w, base, qkv, q, kv);
        }
    }
    static char err[512];
    err[0] = 0;
    const char *path = tmp_path(file);
    assert_int_equal(gguf_writer_write(w, path, err, sizeof err), 0);
    gguf_writer_destroy(w);
    *out = NULL;
    if (lms_lora_load(path, g_model, out, err, sizeof err) == 0)
        err[0] = 0;
    return err;
}


static fused_ab *make_all(void)
{
    const lms_hparams *hp = &g_model->hp;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim, kv = (int64_t)hp->n_head_kv * hp->head_dim;
    fused_ab *abs = malloc((size_t)hp->n_layer * 2 * sizeof *abs);
    uint64_t seed = 99;
    for (int il = 0; il < hp->n_layer; il++) {
        abs[2 * il] = make_ab(hp->n_embd, q + 2 * kv, &seed);
        abs[2 * il + 1] = make_ab(hp->n_embd, 2 * (int64_t)hp->n_ff, &seed);
    }
    return abs;
}

static void free_all(fused_ab *abs)
{
    for (int i = 0; i < 2 * g_model->hp.n_layer; i++) {
        free(abs[i].a);
        free(abs[i].b);
    }
    free(abs);
}

static void test_fused_equals_split(void **state)
{
    (void)state;
    fused_ab *abs = make_all();
    lms_lora *fused, *split;
    const char *e = write_load(abs, WRITE_FUSED, "fused.gguf", &fused);
    if (*e)
        fail_msg("fused: %s", e);
    e = write_load(abs, WRITE_SPLIT, "split.gguf", &split);
    if (*e)
        fail_msg("split: %s", e);
    const lms_hparams *hp = &g_model->hp;
    assert_int_equal(lms_lora_n_tensors(fused), 5 * hp->n_layer);
    assert_int_equal(lms_lora_n_tensors(split), 5 * hp->n_layer);
    /* the parts' shapes */
    const int targets[5] = {LMS_LORA_Q, LMS_LORA_K, LMS_LORA_V, LMS_LORA_GATE, LMS_LORA_UP};
    const int64_t outs[5] = {(int64_t)hp->n_head * hp->head_dim, (int64_t)hp->n_head_kv * hp->head_dim,
                             (int64_t)hp->n_head_kv * hp->head_dim, hp->n_ff, hp->n_ff};
    for (int k = 0; k < 5; k++) {
        const lms_lora_pair *p = lms_lora_layer_pair(fused, 2, targets[k]);
        assert_non_null(p);
        assert_int_equal(p->rank, RANK);
        assert_int_equal(p->n_in, hp->n_embd);
        assert_int_equal(p->n_out, outs[k]);
    }
    assert_null(lms_lora_layer_pair(fused, 2, LMS_LORA_O));
    /* the same content: the prefix cache may share their blocks */
    assert_true(lms_lora_id(fused) == lms_lora_id(split));

    int32_t toks[N_TOK];
    uint64_t seed = 5;
    for (int i = 0; i < N_TOK; i++)
        toks[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)hp->n_vocab);
    char err[256];
    lms_lora_set sf, ss;
    lms_lora_use uf = {fused, 0.7f}, us = {split, 0.7f};
    assert_int_equal(lms_lora_set_make(&sf, &uf, 1, err, sizeof err), 0);
    assert_int_equal(lms_lora_set_make(&ss, &us, 1, err, sizeof err), 0);
    float *lf = tu_logits_all(g_model, &sf, toks, N_TOK), *ls = tu_logits_all(g_model, &ss, toks, N_TOK), *lb = tu_logits_all(g_model, NULL, toks, N_TOK);
    const size_t n = (size_t)N_TOK * (size_t)hp->n_vocab;
    assert_true(memcmp(lf, ls, n * sizeof *lf) == 0);
    assert_true(tu_max_diff(lf, lb, n) > 1e-2f);
    free(lf);
    free(ls);
    free(lb);
    lms_lora_release(fused);
    lms_lora_release(split);
    free_all(abs);
}

static void test_fused_errors(void **state)
{
    (void)state;
    fused_ab *abs = make_all();
    lms_lora *l;
    const char *e = write_load(abs, WRITE_BAD_ROWS, "rows.gguf", &l);
    assert_null(l);
    if (!strstr(e, "blk.2.attn_qkv.weight.lora_b") || !strstr(e, "fused base weight"))
        fail_msg("bad rows: %s", e);
    e = write_load(abs, WRITE_NO_B, "nob.gguf", &l);
    assert_null(l);
    if (!strstr(e, "'blk.1.attn_qkv.weight.lora_b' is missing"))
        fail_msg("missing half: %s", e);
    e = write_load(abs, WRITE_BOTH, "both.gguf", &l);
    assert_null(l);
    if (!strstr(e, "attn_k' is adapted both fused ('blk.3.attn_qkv.weight')"))
        fail_msg("both: %s", e);
    free_all(abs);
}

/* The same adapter as a PEFT folder: lora_A [r, n_in] and lora_B
 * [n_out, r] hold the same bytes as the GGUF lora_a / lora_b. */
static const char *write_peft(const fused_ab *abs)
{
    const char *dir = tmp_path("peft");
    mkdir(dir, 0700);
    const int nl = g_model->hp.n_layer;
    char path[256], name[128];
    /* header: every tensor's dtype, shape and byte range, then the data */
    size_t cap = 64 * 1024, len = 0, off = 0;
    char *hdr = malloc(cap);
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int il = 0; il < nl; il++)
        for (int k = 0; k < 2; k++) {
            const fused_ab *f = &abs[2 * il + k];
            const char *mod = k ? "mlp.gate_up_proj" : "self_attn.qkv_proj";
            for (int ab = 0; ab < 2; ab++) {
                const size_t n = (size_t)(ab ? f->rows : f->n_in) * RANK * sizeof(float);
                snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_%c.weight",
                         il, mod, ab ? 'B' : 'A');
                len += (size_t)snprintf(hdr + len, cap - len,
                                        "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                                        "\"data_offsets\":[%zu,%zu]}",
                                        len > 1 ? "," : "", name,
                                        (long long)(ab ? f->rows : RANK),
                                        (long long)(ab ? RANK : f->n_in), off, off + n);
                off += n;
            }
        }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    assert_true(len < cap);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    const uint64_t hl = len;
    fwrite(&hl, sizeof hl, 1, fp);
    fwrite(hdr, 1, len, fp);
    for (int il = 0; il < nl; il++)
        for (int k = 0; k < 2; k++) {
            const fused_ab *f = &abs[2 * il + k];
            fwrite(f->a, sizeof(float), (size_t)f->n_in * RANK, fp);
            fwrite(f->b, sizeof(float), (size_t)f->rows * RANK, fp);
        }
    assert_int_equal(fclose(fp), 0);
    free(hdr);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    fp = fopen(path, "w");
    assert_non_null(fp);
    fprintf(fp, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": 8, "
                "\"target_modules\": [\"qkv_proj\", \"gate_up_proj\"]}", RANK);
    assert_int_equal(fclose(fp), 0);
    return dir;
}

static void test_peft(void **state)
{
    (void)state;
    fused_ab *abs = make_all();
    lms_lora *fused, *peft = NULL;
    const char *e = write_load(abs, WRITE_FUSED, "fused.gguf", &fused);
    if (*e)
        fail_msg("fused: %s", e);
    char err[512];
    const char *dir = write_peft(abs);
    if (lms_lora_load(dir, g_model, &peft, err, sizeof err) < 0)
        fail_msg("peft: %s", err);
    assert_int_equal(lms_lora_n_tensors(peft), 5 * g_model->hp.n_layer);
    assert_true(lms_lora_id(peft) == lms_lora_id(fused));
    lms_lora_release(peft);
    lms_lora_release(fused);
    char path[256];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    unlink(path);
    rmdir(dir);
    free_all(abs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_equals_split),
        cmocka_unit_test(test_fused_errors),
        cmocka_unit_test(test_peft),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
