/*
 * cmd_info.c - `lmserv info`: metadata, tensors by type, parameter count and
 * the memory a context of N tokens needs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/args.h"
#include "app/cli.h"
#include "app/common.h"
#include "base/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/model.h"

static void print_kv(const gguf_kv *kv)
{
    printf("  %-44s ", kv->key.p);
    switch (kv->type) {
    case GGUF_VT_STRING:
        for (size_t i = 0; i < kv->v.s.n && i < 60; i++) {
            unsigned char c = (unsigned char)kv->v.s.p[i];
            if (c < 0x20)
                printf("\\x%02x", c);
            else
                putchar(c);
        }
        printf("%s\n", kv->v.s.n > 60 ? "..." : "");
        return;
    case GGUF_VT_ARRAY:
        printf("[%s x %llu]\n", gguf_vtype_name(kv->arr_type), (unsigned long long)kv->n);
        return;
    case GGUF_VT_F32:
    case GGUF_VT_F64:
        printf("%g\n", kv->v.f);
        return;
    case GGUF_VT_BOOL:
        printf("%s\n", kv->v.u ? "true" : "false");
        return;
    default:
        printf("%lld\n", (long long)kv->v.i);
    }
}

static void print_tensors(const gguf_file *f)
{
    int64_t count[LMS_TYPE_COUNT] = {0};
    size_t bytes[LMS_TYPE_COUNT] = {0};
    int64_t n_params = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        count[t->type]++;
        bytes[t->type] += t->n_bytes;
        n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    printf("tensors: %llu, parameters: %lld (%.2f M)\n", (unsigned long long)f->n_tensors,
           (long long)n_params, (double)n_params / 1e6);
    for (int ty = 0; ty < LMS_TYPE_COUNT; ty++)
        if (count[ty])
            printf("  %-6s %4lld tensors  %10.2f MiB\n", lms_type_get(ty)->name, (long long)count[ty],
                   (double)bytes[ty] / (1 << 20));
}

/* An embedding model (bert, nomic-bert): no KV cache and no output head. */
static void print_encoder(const lms_model *m)
{
    const lms_hparams *hp = &m->hp;
    char kind[96];
    if (hp->pooling == LMS_POOLING_RANK)
        snprintf(kind, sizeof kind, "a reranker: [CLS] through its classification head, %d "
                 "score%s", hp->n_cls_out, hp->n_cls_out == 1 ? "" : "s");
    else
        snprintf(kind, sizeof kind, "embedding model: bidirectional attention, %s pooling, "
                 "L2-normalized", lms_pooling_name(hp->pooling));
    printf("model: %s\n  arch %s (%s), n_vocab %d, n_embd %d, n_layer %d, n_head %d, head_dim %d, "
           "n_ff %d, at most %d tokens an input\n  positions %s, LayerNorm eps %g, no output head\n",
           m->name, hp->arch, kind,
           hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_head, hp->head_dim, hp->n_ff,
           hp->n_ctx_train, hp->encoder_rope ? "by NeoX RoPE" : "learned (position_embd)",
           hp->norm_eps);
    size_t act = (size_t)hp->n_ctx_train * ((size_t)hp->n_embd * 6 + (size_t)hp->n_ff * 2) * 4;
    printf("memory: weights %.2f MiB (mapped), compute buffers ~%.2f MiB (no KV cache)\n",
           (double)m->weight_bytes / (1 << 20), (double)act / (1 << 20));
}

