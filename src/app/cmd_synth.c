/*
 * cmd_synth.c - `lmserv synth --shape NAME --type TYPE OUT.gguf [--seed S]`:
 * a random-weight model of a real architecture's shape (synth.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/args.h"
#include "app/cli.h"
#include "model/synth.h"

int cmd_synth(int argc, char **argv)
{
    const char *shape = "tiny", *type = "Q4_K_M", *out = NULL;
    int64_t seed = 1234;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--shape") && i + 1 < argc)
            shape = argv[++i];
        else if (!strcmp(argv[i], "--type") && i + 1 < argc)
            type = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (!args_int("--seed", argv[++i], 0, INT64_MAX, &seed))
                return 2;
        } else if (!out && argv[i][0] != '-')
            out = argv[i];
        else {
            fprintf(stderr, "lmserv synth: bad option '%s'\n", argv[i]);
            return 2;
        }
    }
    const lms_synth_shape *s = lms_synth_find(shape);
    if (!out || !s) {
        fprintf(stderr, "usage: lmserv synth --shape SHAPE [--type TYPE] [--seed S] OUT.gguf\n"
                        "  SHAPE: %s\n", lms_synth_names());
        return 2;
    }
    char err[512];
    if (lms_synth_write(s, type, (uint64_t)seed, out, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv synth: %s\n", err);
        return 1;
    }
    printf("wrote %s (%s, %s, seed %lld)\n", out, s->name, type, (long long)seed);
    return 0;
}
