/*
 * test_lora_peft.c - PEFT LoRA adapters (adapter_model.safetensors +
 * adapter_config.json): an adapter written here in HF layout loads to the
 * same values (content id) and the same logits as the GGUF adapter
 * llama.cpp's converter would make of it (A as is, B with q/k rows
 * permuted for llama's RoPE, token_embd's A transposed, alpha kept), in
 * both path forms (directory, .safetensors file); rsLoRA scaling; q/k
 * rows permuted for llama but not for qwen3; and load errors (safetensors,
 * including every truncation of a file, and config), each message checked.
 *
 * Base model: stories260K (llama: n_embd 64, 8 heads, 4 kv heads of 8,
 * n_ff 172, 5 layers, vocab 512, untied output).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/err.h"
#include "engine/forward.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "model/model.h"
#include "testutil.h"

static lms_model *g_model;
static char g_dir[64];

static const char *tmp_path(const char *name)
{
    static char buf[8][160];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 160, "%s/%s", g_dir, name);
    return p;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

/* ---- a PEFT adapter in HF layout -------------------------------------------------- */

/* One tensor: shape [s0, s1] row-major; values f32 (converted to dtype). */
typedef struct hf_tensor {
    char name[128];
    int type;          /* LMS_TYPE_F32 / F16 / BF16 */
    int64_t s0, s1;
    float *v;          /* [s0][s1] */
} hf_tensor;

typedef struct hf_adapter {
    int n;
    hf_tensor t[80];
} hf_adapter;

static const char *dtype_name(int type)
{
    return type == LMS_TYPE_F16 ? "F16" : type == LMS_TYPE_BF16 ? "BF16" : "F32";
}

static size_t esize(int type) { return type == LMS_TYPE_F32 ? 4 : 2; }

/* The stored bytes of t (dtype applied). */
static void *hf_bytes(const hf_tensor *t)
{
    size_t n = (size_t)(t->s0 * t->s1);
    void *p = malloc(n * esize(t->type));
    if (t->type == LMS_TYPE_F32)
        memcpy(p, t->v, n * 4);
    else
        lms_kernels_get()->from_float[t->type](t->v, p, (int64_t)n);
    return p;
}

/* Writes a .safetensors file of the adapter's tensors. */
static void st_write(const char *path, const hf_adapter *a)
{
    size_t cap = 65536, hn = 0, off = 0;
    char *h = malloc(cap);
    hn += (size_t)snprintf(h + hn, cap - hn, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < a->n; i++) {
        const hf_tensor *t = &a->t[i];
        size_t nb = (size_t)(t->s0 * t->s1) * esize(t->type);
        hn += (size_t)snprintf(h + hn, cap - hn,
                               ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":"
                               "[%zu,%zu]}", t->name, dtype_name(t->type), (long long)t->s0,
                               (long long)t->s1, off, off + nb);
        off += nb;
    }
    hn += (size_t)snprintf(h + hn, cap - hn, "}");
    while (hn % 8)
        h[hn++] = ' '; /* as the reference writer pads */
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)hn >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(h, 1, hn, f);
    for (int i = 0; i < a->n; i++) {
        void *p = hf_bytes(&a->t[i]);
        fwrite(p, 1, (size_t)(a->t[i].s0 * a->t[i].s1) * esize(a->t[i].type), f);
        free(p);
    }
    fclose(f);
    free(h);
}

static void hf_free(hf_adapter *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->t[i].v);
    a->n = 0;
}

