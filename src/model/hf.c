/*
 * hf.c - a Hugging Face model folder as an in-memory gguf_file (what the
 * folder holds and why: hf.h).
 *
 * Central idea: build exactly the metadata keys and tensors llama.cpp's
 * converter would write, with the tensor views pointing into the mapped
 * safetensors files, so that model.c and the tokenizer cannot tell the
 * difference. The facts used are the converter's:
 *
 *   config.json                  GGUF key (<a> = general.architecture)
 *   ---------------------------  -----------------------------------------
 *   architectures[0]             general.architecture: llama (Llama,
 *                                Mistral), qwen2, qwen3
 *   max_position_embeddings      <a>.context_length
 *   hidden_size                  <a>.embedding_length
 *   num_hidden_layers            <a>.block_count
 *   intermediate_size            <a>.feed_forward_length
 *   num_attention_heads          <a>.attention.head_count
 *   num_key_value_heads          <a>.attention.head_count_kv (default: heads)
 *   head_dim                     <a>.attention.key_length, value_length
 *                                (llama also rope.dimension_count)
 *   rms_norm_eps                 <a>.attention.layer_norm_rms_epsilon
 *   rope_theta                   <a>.rope.freq_base (default 10000, as in
 *                                the transformers configs)
 *   rope_scaling linear          <a>.rope.scaling.type, .factor
 *   rope_scaling llama3          tensor rope_freqs.weight (per-frequency
 *                                divisors, formula at llama3_freqs)
 *   vocab_size                   <a>.vocab_size; the token list is padded
 *                                to it with [PAD<id>] tokens (type unused)
 *   tie_word_embeddings          no output.weight (default false)
 *
 *   tensor (model.layers.N. ...)       GGUF tensor (blk.N. ...)
 *   ---------------------------------  -----------------------------------
 *   model.embed_tokens.weight          token_embd.weight
 *   model.norm.weight                  output_norm.weight
 *   lm_head.weight                     output.weight (skipped when tied)
 *   input_layernorm.weight             attn_norm.weight
 *   self_attn.{q,k,v,o}_proj.weight    attn_{q,k,v,output}.weight
 *   self_attn.{q,k,v}_proj.bias        attn_{q,k,v}.bias (qwen2)
 *   self_attn.{q,k}_norm.weight        attn_{q,k}_norm.weight (qwen3)
 *   post_attention_layernorm.weight    ffn_norm.weight
 *   mlp.{gate,up,down}_proj.weight     ffn_{gate,up,down}.weight
 *   self_attn.rotary_emb.inv_freq      not used (older checkpoints)
 *
 * Shapes are reversed (HF row-major [rows, cols] is GGUF ne [cols, rows]),
 * bytes unchanged; llama's q/k rows are permuted (lms_st_reorder), 1-D
 * tensors converted to F32.
 *
 * The tokenizer (tokenizer.json, byte-level BPE only) becomes
 * tokenizer.ggml.model "gpt2", tokens by id (added tokens: control when
 * special or spelled <|...|>, else user-defined), merges as "a b", the
 * pre-tokenizer named by its Split regexes (lms_tokenizer_bpe_pre_find).
 *
 * Callers: lms_model_load, `lmserv info` (through hf_open_any).
 */
#include "model/hf.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/err.h"
#include "kernels/kernels.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

#define HF_MAX_DIM (1 << 24)  /* any hyper-parameter above this is not a real model's */
#define HF_MAX_SHARDS 4096
#define HF_MAX_REGEX 8

/* ---- owned memory -------------------------------------------------------------
 * Everything the gguf_file's views point into besides its own arrays:
 * strings, numeric arrays, converted tensors, the mapped files. Released
 * by gguf_close through gguf_file.release. */

typedef struct hf_owner {
    void **blocks;
    size_t n_blocks, cap_blocks;
    char *chunk;       /* the string chunk being filled (one of blocks) */
    size_t chunk_used;
    lms_st_file **files;
    int n_files;
} hf_owner;

static void owner_release(void *ctx)
{
    hf_owner *o = ctx;
    if (!o)
        return;
    for (size_t i = 0; i < o->n_blocks; i++)
        free(o->blocks[i]);
    free(o->blocks);
    for (int i = 0; i < o->n_files; i++)
        lms_st_close(o->files[i]);
    free(o->files);
    free(o);
}

/* Room for element n of the array *arr (capacity *cap, elem bytes each). */
static bool grow(void *arr, size_t n, size_t *cap, size_t elem)
{
    void **pa = arr;
    if (n < *cap)
        return true;
    const size_t nc = *cap ? *cap * 2 : 64;
    void *p = realloc(*pa, nc * elem);
    if (!p)
        return false;
    *pa = p;
    *cap = nc;
    return true;
}

/* Takes p (malloc'd) into o; on failure frees p and returns NULL. */
static void *own(hf_owner *o, void *p)
{
    if (p && !grow(&o->blocks, o->n_blocks, &o->cap_blocks, sizeof *o->blocks)) {
        free(p);
        return NULL;
    }
    if (p)
        o->blocks[o->n_blocks++] = p;
    return p;
}

static void *own_alloc(hf_owner *o, size_t n) { return own(o, malloc(n ? n : 1)); }

/* A NUL-terminated copy of s[0..n), from 1 MiB chunks (a vocabulary is
 * hundreds of thousands of short strings). */
