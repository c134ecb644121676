/*
 * common.c - see common.h.
 */
#include "app/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>
#include <strings.h>

#include "app/args.h"
#include "base/err.h"
#include "engine/gbnf.h"
#include "engine/generate.h"
#include "engine/jsonschema.h"
#include "kernels/kernels.h"

int app_kv_type(const char *name)
{
    if (!strcasecmp(name, "f16"))
        return 0;
    if (!strcasecmp(name, "q8_0"))
        return LMS_TYPE_Q8_0;
    if (!strcasecmp(name, "q4_0"))
        return LMS_TYPE_Q4_0;
    return -1;
}

int app_gpu_arg(int argc, char **argv, int *i, app_gpu_opts *o)
{
    const char *a = argv[*i], *v;
    int64_t n;
    bool layers = !strcmp(a, "--gpu-layers"), margin = !strcmp(a, "--vram-margin-mb"),
         budget = !strcmp(a, "--vram-budget-mb"), kv = !strcmp(a, "--kv-type");
    if (!layers && !margin && !budget && !kv)
        return 0;
    if (!(v = args_value(argc, argv, i)))
        return -1;
    if (kv) {
        const int t = app_kv_type(v);
        if (t < 0) {
            fprintf(stderr, "lmserv: --kv-type '%s': use " APP_KV_TYPES "\n", v);
            return -1;
        }
        o->kv_type = t;
        return 1;
    }
    if (layers)
        return args_gpu_layers(a, v, &o->gpu_layers) ? 1 : -1;
    if (!args_int(a, v, 0, 1 << 20, &n))
        return -1;
    if (margin)
        o->vram_margin_mb = n > 0 ? (int32_t)n : 1; /* 0 would mean "default" */
    else
        o->vram_budget_mb = (int32_t)n;
    return 1;
}

int app_lora_arg(int argc, char **argv, int *i, app_lora_opts *o)
{
    const char *a = argv[*i];
    const bool scaled = !strcmp(a, "--lora-scaled");
    if (!scaled && strcmp(a, "--lora") != 0)
        return 0;
    if (o->n == LMS_LORA_MAX) {
        fprintf(stderr, "lmserv: at most %d LoRA adapters\n", LMS_LORA_MAX);
        return -1;
    }
    const char *path = args_value(argc, argv, i);
    double scale = 1.0;
    if (!path)
        return -1;
    if (scaled && (*i + 1 >= argc || !args_float(a, argv[++*i], -1e6, 1e6, &scale)))
        return -1;
    o->path[o->n] = path;
    o->scale[o->n++] = (float)scale;
    return 1;
}

int app_lora_load(app_lora_opts *o, const lms_model *m, const lms_ctx *c, lms_lora_set *set)
{
    char err[512];
    lms_lora_use uses[LMS_LORA_MAX];
    (void)c; /* any placement: the GPU layers apply adapters too */
    memset(set, 0, sizeof *set);
    if (o->n == 0)
        return 0;
    for (int k = 0; k < o->n; k++) {
        int rc = lms_lora_load(o->path[k], m, &o->loaded[k], err, sizeof err);
        if (rc < 0) {
            fprintf(stderr, "lmserv: %s\n", err);
            app_lora_release(o);
            return rc;
        }
        uses[k] = (lms_lora_use){o->loaded[k], o->scale[k]};
        fprintf(stderr, "lora: %s (%d tensors, rank %d, alpha %g) scale %g\n",
                lms_lora_name(o->loaded[k]), lms_lora_n_tensors(o->loaded[k]),
                lms_lora_rank(o->loaded[k]), (double)lms_lora_alpha(o->loaded[k]),
                (double)o->scale[k]);
    }
    int rc = lms_lora_set_make(set, uses, o->n, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "lmserv: %s\n", err);
        app_lora_release(o);
    }
    return rc;
}

void app_lora_release(app_lora_opts *o)
{
    for (int k = 0; k < LMS_LORA_MAX; k++) {
        lms_lora_release(o->loaded[k]);
        o->loaded[k] = NULL;
    }
}

void app_gpu_apply(const app_gpu_opts *o, lms_ctx_params *p)
{
    if (!o)
        return;
    p->gpu_layers = o->gpu_layers;
    p->kv_type = o->kv_type;
    p->vram_margin_mb = o->vram_margin_mb;
    p->vram_budget_mb = o->vram_budget_mb;
}

int app_load(const char *path, int32_t n_ctx, int32_t n_batch, int32_t n_threads, lms_model **m,
             lms_ctx **c)
{
    return app_load_gpu(path, n_ctx, n_batch, n_threads, NULL, m, c);
}

