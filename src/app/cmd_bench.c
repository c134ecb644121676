/*
 * cmd_bench.c - `lmserv bench`: prompt processing (pp) and generation (tg)
 * speed, with the achieved memory bandwidth and arithmetic rate next to the
 * measured bandwidth of the memory the weights are read from (the CPU's read
 * bandwidth; with every layer and the head on the GPU, the GPU's: bytes read
 * plus written per second by a device-to-device copy, lcu_peak_gbs); and,
 * with --parallel, the aggregate
 * decode speed and TTFT of N concurrent requests through the scheduler.
 *
 *   pp<P>   P random tokens through the forward pass in batches of -b,
 *           from an empty cache (after --depth D tokens if given)
 *   tg<N>   N single-token decode steps (after --depth D tokens); with
 *           --depth, each repetition at depth D follows one at depth 0 and
 *           both are reported, with the median ratio of the pairs and the
 *           ratio that reading the cache alone allows (kv_ceiling)
 *
 * Each test runs -r times; the median, min and max tokens/s are reported.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "app/args.h"
#include "app/bench.h"
#include "app/cli.h"
#include "app/common.h"
#include "base/err.h"
#include "base/timeutil.h"
#include "engine/kv_cache.h"
#include "engine/sched.h"
#include "kernels/kernels.h"
#ifdef LMS_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Read bandwidth of a 1 GiB buffer with the compute threads, GB/s. */
double bench_bandwidth(void)
{
    size_t n = (size_t)1 << 27; /* uint64 words: 1 GiB */
    uint64_t *buf = malloc(n * sizeof *buf);
    if (!buf)
        return 0;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        buf[i] = i;
    double best = 0;
    uint64_t sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = lms_now_ms();
#pragma omp parallel for schedule(static) reduction(^ : sink)
        for (size_t i = 0; i < n; i += 8) {
            uint64_t a = buf[i] + buf[i + 1], b = buf[i + 2] + buf[i + 3];
            uint64_t c = buf[i + 4] + buf[i + 5], d = buf[i + 6] + buf[i + 7];
            sink ^= a ^ b ^ c ^ d;
        }
        double gbs = (double)(n * sizeof *buf) / ((lms_now_ms() - t0) * 1e6);
        best = gbs > best ? gbs : best;
    }
    free(buf);
    return sink == 42 ? best + 1e-12 : best;
}

/* Runs n tokens starting at position `from` in batches of nb; ms taken. */
static double run_tokens(lms_ctx *c, lms_kv_seq *seq, int32_t from, int32_t n, int32_t nb,
                         float *logits, uint64_t *rng)
{
    int32_t nv = lms_ctx_model(c)->hp.n_vocab;
    int32_t *tok = malloc((size_t)nb * sizeof *tok), *pos = malloc((size_t)nb * sizeof *pos);
    lms_kv_seq **seqs = malloc((size_t)nb * sizeof *seqs);
    double t0 = lms_now_ms();
    for (int32_t i = 0; i < n && tok && pos && seqs; i += nb) {
        int32_t m = n - i < nb ? n - i : nb;
        for (int32_t j = 0; j < m; j++) {
            *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
            tok[j] = (int32_t)((*rng >> 33) % (uint64_t)nv);
            pos[j] = from + i + j;
            seqs[j] = seq;
        }
        lms_batch b = {.n_tokens = m, .tokens = tok, .pos = pos, .seq = seqs};
        if (lms_forward(c, &b, logits) < 0)
            break;
    }
    double ms = lms_now_ms() - t0;
    free(tok), free(pos), free(seqs);
    return ms;
}

typedef struct bench_result {
    const char *kind; /* "pp" or "tg" */
    int64_t n;
    double med, min, max; /* tokens/s */
} bench_result;

/* One repetition: tokens/s of pp or tg on a fresh sequence, after
 * o->depth tokens. */
static double one_rep(lms_ctx *c, const bench_opts *o, bool pp, float *logits, uint64_t *rng)
{
    const int64_t n = pp ? o->pp : o->tg;
    lms_kv_seq seq = {0};
    lms_kv_seq_reserve(lms_ctx_kv(c), &seq, (int32_t)(o->depth + n + 1));
    if (o->depth > 0)
        run_tokens(c, &seq, 0, (int32_t)o->depth, (int32_t)o->batch, logits, rng);
    double ms = run_tokens(c, &seq, (int32_t)o->depth, (int32_t)n, pp ? (int32_t)o->batch : 1,
                           logits, rng);
    lms_kv_seq_release(lms_ctx_kv(c), &seq);
    return (double)n * 1000.0 / ms;
}