static char *own_str(hf_owner *o, const char *s, size_t n)
{
    enum { CHUNK = 1 << 20 };
    char *p;
    if (n + 1 > CHUNK / 4) {
        p = own_alloc(o, n + 1);
    } else {
        if (!o->chunk || CHUNK - o->chunk_used < n + 1) {
            if (!(o->chunk = own_alloc(o, CHUNK)))
                return NULL;
            o->chunk_used = 0;
        }
        p = o->chunk + o->chunk_used;
        o->chunk_used += n + 1;
    }
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* ---- the builder ---------------------------------------------------------------- */

typedef struct hf_arch {
    const char *hf;     /* config.json architectures[0] */
    const char *gguf;   /* general.architecture */
    bool permute_qk;    /* RoPE on adjacent pairs: q/k rows reordered */
    bool qkv_bias;      /* q/k/v projections have biases */
    bool qk_norm;       /* per-head RMSNorm of q and k */
} hf_arch;

static const hf_arch hf_archs[] = {
    {"LlamaForCausalLM", "llama", true, false, false},
    {"MistralForCausalLM", "llama", true, false, false}, /* the converter writes llama */
    {"Qwen2ForCausalLM", "qwen2", false, true, false},
    {"Qwen3ForCausalLM", "qwen3", false, false, true},
};

typedef struct hf_build {
    char dir[4096];     /* the folder, without a trailing slash */
    unsigned flags;
    hf_owner *own;
    gguf_kv *kv;
    size_t n_kv, cap_kv;
    gguf_tensor *ts;
    size_t n_ts, cap_ts;
    char *err;
    size_t errsz;
    /* from config.json */
    const hf_arch *arch;
    int64_t n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_vocab;
    bool tied;
    double rope_theta;
    json_t *rope_scaling; /* borrowed from cfg */
    json_t *cfg;          /* config.json */
} hf_build;

/* "hf '<dir>': <file>: <message>" */
__attribute__((format(printf, 4, 5))) static int ferr(hf_build *b, int code, const char *file,
                                                      const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lms_errf(b->err, b->errsz, code, "hf '%s': %s: %s", b->dir, file, msg);
}

static int nomem(hf_build *b)
{
    return lms_errf(b->err, b->errsz, LMS_ERR_NOMEM, "hf '%s': out of memory", b->dir);
}

static void join(const hf_build *b, const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", b->dir, name);
}

static bool file_exists(const hf_build *b, const char *name)
{
    char p[4200];
    struct stat st;
    join(b, name, p, sizeof p);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A JSON file of the folder; NULL with *rc = 0 when absent and optional. */
/* A JSON file's text with every integer literal too large for 64 bits
 * given a fraction (transformers writes model_max_length as
 * 1000000000000000019884624838656, which jansson refuses as an integer;
 * as a real it is read, and no field lmserv uses is such a number). NULL
 * when the file cannot be read or is over HF_JSON_MAX bytes. */
#define HF_JSON_MAX (256 << 20)
static char *read_json_text(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *in = NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size >= 0 && size <= HF_JSON_MAX && fseek(f, 0, SEEK_SET) == 0)
        in = malloc((size_t)size + 1);
    if (in && fread(in, 1, (size_t)size, f) != (size_t)size) {
        free(in);
        in = NULL;
    }
    fclose(f);
    if (!in)
        return NULL;
    /* at most one ".0" per 19 input bytes */
    char *out = malloc((size_t)size + (size_t)size / 19 * 2 + 1);
    if (!out) {
        free(in);
        return NULL;
    }
    size_t o = 0;
    bool in_str = false;
    for (long i = 0; i < size;) {
        const char c = in[i];
        if (in_str) {
            out[o++] = in[i++];
            if (c == '\\' && i < size)
                out[o++] = in[i++];
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
            out[o++] = in[i++];
            continue;
        }
        if (c < '0' || c > '9' || (i > 0 && (in[i - 1] == '.' || in[i - 1] == 'e' ||
                                            in[i - 1] == 'E' || in[i - 1] == '+'))) {
            out[o++] = in[i++];
            continue;
        }
        long e = i;
        while (e < size && in[e] >= '0' && in[e] <= '9')
            e++;
        memcpy(out + o, in + i, (size_t)(e - i));
        o += (size_t)(e - i);
        const bool frac = e < size && (in[e] == '.' || in[e] == 'e' || in[e] == 'E');
        if (e - i > 18 && !frac) {
            out[o++] = '.';
            out[o++] = '0';
        }
        i = e;
    }
    free(in);
    *n_out = o;
    return out;
}

static json_t *load_json(hf_build *b, const char *name, bool required, int *rc)
{
    char p[4200];
    join(b, name, p, sizeof p);
    *rc = 0;
    if (!file_exists(b, name)) {
        if (required)
            *rc = ferr(b, LMS_ERR_NOTFOUND, name, "missing (a Hugging Face model folder needs it)");
        return NULL;
    }
    size_t n = 0;
    char *text = read_json_text(p, &n);
    if (!text) {
        *rc = ferr(b, LMS_ERR_IO, name, "cannot be read (or is over %d MiB)", HF_JSON_MAX >> 20);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!j) {
        *rc = ferr(b, LMS_ERR_FORMAT, name, "not valid JSON: %s (line %d, column %d)", je.text,
                   je.line, je.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        *rc = ferr(b, LMS_ERR_FORMAT, name, "not a JSON object");
        return NULL;
    }
    return j;
}

/* A new metadata entry with key prefix.suffix (prefix may be NULL). */
static gguf_kv *kv_new(hf_build *b, int type, const char *prefix, const char *suffix)
{
    if (!grow(&b->kv, b->n_kv, &b->cap_kv, sizeof *b->kv))
        return NULL;
    char key[256];
    int n = snprintf(key, sizeof key, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", suffix);
    char *k = own_str(b->own, key, (size_t)n);
    if (!k)
        return NULL;
    gguf_kv *kv = &b->kv[b->n_kv++];
    memset(kv, 0, sizeof *kv);
    kv->key = (gguf_str){k, (size_t)n};
    kv->type = type;
    kv->arr_type = -1;
    kv->n = 1;
    return kv;
}

static int kv_u32(hf_build *b, const char *prefix, const char *suffix, uint32_t v)
{
    gguf_kv *kv = kv_new(b, GGUF_VT_U32, prefix, suffix);
    if (!kv)
        return nomem(b);
    kv->v.i = v;
    return 0;
}

static int kv_f32(hf_build *b, const char *prefix, const char *suffix, double v)
{
    gguf_kv *kv = kv_new(b, GGUF_VT_F32, prefix, suffix);
    if (!kv)
        return nomem(b);
    kv->v.f = (float)v;
    return 0;
}

static int kv_bool(hf_build *b, const char *suffix, bool v)
{
    gguf_kv *kv = kv_new(b, GGUF_VT_BOOL, NULL, suffix);
    if (!kv)
        return nomem(b);
    kv->v.i = v;
    return 0;
}

static int kv_str(hf_build *b, const char *prefix, const char *suffix, const char *s, size_t n)
{
    gguf_kv *kv = kv_new(b, GGUF_VT_STRING, prefix, suffix);
    char *p = kv ? own_str(b->own, s, n) : NULL;
    if (!p)
        return nomem(b);
    kv->v.s = (gguf_str){p, n};
    return 0;
}

/* A string array: strs (malloc'd, taken over) of strings in owned memory. */
static int kv_strs(hf_build *b, const char *suffix, gguf_str *strs, uint64_t n)
{
    gguf_kv *kv = kv_new(b, GGUF_VT_ARRAY, NULL, suffix);
    if (!kv) {
        free(strs);
        return nomem(b);
    }
    kv->arr_type = GGUF_VT_STRING;
    kv->n = n;
    kv->strs = strs;
    return 0;
}

static int kv_i32s(hf_build *b, const char *suffix, const int32_t *v, uint64_t n)
{
    gguf_kv *kv = kv_new(b, GGUF_VT_ARRAY, NULL, suffix);
    if (!kv)
        return nomem(b);
    kv->arr_type = GGUF_VT_I32;
    kv->n = n;
    kv->arr = v;
    return 0;
}

static gguf_tensor *tensor_new(hf_build *b, const char *name)
{
    if (!grow(&b->ts, b->n_ts, &b->cap_ts, sizeof *b->ts))
        return NULL;
    size_t n = strlen(name);
    char *p = own_str(b->own, name, n);
    if (!p)
        return NULL;
    gguf_tensor *t = &b->ts[b->n_ts++];
    memset(t, 0, sizeof *t);
    t->name = (gguf_str){p, n};
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    return t;
}

/* ---- config.json ------------------------------------------------------------------ */

/* Integer field in [1, max]; absent: def (< 0: required). */
static int cfg_int(hf_build *b, const char *field, int64_t def, int64_t max, int64_t *out)
{
    const json_t *v = json_object_get(b->cfg, field);
    if (!v || json_is_null(v)) {
        if (def < 0)
            return ferr(b, LMS_ERR_FORMAT, "config.json", "\"%s\" is missing", field);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > max)
        return ferr(b, LMS_ERR_FORMAT, "config.json", "\"%s\" must be an integer from 1 to %lld",
                    field, (long long)max);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int cfg_num(hf_build *b, const char *field, double def, double *out)
{
    const json_t *v = json_object_get(b->cfg, field);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return ferr(b, LMS_ERR_FORMAT, "config.json", "\"%s\" must be a positive number", field);
    *out = json_number_value(v);
    return 0;
}

static int cfg_bool(hf_build *b, const char *field, bool def, bool *out)
{
    const json_t *v = json_object_get(b->cfg, field);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return ferr(b, LMS_ERR_FORMAT, "config.json", "\"%s\" must be true or false", field);
    *out = json_is_true(v);
    return 0;
}

static int read_arch(hf_build *b)
{
    const json_t *a = json_object_get(b->cfg, "architectures");
    const char *name = json_string_value(json_array_get(a, 0));
    if (!name)
        return ferr(b, LMS_ERR_FORMAT, "config.json",
                    "\"architectures\" is missing or not a list of names");
    for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
        if (!strcmp(hf_archs[i].hf, name))
            b->arch = &hf_archs[i];
    if (!b->arch)
        return ferr(b, LMS_ERR_UNSUPPORTED, "config.json",
                    "architecture \"%.80s\" is not supported (LlamaForCausalLM, "
                    "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)", name);
    return 0;
}

/* What the forward pass has no room for is refused by name. */
static int refuse_unsupported(hf_build *b)
{
    const char *act = json_string_value(json_object_get(b->cfg, "hidden_act"));
    if (json_object_get(b->cfg, "hidden_act") && (!act || strcmp(act, "silu")))
        return ferr(b, LMS_ERR_UNSUPPORTED, "config.json",
                    "\"hidden_act\" \"%.40s\" is not supported (silu)", act ? act : "?");
    bool on = false;
    int rc;
    if ((rc = cfg_bool(b, "attention_bias", false, &on)) < 0)
        return rc;
    if (on && !b->arch->qkv_bias)
        return ferr(b, LMS_ERR_UNSUPPORTED, "config.json",
                    "\"attention_bias\": true is not supported for %s", b->arch->hf);
    if ((rc = cfg_bool(b, "mlp_bias", false, &on)) < 0)
        return rc;
    if (on)
        return ferr(b, LMS_ERR_UNSUPPORTED, "config.json", "\"mlp_bias\": true is not supported");
    if ((rc = cfg_bool(b, "use_sliding_window", false, &on)) < 0)
        return rc;
    if (on)
        return ferr(b, LMS_ERR_UNSUPPORTED, "config.json",
                    "\"use_sliding_window\": true is not supported");
    return 0;
}

/* transformers 5 writes "rope_parameters": {"rope_type", "rope_theta",
 * and the scaling's fields} in place of rope_theta and rope_scaling; the
 * older keys win where both are present. */
static int read_rope_parameters(hf_build *b)
{
    json_t *rp = json_object_get(b->cfg, "rope_parameters");
    if (!rp || json_is_null(rp))
        return 0;
    if (!json_is_object(rp))
        return ferr(b, LMS_ERR_FORMAT, "config.json", "\"rope_parameters\" is not an object");
    const json_t *theta = json_object_get(rp, "rope_theta");
    if (theta && !json_object_get(b->cfg, "rope_theta")) {
        if (!json_is_number(theta) || !(json_number_value(theta) > 0))
            return ferr(b, LMS_ERR_FORMAT, "config.json",
                        "\"rope_parameters\" \"rope_theta\" must be a positive number");
        b->rope_theta = json_number_value(theta);
    }
    const json_t *type = json_object_get(rp, "rope_type");
    if (type && !json_is_string(type))
        return ferr(b, LMS_ERR_FORMAT, "config.json",
                    "\"rope_parameters\" \"rope_type\" is not a string");
    if (!b->rope_scaling && type && strcmp(json_string_value(type), "default") != 0)
        b->rope_scaling = rp;
    return 0;
}

static int read_config(hf_build *b)
{
    int rc;
    if ((rc = read_arch(b)) < 0 || (rc = refuse_unsupported(b)) < 0 ||
        (rc = cfg_int(b, "hidden_size", -1, HF_MAX_DIM, &b->n_embd)) < 0 ||
        (rc = cfg_int(b, "num_hidden_layers", -1, 4096, &b->n_layer)) < 0 ||
        (rc = cfg_int(b, "intermediate_size", -1, HF_MAX_DIM, &b->n_ff)) < 0 ||
        (rc = cfg_int(b, "num_attention_heads", -1, 4096, &b->n_head)) < 0 ||
        (rc = cfg_int(b, "num_key_value_heads", b->n_head, 4096, &b->n_head_kv)) < 0 ||
        (rc = cfg_int(b, "vocab_size", -1, HF_MAX_DIM, &b->n_vocab)) < 0 ||
        (rc = cfg_bool(b, "tie_word_embeddings", false, &b->tied)) < 0 ||
        (rc = cfg_num(b, "rope_theta", 10000.0, &b->rope_theta)) < 0)
        return rc;
    if (b->n_head % b->n_head_kv != 0)
        return ferr(b, LMS_ERR_FORMAT, "config.json",
                    "\"num_attention_heads\" %lld is not a multiple of "
                    "\"num_key_value_heads\" %lld", (long long)b->n_head, (long long)b->n_head_kv);
    const bool has_hd = json_is_integer(json_object_get(b->cfg, "head_dim"));
    if (!has_hd && b->n_embd % b->n_head != 0)
        return ferr(b, LMS_ERR_FORMAT, "config.json",
                    "\"hidden_size\" %lld is not a multiple of \"num_attention_heads\" %lld (and "
                    "there is no \"head_dim\")", (long long)b->n_embd, (long long)b->n_head);
    if ((rc = cfg_int(b, "head_dim", b->n_embd / b->n_head, 4096, &b->head_dim)) < 0)
        return rc;
    if (b->head_dim % 2 != 0)
        return ferr(b, LMS_ERR_FORMAT, "config.json", "\"head_dim\" %lld is odd",
                    (long long)b->head_dim);
    b->rope_scaling = json_object_get(b->cfg, "rope_scaling");
    if (json_is_null(b->rope_scaling))
        b->rope_scaling = NULL;
    if (b->rope_scaling && !json_is_object(b->rope_scaling))
        return ferr(b, LMS_ERR_FORMAT, "config.json", "\"rope_scaling\" is not an object");
    return read_rope_parameters(b);
}

/* rope_scaling's type ("rope_type" in newer configs, "type" in older). */
static const char *rope_scaling_type(const hf_build *b)
{
    const char *t = json_string_value(json_object_get(b->rope_scaling, "rope_type"));
    return t ? t : json_string_value(json_object_get(b->rope_scaling, "type"));
}

static int write_hparams(hf_build *b)
{
    const char *a = b->arch->gguf;
    int64_t ctx = 0;
    int rc;
    if ((rc = cfg_int(b, "max_position_embeddings", 2048, INT32_MAX, &ctx)) < 0)
        return rc;
    double eps = 0;
    if ((rc = cfg_num(b, "rms_norm_eps", 1e-6, &eps)) < 0)
        return rc;
    const char *dir_name = strrchr(b->dir, '/');
    dir_name = dir_name ? dir_name + 1 : b->dir;
    if ((rc = kv_str(b, NULL, "general.architecture", a, strlen(a))) < 0 ||
        (rc = kv_str(b, NULL, "general.name", dir_name, strlen(dir_name))) < 0 ||
        (rc = kv_u32(b, a, "context_length", (uint32_t)ctx)) < 0 ||
        (rc = kv_u32(b, a, "embedding_length", (uint32_t)b->n_embd)) < 0 ||
        (rc = kv_u32(b, a, "block_count", (uint32_t)b->n_layer)) < 0 ||
        (rc = kv_u32(b, a, "feed_forward_length", (uint32_t)b->n_ff)) < 0 ||
        (rc = kv_u32(b, a, "attention.head_count", (uint32_t)b->n_head)) < 0 ||
        (rc = kv_u32(b, a, "attention.head_count_kv", (uint32_t)b->n_head_kv)) < 0 ||
        (rc = kv_f32(b, a, "rope.freq_base", b->rope_theta)) < 0 ||
        (rc = kv_f32(b, a, "attention.layer_norm_rms_epsilon", eps)) < 0 ||
        (rc = kv_u32(b, a, "vocab_size", (uint32_t)b->n_vocab)) < 0)
        return rc;
    if (json_object_get(b->cfg, "head_dim") &&
        ((rc = kv_u32(b, a, "attention.key_length", (uint32_t)b->head_dim)) < 0 ||
         (rc = kv_u32(b, a, "attention.value_length", (uint32_t)b->head_dim)) < 0))
        return rc;
    if (b->arch->permute_qk &&
        (rc = kv_u32(b, a, "rope.dimension_count", (uint32_t)b->head_dim)) < 0)
        return rc;
    if (!b->rope_scaling)
        return 0;
    const char *type = rope_scaling_type(b);
    if (!type)
        return ferr(b, LMS_ERR_FORMAT, "config.json", "\"rope_scaling\" has no \"rope_type\"");
    if (!strcmp(type, "default") || !strcmp(type, "llama3"))
        return 0; /* llama3: a rope_freqs tensor (add_rope_freqs) */
    if (strcmp(type, "linear"))
        return ferr(b, LMS_ERR_UNSUPPORTED, "config.json",
                    "\"rope_scaling\" type \"%.40s\" is not supported (linear, llama3)", type);
    const json_t *f = json_object_get(b->rope_scaling, "factor");
    if (!json_is_number(f) || !(json_number_value(f) > 0))
        return ferr(b, LMS_ERR_FORMAT, "config.json",
                    "\"rope_scaling\" \"factor\" must be a positive number");
    if ((rc = kv_str(b, a, "rope.scaling.type", "linear", 6)) < 0 ||
        (rc = kv_f32(b, a, "rope.scaling.factor", json_number_value(f))) < 0)
        return rc;
    return 0;
}

/* Llama 3's rope scaling as the converter stores it: a divisor per
 * frequency pair i (freq_i = base^(-2i/hd), wavelength w = 2 pi / freq_i):
 * 1 when w < L / high, factor when w > L / low, else
 * 1 / ((1 - s) / factor + s) with s = (L / w - low) / (high - low);
 * L = original_max_position_embeddings (default 8192), factor (8),
 * low = low_freq_factor (1), high = high_freq_factor (4). */
static int llama3_freqs(hf_build *b)
{
    if (!b->rope_scaling || strcmp(rope_scaling_type(b), "llama3"))
        return 0;
    double v[4] = {8.0, 1.0, 4.0, 8192.0};
    static const char *const names[4] = {"factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_position_embeddings"};
    for (int i = 0; i < 4; i++) {
        const json_t *j = json_object_get(b->rope_scaling, names[i]);
        if (j && !(json_is_number(j) && json_number_value(j) > 0))
            return ferr(b, LMS_ERR_FORMAT, "config.json",
                        "\"rope_scaling\" \"%s\" must be a positive number", names[i]);
        if (j)
            v[i] = json_number_value(j);
    }
    if (v[1] == v[2])
        return ferr(b, LMS_ERR_FORMAT, "config.json",
                    "\"rope_scaling\" low_freq_factor equals high_freq_factor");
    const int64_t n = b->head_dim / 2;
    float *f = own_alloc(b->own, (size_t)n * sizeof *f);
    gguf_tensor *t = f ? tensor_new(b, "rope_freqs.weight") : NULL;
    if (!t)
        return nomem(b);
    const double lo_wl = v[3] / v[1], hi_wl = v[3] / v[2];
    for (int64_t i = 0; i < n; i++) {
        const float freq = 1.0f / powf((float)b->rope_theta, (float)(2 * i) / (float)b->head_dim);
        const double wl = 2.0 * M_PI / freq;
        if (wl < hi_wl) {
            f[i] = 1.0f;
        } else if (wl > lo_wl) {
            f[i] = (float)v[0];
        } else {
            const double s = (v[3] / wl - v[1]) / (v[2] - v[1]);
            f[i] = (float)(1.0 / ((1.0 - s) / v[0] + s));
        }
    }
    t->type = LMS_TYPE_F32;
    t->n_dims = 1;
    t->ne[0] = n;
    t->n_bytes = (size_t)n * 4;
    t->data = f;
    return 0;
}

/* ---- tensors ------------------------------------------------------------------------ */

enum { SH_EMBD, SH_Q, SH_KV, SH_O, SH_QV, SH_KVV, SH_HD, SH_FF_IN, SH_FF_OUT, SH_VOCAB };
enum { NEED_ALL, NEED_BIAS, NEED_QKNORM };

static const struct layer_tensor {
    const char *hf, *gguf;
    int shape, need;
} layer_tensors[] = {
    {"input_layernorm.weight", "attn_norm.weight", SH_EMBD, NEED_ALL},
    {"self_attn.q_proj.weight", "attn_q.weight", SH_Q, NEED_ALL},
    {"self_attn.k_proj.weight", "attn_k.weight", SH_KV, NEED_ALL},
    {"self_attn.v_proj.weight", "attn_v.weight", SH_KV, NEED_ALL},
    {"self_attn.o_proj.weight", "attn_output.weight", SH_O, NEED_ALL},
    {"self_attn.q_proj.bias", "attn_q.bias", SH_QV, NEED_BIAS},
    {"self_attn.k_proj.bias", "attn_k.bias", SH_KVV, NEED_BIAS},
    {"self_attn.v_proj.bias", "attn_v.bias", SH_KVV, NEED_BIAS},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", SH_HD, NEED_QKNORM},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", SH_HD, NEED_QKNORM},
    {"post_attention_layernorm.weight", "ffn_norm.weight", SH_EMBD, NEED_ALL},
    {"mlp.gate_proj.weight", "ffn_gate.weight", SH_FF_IN, NEED_ALL},
    {"mlp.up_proj.weight", "ffn_up.weight", SH_FF_IN, NEED_ALL},
    {"mlp.down_proj.weight", "ffn_down.weight", SH_FF_OUT, NEED_ALL},
};
#define N_LAYER_T ((int)(sizeof layer_tensors / sizeof layer_tensors[0]))

static const struct global_tensor {
    const char *hf, *gguf;
    int shape;
} global_tensors[] = {
    {"model.embed_tokens.weight", "token_embd.weight", SH_VOCAB},
    {"model.norm.weight", "output_norm.weight", SH_EMBD},
    {"lm_head.weight", "output.weight", SH_VOCAB},
};
#define N_GLOBAL_T 3
#define G_OUTPUT 2

static bool needed(const hf_build *b, int need)
{
    return need == NEED_ALL || (need == NEED_BIAS && b->arch->qkv_bias) ||
           (need == NEED_QKNORM && b->arch->qk_norm);
}

/* The HF shape [s[0], s[1]] of a shape class (s[1] = 0: a vector). */
static void want_shape(const hf_build *b, int sh, int64_t s[2])
{
    const int64_t q = b->n_head * b->head_dim, kv = b->n_head_kv * b->head_dim;
    s[1] = b->n_embd;
    switch (sh) {
    case SH_EMBD: s[0] = b->n_embd, s[1] = 0; break;
    case SH_Q: s[0] = q; break;
    case SH_KV: s[0] = kv; break;
    case SH_O: s[0] = b->n_embd, s[1] = q; break;
    case SH_QV: s[0] = q, s[1] = 0; break;
    case SH_KVV: s[0] = kv, s[1] = 0; break;
    case SH_HD: s[0] = b->head_dim, s[1] = 0; break;
    case SH_FF_IN: s[0] = b->n_ff; break;
    case SH_FF_OUT: s[0] = b->n_embd, s[1] = b->n_ff; break;
    case SH_VOCAB: s[0] = b->n_vocab; break;
    }
}

static const char *shape_fields(int sh)
{
    switch (sh) {
    case SH_EMBD: return "hidden_size";
    case SH_Q: case SH_O: return "num_attention_heads x head_dim, hidden_size";
    case SH_KV: return "num_key_value_heads x head_dim, hidden_size";
    case SH_QV: return "num_attention_heads x head_dim";
    case SH_KVV: return "num_key_value_heads x head_dim";
    case SH_HD: return "head_dim";
    case SH_FF_IN: case SH_FF_OUT: return "intermediate_size, hidden_size";
    default: return "vocab_size, hidden_size";
    }
}

/* Parses "model.layers.<N>.<rest>"; the layer index canonical (no sign or
 * leading zero). */
static bool layer_name(const char *name, int64_t *il, const char **rest)
{
    const char *pre = "model.layers.";
    if (strncmp(name, pre, strlen(pre)))
        return false;
    const char *p = name + strlen(pre);
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] != '.'))
        return false;
    int64_t v = 0;
    while (*p >= '0' && *p <= '9' && v < HF_MAX_DIM)
        v = v * 10 + (*p++ - '0');
    if (*p != '.')
        return false;
    *il = v;
    *rest = p + 1;
    return true;
}

