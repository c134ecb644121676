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

#endif