static hf_tensor *hf_add(hf_adapter *a, const char *name, int type, int64_t s0, int64_t s1,
                         uint64_t *rng)
{
    hf_tensor *t = &a->t[a->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type, t->s0 = s0, t->s1 = s1;
    t->v = malloc((size_t)(s0 * s1) * sizeof *t->v);
    for (int64_t i = 0; i < s0 * s1; i++)
        t->v[i] = tu_rand_f32(rng, -0.3f, 0.3f);
    return t;
}

/* HF module, its [n_out, n_in] in stories260K, and its GGUF stem. */
static const struct {
    const char *hf, *gguf;
    int64_t n_out, n_in;
} g_mods[7] = {
    {"self_attn.q_proj", "attn_q", 64, 64},   {"self_attn.k_proj", "attn_k", 32, 64},
    {"self_attn.v_proj", "attn_v", 32, 64},   {"self_attn.o_proj", "attn_output", 64, 64},
    {"mlp.gate_proj", "ffn_gate", 172, 64},   {"mlp.up_proj", "ffn_up", 172, 64},
    {"mlp.down_proj", "ffn_down", 64, 172},
};

/* A rank-r adapter of every layer target plus lm_head and embed_tokens. */
static void make_hf(hf_adapter *a, int r, int type, uint64_t seed, bool head_embd)
{
    uint64_t rng = seed;
    char name[128];
    a->n = 0;
    for (int il = 0; il < 5; il++)
        for (int k = 0; k < 7; k++) {
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_A.weight", il,
                     g_mods[k].hf);
            hf_add(a, name, type, r, g_mods[k].n_in, &rng);
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.lora_B.weight", il,
                     g_mods[k].hf);
            hf_add(a, name, type, g_mods[k].n_out, r, &rng);
        }
    if (!head_embd)
        return;
    hf_add(a, "base_model.model.lm_head.lora_A.weight", type, r, 64, &rng);
    hf_add(a, "base_model.model.lm_head.lora_B.weight", type, 512, r, &rng);
    hf_add(a, "base_model.model.model.embed_tokens.lora_embedding_A", type, r, 512, &rng);
    hf_add(a, "base_model.model.model.embed_tokens.lora_embedding_B", type, 64, r, &rng);
}

static const char *config(int r, double alpha, const char *extra)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %g, \"lora_dropout\": 0.05, "
             "\"bias\": \"none\", \"fan_in_fan_out\": false, "
             "\"rank_pattern\": {}, \"alpha_pattern\": {}, \"modules_to_save\": null, "
             "\"task_type\": \"CAUSAL_LM\", \"target_modules\": [\"q_proj\", \"k_proj\", "
             "\"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\", \"lm_head\", "
             "\"embed_tokens\"]%s}", r, alpha, extra ? extra : "");
    return buf;
}

/* Writes the adapter as a PEFT directory dir (created). */
static const char *write_peft(const char *dir, const hf_adapter *a, const char *cfg)
{
    const char *d = tmp_path(dir);
    mkdir(d, 0700);
    char p[256];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", d);
    st_write(p, a);
    snprintf(p, sizeof p, "%s/adapter_config.json", d);
    if (cfg)
        write_text(p, cfg);
    else
        remove(p);
    return d;
}

/* ---- the GGUF adapter llama.cpp's converter would write --------------------------- */

/* GGUF row of HF row `row` of a q/k projection with heads of hd rows:
 * HF (head, half j, i) -> GGUF (head, i, j). */
static int64_t rope_row(int64_t row, int64_t hd)
{
    int64_t h = row / hd, w = row % hd, j = w / (hd / 2), i = w % (hd / 2);
    return h * hd + 2 * i + j;
}

/* write_gguf's architecture, and rows per head of q/k for the RoPE
 * permutation (0: none, as for qwen2/qwen3) */
static const char *g_arch = "llama";
static int64_t g_hd = 8;

