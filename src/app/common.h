/*
 * common.h - what several subcommands share: loading a model with an
 * engine context, reading token lists.
 */
#ifndef LMS_APP_COMMON_H
#define LMS_APP_COMMON_H

#include <stdint.h>

#include "engine/forward.h"
#include "model/lora.h"
#include "model/model.h"

/* Loads the model and creates a context (n_ctx <= 0: min(train, 4096)).
 * Prints the error and returns < 0 on failure. */
int app_load(const char *path, int32_t n_ctx, int32_t n_batch, int32_t n_threads, lms_model **m,
             lms_ctx **c);

/* Context options shared by run, bench, eval and info:
 *   --gpu-layers auto|all|N   --vram-margin-mb MB   --vram-budget-mb MB
 *   --kv-type f16|q8_0|q4_0 */
typedef struct app_gpu_opts {
    int32_t gpu_layers; /* 0 = CPU, N, LMS_GPU_LAYERS_AUTO, LMS_GPU_LAYERS_ALL */
    int32_t vram_margin_mb, vram_budget_mb;
    int kv_type;        /* 0 (F16), LMS_TYPE_Q8_0 or LMS_TYPE_Q4_0 */
} app_gpu_opts;

/* The KV cache types --kv-type takes (as Ollama's OLLAMA_KV_CACHE_TYPE and
 * llama.cpp's -ctk/-ctv): f16 (default), q8_0 (53% of f16's bytes), q4_0
 * (28%; its rounding error is several times q8_0's). */
#define APP_KV_TYPES "f16, q8_0 or q4_0"

#define APP_GPU_USAGE \
    "[--gpu-layers auto|all|N] [--vram-margin-mb MB] [--vram-budget-mb MB] " \
    "[--kv-type f16|q8_0|q4_0]"

/* The cache type named by a --kv-type value (case-insensitive): 0 for f16
 * (the context's default), LMS_TYPE_Q8_0 or LMS_TYPE_Q4_0; -1 if unknown. */
int app_kv_type(const char *name);

/* If argv[*i] is one of the GPU options, parses it and its value (advancing
 * *i): 1 when taken, 0 when not a GPU option, -1 (message printed) on a bad
 * value. */
int app_gpu_arg(int argc, char **argv, int *i, app_gpu_opts *o);
/* Copies the options into context parameters. */
void app_gpu_apply(const app_gpu_opts *o, lms_ctx_params *p);
/* app_load with GPU placement (gpu may be NULL); prints the plan to stderr
 * when the GPU is used. */
int app_load_gpu(const char *path, int32_t n_ctx, int32_t n_batch, int32_t n_threads,
                 const app_gpu_opts *gpu, lms_model **m, lms_ctx **c);

/* A whole text file of at most 1 MiB, NUL-terminated (*n_out: its bytes,
 * may be NULL); NULL with errno set (EFBIG past 1 MiB). Free with free(). */
char *app_read_file(const char *path, size_t *n_out);

/* The output's shape on the command line (run, chat), as llama.cpp's flags:
 *   --grammar TEXT  --grammar-file FILE     a GBNF grammar (engine/gbnf.h)
 *   -j / --json-schema TEXT  --json-schema-file FILE   a JSON schema
 *   --json                                  any one JSON object
 * At most one of them; app_shape_compile turns it into generation params. */
typedef struct app_shape_opts {
    const char *grammar, *grammar_file, *schema, *schema_file;
    bool json;
    struct lms_gbnf *compiled_grammar;     /* app_shape_compile's, freed by app_shape_free */
    struct lms_jschema *compiled_schema;
} app_shape_opts;

#define APP_SHAPE_USAGE \
    "[--grammar GBNF | --grammar-file F | -j SCHEMA | --json-schema-file F | --json]"

/* As app_gpu_arg, for the shape options. */
int app_shape_arg(int argc, char **argv, int *i, app_shape_opts *o);
/* Compiles the chosen shape (files read) and sets json / schema / grammar
 * of gp. Prints the error (the grammar's line and column, the schema's
 * keyword) and returns < 0 on failure. */
struct lms_gen_params;
int app_shape_compile(app_shape_opts *o, struct lms_gen_params *gp);
void app_shape_free(app_shape_opts *o);

/* LoRA adapters on the command line (run, eval), as llama.cpp's flags:
 *   --lora FILE               scale 1
 *   --lora-scaled FILE SCALE
 * repeatable up to LMS_LORA_MAX times. */
typedef struct app_lora_opts {
    const char *path[LMS_LORA_MAX];
    float scale[LMS_LORA_MAX];
    int n;
    lms_lora *loaded[LMS_LORA_MAX]; /* app_lora_load's, released by app_lora_release */
} app_lora_opts;

#define APP_LORA_USAGE "[--lora FILE] [--lora-scaled FILE SCALE]"

/* If argv[*i] is --lora or --lora-scaled, parses it (advancing *i): 1 when
 * taken, 0 when not a LoRA option, -1 (message printed) on a bad value. */
int app_lora_arg(int argc, char **argv, int *i, app_lora_opts *o);
/* Loads the adapters for m and fills set (empty when none were named).
 * Refuses a context with GPU layers. Prints the error and returns < 0 on
 * failure (nothing left loaded). */
int app_lora_load(app_lora_opts *o, const lms_model *m, const lms_ctx *c, lms_lora_set *set);
void app_lora_release(app_lora_opts *o);

/* Parses "1 2 3" (spaces, commas or newlines) into a malloc'd array.
 * Prints the error and returns < 0 on a bad list. */
int app_parse_tokens(const char *s, int32_t **out, int32_t *n_out);

#endif
