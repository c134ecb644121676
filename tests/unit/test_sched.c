/*
 * test_sched.c - the serving engine: batched greedy equals solo greedy,
 * prefix reuse, aborts in every state, pool exhaustion, queue limits,
 * block accounting (every block back in the pool when all work is done),
 * and two schedulers taking turns.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/forward.h"
#include "engine/kv_cache.h"
#include "engine/sched.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "ops/fault.h"
#include "ops/watchdog.h"
#include "testutil.h"

#define MAX_TOK 512

typedef struct result {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int32_t toks[MAX_TOK];
    int n_tok;
    char text[8192];
    size_t n_text;
    bool done;
    int end_type;
    lms_req_stats stats;
    int n_embd;
    float embd0;
    int n_plp;                 /* LMS_EV_PROMPT events */
    int32_t plp_tok[MAX_TOK];
    float plp_lp[MAX_TOK], plp_top0[MAX_TOK];
    int32_t plp_top0_id[MAX_TOK];
} result;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static lms_model *g_model;

static void on_event(void *user, lms_event *ev)
{
    result *r = user;
    pthread_mutex_lock(&g_mu);
    if (r->done)
        fail_msg("event after the terminal event");
    if (ev->type == LMS_EV_TOKEN) {
        if (ev->token >= 0 && r->n_tok < MAX_TOK)
            r->toks[r->n_tok++] = ev->token;
        if (r->n_text + ev->text_len < sizeof r->text) {
            memcpy(r->text + r->n_text, ev->text, ev->text_len);
            r->n_text += ev->text_len;
        }
    } else if (ev->type == LMS_EV_PROMPT) {
        if (r->n_tok > 0)
            fail_msg("a prompt log-probability after a generated token");
        if (r->n_plp < MAX_TOK) {
            r->plp_tok[r->n_plp] = ev->token;
            r->plp_lp[r->n_plp] = ev->logprob;
            r->plp_top0[r->n_plp] = ev->n_top ? ev->top[0].logprob : 1.0f;
            r->plp_top0_id[r->n_plp] = ev->n_top ? ev->top[0].id : -1;
            r->n_plp++;
        }
    } else if (ev->type == LMS_EV_EMBD) {
        r->n_embd = ev->n_embd;
        r->embd0 = ev->embd[0];
    } else {
        r->done = true;
        r->end_type = ev->type;
        r->stats = ev->stats;
        pthread_cond_broadcast(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
    lms_event_free(ev);
}

static void wait_done(result *r)
{
    pthread_mutex_lock(&g_mu);
    while (!r->done)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

static lms_sched *make_sched(int parallel, int64_t kv_budget, int queue)
{
    lms_sched_params p = {.n_ctx = 2048, .n_parallel = parallel, .n_batch = 64,
                          .max_queue = queue, .kv_budget_bytes = kv_budget, .n_threads = 2};
    lms_sched *s;
    char err[256];
    if (lms_sched_create(g_model, &p, &s, err, sizeof err) < 0)
        fail_msg("%s", err);
    return s;
}

static uint64_t submit(lms_sched *s, const int32_t *toks, int n, int max_tokens, result *r)
{
    lms_request req = {.tokens = toks, .n_tokens = n, .max_tokens = max_tokens,
                       .sp = lms_sampler_defaults(), .cb = on_event, .user = r, .ignore_eos = true};
    req.sp.temperature = 0;
    uint64_t id;
    char err[256];
    if (lms_sched_submit(s, &req, &id, err, sizeof err) < 0)
        fail_msg("submit: %s", err);
    return id;
}

static int tokenize(const char *text, int32_t *out, int cap)
{
    return (int)lms_tokenize(g_model->tok, text, strlen(text), true, false, out, cap);
}

static void assert_idle_pool(lms_sched *s)
{
    lms_sched_stats st;
    for (int i = 0; i < 200; i++) { /* the last step's stats land just after the events */
        lms_sched_get_stats(s, &st);
        if (st.kv_blocks_used == 0 && !st.busy)
            break;
        usleep(1000);
    }
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.n_running, 0);
}

static const char *prompts[8] = {
    "Once upon a time", "The little dog", "Lily and Ben went to the park. They saw a big tree",
    "One day", "Tom had a red ball", "The sun was", "She liked to", "A cat and a bird were friends",
};

/* 8 sequences with different lengths arriving at different steps give the
 * same greedy tokens as each alone. */
static void test_batched_equals_solo(void **state)
{
    static result solo[8], batch[8];
    int32_t toks[8][64];
    int n[8];
    lms_sched *s = make_sched(8, 0, 64);
    for (int i = 0; i < 8; i++) {
        n[i] = tokenize(prompts[i], toks[i], 64);
        submit(s, toks[i], n[i], 24 + i, &solo[i]);
        wait_done(&solo[i]);
        assert_int_equal(solo[i].n_tok, 24 + i);
    }
    for (int i = 0; i < 8; i++) {
        submit(s, toks[i], n[i], 24 + i, &batch[i]);
        if (i % 3 == 2)
            usleep(3000); /* later arrivals join running steps */
    }
    for (int i = 0; i < 8; i++) {
        wait_done(&batch[i]);
        assert_int_equal(batch[i].end_type, LMS_EV_END);
        assert_string_equal(batch[i].stats.finish, "length");
        assert_int_equal(batch[i].n_tok, solo[i].n_tok);
        assert_memory_equal(batch[i].toks, solo[i].toks, sizeof(int32_t) * (size_t)solo[i].n_tok);
        assert_int_equal(batch[i].n_text, solo[i].n_text);
    }
    assert_idle_pool(s);
    lms_sched_destroy(s);
}

/* Two schedulers of one model take turns, each giving its OpenMP team
 * back when it goes idle (sched_main) and starting a new one for the next
 * request: the same greedy tokens every time. */
static void test_schedulers_take_turns(void **state)
{
    static result r[4];
    int32_t toks[64];
    int n = tokenize(prompts[2], toks, 64);
    lms_sched *s[2] = {make_sched(2, 0, 8), make_sched(2, 0, 8)};
    for (int i = 0; i < 4; i++) {
        submit(s[i % 2], toks, n, 16, &r[i]);
        wait_done(&r[i]);
        assert_int_equal(r[i].end_type, LMS_EV_END);
        assert_int_equal(r[i].n_tok, 16);
        assert_memory_equal(r[i].toks, r[0].toks, sizeof(int32_t) * 16);
    }
    for (int i = 0; i < 2; i++) {
        assert_idle_pool(s[i]);
        lms_sched_destroy(s[i]);
    }
}

/* A long shared prefix is computed once. */
static void test_prefix_reuse(void **state)
{
    static int32_t toks[1100];
    static result a, b;
    int n = 0;
    toks[n++] = 1;
    while (n < 1000)
        toks[n] = 10 + (n * 7) % 400, n++;
    lms_sched *s = make_sched(2, 0, 8);
    submit(s, toks, 1000, 8, &a);
    wait_done(&a);
    assert_int_equal(a.stats.n_cached, 0);
    toks[1000] = 33; /* same 1000-token prefix, one more token */
    submit(s, toks, 1001, 8, &b);
    wait_done(&b);
    printf("second request: %d of %d prompt tokens cached\n", b.stats.n_cached, b.stats.n_prompt);
    assert_true(b.stats.n_cached >= 960);
    assert_idle_pool(s);
    lms_sched_stats st;
    lms_sched_get_stats(s, &st);
    assert_true(st.prefix_hits >= 960);
    assert_true(st.kv_blocks_cached > 0);
    lms_sched_destroy(s);
}

/* Two requests with one 1000-token prompt submitted together: the second
 * waits for the first's prefill and maps its blocks instead of computing
 * them beside it; both give the same greedy tokens. */
static void test_prefix_wait(void **state)
{
    (void)state;
    static int32_t toks[1000];
    static result a, b;
    int n = 0;
    toks[n++] = 1;
    while (n < 1000)
        toks[n] = 10 + (n * 11) % 400, n++;
    lms_sched *s = make_sched(2, 0, 8); /* 64 prompt tokens a step: 16 steps of prefill */
    submit(s, toks, 1000, 6, &a);
    submit(s, toks, 1000, 6, &b);
    wait_done(&a);
    wait_done(&b);
    printf("together: %d and %d of 1000 prompt tokens cached\n", a.stats.n_cached,
           b.stats.n_cached);
    assert_int_equal(a.stats.n_cached, 0);
    assert_int_equal(b.stats.n_cached, 992); /* every full block before the last token */
    assert_int_equal(a.n_tok, b.n_tok);
    assert_memory_equal(a.toks, b.toks, sizeof a.toks[0] * (size_t)a.n_tok);
    assert_idle_pool(s);
    lms_sched_destroy(s);
}

/* Prompt log-probabilities: one event per prompt token after the first,
 * each the log-softmax of a forward pass's logits at the token before it
 * (computed here with lms_forward directly); max_tokens 0 generates
 * nothing; with tokens to generate, the greedy ones are those of a plain
 * request. The prompt is longer than a step's PLP_ROWS, so it spans steps. */
static void test_prompt_logprobs(void **state)
{
    (void)state;
    static int32_t toks[120];
    static result a, b, c;
    int n = 0;
    toks[n++] = 1;
    while (n < 100)
        toks[n] = 10 + (n * 13) % 400, n++;
    lms_sched *s = make_sched(2, 0, 8);
    lms_request req = {.tokens = toks, .n_tokens = n, .max_tokens = 0, .sp = lms_sampler_defaults(),
                       .cb = on_event, .user = &a, .prompt_logprobs = true, .n_logprobs = 2};
    req.sp.temperature = 0;
    uint64_t id;
    char err[256];
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), 0);
    wait_done(&a);
    assert_int_equal(a.end_type, LMS_EV_END);
    assert_int_equal(a.stats.n_gen, 0);
    assert_int_equal(a.n_plp, n - 1);
    /* the reference: every position's logits from one forward pass */
    lms_ctx_params cp = {.n_ctx = 256, .n_batch = 128, .n_seq = 1, .n_threads = 2};
    lms_ctx *ctx;
    assert_int_equal(lms_ctx_create(g_model, &cp, &ctx, err, sizeof err), 0);
    lms_kv_seq seq = {0};
    assert_int_equal(lms_kv_seq_reserve(lms_ctx_kv(ctx), &seq, n), 0);
    static int32_t pos[120];
    static bool want[120];
    static lms_kv_seq *sp[120];
    for (int i = 0; i < n; i++)
        pos[i] = i, want[i] = true, sp[i] = &seq;
    const int32_t nv = g_model->hp.n_vocab;
    float *lg = malloc((size_t)n * nv * sizeof *lg);
    lms_batch bt = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = sp, .logits = want};
    assert_int_equal(lms_forward(ctx, &bt, lg), 0);
    double worst = 0;
    for (int i = 0; i + 1 < n; i++) {
        const float *row = lg + (size_t)i * nv;
        float mx = row[0];
        int32_t arg = 0;
        for (int32_t t = 1; t < nv; t++)
            if (row[t] > mx)
                mx = row[t], arg = t;
        double sum = 0;
        for (int32_t t = 0; t < nv; t++)
            sum += exp((double)(row[t] - mx));
        const double ref = row[toks[i + 1]] - mx - log(sum);
        assert_int_equal(a.plp_tok[i], toks[i + 1]);
        worst = fmax(worst, fabs(ref - a.plp_lp[i]));
        assert_int_equal(a.plp_top0_id[i], arg);
        assert_true(a.plp_top0[i] >= a.plp_lp[i]);
    }
    printf("prompt log-probabilities: %d, largest difference from the forward pass %.2g\n", a.n_plp,
           worst);
    assert_true(worst < 1e-3);
    free(lg);
    lms_kv_seq_release(lms_ctx_kv(ctx), &seq);
    lms_ctx_destroy(ctx);
    /* with tokens to generate: the same greedy tokens as a plain request */
    req.max_tokens = 6;
    req.user = &b;
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), 0);
    wait_done(&b);
    submit(s, toks, n, 6, &c);
    wait_done(&c);
    assert_int_equal(b.n_plp, n - 1);
    assert_int_equal(b.n_tok, c.n_tok);
    assert_memory_equal(b.toks, c.toks, sizeof b.toks[0] * (size_t)b.n_tok);
    assert_idle_pool(s);
    lms_sched_destroy(s);
}