static void write_gguf(const char *path, const hf_adapter *a, float alpha)
{
    gguf_writer *w = gguf_writer_create();
    gguf_writer_set_str(w, "general.type", "adapter");
    gguf_writer_set_str(w, "general.architecture", g_arch);
    gguf_writer_set_str(w, "adapter.type", "lora");
    gguf_writer_set_f32(w, "adapter.lora.alpha", alpha);
    for (int i = 0; i < a->n; i++) {
        const hf_tensor *t = &a->t[i];
        char gname[128];
        int il = -1;
        bool is_a = strstr(t->name, "lora_A") || strstr(t->name, "lora_embedding_A");
        int64_t hd = 0; /* q/k: rows per head */
        bool embd = strstr(t->name, "embed_tokens") != NULL;
        if (embd)
            snprintf(gname, sizeof gname, "token_embd.weight");
        else if (strstr(t->name, "lm_head"))
            snprintf(gname, sizeof gname, "output.weight");
        else {
            assert_int_equal(sscanf(t->name, "base_model.model.model.layers.%d.", &il), 1);
            for (int k = 0; k < 7; k++)
                if (strstr(t->name, g_mods[k].hf)) {
                    snprintf(gname, sizeof gname, "blk.%d.%s.weight", il, g_mods[k].gguf);
                    hd = k < 2 ? g_hd : 0;
                }
        }
        strcat(gname, is_a ? ".lora_a" : ".lora_b");
        const size_t es = esize(t->type);
        uint8_t *src = hf_bytes(t), *dst = malloc((size_t)(t->s0 * t->s1) * es);
        int64_t ne[2] = {t->s1, t->s0};
        if (embd && is_a) { /* transposed: a row of r per token */
            for (int64_t r = 0; r < t->s0; r++)
                for (int64_t c = 0; c < t->s1; c++)
                    memcpy(dst + (size_t)(c * t->s0 + r) * es, src + (size_t)(r * t->s1 + c) * es, es);
            ne[0] = t->s0, ne[1] = t->s1;
        } else if (!is_a && hd) {
            for (int64_t r = 0; r < t->s0; r++)
                memcpy(dst + (size_t)(rope_row(r, hd) * t->s1) * es, src + (size_t)(r * t->s1) * es,
                       (size_t)t->s1 * es);
        } else {
            memcpy(dst, src, (size_t)(t->s0 * t->s1) * es);
        }
        assert_int_equal(gguf_writer_add_tensor(w, gname, t->type, 2, ne, dst,
                                                (size_t)(t->s0 * t->s1) * es, false), 0);
        free(src);
        free(dst);
    }
    char err[256];
    if (gguf_writer_write(w, path, err, sizeof err) < 0)
        fail_msg("%s", err);
    gguf_writer_destroy(w);
}

/* ---- equivalence ---------------------------------------------------------------------- */

static const int32_t g_toks[16] = {1, 403, 261, 378, 46, 263, 471, 29, 300, 69, 500, 12, 7, 99, 250, 3};

static float *run_logits(const lms_lora_set *set)
{
    return tu_logits_all(g_model, set, g_toks, 16);
}

static lms_lora *load_ok(const char *path)
{
    lms_lora *l = NULL;
    char err[512];
    if (lms_lora_load(path, g_model, &l, err, sizeof err) < 0)
        fail_msg("load %s: %s", path, err);
    return l;
}

static float *logits_with(lms_lora *l)
{
    lms_lora_use u = {.lora = l, .scale = 1.0f};
    lms_lora_set s;
    char err[256];
    assert_int_equal(lms_lora_set_make(&s, &u, 1, err, sizeof err), 0);
    return run_logits(&s);
}

/* PEFT (both path forms) against the converted GGUF: same values, same
 * logits, and different from the base model. */
static void check_equiv(int type, int r, double alpha, const char *extra, float gguf_alpha)
{
    hf_adapter *a = calloc(1, sizeof *a);
    make_hf(a, r, type, 0x5EED + (uint64_t)r, true);
    const char *dir = write_peft("equiv", a, config(r, alpha, extra));
    write_gguf(tmp_path("equiv.gguf"), a, gguf_alpha);
    lms_lora *lp = load_ok(dir), *lg = load_ok(tmp_path("equiv.gguf"));
    char file[256];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    lms_lora *lf = load_ok(file);
    assert_int_equal(lms_lora_n_tensors(lp), 37);
    assert_int_equal(lms_lora_rank(lp), r);
    assert_string_equal(lms_lora_name(lp), "equiv");
    assert_true(lms_lora_id(lp) == lms_lora_id(lg)); /* every f32 value equal */
    assert_true(lms_lora_id(lf) == lms_lora_id(lg));
    float *yp = logits_with(lp), *yg = logits_with(lg), *y0 = run_logits(NULL);
    const size_t n = 16 * 512;
    assert_true(tu_max_diff(yp, yg, n) <= 1e-5f);
    assert_true(tu_max_diff(yp, y0, n) > 1e-2f); /* the adapter does something */
    free(yp);
    free(yg);
    free(y0);
    lms_lora_release(lp);
    lms_lora_release(lg);
    lms_lora_release(lf);
    hf_free(a);
    free(a);
}

