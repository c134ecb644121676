/*
 * safetensors.c - .safetensors reader (format facts in safetensors.h).
 * The file is untrusted: every length, offset and field is checked
 * before use, and errors name what was wrong.
 */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "kernels/qtypes.h"

#define ST_MAX_HEADER (64u << 20) /* far above any real header (a 70B shard: < 1 MiB) */

void lms_st_close(lms_st_file *f)
{
    if (!f)
        return;
    for (int32_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    if (f->is_mapped)
        munmap(f->buf, f->size);
    else
        free(f->buf);
    free(f);
}

const lms_st_tensor *lms_st_find(const lms_st_file *f, const char *name)
{
    for (int32_t i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

/* A JSON integer in [0, 2^53] (what a JSON double can hold exactly), or -1. */
static int64_t json_uint(const json_t *v)
{
    if (!json_is_integer(v))
        return -1;
    json_int_t x = json_integer_value(v);
    return x >= 0 && x <= (json_int_t)1 << 53 ? (int64_t)x : -1;
}

/* Fills t from the header entry of tensor `name`; data_size is the length
 * of the data section. */
static int parse_tensor(lms_st_file *f, lms_st_tensor *t, const char *name, const json_t *e,
                        size_t data_size, char *err, size_t errsz)
{
    if (!json_is_object(e))
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "tensor '%s': entry is not an object", name);
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    size_t esize;
    if (!dt)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "tensor '%s': dtype is missing or not a string",
                        name);
    if (!strcmp(dt, "F32"))
        t->type = LMS_TYPE_F32, esize = 4;
    else if (!strcmp(dt, "F16"))
        t->type = LMS_TYPE_F16, esize = 2;
    else if (!strcmp(dt, "BF16"))
        t->type = LMS_TYPE_BF16, esize = 2;
    else
        return lms_errf(err, errsz, LMS_ERR_UNSUPPORTED,
                        "tensor '%s': dtype \"%.16s\" is not supported (F32, F16, BF16)", name, dt);
    const json_t *shape = json_object_get(e, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > LMS_ST_MAX_DIMS)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tensor '%s': shape is missing, not an array or has more than %d dimensions",
                        name, LMS_ST_MAX_DIMS);
    t->n_dims = (int)json_array_size(shape);
    uint64_t count = 1;
    for (int d = 0; d < t->n_dims; d++) {
        int64_t v = json_uint(json_array_get(shape, (size_t)d));
        if (v < 0)
            return lms_errf(err, errsz, LMS_ERR_FORMAT,
                            "tensor '%s': shape[%d] is not a non-negative integer", name, d);
        t->shape[d] = v;
        if (v != 0 && count > (UINT64_MAX / 8) / (uint64_t)v)
            return lms_errf(err, errsz, LMS_ERR_FORMAT, "tensor '%s': shape is too large", name);
        count *= (uint64_t)v;
    }
    for (int d = t->n_dims; d < LMS_ST_MAX_DIMS; d++)
        t->shape[d] = 1;
    const json_t *off = json_object_get(e, "data_offsets");
    int64_t begin = json_uint(json_array_get(off, 0)), end = json_uint(json_array_get(off, 1));
    if (!json_is_array(off) || json_array_size(off) != 2 || begin < 0 || end < 0)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tensor '%s': data_offsets is not an array of two non-negative integers",
                        name);
    if (begin > end || (uint64_t)end > data_size)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tensor '%s': data_offsets [%lld, %lld] is outside the data section "
                        "(%zu bytes)", name, (long long)begin, (long long)end, data_size);
    if ((uint64_t)(end - begin) != count * esize)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "tensor '%s': data_offsets hold %lld bytes, but dtype %s and its shape "
                        "need %llu", name, (long long)(end - begin), dt,
                        (unsigned long long)(count * esize));
    t->data = f->buf + (f->size - data_size) + begin;
    t->n_bytes = (size_t)(end - begin);
    t->name = strdup(name);
    return t->name ? 0 : lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
}

