/*
 * testutil.c - see testutil.h.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels.h"

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

void tu_rand_acts(uint64_t *seed, float *x, int64_t n)
{
    static const float amps[] = {1.0f, 1.0f, 3.5f, 1e-3f, 1e3f, 1e-30f, 0.0f};
    for (int64_t i = 0; i < n; i += 256) {
        const float a = amps[tu_rand_u64(seed) % (sizeof amps / sizeof amps[0])];
        for (int64_t j = i; j < n && j < i + 256; j++)
            x[j] = a * tu_rand_f32(seed, -1.0f, 1.0f);
    }
}

double tu_dot_magnitude(int type, int64_t n, const void *w, const void *xq)
{
    const lms_type_traits *tt = lms_type_get(type);
    float *xf = malloc((size_t)n * sizeof *xf), *wf = malloc((size_t)n * sizeof *wf);
    double m = 0.0;
    lms_kernels_ref()->to_float[tt->vec_dot_type](xq, xf, n);
    if (!tt->is_quantized) {
        lms_kernels_ref()->to_float[type](w, wf, n);
        for (int64_t i = 0; i < n; i++)
            m += fabs((double)wf[i] * xf[i]);
    } else if (tt->blck_size == 32) {
        static void (*const un[])(const void *, lms_lq_block *) = {
            [LMS_TYPE_Q4_0] = lms_unpack_q4_0, [LMS_TYPE_Q4_1] = lms_unpack_q4_1,
            [LMS_TYPE_Q5_0] = lms_unpack_q5_0, [LMS_TYPE_Q5_1] = lms_unpack_q5_1,
            [LMS_TYPE_Q8_0] = lms_unpack_q8_0, [LMS_TYPE_IQ4_NL] = lms_unpack_iq4_nl,
        };
        for (int64_t b = 0; b < n / 32; b++) {
            lms_lq_block q;
            un[type]((const uint8_t *)w + (size_t)b * tt->type_size, &q);
            for (int j = 0; j < 32; j++)
                m += (fabs((double)q.q[j] * q.d) + fabs(q.m)) * fabs(xf[b * 32 + j]);
        }
    } else {
        static void (*const un[])(const void *, lms_kq_block *) = {
            [LMS_TYPE_Q2_K] = lms_unpack_q2_K, [LMS_TYPE_Q3_K] = lms_unpack_q3_K,
            [LMS_TYPE_Q4_K] = lms_unpack_q4_K, [LMS_TYPE_Q5_K] = lms_unpack_q5_K,
            [LMS_TYPE_Q6_K] = lms_unpack_q6_K, [LMS_TYPE_IQ4_XS] = lms_unpack_iq4_xs,
        };
        for (int64_t b = 0; b < n / LMS_QK_K; b++) {
            lms_kq_block q;
            un[type]((const uint8_t *)w + (size_t)b * tt->type_size, &q);
            for (int e = 0; e < LMS_QK_K; e++) {
                const int s = e / q.sub;
                const double t =
                    fabs((double)q.d * q.sc[s] * q.q[e]) + fabs((double)q.dmin * q.mn[s]);
                m += t * fabs(xf[b * LMS_QK_K + e]);
            }
        }
    }
    free(xf);
    free(wf);
    return m;
}

void tu_read_margins(const char *dir, const char *cs, float *margin, int32_t n)
{
    char rel[256];
    snprintf(rel, sizeof rel, "golden/%s/%s.greedy.txt", dir, cs);
    char *txt = tu_read_file(tu_data_path(rel), NULL);
    assert_non_null(txt);
    char *line = txt;
    for (int32_t i = 0; i < n && line && *line; i++) {
        int step, id;
        float logit, m;
        assert_int_equal(sscanf(line, "%d %d %g %g", &step, &id, &logit, &m), 4);
        margin[i] = m;
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    free(txt);
}
