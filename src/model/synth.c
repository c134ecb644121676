/*
 * synth.c - seeded random models of real shapes (see synth.h).
 *
 * Weights: matrices N(0, 0.02^2) (token embedding too), norm weights 1
 * (shapes with w_sd: N(0, w_sd^2) and 1 + N(0, 0.1^2)). gemma2 / gemma3
 * shapes get their post-attention and post-FFN norms (and gemma3 its q/k
 * norms), sliding-window and soft-capping keys, as llama.cpp's converter
 * writes them; phi3 shapes their fused attn_qkv and gate+up ffn_up, the
 * (unused) sliding-window key and, for 128k shapes, LongRoPE factors.
 * Vocabulary: a byte-level BPE (tokenizer.ggml.model "gpt2", pre "default")
 * with the 256 byte tokens, merges for lower-case letter pairs and
 * space+letter, the family's special tokens, then unused filler tokens up
 * to the shape's vocabulary size; the chat template is the family's.
 * bert shapes: llama.cpp's BERT tensors with biases, learned positions and
 * two token types, pooling_type mean, and a WordPiece vocabulary
 * (tokenizer.ggml.model "bert": [PAD] [UNK] [CLS] [SEP] [MASK], letters,
 * digits and punctuation as word starts "\u2581x" and continuations "x", a
 * few whole words, then filler). nomic-bert shapes: no position_embd (its
 * RoPE base in rope.freq_base), q, k, v fused in attn_qkv, a SwiGLU FFN
 * (ffn_gate), no linear biases.
 */
#include "model/synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/quant_plan.h"
#include "model/template.h"

typedef struct shape_row {
    lms_synth_shape s;
    lms_synth_extra x;
} shape_row;

