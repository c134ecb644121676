/*
 * test_hf.c - Hugging Face model folders (model/hf.c).
 *
 * A writer here does the inverse of llama.cpp's converter: from a GGUF
 * model it makes the folder the model came from (config.json, safetensors
 * in HF names and row-major shapes, llama's q/k rows put back in HF order,
 * one file or shards with an index, tokenizer.json and
 * tokenizer_config.json). Loading the folder must then give what loading
 * the GGUF gives: the same hyper-parameters, vocabulary and tokenization,
 * and bit-identical logits (the tensor bytes are the same). Covered:
 * qwen3 (tied head, one file), llama F16 and BF16 (untied, 3 shards, q/k
 * permuted), the real Llama 3 and Qwen2 vocabularies (every test string of
 * their llama.cpp vectors), tokenizer_config.json details, Llama 3 rope
 * scaling, `lmserv info DIR` and `lmserv quantize DIR` (the same model as
 * quantizing the GGUF), and the load errors, each message checked.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/forward.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "testutil.h"

static char g_root[64];

/* A folder under the test's temporary root (created). */
static const char *folder(const char *name)
{
    static char buf[4][200];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 200, "%s/%s", g_root, name);
    mkdir(p, 0755);
    return p;
}

static const char *in(const char *dir, const char *name)
{
    static char buf[8][300];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 300, "%s/%s", dir, name);
    return p;
}

