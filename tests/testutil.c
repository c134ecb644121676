/*
 * testutil.c - see testutil.h.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tu_data_path(const char *rel)
{
    static char bufs[8][4096];
    static int slot;
    const char *root = getenv("LMS_TESTDATA");
    char *b = bufs[slot++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", root ? root : "../shared/testdata", rel);
    return b;
}

char *tu_read_file(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    rewind(f);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    if (n_out)
        *n_out = (size_t)n;
    return buf;
}

uint64_t tu_rand_u64(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

float tu_rand_f32(uint64_t *s, float lo, float hi)
{
    double u = (double)(tu_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

float *tu_read_f32(const char *path, size_t *n)
{
    size_t bytes;
    char *buf = tu_read_file(path, &bytes);
    if (buf)
        *n = bytes / sizeof(float);
    return (float *)buf;
}

int32_t *tu_read_ids(const char *path, int32_t *n)
{
    char *txt = tu_read_file(path, NULL);
    if (!txt)
        return NULL;
    int32_t *ids = malloc(4096 * sizeof *ids);
    int32_t k = 0;
    char *save = NULL;
    for (char *tok = strtok_r(txt, " \n", &save); ids && tok && k < 4096;
         tok = strtok_r(NULL, " \n", &save))
        ids[k++] = (int32_t)atol(tok);
    free(txt);
    *n = k;
    return ids;
}

float tu_max_diff(const float *a, const float *b, size_t n)
{
    float d = 0;
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(a[i] - b[i]);
        d = e > d || isnan(e) ? e : d;
    }
    return d;
}

int32_t tu_argmax(const float *v, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}
