/*
 * test_gguf.c - the GGUF reader and writer: round trips, real files, and
 * hostile input (truncation at every length, flipped bytes, absurd counts
 * and dimensions, unknown types) that must give an error, never a crash.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/model.h"
#include "testutil.h"

static char tmp_path[256];

static int setup(void **state)
{
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lms_test_gguf_%d.gguf", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    unlink(tmp_path);
    return 0;
}

/* Writes a small file with every metadata type and two tensors. */
static void write_sample(const char *path)
{
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    const char *strs[] = {"a", "", "ünïcode"};
    int32_t ints[] = {1, -2, 3};
    float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = (float)i * 0.5f;
    int64_t ne[2] = {32, 2}, ne1[1] = {32};
    assert_int_equal(gguf_writer_set_str(w, "general.architecture", "llama"), 0);
    assert_int_equal(gguf_writer_set_u32(w, "test.u32", 123456), 0);
    assert_int_equal(gguf_writer_set_i32(w, "test.i32", -7), 0);
    assert_int_equal(gguf_writer_set_f32(w, "test.f32", 1.5f), 0);
    assert_int_equal(gguf_writer_set_bool(w, "test.bool", true), 0);
    assert_int_equal(gguf_writer_set_arr_str(w, "test.strs", strs, 3), 0);
    assert_int_equal(gguf_writer_set_arr(w, "test.ints", GGUF_VT_I32, ints, 3), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "t.matrix", LMS_TYPE_F32, 2, ne, data, sizeof data, false), 0);
    assert_int_equal(gguf_writer_add_tensor(w, "t.vector", LMS_TYPE_F32, 1, ne1, data, 128, false), 0);
    char err[256];
    assert_int_equal(gguf_writer_write(w, path, err, sizeof err), 0);
    gguf_writer_destroy(w);
}

static void test_round_trip(void **state)
{
    write_sample(tmp_path);
    gguf_file *f;
    char err[256];
    assert_int_equal(gguf_open(tmp_path, &f, err, sizeof err), 0);
    uint32_t u;
    int64_t i;
    float fl;
    bool b;
    const char *s;
    assert_int_equal(gguf_get_u32(f, "test.u32", &u), 0);
    assert_int_equal(u, 123456);
    assert_int_equal(gguf_get_i64(f, "test.i32", &i), 0);
    assert_int_equal(i, -7);
    assert_int_equal(gguf_get_u32(f, "test.i32", &u), LMS_ERR_FORMAT); /* negative */
    assert_int_equal(gguf_get_f32(f, "test.f32", &fl), 0);
    assert_true(fl == 1.5f);
    assert_int_equal(gguf_get_bool(f, "test.bool", &b), 0);
    assert_true(b);
    assert_int_equal(gguf_get_str(f, "general.architecture", &s), 0);
    assert_string_equal(s, "llama");
    assert_int_equal(gguf_get_str(f, "test.u32", &s), LMS_ERR_FORMAT);
    assert_int_equal(gguf_get_u32(f, "missing", &u), LMS_ERR_NOTFOUND);
    const gguf_kv *kv = gguf_find_kv(f, "test.strs");
    assert_non_null(kv);
    assert_int_equal(kv->n, 3);
    assert_string_equal(kv->strs[2].p, "ünïcode");
    assert_int_equal(kv->strs[1].n, 0);
    kv = gguf_find_kv(f, "test.ints");
    assert_int_equal(gguf_arr_i64(kv, 1), -2);
    const gguf_tensor *t = gguf_find_tensor(f, "t.matrix");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 32);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(((uintptr_t)t->data - (uintptr_t)f->base) % 32, 0);
    assert_true(((const float *)t->data)[63] == 31.5f);
    gguf_close(f);
}

/* Every prefix of a valid file must fail cleanly (or parse, for the full
 * length), under ASan too. */