/* Aborts while queued, while prefilling, while decoding; then the pool is
 * whole again and new work runs. */
static void test_abort_every_state(void **state)
{
    static int32_t longp[1500];
    static result r[4], after;
    for (int i = 0; i < 1500; i++)
        longp[i] = 5 + i % 300;
    lms_sched *s = make_sched(1, 0, 8);
    uint64_t running = submit(s, longp, 1500, 400, &r[0]); /* long prefill */
    uint64_t queued = submit(s, longp, 20, 10, &r[1]);
    lms_sched_abort(s, queued);
    usleep(2000);
    lms_sched_abort(s, running);
    wait_done(&r[0]);
    wait_done(&r[1]);
    assert_string_equal(r[1].stats.finish, "abort");
    assert_string_equal(r[0].stats.finish, "abort");
    uint64_t dec = submit(s, longp, 10, 1000, &r[2]);
    while (1) { /* wait until it is decoding */
        pthread_mutex_lock(&g_mu);
        int nt = r[2].n_tok;
        pthread_mutex_unlock(&g_mu);
        if (nt >= 3)
            break;
        usleep(500);
    }
    lms_sched_abort(s, dec);
    wait_done(&r[2]);
    assert_string_equal(r[2].stats.finish, "abort");
    assert_true(r[2].n_tok < 1000);
    lms_sched_abort(s, 987654); /* unknown id: ignored */
    /* a deadline ends a request like an abort, with its own reason */
    static result late;
    lms_request dl = {.tokens = longp, .n_tokens = 10, .max_tokens = 1500, .timeout_ms = 30,
                      .sp = lms_sampler_defaults(), .cb = on_event, .user = &late, .ignore_eos = true};
    uint64_t dl_id;
    char dl_err[128];
    assert_int_equal(lms_sched_submit(s, &dl, &dl_id, dl_err, sizeof dl_err), 0);
    wait_done(&late);
    assert_string_equal(late.stats.finish, "deadline");
    assert_true(late.n_tok < 1500);
    assert_idle_pool(s);
    submit(s, longp, 10, 5, &after);
    wait_done(&after);
    assert_int_equal(after.n_tok, 5);
    lms_sched_destroy(s);
}

