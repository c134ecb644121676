/*
 * test_spec.c - speculative decoding: the prompt-lookup proposer, the
 * draft model's vocabulary check, and through the scheduler and the CLI's
 * session: greedy output with every proposer equal token for token to
 * plain decoding (several prompts at once), seeded sampling the same as
 * without speculation and its token distribution, the same model as draft
 * taking every proposal, rollback (a block filled by rejected proposals
 * never enters the prefix cache), aborts and a short pool.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/err.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/sched.h"
#include "engine/spec.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "serve/serve_int.h"
#include "testutil.h"

#define MAX_TOK 256

typedef struct result {
    int32_t toks[MAX_TOK];
    int n_tok;
    bool done;
    int end_type;
    lms_req_stats stats;
} result;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static lms_model *g_stories, *g_f32;

static void on_event(void *user, lms_event *ev)
{
    result *r = user;
    pthread_mutex_lock(&g_mu);
    if (ev->type == LMS_EV_TOKEN) {
        if (ev->token >= 0 && r->n_tok < MAX_TOK)
            r->toks[r->n_tok++] = ev->token;
    } else if (ev->type == LMS_EV_END || ev->type == LMS_EV_ERROR) {
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

static lms_sched *make_sched(lms_model *m, int mode, const char *draft, int n_max, float p_min,
                             int64_t kv_budget, bool no_prefix)
{
    lms_sched_params p = {.n_ctx = 1024, .n_parallel = 6, .n_batch = 64, .max_queue = 32,
                          .n_threads = 2, .kv_budget_bytes = kv_budget,
                          .no_prefix_cache = no_prefix,
                          .spec = {.mode = mode, .n_max = n_max, .p_min = p_min},
                          .draft_model = draft ? tu_data_path(draft) : NULL};
    lms_sched *s;
    char err[512];
    if (lms_sched_create(m, &p, &s, err, sizeof err) < 0)
        fail_msg("%s", err);
    return s;
}

static lms_request request(const int32_t *toks, int n, int max_tokens, result *r, float temp,
                           uint64_t seed)
{
    lms_request req = {.tokens = toks, .n_tokens = n, .max_tokens = max_tokens,
                       .sp = lms_sampler_defaults(), .cb = on_event, .user = r, .ignore_eos = true};
    req.sp.temperature = temp;
    req.sp.seed = seed;
    return req;
}

static void submit_req(lms_sched *s, const lms_request *req)
{
    uint64_t id;
    char err[256];
    if (lms_sched_submit(s, req, &id, err, sizeof err) < 0)
        fail_msg("submit: %s", err);
}

static void assert_idle(lms_sched *s)
{
    lms_sched_stats st;
    for (int i = 0; i < 500; i++) {
        lms_sched_get_stats(s, &st);
        if (st.kv_blocks_used == 0 && st.draft_blocks_used == 0 && !st.busy)
            break;
        usleep(1000);
    }
    assert_int_equal(st.kv_blocks_used, 0);
    assert_int_equal(st.draft_blocks_used, 0);
    assert_int_equal(st.n_running, 0);
}

/* Prompts of different lengths; the last ones repeat text (prompt lookup
 * finds them). */
#define N_PROMPTS 6
static int make_prompt(int i, int32_t *t)
{
    static const int len[N_PROMPTS] = {5, 17, 40, 9, 70, 33};
    int n = 0;
    t[n++] = 1;
    while (n < len[i])
        t[n] = i >= 3 ? 20 + (n % (5 + i)) * 13 % 300 : 3 + (n * 37 + i * 101) % 500, n++;
    return n;
}

/* Runs the prompts at once (temperature temp, seed i + 1 each) and
 * returns the scheduler's totals. */
static void run_all(lms_sched *s, result *r, int max_tokens, float temp)
{
    static int32_t toks[N_PROMPTS][80];
    memset(r, 0, sizeof(result) * N_PROMPTS);
    for (int i = 0; i < N_PROMPTS; i++) {
        int n = make_prompt(i, toks[i]);
        lms_request req = request(toks[i], n, max_tokens - 3 * i, &r[i], temp, (uint64_t)i + 1);
        submit_req(s, &req);
        if (i == 2)
            usleep(2000); /* later arrivals join running steps */
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        wait_done(&r[i]);
        assert_int_equal(r[i].end_type, LMS_EV_END);
    }
}