static void write_text(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

static void dump(json_t *j, const char *path)
{
    assert_int_equal(json_dump_file(j, path, JSON_COMPACT), 0);
    json_decref(j);
}

static gguf_file *open_gguf(const char *rel)
{
    gguf_file *f;
    char err[256];
    if (gguf_open(tu_data_path(rel), &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    return f;
}

static const char *str_of(const gguf_file *g, const char *key)
{
    const char *s = NULL;
    gguf_get_str(g, key, &s);
    return s;
}

static int64_t int_of(const gguf_file *g, const char *key, int64_t def)
{
    int64_t v = def;
    gguf_get_i64(g, key, &v);
    return v;
}

/* ---- the writer: GGUF -> Hugging Face folder --------------------------------------- */

typedef struct hf_opts {
    const char *hf_arch;   /* config.json architectures[0] */
    int n_shards;          /* 0: model.safetensors; else an index and n shards */
    bool merges_as_pairs;  /* merges as ["a", "b"] instead of "a b" */
    bool special_objects;  /* bos/eos in tokenizer_config.json as {"content": ...} */
    int64_t vocab_limit;   /* tokens of the vocab source kept (0: all) */
    bool no_tensors;       /* config and tokenizer only */
} hf_opts;

/* GGUF tensor name -> HF name (NULL: not written). */
static bool hf_name(const char *g, char *out, size_t n)
{
    static const char *const map[][2] = {
        {"attn_norm.weight", "input_layernorm.weight"},
        {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},
        {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_output.weight", "self_attn.o_proj.weight"},
        {"attn_q.bias", "self_attn.q_proj.bias"},
        {"attn_k.bias", "self_attn.k_proj.bias"},
        {"attn_v.bias", "self_attn.v_proj.bias"},
        {"attn_q_norm.weight", "self_attn.q_norm.weight"},
        {"attn_k_norm.weight", "self_attn.k_norm.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},
        {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"},
    };
    int il, k = 0;
    if (!strcmp(g, "token_embd.weight"))
        return snprintf(out, n, "model.embed_tokens.weight") > 0;
    if (!strcmp(g, "output_norm.weight"))
        return snprintf(out, n, "model.norm.weight") > 0;
    if (!strcmp(g, "output.weight"))
        return snprintf(out, n, "lm_head.weight") > 0;
    if (sscanf(g, "blk.%d.%n", &il, &k) != 1 || !k)
        return false;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(g + k, map[i][0]))
            return snprintf(out, n, "model.layers.%d.%s", il, map[i][1]) > 0;
    return false;
}

static const char *dtype(int type)
{
    return type == LMS_TYPE_F16 ? "F16" : type == LMS_TYPE_BF16 ? "BF16" : "F32";
}

/* Bytes of a GGUF tensor in HF row order: llama's attn_q/attn_k rows go
 * back from (i, half) to (half, i) within each head. */
static void *hf_rows(const gguf_tensor *t, int n_h)
{
    uint8_t *p = malloc(t->n_bytes);
    memcpy(p, t->data, t->n_bytes);
    if (n_h > 0) {
        const size_t rb = t->n_bytes / (size_t)t->ne[1], hd = (size_t)t->ne[1] / (size_t)n_h;
        for (size_t h = 0; h < (size_t)n_h; h++)
            for (size_t i = 0; i < hd / 2; i++)
                for (size_t j = 0; j < 2; j++)
                    memcpy(p + (h * hd + j * hd / 2 + i) * rb,
                           (const uint8_t *)t->data + (h * hd + 2 * i + j) * rb, rb);
    }
    return p;
}

/* Writes the tensors of g whose index i has i % n == k (n = 1: all) to
 * path; adds "name": file to weight_map when given. */
static void write_shard(const gguf_file *g, const char *path, int k, int n, json_t *weight_map)
{
    const char *a = str_of(g, "general.architecture");
    const bool llama = !strcmp(a, "llama");
    char key[96];
    snprintf(key, sizeof key, "%s.attention.head_count", a);
    const int n_head = (int)int_of(g, key, 0);
    snprintf(key, sizeof key, "%s.attention.head_count_kv", a);
    const int n_head_kv = (int)int_of(g, key, n_head);
    json_t *h = json_object();
    size_t off = 0;
    void *data[256];
    size_t sizes[256];
    int nd = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        char name[128];
        if ((int)(i % (uint64_t)n) != k || !hf_name(t->name.p, name, sizeof name))
            continue;
        int n_h = 0;
        if (llama && strstr(t->name.p, "attn_q.weight"))
            n_h = n_head;
        if (llama && strstr(t->name.p, "attn_k.weight"))
            n_h = n_head_kv;
        json_t *shape = t->n_dims == 1
                            ? json_pack("[I]", (json_int_t)t->ne[0])
                            : json_pack("[I,I]", (json_int_t)t->ne[1], (json_int_t)t->ne[0]);
        json_object_set_new(h, name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", dtype(t->type), "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + t->n_bytes)));
        assert_true(nd < 256);
        data[nd] = hf_rows(t, n_h);
        sizes[nd++] = t->n_bytes;
        off += t->n_bytes;
        if (weight_map)
            json_object_set_new(weight_map, name, json_string(strrchr(path, '/') + 1));
    }
    char *hs = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    size_t hn = strlen(hs);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len[8];
    const size_t padded = (hn + 7) / 8 * 8;
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hs, 1, hn, f);
    fwrite("        ", 1, padded - hn, f);
    for (int i = 0; i < nd; i++) {
        fwrite(data[i], 1, sizes[i], f);
        free(data[i]);
    }
    fclose(f);
    free(hs);
}

static void write_tensors(const gguf_file *g, const char *dir, int n_shards)
{
    if (n_shards == 0) {
        write_shard(g, in(dir, "model.safetensors"), 0, 1, NULL);
        return;
    }
    json_t *wm = json_object();
    for (int k = 0; k < n_shards; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
        write_shard(g, in(dir, name), k, n_shards, wm);
    }
    dump(json_pack("{s:{s:i},s:o}", "metadata", "total_size", 0, "weight_map", wm),
         in(dir, "model.safetensors.index.json"));
}

static void write_config(const gguf_file *g, const char *dir, const hf_opts *o, int64_t n_vocab)
{
    const char *a = str_of(g, "general.architecture");
    char key[128];
#define K(s) (snprintf(key, sizeof key, "%s.%s", a, s), key)
    json_t *c = json_pack("{s:[s],s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:b}", "architectures",
                          o->hf_arch, "hidden_act", "silu", "hidden_size",
                          (json_int_t)int_of(g, K("embedding_length"), 0), "num_hidden_layers",
                          (json_int_t)int_of(g, K("block_count"), 0), "intermediate_size",
                          (json_int_t)int_of(g, K("feed_forward_length"), 0), "num_attention_heads",
                          (json_int_t)int_of(g, K("attention.head_count"), 0),
                          "num_key_value_heads",
                          (json_int_t)int_of(g, K("attention.head_count_kv"), 0),
                          "max_position_embeddings", (json_int_t)int_of(g, K("context_length"), 0),
                          "vocab_size", (json_int_t)n_vocab, "rms_norm_eps", 0.0, "rope_theta", 0.0,
                          "tie_word_embeddings", gguf_find_tensor(g, "output.weight") == NULL);
    float v = 0;
    gguf_get_f32(g, K("attention.layer_norm_rms_epsilon"), &v);
    json_object_set_new(c, "rms_norm_eps", json_real(v));
    v = 10000.0f;
    gguf_get_f32(g, K("rope.freq_base"), &v);
    json_object_set_new(c, "rope_theta", json_real(v));
    if (gguf_find_kv(g, K("attention.key_length")))
        json_object_set_new(c, "head_dim", json_integer(int_of(g, key, 0)));
#undef K
    dump(c, in(dir, "config.json"));
}

/* The Split regexes of tokenizer.json for a tokenizer.ggml.pre value (the
 * patterns as the Hugging Face files spell them). */
static json_t *pre_tokenizer(const char *pre)
{
    static const char *llama3 =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char *qwen2 =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const char *rx = !strcmp(pre, "llama-bpe") ? llama3 : !strcmp(pre, "qwen2") ? qwen2 : NULL;
    if (!rx) /* GPT-2: ByteLevel's own regex */
        return json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                         "trim_offsets", 1, "use_regex", 1);
    return json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence",
                     "pretokenizers", "type", "Split", "pattern", "Regex", rx, "behavior",
                     "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
                     "trim_offsets", 1, "use_regex", 0);
}