#define NO_EXTRA {0, 0.0f, 0.0f, 0.0f}
static const shape_row shapes[] = {
    /* name            arch     embd  lay head kv  hd   ff     vocab   ctx     base     eps  tied l3 */
    {{"tiny", "llama", 128, 4, 4, 2, 32, 384, 1024, 2048, 10000.0f, 1e-5f, 1, 0}, NO_EXTRA},
    /* "tiny" with Mistral's tool-call control tokens [TOOL_CALLS] and [ARGS] in its vocabulary */
    {{"mistral-tiny", "llama", 128, 4, 4, 2, 32, 384, 1024, 2048, 10000.0f, 1e-5f, 1, 0},
     NO_EXTRA},
    {{"llama-3.2-1b", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f, 1, 1},
     NO_EXTRA},
    {{"llama-3.2-3b", "llama", 3072, 28, 24, 8, 128, 8192, 128256, 131072, 500000.0f, 1e-5f, 1, 1},
     NO_EXTRA},
    {{"llama-3-8b", "llama", 4096, 32, 32, 8, 128, 14336, 128256, 8192, 500000.0f, 1e-5f, 0, 0},
     NO_EXTRA},
    {{"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, 1, 0},
     NO_EXTRA},
    {{"qwen2.5-0.5b", "qwen2", 896, 24, 14, 2, 64, 4864, 151936, 32768, 1000000.0f, 1e-6f, 1, 0},
     NO_EXTRA},
    /* a tiny Qwen2 for tests (the family's FIM tokens included, as in Qwen2.5's vocab) */
    {{"qwen2-tiny", "qwen2", 128, 2, 4, 2, 32, 256, 1024, 2048, 1000000.0f, 1e-6f, 1, 0},
     NO_EXTRA},
    /* gemma: head_dim 256 is not n_embd / n_head; gemma2 with its real caps 50 / 30
     * (extras: window, attention cap, final cap, weight sd) */
    {{"gemma2-2b", "gemma2", 2304, 26, 8, 4, 256, 9216, 256000, 8192, 10000.0f, 1e-6f, 1, 0},
     {4096, 50.0f, 30.0f, 0.0f}},
    {{"gemma3-1b", "gemma3", 1152, 26, 4, 1, 256, 6912, 262144, 32768, 1000000.0f, 1e-6f, 1, 0},
     {512, 0.0f, 0.0f, 0.0f}},
    /* tiny test models: window 16, q = 256 wider than n_embd 192; gemma2's caps
     * small enough to bite on random weights; gemma3 with 6 layers (5 local, 1 global) */
    {{"gemma2-tiny", "gemma2", 192, 4, 4, 2, 64, 512, 1024, 1024, 10000.0f, 1e-6f, 1, 0},
     {16, 4.0f, 2.0f, 0.08f}},
    {{"gemma3-tiny", "gemma3", 192, 6, 4, 1, 64, 512, 1024, 1024, 1000000.0f, 1e-6f, 1, 0},
     {16, 0.0f, 0.0f, 0.08f}},
    /* phi3: Phi-3-mini-4k and Phi-3.5-mini (128k, LongRoPE from 4096), with the
     * sliding_window values their converted files carry (llama.cpp ignores them) */
    {{"phi3-mini", "phi3", 3072, 32, 32, 32, 96, 8192, 32064, 4096, 10000.0f, 1e-5f, 0, 0},
     {2047, 0.0f, 0.0f, 0.0f}},
    {{"phi3.5-mini", "phi3", 3072, 32, 32, 32, 96, 8192, 32064, 131072, 10000.0f, 1e-5f, 0, 0},
     {262144, 0.0f, 0.0f, 0.0f}},
    /* tiny test models: GQA (unlike the real ones), a window of 16 that must not
     * apply; the 128k one switches to its long factors above 512 positions */
    {{"phi3-tiny", "phi3", 192, 4, 4, 2, 48, 512, 1024, 1024, 10000.0f, 1e-5f, 0, 0},
     {16, 0.0f, 0.0f, 0.08f}},
    {{"phi3-tiny-128k", "phi3", 192, 4, 4, 2, 48, 512, 1024, 4096, 10000.0f, 1e-5f, 0, 0},
     {16, 0.0f, 0.0f, 0.08f}},
    /* bert embedding models (rms_eps: the LayerNorm epsilon; no output head):
     * bge-small-en-v1.5's shape, and a tiny test model */
    {{"bge-small", "bert", 384, 12, 12, 12, 32, 1536, 30522, 512, 10000.0f, 1e-12f, 1, 0},
     NO_EXTRA},
    {{"bert-tiny", "bert", 128, 3, 4, 4, 32, 512, 512, 128, 10000.0f, 1e-12f, 1, 0},
     {0, 0.0f, 0.0f, 0.08f}},
    /* a reranker of that shape (rank pooling, a classification head of one
     * output: bge-reranker's form) */
    {{"bert-rerank-tiny", "bert", 128, 3, 4, 4, 32, 512, 512, 128, 10000.0f, 1e-12f, 1, 0},
     {0, 0.0f, 0.0f, 0.08f}},
    /* Qwen3-Reranker's form on qwen2-tiny's sizes: rank pooling, the head
     * cls.output.weight [n_embd, 2] (labels "yes", "no") and a "rerank"
     * prompt template with {query} and {document} */
    {{"qwen3-rerank-tiny", "qwen3", 128, 2, 4, 2, 32, 256, 1024, 2048, 1000000.0f, 1e-6f, 1, 0},
     NO_EXTRA},
    /* Qwen3-Embedding's form on the same sizes: a decoder whose file asks
     * for last-token pooling */
    {{"qwen3-embed-tiny", "qwen3", 128, 2, 4, 2, 32, 256, 1024, 2048, 1000000.0f, 1e-6f, 1, 0},
     NO_EXTRA},
    /* nomic-embed-text's form (RoPE base 1000, fused attn_qkv, SwiGLU, no biases) */
    {{"nomic-tiny", "nomic-bert", 128, 3, 4, 4, 32, 384, 512, 256, 1000.0f, 1e-12f, 1, 0},
     {0, 0.0f, 0.0f, 0.08f}},
};
#undef NO_EXTRA

/* The phi3 128k shapes (by name, so copies of them count): LongRoPE factors
 * for contexts beyond n_ctx_orig positions (rope_factors_long / _short,
 * rope.scaling.attn_factor and rope.scaling.original_context_length). */
static int32_t longrope_orig(const lms_synth_shape *s)
{
    static const struct {
        const char *name;
        int32_t n_ctx_orig;
    } rows[] = {{"phi3.5-mini", 4096}, {"phi3-tiny-128k", 512}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (!strcmp(s->arch, "phi3") && !strcmp(s->name, rows[i].name))
            return rows[i].n_ctx_orig;
    return 0;
}

const lms_synth_shape *lms_synth_find(const char *name)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (!strcmp(shapes[i].s.name, name))
            return &shapes[i].s;
    return NULL;
}

static const lms_synth_extra *extra_of(const lms_synth_shape *s)
{
    static const lms_synth_extra none;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (s == &shapes[i].s)
            return &shapes[i].x;
    return &none;
}

const char *lms_synth_names(void)
{
    return "tiny llama-3.2-1b llama-3.2-3b llama-3-8b qwen3-0.6b qwen2.5-0.5b qwen2-tiny gemma2-2b gemma3-1b "
           "gemma2-tiny gemma3-tiny phi3-mini phi3.5-mini phi3-tiny phi3-tiny-128k bge-small "
           "bert-tiny bert-rerank-tiny qwen3-rerank-tiny qwen3-embed-tiny nomic-tiny";
}

/* ---- random numbers ------------------------------------------------------ */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Normal sample number i of stream `seed` (counter based: rows can be
 * filled in parallel and in any order with the same result). */
static float normal_at(uint64_t seed, uint64_t i)
{
    uint64_t a = mix64(seed ^ (i * 0x9E3779B97F4A7C15ull)), b = mix64(a + 0x632BE59BD9B4E019ull);
    double u1 = ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* ---- vocabulary ------------------------------------------------------------ */

/* GPT-2's byte -> code point mapping, encoded as UTF-8 into out (<= 3 bytes). */
static void byte_token(int b, char *out)
{
    int cp = b;
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

typedef struct vocab {
    char **tok;
    int32_t *type;
    char **merges;
    int32_t n, n_merges;
    int32_t bos, eos, eot;
} vocab;

static void vocab_free(vocab *v)
{
    for (int32_t i = 0; i < v->n; i++)
        free(v->tok[i]);
    for (int32_t i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tok);
    free(v->type);
    free(v->merges);
}

/* A WordPiece vocabulary (see the top of the file): bos = [CLS], eos =
 * [SEP], eot = [UNK] (written as the unknown token). */
static int build_vocab_wpm(const lms_synth_shape *s, vocab *v)
{
    static const char *specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    static const char *words[] = {"the", "hello", "world", "embedding", "model", "cat", "dog",
                                  "ing", "ed", "er"};
    static const char chars[] = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-";
    memset(v, 0, sizeof *v);
    v->tok = calloc((size_t)s->n_vocab, sizeof *v->tok);
    v->type = calloc((size_t)s->n_vocab, sizeof *v->type);
    if (!v->tok || !v->type)
        return LMS_ERR_NOMEM;
    char buf[32];
    for (int i = 0; i < 5 && v->n < s->n_vocab; i++)
        v->tok[v->n] = strdup(specials[i]), v->type[v->n++] = 3;
    for (size_t i = 0; chars[i] && v->n + 1 < s->n_vocab; i++) {
        snprintf(buf, sizeof buf, "\xe2\x96\x81%c", chars[i]);
        v->tok[v->n] = strdup(buf), v->type[v->n++] = 1;
        snprintf(buf, sizeof buf, "%c", chars[i]);
        v->tok[v->n] = strdup(buf), v->type[v->n++] = 1;
    }
    for (size_t i = 0; i < sizeof words / sizeof words[0] && v->n < s->n_vocab; i++) {
        snprintf(buf, sizeof buf, "%s%s", i < 7 ? "\xe2\x96\x81" : "", words[i]);
        v->tok[v->n] = strdup(buf), v->type[v->n++] = 1;
    }
    while (v->n < s->n_vocab) {
        snprintf(buf, sizeof buf, "[unused%d]", v->n);
        v->tok[v->n] = strdup(buf), v->type[v->n++] = 5;
    }
    v->bos = 2, v->eos = 3, v->eot = 1;
    for (int32_t i = 0; i < v->n; i++)
        if (!v->tok[i])
            return LMS_ERR_NOMEM;
    return 0;
}

static bool is_encoder(const char *arch)
{
    return !strcmp(arch, "bert") || !strcmp(arch, "nomic-bert");
}

/* A reranker (a bert or qwen3 shape named so): rank pooling and its head */
static bool is_rerank(const lms_synth_shape *s)
{
    return (!strcmp(s->arch, "bert") || !strcmp(s->arch, "qwen3")) &&
           strstr(s->name, "rerank") != NULL;
}

/* A decoder reranker's prompt: the query and the document go where
 * {query} and {document} stand (the server substitutes them) */
static const char RERANK_TEMPLATE[] =
    "<|im_start|>system\nAnswer \"yes\" if the document answers the query, else "
    "\"no\".<|im_end|>\n<|im_start|>user\n<Query>: {query}\n<Document>: "
    "{document}<|im_end|>\n<|im_start|>assistant\n";

static int build_vocab(const lms_synth_shape *s, vocab *v)
{
    if (is_encoder(s->arch))
        return build_vocab_wpm(s, v);
    static const char *llama_sp[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                                     "<|start_header_id|>", "<|end_header_id|>"};
    static const char *mistral_sp[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                                       "<|start_header_id|>", "<|end_header_id|>", "[TOOL_CALLS]",
                                       "[ARGS]"};
    static const char *qwen_sp[] = {"<|endoftext|>", "<|im_start|>",  "<|im_end|>",
                                    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                                    "<|fim_pad|>",    "<|repo_name|>",  "<|file_sep|>"};
    static const char *gemma_sp[] = {"<bos>", "<eos>", "<end_of_turn>", "<start_of_turn>"};
    /* (llama.cpp looks "</s>" and "<unk>" up by name in a model named phi3) */
    static const char *phi3_sp[] = {"<s>",           "<|endoftext|>", "<|end|>", "<|user|>",
                                    "<|assistant|>", "</s>",          "<unk>"};
    bool qwen = strncmp(s->arch, "qwen", 4) == 0, gemma = strncmp(s->arch, "gemma", 5) == 0;
    bool phi3 = strcmp(s->arch, "phi3") == 0;
    const bool mistral = strncmp(s->name, "mistral", 7) == 0;
    const char **sp = qwen ? qwen_sp : gemma ? gemma_sp : phi3 ? phi3_sp : mistral ? mistral_sp : llama_sp;
    int n_sp = qwen ? 9 : gemma ? 4 : phi3 ? 7 : mistral ? 7 : 5;
    memset(v, 0, sizeof *v);
    v->tok = calloc((size_t)s->n_vocab, sizeof *v->tok);
    v->type = calloc((size_t)s->n_vocab, sizeof *v->type);
    v->merges = calloc(26 * 27, sizeof *v->merges);
    if (!v->tok || !v->type || !v->merges)
        return LMS_ERR_NOMEM;
    char a[4], b[4], buf[16];
    for (int i = 0; i < 256; i++) {
        byte_token(i, buf);
        v->tok[v->n] = strdup(buf), v->type[v->n++] = 1;
    }
    byte_token(' ', a); /* "Ġ" */
    for (int x = 0; x < 27 && v->n < s->n_vocab - n_sp; x++)
        for (int y = 0; y < 26 && v->n < s->n_vocab - n_sp; y++) {
            if (x < 26)
                snprintf(a, sizeof a, "%c", 'a' + x);
            else
                byte_token(' ', a);
            snprintf(b, sizeof b, "%c", 'a' + y);
            snprintf(buf, sizeof buf, "%s %s", a, b);
            v->merges[v->n_merges++] = strdup(buf);
            snprintf(buf, sizeof buf, "%s%s", a, b);
            v->tok[v->n] = strdup(buf), v->type[v->n++] = 1;
        }
    for (int i = 0; i < n_sp; i++)
        v->tok[v->n] = strdup(sp[i]), v->type[v->n++] = 3;
    v->bos = v->n - n_sp; /* qwen: <|endoftext|>; eos and eot <|im_end|> */
    v->eos = qwen ? v->n - n_sp + 2 : v->n - n_sp + 1;
    v->eot = v->n - n_sp + 2;
    while (v->n < s->n_vocab) {
        snprintf(buf, sizeof buf, "[PAD%d]", v->n);
        v->tok[v->n] = strdup(buf), v->type[v->n++] = 5;
    }
    for (int32_t i = 0; i < v->n; i++)
        if (!v->tok[i])
            return LMS_ERR_NOMEM;
    return 0;
}

/* ---- metadata and tensors --------------------------------------------------- */

static int write_meta(gguf_writer *w, const lms_synth_shape *s, const lms_synth_extra *x,
                      const vocab *v, const lms_quant_plan *plan)
{
    char key[96];
    const char *a = s->arch;
    int rc = gguf_writer_set_str(w, "general.architecture", a);
    rc |= gguf_writer_set_str(w, "general.name", s->name);
    rc |= gguf_writer_set_u32(w, "general.file_type", (uint32_t)plan->ftype);
    rc |= gguf_writer_set_u32(w, "general.quantization_version", 2);
#define SET_U32(suffix, val) (snprintf(key, sizeof key, "%s." suffix, a), gguf_writer_set_u32(w, key, (uint32_t)(val)))
#define SET_F32(suffix, val) (snprintf(key, sizeof key, "%s." suffix, a), gguf_writer_set_f32(w, key, (val)))
    rc |= SET_U32("context_length", s->n_ctx);
    rc |= SET_U32("embedding_length", s->n_embd);
    rc |= SET_U32("block_count", s->n_layer);
    rc |= SET_U32("feed_forward_length", s->n_ff);
    rc |= SET_U32("attention.head_count", s->n_head);
    rc |= SET_U32("attention.head_count_kv", s->n_head_kv);
    rc |= SET_U32("attention.key_length", s->head_dim);
    rc |= SET_U32("attention.value_length", s->head_dim);
    rc |= SET_U32("rope.dimension_count", s->head_dim);
    rc |= SET_U32("vocab_size", s->n_vocab);
    rc |= SET_F32("rope.freq_base", s->rope_base);
    rc |= SET_F32("attention.layer_norm_rms_epsilon", s->rms_eps);
    if (x->n_swa)
        rc |= SET_U32("attention.sliding_window", x->n_swa);
    if (x->attn_softcap != 0.0f)
        rc |= SET_F32("attn_logit_softcapping", x->attn_softcap);
    if (x->final_softcap != 0.0f)
        rc |= SET_F32("final_logit_softcapping", x->final_softcap);
    const int32_t orig = longrope_orig(s);
    if (orig > 0) { /* the converter's LongRoPE attention factor */
        const double scale = (double)s->n_ctx / orig;
        rc |= SET_U32("rope.scaling.original_context_length", orig);
        rc |= SET_F32("rope.scaling.attn_factor",
                      scale > 1.0 ? (float)sqrt(1.0 + log(scale) / log((double)orig)) : 1.0f);
    }
    if (is_encoder(a)) {
        rc |= SET_F32("attention.layer_norm_epsilon", s->rms_eps);
        rc |= SET_U32("pooling_type", is_rerank(s) ? 4 : 1); /* rank, else mean */
        rc |= (snprintf(key, sizeof key, "%s.attention.causal", a),
               gguf_writer_set_bool(w, key, false));
    }
    if (!is_encoder(a) && strstr(s->name, "embed") != NULL)
        rc |= SET_U32("pooling_type", 3); /* last */
    if (!is_encoder(a) && is_rerank(s)) {
        static const char *const labels[] = {"yes", "no"};
        rc |= SET_U32("pooling_type", 4);
        rc |= (snprintf(key, sizeof key, "%s.classifier.output_labels", a),
               gguf_writer_set_arr_str(w, key, labels, 2));
        rc |= gguf_writer_set_str(w, "tokenizer.chat_template.rerank", RERANK_TEMPLATE);
    }
#undef SET_U32
#undef SET_F32
    if (is_encoder(a)) { /* WordPiece; no chat template */
        rc |= gguf_writer_set_str(w, "tokenizer.ggml.model", "bert");
        rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok,
                                      (uint64_t)v->n);
        rc |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, v->type,
                                  (uint64_t)v->n);
        rc |= gguf_writer_set_u32(w, "tokenizer.ggml.token_type_count", 2);
        rc |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
        rc |= gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", (uint32_t)v->eos);
        rc |= gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->eot);
        rc |= gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 0);
        rc |= gguf_writer_set_u32(w, "tokenizer.ggml.mask_token_id", 4);
        return rc ? LMS_ERR_NOMEM : 0;
    }
    rc |= gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    rc |= gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, (uint64_t)v->n);
    rc |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VT_I32, v->type, (uint64_t)v->n);
    rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                  (uint64_t)v->n_merges);
    rc |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)v->eot);
    const bool gemma = strncmp(a, "gemma", 5) == 0;
    rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", strcmp(a, "llama") == 0 || gemma);
    const char *tpl = lms_template_builtin(strcmp(a, "llama") == 0  ? "llama3"
                                           : gemma                  ? "gemma"
                                           : strcmp(a, "phi3") == 0 ? "phi3"
                                                                    : "chatml");
    if (tpl)
        rc |= gguf_writer_set_str(w, "tokenizer.chat_template", tpl);
    return rc ? LMS_ERR_NOMEM : 0;
}

