/*
 * cmd_synth.c - `lmserv synth`: a random-weight model of a real
 * architecture's shape, or a random LoRA adapter for a model (synth.h).
 *
 *   lmserv synth --shape NAME [--type TYPE] [--seed S] OUT.gguf
 *   lmserv synth --lora-for MODEL.gguf [--rank R] [--alpha A] [--targets LIST]
 *                [--type f32|f16|bf16|q8_0] [--strength X] [--seed S] OUT.gguf
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/args.h"
#include "app/cli.h"
#include "model/synth.h"

static int usage(void)
{
    fprintf(stderr,
            "usage: lmserv synth --shape SHAPE [--type TYPE] [--seed S] OUT.gguf\n"
            "       lmserv synth --lora-for MODEL.gguf [--rank R] [--alpha A] [--targets LIST]\n"
            "                    [--type f32|f16|bf16|q8_0] [--strength X] [--seed S] OUT.gguf\n"
            "  SHAPE: %s\n"
            "  LIST: comma-separated among attn_q, attn_k, attn_v, attn_output, ffn_gate,\n"
            "        ffn_up, ffn_down, output, token_embd (default: the seven layer matrices)\n",
            lms_synth_names());
    return 2;
}

int cmd_synth(int argc, char **argv)
{
    const char *shape = "tiny", *type = NULL, *out = NULL, *lora_for = NULL, *targets = NULL;
    int64_t seed = 1234, rank = 8;
    double alpha = 0, strength = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "--shape") && has)
            shape = argv[++i];
        else if (!strcmp(a, "--type") && has)
            type = argv[++i];
        else if (!strcmp(a, "--lora-for") && has)
            lora_for = argv[++i];
        else if (!strcmp(a, "--targets") && has)
            targets = argv[++i];
        else if (!strcmp(a, "--seed") && has) {
            if (!args_int(a, argv[++i], 0, INT64_MAX, &seed))
                return 2;
        } else if (!strcmp(a, "--rank") && has) {
            if (!args_int(a, argv[++i], 1, 4096, &rank))
                return 2;
        } else if (!strcmp(a, "--alpha") && has) {
            if (!args_float(a, argv[++i], -1e6, 1e6, &alpha))
                return 2;
        } else if (!strcmp(a, "--strength") && has) {
            if (!args_float(a, argv[++i], 0, 1e3, &strength))
                return 2;
        } else if (!out && a[0] != '-')
            out = a;
        else {
            fprintf(stderr, "lmserv synth: bad option '%s'\n", a);
            return usage();
        }
    }
    char err[512];
    if (lora_for) {
        if (!out)
            return usage();
        lms_synth_lora_params p = {.rank = (int32_t)rank, .alpha = (float)alpha,
                                   .targets = targets, .type = type,
                                   .strength = (float)strength, .seed = (uint64_t)seed};
        if (lms_synth_lora_write(lora_for, &p, out, err, sizeof err) < 0) {
            fprintf(stderr, "lmserv synth: %s\n", err);
            return 1;
        }
        printf("wrote %s (LoRA for %s, rank %lld, alpha %g, %s, seed %lld)\n", out, lora_for,
               (long long)rank, alpha, type ? type : "f32", (long long)seed);
        return 0;
    }
    const lms_synth_shape *s = lms_synth_find(shape);
    if (!out || !s)
        return usage();
    if (!type)
        type = "Q4_K_M";
    if (lms_synth_write(s, type, (uint64_t)seed, out, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv synth: %s\n", err);
        return 1;
    }
    printf("wrote %s (%s, %s, seed %lld)\n", out, s->name, type, (long long)seed);
    return 0;
}