int app_load_gpu(const char *path, int32_t n_ctx, int32_t n_batch, int32_t n_threads,
                 const app_gpu_opts *gpu, lms_model **m, lms_ctx **c)
{
    char err[512];
    int rc = lms_model_load(path, m, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "lmserv: %s\n", err);
        return rc;
    }
    if ((*m)->hp.is_encoder) { /* no output head: the decoder's commands cannot use it */
        fprintf(stderr,
                "lmserv: model '%s' is an embedding model (%s): it computes embeddings only "
                "(lmserv serve: /v1/embeddings, /api/embed), not text\n",
                (*m)->name, (*m)->hp.arch);
        lms_model_free(*m);
        *m = NULL;
        return LMS_ERR_UNSUPPORTED;
    }
    if (n_ctx <= 0)
        n_ctx = (*m)->hp.n_ctx_train < 4096 ? (*m)->hp.n_ctx_train : 4096;
    lms_ctx_params p = {.n_ctx = n_ctx, .n_batch = n_batch > 0 ? n_batch : 512, .n_seq = 1,
                        .n_threads = n_threads};
    if (p.n_batch > n_ctx)
        p.n_batch = n_ctx;
    app_gpu_apply(gpu, &p);
    rc = lms_ctx_create(*m, &p, c, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "lmserv: %s\n", err);
        lms_model_free(*m);
        *m = NULL;
    } else if (lms_ctx_gpu_plan(*c)) {
        char line[512];
        lms_gpu_plan_format(lms_ctx_gpu_plan(*c), line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    return rc;
}

int app_parse_tokens(const char *s, int32_t **out, int32_t *n_out)
{
    int32_t n = 0, cap = 64;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v)
        return LMS_ERR_NOMEM;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long long t = strtoll(p, &end, 10);
        if (end == p || errno || t < 0 || t > INT32_MAX) {
            fprintf(stderr, "lmserv: bad token id near '%.20s'\n", p);
            free(v);
            return LMS_ERR_INVAL;
        }
        if (n == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return LMS_ERR_NOMEM;
            }
            v = nv;
        }
        v[n++] = (int32_t)t;
        p = end;
    }
    *out = v;
    *n_out = n;
    return 0;
}

/* ---- the output's shape ------------------------------------------------------------ */

int app_shape_arg(int argc, char **argv, int *i, app_shape_opts *o)
{
    const char *a = argv[*i];
    const char **slot = !strcmp(a, "--grammar")                               ? &o->grammar
                        : !strcmp(a, "--grammar-file")                        ? &o->grammar_file
                        : !strcmp(a, "-j") || !strcmp(a, "--json-schema")     ? &o->schema
                        : !strcmp(a, "--json-schema-file")                    ? &o->schema_file
                                                                              : NULL;
    if (!strcmp(a, "--json")) {
        o->json = true;
        return 1;
    }
    if (!slot)
        return 0;
    return (*slot = args_value(argc, argv, i)) ? 1 : -1;
}

char *app_read_file(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc((1u << 20) + 1);
    size_t n = buf ? fread(buf, 1, (1u << 20) + 1, f) : 0;
    const bool big = n > (1u << 20);
    fclose(f);
    if (!buf || big) {
        free(buf);
        errno = buf ? EFBIG : ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    if (n_out)
        *n_out = n;
    return buf;
}

int app_shape_compile(app_shape_opts *o, lms_gen_params *gp)
{
    const int given = (o->grammar != NULL) + (o->grammar_file != NULL) + (o->schema != NULL) +
                      (o->schema_file != NULL) + o->json;
    if (given > 1) {
        fprintf(stderr, "lmserv: give one of --grammar, --grammar-file, --json-schema, "
                        "--json-schema-file and --json\n");
        return -1;
    }
    const char *file = o->grammar_file ? o->grammar_file : o->schema_file;
    char *text = NULL, err[256];
    size_t n = 0;
    if (file && !(text = app_read_file(file, &n))) {
        fprintf(stderr, "lmserv: cannot read '%s': %s\n", file, strerror(errno));
        return -1;
    }
    const char *src = text ? text : o->grammar ? o->grammar : o->schema;
    if (src && !text)
        n = strlen(src);
    int rc = 0;
    if (o->grammar || o->grammar_file) {
        if (!(o->compiled_grammar = lms_gbnf_compile(src, n, err, sizeof err))) {
            fprintf(stderr, "lmserv: %s%s%s\n", file ? file : "", file ? ": " : "", err);
            rc = -1;
        }
        gp->grammar = o->compiled_grammar;
    } else if (o->schema || o->schema_file) {
        if (!(o->compiled_schema = lms_jschema_compile(src, n, err, sizeof err))) {
            fprintf(stderr, "lmserv: the JSON schema%s%s: %s\n", file ? " in " : "",
                    file ? file : "", err);
            rc = -1;
        }
        gp->json = true;
        gp->schema = o->compiled_schema;
    } else {
        gp->json = o->json;
    }
    free(text);
    return rc;
}

void app_shape_free(app_shape_opts *o)
{
    free(o->compiled_grammar);
    free(o->compiled_schema);
    o->compiled_grammar = NULL;
    o->compiled_schema = NULL;
}