static void test_equiv_f32(void **state) { check_equiv(LMS_TYPE_F32, 4, 8.0, NULL, 8.0f); }
static void test_equiv_bf16(void **state) { check_equiv(LMS_TYPE_BF16, 8, 16.0, NULL, 16.0f); }
static void test_equiv_f16(void **state) { check_equiv(LMS_TYPE_F16, 2, 4.0, NULL, 4.0f); }
/* rsLoRA: scale alpha / sqrt(r) = (alpha * sqrt(r)) / r */
static void test_equiv_rslora(void **state)
{
    check_equiv(LMS_TYPE_F32, 4, 8.0, ", \"use_rslora\": true", (float)(8.0 * sqrt(4.0)));
}

/* qwen3 (RoPE on halves): q/k rows are not permuted; llama without the
 * permutation would load to different values. */
static void test_permutation(void **state)
{
    char err[256];
    lms_model *m3;
    if (lms_model_load(tu_data_path("models/qwen3-synth-f16.gguf"), &m3, err, sizeof err) < 0)
        fail_msg("%s", err);
    const int64_t n_embd = m3->layers[0].wq.ne[0], nq = m3->layers[0].wq.ne[1],
                  nk = m3->layers[0].wk.ne[1];
    hf_adapter *a = calloc(1, sizeof *a);
    uint64_t rng = 77;
    hf_add(a, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", LMS_TYPE_F32, 4,
           n_embd, &rng);
    hf_add(a, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", LMS_TYPE_F32, nq,
           4, &rng);
    hf_add(a, "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", LMS_TYPE_F32, 4,
           n_embd, &rng);
    hf_add(a, "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight", LMS_TYPE_F32, nk,
           4, &rng);
    const char *dir = write_peft("qwen3", a, "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
                                             "[\"q_proj\", \"k_proj\"]}");
    g_arch = "qwen3", g_hd = 0;
    write_gguf(tmp_path("qwen3.gguf"), a, 8.0f);
    lms_lora *lp, *lg;
    assert_int_equal(lms_lora_load(dir, m3, &lp, err, sizeof err), 0);
    assert_int_equal(lms_lora_load(tmp_path("qwen3.gguf"), m3, &lg, err, sizeof err), 0);
    assert_true(lms_lora_id(lp) == lms_lora_id(lg));
    lms_lora_release(lp);
    lms_lora_release(lg);
    lms_model_free(m3);
    hf_free(a);

    /* stories260K (llama): the unpermuted GGUF differs, the permuted one not */
    hf_add(a, "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", LMS_TYPE_F32, 4,
           64, &rng);
    hf_add(a, "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight", LMS_TYPE_F32, 32,
           4, &rng);
    dir = write_peft("llama_k", a, config(4, 8.0, NULL));
    g_arch = "llama";
    write_gguf(tmp_path("llama_k0.gguf"), a, 8.0f);
    g_hd = 8;
    write_gguf(tmp_path("llama_k8.gguf"), a, 8.0f);
    lms_lora *l0, *l8;
    lp = load_ok(dir), l0 = load_ok(tmp_path("llama_k0.gguf")), l8 = load_ok(tmp_path("llama_k8.gguf"));
    assert_true(lms_lora_id(lp) != lms_lora_id(l0));
    assert_true(lms_lora_id(lp) == lms_lora_id(l8));
    lms_lora_release(lp);
    lms_lora_release(l0);
    lms_lora_release(l8);
    hf_free(a);
    free(a);
}