/* A pool too small for all requests at once: they wait, then all finish. */
static void test_pool_exhaustion(void **state)
{
    static result r[6];
    int32_t toks[64];
    int n = tokenize(prompts[0], toks, 64);
    const lms_hparams *hp = &g_model->hp;
    int64_t per_block = (int64_t)LMS_KV_BLOCK * hp->n_layer * hp->n_head_kv * hp->head_dim * 4;
    lms_sched *s = make_sched(6, per_block * 10, 16); /* 10 blocks: ~2 requests of 80 positions */
    for (int i = 0; i < 6; i++)
        submit(s, toks, n, 70, &r[i]);
    for (int i = 0; i < 6; i++) {
        wait_done(&r[i]);
        assert_int_equal(r[i].end_type, LMS_EV_END);
        assert_int_equal(r[i].n_tok, 70);
    }
    /* a request that can never fit is refused at submit */
    lms_request big = {.tokens = toks, .n_tokens = n, .max_tokens = 1000,
                       .sp = lms_sampler_defaults(), .cb = on_event, .user = &r[0]};
    uint64_t id;
    char err[256];
    assert_int_equal(lms_sched_submit(s, &big, &id, err, sizeof err), LMS_ERR_LIMIT);
    assert_idle_pool(s);
    lms_sched_destroy(s);
}