static void assert_same(const result *a, const result *b)
{
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_int_equal(a[i].n_tok, b[i].n_tok);
        assert_memory_equal(a[i].toks, b[i].toks, sizeof(int32_t) * (size_t)a[i].n_tok);
    }
}

/* ---- proposers ---------------------------------------------------------- */

static void test_ngram(void **state)
{
    (void)state;
    int32_t out[8];
    /* "1 2 3 4 5 1 2 3": the 3-gram 1 2 3 was followed by 4 5 1 2 3 */
    const int32_t a[] = {1, 2, 3, 4, 5, 1, 2, 3};
    assert_int_equal(lms_spec_ngram(a, 8, 3, 1, 4, out), 4);
    assert_int_equal(out[0], 4);
    assert_int_equal(out[1], 5);
    assert_int_equal(out[2], 1);
    assert_int_equal(out[3], 2);
    /* the continuation stops at the end of the sequence */
    assert_int_equal(lms_spec_ngram(a, 8, 3, 1, 8, out), 5);
    /* the most recent match wins: "7 9 ... 7 8 ... 7" -> 8 */
    const int32_t b[] = {7, 9, 0, 7, 8, 0, 7};
    assert_int_equal(lms_spec_ngram(b, 7, 3, 1, 1, out), 1);
    assert_int_equal(out[0], 8);
    /* the longer n-gram is preferred: "5 7 1 ... 6 7 2 ... 6 7" -> 2 */
    const int32_t c[] = {5, 7, 1, 6, 7, 2, 9, 7, 3, 6, 7};
    assert_int_equal(lms_spec_ngram(c, 11, 3, 1, 1, out), 1);
    assert_int_equal(out[0], 2);
    /* with ngram_min 2 a lone token does not match */
    const int32_t d[] = {4, 1, 2, 3, 4};
    assert_int_equal(lms_spec_ngram(d, 5, 3, 2, 4, out), 0);
    assert_int_equal(lms_spec_ngram(d, 5, 3, 1, 4, out), 4);
    assert_int_equal(out[0], 1);
    /* nothing earlier, an empty or one-token sequence */
    const int32_t e[] = {1, 2, 3};
    assert_int_equal(lms_spec_ngram(e, 3, 3, 1, 4, out), 0);
    assert_int_equal(lms_spec_ngram(e, 1, 3, 1, 4, out), 0);
    assert_int_equal(lms_spec_ngram(e, 0, 3, 1, 4, out), 0);
}

static void test_vocab_check(void **state)
{
    (void)state;
    char err[512];
    lms_drafter *d = NULL;
    assert_int_equal(lms_drafter_create(g_f32, tu_data_path("models/llama-synth-q4_0.gguf"), 256,
                                        64, 1, 0, 2, NULL, &d, err, sizeof err),
                     0);
    lms_drafter_destroy(d);
    d = NULL;
    int rc = lms_drafter_create(g_f32, tu_data_path("models/qwen3-synth-f16.gguf"), 256, 64, 1, 0,
                                2, NULL, &d, err, sizeof err);
    assert_int_equal(rc, LMS_ERR_UNSUPPORTED);
    assert_null(d);
    assert_non_null(strstr(err, "qwen3-synth-f16.gguf"));
    assert_non_null(strstr(err, "vocabulary does not match"));
    rc = lms_drafter_create(g_f32, "/nonexistent/draft.gguf", 256, 64, 1, 0, 2, NULL, &d, err,
                            sizeof err);
    assert_true(rc < 0);
    assert_non_null(strstr(err, "/nonexistent/draft.gguf"));
    /* a scheduler refuses a draft mode without a draft, and bad ranges */
    lms_sched_params p = {.n_ctx = 256, .n_parallel = 1, .n_batch = 16, .max_queue = 4,
                          .n_threads = 2, .spec = {.mode = LMS_SPEC_DRAFT}};
    lms_sched *s = NULL;
    assert_true(lms_sched_create(g_f32, &p, &s, err, sizeof err) < 0);
    assert_non_null(strstr(err, "draft"));
    p.spec = (lms_spec_params){.mode = LMS_SPEC_NGRAM, .n_max = LMS_SPEC_MAX + 1};
    assert_true(lms_sched_create(g_f32, &p, &s, err, sizeof err) < 0);
    assert_non_null(strstr(err, "draft-max"));
    assert_null(s);
}

/* The request fields, llama-server's keys: 0 turns speculation (n_max) or
 * the limit (n_min, p_min) off for the request; out of range refused. */
