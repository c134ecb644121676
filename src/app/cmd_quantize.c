/*
 * cmd_quantize.c - `lmserv quantize IN.gguf OUT.gguf TYPE`.
 *
 * Reads an F32/F16/BF16 (or already quantized) model and writes every 2-D
 * weight in the target type; 1-D tensors (norms, biases) stay F32. The
 * mixes users know from llama.cpp pick per-tensor types:
 *
 *   Q4_K_M / Q5_K_M  Q4_K / Q5_K everywhere, Q6_K for the output head (or
 *                    the tied embedding) and for attn_v and ffn_down of the
 *                    layers use_more_bits() selects (first and last eighth,
 *                    and every third in between).
 *
 * A row length that a K-quant block (256) cannot divide falls back to
 * Q5_0 / Q5_1 / Q8_0 (for Q4_K / Q5_K / Q6_K) or, if even 32 does not
 * divide it, to F16. The RMS error of each output type is reported.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/cli.h"
#include "base/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"

typedef struct qplan {
    const char *name;   /* as the user writes it */
    int base;           /* type of most matrices */
    int more;           /* type for the "more bits" tensors (-1: base) */
    int ftype;          /* general.file_type (llama.cpp's numbering) */
} qplan;

static const qplan plans[] = {
    {"F16", LMS_TYPE_F16, -1, 1},       {"BF16", LMS_TYPE_BF16, -1, 32},
    {"Q8_0", LMS_TYPE_Q8_0, -1, 7},     {"Q4_0", LMS_TYPE_Q4_0, LMS_TYPE_Q6_K, 2},
    {"Q4_1", LMS_TYPE_Q4_1, LMS_TYPE_Q6_K, 3}, {"Q5_0", LMS_TYPE_Q5_0, LMS_TYPE_Q6_K, 8},
    {"Q5_1", LMS_TYPE_Q5_1, LMS_TYPE_Q6_K, 9}, {"Q2_K", LMS_TYPE_Q2_K, LMS_TYPE_Q4_K, 10},
    {"Q3_K", LMS_TYPE_Q3_K, LMS_TYPE_Q5_K, 12}, {"Q4_K", LMS_TYPE_Q4_K, LMS_TYPE_Q6_K, 14},
    {"Q4_K_S", LMS_TYPE_Q4_K, LMS_TYPE_Q6_K, 14}, {"Q4_K_M", LMS_TYPE_Q4_K, LMS_TYPE_Q6_K, 15},
    {"Q5_K", LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, 16}, {"Q5_K_S", LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, 16},
    {"Q5_K_M", LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, 17}, {"Q6_K", LMS_TYPE_Q6_K, -1, 18},
};

