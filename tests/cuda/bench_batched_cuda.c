/*
 * bench_batched_cuda.c - the engine's batched decode speed, measured like
 * llama.cpp's llama-batched-bench: for each B, B sequences get a PP-token
 * prompt each (one forward call per sequence), then TG steps each decode
 * one token of every sequence in one lms_forward call (logits for all B
 * rows, no sampling). Prints aggregate decode tokens/s.
 *
 *   bench_batched_cuda MODEL [PP=128] [TG=128] [B,...=1,8] [gpu_layers=-1 (all)]
 *
 * LMS_BENCH_PROFILE=1: the CUDA profiler runs over the last two decode
 * steps of each B only (ncu --profile-from-start off).
 *
 * A development tool (not a test): the target bench_batched_cuda of a
 * CUDA build (cmake -DLMS_CUDA=ON), not run by CTest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_profiler_api.h>

#include "engine/forward.h"
#include "model/model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [PP] [TG] [B,...] [gpu_layers]\n", argv[0]);
        return 2;
    }
    const int pp = argc > 2 ? atoi(argv[2]) : 128, tg = argc > 3 ? atoi(argv[3]) : 128;
    int bs[16], nb = 0, bmax = 1;
    char list[256];
    snprintf(list, sizeof list, "%s", argc > 4 ? argv[4] : "1,8");
    for (char *t = strtok(list, ","); t && nb < 16; t = strtok(NULL, ","))
        bs[nb++] = atoi(t);
    for (int i = 0; i < nb; i++)
        bmax = bs[i] > bmax ? bs[i] : bmax;
    char err[512];
    lms_model *m;
    if (lms_model_load(argv[1], &m, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    lms_ctx_params p = {.n_ctx = pp + tg + 16, .n_batch = pp > bmax ? pp : bmax, .n_seq = bmax,
                        .gpu_layers = argc > 5 ? atoi(argv[5]) : LMS_GPU_LAYERS_ALL};
    lms_ctx *c;
    if (lms_ctx_create(m, &p, &c, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const int32_t nv = m->hp.n_vocab;
    /* LMS_BENCH_PAGEABLE=1: logits in plain memory (a host copy a step, for A/B) */
    const char *pg = getenv("LMS_BENCH_PAGEABLE");
    const size_t lg_bytes = (size_t)(pp > bmax ? pp : bmax) * (size_t)nv * sizeof(float);
    float *lg = pg && atoi(pg) ? malloc(lg_bytes) : lms_ctx_host_alloc(c, lg_bytes);
    int32_t *tok = malloc((size_t)(pp > bmax ? pp : bmax) * sizeof *tok);
    int32_t *pos = malloc((size_t)(pp > bmax ? pp : bmax) * sizeof *pos);
    bool *want = malloc((size_t)(pp > bmax ? pp : bmax) * sizeof *want);
    lms_kv_seq *seqs = calloc((size_t)bmax, sizeof *seqs);
    lms_kv_seq **sp = malloc((size_t)(pp > bmax ? pp : bmax) * sizeof *sp);
    for (int k = 0; k < nb; k++) {
        const int B = bs[k];
        double t0 = now_s();
        for (int s = 0; s < B; s++) {
            memset(&seqs[s], 0, sizeof seqs[s]);
            for (int i = 0; i < pp; i++) {
                tok[i] = (int32_t)((uint32_t)(s * 7919 + i * 104729 + 17) % (uint32_t)nv);
                pos[i] = i;
                sp[i] = &seqs[s];
                want[i] = i == pp - 1;
            }
            if (lms_kv_seq_reserve(lms_ctx_kv(c), &seqs[s], pp) < 0)
                return fprintf(stderr, "kv reserve failed\n"), 1;
            lms_batch b = {.n_tokens = pp, .tokens = tok, .pos = pos, .seq = sp, .logits = want};
            if (lms_forward(c, &b, lg) < 0)
                return fprintf(stderr, "forward failed\n"), 1;
        }
        double t1 = now_s();
        const char *pe = getenv("LMS_BENCH_PROFILE");
        const bool prof = pe && atoi(pe) != 0;
        for (int step = 0; step < tg; step++) {
            if (prof && step == tg - 2)
                cudaProfilerStart();
            for (int s = 0; s < B; s++) {
                tok[s] = (int32_t)((uint32_t)(s * 31 + step * 17 + 5) % (uint32_t)nv);
                pos[s] = pp + step;
                sp[s] = &seqs[s];
                want[s] = true;
                if (lms_kv_seq_reserve(lms_ctx_kv(c), &seqs[s], pp + step + 1) < 0)
                    return fprintf(stderr, "kv reserve failed\n"), 1;
            }
            lms_batch b = {.n_tokens = B, .tokens = tok, .pos = pos, .seq = sp, .logits = want};
            if (lms_forward(c, &b, lg) < 0)
                return fprintf(stderr, "forward failed\n"), 1;
        }
        double t2 = now_s();
        if (prof)
            cudaProfilerStop();
        /* the last step's logits, summed: equal sums for runs that must
         * compute the same (e.g. LMS_CUDA_MMQ_PERM=0 and 1) */
        double sum = 0;
        for (size_t i = 0; tg > 0 && i < (size_t)B * (size_t)nv; i++)
            sum += (double)lg[i] * (double)((i % 7) + 1);
        printf("batched B=%2d PP=%d TG=%d: prompt %8.2f t/s, decode %8.2f t/s aggregate "
               "(%.3f ms/step), last logits sum %.17g\n",
               B, pp, tg, B * pp / (t1 - t0), B * tg / (t2 - t1), (t2 - t1) * 1e3 / tg, sum);
        for (int s = 0; s < B; s++)
            lms_kv_seq_release(lms_ctx_kv(c), &seqs[s]);
    }
    lms_ctx_destroy(c);
    lms_model_free(m);
    return 0;
}