static void test_request_fields(void **state)
{
    (void)state;
    genparams gp;
    reqerr e;
    json_error_t je;
    json_t *o = json_loads("{\"speculative.n_max\":3,\"speculative.n_min\":2,"
                           "\"speculative.p_min\":0.5}", 0, &je);
    genparams_init(&gp, 1);
    assert_int_equal(reqparse_gen(o, &gp, &e), 0);
    lms_request r = genparams_request(&gp, NULL, 0);
    assert_int_equal(r.spec_n_max, 3);
    assert_int_equal(r.spec_n_min, 2);
    assert_true(r.spec_p_min == 0.5f);
    genparams_deinit(&gp);
    json_decref(o);
    o = json_loads("{\"speculative.n_max\":0,\"speculative.n_min\":0,\"speculative.p_min\":0}",
                   0, &je);
    genparams_init(&gp, 1);
    assert_int_equal(reqparse_gen(o, &gp, &e), 0);
    assert_true(gp.spec_n_max < 0 && gp.spec_n_min < 0 && gp.spec_p_min < 0);
    genparams_deinit(&gp);
    json_decref(o);
    const char *bad[][2] = {{"{\"speculative.n_max\":-1}", "speculative.n_max"},
                            {"{\"speculative.n_max\":1000}", "speculative.n_max"},
                            {"{\"speculative.n_min\":\"2\"}", "speculative.n_min"},
                            {"{\"speculative.p_min\":1.5}", "speculative.p_min"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = json_loads(bad[i][0], 0, &je);
        genparams_init(&gp, 1);
        assert_int_equal(reqparse_gen(o, &gp, &e), -1);
        assert_string_equal(e.param, bad[i][1]);
        genparams_deinit(&gp);
        json_decref(o);
    }
}

/* ---- greedy: token for token -------------------------------------------------- */

static void greedy_case(lms_model *m, int mode, const char *draft, int n_max, float p_min,
                        bool full_accept, bool some_accept)
{
    static result plain[N_PROMPTS], spec[N_PROMPTS];
    lms_sched *s0 = make_sched(m, LMS_SPEC_NONE, NULL, 0, 0, 0, false);
    run_all(s0, plain, 48, 0.0f);
    lms_sched_destroy(s0);
    lms_sched *s = make_sched(m, mode, draft, n_max, p_min, 0, false);
    run_all(s, spec, 48, 0.0f);
    assert_same(plain, spec);
    lms_sched_stats st;
    lms_sched_get_stats(s, &st);
    int32_t drafted = 0, accepted = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        drafted += spec[i].stats.n_drafted;
        accepted += spec[i].stats.n_accepted;
        assert_true(spec[i].stats.n_accepted <= spec[i].stats.n_drafted);
    }
    printf("%s %s: drafted %d, accepted %d\n", mode == LMS_SPEC_NGRAM ? "ngram" : "draft",
           draft ? draft : "", drafted, accepted);
    assert_int_equal((int64_t)st.spec_drafted, drafted);
    assert_int_equal((int64_t)st.spec_accepted, accepted);
    assert_true(drafted > 0);
    if (full_accept)
        assert_int_equal(accepted, drafted);
    if (some_accept)
        assert_true(accepted > 0);
    assert_idle(s);
    lms_sched_destroy(s);
}

static void test_greedy_same_model(void **state)
{
    (void)state;
    greedy_case(g_stories, LMS_SPEC_DRAFT, "models/stories260K.gguf", 0, 0.0f, true, true);
}

static void test_greedy_quantized_draft(void **state)
{
    (void)state;
    greedy_case(g_f32, LMS_SPEC_DRAFT, "models/llama-synth-q4_0.gguf", 0, 0.0f, false, true);
}

/* A 50k-token vocabulary, F16 weights, the same model as draft. */
static void test_greedy_qwen3(void **state)
{
    (void)state;
    lms_model *m;
    char err[512];
    assert_int_equal(lms_model_load(tu_data_path("models/qwen3-synth-f16.gguf"), &m, err, sizeof err), 0);
    greedy_case(m, LMS_SPEC_DRAFT, "models/qwen3-synth-f16.gguf", 0, 0.0f, false, true);
    lms_model_free(m);
}

static void test_greedy_other_draft(void **state)
{
    (void)state; /* a draft that is mostly wrong: every step rolls back */
    greedy_case(g_f32, LMS_SPEC_DRAFT, "models/stories260K.gguf", 3, 0.0f, false, false);
}

