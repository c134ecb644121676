/*
 * model.c - loads a transformer from GGUF: the architecture table, the
 * hyper-parameters and every weight, each checked for presence, type and
 * shape before the forward pass may use it.
 *
 * Adding a family that fits the decoder template (RMSNorm, RoPE attention
 * with GQA, SwiGLU FFN) is one row of arch_table. Gemma 2 and 3 add, as
 * flags of their rows: scaled input embeddings, RMSNorm after attention and
 * after the FFN, a GELU-gated FFN, queries scaled before the scores,
 * sliding-window (local) layers with their own RoPE base, and (gemma2)
 * soft-capped attention scores and logits (read_gemma below; the facts
 * are llama.cpp's, whose GGUF files these are). Phi-3 stores q, k, v as one
 * attn_qkv matrix and gate, up as one ffn_up matrix: they are bound as row
 * ranges of the fused tensors (bind_fused), so the rest of the engine sees
 * a llama layer; its 128k variants add LongRoPE factors (read_longrope).
 * BERT is an encoder with its own tensors and no output head (bind_bert);
 * engine/encoder.c, not the decoder, runs it.
 */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/kernels.h"
#include "model/hf.h"
#include "model/tokenizer.h"

/* ---- the architecture table ---------------------------------------------- */

enum {
    ARCH_QKV_BIAS = 1 << 0, /* attn_{q,k,v}.bias expected */
    ARCH_QK_NORM = 1 << 1,  /* attn_{q,k}_norm.weight expected */
    ARCH_GEMMA2 = 1 << 2,   /* the gemma2 extras (read_gemma) */
    ARCH_GEMMA3 = 1 << 3,   /* the gemma3 extras (read_gemma) */
    ARCH_PHI3 = 1 << 4,     /* fused attn_qkv and gate+up ffn_up, LongRoPE factors */
    ARCH_BERT = 1 << 5,     /* post-norm encoder, no output head (bind_bert) */
    ARCH_NOMIC = 1 << 6,    /* with ARCH_BERT: RoPE instead of positions, SwiGLU FFN */
};

typedef struct arch_desc {
    const char *name;  /* general.architecture, also the key prefix */
    int rope_type;
    unsigned flags;
    float rope_base;   /* default when the file has no freq_base key */
} arch_desc;

static const arch_desc arch_table[] = {
    /* llama covers Llama 1/2/3, Mistral 7B, TinyLlama, llama2.c conversions */
    {"llama", LMS_ROPE_NORM, 0, 10000.0f},
    {"mistral", LMS_ROPE_NORM, 0, 1000000.0f},
    {"qwen2", LMS_ROPE_NEOX, ARCH_QKV_BIAS, 1000000.0f},
    {"qwen3", LMS_ROPE_NEOX, ARCH_QK_NORM, 1000000.0f},
    /* text decoders only (a gemma3 file's vision tower is not read) */
    {"gemma2", LMS_ROPE_NEOX, ARCH_GEMMA2, 10000.0f},
    {"gemma3", LMS_ROPE_NEOX, ARCH_GEMMA3 | ARCH_QK_NORM, 10000.0f},
    /* Phi-3 / Phi-3.5 mini and medium. Their attention.sliding_window is
     * not applied: llama.cpp disables it for phi3 (its converter does not
     * record which layers use it), and these are its files */
    {"phi3", LMS_ROPE_NEOX, ARCH_PHI3, 10000.0f},
    /* BERT embedding models (all-MiniLM, bge, mxbai-embed-large): no RoPE,
     * run by engine/encoder.c, not the decoder */
    {"bert", LMS_ROPE_NORM, ARCH_BERT, 10000.0f},
    {"nomic-bert", LMS_ROPE_NEOX, ARCH_BERT | ARCH_NOMIC, 10000.0f}, /* nomic-embed-text */
};

const char *lms_model_supported_archs(void)
{
    return "llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, bert and nomic-bert (embeddings "
           "only)";
}

static const arch_desc *arch_find(const char *name)
{
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (strcmp(arch_table[i].name, name) == 0)
            return &arch_table[i];
    return NULL;
}

/* ---- hyper-parameters ----------------------------------------------------- */

typedef struct loader {
    lms_model *m;
    const arch_desc *arch;
    char *err;
    size_t errsz;
} loader;

/* Reads "<arch>.<suffix>" as a positive int32; absent is an error unless
 * a default >= 0 is given. */
