/*
 * fuzz_gguf.c - libFuzzer target: any bytes as a GGUF file. Parsing must
 * fail cleanly or succeed; on success the tokenizer loader and the model
 * loader's checks run over the parsed metadata too.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    gguf_file *f;
    if (gguf_open_mem(data, size, &f, err, sizeof err) < 0)
        return 0;
    lms_tokenizer *t;
    if (lms_tokenizer_load(f, &t, err, sizeof err) == 0) {
        int32_t ids[64];
        lms_tokenize(t, "Hello world <s> 123", 19, true, true, ids, 64);
        lms_tokenizer_destroy(t);
    }
    gguf_close(f);
    /* the model loader reads from a path: give it the bytes as a file */
    char path[64];
    snprintf(path, sizeof path, "/tmp/lms_fuzz_%d.gguf", (int)getpid());
    FILE *fp = fopen(path, "wb");
    if (fp) {
        fwrite(data, 1, size, fp);
        fclose(fp);
        lms_model *m;
        if (lms_model_load(path, &m, err, sizeof err) == 0)
            lms_model_free(m);
        unlink(path);
    }
    return 0;
}