static void test_greedy_ngram(void **state)
{
    (void)state;
    greedy_case(g_stories, LMS_SPEC_NGRAM, NULL, 0, 0, false, true);
    greedy_case(g_f32, LMS_SPEC_NGRAM, NULL, 0, 0, false, true);
}

/* ---- sampling ---------------------------------------------------------------- */

/* Seeded sampling with speculation gives the tokens of plain decoding with
 * the same seed (one draw per token from the sequence's own chain), and
 * so the same run after run. */
static void test_sampling_seeded(void **state)
{
    (void)state;
    static result plain[N_PROMPTS], a[N_PROMPTS], b[N_PROMPTS];
    lms_sched *s0 = make_sched(g_stories, LMS_SPEC_NONE, NULL, 0, 0, 0, false);
    run_all(s0, plain, 40, 0.8f);
    lms_sched_destroy(s0);
    lms_sched *s = make_sched(g_stories, LMS_SPEC_DRAFT, "models/stories260K.gguf", 0, 0.0f, 0,
                              false);
    run_all(s, a, 40, 0.8f);
    run_all(s, b, 40, 0.8f);
    assert_same(a, b);
    assert_same(plain, a);
    lms_sched_stats st;
    lms_sched_get_stats(s, &st);
    printf("sampling, same model as draft: drafted %llu, accepted %llu\n",
           (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted);
    assert_true(st.spec_accepted > 0 && st.spec_accepted < st.spec_drafted);
    assert_idle(s);
    lms_sched_destroy(s);
}

typedef struct collect {
    int32_t toks[4];
    int n;
} collect;

static bool on_piece(void *ud, const char *text, size_t n, int32_t token, float prob)
{
    (void)text, (void)n, (void)prob;
    collect *c = ud;
    if (token >= 0 && c->n < 4)
        c->toks[c->n++] = token;
    return true;
}

/* The distribution of the first token drawn from a proposal's row (the
 * third generated token: the pass after the first runs the first token and
 * the draft's proposal for the second, whose row gives the third) over 2000
 * seeds equals that of plain decoding: total variation distance of the
 * two histograms well under what a biased verifier gives. Session level
 * (lmserv run's loop) with the same model as draft at temperature 1. */
static void test_sampling_distribution(void **state)
{
    (void)state;
#ifdef __SANITIZE_ADDRESS__
    enum { N = 400 }; /* the draws are equal seed by seed; fewer keep ASan builds quick */
#else
    enum { N = 2000 };
#endif
    const int32_t nv = g_stories->hp.n_vocab;
    int *h[2] = {calloc((size_t)nv, sizeof(int)), calloc((size_t)nv, sizeof(int))};
    int *first = calloc((size_t)nv, sizeof(int));
    lms_ctx *c;
    char err[512];
    lms_ctx_params cp = {.n_ctx = 64, .n_batch = 64, .n_seq = 1, .n_threads = 2};
    assert_int_equal(lms_ctx_create(g_stories, &cp, &c, err, sizeof err), 0);
    lms_drafter *d;
    assert_int_equal(lms_drafter_create(g_stories, tu_data_path("models/stories260K.gguf"), 64, 64, 1,
                                        0, 2, NULL, &d, err, sizeof err),
                     0);
    int32_t prompt[6] = {1, 400, 30, 291, 29, 10};
    int32_t drafted = 0, accepted = 0;
    for (int pass = 0; pass < 2; pass++) {
        lms_session ses;
        lms_session_init(&ses, c);
        lms_draft_seq ds = {0};
        for (uint64_t seed = 1; seed <= N; seed++) {
            lms_gen_params gp = {.sp = lms_sampler_defaults(), .n_predict = 3, .ignore_eos = true};
            gp.sp.temperature = 1.0f;
            gp.sp.top_k = 0;
            gp.sp.top_p = 1.0f;
            gp.sp.min_p = 0.0f;
            gp.sp.seed = seed * 7919;
            if (pass == 1)
                gp.spec = (lms_spec_params){.mode = LMS_SPEC_DRAFT, .n_max = 4, .n_min = 0,
                                            .p_min = 0, .ngram_max = 3, .ngram_min = 1},
                gp.drafter = d, gp.draft_seq = &ds;
            collect col = {0};
            lms_gen_stats st;
            lms_session_reset(&ses);
            assert_int_equal(lms_session_generate(&ses, prompt, 6, &gp, on_piece, &col, &st, err,
                                                  sizeof err),
                             0);
            assert_int_equal(col.n, 3);
            h[pass][col.toks[2]]++;
            if (pass == 0)
                first[col.toks[0]]++;
            drafted += st.n_drafted;
            accepted += st.n_accepted;
        }
        lms_draft_seq_release(d, &ds);
        lms_session_deinit(&ses);
    }
    double tv = 0, tv_first = 0;
    for (int32_t i = 0; i < nv; i++) {
        tv += fabs((double)h[0][i] - h[1][i]) / (2.0 * N);
        tv_first += fabs((double)h[0][i] - first[i]) / (2.0 * N);
    }
    printf("third token over %d seeds: drafted %d, accepted %d; total variation %.4f "
           "(against another position's distribution: %.4f)\n",
           N, drafted, accepted, tv, tv_first);
    assert_true(drafted > 0 && accepted > 0);
    assert_true(tv < 0.05);
    assert_true(tv_first > 0.1); /* the check can tell distributions apart */
    lms_drafter_destroy(d);
    lms_ctx_destroy(c);
    free(h[0]);
    free(h[1]);
    free(first);
}

/* ---- rollback, prefix cache, aborts, a short pool -------------------------------- */

/* A draft that is nearly always wrong writes rejected proposals' K/V into
 * blocks past the sequence's end every step; the blocks that enter the
 * prefix cache must hold only taken tokens: a request whose prompt is the
 * first one's prompt and output maps them and gives the tokens of a cold
 * run (no prefix cache). */
static void test_rollback_prefix_cache(void **state)
{
    (void)state;
    static int32_t toks[300];
    static result a, b, cold;
    int n = 0;
    toks[n++] = 1;
    while (n < 37)
        toks[n] = 3 + (n * 53) % 500, n++;
    lms_sched *s = make_sched(g_f32, LMS_SPEC_DRAFT, "models/stories260K.gguf", 8, 0.0f, 0, false);
    lms_request ra = request(toks, n, 90, &a, 0.0f, 1);
    submit_req(s, &ra);
    wait_done(&a);
    assert_int_equal(a.n_tok, 90);
    assert_true(a.stats.n_drafted > a.stats.n_accepted); /* rejections happened */
    memcpy(toks + n, a.toks, sizeof(int32_t) * 90);
    const int nb = n + 90;
    lms_request rb = request(toks, nb, 20, &b, 0.0f, 1);
    submit_req(s, &rb);
    wait_done(&b);
    printf("after rollbacks: %d of %d prompt tokens from the prefix cache\n", b.stats.n_cached, nb);
    assert_true(b.stats.n_cached >= (nb - 1) / LMS_KV_BLOCK * LMS_KV_BLOCK - LMS_KV_BLOCK);
    assert_idle(s);
    lms_sched_destroy(s);
    lms_sched *c = make_sched(g_f32, LMS_SPEC_NONE, NULL, 0, 0, 0, true);
    lms_request rc = request(toks, nb, 20, &cold, 0.0f, 1);
    submit_req(c, &rc);
    wait_done(&cold);
    assert_int_equal(cold.stats.n_cached, 0);
    assert_int_equal(b.n_tok, cold.n_tok);
    assert_memory_equal(b.toks, cold.toks, sizeof(int32_t) * (size_t)cold.n_tok);
    lms_sched_destroy(c);
}

/* An abort while speculating frees the sequence's blocks in both pools;
 * per-request settings turn speculation off or narrow it. */
static void test_abort_and_request_settings(void **state)
{
    (void)state;
    static int32_t toks[16];
    static result r, off, two;
    for (int i = 0; i < 16; i++)
        toks[i] = i ? 5 + i * 7 : 1;
    lms_sched *s = make_sched(g_stories, LMS_SPEC_DRAFT, "models/stories260K.gguf", 8, 0.0f, 0,
                              false);
    lms_request req = request(toks, 16, 900, &r, 0.0f, 1);
    uint64_t id;
    char err[256];
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), 0);
    for (;;) {
        pthread_mutex_lock(&g_mu);
        int nt = r.n_tok;
        pthread_mutex_unlock(&g_mu);
        if (nt >= 20)
            break;
        usleep(300);
    }
    lms_sched_stats st;
    lms_sched_get_stats(s, &st);
    assert_true(st.draft_blocks_used > 0);
    lms_sched_abort(s, id);
    wait_done(&r);
    assert_string_equal(r.stats.finish, "abort");
    assert_idle(s);
    /* n_max < 0: off; n_max 2: two proposals a step at most */
    req = request(toks, 16, 30, &off, 0.0f, 1);
    req.spec_n_max = -1;
    submit_req(s, &req);
    wait_done(&off);
    assert_int_equal(off.stats.n_drafted, 0);
    req = request(toks, 16, 30, &two, 0.0f, 1);
    req.spec_n_max = 2;
    submit_req(s, &req);
    wait_done(&two);
    assert_true(two.stats.n_drafted > 0 && two.stats.n_drafted <= 2 * 30);
    assert_int_equal(two.stats.n_accepted, two.stats.n_drafted); /* the same model */
    assert_memory_equal(off.toks, two.toks, sizeof(int32_t) * 30);
    req.spec_p_min = 1.5f; /* out of range */
    assert_int_equal(lms_sched_submit(s, &req, &id, err, sizeof err), LMS_ERR_INVAL);
    assert_idle(s);
    lms_sched_destroy(s);
}