static void print_model(const lms_model *m, int64_t n_ctx)
{
    const lms_hparams *hp = &m->hp;
    if (hp->is_encoder) {
        print_encoder(m);
        return;
    }
    if (n_ctx <= 0)
        n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    printf("model: %s\n  arch %s, n_vocab %d, n_embd %d, n_layer %d, n_head %d, n_head_kv %d, "
           "head_dim %d, n_ff %d, n_ctx_train %d\n  rope %s base %g dims %d scale %g, rms_eps %g, "
           "output %s\n",
           m->name, hp->arch, hp->n_vocab, hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv,
           hp->head_dim, hp->n_ff, hp->n_ctx_train, hp->rope_type == LMS_ROPE_NEOX ? "neox" : "norm",
           hp->rope_base, hp->n_rot, 1.0 / hp->rope_freq_scale, hp->rms_eps,
           m->output.data == m->tok_embd.data ? "tied to token_embd" : "separate");
    if (hp->pooling == LMS_POOLING_RANK)
        printf("  a reranker (/v1/rerank): the last token's state through its classification "
               "head, %d score%s (softmax)\n", hp->n_cls_out, hp->n_cls_out == 1 ? "" : "s");
    else if (hp->pooling >= LMS_POOLING_MEAN && hp->pooling <= LMS_POOLING_LAST)
        printf("  an embedding model: /v1/embeddings pools by %s by default\n",
               lms_pooling_name(hp->pooling));
    size_t kv = lms_model_kv_bytes(hp, n_ctx);
    size_t act = (size_t)512 * ((size_t)hp->n_embd * 6 + (size_t)hp->n_ff * 2) * 4 +
                 (size_t)hp->n_vocab * 4;
    printf("memory for a %lld-token context:\n  weights %.2f MiB (mapped), KV cache %.2f MiB (f16), "
           "compute buffers ~%.2f MiB, total ~%.2f MiB\n",
           (long long)n_ctx, (double)m->weight_bytes / (1 << 20), (double)kv / (1 << 20),
           (double)act / (1 << 20), (double)(m->weight_bytes + kv + act) / (1 << 20));
}

int cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    int64_t n_ctx = 0;
    app_gpu_opts gpu = {0};
    for (int i = 1; i < argc; i++) {
        int g = app_gpu_arg(argc, argv, &i, &gpu);
        if (g < 0)
            return 2;
        if (g > 0)
            continue;
        if (!strcmp(argv[i], "-c") && i + 1 < argc) {
            if (!args_int("-c", argv[++i], 1, 1 << 22, &n_ctx))
                return 2;
        } else if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            path = argv[++i];
        } else if (!path && argv[i][0] != '-') {
            path = argv[i];
        } else {
            fprintf(stderr, "lmserv info: bad option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: lmserv info MODEL [-c CTX] " APP_GPU_USAGE "\n");
        return 2;
    }
    char err[512];
    gguf_file *f;
    if (hf_open_any(path, 0, &f, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv info: %s\n", err);
        return 1;
    }
    if (f->release) /* a Hugging Face folder: the metadata its conversion would have */
        printf("folder: %s (Hugging Face, read as GGUF)\nmetadata: %llu keys\n", f->path,
               (unsigned long long)f->n_kv);
    else
        printf("file: %s (GGUF v%u, %.2f MiB)\nmetadata: %llu keys\n", path, f->version,
               (double)f->size / (1 << 20), (unsigned long long)f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++)
        print_kv(&f->kv[i]);
    print_tensors(f);
    const char *type = NULL, *arch = NULL;
    const bool adapter = gguf_get_str(f, "general.type", &type) == 0 && type &&
                         !strcmp(type, "adapter");
    if (adapter) {
        gguf_get_str(f, "general.architecture", &arch);
        printf("a LoRA adapter for %s models: use it with --lora FILE (run, chat, eval, serve)\n",
               arch ? arch : "(no architecture named)");
    }
    gguf_close(f);
    if (adapter)
        return 0;
    lms_model *m;
    if (lms_model_load(path, &m, err, sizeof err) < 0) {
        printf("not loadable as a model: %s\n", err);
        return 0;
    }
    print_model(m, n_ctx);
    int rc = 0;
    if (gpu.gpu_layers != 0) {
        /* the plan of a real context (its allocations are what it reports) */
        lms_ctx_params p = {.n_ctx = (int32_t)(n_ctx > 0 ? n_ctx
                                               : m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096),
                            .n_batch = 512, .n_seq = 1};
        if (p.n_batch > p.n_ctx)
            p.n_batch = p.n_ctx;
        app_gpu_apply(&gpu, &p);
        lms_ctx *c;
        if (lms_ctx_create(m, &p, &c, err, sizeof err) < 0) {
            fprintf(stderr, "lmserv info: %s\n", err);
            rc = 1;
        } else {
            const lms_gpu_plan *pl = lms_ctx_gpu_plan(c);
            char line[512];
            if (pl)
                lms_gpu_plan_format(pl, line, sizeof line);
            else
                snprintf(line, sizeof line, "gpu: none used (all %d layers on the CPU)",
                         m->hp.n_layer);
            printf("placement for a %d-token context, batch %d:\n  %s\n", p.n_ctx, p.n_batch, line);
            lms_ctx_destroy(c);
        }
    }
    lms_model_free(m);
    return rc;
}
