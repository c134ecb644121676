/*
 * fuzz_tokenize.c - libFuzzer target: any bytes tokenized with the GPT-2
 * byte-level BPE and the SentencePiece vocab of the test data, with and
 * without special-token parsing; the pieces streamed back through the
 * detokenizer. Needs LMS_TESTDATA.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/gguf.h"
#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lms_tokenizer *load(const char *rel)
{
    char path[1024], err[256];
    const char *root = getenv("LMS_TESTDATA");
    snprintf(path, sizeof path, "%s/%s", root ? root : "../shared/testdata", rel);
    gguf_file *f;
    lms_tokenizer *t = NULL;
    if (gguf_open(path, &f, err, sizeof err) == 0) {
        lms_tokenizer_load(f, &t, err, sizeof err);
        gguf_close(f);
    }
    if (!t) {
        fprintf(stderr, "fuzz_tokenize: cannot load %s\n", path);
        abort();
    }
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static lms_tokenizer *tok[2];
    if (!tok[0]) {
        tok[0] = load("tokenizer/ggml-vocab-gpt-2.gguf");
        tok[1] = load("tokenizer/ggml-vocab-llama-spm.gguf");
    }
    int32_t ids[4096];
    char out[1024];
    for (int k = 0; k < 2; k++) {
        int64_t n = lms_tokenize(tok[k], (const char *)data, size, true, size & 1, ids, 4096);
        lms_detok d;
        lms_detok_init(&d, tok[k], false);
        for (int64_t i = 0; i < n && i < 4096; i++)
            lms_detok_push(&d, ids[i], out, sizeof out);
        lms_detok_flush(&d, out, sizeof out);
    }
    return 0;
}