static void write_tokenizer(const gguf_file *v, const char *dir, const hf_opts *o)
{
    const gguf_kv *toks = gguf_find_kv(v, "tokenizer.ggml.tokens");
    const gguf_kv *types = gguf_find_kv(v, "tokenizer.ggml.token_type");
    const gguf_kv *merges = gguf_find_kv(v, "tokenizer.ggml.merges");
    const char *pre = str_of(v, "tokenizer.ggml.pre");
    const int64_t n = o->vocab_limit ? o->vocab_limit : (int64_t)toks->n;
    json_t *vocab = json_object(), *added = json_array(), *jm = json_array();
    for (int64_t i = 0; i < n; i++) {
        const int64_t ty = gguf_arr_i64(types, (uint64_t)i);
        if (ty == LMS_TOKEN_TYPE_NORMAL)
            json_object_set_new(vocab, toks->strs[i].p, json_integer(i));
        else if (ty == LMS_TOKEN_TYPE_CONTROL || ty == LMS_TOKEN_TYPE_USER_DEFINED)
            json_array_append_new(added, json_pack("{s:I,s:s,s:b,s:b,s:b,s:b,s:b}", "id",
                                                   (json_int_t)i, "content", toks->strs[i].p,
                                                   "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                   "normalized", 0, "special",
                                                   ty == LMS_TOKEN_TYPE_CONTROL));
    }
    for (uint64_t i = 0; i < merges->n; i++) {
        const char *m = merges->strs[i].p, *sp = strchr(m + 1, ' ');
        char l[256], r[256], lr[512];
        snprintf(l, sizeof l, "%.*s", (int)(sp - m), m);
        snprintf(r, sizeof r, "%s", sp + 1);
        snprintf(lr, sizeof lr, "%s%s", l, r);
        if (o->vocab_limit && (!json_object_get(vocab, l) || !json_object_get(vocab, r) ||
                               !json_object_get(vocab, lr)))
            continue;
        json_array_append_new(jm, o->merges_as_pairs ? json_pack("[s,s]", l, r) : json_string(m));
    }
    json_t *model = json_pack("{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:o,s:o}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                              "fuse_unk", 0, "byte_fallback", 0, "vocab", vocab, "merges", jm);
    json_object_set_new(model, "ignore_merges", json_boolean(!strcmp(pre, "llama-bpe")));
    dump(json_pack("{s:s,s:n,s:n,s:o,s:n,s:o,s:n,s:{s:s},s:o}", "version", "1.0", "truncation",
                   "padding", "added_tokens", added, "normalizer", "pre_tokenizer",
                   pre_tokenizer(pre), "post_processor", "decoder", "type", "ByteLevel", "model",
                   model),
         in(dir, "tokenizer.json"));
    json_t *tc = json_object();
    const char *names[2] = {"bos_token", "eos_token"}, *keys[2] = {"tokenizer.ggml.bos_token_id",
                                                                   "tokenizer.ggml.eos_token_id"};
    for (int k = 0; k < 2; k++) {
        int64_t id = int_of(v, keys[k], -1);
        if (id < 0 || id >= n)
            continue;
        const char *s = toks->strs[id].p;
        json_object_set_new(tc, names[k],
                            o->special_objects ? json_pack("{s:s,s:b}", "content", s, "special", 1)
                                               : json_string(s));
    }
    bool ab;
    if (gguf_get_bool(v, "tokenizer.ggml.add_bos_token", &ab) == 0)
        json_object_set_new(tc, "add_bos_token", json_boolean(ab));
    const char *tpl = str_of(v, "tokenizer.chat_template");
    if (tpl)
        json_object_set_new(tc, "chat_template", json_string(tpl));
    dump(tc, in(dir, "tokenizer_config.json"));
}

/* The folder of model g, its tokenizer from vocab v (g itself when NULL). */
static void write_hf(const gguf_file *g, const gguf_file *v, const char *dir, const hf_opts *o)
{
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight");
    const gguf_kv *toks = gguf_find_kv(v ? v : g, "tokenizer.ggml.tokens");
    write_config(g, dir, o, te ? te->ne[1] : (int64_t)toks->n);
    write_tokenizer(v ? v : g, dir, o);
    if (!o->no_tensors)
        write_tensors(g, dir, o->n_shards);
}

/* ---- equivalence -------------------------------------------------------------------- */

static lms_model *load_model(const char *path)
{
    lms_model *m = NULL;
    char err[512];
    if (lms_model_load(path, &m, err, sizeof err) < 0)
        fail_msg("%s: %s", path, err);
    return m;
}

static float *logits(const lms_model *m, const int32_t *toks, int n)
{
    lms_ctx_params cp = {.n_ctx = 32, .n_batch = 32, .n_seq = 1, .n_threads = 2};
    lms_ctx *c;
    char err[256];
    if (lms_ctx_create(m, &cp, &c, err, sizeof err) < 0)
        fail_msg("%s", err);
    lms_kv_seq seq = {0};
    lms_kv_seq *seqs[32];
    int32_t pos[32];
    bool want[32];
    for (int i = 0; i < n; i++)
        seqs[i] = &seq, pos[i] = i, want[i] = true;
    float *lg = malloc((size_t)n * (size_t)m->hp.n_vocab * sizeof *lg);
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &seq, n), 0);
    lms_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .logits = want};
    assert_int_equal(lms_forward(c, &b, lg), 0);
    lms_kv_seq_release(lms_ctx_kv(c), &seq);
    lms_ctx_destroy(c);
    return lg;
}

static void same_hparams(const lms_model *a, const lms_model *b)
{
    const lms_hparams *x = &a->hp, *y = &b->hp;
    assert_string_equal(x->arch, y->arch);
    assert_int_equal(x->n_vocab, y->n_vocab);
    assert_int_equal(x->n_embd, y->n_embd);
    assert_int_equal(x->n_layer, y->n_layer);
    assert_int_equal(x->n_head, y->n_head);
    assert_int_equal(x->n_head_kv, y->n_head_kv);
    assert_int_equal(x->head_dim, y->head_dim);
    assert_int_equal(x->n_ff, y->n_ff);
    assert_int_equal(x->n_ctx_train, y->n_ctx_train);
    assert_int_equal(x->n_rot, y->n_rot);
    assert_int_equal(x->rope_type, y->rope_type);
    assert_true(x->rope_base == y->rope_base);
    assert_true(x->rms_eps == y->rms_eps);
    assert_true(x->rope_freq_scale == y->rope_freq_scale);
    assert_int_equal(a->output.data == a->tok_embd.data, b->output.data == b->tok_embd.data);
    assert_int_equal(a->weight_bytes, b->weight_bytes);
}