static int hp_int(loader *L, const char *suffix, int32_t def, int32_t *out)
{
    char key[128];
    int64_t v;
    snprintf(key, sizeof key, "%s.%s", L->arch->name, suffix);
    int rc = gguf_get_i64(L->m->gguf, key, &v);
    if (rc == LMS_ERR_NOTFOUND && def >= 0) {
        *out = def;
        return 0;
    }
    if (rc == LMS_ERR_NOTFOUND)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: required key '%s' is missing", key);
    if (rc < 0 || v <= 0 || v > (1 << 24))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: key '%s' must be a positive integer below 2^24", key);
    *out = (int32_t)v;
    return 0;
}

static float hp_float(loader *L, const char *suffix, float def)
{
    char key[128];
    float v;
    snprintf(key, sizeof key, "%s.%s", L->arch->name, suffix);
    return gguf_get_f32(L->m->gguf, key, &v) == 0 ? v : def;
}

static int read_rope_scaling(loader *L, lms_hparams *hp)
{
    char key[128];
    const char *type = NULL;
    hp->rope_freq_scale = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", L->arch->name);
    gguf_get_str(L->m->gguf, key, &type);
    float factor = hp_float(L, "rope.scaling.factor", 0.0f);
    if (!type || strcmp(type, "none") == 0 || factor == 0.0f || factor == 1.0f)
        return 0;
    if (strcmp(type, "linear") != 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: rope scaling type '%s' is not supported (none, linear)", type);
    if (!(factor > 0.0f))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: rope scaling factor %g", factor);
    hp->rope_freq_scale = 1.0f / factor;
    return 0;
}

static int read_hparams(loader *L)
{
    lms_hparams *hp = &L->m->hp;
    int rc;
    snprintf(hp->arch, sizeof hp->arch, "%s", L->arch->name);
    if ((rc = hp_int(L, "embedding_length", -1, &hp->n_embd)) < 0 ||
        (rc = hp_int(L, "block_count", -1, &hp->n_layer)) < 0 ||
        (rc = hp_int(L, "feed_forward_length", -1, &hp->n_ff)) < 0 ||
        (rc = hp_int(L, "attention.head_count", -1, &hp->n_head)) < 0 ||
        (rc = hp_int(L, "attention.head_count_kv", hp->n_head, &hp->n_head_kv)) < 0 ||
        (rc = hp_int(L, "context_length", 2048, &hp->n_ctx_train)) < 0)
        return rc;
    /* every layer has tensors of its own: a larger count is a bad file, and
     * would size the layer table (hundreds of bytes a layer) from it */
    if ((uint64_t)hp->n_layer > L->m->gguf->n_tensors)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: %s.block_count %d exceeds the %llu tensors in the file",
                        L->arch->name, hp->n_layer, (unsigned long long)L->m->gguf->n_tensors);
    if (hp->n_embd % hp->n_head != 0 || hp->n_head % hp->n_head_kv != 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: n_embd %d, n_head %d, n_head_kv %d do not divide evenly",
                        hp->n_embd, hp->n_head, hp->n_head_kv);
    if ((rc = hp_int(L, "attention.key_length", hp->n_embd / hp->n_head, &hp->head_dim)) < 0 ||
        (rc = hp_int(L, "rope.dimension_count", hp->head_dim, &hp->n_rot)) < 0)
        return rc;
    int32_t vlen;
    if ((rc = hp_int(L, "attention.value_length", hp->head_dim, &vlen)) < 0)
        return rc;
    if (vlen != hp->head_dim || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0 || hp->head_dim % 2 ||
        hp->head_dim > 512)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: head sizes key %d, value %d, rope %d are not supported",
                        hp->head_dim, vlen, hp->n_rot);
    hp->rms_eps = hp_float(L, "attention.layer_norm_rms_epsilon", 1e-5f);
    hp->rope_base = hp_float(L, "rope.freq_base", L->arch->rope_base);
    hp->rope_type = L->arch->rope_type;
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_base > 0.0f))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: rms epsilon %g and rope base %g must be positive", hp->rms_eps,
                        hp->rope_base);
    return read_rope_scaling(L, hp);
}

static const char *const pooling_names[] = {"none", "mean", "cls", "last", "rank"};

const char *lms_pooling_name(int pooling)
{
    return pooling >= LMS_POOLING_MEAN && pooling <= LMS_POOLING_RANK ? pooling_names[pooling]
                                                                       : pooling_names[0];
}

int lms_pooling_parse(const char *name)
{
    for (int i = LMS_POOLING_MEAN; name && i <= LMS_POOLING_RANK; i++)
        if (!strcmp(name, pooling_names[i]))
            return i;
    return 0;
}

/* <arch>.pooling_type into hp.pooling, def where the file has none (0 for
 * a decoder: a plain language model); 1 mean, 2 cls, 3 last, 4 rank. An
 * encoder refuses other values; a decoder reads them as none (0: none, -1:
 * unspecified, ...), a hint that must not keep a language model from
 * loading. */
