/*
 * bench_par.c - `lmserv bench --parallel N,...`: N requests submitted at
 * once to the scheduler (distinct 128-token prompts, 64 generated tokens,
 * greedy, end-of-text ignored); reports aggregate decode tokens/s (tokens
 * generated after each request's first, over the time from the last first
 * token to the end) and TTFT percentiles. With --draft / --spec ngram the
 * scheduler speculates, and the proposed and accepted token counts are
 * reported; --repeat-prompt makes each prompt one 16-token pattern
 * repeated (text that prompt lookup finds).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/bench.h"
#include "base/timeutil.h"
#include "engine/sched.h"

#define PAR_PROMPT 128
#define PAR_GEN 64

typedef struct par_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_done;
    double ttft[256];
    double t_first[256];
    int n_gen[256];
} par_state;

typedef struct par_req {
    par_state *st;
    int idx;
    double t_submit;
} par_req;

static void on_event(void *user, lms_event *ev)
{
    par_req *r = user;
    par_state *st = r->st;
    pthread_mutex_lock(&st->mu);
    if (ev->type == LMS_EV_TOKEN && st->t_first[r->idx] == 0)
        st->t_first[r->idx] = lms_now_ms();
    if (ev->type == LMS_EV_END || ev->type == LMS_EV_ERROR) {
        st->ttft[r->idx] = ev->stats.ttft_ms;
        st->n_gen[r->idx] = ev->stats.n_gen;
        st->n_done++;
        pthread_cond_signal(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    lms_event_free(ev);
}

/* Submits one greedy request (end of text ignored) reporting to r. */
static int submit_one(lms_sched *s, const int32_t *toks, int32_t n, int32_t gen, par_req *r)
{
    lms_request q = {.tokens = toks, .n_tokens = n, .max_tokens = gen, .sp = lms_sampler_defaults(),
                     .ignore_eos = true, .cb = on_event, .user = r};
    q.sp.temperature = 0;
    uint64_t id;
    char err[256];
    if (lms_sched_submit(s, &q, &id, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv bench: %s\n", err);
        return -1;
    }
    return 0;
}

static void wait_done(par_state *st, int n)
{
    pthread_mutex_lock(&st->mu);
    while (st->n_done < n)
        pthread_cond_wait(&st->cv, &st->mu);
    pthread_mutex_unlock(&st->mu);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run_level(lms_sched *s, int n, const bench_opts *o, const char *model, double peak)
{
    static par_state st;
    static par_req reqs[256];
    static int32_t toks[256][PAR_PROMPT];
    memset(&st, 0, sizeof st);
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    int32_t nv = lms_sched_model(s)->hp.n_vocab;
    lms_sched_stats s0, s1;
    lms_sched_get_stats(s, &s0);
    double t0 = lms_now_ms();
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < PAR_PROMPT; j++)
            toks[i][j] = (int32_t)((uint32_t)(i * 7919 + (o->repeat_prompt ? j % 16 : j) * 104729 + 17) %
                                   (uint32_t)nv);
        reqs[i] = (par_req){&st, i, t0};
        if (submit_one(s, toks[i], PAR_PROMPT, PAR_GEN, &reqs[i]) < 0)
            return -1;
    }
    wait_done(&st, n);
    double t_end = lms_now_ms(), last_first = 0;
    lms_sched_get_stats(s, &s1);
    const uint64_t drafted = s1.spec_drafted - s0.spec_drafted;
    const uint64_t accepted = s1.spec_accepted - s0.spec_accepted;
    int gen = 0;
    for (int i = 0; i < n; i++) {
        last_first = st.t_first[i] > last_first ? st.t_first[i] : last_first;
        gen += st.n_gen[i] - 1;
    }
    double dec = t_end > last_first ? gen * 1000.0 / (t_end - last_first) : 0;
    double total = (double)(gen + n) * 1000.0 / (t_end - t0);
    qsort(st.ttft, (size_t)n, sizeof st.ttft[0], cmp_d);
    double p50 = st.ttft[n / 2], p99 = st.ttft[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1];
    if (o->json)
        printf("{\"test\":\"parallel\",\"model\":\"%s\",\"sequences\":%d,\"prompt\":%d,\"gen\":%d,"
               "\"decode_tokens_per_s\":%.2f,\"total_tokens_per_s\":%.2f,\"ttft_ms\":{\"p50\":%.1f,"
               "\"p99\":%.1f},\"peak_gb_per_s\":%.2f,\"draft_tokens\":%llu,\"draft_accepted\":%llu}\n",
               model, n, PAR_PROMPT, PAR_GEN, dec, total, p50, p99, peak,
               (unsigned long long)drafted, (unsigned long long)accepted);
    else if (peak > 0)
        printf("parallel %3d: decode %8.2f t/s aggregate, %8.2f t/s incl. prompts, TTFT p50 %.1f ms "
               "p99 %.1f ms (peak %.2f GB/s just before)\n",
               n, dec, total, p50, p99, peak);
    else
        printf("parallel %3d: decode %8.2f t/s aggregate, %8.2f t/s incl. prompts, TTFT p50 %.1f ms "
               "p99 %.1f ms\n",
               n, dec, total, p50, p99);
    if (!o->json && drafted > 0)
        printf("parallel %3d: speculative: drafted %llu, accepted %llu (%.1f%%)\n", n,
               (unsigned long long)drafted, (unsigned long long)accepted, 100.0 * accepted / drafted);
    pthread_mutex_destroy(&st.mu);
    pthread_cond_destroy(&st.cv);
    return 0;
}

