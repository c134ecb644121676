/*
 * cmd_quantize.c - `lmserv quantize IN.gguf OUT.gguf TYPE` (IN may also be a
 * Hugging Face model folder, model/hf.h).
 *
 * Reads a model (any type the kernels can dequantize, normally F32, F16 or
 * BF16) and writes every matrix in the type the plan picks (quant_plan.h);
 * 1-D tensors stay F32. Metadata is copied, with general.file_type set.
 * Prints the RMS error of each output type.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "base/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/quant_plan.h"

/* Dequantizes a whole tensor to floats (malloc'd), NULL on failure. */
static float *to_floats(const gguf_tensor *t, int64_t *n_rows)
{
    const lms_kernel_table *k = lms_kernels_get();
    int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    size_t row = lms_row_size(t->type, ne0);
    float *f = malloc((size_t)(ne0 * rows) * sizeof *f);
    if (!f || (t->type != LMS_TYPE_F32 && !k->to_float[t->type])) {
        free(f);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r * row;
        if (t->type == LMS_TYPE_F32)
            memcpy(f + r * ne0, src, row);
        else
            k->to_float[t->type](src, f + r * ne0, ne0);
    }
    *n_rows = rows;
    return f;
}

static bool skip_ftype(const char *key)
{
    return !strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version");
}

static int add_tensor(gguf_writer *w, const gguf_tensor *t, int type, lms_quant_err *st)
{
    int64_t rows;
    float *f = to_floats(t, &rows);
    size_t nb;
    void *data = f ? lms_quant_rows(f, t->ne[0], rows, type, &nb, st) : NULL;
    free(f);
    if (!data) {
        fprintf(stderr, "lmserv quantize: cannot convert '%s' from %s to %s\n", t->name.p,
                lms_type_get(t->type)->name, lms_type_get(type)->name);
        return LMS_ERR_UNSUPPORTED;
    }
    int rc = gguf_writer_add_tensor(w, t->name.p, type, t->n_dims, t->ne, data, nb, false);
    free(data);
    return rc;
}

static int quantize_file(const gguf_file *in, const lms_quant_plan *p, const char *out_path,
                         lms_quant_err *st)
{
    char err[512], key[96];
    const char *arch = "llama";
    uint32_t n_layer = 0;
    gguf_get_str(in, "general.architecture", &arch);
    snprintf(key, sizeof key, "%s.block_count", arch);
    gguf_get_u32(in, key, &n_layer);
    bool has_output = gguf_find_tensor(in, "output.weight") != NULL;
    gguf_writer *w = gguf_writer_create();
    int rc = w ? gguf_writer_copy_kv(w, in, skip_ftype) : LMS_ERR_NOMEM;
    if (rc == 0)
        rc = gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (rc == 0)
        rc = gguf_writer_set_u32(w, "general.file_type", (uint32_t)p->ftype);
    for (uint64_t i = 0; i < in->n_tensors && rc == 0; i++) {
        const gguf_tensor *t = &in->tensors[i];
        int type = lms_quant_pick(p, t->name.p, t->n_dims, t->ne[0], (int)n_layer, has_output);
        rc = add_tensor(w, t, type, st);
    }
    if (rc == 0 && (rc = gguf_writer_write(w, out_path, err, sizeof err)) < 0)
        fprintf(stderr, "lmserv quantize: %s\n", err);
    gguf_writer_destroy(w);
    return rc;
}

int cmd_quantize(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: lmserv quantize IN.gguf OUT.gguf TYPE\n  TYPE: %s\n",
                lms_quant_plan_names());
        return 2;
    }
    const lms_quant_plan *p = lms_quant_plan_find(argv[3]);
    if (!p) {
        fprintf(stderr, "lmserv quantize: unknown type '%s' (one of: %s)\n", argv[3],
                lms_quant_plan_names());
        return 2;
    }
    char err[512];
    gguf_file *in;
    if (hf_open_any(argv[1], 0, &in, err, sizeof err) < 0) { /* GGUF or a Hugging Face folder */
        fprintf(stderr, "lmserv quantize: %s\n", err);
        return 1;
    }
    lms_quant_err st = {0};
    int rc = quantize_file(in, p, argv[2], &st);
    gguf_close(in);
    if (rc < 0)
        return 1;
    printf("wrote %s (%s)\n%-6s %12s %12s %10s\n", argv[2], p->name, "type", "values", "rms error",
           "rel rms");
    for (int ty = 0; ty < LMS_TYPE_COUNT; ty++)
        if (st.n[ty])
            printf("%-6s %12lld %12.6g %10.6g\n", lms_type_get(ty)->name, (long long)st.n[ty],
                   sqrt(st.se[ty] / (double)st.n[ty]), st.ss[ty] > 0 ? sqrt(st.se[ty] / st.ss[ty]) : 0.0);
    return 0;
}