static int read_pooling(loader *L, int def)
{
    char key[128];
    int64_t v = def;
    snprintf(key, sizeof key, "%s.pooling_type", L->arch->name);
    int rc = gguf_get_i64(L->m->gguf, key, &v);
    if (rc < 0 && rc != LMS_ERR_NOTFOUND)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: '%s' is not an integer", key);
    const bool known = v == LMS_POOLING_MEAN || v == LMS_POOLING_CLS || v == LMS_POOLING_LAST ||
                       v == LMS_POOLING_RANK;
    if (!known && def == 0)
        v = 0;
    else if (!known)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: '%s' = %lld is not supported (1 mean, 2 cls, 3 last, 4 rank)", key,
                        (long long)v);
    L->m->hp.pooling = (int)v;
    return 0;
}

/*
 * Gemma 2 and 3 (as llama.cpp reads their GGUF files):
 *
 *   embeddings      x = token_embd[id] * sqrt(n_embd)
 *   attention       q scaled by 1/sqrt(head_dim) after RoPE (1/sqrt(n_embd/n_head)
 *                   for the 27B models: 46 layers gemma2, 62 gemma3), scores not
 *                   scaled again; gemma2: scores = c * tanh(scores / c),
 *                   c = attn_logit_softcapping (default 50)
 *   local layers    layer il is local when il % P < P - 1 (P = 0: all local),
 *                   P = attention.sliding_window_pattern (gemma2 default 2,
 *                   gemma3 6); a local layer's query at p sees keys (p - W, p],
 *                   W = attention.sliding_window (gemma2 default 4096; gemma3:
 *                   no local layers without the key)
 *   RoPE of local   base rope.freq_base_swa if present, else gemma2: the global
 *                   base, gemma3: 10000; linear scaling: gemma2 as the global
 *                   layers, gemma3 none
 *   logits          gemma2: c * tanh(logits / c), c = final_logit_softcapping
 *                   (default 30); gemma3 only when the key is present
 *   norms           weights already hold the "+1" of Gemma's RMSNorm (the
 *                   converter adds it), so they are used as stored
 */
static int read_gemma(loader *L)
{
    lms_hparams *hp = &L->m->hp;
    const bool g2 = L->arch->flags & ARCH_GEMMA2;
    char key[128];
    hp->ffn_act = LMS_FFN_GELU_TANH;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    const bool is_27b = hp->n_layer == (g2 ? 46 : 62);
    hp->q_scale = 1.0f / sqrtf((float)(is_27b ? hp->n_embd / hp->n_head : hp->head_dim));
    hp->attn_softcap = g2 ? hp_float(L, "attn_logit_softcapping", 50.0f) : 0.0f;
    hp->final_softcap = hp_float(L, "final_logit_softcapping", g2 ? 30.0f : 0.0f);
    if (hp->attn_softcap < 0.0f || hp->final_softcap < 0.0f || !isfinite(hp->attn_softcap) ||
        !isfinite(hp->final_softcap))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: soft-capping values %g and %g must be >= 0", hp->attn_softcap,
                        hp->final_softcap);
    int32_t n_swa = 0, pattern = g2 ? 2 : 6;
    int64_t v;
    snprintf(key, sizeof key, "%s.attention.sliding_window", L->arch->name);
    int rc = gguf_get_i64(L->m->gguf, key, &v);
    if (rc == 0 && (v < 0 || v > (1 << 24)))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: '%s' = %lld", key, (long long)v);
    if (rc == 0)
        n_swa = (int32_t)v;
    else if (rc != LMS_ERR_NOTFOUND)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: '%s' is not an integer", key);
    else if (g2)
        n_swa = 4096;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", L->arch->name);
    rc = gguf_get_i64(L->m->gguf, key, &v);
    if (rc == 0 && (v < 0 || v > (1 << 24)))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: '%s' = %lld", key, (long long)v);
    if (rc == 0)
        pattern = (int32_t)v;
    else if (rc != LMS_ERR_NOTFOUND) /* a per-layer array: not read yet */
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: '%s' is not a single integer (per-layer patterns are not "
                        "supported)", key);
    const float base_swa = hp_float(L, "rope.freq_base_swa", g2 ? hp->rope_base : 10000.0f);
    if (!(base_swa > 0.0f))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: rope.freq_base_swa %g", base_swa);
    for (int il = 0; il < hp->n_layer; il++) {
        lms_layer *l = &L->m->layers[il];
        const bool local = n_swa > 0 && (pattern == 0 || il % pattern < pattern - 1);
        l->n_swa = local ? n_swa : 0;
        if (local) {
            l->rope_base = base_swa;
            l->rope_freq_scale = g2 ? hp->rope_freq_scale : 1.0f;
        }
    }
    return 0;
}

