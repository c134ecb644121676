/*
 * fuzz_gbnf.c - libFuzzer target: the input up to its first NUL byte as a
 * GBNF grammar (engine/gbnf.h) and, when it compiles, the rest fed to the
 * checker a byte at a time (asked first, then fed) and in one piece.
 * Refusals are expected; crashes, hangs and leaks are not.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gbnf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    const size_t n = nul ? (size_t)(nul - data) : size;
    char err[256];
    lms_gbnf *g = lms_gbnf_compile((const char *)data, n, err, sizeof err);
    if (!g)
        return 0;
    lms_gbnf_chk *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    if (a && b && lms_gbnf_init(a, g)) {
        lms_gbnf_copy(b, a);
        const char *text = (const char *)data + n + 1;
        const size_t tn = nul ? size - n - 1 : 0;
        for (size_t i = 0; i < tn; i++) {
            const bool ok = lms_gbnf_allows(a, text + i, 1);
            if (ok != lms_gbnf_feed(a, text + i, 1))
                abort(); /* asking and feeding disagree */
            if (!ok)
                break;
        }
        (void)lms_gbnf_done(a);
        (void)lms_gbnf_closed(a);
        (void)lms_gbnf_feed(b, text, tn);
        (void)lms_gbnf_same(a, b);
    }
    free(a);
    free(b);
    free(g);
    return 0;
}