static void same_logits(const lms_model *a, const lms_model *b, const int32_t *toks, int n)
{
    float *la = logits(a, toks, n), *lb = logits(b, toks, n);
    const size_t nl = (size_t)n * (size_t)a->hp.n_vocab;
    assert_int_equal(memcmp(la, lb, nl * sizeof *la), 0); /* the same bytes: bit-identical */
    free(la);
    free(lb);
}

/* Same vocabulary (texts and types of every id) and the same specials. */
static void same_vocab(const lms_tokenizer *a, const lms_tokenizer *b, bool unused_texts)
{
    assert_int_equal(lms_tokenizer_n_vocab(a), lms_tokenizer_n_vocab(b));
    for (int32_t i = 0; i < lms_tokenizer_n_vocab(a); i++) {
        assert_int_equal(lms_token_type(a, i), lms_token_type(b, i));
        if (unused_texts || lms_token_type(a, i) != LMS_TOKEN_TYPE_UNUSED)
            assert_string_equal(lms_token_text(a, i), lms_token_text(b, i));
        assert_int_equal(lms_token_is_eog(a, i), lms_token_is_eog(b, i));
    }
    assert_string_equal(lms_tokenizer_model(a), lms_tokenizer_model(b));
    assert_int_equal(lms_tokenizer_bos(a), lms_tokenizer_bos(b));
    assert_int_equal(lms_tokenizer_eos(a), lms_tokenizer_eos(b));
    assert_int_equal(lms_tokenizer_add_bos(a), lms_tokenizer_add_bos(b));
}

static void same_tokens(const lms_tokenizer *a, const lms_tokenizer *b, const char *s, size_t n)
{
    for (int mode = 0; mode < 2; mode++) {
        int32_t ia[4096], ib[4096];
        int64_t na = lms_tokenize(a, s, n, mode, mode, ia, 4096);
        int64_t nb = lms_tokenize(b, s, n, mode, mode, ib, 4096);
        assert_true(na >= 0 && na <= 4096);
        assert_int_equal(na, nb);
        assert_memory_equal(ia, ib, (size_t)na * sizeof *ia);
    }
}

static const char *const samples[] = {
    "Hello world", " Hello World!", "  leading spaces and\ttabs\n\nnew lines",
    "numbers 1 12 123 1234 12345", "Ünïcödé – 漢字 and emoji 🦙", "don't we'll they're",
    "<|endoftext|> after a special", "a<|im_start|>b", "",
};

static void test_qwen3_tied_one_file(void **state)
{
    gguf_file *g = open_gguf("models/qwen3-synth-f16.gguf");
    const char *dir = folder("qwen3");
    hf_opts o = {.hf_arch = "Qwen3ForCausalLM", .special_objects = true};
    write_hf(g, NULL, dir, &o);
    gguf_close(g);
    lms_model *a = load_model(tu_data_path("models/qwen3-synth-f16.gguf")), *b = load_model(dir);
    same_hparams(a, b);
    assert_ptr_equal(b->output.data, b->tok_embd.data);
    same_vocab(a->tok, b->tok, true);
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++)
        same_tokens(a->tok, b->tok, samples[i], strlen(samples[i]));
    const int32_t toks[12] = {50256, 15496, 995, 11, 314, 716, 257, 1332, 13, 198, 40, 1101};
    same_logits(a, b, toks, 12);
    lms_model_free(b);
    /* the folder's config.json names it too */
    b = load_model(in(dir, "config.json"));
    same_logits(a, b, toks, 4);
    lms_model_free(b);
    lms_model_free(a);
}

/* llama (untied head, q/k permuted) in 3 shards; the tokenizer of the
 * folder is the first 512 tokens of GPT-2's (the GGUF's is SentencePiece). */
static void check_llama(const char *file, const char *name, bool pairs)
{
    gguf_file *g = open_gguf(file), *v = open_gguf("models/qwen3-synth-f16.gguf");
    const char *dir = folder(name);
    hf_opts o = {.hf_arch = "LlamaForCausalLM", .n_shards = 3, .merges_as_pairs = pairs,
                 .vocab_limit = 512};
    write_hf(g, v, dir, &o);
    gguf_close(g);
    gguf_close(v);
    lms_model *a = load_model(tu_data_path(file)), *b = load_model(dir);
    same_hparams(a, b);
    assert_ptr_not_equal(b->output.data, b->tok_embd.data);
    const int32_t toks[16] = {1, 403, 261, 378, 46, 263, 471, 29, 300, 69, 500, 12, 7, 99, 250, 3};
    same_logits(a, b, toks, 16);
    /* the tokenizer: 512 ids, every byte a token, merges applied */
    assert_int_equal(lms_tokenizer_n_vocab(b->tok), 512);
    int32_t ids[64];
    int64_t n = lms_tokenize(b->tok, " the", 4, false, false, ids, 64);
    assert_int_equal(n, 1);
    assert_string_equal(lms_token_text(b->tok, ids[0]), "\xc4\xa0the");
    lms_model_free(a);
    lms_model_free(b);
}

static void test_llama_f16_sharded(void **state)
{
    check_llama("models/llama-synth-f16.gguf", "llama-f16", false);
}