/* ---- weights ---------------------------------------------------------------- */

/* Binds tensor `name` to *w after checking its shape [ne0, ne1] (ne1 = 0:
 * a vector) and, for matrices, that the kernels can multiply its type. */
static int bind(loader *L, lms_weight *w, const char *name, int64_t ne0, int64_t ne1, bool required)
{
    const gguf_tensor *t = gguf_find_tensor(L->m->gguf, name);
    if (!t) {
        if (!required)
            return 0;
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: tensor '%s' is missing", name);
    }
    int64_t want1 = ne1 ? ne1 : 1;
    if (t->ne[0] != ne0 || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                        name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        (long long)t->ne[3], (long long)ne0, (long long)want1);
    const lms_type_traits *tt = lms_type_get(t->type);
    if (ne1 == 0 && t->type != LMS_TYPE_F32)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: vector '%s' has type %s; only f32 is supported", name, tt->name);
    if (ne1 != 0 && !lms_kernels_get()->vec_dot[t->type])
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: tensor '%s' has type %s, which has no matrix kernel", name, tt->name);
    w->data = t->data;
    w->type = t->type;
    w->ne[0] = t->ne[0];
    w->ne[1] = t->ne[1];
    w->row_bytes = lms_row_size(t->type, t->ne[0]);
    L->m->weight_bytes += t->n_bytes;
    return 0;
}

/* Binds the fused tensor `name`, [ne0, rows[0] + ... + rows[n-1]] (ne0 = 0:
 * a vector of that length), and splits it into n consecutive row ranges
 * out[0..n) (`parts` names them for messages). Absent and not required:
 * the outputs stay unbound. */
static int bind_fused(loader *L, const char *name, int64_t ne0, const int64_t *rows,
                      lms_weight *const *out, int n, const char *parts, bool required)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += rows[i];
    const gguf_tensor *t = gguf_find_tensor(L->m->gguf, name);
    const int64_t want0 = ne0 ? ne0 : total, want1 = ne0 ? total : 1;
    if (t && (t->ne[0] != want0 || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, "
                        "%lld] (%s fused)",
                        name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        (long long)t->ne[3], (long long)want0, (long long)want1, parts);
    lms_weight whole = {0};
    int rc = bind(L, &whole, name, want0, ne0 ? total : 0, required);
    if (rc < 0 || !whole.data)
        return rc;
    const uint8_t *p = whole.data;
    for (int i = 0; i < n; i++) {
        /* a matrix's rows are whole quantization blocks, so a range of them
         * is a matrix of the same type; a vector is f32 */
        *out[i] = whole;
        out[i]->data = p;
        if (ne0) {
            out[i]->ne[1] = rows[i];
        } else {
            out[i]->ne[0] = rows[i];
            out[i]->row_bytes = lms_row_size(whole.type, rows[i]);
        }
        p += ne0 ? (size_t)rows[i] * whole.row_bytes : out[i]->row_bytes;
    }
    return 0;
}

/* Phi-3's fused matrices: attn_qkv = [q rows; k rows; v rows] (with an
 * optional bias of the same layout; without attn_qkv, llama.cpp takes
 * separate attn_q/k/v, which bind_layer then binds), ffn_up = [gate rows;
 * up rows] (act(first half) * second half). */
static int bind_phi3(loader *L, lms_layer *l, int il, bool fused_qkv)
{
    const lms_hparams *hp = &L->m->hp;
    const int64_t q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t kv = (int64_t)hp->n_head_kv * hp->head_dim;
    const int64_t qkv_rows[3] = {q, kv, kv}, ff_rows[2] = {hp->n_ff, hp->n_ff};
    lms_weight *const qkv_w[3] = {&l->wq, &l->wk, &l->wv};
    lms_weight *const qkv_b[3] = {&l->bq, &l->bk, &l->bv};
    lms_weight *const ff_w[2] = {&l->w_gate, &l->w_up};
    char name[96];
    int rc;
    if (fused_qkv) {
        snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
        if ((rc = bind_fused(L, name, hp->n_embd, qkv_rows, qkv_w, 3, "q, k, v", true)) < 0)
            return rc;
        snprintf(name, sizeof name, "blk.%d.attn_qkv.bias", il);
        if ((rc = bind_fused(L, name, 0, qkv_rows, qkv_b, 3, "q, k, v", false)) < 0)
            return rc;
    }
    snprintf(name, sizeof name, "blk.%d.ffn_up.weight", il);
    return bind_fused(L, name, hp->n_embd, ff_rows, ff_w, 2, "gate, up", true);
}