/* Where a checkpoint tensor goes: *slot is its index in the seen table
 * (globals first, then n_layer x N_LAYER_T), -1 to skip it. */
static int classify(hf_build *b, const char *file, const char *name, int64_t *slot, int *shape,
                    char *gname, size_t gn)
{
    int64_t il;
    const char *rest;
    *slot = -1;
    for (int g = 0; g < N_GLOBAL_T; g++)
        if (!strcmp(name, global_tensors[g].hf)) {
            if (g == G_OUTPUT && b->tied)
                return 0; /* tied: the head is embed_tokens, as transformers ties it */
            *slot = g;
            *shape = global_tensors[g].shape;
            snprintf(gname, gn, "%s", global_tensors[g].gguf);
            return 0;
        }
    if (layer_name(name, &il, &rest)) {
        if (!strcmp(rest, "self_attn.rotary_emb.inv_freq"))
            return 0;
        for (int k = 0; k < N_LAYER_T; k++) {
            if (strcmp(rest, layer_tensors[k].hf))
                continue;
            if (il >= b->n_layer)
                return ferr(b, LMS_ERR_FORMAT, file,
                            "tensor '%s' is of layer %lld, but config.json \"num_hidden_layers\" "
                            "is %lld", name, (long long)il, (long long)b->n_layer);
            if (!needed(b, layer_tensors[k].need))
                break;
            *slot = N_GLOBAL_T + il * N_LAYER_T + k;
            *shape = layer_tensors[k].shape;
            snprintf(gname, gn, "blk.%lld.%s", (long long)il, layer_tensors[k].gguf);
            return 0;
        }
    }
    return ferr(b, LMS_ERR_UNSUPPORTED, file, "tensor '%s' is not part of a %s checkpoint",
                name, b->arch->hf);
}