/* Parses f->buf (f->size bytes). */
static int parse(lms_st_file *f, char *err, size_t errsz)
{
    if (f->size < 8)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "file of %zu bytes is too short for the "
                        "header length", f->size);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--)
        hn = hn << 8 | f->buf[i];
    if (hn < 2 || hn > f->size - 8 || hn > ST_MAX_HEADER)
        return lms_errf(err, errsz, LMS_ERR_FORMAT,
                        "header length %llu does not fit the file (%zu bytes)",
                        (unsigned long long)hn, f->size);
    json_error_t je;
    json_t *h = json_loadb((const char *)f->buf + 8, (size_t)hn, JSON_REJECT_DUPLICATES, &je);
    if (!h)
        return lms_errf(err, errsz, LMS_ERR_FORMAT, "header JSON: %s (line %d, column %d)",
                        je.text, je.line, je.column);
    int rc = 0;
    if (!json_is_object(h)) {
        rc = lms_errf(err, errsz, LMS_ERR_FORMAT, "header is not a JSON object");
        goto out;
    }
    const json_t *meta = json_object_get(h, "__metadata__");
    if (meta && !json_is_object(meta)) {
        rc = lms_errf(err, errsz, LMS_ERR_FORMAT, "__metadata__ is not an object");
        goto out;
    }
    size_t n = json_object_size(h) - (meta ? 1 : 0);
    if (n > INT32_MAX / 2) {
        rc = lms_errf(err, errsz, LMS_ERR_LIMIT, "too many tensors (%zu)", n);
        goto out;
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        rc = lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
        goto out;
    }
    const size_t data_size = f->size - 8 - (size_t)hn;
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (!strcmp(key, "__metadata__"))
            continue;
        rc = parse_tensor(f, &f->tensors[f->n_tensors], key, v, data_size, err, errsz);
        if (rc < 0)
            goto out;
        f->n_tensors++;
    }
out:
    json_decref(h);
    return rc;
}

int lms_st_open_mem(const void *buf, size_t n, lms_st_file **out, char *err, size_t errsz)
{
    lms_st_file *f = calloc(1, sizeof *f);
    if (f)
        f->buf = malloc(n ? n : 1);
    if (!f || !f->buf) {
        lms_st_close(f);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    }
    if (n)
        memcpy(f->buf, buf, n);
    f->size = n;
    int rc = parse(f, err, errsz);
    if (rc < 0) {
        lms_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int lms_st_open(const char *path, lms_st_file **out, char *err, size_t errsz)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return lms_errf(err, errsz, LMS_ERR_IO, "cannot open '%s'", path);
    lms_st_file *f = calloc(1, sizeof *f);
    long len = -1;
    if (f && fseek(fp, 0, SEEK_END) == 0 && (len = ftell(fp)) >= 0 && fseek(fp, 0, SEEK_SET) == 0)
        f->buf = malloc(len ? (size_t)len : 1);
    if (!f || !f->buf || len < 0) {
        fclose(fp);
        lms_st_close(f);
        return lms_errf(err, errsz, len < 0 ? LMS_ERR_IO : LMS_ERR_NOMEM,
                        "cannot read '%s'", path);
    }
    f->size = (size_t)len;
    size_t got = fread(f->buf, 1, f->size, fp);
    fclose(fp);
    if (got != f->size) {
        lms_st_close(f);
        return lms_errf(err, errsz, LMS_ERR_IO, "short read of '%s'", path);
    }
    int rc = parse(f, err, errsz);
    if (rc < 0) {
        lms_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

int lms_st_map(const char *path, lms_st_file **out, char *err, size_t errsz)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return lms_errf(err, errsz, LMS_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return lms_errf(err, errsz, LMS_ERR_IO, "'%s' is not a regular non-empty file", path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return lms_errf(err, errsz, LMS_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
    lms_st_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap(m, (size_t)st.st_size);
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "out of memory");
    }
    f->buf = m;
    f->size = (size_t)st.st_size;
    f->is_mapped = 1;
    int rc = parse(f, err, errsz);
    if (rc < 0) {
        lms_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

void *lms_st_reorder(const lms_st_tensor *t, bool transpose, int32_t n_h)
{
    const size_t es = t->type == LMS_TYPE_F32 ? 4 : 2;
    const size_t rows = (size_t)t->shape[0], cols = (size_t)t->shape[1];
    uint8_t *out = malloc(t->n_bytes ? t->n_bytes : 1);
    if (!out)
        return NULL;
    if (transpose) {
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++)
                memcpy(out + (c * rows + r) * es, t->data + (r * cols + c) * es, es);
        return out;
    }
    const size_t hd = rows / (size_t)n_h;
    for (size_t h = 0; h < (size_t)n_h; h++)
        for (size_t i = 0; i < hd / 2; i++)
            for (size_t j = 0; j < 2; j++)
                memcpy(out + (h * hd + 2 * i + j) * cols * es,
                       t->data + (h * hd + j * (hd / 2) + i) * cols * es, cols * es);
    return out;
}