typedef struct synth_ctx {
    gguf_writer *w;
    const lms_quant_plan *plan;
    const lms_synth_shape *s;
    const lms_synth_extra *x;
    uint64_t seed;
    uint64_t stream;   /* tensor counter: each tensor has its own stream */
} synth_ctx;

static int add(synth_ctx *c, const char *name, int64_t ne0, int64_t ne1, float fill)
{
    size_t n = (size_t)ne0 * (size_t)(ne1 ? ne1 : 1);
    float *x = malloc(n * sizeof *x);
    if (!x)
        return LMS_ERR_NOMEM;
    uint64_t stream = mix64(c->seed + ++c->stream);
    const float sd = c->x->w_sd > 0.0f ? c->x->w_sd : 0.02f;
    const float fill_sd = c->x->w_sd > 0.0f ? 0.1f : 0.0f; /* norms: 1 + N(0, 0.1^2) */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < (int64_t)n; i++)
        x[i] = fill != 0.0f ? fill + fill_sd * normal_at(stream, (uint64_t)i)
                            : sd * normal_at(stream, (uint64_t)i);
    int nd = ne1 ? 2 : 1;
    int type = lms_quant_pick(c->plan, name, nd, ne0, c->s->n_layer, !c->s->tied);
    size_t nb;
    void *data = lms_quant_rows(x, ne0, ne1 ? ne1 : 1, type, &nb, NULL);
    free(x);
    if (!data)
        return LMS_ERR_NOMEM;
    int64_t ne[2] = {ne0, ne1};
    int rc = gguf_writer_add_tensor(c->w, name, type, nd, ne, data, nb, false);
    free(data);
    return rc;
}