/* A copy of a vector's values as F32. */
static const void *vector_f32(hf_build *b, const lms_st_tensor *st, size_t *n_bytes)
{
    const int64_t n = st->shape[0];
    *n_bytes = (size_t)n * 4;
    if (st->type == LMS_TYPE_F32)
        return st->data;
    float *f = own_alloc(b->own, *n_bytes);
    if (f)
        lms_kernels_get()->to_float[st->type](st->data, f, n);
    return f;
}

/* Adds one checkpoint tensor under its GGUF name (shape checked). */
static int add_tensor(hf_build *b, const char *file, const lms_st_tensor *st, int sh,
                      const char *gname)
{
    const int64_t n_rope_heads = sh == SH_Q && strstr(gname, ".attn_q.") ? b->n_head
                                 : sh == SH_KV && strstr(gname, ".attn_k.") ? b->n_head_kv
                                                                              : 0;
    int64_t s[2] = {0, 0};
    want_shape(b, sh, s);
    const int nd = s[1] ? 2 : 1;
    if (st->n_dims != nd || st->shape[0] != s[0] || (nd == 2 && st->shape[1] != s[1])) {
        char got[96] = "";
        for (int d = 0, k = 0; d < st->n_dims; d++)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", d ? ", " : "",
                          (long long)st->shape[d]);
        return ferr(b, LMS_ERR_FORMAT, file,
                    "tensor '%s' has shape [%s], but config.json (%s) gives [%lld%s%.0lld]",
                    st->name, got, shape_fields(sh), (long long)s[0], nd == 2 ? ", " : "",
                    (long long)(nd == 2 ? s[1] : 0));
    }
    gguf_tensor *t = tensor_new(b, gname);
    if (!t)
        return nomem(b);
    t->n_dims = nd;
    t->type = st->type;
    t->ne[0] = nd == 2 ? st->shape[1] : st->shape[0];
    t->ne[1] = nd == 2 ? st->shape[0] : 1;
    t->n_bytes = st->n_bytes;
    t->data = st->data;
    if (nd == 1) {
        t->type = LMS_TYPE_F32;
        if (!(t->data = vector_f32(b, st, &t->n_bytes)))
            return nomem(b);
    } else if (b->arch->permute_qk && n_rope_heads > 0) {
        /* llama.cpp stores q/k rows in the order RoPE on adjacent pairs
         * needs (rows are whole heads of even size: checked by the shape) */
        if (!(t->data = own(b->own, lms_st_reorder(st, false, (int32_t)n_rope_heads))))
            return nomem(b);
    }
    return 0;
}