static int bind_layer(loader *L, int il)
{
    const lms_hparams *hp = &L->m->hp;
    lms_layer *l = &L->m->layers[il];
    int64_t e = hp->n_embd, q = (int64_t)hp->n_head * hp->head_dim;
    int64_t kv = (int64_t)hp->n_head_kv * hp->head_dim, f = hp->n_ff;
    bool bias = L->arch->flags & ARCH_QKV_BIAS, qkn = L->arch->flags & ARCH_QK_NORM;
    bool gemma = L->arch->flags & (ARCH_GEMMA2 | ARCH_GEMMA3);
    char name[96];
    /* phi3: q, k, v and gate, up are views of fused tensors (bind_phi3) */
    const bool phi3 = L->arch->flags & ARCH_PHI3;
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
    const bool split_qkv = !phi3 || !gguf_find_tensor(L->m->gguf, name);
    char q_name[96];
    snprintf(q_name, sizeof q_name, "blk.%d.attn_q.weight", il);
    if (phi3 && split_qkv && !gguf_find_tensor(L->m->gguf, q_name))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: tensor '%s' is missing (nor are there separate attn_q/k/v)", name);
    struct {
        lms_weight *w;
        const char *suffix;
        int64_t ne0, ne1;
        bool required;
        bool on; /* false: bound by bind_phi3 instead */
    } spec[] = {
        {&l->attn_norm, "attn_norm.weight", e, 0, true, true},
        {&l->wq, "attn_q.weight", e, q, true, split_qkv},
        {&l->wk, "attn_k.weight", e, kv, true, split_qkv},
        {&l->wv, "attn_v.weight", e, kv, true, split_qkv},
        {&l->wo, "attn_output.weight", q, e, true, true},
        {&l->bq, "attn_q.bias", q, 0, bias, split_qkv},
        {&l->bk, "attn_k.bias", kv, 0, bias, split_qkv},
        {&l->bv, "attn_v.bias", kv, 0, bias, split_qkv},
        {&l->q_norm, "attn_q_norm.weight", hp->head_dim, 0, qkn, true},
        {&l->k_norm, "attn_k_norm.weight", hp->head_dim, 0, qkn, true},
        {&l->attn_post_norm, "post_attention_norm.weight", e, 0, gemma, true},
        {&l->ffn_norm, "ffn_norm.weight", e, 0, true, true},
        {&l->w_gate, "ffn_gate.weight", e, f, true, !phi3},
        {&l->w_up, "ffn_up.weight", e, f, true, !phi3},
        {&l->w_down, "ffn_down.weight", f, e, true, true},
        {&l->ffn_post_norm, "post_ffw_norm.weight", e, 0, gemma, true},
    };
    l->rope_base = hp->rope_base;
    l->rope_freq_scale = hp->rope_freq_scale;
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
        if (!spec[i].on)
            continue;
        snprintf(name, sizeof name, "blk.%d.%s", il, spec[i].suffix);
        int rc = bind(L, spec[i].w, name, spec[i].ne0, spec[i].ne1, spec[i].required);
        if (rc < 0)
            return rc;
    }
    return phi3 ? bind_phi3(L, l, il, !split_qkv) : 0;
}

/*
 * LongRoPE (Phi-3 128k, Phi-3.5), as llama.cpp reads it: rope_factors_long
 * and rope_factors_short [n_rot/2] f32 divide the angles of the rotated
 * pairs, the long ones for contexts longer than
 * rope.scaling.original_context_length (default: context_length) positions
 * per sequence; every rotated pair's cos and sin are multiplied by
 * rope.scaling.attn_factor (default 1).
 */
static int read_longrope(loader *L)
{
    lms_model *m = L->m;
    lms_hparams *hp = &m->hp;
    int rc;
    if ((rc = bind(L, &m->rope_long, "rope_factors_long.weight", hp->n_rot / 2, 0, false)) < 0 ||
        (rc = bind(L, &m->rope_short, "rope_factors_short.weight", hp->n_rot / 2, 0, false)) < 0 ||
        (rc = hp_int(L, "rope.scaling.original_context_length", hp->n_ctx_train,
                     &hp->n_ctx_orig)) < 0)
        return rc;
    if (!m->rope_long.data != !m->rope_short.data)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: tensor '%s' is missing (LongRoPE needs both long and short "
                        "factors)",
                        m->rope_long.data ? "rope_factors_short.weight"
                                          : "rope_factors_long.weight");
    const lms_weight *fs[2] = {&m->rope_long, &m->rope_short};
    for (int k = 0; k < 2 && fs[k]->data; k++)
        for (int64_t i = 0; i < fs[k]->ne[0]; i++) {
            const float v = ((const float *)fs[k]->data)[i];
            if (!(v > 0.0f) || !isfinite(v))
                return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                                "model: tensor '%s' value %lld is %g; factors must be positive",
                                k ? "rope_factors_short.weight" : "rope_factors_long.weight",
                                (long long)i, v);
        }
    hp->rope_attn_factor = hp_float(L, "rope.scaling.attn_factor", 1.0f);
    if (!(hp->rope_attn_factor > 0.0f) || !isfinite(hp->rope_attn_factor))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: '%s.rope.scaling.attn_factor' is %g; it must be positive",
                        L->arch->name, hp->rope_attn_factor);
    return 0;
}

