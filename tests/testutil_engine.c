/*
 * testutil_engine.c - the helpers of testutil.h that run the engine (not in
 * the kernels-only build, whose testutil is testutil.c alone).
 */
#include "testutil.h"

#include <stdbool.h>
#include <stdlib.h>

#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "model/lora.h"
#include "model/model.h"

float *tu_logits_all(const struct lms_model *m, const void *lora, const int32_t *toks, int n)
{
    enum { MAX = 64 };
    const lms_lora_set *set = lora;
    assert_true(n > 0 && n <= MAX);
    lms_ctx_params cp = {.n_ctx = MAX, .n_batch = MAX, .n_seq = 1, .n_threads = 2};
    lms_ctx *c;
    char err[256];
    if (lms_ctx_create(m, &cp, &c, err, sizeof err) < 0)
        fail_msg("%s", err);
    lms_kv_seq seq = {0};
    lms_kv_seq *seqs[MAX];
    const lms_lora_set *sets[MAX];
    int32_t pos[MAX];
    bool want[MAX];
    for (int i = 0; i < n; i++)
        seqs[i] = &seq, sets[i] = set, pos[i] = i, want[i] = true;
    float *lg = malloc((size_t)n * (size_t)m->hp.n_vocab * sizeof *lg);
    assert_non_null(lg);
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(c), &seq, n), 0);
    lms_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .logits = want,
                   .lora = set ? sets : NULL};
    assert_int_equal(lms_forward(c, &b, lg), 0);
    lms_kv_seq_release(lms_ctx_kv(c), &seq);
    lms_ctx_destroy(c);
    return lg;
}