/* Checks a shard name of the index: a plain file name of the folder. */
static int check_shard_name(hf_build *b, const char *idx, const char *name)
{
    if (!name[0] || strchr(name, '/') || strchr(name, '\\') || !strcmp(name, ".") ||
        !strcmp(name, ".."))
        return ferr(b, LMS_ERR_FORMAT, idx,
                    "\"weight_map\" names '%.200s', which is not a file name inside the folder "
                    "(refused)", name);
    if (!file_exists(b, name))
        return ferr(b, LMS_ERR_NOTFOUND, idx, "\"weight_map\" names '%.200s', which does not exist",
                    name);
    return 0;
}

/* The shard file names (owned strings) in first-seen order. */
static int shard_list(hf_build *b, json_t *index, const char ***names, int *n)
{
    const char *idx = "model.safetensors.index.json";
    json_t *wm = json_object_get(index, "weight_map");
    if (!json_is_object(wm))
        return ferr(b, LMS_ERR_FORMAT, idx, "\"weight_map\" is missing or not an object");
    const char **list = own_alloc(b->own, sizeof *list * HF_MAX_SHARDS);
    if (!list)
        return nomem(b);
    *n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *s = json_string_value(v);
        if (!s)
            return ferr(b, LMS_ERR_FORMAT, idx, "\"weight_map\" entry '%.200s' is not a file name",
                        key);
        int k = 0;
        while (k < *n && strcmp(list[k], s))
            k++;
        if (k < *n)
            continue;
        int rc = check_shard_name(b, idx, s);
        if (rc < 0)
            return rc;
        if (*n == HF_MAX_SHARDS)
            return ferr(b, LMS_ERR_LIMIT, idx, "more than %d shards", HF_MAX_SHARDS);
        if (!(list[(*n)++] = own_str(b->own, s, strlen(s))))
            return nomem(b);
    }
    if (*n == 0)
        return ferr(b, LMS_ERR_FORMAT, idx, "\"weight_map\" is empty");
    *names = list;
    return 0;
}

/* Every tensor the index places in a shard must be in it. */
static int check_index(hf_build *b, json_t *index, const char **names, int n)
{
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(index, "weight_map"), key, v) {
        const char *s = json_string_value(v);
        for (int k = 0; k < n; k++)
            if (!strcmp(names[k], s) && !lms_st_find(b->own->files[k], key))
                return ferr(b, LMS_ERR_FORMAT, "model.safetensors.index.json",
                            "\"weight_map\" places tensor '%.200s' in '%s', which does not hold it",
                            key, s);
    }
    return 0;
}

static int map_files(hf_build *b, const char **names, int n)
{
    b->own->files = calloc((size_t)n, sizeof *b->own->files);
    if (!b->own->files)
        return nomem(b);
    for (int k = 0; k < n; k++) {
        char p[4200], serr[512];
        join(b, names[k], p, sizeof p);
        int rc = lms_st_map(p, &b->own->files[k], serr, sizeof serr);
        if (rc < 0)
            return ferr(b, rc, names[k], "%s", serr);
        b->own->n_files++;
    }
    return 0;
}