/* Llama 3 rope scaling (factor 32, low 1, high 4, original context 8192). */
static int add_rope_freqs(synth_ctx *c)
{
    int n = c->s->head_dim / 2;
    float *f = malloc((size_t)n * sizeof *f);
    if (!f)
        return LMS_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        double freq = pow(c->s->rope_base, -2.0 * i / c->s->head_dim);
        double wavelen = 2 * M_PI / freq, lo = 8192.0 / 1.0, hi = 8192.0 / 4.0;
        if (wavelen < hi)
            f[i] = 1.0f;
        else if (wavelen > lo)
            f[i] = 32.0f;
        else {
            double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
            f[i] = (float)(1.0 / ((1 - smooth) / 32.0 + smooth));
        }
    }
    int64_t ne[1] = {n};
    int rc = gguf_writer_add_tensor(c->w, "rope_freqs.weight", 0, 1, ne, f, (size_t)n * 4, false);
    free(f);
    return rc;
}

/* LongRoPE factors [head_dim/2] f32, made up but of the real ones' form:
 * short near 1, long growing to tens over the low frequencies. */
static int add_longrope(synth_ctx *c)
{
    const int n = c->s->head_dim / 2;
    float *f = malloc((size_t)n * 2 * sizeof *f);
    if (!f)
        return LMS_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        f[i] = 1.0f + 40.0f * (float)i / (float)n;    /* long */
        f[n + i] = 1.0f + 0.5f * (float)i / (float)n; /* short */
    }
    int64_t ne[1] = {n};
    const size_t nb = (size_t)n * 4;
    int rc = gguf_writer_add_tensor(c->w, "rope_factors_long.weight", 0, 1, ne, f, nb, false);
    if (rc == 0)
        rc = gguf_writer_add_tensor(c->w, "rope_factors_short.weight", 0, 1, ne, f + n, nb, false);
    free(f);
    return rc;
}