/* ---- errors ------------------------------------------------------------------------------- */

static const char *load_err(const char *path)
{
    static char err[512];
    lms_lora *l = NULL;
    if (lms_lora_load(path, g_model, &l, err, sizeof err) >= 0)
        fail_msg("%s loaded", path);
    assert_null(l);
    return err;
}

static void expect(const char *msg, const char *want)
{
    if (!strstr(msg, want))
        fail_msg("message '%s' lacks '%s'", msg, want);
}

/* A safetensors file of raw header text and n data bytes, with config. */
static const char *raw_st(const char *name, uint64_t hlen_delta, const char *hdr, size_t n_data)
{
    const char *p = tmp_path(name);
    size_t hn = strlen(hdr), total = 8 + hn + n_data;
    uint8_t *b = calloc(1, total);
    uint64_t len = hn + hlen_delta;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(len >> (8 * i));
    memcpy(b + 8, hdr, hn);
    write_bytes(p, b, total);
    free(b);
    write_text(tmp_path("adapter_config.json"), config(4, 8.0, NULL));
    return p;
}

static void test_st_errors(void **state)
{
    const char *t = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    char h[512];
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4,64],\"data_offsets\":[0,1024]}}", t);
    expect(load_err(raw_st("len.safetensors", 1u << 30, h, 1024)), "header length ");
    expect(load_err(raw_st("len.safetensors", 1u << 30, h, 1024)), "does not fit the file");
    expect(load_err(raw_st("short.safetensors", 0, h, 1000)),
           "data_offsets [0, 1024] is outside the data section (1000 bytes)");
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F16\",\"shape\":[4,64],\"data_offsets\":[0,1024]}}", t);
    expect(load_err(raw_st("dtype.safetensors", 0, h, 1024)),
           "data_offsets hold 1024 bytes, but dtype F16 and its shape need 512");
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"I64\",\"shape\":[4,64],\"data_offsets\":[0,2048]}}", t);
    expect(load_err(raw_st("i64.safetensors", 0, h, 2048)),
           "dtype \"I64\" is not supported (F32, F16, BF16)");
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4,-64],\"data_offsets\":[0,1024]}}", t);
    expect(load_err(raw_st("neg.safetensors", 0, h, 1024)), "shape[1] is not a non-negative integer");
    snprintf(h, sizeof h, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4,64]}}", t);
    expect(load_err(raw_st("nooff.safetensors", 0, h, 1024)),
           "data_offsets is not an array of two non-negative integers");
    expect(load_err(raw_st("json.safetensors", 0, "{\"a\": [1,", 0)), "header JSON: ");
    /* every truncation of a valid file is refused (and nothing reads past it) */
    hf_adapter *a = calloc(1, sizeof *a);
    make_hf(a, 2, LMS_TYPE_F16, 11, true);
    st_write(tmp_path("full.safetensors"), a);
    size_t n;
    char *bytes = tu_read_file(tmp_path("full.safetensors"), &n);
    assert_non_null(bytes);
    for (size_t cut = 0; cut < n; cut += 1 + n / 97) {
        write_bytes(tmp_path("cut.safetensors"), bytes, cut);
        (void)load_err(tmp_path("cut.safetensors"));
    }
    free(bytes);
    hf_free(a);
    free(a);
    uint8_t tiny[4] = {1, 2, 3, 4};
    write_bytes(tmp_path("tiny.safetensors"), tiny, 4);
    expect(load_err(tmp_path("tiny.safetensors")), "too short for the header length");
}