/* Converts every tensor of every file and checks that none is missing. */
static int convert_tensors(hf_build *b, const char **names, int n)
{
    const int64_t n_slots = N_GLOBAL_T + b->n_layer * N_LAYER_T;
    int16_t *seen = calloc((size_t)n_slots, sizeof *seen); /* 1 + the file index */
    if (!seen)
        return nomem(b);
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        const lms_st_file *sf = b->own->files[k];
        for (int32_t i = 0; i < sf->n_tensors && rc == 0; i++) {
            const lms_st_tensor *st = &sf->tensors[i];
            int64_t slot;
            int sh = 0;
            char gname[96];
            if ((rc = classify(b, names[k], st->name, &slot, &sh, gname, sizeof gname)) < 0 ||
                slot < 0)
                continue;
            if (seen[slot]) {
                rc = ferr(b, LMS_ERR_FORMAT, names[k], "tensor '%s' is also in '%s'", st->name,
                          names[seen[slot] - 1]);
                break;
            }
            seen[slot] = (int16_t)(k + 1);
            rc = add_tensor(b, names[k], st, sh, gname);
        }
    }
    const char *where = n > 1 ? "model.safetensors.index.json" : names[0];
    for (int64_t s = 0; s < n_slots && rc == 0; s++) {
        if (seen[s])
            continue;
        if (s < N_GLOBAL_T && (s != G_OUTPUT || !b->tied))
            rc = ferr(b, LMS_ERR_FORMAT, where, "tensor '%s' is missing%s",
                      global_tensors[s].hf,
                      s == G_OUTPUT ? " (config.json \"tie_word_embeddings\" is false)" : "");
        else if (s >= N_GLOBAL_T && needed(b, layer_tensors[(s - N_GLOBAL_T) % N_LAYER_T].need))
            rc = ferr(b, LMS_ERR_FORMAT, where, "tensor 'model.layers.%lld.%s' is missing",
                      (long long)((s - N_GLOBAL_T) / N_LAYER_T),
                      layer_tensors[(s - N_GLOBAL_T) % N_LAYER_T].hf);
    }
    free(seen);
    return rc;
}

static int read_tensors(hf_build *b)
{
    int rc = 0, n = 0;
    const char **names = NULL;
    static const char *single[1] = {"model.safetensors"};
    json_t *index = NULL;
    if (file_exists(b, "model.safetensors.index.json")) {
        if (!(index = load_json(b, "model.safetensors.index.json", true, &rc)))
            return rc;
        rc = shard_list(b, index, &names, &n);
    } else if (file_exists(b, "model.safetensors")) {
        names = single;
        n = 1;
    } else {
        bool bin = file_exists(b, "pytorch_model.bin") ||
                   file_exists(b, "pytorch_model.bin.index.json");
        return ferr(b, LMS_ERR_NOTFOUND, "model.safetensors",
                    "missing, and no model.safetensors.index.json%s",
                    bin ? " (PyTorch .bin checkpoints are not supported)" : "");
    }
    if (rc == 0)
        rc = map_files(b, names, n);
    if (rc == 0 && index)
        rc = check_index(b, index, names, n);
    if (rc == 0)
        rc = convert_tensors(b, names, n);
    if (rc == 0)
        rc = llama3_freqs(b);
    json_decref(index);
    return rc;
}

/* ---- tokenizer -------------------------------------------------------------------- */

typedef struct hf_tok {
    json_t *tj;     /* tokenizer.json */
    json_t *tc;     /* tokenizer_config.json or NULL */
    json_t *vocab;  /* tj.model.vocab */
    json_t *added;  /* tj.added_tokens or NULL */
    int64_t n;      /* token count */
} hf_tok;

static const char *TJ = "tokenizer.json";

/* The id of token text s, or -1. */
static int64_t tok_id(const hf_tok *T, const char *s)
{
    size_t i;
    json_t *a;
    json_array_foreach(T->added, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && !strcmp(c, s) && json_is_integer(json_object_get(a, "id")))
            return (int64_t)json_integer_value(json_object_get(a, "id"));
    }
    const json_t *v = json_object_get(T->vocab, s);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

/* Spelled like a control token although not marked special (<|...|>). */
static bool looks_special(const char *s)
{
    size_t n = strlen(s);
    return (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) || !strcmp(s, "<pad>") ||
           !strcmp(s, "<mask>");
}

/* Slots tokens[id] and types[id] for one vocab or added entry. */
static int put_token(hf_build *b, gguf_str *tokens, int32_t *types, int64_t n, const char *text,
                     size_t len, json_int_t id, int type, const char *where)
{
    if (id < 0 || id >= n)
        return ferr(b, LMS_ERR_FORMAT, TJ, "%s token '%.60s' has id %lld, outside 0..%lld", where,
                    text, (long long)id, (long long)n - 1);
    if (tokens[id].p && (tokens[id].n != len || memcmp(tokens[id].p, text, len)))
        return ferr(b, LMS_ERR_FORMAT, TJ, "id %lld is both '%.60s' and '%.60s'", (long long)id,
                    tokens[id].p, text);
    if (!tokens[id].p && !(tokens[id].p = own_str(b->own, text, len)))
        return nomem(b);
    tokens[id].n = len;
    types[id] = type;
    return 0;
}

static int read_vocab(hf_build *b, hf_tok *T)
{
    int64_t max_id = -1;
    const char *key;
    json_t *v;
    size_t i;
    json_object_foreach(T->vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= HF_MAX_DIM)
            return ferr(b, LMS_ERR_FORMAT, TJ, "model.vocab '%.60s' has no valid id", key);
        if (json_integer_value(v) > max_id)
            max_id = json_integer_value(v);
    }
    json_array_foreach(T->added, i, v) {
        const json_t *id = json_object_get(v, "id");
        if (!json_is_string(json_object_get(v, "content")) || !json_is_integer(id) ||
            json_integer_value(id) < 0 || json_integer_value(id) >= HF_MAX_DIM)
            return ferr(b, LMS_ERR_FORMAT, TJ, "added_tokens[%zu] has no content or no valid id",
                        i);
        if (json_integer_value(id) > max_id)
            max_id = json_integer_value(id);
    }
    T->n = max_id + 1 > b->n_vocab ? max_id + 1 : b->n_vocab;
    gguf_str *tokens = calloc((size_t)T->n, sizeof *tokens);
    int32_t *types = own_alloc(b->own, (size_t)T->n * sizeof *types);
    if (!tokens || !types) {
        free(tokens);
        return nomem(b);
    }
    int rc = 0;
    json_object_foreach(T->vocab, key, v) {
        if ((rc = put_token(b, tokens, types, T->n, key, strlen(key), json_integer_value(v),
                            LMS_TOKEN_TYPE_NORMAL, "model.vocab")) < 0)
            break;
    }
    json_array_foreach(T->added, i, v) {
        if (rc < 0)
            break;
        const json_t *c = json_object_get(v, "content");
        const char *text = json_string_value(c);
        const bool special = json_is_true(json_object_get(v, "special")) || looks_special(text);
        rc = put_token(b, tokens, types, T->n, text, json_string_length(c),
                       json_integer_value(json_object_get(v, "id")),
                       special ? LMS_TOKEN_TYPE_CONTROL : LMS_TOKEN_TYPE_USER_DEFINED,
                       "added_tokens");
    }
    for (int64_t id = 0; id < T->n && rc == 0; id++) {
        if (tokens[id].p)
            continue;
        char pad[32];
        int k = snprintf(pad, sizeof pad, "[PAD%lld]", (long long)id);
        if (!(tokens[id].p = own_str(b->own, pad, (size_t)k)))
            rc = nomem(b);
        tokens[id].n = (size_t)k;
        types[id] = LMS_TOKEN_TYPE_UNUSED;
    }
    if (rc < 0) {
        free(tokens);
        return rc;
    }
    if ((rc = kv_strs(b, "tokenizer.ggml.tokens", tokens, (uint64_t)T->n)) < 0)
        return rc;
    return kv_i32s(b, "tokenizer.ggml.token_type", types, (uint64_t)T->n);
}