/* A bert layer: every linear part with its bias, LayerNorms with biases
 * (nomic-bert: fused q, k, v and a gated FFN, no linear biases). */
static int add_layer_bert(synth_ctx *c, int il)
{
    const int64_t e = c->s->n_embd, f = c->s->n_ff;
    char name[96];
    int rc = 0;
#define T(suffix, ne0, ne1, fill) \
    (snprintf(name, sizeof name, "blk.%d." suffix, il), rc = rc ? rc : add(c, name, ne0, ne1, fill))
    if (!strcmp(c->s->arch, "nomic-bert")) {
        T("attn_qkv.weight", e, 3 * e, 0.0f);
        T("attn_output.weight", e, e, 0.0f);
        T("attn_output_norm.weight", e, 0, 1.0f);
        T("attn_output_norm.bias", e, 0, 0.0f);
        T("ffn_up.weight", e, f, 0.0f);
        T("ffn_gate.weight", e, f, 0.0f);
        T("ffn_down.weight", f, e, 0.0f);
        T("layer_output_norm.weight", e, 0, 1.0f);
        T("layer_output_norm.bias", e, 0, 0.0f);
        return rc;
    }
    T("attn_q.weight", e, e, 0.0f);
    T("attn_q.bias", e, 0, 0.0f);
    T("attn_k.weight", e, e, 0.0f);
    T("attn_k.bias", e, 0, 0.0f);
    T("attn_v.weight", e, e, 0.0f);
    T("attn_v.bias", e, 0, 0.0f);
    T("attn_output.weight", e, e, 0.0f);
    T("attn_output.bias", e, 0, 0.0f);
    T("attn_output_norm.weight", e, 0, 1.0f);
    T("attn_output_norm.bias", e, 0, 0.0f);
    T("ffn_up.weight", e, f, 0.0f);
    T("ffn_up.bias", f, 0, 0.0f);
    T("ffn_down.weight", f, e, 0.0f);
    T("ffn_down.bias", e, 0, 0.0f);
    T("layer_output_norm.weight", e, 0, 1.0f);
    T("layer_output_norm.bias", e, 0, 0.0f);
#undef T
    return rc;
}