static void test_llama_bf16_pairs(void **state)
{
    check_llama("models/llama-synth-bf16.gguf", "llama-bf16", true);
}

/* ---- real vocabularies -------------------------------------------------------------- */

static lms_tokenizer *vocab_of(const char *dir)
{
    gguf_file *f;
    lms_tokenizer *t;
    char err[512];
    if (hf_open(dir, HF_OPEN_NO_TENSORS, &f, err, sizeof err) < 0 ||
        lms_tokenizer_load(f, &t, err, sizeof err) < 0)
        fail_msg("%s: %s", dir, err);
    gguf_close(f);
    return t;
}

/* Every test string of llama.cpp's vectors (and the chat vectors) gives
 * the same ids from the folder as from the GGUF vocab. */
static void check_vocab(const char *name, const char *hf_arch)
{
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizer/ggml-vocab-%s.gguf", name);
    gguf_file *g = open_gguf(rel);
    const char *dir = folder(name);
    hf_opts o = {.hf_arch = hf_arch, .no_tensors = true};
    write_hf(g, NULL, dir, &o);
    lms_tokenizer *a, *b = vocab_of(dir);
    char err[256];
    assert_int_equal(lms_tokenizer_load(g, &a, err, sizeof err), 0);
    same_vocab(a, b, false);
    assert_string_equal(lms_tokenizer_pre(b), !strcmp(name, "qwen2") ? "qwen2" : "llama3");
    for (int chat = 0; chat < 2; chat++) {
        char p[160];
        snprintf(p, sizeof p, "%s%s.inp", rel, chat ? ".chat" : "");
        size_t n;
        char *buf = tu_read_file(tu_data_path(p), &n);
        assert_non_null(buf);
        int n_tests = 0;
        const char *sep = "\n__ggml_vocab_test__\n";
        for (size_t at = 0; at < n; n_tests++) {
            const char *e = strstr(buf + at, sep);
            size_t len = e ? (size_t)(e - (buf + at)) : n - at;
            same_tokens(a, b, buf + at, len);
            at += len + (e ? strlen(sep) : 0);
        }
        assert_true(n_tests >= 15);
        free(buf);
    }
    lms_tokenizer_destroy(a);
    lms_tokenizer_destroy(b);
    gguf_close(g);
}

static void test_vocab_llama3(void **state) { check_vocab("llama-bpe", "LlamaForCausalLM"); }
static void test_vocab_qwen2(void **state) { check_vocab("qwen2", "Qwen2ForCausalLM"); }

/* ---- metadata details -------------------------------------------------------------------- */

/* A small folder without tensors: config.json fields over a base. */
static const char *small_folder(const char *name, const char *cfg_extra, const char *tc)
{
    const char *dir = folder(name);
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
             "\"intermediate_size\":96,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
             "\"vocab_size\":8,\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,"
             "\"max_position_embeddings\":4096%s}", cfg_extra);
    write_text(in(dir, "config.json"), cfg);
    write_text(in(dir, "tokenizer.json"),
               "{\"added_tokens\":[{\"id\":6,\"content\":\"<|begin_of_text|>\",\"special\":true},"
               "{\"id\":7,\"content\":\"<|eot_id|>\",\"special\":true},"
               "{\"id\":5,\"content\":\"<think>\",\"special\":false}],\"normalizer\":null,"
               "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"
               "\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\"},"
               "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
               "\"<|begin_of_text|>\",\"type_id\":0}},"
               "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]}]},"
               "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xc4\xa0\":3},"
               "\"merges\":[[\"a\",\"b\"]]}}");
    write_text(in(dir, "tokenizer_config.json"), tc);
    return dir;
}

static gguf_file *open_meta(const char *dir)
{
    gguf_file *f;
    char err[512];
    if (hf_open(dir, HF_OPEN_NO_TENSORS, &f, err, sizeof err) < 0)
        fail_msg("%s", err);
    return f;
}

