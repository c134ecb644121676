/*
 * fuzz_jsonschema.c - libFuzzer target: the input's first line as a JSON
 * schema for JSON mode (engine/jsonschema.h) and, when it compiles, the
 * rest fed to the checker byte by byte and through copies. Refusals are
 * expected; crashes, hangs and leaks are not.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/jsonschema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    const size_t n = nl ? (size_t)(nl - data) : size;
    char err[256];
    lms_jschema *sc = lms_jschema_compile((const char *)data, n, err, sizeof err);
    if (!sc)
        return 0;
    lms_jschk k, c;
    lms_jschk_init(&k, sc);
    for (size_t i = n + 1; i < size; i++) {
        lms_jschk_copy(&c, &k);
        if (!lms_jschk_feed(&c, (const char *)data + i, 1))
            break;
        (void)lms_jschk_same(&c, &k);
        lms_jschk_copy(&k, &c);
    }
    (void)lms_jschk_done(&k);
    free(sc);
    return 0;
}