static bench_result summarize(bool pp, int64_t n, double *tps, int reps)
{
    qsort(tps, (size_t)reps, sizeof tps[0], cmp_d);
    return (bench_result){pp ? "pp" : "tg", n, tps[reps / 2], tps[0], tps[reps - 1]};
}

static void one_test(lms_ctx *c, const bench_opts *o, bool pp, bench_result *r, float *logits)
{
    double tps[64];
    int reps = (int)(o->reps < 64 ? o->reps : 64);
    uint64_t rng = 42;
    for (int rep = 0; rep < reps; rep++)
        tps[rep] = one_rep(c, o, pp, logits, &rng);
    *r = summarize(pp, pp ? o->pp : o->tg, tps, reps);
}

/* tg at depth 0 and after --depth D, alternating repetition by repetition:
 * this machine's memory bandwidth drifts from minute to minute, so only
 * neighbours in time compare fairly. Returns the median of the
 * repetitions' ratios (depth D over depth 0). */
static double tg_depth_pair(lms_ctx *c, const bench_opts *o, bench_result *r0, bench_result *rd,
                            float *logits)
{
    bench_opts o0 = *o;
    o0.depth = 0;
    double t0[64], td[64], q[64];
    int reps = (int)(o->reps < 64 ? o->reps : 64);
    uint64_t rng = 42;
    for (int rep = 0; rep < reps; rep++) {
        t0[rep] = one_rep(c, &o0, false, logits, &rng);
        td[rep] = one_rep(c, o, false, logits, &rng);
        q[rep] = td[rep] / t0[rep];
    }
    *r0 = summarize(false, o->tg, t0, reps);
    *rd = summarize(false, o->tg, td, reps);
    qsort(q, (size_t)reps, sizeof q[0], cmp_d);
    return q[reps / 2];
}

/* Bytes of weights one token reads, and multiply-adds per token. */
static void model_cost(const lms_model *m, double *bytes, double *flops)
{
    size_t embd = lms_row_size(m->tok_embd.type, m->tok_embd.ne[0]) * (size_t)m->tok_embd.ne[1];
    bool tied = m->output.data == m->tok_embd.data;
    *bytes = (double)m->weight_bytes - (tied ? 0.0 : (double)embd);
    const lms_hparams *hp = &m->hp;
    double per_layer = (double)hp->n_embd * hp->head_dim * (2.0 * hp->n_head + 2.0 * hp->n_head_kv) +
                       3.0 * hp->n_embd * hp->n_ff;
    *flops = 2.0 * (per_layer * hp->n_layer + (double)hp->n_embd * hp->n_vocab);
}

/* Bytes of K and V cache a decode token at position p reads: every layer's
 * rows of the positions it sees (a sliding-window layer, its window). */
static double kv_bytes_at(const lms_model *m, const lms_kv_cache *kv, int64_t p)
{
    double bytes = 0.0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const int64_t w = m->layers[il].n_swa, seen = w > 0 && p + 1 > w ? w : p + 1;
        bytes += 2.0 * (double)seen * (double)kv->row_bytes;
    }
    return bytes;
}

/*
 * The speed ratio (depth D over depth 0) that the cache's bytes alone
 * allow: a token at depth D reads its extra K and V rows (the tg run's
 * average over depth 0) besides what a depth-0 token does; at the peak
 * bandwidth that reading takes extra / peak beyond the depth-0 token's
 * measured time t0, attention arithmetic taking none. *extra_mb: those
 * bytes, MB. 0 without a peak.
 */
static double kv_ceiling(const lms_model *m, const lms_kv_cache *kv, const bench_opts *o,
                         double tps0, double peak, double *extra_mb)
{
    double extra = 0.0;
    for (int64_t i = 0; i < o->tg; i++)
        extra += kv_bytes_at(m, kv, o->depth + i) - kv_bytes_at(m, kv, i);
    extra /= (double)(o->tg > 0 ? o->tg : 1);
    *extra_mb = extra / 1e6;
    if (peak <= 0.0 || tps0 <= 0.0)
        return 0.0;
    const double t0 = 1.0 / tps0;
    return t0 / (t0 + extra / (peak * 1e9));
}