/* A pool with room for two requests at a time: speculation stays inside
 * each request's reservation, so the six finish as without it. */
static void test_short_pool(void **state)
{
    (void)state;
    static result plain[N_PROMPTS], spec[N_PROMPTS];
    const lms_hparams *hp = &g_stories->hp;
    int64_t per_block = (int64_t)LMS_KV_BLOCK * hp->n_layer * hp->n_head_kv * hp->head_dim * 4;
    lms_sched *s0 = make_sched(g_stories, LMS_SPEC_NONE, NULL, 0, 0, per_block * 14, false);
    run_all(s0, plain, 48, 0.0f);
    lms_sched_destroy(s0);
    lms_sched *s = make_sched(g_stories, LMS_SPEC_NGRAM, NULL, 6, 0, per_block * 14, false);
    run_all(s, spec, 48, 0.0f);
    assert_same(plain, spec);
    assert_idle(s);
    lms_sched_destroy(s);
    /* two requests with one 150-token prompt: the target's pool holds both
     * (the second maps the first's blocks), the draft's pool (as many
     * blocks, no sharing) one: the second goes without proposals until
     * there is room, and both give the plain tokens */
    static int32_t toks[160];
    static result a[2], b[2];
    toks[0] = 1;
    for (int i = 1; i < 150; i++)
        toks[i] = 3 + (i * 29) % 400;
    for (int pass = 0; pass < 2; pass++) {
        result *r = pass ? b : a;
        s = pass ? make_sched(g_stories, LMS_SPEC_DRAFT, "models/stories260K.gguf", 4, 0.0f,
                              per_block * 14, false)
                 : make_sched(g_stories, LMS_SPEC_NONE, NULL, 0, 0, per_block * 14, false);
        for (int i = 0; i < 2; i++) {
            lms_request req = request(toks, 150, 20, &r[i], 0.0f, 1);
            submit_req(s, &req);
        }
        wait_done(&r[0]);
        wait_done(&r[1]);
        assert_idle(s);
        lms_sched_destroy(s);
    }
    for (int i = 0; i < 2; i++) {
        assert_int_equal(b[i].end_type, LMS_EV_END);
        assert_int_equal(b[i].n_tok, 20);
        assert_memory_equal(a[i].toks, b[i].toks, sizeof(int32_t) * 20);
    }
    printf("draft pool short: drafted %d and %d; cached %d and %d\n", b[0].stats.n_drafted,
           b[1].stats.n_drafted, b[0].stats.n_cached, b[1].stats.n_cached);
    assert_true(b[1].stats.n_cached > 0); /* the target's pool shared the prompt */
}

static int setup(void **state)
{
    (void)state;
    char err[512];
    if (lms_model_load(tu_data_path("models/stories260K.gguf"), &g_stories, err, sizeof err) < 0 ||
        lms_model_load(tu_data_path("models/llama-synth-f32.gguf"), &g_f32, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lms_model_free(g_stories);
    lms_model_free(g_f32);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram),
        cmocka_unit_test(test_vocab_check),
        cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_greedy_same_model),
        cmocka_unit_test(test_greedy_quantized_draft),
        cmocka_unit_test(test_greedy_other_draft),
        cmocka_unit_test(test_greedy_qwen3),
        cmocka_unit_test(test_greedy_ngram),
        cmocka_unit_test(test_sampling_seeded),
        cmocka_unit_test(test_sampling_distribution),
        cmocka_unit_test(test_rollback_prefix_cache),
        cmocka_unit_test(test_abort_and_request_settings),
        cmocka_unit_test(test_short_pool),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
