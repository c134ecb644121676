/*
 * gguf_writer.c - builds GGUF v3 files (for `quantize`, `synth` and tests).
 *
 * Metadata entries are serialised into one growing byte buffer as they are
 * set; tensors are kept as (name, type, shape, data) and laid out with
 * general.alignment (32) padding when the file is written.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"

typedef struct wtensor {
    char *name;
    int type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    const void *data;
    size_t n_bytes;
    bool owned;
} wtensor;

struct gguf_writer {
    uint8_t *kv;     /* serialised key/value entries */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    wtensor *t;
    size_t n_t, cap_t;
    bool failed;     /* an allocation failed: write() reports it */
};

gguf_writer *gguf_writer_create(void)
{
    return calloc(1, sizeof(gguf_writer));
}

void gguf_writer_destroy(gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        if (w->t[i].owned)
            free((void *)w->t[i].data);
    }
    free(w->t);
    free(w->kv);
    free(w);
}

static void put(gguf_writer *w, const void *p, size_t n)
{
    if (w->failed)
        return;
    if (w->kv_cap - w->kv_len < n) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap - w->kv_len < n)
            cap *= 2;
        uint8_t *nb = realloc(w->kv, cap);
        if (!nb) {
            w->failed = true;
            return;
        }
        w->kv = nb;
        w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
}

static void put_u32(gguf_writer *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(gguf_writer *w, uint64_t v) { put(w, &v, 8); }

static void put_str(gguf_writer *w, const char *s, size_t n)
{
    put_u64(w, n);
    put(w, s, n);
}

static void put_key(gguf_writer *w, const char *key, int vt)
{
    put_str(w, key, strlen(key));
    put_u32(w, (uint32_t)vt);
    w->n_kv++;
}

static int status(const gguf_writer *w)
{
    return w->failed ? LMS_ERR_NOMEM : 0;
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    put_key(w, key, GGUF_VT_U32);
    put_u32(w, v);
    return status(w);
}

int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    put_key(w, key, GGUF_VT_I32);
    put(w, &v, 4);
    return status(w);
}

int gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    put_key(w, key, GGUF_VT_F32);
    put(w, &v, 4);
    return status(w);
}

int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v;
    put_key(w, key, GGUF_VT_BOOL);
    put(w, &b, 1);
    return status(w);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    put_key(w, key, GGUF_VT_STRING);
    put_str(w, v, strlen(v));
    return status(w);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    put_key(w, key, GGUF_VT_ARRAY);
    put_u32(w, GGUF_VT_STRING);
    put_u64(w, n);
    for (uint64_t i = 0; i < n; i++)
        put_str(w, v[i], strlen(v[i]));
    return status(w);
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, int vt, const void *data, uint64_t n)
{
    size_t es = gguf_vtype_size(vt);
    if (!es)
        return LMS_ERR_INVAL;
    put_key(w, key, GGUF_VT_ARRAY);
    put_u32(w, (uint32_t)vt);
    put_u64(w, n);
    put(w, data, es * n);
    return status(w);
}

/* Re-serialises one parsed entry (scalars from the mapping bytes). */
static void copy_entry(gguf_writer *w, const gguf_file *src, const gguf_kv *kv)
{
    put_key(w, kv->key.p, kv->type);
    if (kv->type == GGUF_VT_STRING) {
        put_str(w, kv->v.s.p, kv->v.s.n);
    } else if (kv->type == GGUF_VT_ARRAY) {
        put_u32(w, (uint32_t)kv->arr_type);
        put_u64(w, kv->n);
        if (kv->arr_type == GGUF_VT_STRING)
            for (uint64_t i = 0; i < kv->n; i++)
                put_str(w, kv->strs[i].p, kv->strs[i].n);
        else
            put(w, kv->arr, kv->n * gguf_vtype_size(kv->arr_type));
    } else {
        put(w, src->base + kv->file_offset, gguf_vtype_size(kv->type));
    }
}

int gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, bool (*skip)(const char *key))
{
    for (uint64_t i = 0; i < src->n_kv; i++)
        if (!skip || !skip(src->kv[i].key.p))
            copy_entry(w, src, &src->kv[i]);
    return status(w);
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, int type, int n_dims,
                           const int64_t *ne, const void *data, size_t n_bytes, bool borrow)
{
    const lms_type_traits *tt = lms_type_get(type);
    if (!tt || n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return LMS_ERR_INVAL;
    size_t expect = lms_row_size(type, ne[0]);
    for (int d = 1; d < n_dims; d++)
        expect *= (size_t)ne[d];
    if (expect != n_bytes || expect == 0)
        return LMS_ERR_INVAL;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt)
            return LMS_ERR_NOMEM;
        w->t = nt;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    void *copy = borrow ? NULL : malloc(n_bytes);
    if (!t->name || (!borrow && !copy)) {
        free(t->name);
        free(copy);
        return LMS_ERR_NOMEM;
    }
    if (copy)
        memcpy(copy, data, n_bytes);
    t->data = borrow ? data : copy;
    t->owned = !borrow;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    t->n_bytes = n_bytes;
    w->n_t++;
    return 0;
}

static size_t pad_to(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static int write_all(FILE *fp, const void *p, size_t n)
{
    return fwrite(p, 1, n, fp) == n ? 0 : LMS_ERR_IO;
}

static int write_padding(FILE *fp, size_t n)
{
    static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];
    return write_all(fp, zeros, n);
}

/* Header, kv block and tensor infos; returns bytes written in *pos. */
static int write_header(gguf_writer *w, FILE *fp, size_t *pos)
{
    uint32_t hdr[2] = {0x46554747u /* "GGUF" */, 3};
    uint64_t counts[2] = {w->n_t, w->n_kv};
    int rc = write_all(fp, hdr, 8);
    rc = rc ? rc : write_all(fp, counts, 16);
    rc = rc ? rc : write_all(fp, w->kv, w->kv_len);
    *pos = 24 + w->kv_len;
    size_t off = 0;
    for (size_t i = 0; i < w->n_t && !rc; i++) {
        wtensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims, ty = (uint32_t)t->type;
        uint64_t o = off;
        rc = write_all(fp, &nl, 8);
        rc = rc ? rc : write_all(fp, t->name, nl);
        rc = rc ? rc : write_all(fp, &nd, 4);
        rc = rc ? rc : write_all(fp, t->ne, 8 * nd);
        rc = rc ? rc : write_all(fp, &ty, 4);
        rc = rc ? rc : write_all(fp, &o, 8);
        *pos += 8 + nl + 4 + 8 * nd + 4 + 8;
        off = pad_to(off + t->n_bytes, GGUF_DEFAULT_ALIGNMENT);
    }
    return rc;
}

int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t errsz)
{
    if (w->failed)
        return lms_errf(err, errsz, LMS_ERR_NOMEM, "gguf: out of memory while building '%s'", path);
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return lms_errf(err, errsz, LMS_ERR_IO, "gguf: cannot create '%s': %s", path, strerror(errno));
    size_t pos;
    int rc = write_header(w, fp, &pos);
    if (!rc)
        rc = write_padding(fp, pad_to(pos, GGUF_DEFAULT_ALIGNMENT) - pos);
    for (size_t i = 0; i < w->n_t && !rc; i++) {
        rc = write_all(fp, w->t[i].data, w->t[i].n_bytes);
        if (!rc)
            rc = write_padding(fp, pad_to(w->t[i].n_bytes, GGUF_DEFAULT_ALIGNMENT) - w->t[i].n_bytes);
    }
    if (fclose(fp) != 0 && !rc)
        rc = LMS_ERR_IO;
    if (rc)
        return lms_errf(err, errsz, rc, "gguf: writing '%s' failed: %s", path, strerror(errno));
    return 0;
}