static void report(const bench_opts *o, const lms_model *m, const bench_result *r, double peak,
                   int64_t depth, double vs0, double ceil, double extra_mb)
{
    double bytes, flops;
    model_cost(m, &bytes, &flops);
    double gbs = r->kind[0] == 't' ? bytes * r->med / 1e9 : bytes * r->med / 1e9 / (double)o->batch;
    double gfl = flops * r->med / 1e9;
    char name[48];
    snprintf(name, sizeof name, "%s%lld", r->kind, (long long)r->n);
    if (!o->json && depth > 0) /* as llama-bench writes it */
        snprintf(name + strlen(name), sizeof name - strlen(name), " @ d%lld", (long long)depth);
    if (o->json) {
        char extra[96] = "";
        if (vs0 > 0)
            snprintf(extra, sizeof extra, ",\"vs_depth0\":%.4f,\"kv_ceiling\":%.4f", vs0, ceil);
        printf("{\"test\":\"%s\",\"model\":\"%s\",\"threads\":%lld,\"depth\":%lld,\"isa\":\"%s\","
               "\"tokens_per_s\":{\"median\":%.2f,\"min\":%.2f,\"max\":%.2f},\"gb_per_s\":%.2f,"
               "\"gflop_per_s\":%.1f,\"peak_gb_per_s\":%.2f%s}\n",
               name, m->name, (long long)o->threads, (long long)depth, lms_kernels_get()->isa,
               r->med, r->min, r->max, gbs, gfl, peak, extra);
    } else {
        if (peak > 0)
            printf("%-8s %8.2f t/s (min %.2f, max %.2f)  %7.2f GB/s of %.2f peak (%3.0f%%)  %8.1f GFLOP/s\n",
                   name, r->med, r->min, r->max, gbs, peak, 100 * gbs / peak, gfl);
        else
            printf("%-8s %8.2f t/s (min %.2f, max %.2f)  %7.2f GB/s of weights read  %8.1f GFLOP/s\n",
                   name, r->med, r->min, r->max, gbs, gfl);
        if (vs0 > 0)
            printf("%s: %.1f%% of the depth-0 speed (median of the repetitions' ratios, each "
                   "beside a depth-0 run)\n",
                   name, 100.0 * vs0);
        if (vs0 > 0 && ceil > 0)
            printf("%s: reading the cache alone allows %.1f%% (%.1f MB more K and V a token at "
                   "the peak, on top of the depth-0 time)\n",
                   name, 100.0 * ceil, extra_mb);
    }
}

