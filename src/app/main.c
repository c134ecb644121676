/*
 * main.c - the lmserv command line: dispatches to a subcommand.
 */
#include <stdio.h>
#include <string.h>

#include "app/cli.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *usage;
} command;

static const command commands[] = {
    {"serve", cmd_serve, "serve    -m MODEL | --config FILE [--host H] [--port P] [-t N] [--parallel N] [-c CTX]\n"
                         "         [--api-key KEY] [--max-body BYTES] [--queue N] [--max-conns N] [--grace S]\n"
                         "         [--alias NAME] [--lora FILE] [--lora-scaled FILE SCALE] [--lora-dir DIR]"},
    {"run", cmd_run, "run      -m MODEL -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P]\n"
                     "         [--seed S] [--repeat-penalty R] [-c CTX] [-t N] [--chat] [--stop S]\n"
                     "         [--lora FILE] [--lora-scaled FILE SCALE]"},
    {"tokenize", cmd_tokenize, "tokenize -m MODEL [--no-bos] [--pieces] [--special] TEXT"},
    {"eval", cmd_eval, "eval     -m MODEL --tokens \"1 2 3\" --logits OUT.f32 [--all-positions]"},
    {"info", cmd_info, "info     MODEL [-c CTX]"},
    {"quantize", cmd_quantize, "quantize IN.gguf OUT.gguf TYPE   (Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS Q4_K_M Q5_K_M F16 BF16)"},
    {"synth", cmd_synth, "synth    --shape SHAPE [--type Q4_K_M] [--seed S] OUT.gguf"},
    {"bench", cmd_bench, "bench    -m MODEL [-p 512] [-n 128] [-t N] [-r 3] [--depth D] [--parallel 1,4,8] [--json]"},
    {"chat", cmd_chat, "chat     -m MODEL [--system TEXT] [--template NAME|FILE] [-c CTX] [-t N] [sampling options]"},
    {"template", cmd_template, "template [-m MODEL] --messages CONV.json [--template FILE|NAME] [--no-generation-prompt]"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: lmserv COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %s\n", commands[i].usage);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "lmserv: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