/* A bert model's tensors after token_embd. */
static int add_bert(synth_ctx *c)
{
    const lms_synth_shape *s = c->s;
    int rc = add(c, "token_types.weight", s->n_embd, 2, 0.0f);
    if (rc == 0 && strcmp(s->arch, "nomic-bert"))
        rc = add(c, "position_embd.weight", s->n_embd, s->n_ctx, 0.0f);
    if (rc == 0)
        rc = add(c, "token_embd_norm.weight", s->n_embd, 0, 1.0f);
    if (rc == 0)
        rc = add(c, "token_embd_norm.bias", s->n_embd, 0, 0.0f);
    for (int il = 0; il < s->n_layer && rc == 0; il++)
        rc = add_layer_bert(c, il);
    if (rc == 0 && is_rerank(s))
        rc = add(c, "cls.weight", s->n_embd, s->n_embd, 0.0f);
    if (rc == 0 && is_rerank(s))
        rc = add(c, "cls.bias", s->n_embd, 0, 0.0f);
    if (rc == 0 && is_rerank(s))
        rc = add(c, "cls.output.weight", s->n_embd, 1, 0.0f);
    if (rc == 0 && is_rerank(s))
        rc = add(c, "cls.output.bias", 1, 0, 0.0f);
    return rc;
}

static int add_layer(synth_ctx *c, int il)
{
    const lms_synth_shape *s = c->s;
    int64_t e = s->n_embd, q = (int64_t)s->n_head * s->head_dim, kv = (int64_t)s->n_head_kv * s->head_dim;
    char name[96];
    int rc = 0;
#define T(suffix, ne0, ne1, fill) \
    (snprintf(name, sizeof name, "blk.%d." suffix, il), rc = rc ? rc : add(c, name, ne0, ne1, fill))
    const bool phi3 = !strcmp(s->arch, "phi3");
    T("attn_norm.weight", e, 0, 1.0f);
    if (phi3) { /* q, k, v rows in one matrix */
        T("attn_qkv.weight", e, q + 2 * kv, 0.0f);
    } else {
        T("attn_q.weight", e, q, 0.0f);
        T("attn_k.weight", e, kv, 0.0f);
        T("attn_v.weight", e, kv, 0.0f);
    }
    T("attn_output.weight", q, e, 0.0f);
    if (!strcmp(s->arch, "qwen2")) {
        T("attn_q.bias", q, 0, 0.0f);
        T("attn_k.bias", kv, 0, 0.0f);
        T("attn_v.bias", kv, 0, 0.0f);
    }
    const bool gemma = !strncmp(s->arch, "gemma", 5);
    if (!strcmp(s->arch, "qwen3") || !strcmp(s->arch, "gemma3")) {
        T("attn_q_norm.weight", s->head_dim, 0, 1.0f);
        T("attn_k_norm.weight", s->head_dim, 0, 1.0f);
    }
    if (gemma)
        T("post_attention_norm.weight", e, 0, 1.0f);
    T("ffn_norm.weight", e, 0, 1.0f);
    if (phi3) { /* gate rows, then up rows */
        T("ffn_up.weight", e, 2 * (int64_t)s->n_ff, 0.0f);
    } else {
        T("ffn_gate.weight", e, s->n_ff, 0.0f);
        T("ffn_up.weight", e, s->n_ff, 0.0f);
    }
    T("ffn_down.weight", s->n_ff, e, 0.0f);
    if (gemma)
        T("post_ffw_norm.weight", e, 0, 1.0f);
#undef T
    return rc;
}

int lms_synth_write(const lms_synth_shape *s, const char *type, uint64_t seed, const char *path,
                    char *err, size_t errsz)
{
    return lms_synth_write_ex(s, NULL, type, seed, path, err, errsz);
}

