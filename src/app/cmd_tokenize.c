/*
 * cmd_tokenize.c - `lmserv tokenize`: token ids of a text, space separated.
 *
 * Needs only the vocabulary, so it works on vocab-only GGUF files too.
 * BOS is added when the vocabulary asks for it, unless --no-bos; special
 * token text is parsed only with --special.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/cli.h"
#include "base/err.h"
#include "model/gguf.h"
#include "model/hf.h"
#include "model/tokenizer.h"

static void print_piece(const lms_tokenizer *t, int32_t id)
{
    char buf[1024];
    int n = lms_token_to_piece(t, id, true, buf, sizeof buf);
    putchar('\'');
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\'' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('\'');
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL;
    bool no_bos = false, pieces = false, special = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--no-bos"))
            no_bos = true;
        else if (!strcmp(argv[i], "--pieces"))
            pieces = true;
        else if (!strcmp(argv[i], "--special"))
            special = true;
        else if (!text && (argv[i][0] != '-' || argv[i][1] == 0 || argv[i][1] == ' '))
            text = argv[i];
        else if (!text && !strcmp(argv[i], "--") && i + 1 < argc)
            text = argv[++i];
        else {
            fprintf(stderr, "lmserv tokenize: bad option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!model || !text) {
        fprintf(stderr, "usage: lmserv tokenize -m MODEL [--no-bos] [--pieces] [--special] TEXT\n");
        return 2;
    }
    char err[512];
    gguf_file *f;
    lms_tokenizer *t;
    if (hf_open_any(model, HF_OPEN_NO_TENSORS, &f, err, sizeof err) < 0 ||
        lms_tokenizer_load(f, &t, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv tokenize: %s\n", err);
        return 1;
    }
    gguf_close(f);
    size_t len = strlen(text);
    int64_t n = lms_tokenize(t, text, len, !no_bos, special, NULL, 0);
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    if (n < 0 || (n > 0 && !ids)) {
        fprintf(stderr, "lmserv tokenize: %s\n", lms_strerror(n < 0 ? (int)n : LMS_ERR_NOMEM));
        lms_tokenizer_destroy(t);
        return 1;
    }
    lms_tokenize(t, text, len, !no_bos, special, ids, n);
    for (int64_t i = 0; i < n; i++) {
        printf(i ? " %d" : "%d", ids[i]);
        if (pieces) {
            putchar(':');
            print_piece(t, ids[i]);
        }
    }
    putchar('\n');
    free(ids);
    lms_tokenizer_destroy(t);
    return 0;
}