static void test_metadata(void **state)
{
    const char *dir = small_folder(
        "meta", ",\"head_dim\":32,\"eos_token_id\":99",
        "{\"bos_token\":{\"content\":\"<|begin_of_text|>\"},\"chat_template\":["
        "{\"name\":\"default\",\"template\":\"{{ messages }}\"},"
        "{\"name\":\"tool_use\",\"template\":\"tools\"}]}");
    write_text(in(dir, "generation_config.json"), "{\"eos_token_id\":[7,6]}");
    gguf_file *f = open_meta(dir);
    assert_string_equal(str_of(f, "general.architecture"), "llama");
    assert_string_equal(str_of(f, "general.name"), "meta");
    assert_int_equal(int_of(f, "llama.embedding_length", 0), 64);
    assert_int_equal(int_of(f, "llama.attention.head_count_kv", 0), 2);
    assert_int_equal(int_of(f, "llama.attention.key_length", 0), 32);
    assert_int_equal(int_of(f, "llama.rope.dimension_count", 0), 32);
    assert_int_equal(int_of(f, "llama.context_length", 0), 4096);
    float base = 0;
    assert_int_equal(gguf_get_f32(f, "llama.rope.freq_base", &base), 0);
    assert_true(base == 500000.0f);
    assert_int_equal(int_of(f, "tokenizer.ggml.bos_token_id", -1), 6);
    /* generation_config's first */
    assert_int_equal(int_of(f, "tokenizer.ggml.eos_token_id", -1), 7);
    bool ab = false;
    assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &ab), 0);
    assert_true(ab); /* from the post_processor */
    assert_string_equal(str_of(f, "tokenizer.ggml.pre"), "gpt-2");
    assert_string_equal(str_of(f, "tokenizer.chat_template"), "{{ messages }}");
    assert_string_equal(str_of(f, "tokenizer.chat_template.tool_use"), "tools");
    const gguf_kv *ty = gguf_find_kv(f, "tokenizer.ggml.token_type");
    assert_int_equal(ty->n, 8);
    assert_int_equal(gguf_arr_i64(ty, 4), LMS_TOKEN_TYPE_UNUSED); /* a gap: [PAD4] */
    assert_string_equal(gguf_find_kv(f, "tokenizer.ggml.tokens")->strs[4].p, "[PAD4]");
    assert_int_equal(gguf_arr_i64(ty, 5), LMS_TOKEN_TYPE_USER_DEFINED);
    assert_int_equal(gguf_arr_i64(ty, 6), LMS_TOKEN_TYPE_CONTROL);
    assert_string_equal(gguf_find_kv(f, "tokenizer.ggml.merges")->strs[0].p, "a b");
    /* scalars also have raw bytes, as a parsed file's (the writer copies them) */
    const gguf_kv *kv = gguf_find_kv(f, "llama.block_count");
    uint32_t raw;
    memcpy(&raw, f->base + kv->file_offset, 4);
    assert_int_equal(raw, 1);
    gguf_close(f);

    /* chat_template.jinja when tokenizer_config.json has none; eos from it;
     * transformers' model_max_length (an integer over 64 bits) read */
    dir = small_folder("meta2", ",\"big\":-123456789012345678901234,\"small\":1.5e+300",
                       "{\"eos_token\":\"<|eot_id|>\",\"add_bos_token\":false,"
                       "\"model_max_length\":1000000000000000019884624838656,"
                       "\"x\":\"12345678901234567890123\\\"45678901234567890123\"}");
    write_text(in(dir, "chat_template.jinja"), "{% for m in messages %}{{ m }}{% endfor %}");
    f = open_meta(dir);
    assert_string_equal(str_of(f, "tokenizer.chat_template"),
                        "{% for m in messages %}{{ m }}{% endfor %}");
    assert_int_equal(int_of(f, "tokenizer.ggml.eos_token_id", -1), 7);
    assert_int_equal(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &ab), 0);
    assert_false(ab);
    assert_null(gguf_find_kv(f, "llama.attention.key_length"));
    assert_int_equal(int_of(f, "llama.rope.dimension_count", 0), 16);
    gguf_close(f);
}

/* Llama 3.1's rope scaling becomes rope_freqs.weight; linear scaling keys. */
static void test_rope_scaling(void **state)
{
    gguf_file *g = open_gguf("models/llama-synth-f16.gguf");
    gguf_file *v = open_gguf("models/qwen3-synth-f16.gguf");
    const char *dir = folder("llama3-rope");
    hf_opts o = {.hf_arch = "LlamaForCausalLM", .vocab_limit = 512};
    write_hf(g, v, dir, &o);
    gguf_close(g);
    gguf_close(v);
    char *cfg = tu_read_file(in(dir, "config.json"), NULL);
    json_t *c = json_loads(cfg, 0, NULL);
    free(cfg);
    json_object_set_new(c, "rope_scaling",
                        json_pack("{s:s,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "factor", 8.0,
                                  "low_freq_factor", 1.0, "high_freq_factor", 4.0,
                                  "original_max_position_embeddings", 64));
    json_dump_file(c, in(dir, "config.json"), 0);
    lms_model *m = load_model(dir);
    assert_non_null(m->rope_freqs.data);
    assert_int_equal(m->rope_freqs.ne[0], 32);
    /* head_dim 64, base 10000: wavelength 2 pi 10000^(2i/64); L = 64 ->
     * 1 below 16, 8 above 64, interpolated between */
    const float *f = m->rope_freqs.data;
    for (int i = 0; i < 32; i++) {
        double wl = 2 * M_PI * pow(10000.0, 2.0 * i / 64.0), want;
        if (wl < 16)
            want = 1;
        else if (wl > 64)
            want = 8;
        else
            want = 1 / ((1 - (64 / wl - 1) / 3) / 8 + (64 / wl - 1) / 3);
        assert_true(fabs(f[i] - want) < 1e-4 * want);
    }
    assert_true(f[0] == 1.0f && f[31] == 8.0f && f[5] > 1.0f && f[5] < 8.0f);
    float f_llama3[32];
    memcpy(f_llama3, f, sizeof f_llama3);
    lms_model_free(m);
    json_object_set_new(c, "rope_scaling", json_pack("{s:s,s:f}", "type", "linear", "factor", 4.0));
    json_dump_file(c, in(dir, "config.json"), 0);
    m = load_model(dir);
    assert_true(m->hp.rope_freq_scale == 0.25f);
    assert_null(m->rope_freqs.data);
    lms_model_free(m);
    /* transformers 5: rope_parameters holds the base and the scaling */
    json_object_del(c, "rope_scaling");
    json_object_del(c, "rope_theta");
    json_object_set_new(c, "rope_parameters",
                        json_pack("{s:s,s:f}", "rope_type", "default", "rope_theta", 1e6));
    json_dump_file(c, in(dir, "config.json"), 0);
    m = load_model(dir);
    assert_true(m->hp.rope_base == 1e6f);
    assert_true(m->hp.rope_freq_scale == 1.0f);
    assert_null(m->rope_freqs.data);
    lms_model_free(m);
    json_object_set_new(c, "rope_parameters",
                        json_pack("{s:s,s:f,s:f,s:f,s:f,s:i}", "rope_type", "llama3", "rope_theta",
                                  10000.0, "factor", 8.0, "low_freq_factor", 1.0,
                                  "high_freq_factor", 4.0, "original_max_position_embeddings", 64));
    json_dump_file(c, in(dir, "config.json"), 0);
    m = load_model(dir);
    assert_non_null(m->rope_freqs.data);
    assert_true(memcmp(m->rope_freqs.data, f_llama3, sizeof f_llama3) == 0);
    lms_model_free(m);
    json_decref(c);
}