static bool use_more_bits(int il, int n_layer)
{
    return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

static bool is_mix(const qplan *p)
{
    return strstr(p->name, "_M") != NULL;
}

/* The type for one tensor under a plan. */
static int pick_type(const qplan *p, const char *name, int n_layer, bool has_output)
{
    bool head = !strcmp(name, "output.weight") || (!has_output && !strcmp(name, "token_embd.weight"));
    int il = -1;
    if (sscanf(name, "blk.%d.", &il) != 1)
        il = -1;
    if (head && p->more >= 0)
        return LMS_TYPE_Q6_K;
    if (is_mix(p) && il >= 0 && (strstr(name, "attn_v.weight") || strstr(name, "ffn_down.weight")) &&
        use_more_bits(il, n_layer))
        return p->more;
    return p->base;
}

static int fallback(int type, int64_t ne0)
{
    if (ne0 % lms_type_get(type)->blck_size == 0)
        return type;
    int alt = type == LMS_TYPE_Q6_K   ? LMS_TYPE_Q8_0
              : type == LMS_TYPE_Q5_K ? LMS_TYPE_Q5_1
              : type == LMS_TYPE_Q4_K ? LMS_TYPE_Q5_0
              : type == LMS_TYPE_Q2_K || type == LMS_TYPE_Q3_K ? LMS_TYPE_Q4_0
                                                               : LMS_TYPE_F16;
    return ne0 % lms_type_get(alt)->blck_size == 0 ? alt : LMS_TYPE_F16;
}

typedef struct qstats {
    double se[LMS_TYPE_COUNT], ss[LMS_TYPE_COUNT];
    int64_t n[LMS_TYPE_COUNT];
} qstats;

/* Converts one tensor; returns malloc'd data of *n_bytes or NULL. */
static void *convert(const gguf_tensor *t, int type, size_t *n_bytes, qstats *st)
{
    const lms_kernel_table *k = lms_kernels_get();
    int64_t ne0 = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
    size_t in_row = lms_row_size(t->type, ne0), out_row = lms_row_size(type, ne0);
    float *f = malloc((size_t)ne0 * sizeof *f), *back = malloc((size_t)ne0 * sizeof *back);
    uint8_t *out = malloc(out_row * (size_t)rows);
    if (!f || !back || !out || !k->to_float[t->type] || !k->from_float[type]) {
        free(f), free(back), free(out);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r * in_row;
        uint8_t *dst = out + (size_t)r * out_row;
        if (t->type == LMS_TYPE_F32)
            memcpy(f, src, (size_t)ne0 * sizeof *f);
        else
            k->to_float[t->type](src, f, ne0);
        if (type == LMS_TYPE_F32)
            memcpy(dst, f, (size_t)ne0 * sizeof *f);
        else
            k->from_float[type](f, dst, ne0);
        if (type == LMS_TYPE_F32)
            continue;
        k->to_float[type](dst, back, ne0);
        for (int64_t i = 0; i < ne0; i++) {
            double d = (double)back[i] - f[i];
            st->se[type] += d * d;
            st->ss[type] += (double)f[i] * f[i];
        }
        st->n[type] += ne0;
    }
    free(f), free(back);
    *n_bytes = out_row * (size_t)rows;
    return out;
}

static bool skip_ftype(const char *key)
{
    return !strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version");
}

static int quantize_file(const gguf_file *in, const qplan *p, const char *out_path, qstats *st)
{
    char err[512];
    const char *arch = "llama";
    char key[96];
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
        bool matrix = t->n_dims >= 2;
        int type = matrix ? fallback(pick_type(p, t->name.p, (int)n_layer, has_output), t->ne[0])
                          : LMS_TYPE_F32;
        size_t nb;
        void *data = convert(t, type, &nb, st);
        if (!data) {
            fprintf(stderr, "lmserv quantize: cannot convert '%s' from %s to %s\n", t->name.p,
                    lms_type_get(t->type)->name, lms_type_get(type)->name);
            rc = LMS_ERR_UNSUPPORTED;
            break;
        }
        rc = gguf_writer_add_tensor(w, t->name.p, type, t->n_dims, t->ne, data, nb, false);
        free(data);
    }
    if (rc == 0 && (rc = gguf_writer_write(w, out_path, err, sizeof err)) < 0)
        fprintf(stderr, "lmserv quantize: %s\n", err);
    gguf_writer_destroy(w);
    return rc;
}

int cmd_quantize(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: lmserv quantize IN.gguf OUT.gguf TYPE\n  TYPE:");
        for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++)
            fprintf(stderr, " %s", plans[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    const qplan *p = NULL;
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++)
        if (!strcasecmp(argv[3], plans[i].name))
            p = &plans[i];
    if (!p) {
        fprintf(stderr, "lmserv quantize: unknown type '%s'\n", argv[3]);
        return 2;
    }
    char err[512];
    gguf_file *in;
    if (gguf_open(argv[1], &in, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv quantize: %s\n", err);
        return 1;
    }
    qstats st = {0};
    int rc = quantize_file(in, p, argv[2], &st);
    gguf_close(in);
    if (rc < 0)
        return 1;
    printf("wrote %s (%s)\n%-6s %12s %12s %10s\n", argv[2], p->name, "type", "values", "rms error",
           "rel rms");
    for (int ty = 0; ty < LMS_TYPE_COUNT; ty++)
        if (st.n[ty])
            printf("%-6s %12lld %12.6g %10.6g\n", lms_type_get(ty)->name, (long long)st.n[ty],
                   sqrt(st.se[ty] / (double)st.n[ty]),
                   st.ss[ty] > 0 ? sqrt(st.se[ty] / st.ss[ty]) : 0.0);
    return 0;
}