int bench_parallel(lms_model *m, const bench_opts *o)
{
    /* The scheduler's thread runs the forward passes with an OpenMP team
     * of its own; the idle team this (main) thread keeps from the bandwidth
     * measurement and the pp/tg tests would make libgomp's workers sleep
     * between regions (9000 context switches and 15% of the speed of 64
     * decode steps of a 1B model, a cost a server, whose other threads run
     * no OpenMP, does not have). */
    lms_release_omp_team();
    int max = 1;
    for (int i = 0; i < o->n_par; i++)
        max = o->par[i] > max ? o->par[i] : max;
    lms_sched_params p = {.n_ctx = PAR_PROMPT + PAR_GEN + 16, .n_parallel = max,
                          .n_batch = (int32_t)o->batch, .max_queue = 1024,
                          .n_threads = (int32_t)o->threads, .no_prefix_cache = true,
                          .gpu_layers = o->gpu.gpu_layers, .vram_margin_mb = o->gpu.vram_margin_mb,
                          .vram_budget_mb = o->gpu.vram_budget_mb, .spec = o->spec.spec,
                          .draft_model = o->spec.draft, .draft_gpu_layers = o->spec.draft_gpu,
                          .draft_gpu_set = o->spec.draft_gpu_set};
    lms_sched *s;
    char err[512];
    if (lms_sched_create(m, &p, &s, err, sizeof err) < 0) {
        fprintf(stderr, "lmserv bench: %s\n", err);
        return -1;
    }
    /* The memory bandwidth swings between runs (and within one): each
     * level is reported with the peak measured just before it, so that it
     * compares with a tg of the same mode. The scheduler's thread has given
     * its team back while idle, so the measurement's team is the only one. */
    int rc = 0;
    for (int i = 0; i < o->n_par && rc == 0; i++) {
        double peak = o->gpu.gpu_layers == 0 ? bench_bandwidth() : 0.0;
        lms_release_omp_team();
        rc = run_level(s, o->par[i], o, m->name, peak);
    }
    lms_sched_destroy(s);
    return rc;
}

/* One request through s; returns its TTFT in ms (or < 0). */
static double one_ttft(lms_sched *s, const int32_t *toks, int32_t n, lms_req_stats *out)
{
    static par_state st;
    static par_req req;
    memset(&st, 0, sizeof st);
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    req = (par_req){&st, 0, lms_now_ms()};
    if (submit_one(s, toks, n, 1, &req) < 0)
        return -1;
    wait_done(&st, 1);
    out->ttft_ms = st.ttft[0];
    return st.ttft[0];
}

int bench_prefix(lms_model *m, const bench_opts *o)
{
    lms_release_omp_team(); /* as bench_parallel */
    int32_t n = (int32_t)o->prefix, extra = 16;
    int32_t *toks = malloc((size_t)(n + extra) * sizeof *toks);
    lms_sched_params p = {.n_ctx = n + extra + 16, .n_parallel = 1, .n_batch = (int32_t)o->batch,
                          .max_queue = 4, .n_threads = (int32_t)o->threads};
    lms_sched *s;
    char err[256];
    if (!toks || lms_sched_create(m, &p, &s, err, sizeof err) < 0) {
        free(toks);
        return -1;
    }
    for (int32_t i = 0; i < n + extra; i++)
        toks[i] = (int32_t)((uint32_t)(i * 2654435761u) % (uint32_t)m->hp.n_vocab);
    lms_req_stats a, b;
    double cold = one_ttft(s, toks, n, &a);
    double warm = one_ttft(s, toks, n + extra, &b);
    if (o->json)
        printf("{\"test\":\"prefix%d\",\"model\":\"%s\",\"ttft_ms\":{\"uncached\":%.1f,"
               "\"cached\":%.1f},\"ratio\":%.3f}\n",
               n, m->name, cold, warm, cold > 0 ? warm / cold : 0);
    else
        printf("prefix %d: TTFT uncached %.1f ms, with the prefix cached (+%d new tokens) %.1f ms "
               "(%.1f%%)\n",
               n, cold, extra, warm, cold > 0 ? 100 * warm / cold : 0);
    lms_sched_destroy(s);
    free(toks);
    return cold < 0 || warm < 0 ? -1 : 0;
}