static void test_refusals(void **state)
{
    static result r[4];
    int32_t toks[4] = {1, 2, 3, 999999};
    lms_sched *s = make_sched(1, 0, 1);
    lms_request req = {.tokens = toks, .n_tokens = 4, .max_tokens = 4,
                       .sp = lms_sampler_defaults(), .cb = on_event, .user = &r[0]};
    uint64_t id;
    char err[256];
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), LMS_ERR_RANGE);
    assert_non_null(strstr(err, "999999"));
    req.n_tokens = 0;
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), LMS_ERR_INVAL);
    req.n_tokens = 3;
    req.sp.temperature = -1;
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), LMS_ERR_INVAL);
    assert_non_null(strstr(err, "temperature"));
    req.sp = lms_sampler_defaults();
    req.max_tokens = 300;
    /* queue of 1: the first runs, the second queues, the third is refused */
    static int32_t longp[1200];
    for (int i = 0; i < 1200; i++)
        longp[i] = 5 + i % 300;
    req.tokens = longp;
    req.n_tokens = 1200;
    req.user = &r[1];
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), 0);
    for (int i = 0; i < 5000; i++) { /* wait until the first is admitted */
        lms_sched_stats st;
        lms_sched_get_stats(s, &st);
        if (st.n_running == 1 && st.n_queued == 0)
            break;
        usleep(1000);
    }
    req.user = &r[2];
    uint64_t id2;
    assert_int_equal(lms_sched_submit(s, &req, &id2, err, sizeof err), 0);
    req.user = &r[3];
    int rc = lms_sched_submit(s, &req, &id, err, sizeof err);
    assert_int_equal(rc, LMS_ERR_BUSY);
    lms_sched_destroy(s); /* running and queued end with abort */
    assert_true(r[1].done && r[2].done);
    assert_string_equal(r[2].stats.finish, "abort");
}