static void test_info(void **state)
{
    const char *lmserv = getenv("LMSERV");
    if (!lmserv)
        skip();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s info %s 2>&1", lmserv, folder("qwen3"));
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[16384];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    assert_int_equal(pclose(p), 0);
    assert_non_null(strstr(out, "(Hugging Face, read as GGUF)"));
    assert_non_null(strstr(out, "general.architecture"));
    assert_non_null(strstr(out, "qwen3.attention.key_length"));
    assert_non_null(strstr(out, "tokenizer.ggml.merges"));
    assert_non_null(strstr(out, "arch qwen3, n_vocab 50257"));
    assert_non_null(strstr(out, "output tied to token_embd"));
}

/* `lmserv quantize DIR OUT TYPE` gives the model that quantizing the GGUF
 * gives: the same logits bit for bit. */
static void test_quantize(void **state)
{
    const char *lmserv = getenv("LMSERV");
    if (!lmserv)
        skip();
    char cmd[1024], a[200], b[200];
    snprintf(a, sizeof a, "%s/from-hf-q8.gguf", g_root);
    snprintf(b, sizeof b, "%s/from-gguf-q8.gguf", g_root);
    snprintf(cmd, sizeof cmd,
             "%s quantize %s %s Q8_0 >/dev/null && %s quantize %s %s Q8_0 >/dev/null", lmserv,
             folder("llama-f16"), a, lmserv, tu_data_path("models/llama-synth-f16.gguf"), b);
    assert_int_equal(system(cmd), 0);
    lms_model *ma = load_model(a), *mb = load_model(b);
    assert_int_equal(ma->tok_embd.type, LMS_TYPE_Q8_0);
    const int32_t toks[8] = {1, 403, 261, 378, 46, 263, 471, 29};
    same_logits(ma, mb, toks, 8);
    lms_model_free(ma);
    lms_model_free(mb);
}

/* ---- errors ---------------------------------------------------------------------------- */

static const char *load_err(const char *path)
{
    static char err[768];
    lms_model *m = NULL;
    err[0] = 0;
    assert_true(lms_model_load(path, &m, err, sizeof err) < 0);
    assert_null(m);
    return err;
}

static void expect(const char *msg, const char *want)
{
    if (!strstr(msg, want))
        fail_msg("message '%s' lacks '%s'", msg, want);
}