int lms_synth_write_ex(const lms_synth_shape *s, const lms_synth_extra *x, const char *type,
                       uint64_t seed, const char *path, char *err, size_t errsz)
{
    if (!x)
        x = extra_of(s);
    const lms_quant_plan *plan = lms_quant_plan_find(type);
    if (!plan)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "synth: unknown type '%s' (one of: %s)", type,
                        lms_quant_plan_names());
    vocab v;
    gguf_writer *w = gguf_writer_create();
    int rc = w ? build_vocab(s, &v) : LMS_ERR_NOMEM;
    if (rc == 0)
        rc = write_meta(w, s, x, &v, plan);
    synth_ctx c = {.w = w, .plan = plan, .s = s, .x = x, .seed = seed};
    if (rc == 0)
        rc = add(&c, "token_embd.weight", s->n_embd, s->n_vocab, 0.0f);
    const bool bert = is_encoder(s->arch);
    if (rc == 0 && bert)
        rc = add_bert(&c);
    for (int il = 0; il < s->n_layer && rc == 0 && !bert; il++)
        rc = add_layer(&c, il);
    if (rc == 0 && !bert)
        rc = add(&c, "output_norm.weight", s->n_embd, 0, 1.0f);
    if (rc == 0 && !bert && is_rerank(s))
        rc = add(&c, "cls.output.weight", s->n_embd, 2, 0.0f);
    if (rc == 0 && !s->tied)
        rc = add(&c, "output.weight", s->n_embd, s->n_vocab, 0.0f);
    if (rc == 0 && s->llama3_rope)
        rc = add_rope_freqs(&c);
    if (rc == 0 && longrope_orig(s) > 0)
        rc = add_longrope(&c);
    if (rc == 0)
        rc = gguf_writer_write(w, path, err, errsz);
    else
        lms_errf(err, errsz, rc, "synth: cannot build the model: %s", lms_strerror(rc));
    if (w)
        vocab_free(&v);
    gguf_writer_destroy(w);
    return rc;
}

/* ---- random LoRA adapters ------------------------------------------------------ */

static const char *const lora_targets[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                           "ffn_gate", "ffn_up", "ffn_down", "output",
                                           "token_embd"};
#define N_LORA_TARGETS (sizeof lora_targets / sizeof lora_targets[0])
#define N_LAYER_TARGETS 7

/* Parses the target list into want[N_LORA_TARGETS]. */
static int parse_targets(const char *list, bool *want, char *err, size_t errsz)
{
    for (size_t t = 0; t < N_LORA_TARGETS; t++)
        want[t] = (!list || !list[0]) && t < N_LAYER_TARGETS;
    for (const char *p = list; p && *p;) {
        size_t n = strcspn(p, ",");
        size_t t = 0;
        while (t < N_LORA_TARGETS && (strlen(lora_targets[t]) != n || strncmp(p, lora_targets[t], n)))
            t++;
        if (t == N_LORA_TARGETS)
            return lms_errf(err, errsz, LMS_ERR_INVAL, "synth lora: unknown target '%.*s' (one of "
                            "attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down, "
                            "output, token_embd)", (int)n, p);
        want[t] = true;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* RMS of the values of up to 32 rows of t, spread over the tensor. */
static double tensor_rms(const gguf_tensor *t)
{
    const lms_to_float_fn conv = lms_kernels_get()->to_float[t->type];
    const size_t rb = lms_row_size(t->type, t->ne[0]);
    float *row = malloc((size_t)t->ne[0] * sizeof *row);
    if (!row || !conv || !rb) {
        free(row);
        return 0.02;
    }
    double ss = 0;
    int64_t n = 0, step = t->ne[1] > 32 ? t->ne[1] / 32 : 1;
    for (int64_t r = 0; r < t->ne[1]; r += step) {
        conv((const uint8_t *)t->data + (size_t)r * rb, row, t->ne[0]);
        for (int64_t i = 0; i < t->ne[0]; i++)
            ss += (double)row[i] * row[i];
        n += t->ne[0];
    }
    free(row);
    return n > 0 && ss > 0 ? sqrt(ss / (double)n) : 0.02;
}

/* Adds rows x n values of N(0, sd^2) as `name` with ne = [n, rows]. */
static int add_random(gguf_writer *w, const char *name, int64_t n, int64_t rows, double sd,
                      int type, uint64_t stream)
{
    const size_t cnt = (size_t)n * (size_t)rows;
    float *x = malloc(cnt * sizeof *x);
    if (!x)
        return LMS_ERR_NOMEM;
    for (size_t i = 0; i < cnt; i++)
        x[i] = (float)(sd * normal_at(stream, (uint64_t)i));
    if (type == LMS_TYPE_Q8_0 && n % LMS_QK8_0 != 0)
        type = LMS_TYPE_F16;
    size_t nb;
    void *data = lms_quant_rows(x, n, rows, type, &nb, NULL);
    free(x);
    if (!data)
        return LMS_ERR_NOMEM;
    int64_t ne[2] = {n, rows};
    int rc = gguf_writer_add_tensor(w, name, type, 2, ne, data, nb, false);
    free(data);
    return rc;
}

/* The pair of base tensor t (name `wname`; token_embd: is_embd). */
static int add_lora_pair(gguf_writer *w, const lms_synth_lora_params *p, const gguf_tensor *t,
                         const char *wname, bool is_embd, int type, uint64_t *stream)
{
    const double rank = p->rank, factor = p->alpha != 0.0f ? p->alpha / rank : 1.0;
    const double strength = p->strength > 0 ? p->strength : 0.5, rms = tensor_rms(t);
    char name[160];
    int rc;
    if (is_embd) { /* A [n_vocab][rank] N(0,1), B [n_embd][rank]: delta rms = strength * rms */
        snprintf(name, sizeof name, "%s.lora_a", wname);
        rc = add_random(w, name, p->rank, t->ne[1], 1.0, type, mix64(p->seed + ++*stream));
        snprintf(name, sizeof name, "%s.lora_b", wname);
        return rc ? rc : add_random(w, name, p->rank, t->ne[0],
                                    strength * rms / sqrt(rank) / factor, type,
                                    mix64(p->seed + ++*stream));
    }
    const double n_in = (double)t->ne[0];
    snprintf(name, sizeof name, "%s.lora_a", wname);
    rc = add_random(w, name, t->ne[0], p->rank, 1.0 / sqrt(n_in), type, mix64(p->seed + ++*stream));
    snprintf(name, sizeof name, "%s.lora_b", wname);
    return rc ? rc : add_random(w, name, p->rank, t->ne[1],
                                strength * rms * sqrt(n_in) / sqrt(rank) / factor, type,
                                mix64(p->seed + ++*stream));
}

static int lora_tensors(gguf_writer *w, const gguf_file *f, const lms_synth_lora_params *p,
                        const bool *want, int type, char *err, size_t errsz)
{
    uint32_t n_layer = 0;
    const char *arch = NULL;
    char key[96], wname[96];
    if (gguf_get_str(f, "general.architecture", &arch) < 0)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "synth lora: the model has no general.architecture");
    snprintf(key, sizeof key, "%s.block_count", arch);
    if (gguf_get_u32(f, key, &n_layer) < 0)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "synth lora: the model has no %s", key);
    uint64_t stream = 0;
    int rc = 0;
    for (size_t k = N_LAYER_TARGETS; k < N_LORA_TARGETS && rc == 0; k++) {
        if (!want[k])
            continue;
        snprintf(wname, sizeof wname, "%s.weight", lora_targets[k]);
        const gguf_tensor *t = gguf_find_tensor(f, wname);
        if (!t || t->n_dims != 2)
            return lms_errf(err, errsz, LMS_ERR_NOTFOUND, "synth lora: the model has no matrix "
                            "'%s'%s", wname, k == 7 ? " (its output head is tied to token_embd)" : "");
        rc = add_lora_pair(w, p, t, wname, k == 8, type, &stream);
    }
    for (uint32_t il = 0; il < n_layer && rc == 0; il++)
        for (size_t k = 0; k < N_LAYER_TARGETS && rc == 0; k++) {
            if (!want[k])
                continue;
            snprintf(wname, sizeof wname, "blk.%u.%s.weight", il, lora_targets[k]);
            const gguf_tensor *t = gguf_find_tensor(f, wname);
            if (!t || t->n_dims != 2)
                return lms_errf(err, errsz, LMS_ERR_NOTFOUND, "synth lora: the model has no "
                                "matrix '%s'", wname);
            rc = add_lora_pair(w, p, t, wname, false, type, &stream);
        }
    if (rc < 0)
        return lms_errf(err, errsz, rc, "synth lora: cannot build the adapter: %s", lms_strerror(rc));
    return 0;
}