const float *lms_model_rope_factors(const lms_model *m, int32_t n_ctx)
{
    if (m->rope_freqs.data)
        return m->rope_freqs.data;
    if (!m->rope_long.data)
        return NULL;
    return n_ctx > m->hp.n_ctx_orig ? m->rope_long.data : m->rope_short.data;
}

/*
 * BERT (as llama.cpp reads its GGUF files; the encoder's data flow is in
 * engine/encoder.h):
 *
 *   token_embd.weight          [n_embd, n_vocab]
 *   token_types.weight         [n_embd, n_types]  optional; row 0 is added
 *   position_embd.weight       [n_embd, n_ctx_train]
 *   token_embd_norm.{weight,bias}                 LayerNorm of the sum
 *   blk.N.attn_{q,k,v}.{weight,bias}              biases optional
 *   blk.N.attn_output.{weight,bias}               bias optional
 *   blk.N.attn_output_norm.{weight,bias}          -> attn_norm, attn_norm_b
 *   blk.N.ffn_up.{weight,bias}, ffn_down.{weight,bias}   biases optional
 *   blk.N.layer_output_norm.{weight,bias}         -> ffn_norm, ffn_norm_b
 *   (blk.N.attn_qkv.{weight,bias}: q, k, v fused, taken as row ranges)
 *
 * nomic-bert (nomic-embed-text) differs: no position_embd (NeoX RoPE of
 * q and k, rope.freq_base), and a SwiGLU FFN: blk.N.ffn_gate.weight,
 * silu(gate) * up (its files have no linear biases; any present are used).
 * Its MoE variant (moe_every_n_layers > 0) is refused.
 *
 * Keys: bert.attention.layer_norm_epsilon (required), bert.pooling_type
 * (1 mean, the default; 2 cls; 3 last; 4 rank: a reranker, whose head is
 * cls.weight [n_embd, n_embd] with cls.bias, then cls.output.weight [n_embd,
 * n_out] with cls.output.bias, either part optional as in llama.cpp),
 * bert.attention.causal (must be false when present).
 */
static int read_bert(loader *L)
{
    lms_hparams *hp = &L->m->hp;
    char key[128];
    hp->is_encoder = true;
    snprintf(key, sizeof key, "%s.attention.layer_norm_epsilon", L->arch->name);
    if (gguf_get_f32(L->m->gguf, key, &hp->norm_eps) < 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: required key '%s' is missing",
                        key);
    if (!(hp->norm_eps > 0.0f) || !isfinite(hp->norm_eps))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: '%s' is %g; it must be positive",
                        key, hp->norm_eps);
    int rc = read_pooling(L, LMS_POOLING_MEAN);
    if (rc < 0)
        return rc;
    int64_t v;
    bool causal = false;
    snprintf(key, sizeof key, "%s.attention.causal", L->arch->name);
    if (gguf_get_bool(L->m->gguf, key, &causal) == 0 && causal)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: '%s' is true; a bert encoder attends both ways", key);
    hp->encoder_rope = L->arch->flags & ARCH_NOMIC;
    snprintf(key, sizeof key, "%s.moe_every_n_layers", L->arch->name);
    if (gguf_get_i64(L->m->gguf, key, &v) == 0 && v > 0)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: '%s' = %lld: mixture-of-experts encoders are not supported", key,
                        (long long)v);
    if (hp->n_head_kv != hp->n_head || hp->head_dim * hp->n_head != hp->n_embd)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: bert with %d heads, %d kv heads of %d (n_embd %d) is not supported",
                        hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_embd);
    return 0;
}

/* Binds `name` as a matrix of ne0 columns and whatever rows it has (at
 * least min_rows); absent and not required: left unbound. */
static int bind_rows(loader *L, lms_weight *w, const char *name, int64_t ne0, int64_t min_rows,
                     bool required)
{
    const gguf_tensor *t = gguf_find_tensor(L->m->gguf, name);
    if (t && (t->ne[1] < min_rows || t->ne[1] > (1 << 24)))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: tensor '%s' has %lld rows, expected at least %lld", name,
                        (long long)t->ne[1], (long long)min_rows);
    return bind(L, w, name, ne0, t ? t->ne[1] : min_rows, required);
}