static int read_merges(hf_build *b, const json_t *merges)
{
    if (!json_is_array(merges))
        return ferr(b, LMS_ERR_FORMAT, TJ, "model.merges is missing or not a list");
    const size_t n = json_array_size(merges);
    gguf_str *m = calloc(n ? n : 1, sizeof *m);
    if (!m)
        return nomem(b);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(merges, i);
        const json_t *l = json_array_get(e, 0), *r = json_array_get(e, 1);
        char *p = NULL;
        size_t len = 0;
        if (json_is_string(e)) { /* "left right" */
            len = json_string_length(e);
            p = own_str(b->own, json_string_value(e), len);
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(l) &&
                   json_is_string(r)) { /* ["left", "right"] */
            const size_t nl = json_string_length(l), nr = json_string_length(r);
            len = nl + 1 + nr;
            if ((p = own_alloc(b->own, len + 1))) {
                memcpy(p, json_string_value(l), nl);
                p[nl] = ' ';
                memcpy(p + nl + 1, json_string_value(r), nr);
                p[len] = 0;
            }
        } else {
            free(m);
            return ferr(b, LMS_ERR_FORMAT, TJ,
                        "model.merges[%zu] is neither \"left right\" nor [\"left\", \"right\"]", i);
        }
        if (!p) {
            free(m);
            return nomem(b);
        }
        m[i] = (gguf_str){p, len};
    }
    return kv_strs(b, "tokenizer.ggml.merges", m, n);
}

/* GPT-2's split, what a ByteLevel pre-tokenizer with use_regex applies. */
static const char *const gpt2_regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Collects the regexes of one pre-tokenizer (recursing into Sequence);
 * *byte_level is set when a ByteLevel step is seen. */
static int collect_pre(hf_build *b, const json_t *p, const char **re, int *n, bool *byte_level)
{
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type)
        return ferr(b, LMS_ERR_FORMAT, TJ, "a pre_tokenizer has no \"type\"");
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(p, "pretokenizers"), i, e) {
            int rc = collect_pre(b, e, re, n, byte_level);
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (*n == HF_MAX_REGEX)
        return ferr(b, LMS_ERR_UNSUPPORTED, TJ, "more than %d pre-tokenizer steps", HF_MAX_REGEX);
    if (!strcmp(type, "ByteLevel")) {
        *byte_level = true;
        const json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur))
            re[(*n)++] = gpt2_regex;
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                        "pre_tokenizer ByteLevel with \"add_prefix_space\": true is not supported");
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const char *rx = json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!rx)
            return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                        "pre_tokenizer Split without a \"Regex\" pattern is not supported");
        if (!beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(p, "invert")))
            return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                        "pre_tokenizer Split with behavior \"%.30s\"%s is not supported (Isolated)",
                        beh ? beh : "?",
                        json_is_true(json_object_get(p, "invert")) ? ", inverted" : "");
        re[(*n)++] = rx;
        return 0;
    }
    return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                "pre_tokenizer type \"%.40s\" is not supported (Split, ByteLevel, Sequence)", type);
}

static int read_pre(hf_build *b, const hf_tok *T, bool ignore_merges)
{
    const json_t *norm = json_object_get(T->tj, "normalizer");
    const char *nt = json_string_value(json_object_get(norm, "type"));
    /* NFC (Qwen2) is left out, as llama.cpp does */
    if (norm && !json_is_null(norm) && (!nt || strcmp(nt, "NFC")))
        return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                    "normalizer \"%.40s\" is not supported (a byte-level BPE has none, or NFC)",
                    nt ? nt : "?");
    const json_t *pre = json_object_get(T->tj, "pre_tokenizer");
    const char *re[HF_MAX_REGEX];
    int n = 0, rc;
    bool byte_level = false;
    if (!json_is_object(pre) || (rc = collect_pre(b, pre, re, &n, &byte_level)) >= 0) {
        if (!byte_level)
            return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                        "pre_tokenizer has no ByteLevel step: only byte-level BPE is supported "
                        "(SentencePiece-style tokenizers are not)");
    } else {
        return rc;
    }
    char name[64];
    if (lms_tokenizer_bpe_pre_find(re, n, ignore_merges, name, sizeof name) < 0)
        return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                    "pre-tokenizer pattern \"%.300s\"%s is not one this tokenizer knows "
                    "(GPT-2, Llama 3, Qwen2, ...)", n ? re[0] : "", n > 1 ? " (and more)" : "");
    return kv_str(b, NULL, "tokenizer.ggml.pre", name, strlen(name));
}

/* A special token field of tokenizer_config.json: a string, an object
 * with "content", or null/absent (NULL). */
static const char *special_text(const json_t *tc, const char *field)
{
    const json_t *v = json_object_get(tc, field);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_string_value(v);
}

/* Whether tokenizer.json's post_processor puts bos first: 1, 0, or -1
 * when it does not say. */
static int post_adds_bos(const json_t *pp, const char *bos)
{
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!type)
        return -1;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(pp, "processors"), i, e) {
            int r = post_adds_bos(e, bos);
            if (r >= 0)
                return r;
        }
        return -1;
    }
    if (strcmp(type, "TemplateProcessing"))
        return -1;
    const json_t *first = json_array_get(json_object_get(pp, "single"), 0);
    const json_t *st = json_object_get(first, "SpecialToken");
    const char *id = json_string_value(json_object_get(st, "id"));
    return id && bos && !strcmp(id, bos);
}

static int special_id(hf_build *b, const hf_tok *T, const char *field, const char *key)
{
    const char *s = special_text(T->tc, field);
    if (!s)
        return 0;
    int64_t id = tok_id(T, s);
    if (id < 0)
        return ferr(b, LMS_ERR_FORMAT, "tokenizer_config.json",
                    "\"%s\" '%.60s' is not a token of tokenizer.json", field, s);
    return kv_u32(b, NULL, key, (uint32_t)id);
}

/* An id field (integer or list: the first) of a JSON object, or -1. */
static int64_t json_first_id(const json_t *o, const char *field)
{
    const json_t *v = json_object_get(o, field);
    if (json_is_array(v))
        v = json_array_get(v, 0);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static int read_specials(hf_build *b, const hf_tok *T)
{
    int rc;
    const char *bos = special_text(T->tc, "bos_token");
    if ((rc = special_id(b, T, "bos_token", "tokenizer.ggml.bos_token_id")) < 0 ||
        (rc = special_id(b, T, "eos_token", "tokenizer.ggml.eos_token_id")) < 0 ||
        (rc = special_id(b, T, "pad_token", "tokenizer.ggml.padding_token_id")) < 0)
        return rc;
    if (!bos) {
        int64_t id = json_first_id(b->cfg, "bos_token_id");
        if (id >= 0 && id < T->n &&
            (rc = kv_u32(b, NULL, "tokenizer.ggml.bos_token_id", (uint32_t)id)) < 0)
            return rc;
    }
    if (!special_text(T->tc, "eos_token")) {
        json_t *gc = load_json(b, "generation_config.json", false, &rc);
        if (rc < 0)
            return rc;
        int64_t id = json_first_id(gc, "eos_token_id");
        json_decref(gc);
        if (id < 0)
            id = json_first_id(b->cfg, "eos_token_id");
        if (id >= T->n)
            return ferr(b, LMS_ERR_FORMAT, "generation_config.json",
                        "\"eos_token_id\" %lld is outside the vocabulary", (long long)id);
        if (id >= 0 && (rc = kv_u32(b, NULL, "tokenizer.ggml.eos_token_id", (uint32_t)id)) < 0)
            return rc;
    }
    const json_t *ab = json_object_get(T->tc, "add_bos_token");
    const int post = post_adds_bos(json_object_get(T->tj, "post_processor"), bos);
    if (json_is_boolean(ab))
        rc = kv_bool(b, "tokenizer.ggml.add_bos_token", json_is_true(ab));
    else if (post >= 0)
        rc = kv_bool(b, "tokenizer.ggml.add_bos_token", post == 1);
    const json_t *ae = json_object_get(T->tc, "add_eos_token");
    if (rc == 0 && json_is_boolean(ae))
        rc = kv_bool(b, "tokenizer.ggml.add_eos_token", json_is_true(ae));
    return rc;
}

/* tokenizer_config.json chat_template: a string, or a list of {name,
 * template} (the "default" one is tokenizer.chat_template, the others
 * tokenizer.chat_template.<name>); else chat_template.jinja. */
static int read_template(hf_build *b, const hf_tok *T)
{
    const json_t *ct = json_object_get(T->tc, "chat_template");
    if (json_is_string(ct))
        return kv_str(b, NULL, "tokenizer.chat_template", json_string_value(ct),
                      json_string_length(ct));
    if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            const json_t *tpl = json_object_get(e, "template");
            if (!name || !json_is_string(tpl) || strlen(name) > 64)
                return ferr(b, LMS_ERR_FORMAT, "tokenizer_config.json",
                            "chat_template[%zu] is not {\"name\", \"template\"}", i);
            int rc = kv_str(b, strcmp(name, "default") ? "tokenizer.chat_template" : NULL,
                            strcmp(name, "default") ? name : "tokenizer.chat_template",
                            json_string_value(tpl), json_string_length(tpl));
            if (rc < 0)
                return rc;
        }
        return 0;
    }
    if (ct && !json_is_null(ct))
        return ferr(b, LMS_ERR_FORMAT, "tokenizer_config.json",
                    "\"chat_template\" is neither a string nor a list");
    if (!file_exists(b, "chat_template.jinja"))
        return 0;
    char p[4200];
    join(b, "chat_template.jinja", p, sizeof p);
    FILE *fp = fopen(p, "rb");
    char *buf = NULL;
    long len = -1;
    if (fp && fseek(fp, 0, SEEK_END) == 0 && (len = ftell(fp)) >= 0 && len < (16 << 20) &&
        fseek(fp, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) &&
        fread(buf, 1, (size_t)len, fp) != (size_t)len)
        len = -1;
    if (fp)
        fclose(fp);
    int rc = buf && len >= 0 ? kv_str(b, NULL, "tokenizer.chat_template", buf, (size_t)len)
                             : ferr(b, LMS_ERR_IO, "chat_template.jinja", "cannot be read");
    free(buf);
    return rc;
}