static void test_truncation(void **state)
{
    write_sample(tmp_path);
    size_t n;
    char *buf = tu_read_file(tmp_path, &n);
    assert_non_null(buf);
    char err[256];
    for (size_t len = 0; len < n; len++) {
        char *copy = malloc(len ? len : 1);
        memcpy(copy, buf, len);
        gguf_file *f = NULL;
        int rc = gguf_open_mem(copy, len, &f, err, sizeof err);
        assert_true(rc < 0);
        assert_null(f);
        assert_true(strlen(err) > 0);
        free(copy);
    }
    gguf_file *f;
    assert_int_equal(gguf_open_mem(buf, n, &f, err, sizeof err), 0);
    gguf_close(f);
    free(buf);
}

/* Flip every byte of the header area to a few values: never a crash. */
static void test_flipped_bytes(void **state)
{
    write_sample(tmp_path);
    size_t n;
    char *buf = tu_read_file(tmp_path, &n);
    char err[256];
    const uint8_t vals[] = {0x00, 0xff, 0x7f, 0x80, 0x01};
    size_t hdr = n > 600 ? 600 : n;
    for (size_t pos = 0; pos < hdr; pos++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            char *copy = malloc(n);
            memcpy(copy, buf, n);
            copy[pos] = (char)vals[v];
            gguf_file *f = NULL;
            if (gguf_open_mem(copy, n, &f, err, sizeof err) == 0)
                gguf_close(f);
            free(copy);
        }
    }
    free(buf);
}

static void put_u32(uint8_t **p, uint32_t v) { memcpy(*p, &v, 4); *p += 4; }
static void put_u64(uint8_t **p, uint64_t v) { memcpy(*p, &v, 8); *p += 8; }
static void put_s(uint8_t **p, const char *s) { put_u64(p, strlen(s)); memcpy(*p, s, strlen(s)); *p += strlen(s); }

/* Writes a version-3 header claiming n_tensors and n_kv; returns the end. */
static uint8_t *put_header(uint8_t *buf, uint64_t n_tensors, uint64_t n_kv)
{
    uint8_t *p = buf;
    memcpy(p, "GGUF", 4);
    p += 4;
    put_u32(&p, 3);
    put_u64(&p, n_tensors);
    put_u64(&p, n_kv);
    return p;
}

/* A one-tensor file with the given tensor fields. */
static size_t make_tensor_file(uint8_t *buf, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                               uint64_t offset, uint64_t n_kv_claim)
{
    uint8_t *p = put_header(buf, 1, n_kv_claim);
    put_s(&p, "w");
    put_u32(&p, n_dims);
    for (uint32_t d = 0; d < n_dims && d < 8; d++)
        put_u64(&p, ne[d]);
    put_u32(&p, type);
    put_u64(&p, offset);
    while ((p - buf) % 32)
        *p++ = 0;
    memset(p, 0, 256);
    return (size_t)(p - buf) + 256;
}

static void expect_error(uint8_t *buf, size_t n, const char *needle)
{
    gguf_file *f = NULL;
    char err[256] = "";
    int rc = gguf_open_mem(buf, n, &f, err, sizeof err);
    assert_true(rc < 0);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not mention '%s'", err, needle);
}

static void test_hostile_headers(void **state)
{
    uint8_t buf[1024];
    /* 8 entries: the n_dims = 9 case writes (up to) 8 dimensions */
    uint64_t ok[8] = {32, 2, 1, 1, 1, 1, 1, 1}, huge[8] = {1ull << 40, 1ull << 40};
    uint64_t neg[8] = {~0ull, 1}, odd[8] = {33, 1};
    expect_error(buf, make_tensor_file(buf, 2, huge, LMS_TYPE_F32, 0, 0), "overflow");
    expect_error(buf, make_tensor_file(buf, 2, neg, LMS_TYPE_F32, 0, 0), "w");
    expect_error(buf, make_tensor_file(buf, 9, ok, LMS_TYPE_F32, 0, 0), "n_dims");
    expect_error(buf, make_tensor_file(buf, 2, ok, 99, 0, 0), "type 99");
    expect_error(buf, make_tensor_file(buf, 2, ok, 4, 0, 0), "type 4"); /* removed Q4_2 */
    expect_error(buf, make_tensor_file(buf, 2, odd, LMS_TYPE_Q8_0, 0, 0), "multiple");
    expect_error(buf, make_tensor_file(buf, 2, ok, LMS_TYPE_F32, 1ull << 60, 0), "ends at byte");
    expect_error(buf, make_tensor_file(buf, 2, ok, LMS_TYPE_F32, 7, 0), "aligned");
    expect_error(buf, make_tensor_file(buf, 2, ok, LMS_TYPE_F32, 0, 1ull << 50), "cannot fit");
    /* bad magic and version */
    size_t n = make_tensor_file(buf, 2, ok, LMS_TYPE_F32, 0, 0);
    buf[0] = 'X';
    expect_error(buf, n, "magic");
    buf[0] = 'G';
    buf[4] = 9;
    expect_error(buf, n, "version 9");
}