static void test_embeddings_and_stop(void **state)
{
    static result e1, e2, st;
    int32_t toks[64];
    int n = tokenize(prompts[2], toks, 64);
    lms_sched *s = make_sched(2, 0, 8);
    lms_request req = {.tokens = toks, .n_tokens = n, .embedding = true, .pooling = LMS_POOL_MEAN,
                       .cb = on_event, .user = &e1};
    uint64_t id;
    char err[256];
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), 0);
    req.user = &e2;
    req.pooling = LMS_POOL_LAST;
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), 0);
    wait_done(&e1);
    wait_done(&e2);
    assert_int_equal(e1.n_embd, g_model->hp.n_embd);
    assert_true(e1.embd0 != e2.embd0);
    /* stop string: greedy story contains " Lily" */
    const char *stop[] = {" Lily"};
    int np = tokenize("Once upon a time", toks, 64);
    lms_request g = {.tokens = toks, .n_tokens = np, .max_tokens = 40, .sp = lms_sampler_defaults(),
                     .stop = stop, .n_stop = 1, .cb = on_event, .user = &st};
    g.sp.temperature = 0;
    assert_int_equal(lms_sched_submit(s, &g, &id, err, sizeof err), 0);
    wait_done(&st);
    st.text[st.n_text] = 0;
    assert_string_equal(st.stats.finish, "stop");
    assert_string_equal(st.text, ", there was a little girl named");
    assert_idle_pool(s);
    lms_sched_destroy(s);
}

static volatile int g_stalled;

static void on_stall(void *ud, lms_sched *s)
{
    (void)ud, (void)s;
    pthread_mutex_lock(&g_mu);
    g_stalled = 1;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* A step that hangs (test-only fault hook) is noticed by the watchdog; the
 * owner abandons the scheduler, its requests fail with an error, and a new
 * scheduler serves the next request. */
static void test_watchdog_restart(void **state)
{
    static result hung, next;
    int32_t toks[64];
    int n = tokenize(prompts[0], toks, 64);
    lms_watchdog *wd = lms_watchdog_create(50);
    lms_sched_params p = {.n_ctx = 256, .n_parallel = 2, .n_batch = 64, .max_queue = 8,
                          .n_threads = 1, .watchdog = wd, .stall_ms = 300, .on_stall = on_stall};
    lms_sched *s;
    char err[256];
    assert_int_equal(lms_sched_create(g_model, &p, &s, err, sizeof err), 0);
    lms_fault_set("hang_step", 3);
    submit(s, toks, n, 50, &hung);
    pthread_mutex_lock(&g_mu);
    while (!g_stalled)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    lms_sched_abandon(s, "the engine stalled; restarting");
    wait_done(&hung);
    assert_int_equal(hung.end_type, LMS_EV_ERROR);
    assert_int_equal(hung.n_tok, 2); /* two steps ran before the hang */
    lms_fault_set("hang_step", 0);
    assert_int_equal(lms_sched_create(g_model, &p, &s, err, sizeof err), 0);
    submit(s, toks, n, 5, &next);
    wait_done(&next);
    assert_int_equal(next.end_type, LMS_EV_END);
    assert_int_equal(next.n_tok, 5);
    lms_sched_destroy(s);
    usleep(20000); /* the abandoned thread exits on its own */
    lms_watchdog_destroy(wd);
}

static int setup(void **state)
{
    char err[256];
    if (lms_model_load(tu_data_path("models/stories260K.gguf"), &g_model, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    lms_model_free(g_model);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_solo), cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_abort_every_state),   cmocka_unit_test(test_pool_exhaustion),
        cmocka_unit_test(test_refusals),            cmocka_unit_test(test_embeddings_and_stop),
        cmocka_unit_test(test_watchdog_restart),
        cmocka_unit_test(test_schedulers_take_turns),
        cmocka_unit_test(test_prefix_wait),
        cmocka_unit_test(test_prompt_logprobs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