static int tok_model(hf_build *b, hf_tok *T, bool *ignore_merges)
{
    const json_t *model = json_object_get(T->tj, "model");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model))
        return ferr(b, LMS_ERR_FORMAT, TJ, "\"model\" is missing");
    if (type && strcmp(type, "BPE"))
        return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                    "model type \"%.40s\" is not supported (byte-level BPE only)", type);
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                    "a BPE with \"byte_fallback\" (SentencePiece style) is not supported; only "
                    "byte-level BPE is");
    const char *cont = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *eow = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cont && cont[0]) || (eow && eow[0]))
        return ferr(b, LMS_ERR_UNSUPPORTED, TJ,
                    "a BPE with a subword prefix or word suffix is not supported");
    T->vocab = json_object_get(model, "vocab");
    if (!json_is_object(T->vocab))
        return ferr(b, LMS_ERR_FORMAT, TJ, "model.vocab is missing or not an object");
    T->added = json_object_get(T->tj, "added_tokens");
    if (T->added && !json_is_null(T->added) && !json_is_array(T->added))
        return ferr(b, LMS_ERR_FORMAT, TJ, "added_tokens is not a list");
    *ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    return 0;
}

static int read_tokenizer(hf_build *b)
{
    hf_tok T = {0};
    int rc;
    if (!file_exists(b, TJ))
        return ferr(b, file_exists(b, "tokenizer.model") ? LMS_ERR_UNSUPPORTED : LMS_ERR_NOTFOUND,
                    TJ, "%s", file_exists(b, "tokenizer.model")
                                  ? "missing; a SentencePiece tokenizer.model alone is not "
                                    "supported (byte-level BPE tokenizer.json only)"
                                  : "missing");
    if (!(T.tj = load_json(b, TJ, true, &rc)))
        return rc;
    bool ignore_merges = false;
    if ((rc = tok_model(b, &T, &ignore_merges)) < 0)
        goto out;
    if (!(T.tc = load_json(b, "tokenizer_config.json", false, &rc)) && rc < 0)
        goto out;
    if ((rc = kv_str(b, NULL, "tokenizer.ggml.model", "gpt2", 4)) < 0 ||
        (rc = read_pre(b, &T, ignore_merges)) < 0 || (rc = read_vocab(b, &T)) < 0 ||
        (rc = read_merges(b, json_object_get(json_object_get(T.tj, "model"), "merges"))) < 0 ||
        (rc = read_specials(b, &T)) < 0)
        goto out;
    rc = read_template(b, &T);
out:
    json_decref(T.tc);
    json_decref(T.tj);
    return rc;
}

/* ---- open ------------------------------------------------------------------------ */

/* Moves the built arrays into a gguf_file; scalar values also get raw
 * little-endian bytes (file_offset into base), as a parsed file has. */
static int finish(hf_build *b, gguf_file **out)
{
    uint8_t *raw = own_alloc(b->own, 8 * (b->n_kv ? b->n_kv : 1));
    gguf_file *f = raw ? calloc(1, sizeof *f) : NULL;
    char *path = f ? strdup(b->dir) : NULL;
    if (!path) {
        free(f);
        return nomem(b);
    }
    for (size_t i = 0; i < b->n_kv; i++) {
        gguf_kv *kv = &b->kv[i];
        kv->file_offset = 8 * i;
        if (kv->type == GGUF_VT_F32) {
            float v = (float)kv->v.f;
            memcpy(raw + 8 * i, &v, 4);
        } else if (kv->type == GGUF_VT_U32 || kv->type == GGUF_VT_BOOL) {
            memcpy(raw + 8 * i, &kv->v.i, gguf_vtype_size(kv->type)); /* little-endian host */
        }
    }
    f->version = 3;
    f->n_kv = b->n_kv;
    f->kv = b->kv;
    f->n_tensors = b->n_ts;
    f->tensors = b->ts;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    f->base = raw;
    f->size = 8 * b->n_kv;
    f->path = path;
    f->release = owner_release;
    f->release_ctx = b->own;
    b->kv = NULL, b->ts = NULL, b->own = NULL;
    *out = f;
    return 0;
}

bool hf_is_model_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return true;
    const char *base = strrchr(path, '/');
    return !strcmp(base ? base + 1 : path, "config.json");
}

int hf_open(const char *path, unsigned flags, gguf_file **out, char *err, size_t errsz)
{
    hf_build *b = calloc(1, sizeof *b);
    if (!b)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "hf: out of memory");
    b->flags = flags;
    b->err = err;
    b->errsz = errsz;
    size_t n = strlen(path);
    const char *base = strrchr(path, '/');
    if (!strcmp(base ? base + 1 : path, "config.json")) /* the folder of config.json */
        n = base ? (size_t)(base - path) : 0;
    while (n > 1 && path[n - 1] == '/')
        n--;
    int rc = 0;
    if (n >= sizeof b->dir) {
        rc = lms_errf(err, errsz, LMS_ERR_INVAL, "hf: path of %zu bytes is too long", n);
        goto out;
    }
    snprintf(b->dir, sizeof b->dir, "%.*s", (int)n, n ? path : ".");
    if (!(b->own = calloc(1, sizeof *b->own))) {
        rc = nomem(b);
        goto out;
    }
    if (!(b->cfg = load_json(b, "config.json", true, &rc)))
        goto out;
    if ((rc = read_config(b)) < 0 || (rc = write_hparams(b)) < 0 ||
        (!(flags & HF_OPEN_NO_TOKENIZER) && (rc = read_tokenizer(b)) < 0))
        goto out;
    if (!(flags & HF_OPEN_NO_TENSORS) && (rc = read_tensors(b)) < 0)
        goto out;
    rc = finish(b, out);
out:
    for (size_t i = 0; b->kv && i < b->n_kv; i++)
        free(b->kv[i].strs);
    free(b->kv);
    free(b->ts);
    owner_release(b->own);
    json_decref(b->cfg);
    free(b);
    return rc;
}

int hf_open_any(const char *path, unsigned flags, gguf_file **out, char *err, size_t errsz)
{
    return hf_is_model_path(path) ? hf_open(path, flags, out, err, errsz)
                                  : gguf_open(path, out, err, errsz);
}