int lms_synth_lora_write(const char *model_path, const lms_synth_lora_params *p, const char *path,
                         char *err, size_t errsz)
{
    bool want[N_LORA_TARGETS];
    int type = p->type ? lms_type_from_name(p->type) : LMS_TYPE_F32;
    if (type != LMS_TYPE_F32 && type != LMS_TYPE_F16 && type != LMS_TYPE_BF16 && type != LMS_TYPE_Q8_0)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "synth lora: type '%s': use f32, f16, bf16 or q8_0",
                        p->type);
    if (p->rank < 1 || p->rank > 4096)
        return lms_errf(err, errsz, LMS_ERR_INVAL, "synth lora: rank %d not in [1, 4096]", p->rank);
    int rc = parse_targets(p->targets, want, err, errsz);
    if (rc < 0)
        return rc;
    gguf_file *f;
    char gerr[384];
    if ((rc = gguf_open(model_path, &f, gerr, sizeof gerr)) < 0)
        return lms_errf(err, errsz, rc, "synth lora: %s", gerr);
    gguf_writer *w = gguf_writer_create();
    const char *arch = NULL;
    char name[64];
    snprintf(name, sizeof name, "synthetic LoRA r%d seed %llu", p->rank, (unsigned long long)p->seed);
    rc = w ? 0 : lms_errf(err, errsz, LMS_ERR_NOMEM, "synth lora: out of memory");
    if (rc == 0 && gguf_get_str(f, "general.architecture", &arch) == 0) {
        int m = gguf_writer_set_str(w, "general.architecture", arch);
        m |= gguf_writer_set_str(w, "general.type", "adapter");
        m |= gguf_writer_set_str(w, "general.name", name);
        m |= gguf_writer_set_str(w, "adapter.type", "lora");
        if (p->alpha != 0.0f)
            m |= gguf_writer_set_f32(w, "adapter.lora.alpha", p->alpha);
        if (m)
            rc = lms_errf(err, errsz, LMS_ERR_NOMEM, "synth lora: out of memory");
    }
    if (rc == 0)
        rc = lora_tensors(w, f, p, want, type, err, errsz);
    if (rc == 0)
        rc = gguf_writer_write(w, path, err, errsz);
    gguf_writer_destroy(w);
    gguf_close(f);
    return rc;
}
