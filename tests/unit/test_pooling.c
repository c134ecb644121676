/*
 * test_pooling.c - a decoder's pooling_type and a decoder reranker's head
 * (model.c read_pooling / bind_rank_head, encoder.c lms_rank_scores):
 *   - qwen3-embed-tiny reads as last-token pooling, qwen3-rerank-tiny as
 *     rank with a two-score head; a plain decoder as none;
 *   - a decoder whose pooling_type is a value lmserv does not serve (0
 *     none, -1 unspecified, 7) still loads, as a plain language model; an
 *     encoder with 7 is refused by name;
 *   - rank on a decoder without cls.output.weight is refused by name;
 *   - lms_rank_scores of a decoder: the softmax of the head's two dot
 *     products with the state, computed here from the f32 rows.
 */
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/encoder.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

static void tmp_path(char *buf, size_t n, const char *tag)
{
    snprintf(buf, n, "/tmp/lms_test_pooling_%d_%s.gguf", (int)getpid(), tag);
}

static lms_model *synth_load(const char *shape, const char *tag)
{
    char path[128], err[512];
    tmp_path(path, sizeof path, tag);
    if (lms_synth_write(lms_synth_find(shape), "F32", 3, path, err, sizeof err) < 0)
        fail_msg("%s: %s", shape, err);
    lms_model *m = NULL;
    const int rc = lms_model_load(path, &m, err, sizeof err);
    unlink(path);
    if (rc < 0)
        fail_msg("%s: %s", shape, err);
    return m;
}

static void test_read(void **state)
{
    (void)state;
    lms_model *e = synth_load("qwen3-embed-tiny", "e");
    assert_int_equal(e->hp.pooling, LMS_POOLING_LAST);
    assert_false(e->hp.is_encoder);
    lms_model_free(e);
    lms_model *r = synth_load("qwen3-rerank-tiny", "r");
    assert_int_equal(r->hp.pooling, LMS_POOLING_RANK);
    assert_int_equal(r->hp.n_cls_out, 2);
    assert_non_null(r->cls_out.data);
    assert_null(r->cls.data);
    lms_model_free(r);
    lms_model *p = synth_load("qwen2-tiny", "p");
    assert_int_equal(p->hp.pooling, 0);
    lms_model_free(p);
}

static const char *g_key; /* the key rewrite sets: the copy leaves it out */

static bool skip_key(const char *key)
{
    return !strcmp(key, g_key);
}

/* src rewritten into dst: key `key` set to v (or left out when drop), and
 * the tensor `skip` left out. */
static void rewrite(const char *src, const char *dst, const char *key, int32_t v, bool drop,
                    const char *skip)
{
    char err[256];
    gguf_file *f = NULL;
    assert_int_equal(gguf_open(src, &f, err, sizeof err), 0);
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    g_key = key;
    assert_int_equal(gguf_writer_copy_kv(w, f, skip_key), 0);
    if (!drop)
        assert_int_equal(gguf_writer_set_i32(w, key, v), 0);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (skip && !strcmp(t->name.p, skip))
            continue;
        int64_t ne[2] = {t->ne[0], t->ne[1]};
        assert_int_equal(
            gguf_writer_add_tensor(w, t->name.p, t->type, t->n_dims, ne, t->data, t->n_bytes, true),
            0);
    }
    if (gguf_writer_write(w, dst, err, sizeof err) < 0)
        fail_msg("%s", err);
    gguf_writer_destroy(w);
    gguf_close(f);
}

/* Loads shape rewritten with key = v; returns the load's rc, its message
 * in err, the model's pooling in *pool. */
static int load_edited(const char *shape, const char *key, int32_t v, const char *skip,
                       int *pool, char *err, size_t errsz)
{
    char src[128], dst[128];
    tmp_path(src, sizeof src, "src");
    tmp_path(dst, sizeof dst, "dst");
    if (lms_synth_write(lms_synth_find(shape), "F32", 3, src, err, errsz) < 0)
        fail_msg("%s: %s", shape, err);
    rewrite(src, dst, key, v, false, skip);
    lms_model *m = NULL;
    const int rc = lms_model_load(dst, &m, err, errsz);
    unlink(src);
    unlink(dst);
    *pool = m ? m->hp.pooling : -100;
    lms_model_free(m);
    return rc;
}

static void test_odd_values(void **state)
{
    (void)state;
    char err[512];
    int pool;
    const int32_t ignored[] = {0, -1, 7};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
        assert_int_equal(load_edited("qwen2-tiny", "qwen2.pooling_type", ignored[i], NULL, &pool,
                                     err, sizeof err),
                         0);
        assert_int_equal(pool, 0);
    }
    assert_true(load_edited("bert-tiny", "bert.pooling_type", 7, NULL, &pool, err, sizeof err) < 0);
    assert_non_null(strstr(err, "'bert.pooling_type' = 7 is not supported"));
    assert_true(load_edited("qwen3-rerank-tiny", "qwen3.pooling_type", 4, "cls.output.weight",
                            &pool, err, sizeof err) < 0);
    assert_non_null(strstr(err, "needs a classification head"));
}

static void test_rank_scores(void **state)
{
    (void)state;
    lms_model *m = synth_load("qwen3-rerank-tiny", "s");
    const int64_t e = m->hp.n_embd;
    assert_int_equal(m->cls_out.type, LMS_TYPE_F32);
    float *h = malloc((size_t)e * sizeof *h), *t0 = malloc((size_t)e * sizeof *t0),
          *t1 = malloc((size_t)e * sizeof *t1);
    void *scratch = aligned_alloc(64, (lms_rank_scratch(m) + 63) / 64 * 64 + 64);
    uint64_t rng = 11;
    for (int64_t i = 0; i < e; i++)
        h[i] = tu_rand_f32(&rng, -2.0f, 2.0f);
    float out[2];
    lms_rank_scores(m, h, out, t0, t1, scratch);
    double z[2];
    for (int k = 0; k < 2; k++) {
        const float *row = (const float *)((const uint8_t *)m->cls_out.data +
                                           (size_t)k * m->cls_out.row_bytes);
        z[k] = 0;
        for (int64_t i = 0; i < e; i++)
            z[k] += (double)row[i] * h[i];
    }
    const double p0 = 1.0 / (1.0 + exp(z[1] - z[0]));
    printf("rank scores %.7f %.7f, by hand %.7f (logits %.4f %.4f)\n", out[0], out[1], p0, z[0],
           z[1]);
    assert_true(fabs(out[0] - p0) < 1e-5 && fabs(out[1] - (1 - p0)) < 1e-5);
    assert_true(fabs(z[0] - z[1]) > 1e-3); /* the two rows differ: a real choice */
    free(h), free(t0), free(t1), free(scratch);
    lms_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_odd_values),
        cmocka_unit_test(test_rank_scores),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