/* A reranker's classification head (rank pooling), see read_bert. */
static int bind_rank_head(loader *L)
{
    lms_model *m = L->m;
    const int64_t e = m->hp.n_embd;
    int rc;
    if ((rc = bind(L, &m->cls, "cls.weight", e, e, false)) < 0 ||
        (rc = bind(L, &m->cls_b, "cls.bias", e, 0, false)) < 0 ||
        (rc = bind_rows(L, &m->cls_out, "cls.output.weight", e, 1, false)) < 0)
        return rc;
    if (!m->cls.data && !m->cls_out.data)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT,
                        "model: pooling_type 4 (rank) needs a classification head: neither "
                        "'cls.weight' nor 'cls.output.weight' is in the file");
    m->hp.n_cls_out = m->cls_out.data ? (int32_t)m->cls_out.ne[1] : (int32_t)e;
    if (m->hp.n_cls_out > e)
        return lms_errf(L->err, L->errsz, LMS_ERR_UNSUPPORTED,
                        "model: 'cls.output.weight' has %d outputs; at most n_embd (%lld) are "
                        "supported", m->hp.n_cls_out, (long long)e);
    return bind(L, &m->cls_out_b, "cls.output.bias", m->hp.n_cls_out, 0, false);
}

static int bind_bert(loader *L)
{
    lms_model *m = L->m;
    const lms_hparams *hp = &m->hp;
    const int64_t e = hp->n_embd, f = hp->n_ff;
    int rc;
    const bool nomic = L->arch->flags & ARCH_NOMIC;
    if ((rc = read_bert(L)) < 0 ||
        (!nomic &&
         (rc = bind(L, &m->pos_embd, "position_embd.weight", e, hp->n_ctx_train, true)) < 0) ||
        (rc = bind_rows(L, &m->type_embd, "token_types.weight", e, 1, false)) < 0 ||
        (rc = bind(L, &m->tok_norm, "token_embd_norm.weight", e, 0, true)) < 0 ||
        (rc = bind(L, &m->tok_norm_b, "token_embd_norm.bias", e, 0, true)) < 0)
        return rc;
    if (hp->pooling == LMS_POOLING_RANK && (rc = bind_rank_head(L)) < 0)
        return rc;
    const int64_t qkv_rows[3] = {e, e, e};
    for (int il = 0; il < hp->n_layer; il++) {
        lms_layer *l = &m->layers[il];
        char name[96];
        snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
        const bool fused = gguf_find_tensor(m->gguf, name) != NULL;
        if (fused) {
            lms_weight *const w[3] = {&l->wq, &l->wk, &l->wv}, *const b[3] = {&l->bq, &l->bk, &l->bv};
            if ((rc = bind_fused(L, name, e, qkv_rows, w, 3, "q, k, v", true)) < 0)
                return rc;
            snprintf(name, sizeof name, "blk.%d.attn_qkv.bias", il);
            if ((rc = bind_fused(L, name, 0, qkv_rows, b, 3, "q, k, v", false)) < 0)
                return rc;
        }
        const struct {
            lms_weight *w;
            const char *suffix;
            int64_t ne0, ne1;
            bool required;
            bool on;
        } spec[] = {
            {&l->wq, "attn_q.weight", e, e, true, !fused},
            {&l->wk, "attn_k.weight", e, e, true, !fused},
            {&l->wv, "attn_v.weight", e, e, true, !fused},
            {&l->bq, "attn_q.bias", e, 0, false, !fused},
            {&l->bk, "attn_k.bias", e, 0, false, !fused},
            {&l->bv, "attn_v.bias", e, 0, false, !fused},
            {&l->wo, "attn_output.weight", e, e, true, true},
            {&l->bo, "attn_output.bias", e, 0, false, true},
            {&l->attn_norm, "attn_output_norm.weight", e, 0, true, true},
            {&l->attn_norm_b, "attn_output_norm.bias", e, 0, true, true},
            {&l->w_gate, "ffn_gate.weight", e, f, true, nomic},
            {&l->w_up, "ffn_up.weight", e, f, true, true},
            {&l->b_up, "ffn_up.bias", f, 0, false, true},
            {&l->w_down, "ffn_down.weight", f, e, true, true},
            {&l->b_down, "ffn_down.bias", e, 0, false, true},
            {&l->ffn_norm, "layer_output_norm.weight", e, 0, true, true},
            {&l->ffn_norm_b, "layer_output_norm.bias", e, 0, true, true},
        };
        for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
            if (!spec[i].on)
                continue;
            snprintf(name, sizeof name, "blk.%d.%s", il, spec[i].suffix);
            if ((rc = bind(L, spec[i].w, name, spec[i].ne0, spec[i].ne1, spec[i].required)) < 0)
                return rc;
        }
    }
    return 0;
}