static void parse_par(bench_opts *o, const char *s)
{
    o->n_par = 0;
    for (const char *p = s; *p && o->n_par < 16;) {
        int v = atoi(p);
        if (v > 0 && v <= 256)
            o->par[o->n_par++] = v;
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
}

static int parse(int argc, char **argv, bench_opts *o)
{
    *o = (bench_opts){.pp = 512, .tg = 128, .reps = 3, .batch = 512};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        int g = app_gpu_arg(argc, argv, &i, &o->gpu);
        if (g < 0)
            return -1;
        if (g == 0 && (g = args_spec(argc, argv, &i, &o->spec)) < 0)
            return -1;
        if (g > 0)
            continue;
        if (!strcmp(a, "-m") && v)
            o->model = argv[++i];
        else if (!strcmp(a, "-p") && v)
            ok = args_int(a, argv[++i], 0, 1 << 20, &o->pp);
        else if (!strcmp(a, "-n") && v)
            ok = args_int(a, argv[++i], 0, 1 << 20, &o->tg);
        else if (!strcmp(a, "-t") && v)
            ok = args_int(a, argv[++i], 0, 1024, &o->threads);
        else if (!strcmp(a, "-r") && v)
            ok = args_int(a, argv[++i], 1, 64, &o->reps);
        else if (!strcmp(a, "-b") && v)
            ok = args_int(a, argv[++i], 1, 8192, &o->batch);
        else if (!strcmp(a, "--depth") && v)
            ok = args_int(a, argv[++i], 0, 1 << 20, &o->depth);
        else if (!strcmp(a, "--prefix") && v)
            ok = args_int(a, argv[++i], 16, 1 << 20, &o->prefix);
        else if (!strcmp(a, "--parallel") && v)
            parse_par(o, argv[++i]);
        else if (!strcmp(a, "--json"))
            o->json = true;
        else if (!strcmp(a, "--repeat-prompt"))
            o->repeat_prompt = true;
        else {
            fprintf(stderr, "lmserv bench: bad option '%s'\n", a);
            return -1;
        }
        if (!ok)
            return -1;
    }
    if (!o->model) {
        fprintf(stderr, "usage: lmserv bench -m MODEL [-p 512] [-n 128] [-t N] [-r 3] [-b 512] "
                        "[--depth D] [--parallel 1,4,8,16] [--prefix N] [--json] " APP_GPU_USAGE
                        " [--repeat-prompt] " ARGS_SPEC_USAGE "\n");
        return -1;
    }
    if (args_spec_finish(&o->spec, "bench") < 0)
        return -1;
    if (o->spec.spec.mode != LMS_SPEC_NONE && o->n_par == 0) {
        fprintf(stderr, "lmserv bench: speculative decoding is measured with --parallel N\n");
        return -1;
    }
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    bench_opts o;
    if (parse(argc, argv, &o) < 0)
        return 2;
#ifdef _OPENMP
    if (o.threads <= 0)
        o.threads = omp_get_num_procs();
    omp_set_num_threads((int)o.threads);
#endif
    lms_model *m;
    lms_ctx *c;
    int32_t n_ctx = (int32_t)(o.depth + (o.pp > o.tg ? o.pp : o.tg) + 16);
    if (app_load_gpu(o.model, n_ctx, (int32_t)o.batch, (int32_t)o.threads, &o.gpu, &m, &c) < 0)
        return 1;
    /* the ceiling: the CPU's read bandwidth for a CPU run, the GPU's for a
     * run wholly on the GPU; none for a split (weights in both memories) */
    const lms_gpu_plan *pl = lms_ctx_gpu_plan(c);
    double peak = 0.0;
    if (!pl)
        peak = bench_bandwidth();
#ifdef LMS_HAVE_CUDA
    else if (pl->n_layer_gpu == pl->n_layer && pl->output_gpu)
        peak = lcu_peak_gbs(-1);
#endif
    if (!o.json)
        printf("model %s (%.2f MiB of weights), %lld threads, kernels %s, depth %lld\n", m->name,
               (double)m->weight_bytes / (1 << 20), (long long)o.threads, lms_kernels_get()->isa,
               (long long)o.depth);
    float *logits = lms_ctx_host_alloc(c, (size_t)o.batch * (size_t)m->hp.n_vocab * sizeof *logits);
    bench_result r;
    if (o.pp > 0 && logits) {
        one_test(c, &o, true, &r, logits);
        report(&o, m, &r, peak, o.depth, 0.0, 0.0, 0.0);
    }
    if (o.tg > 0 && logits && o.depth > 0) {
        bench_result r0;
        const double vs0 = tg_depth_pair(c, &o, &r0, &r, logits);
        /* the peak probe runs once, before the tests, and this machine's
         * bandwidth drifts: a depth-0 run that read its weights faster than
         * the probe did sets the peak used for the ceiling */
        double bytes, flops, extra_mb;
        model_cost(m, &bytes, &flops);
        const double seen = bytes * r0.med / 1e9;
        const double ceil = kv_ceiling(m, lms_ctx_kv(c), &o, r0.med,
                                       peak > 0 && seen > peak ? seen : peak, &extra_mb);
        report(&o, m, &r0, peak, 0, 0.0, 0.0, 0.0);
        report(&o, m, &r, peak, o.depth, vs0, ceil, extra_mb);
    } else if (o.tg > 0 && logits) {
        one_test(c, &o, false, &r, logits);
        report(&o, m, &r, peak, o.depth, 0.0, 0.0, 0.0);
    }
    lms_host_free(logits);
    lms_ctx_destroy(c);
    int rc = o.n_par > 0 ? bench_parallel(m, &o) : 0;
    if (rc == 0 && o.prefix > 0)
        rc = bench_prefix(m, &o);
    lms_model_free(m);
    return rc < 0 ? 1 : 0;
}