/* Copies folder src to a new folder dst (flat). */
static const char *copy_folder(const char *src, const char *name)
{
    const char *dst = folder(name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp -f %s/* %s/", src, dst);
    assert_int_equal(system(cmd), 0);
    return dst;
}

/* Replaces the first `from` in a file by `to`. */
static void edit(const char *path, const char *from, const char *to)
{
    size_t n;
    char *s = tu_read_file(path, &n);
    assert_non_null(s);
    char *at = memmem(s, n, from, strlen(from)); /* binary-safe: safetensors too */
    if (!at)
        fail_msg("'%s' not in %s", from, path);
    FILE *f = fopen(path, "wb");
    fwrite(s, 1, (size_t)(at - s), f);
    fputs(to, f);
    fwrite(at + strlen(from), 1, n - (size_t)(at - s) - strlen(from), f);
    fclose(f);
    free(s);
}

/* One error case: a copy of folder `src` with `from` replaced by `to` in
 * `file` (from NULL: file deleted, and a file named `to` created when
 * given) fails to load with a message containing want (and want2). */
typedef struct edit_case {
    const char *src, *file, *from, *to, *want, *want2;
} edit_case;

static void run_cases(const edit_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const edit_case *c = &cases[i];
        char src[200], name[32];
        snprintf(src, sizeof src, "%s", folder(c->src));
        snprintf(name, sizeof name, "case-%s-%zu", c->src, i);
        const char *d = copy_folder(src, name);
        if (c->from)
            edit(in(d, c->file), c->from, c->to);
        else
            unlink(in(d, c->file));
        if (!c->from && c->to)
            write_text(in(d, c->to), "x");
        const char *msg = load_err(d);
        expect(msg, c->want);
        if (c->want2)
            expect(msg, c->want2);
    }
}

static const edit_case config_cases[] = {
    {"llama-f16", "config.json", "\"num_attention_heads\"", "\"num_attention_headz\"",
     "config.json: \"num_attention_heads\" is missing", NULL},
    {"llama-f16", "config.json", "LlamaForCausalLM", "GPTNeoXForCausalLM",
     "config.json: architecture \"GPTNeoXForCausalLM\" is not supported", NULL},
    {"llama-f16", "config.json", "{", "[", "config.json: not valid JSON", NULL},
    {"llama-f16", "config.json", "{", "{\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4},",
     "config.json: \"rope_scaling\" type \"yarn\" is not supported", NULL},
    {"llama-f16", "config.json", "{", "{\"attention_bias\":true,",
     "config.json: \"attention_bias\": true is not supported", NULL},
    {"llama-f16", "config.json", "\"intermediate_size\":768", "\"intermediate_size\":512",
     "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [768, 256], but config.json "
     "(intermediate_size, hidden_size) gives [512, 256]", NULL},
    {"llama-f16", "config.json", "\"num_hidden_layers\":2", "\"num_hidden_layers\":1",
     "is of layer 1, but config.json \"num_hidden_layers\" is 1", NULL},
    {"llama-f16", "config.json", "\"num_hidden_layers\":2", "\"num_hidden_layers\":3",
     "model.safetensors.index.json: tensor 'model.layers.2.", "' is missing"},
    /* an untied config over a checkpoint without lm_head */
    {"qwen3", "config.json", "\"tie_word_embeddings\":true", "\"tie_word_embeddings\":false",
     "model.safetensors: tensor 'lm_head.weight' is missing (config.json "
     "\"tie_word_embeddings\" is false)", NULL},
};

static void test_config_errors(void **state)
{
    expect(load_err(folder("empty")), "config.json: missing");
    run_cases(config_cases, sizeof config_cases / sizeof config_cases[0]);
}

static const edit_case index_cases[] = {
    {"llama-f16", "model.safetensors.index.json", "\"model-00001-of-00003.safetensors\"",
     "\"../llama-f16/model-00001-of-00003.safetensors\"",
     "names '../llama-f16/model-00001-of-00003.safetensors', which is not a file name inside "
     "the folder (refused)", NULL},
    {"llama-f16", "model.safetensors.index.json", "-00001-of-00003.safetensors\"",
     "-00002-of-00003.safetensors\"", "which does not hold it", NULL},
    /* a dtype the reader refuses, named with its file */
    {"llama-f16", "model-00003-of-00003.safetensors", "\"dtype\":\"F16\"", "\"dtype\":\"I16\"",
     "model-00003-of-00003.safetensors: tensor '",
     "dtype \"I16\" is not supported (F32, F16, BF16)"},
    /* a tensor the architecture does not have */
    {"qwen3", "model.safetensors", ".q_norm.weight\"", ".x_norm.weight\"",
     "model.safetensors: tensor 'model.layers.", "x_norm.weight' is not part of a Qwen3ForCausalLM "
                                                 "checkpoint"},
    {"llama-f16", "model-00002-of-00003.safetensors", NULL, NULL,
     "model.safetensors.index.json: \"weight_map\" names 'model-00002-of-00003.safetensors', "
     "which does not exist", NULL},
    {"llama-f16", "model.safetensors.index.json", NULL, NULL,
     "model.safetensors: missing, and no model.safetensors.index.json", NULL},
};

static void test_index_errors(void **state)
{
    run_cases(index_cases, sizeof index_cases / sizeof index_cases[0]);
}

static const edit_case tokenizer_cases[] = {
    {"llama-f16", "tokenizer.json", "\"type\":\"BPE\"", "\"type\":\"Unigram\"",
     "tokenizer.json: model type \"Unigram\" is not supported", NULL},
    {"llama-f16", "tokenizer.json", "\"byte_fallback\":false", "\"byte_fallback\":true",
     "\"byte_fallback\" (SentencePiece style) is not supported", NULL},
    {"llama-f16", "tokenizer.json",
     "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
     "\"trim_offsets\":true,\"use_regex\":true}",
     "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
     "\"pattern\":{\"Regex\":\"\\\\p{N}{1,4}| ?\\\\p{L}+\"},\"behavior\":\"Isolated\"},"
     "{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
     "tokenizer.json: pre-tokenizer pattern \"\\p{N}{1,4}| ?\\p{L}+\" is not one this "
     "tokenizer knows", NULL},
    {"llama-f16", "tokenizer.json", "{\"type\":\"ByteLevel\",\"add_prefix_space\"",
     "{\"type\":\"Metaspace\",\"add_prefix_space\"",
     "pre_tokenizer type \"Metaspace\" is not supported", NULL},
    {"llama-f16", "tokenizer.json", "\"merges\":[", "\"merges\":[7,",
     "tokenizer.json: model.merges[0] is neither", NULL},
    {"qwen3", "tokenizer_config.json", "\"eos_token\":{\"content\":\"",
     "\"eos_token\":{\"content\":\"</nope>",
     "tokenizer_config.json: \"eos_token\" '</nope><|endoftext|>' is not a token", NULL},
    {"llama-f16", "tokenizer.json", NULL, "tokenizer.model",
     "tokenizer.json: missing; a SentencePiece tokenizer.model alone is not supported", NULL},
};

static void test_tokenizer_errors(void **state)
{
    run_cases(tokenizer_cases, sizeof tokenizer_cases / sizeof tokenizer_cases[0]);
}

static int setup(void **state)
{
    snprintf(g_root, sizeof g_root, "/tmp/lms-test-hf-XXXXXX");
    assert_non_null(mkdtemp(g_root));
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_root);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_tied_one_file),
        cmocka_unit_test(test_llama_f16_sharded),
        cmocka_unit_test(test_llama_bf16_pairs),
        cmocka_unit_test(test_vocab_llama3),
        cmocka_unit_test(test_vocab_qwen2),
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_quantize),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_index_errors),
        cmocka_unit_test(test_tokenizer_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
