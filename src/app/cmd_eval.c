/*
 * cmd_eval.c - `lmserv eval`: logits for a token list, as raw float32 LE.
 *
 * The tokens are used exactly as given (no BOS is added) and go through one
 * forward call, like the golden runs of the test data.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/args.h"
#include "app/cli.h"
#include "app/common.h"
#include "base/err.h"

int cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *tokens = NULL, *out = NULL;
    int64_t threads = 0;
    bool all = false;
    app_gpu_opts gpu = {0};
    app_lora_opts lo = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int g = app_gpu_arg(argc, argv, &i, &gpu);
        if (g == 0)
            g = app_lora_arg(argc, argv, &i, &lo);
        if (g < 0)
            return 2;
        if (g > 0)
            continue;
        if (!strcmp(a, "-m") && (model = args_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--tokens") && (tokens = args_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "--logits") && (out = args_value(argc, argv, &i)))
            continue;
        if (!strcmp(a, "-t") && i + 1 < argc && args_int("-t", argv[++i], 0, 1024, &threads))
            continue;
        if (!strcmp(a, "--all-positions")) {
            all = true;
            continue;
        }
        fprintf(stderr, "lmserv eval: bad option '%s'\n", a);
        return 2;
    }
    if (!model || !tokens || !out) {
        fprintf(stderr, "usage: lmserv eval -m MODEL --tokens \"1 2 3\" --logits OUT.f32 "
                        "[--all-positions] " APP_LORA_USAGE "\n");
        return 2;
    }
    int32_t *toks, n;
    if (app_parse_tokens(tokens, &toks, &n) < 0)
        return 1;
    if (n == 0) {
        fprintf(stderr, "lmserv eval: --tokens is empty\n");
        free(toks);
        return 1;
    }
    lms_model *m;
    lms_ctx *c;
    if (app_load_gpu(model, n < 16 ? 16 : n, n, (int32_t)threads, &gpu, &m, &c) < 0) {
        free(toks);
        return 1;
    }
    lms_lora_set lora;
    if (app_lora_load(&lo, m, c, &lora) < 0) {
        free(toks);
        lms_ctx_destroy(c);
        lms_model_free(m);
        return 1;
    }
    int rc = 1;
    int32_t nv = m->hp.n_vocab, n_out = all ? n : 1;
    float *logits = malloc((size_t)n_out * (size_t)nv * sizeof *logits);
    bool *want = calloc((size_t)n, sizeof *want);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    lms_kv_seq seq = {0}, **seqs = malloc((size_t)n * sizeof *seqs);
    const lms_lora_set **sets = malloc((size_t)n * sizeof *sets);
    if (!logits || !want || !pos || !seqs || !sets)
        goto done;
    for (int32_t i = 0; i < n; i++) {
        pos[i] = i;
        seqs[i] = &seq;
        sets[i] = &lora;
        want[i] = all || i == n - 1;
        if (toks[i] >= nv) {
            fprintf(stderr, "lmserv eval: token id %d at position %d is not in [0, %d)\n", toks[i], i, nv);
            goto done;
        }
    }
    int err = lms_kv_seq_reserve(lms_ctx_kv(c), &seq, n);
    lms_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .logits = want,
                   .lora = lora.n > 0 ? sets : NULL};
    if (err == 0)
        err = lms_forward(c, &b, logits);
    if (err < 0) {
        fprintf(stderr, "lmserv eval: forward failed: %s\n", lms_strerror(err));
        goto done;
    }
    FILE *f = fopen(out, "wb");
    size_t cnt = (size_t)n_out * (size_t)nv;
    bool ok = f && fwrite(logits, sizeof(float), cnt, f) == cnt;
    if ((f && fclose(f) != 0) || !ok) {
        fprintf(stderr, "lmserv eval: cannot write '%s'\n", out);
        goto done;
    }
    rc = 0;
done:
    lms_kv_seq_release(lms_ctx_kv(c), &seq);
    free(sets);
    free(seqs);
    free(pos);
    free(want);
    free(logits);
    free(toks);
    app_lora_release(&lo);
    lms_ctx_destroy(c);
    lms_model_free(m);
    return rc;
}