static void test_hostile_strings(void **state)
{
    uint8_t buf[256], *p = put_header(buf, 0, 1);
    put_u64(&p, 1ull << 62); /* key length far beyond the file */
    memset(p, 'a', 64);
    expect_error(buf, (size_t)(p - buf) + 64, "string length");
    /* array of 2^40 strings */
    p = buf + 16;
    put_u64(&p, 1);
    put_s(&p, "k");
    put_u32(&p, GGUF_VT_ARRAY);
    put_u32(&p, GGUF_VT_STRING);
    put_u64(&p, 1ull << 40);
    expect_error(buf, (size_t)(p - buf) + 16, "cannot fit");
    /* unknown value type */
    p = buf + 24;
    put_s(&p, "k");
    put_u32(&p, 77);
    expect_error(buf, (size_t)(p - buf) + 16, "unknown value type 77");
}

/* Float metadata read as integers: values beyond int64 (a fuzzed F64 key of
 * 3.9e180 once made the parser convert it, which C leaves undefined) saturate,
 * NaN reads as 0. */
static void test_float_as_int(void **state)
{
    uint8_t buf[256], *p = put_header(buf, 0, 2);
    put_s(&p, "big");
    put_u32(&p, GGUF_VT_F64);
    const double big = 3.9e180;
    memcpy(p, &big, 8);
    p += 8;
    put_s(&p, "arr");
    put_u32(&p, GGUF_VT_ARRAY);
    put_u32(&p, GGUF_VT_F32);
    put_u64(&p, 5);
    const float v[5] = {1e30f, -1e30f, __builtin_nanf(""), -2.75f, 0x1p63f};
    memcpy(p, v, sizeof v);
    p += sizeof v;
    gguf_file *f;
    char err[256];
    assert_int_equal(gguf_open_mem(buf, (size_t)(p - buf), &f, err, sizeof err), 0);
    const gguf_kv *kv = gguf_find_kv(f, "arr");
    assert_non_null(kv);
    assert_true(gguf_arr_i64(kv, 0) == INT64_MAX);
    assert_true(gguf_arr_i64(kv, 1) == INT64_MIN);
    assert_true(gguf_arr_i64(kv, 2) == 0);
    assert_true(gguf_arr_i64(kv, 3) == -2);
    assert_true(gguf_arr_i64(kv, 4) == INT64_MAX); /* 2^63 exactly: one past */
    float x;
    assert_int_equal(gguf_get_f32(f, "big", &x), 0);
    gguf_close(f);
}

static void test_real_models(void **state)
{
    const char *names[] = {"models/stories260K.gguf", "models/llama-synth-q4_k_m.gguf",
                           "models/qwen3-synth-q4_k_m.gguf", "tokenizer/ggml-vocab-qwen2.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        gguf_file *f;
        char err[256];
        if (gguf_open(tu_data_path(names[i]), &f, err, sizeof err) < 0)
            fail_msg("%s: %s", names[i], err);
        assert_true(f->n_kv > 0);
        gguf_close(f);
    }
    gguf_file *f;
    char err[256];
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &f, err, sizeof err), LMS_ERR_IO);
    assert_int_equal(gguf_open("/tmp", &f, err, sizeof err), LMS_ERR_IO);
}

/* gguf_make_resident: the mapping is 2 MiB-aligned; the copy leaves every
 * tensor at its address with its bytes; it does nothing with LMS_MMAP=1,
 * nor a second time. */
static uint64_t fnv(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ull;
    return h;
}