static int bind_weights(loader *L)
{
    lms_model *m = L->m;
    lms_hparams *hp = &m->hp;
    const gguf_tensor *te = gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te)
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: tensor 'token_embd.weight' is missing");
    if (te->ne[1] <= 0 || te->ne[1] > (1 << 24))
        return lms_errf(L->err, L->errsz, LMS_ERR_FORMAT, "model: token_embd has %lld rows",
                        (long long)te->ne[1]);
    hp->n_vocab = (int32_t)te->ne[1];
    int rc = bind(L, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, true);
    if (rc == 0 && (L->arch->flags & ARCH_BERT)) { /* an encoder: no output head */
        m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
        return m->layers ? bind_bert(L)
                         : lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "model: out of memory");
    }
    if (rc < 0 || (rc = bind(L, &m->output_norm, "output_norm.weight", hp->n_embd, 0, true)) < 0 ||
        /* gemma2's head is always token_embd (as llama.cpp: an output.weight is ignored) */
        (!(L->arch->flags & ARCH_GEMMA2) &&
         (rc = bind(L, &m->output, "output.weight", hp->n_embd, hp->n_vocab, false)) < 0) ||
        (rc = bind(L, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2, 0, false)) < 0)
        return rc;
    if (!m->output.data)
        m->output = m->tok_embd; /* tied output head */
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return lms_errf(L->err, L->errsz, LMS_ERR_NOMEM, "model: out of memory");
    for (int il = 0; il < hp->n_layer; il++)
        if ((rc = bind_layer(L, il)) < 0)
            return rc;
    /* a decoder made into an embedding model (Qwen3-Embedding: last) or a
     * reranker (Qwen3-Reranker: rank, its head the output rows of "yes"
     * and "no" as cls.output.weight [n_embd, 2]) */
    if ((rc = read_pooling(L, 0)) < 0 ||
        (hp->pooling == LMS_POOLING_RANK && (rc = bind_rank_head(L)) < 0))
        return rc;
    if (L->arch->flags & (ARCH_GEMMA2 | ARCH_GEMMA3))
        return read_gemma(L);
    if (L->arch->flags & ARCH_PHI3)
        return read_longrope(L);
    return 0;
}

/* ---- load / free ------------------------------------------------------------ */

static void set_name(lms_model *m, const char *path)
{
    const char *name = NULL;
    if (gguf_get_str(m->gguf, "general.name", &name) == 0 && name[0]) {
        snprintf(m->name, sizeof m->name, "%s", name);
        return;
    }
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
}

int lms_model_load(const char *path, lms_model **out, char *err, size_t errsz)
{
    lms_model *m = calloc(1, sizeof *m);
    if (!m)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "model: out of memory");
    loader L = {.m = m, .err = err, .errsz = errsz};
    const char *arch = NULL;
    /* a Hugging Face folder becomes the gguf_file its conversion would be */
    int rc = hf_open_any(path, 0, &m->gguf, err, errsz);
    if (rc < 0)
        goto fail;
    if (gguf_get_str(m->gguf, "general.architecture", &arch) < 0) {
        rc = lms_errf(err, errsz, LMS_ERR_FORMAT, "model: 'general.architecture' is missing");
        goto fail;
    }
    if (!(L.arch = arch_find(arch))) {
        rc = lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                      "model: architecture '%s' is not supported (supported: %s)", arch,
                      lms_model_supported_archs());
        goto fail;
    }
    if ((rc = read_hparams(&L)) < 0 || (rc = bind_weights(&L)) < 0)
        goto fail;
    if ((rc = lms_tokenizer_load(m->gguf, &m->tok, err, errsz)) < 0)
        goto fail;
    if (lms_tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
        rc = lms_errf(err, errsz, LMS_ERR_FORMAT, "model: vocabulary has %d tokens, token_embd %d rows",
                      (int)lms_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    set_name(m, path);
    *out = m;
    return 0;
fail:
    lms_model_free(m);
    return rc;
}

void lms_model_free(lms_model *m)
{
    if (!m)
        return;
    lms_tokenizer_destroy(m->tok);
    free(m->layers);
    gguf_close(m->gguf);
    free(m);
}

size_t lms_model_kv_bytes(const lms_hparams *hp, int64_t n_ctx)
{
    return (size_t)2 * (size_t)hp->n_layer * (size_t)n_ctx * (size_t)hp->n_head_kv *
           (size_t)hp->head_dim * 2;
}