/* A PEFT dir from make_hf (layer targets only) with one change. */
static void test_peft_errors(void **state)
{
    hf_adapter *a = calloc(1, sizeof *a);
    make_hf(a, 4, LMS_TYPE_F32, 9, false);
    expect(load_err(write_peft("nocfg", a, NULL)), "adapter_config.json: cannot read");
    expect(load_err(write_peft("rank", a, config(8, 16.0, NULL))),
           "tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has rank 4, "
           "but adapter_config.json has r = 8");
    expect(load_err(write_peft("fifo", a, "{\"r\": 4, \"lora_alpha\": 8, \"fan_in_fan_out\": true}")),
           "fan_in_fan_out = true (Conv1D-style weights) is not supported");
    expect(load_err(write_peft("dora", a, "{\"r\": 4, \"lora_alpha\": 8, \"use_dora\": true}")),
           "use_dora = true (DoRA) is not supported");
    expect(load_err(write_peft("pat", a, "{\"r\": 4, \"lora_alpha\": 8, \"rank_pattern\": {\"q\": 2}}")),
           "rank_pattern is not supported");
    expect(load_err(write_peft("noalpha", a, "{\"r\": 4}")), "lora_alpha is missing");
    expect(load_err(write_peft("badjson", a, "{\"r\": 4,")),
           "adapter_config.json: cannot read: ");
    expect(load_err(write_peft("badjson", a, "{\"r\": 4,")), "(line 1, column ");
    expect(load_err(write_peft("type", a, "{\"peft_type\": \"IA3\", \"r\": 4, \"lora_alpha\": 8}")),
           "peft_type is not \"LORA\"");
    expect(load_err(write_peft("tm", a, "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
                                        "[\"q_proj\", \"query_key_value\"]}")),
           "target_modules entry \"query_key_value\" is not supported");
    expect(load_err(write_peft("notin", a, "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
                                           "[\"q_proj\", \"v_proj\"]}")),
           "tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight': module "
           "'k_proj' is not in adapter_config.json target_modules");
    /* an unknown module, a layer the model lacks, a missing half */
    snprintf(a->t[0].name, sizeof a->t[0].name,
             "base_model.model.model.layers.0.self_attn.rotary.lora_A.weight");
    expect(load_err(write_peft("unknown", a, config(4, 8.0, NULL))),
           "tensor 'base_model.model.model.layers.0.self_attn.rotary.lora_A.weight' is not a "
           "LoRA tensor this loader knows");
    snprintf(a->t[0].name, sizeof a->t[0].name,
             "base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight");
    snprintf(a->t[1].name, sizeof a->t[1].name,
             "base_model.model.model.layers.7.self_attn.q_proj.lora_B.weight");
    expect(load_err(write_peft("layer", a, config(4, 8.0, NULL))),
           "targets 'blk.7.attn_q.weight', which the base model does not have");
    snprintf(a->t[0].name, sizeof a->t[0].name,
             "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight");
    expect(load_err(write_peft("base", a, config(4, 8.0, NULL))), "is not a LoRA tensor");
    snprintf(a->t[0].name, sizeof a->t[0].name, "base_model.model.model.layers.07.mlp.up_proj.lora_A.weight");
    expect(load_err(write_peft("zero", a, config(4, 8.0, NULL))), "is not a LoRA tensor");
    hf_free(a);
    /* a shape that does not fit the base weight: checked by the GGUF path's rules */
    uint64_t rng = 3;
    hf_add(a, "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight", LMS_TYPE_F32, 4, 63, &rng);
    hf_add(a, "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight", LMS_TYPE_F32, 172, 4, &rng);
    expect(load_err(write_peft("shape", a, config(4, 8.0, NULL))),
           "tensor 'blk.1.ffn_up.weight.lora_a' has shape [63, 4, 1, 1]");
    hf_free(a);
    free(a);
}

static int setup(void **state)
{
    char err[256];
    snprintf(g_dir, sizeof g_dir, "/tmp/test_lora_peft_XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    if (lms_model_load(tu_data_path("models/stories260K.gguf"), &g_model, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    lms_model_free(g_model);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equiv_f32),  cmocka_unit_test(test_equiv_bf16),
        cmocka_unit_test(test_equiv_f16),  cmocka_unit_test(test_equiv_rslora),
        cmocka_unit_test(test_permutation), cmocka_unit_test(test_st_errors),
        cmocka_unit_test(test_peft_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