static void test_make_resident(void **state)
{
    gguf_file *f;
    char err[256];
    const char *path = tu_data_path("models/llama-synth-q4_k_m.gguf");
    assert_int_equal(gguf_open(path, &f, err, sizeof err), 0);
    assert_int_equal((uintptr_t)f->base % ((uintptr_t)2 << 20), 0);
    uint64_t *sums = calloc(f->n_tensors, sizeof *sums);
    const void **ptrs = calloc(f->n_tensors, sizeof *ptrs);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        ptrs[i] = f->tensors[i].data;
        sums[i] = fnv(ptrs[i], f->tensors[i].n_bytes);
    }
    setenv("LMS_MMAP", "1", 1);
    assert_int_equal(gguf_make_resident(f), 0);
    unsetenv("LMS_MMAP");
    int done = gguf_make_resident(f); /* 0 where the kernel has no THP */
    assert_true(done == 0 || done == 1);
    assert_int_equal(f->resident, done == 1);
    assert_int_equal(gguf_make_resident(f), 0);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        assert_ptr_equal(f->tensors[i].data, ptrs[i]);
        assert_true(fnv(f->tensors[i].data, f->tensors[i].n_bytes) == sums[i]);
    }
    free(sums);
    free(ptrs);
    gguf_close(f);
    assert_int_equal(gguf_make_resident(NULL), 0);
}

/* A model file with a tensor of the wrong shape or a missing tensor must
 * be refused at load with the tensor's name. */
static bool skip_block_count(const char *key)
{
    return strcmp(key, "llama.block_count") == 0;
}

static void test_model_refusals(void **state)
{
    gguf_file *src;
    char err[512];
    assert_int_equal(gguf_open(tu_data_path("models/stories260K.gguf"), &src, err, sizeof err), 0);
    const char *drop[] = {"blk.2.attn_q.weight", "output_norm.weight"};
    for (size_t k = 0; k < 2; k++) {
        gguf_writer *w = gguf_writer_create();
        gguf_writer_copy_kv(w, src, NULL);
        for (uint64_t i = 0; i < src->n_tensors; i++) {
            const gguf_tensor *t = &src->tensors[i];
            if (strcmp(t->name.p, drop[k]) != 0)
                gguf_writer_add_tensor(w, t->name.p, t->type, t->n_dims, t->ne, t->data, t->n_bytes, true);
        }
        assert_int_equal(gguf_writer_write(w, tmp_path, err, sizeof err), 0);
        gguf_writer_destroy(w);
        lms_model *m = NULL;
        assert_true(lms_model_load(tmp_path, &m, err, sizeof err) < 0);
        assert_null(m);
        if (!strstr(err, drop[k]))
            fail_msg("error '%s' does not name '%s'", err, drop[k]);
    }
    /* a block count far beyond the tensors (fuzz_gguf: it sized the layer
     * table, gigabytes, before any layer's tensor was looked for) */
    gguf_writer *w = gguf_writer_create();
    gguf_writer_copy_kv(w, src, skip_block_count);
    gguf_writer_set_u32(w, "llama.block_count", 100000);
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const gguf_tensor *t = &src->tensors[i];
        gguf_writer_add_tensor(w, t->name.p, t->type, t->n_dims, t->ne, t->data, t->n_bytes, true);
    }
    assert_int_equal(gguf_writer_write(w, tmp_path, err, sizeof err), 0);
    gguf_writer_destroy(w);
    lms_model *m = NULL;
    assert_true(lms_model_load(tmp_path, &m, err, sizeof err) < 0);
    assert_null(m);
    if (!strstr(err, "block_count 100000"))
        fail_msg("error '%s' does not name the block count", err);
    /* unknown architecture */
    w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "mamba9");
    assert_int_equal(gguf_writer_write(w, tmp_path, err, sizeof err), 0);
    gguf_writer_destroy(w);
    m = NULL;
    assert_true(lms_model_load(tmp_path, &m, err, sizeof err) < 0);
    assert_non_null(strstr(err, "mamba9"));
    gguf_close(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),      cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_flipped_bytes),   cmocka_unit_test(test_hostile_headers),
        cmocka_unit_test(test_hostile_strings), cmocka_unit_test(test_real_models),
        cmocka_unit_test(test_model_refusals),  cmocka_unit_test(test_make_resident),
        cmocka_unit_test(test_float_as_int),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
