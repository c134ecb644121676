/*
 * cli.h - the lmserv subcommands. Each takes the arguments after its name
 * (argv[0] is the subcommand) and returns the process exit status.
 */
#ifndef LMS_CLI_H
#define LMS_CLI_H

int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_chat(int argc, char **argv);

#include <stdbool.h>

/* llama-server's flags for `serve` (llama_args.c): argv rewritten into
 * lmserv's (argv[0] kept; the strings borrowed), its default sampling as a
 * JSON object of request fields (or NULL), --no-webui. */
typedef struct app_llama_out {
    int argc;
    char **argv;
    char *sampling;
    bool no_web;
} app_llama_out;

/* Returns 0, or -1 after printing what is wrong. */
int app_llama_args(int argc, char **argv, app_llama_out *out);
void app_llama_args_free(app_llama_out *out);

#endif
