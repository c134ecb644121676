/*
 * kbench.c - microbenchmark of the matrix-product kernels.
 *
 *   kbench [-t threads] [-k n_cols] [-m n_rows] [-n n_tok] [-r reps] [type...]
 *
 * For each weight type (default q4_K q6_K q8_0 f16) on random weights of
 * the given shape (default 2048 x 2048, the Llama-3.2-1B attention matrix)
 * it times, single-threaded, one 64-row tile against n_tok tokens through
 * vec_dot (one row x one token at a time; "hot": the tile 20 times over,
 * from cache, the kernel's own speed) and through the ISA's gemm tile
 * kernel, then lms_matmul on the whole matrix with the OpenMP team, and for
 * one token (decode) the whole matrix's GB/s. Best of `reps` runs; GMAC/s
 * is multiply-adds per second. With -t 1 times are the thread's CPU time
 * (robust on a busy machine); otherwise wall time. Kernels of LMS_ISA (or the best the CPU has).
 *
 *   kbench -d [-j rows] [-t threads] [-k n_cols] [-m n_rows] [-r reps] [type...]
 *
 * Decode only (-d): one token through the ISA's gemv kernel (calls of -j
 * rows, default 16, split statically over the threads as lms_matmul's
 * decode, without its activation conversion) and through vec_dot row by
 * row, in GB/s of weights, next to the plain read bandwidth of the same
 * buffer with the same threads. With n_rows x row bytes above the L3 size (32 MiB on the
 * development machine) this is the DRAM streaming speed decode gets; the
 * rows repeat a few distinct quantized rows, so a large matrix is quick to
 * build. Always wall time.
 *
 *   kbench -b [-t threads] [-k n_cols] [-m n_rows] [-n n_tok] [-r reps] [type...]
 *
 * Batched decode (-b): lms_matmul of n_tok tokens (default 8) on a matrix
 * built like -d's (so the Llama output head, -k 2048 -m 128256 q6_K, is
 * quick to build and streams from DRAM), with the team, in ms per product
 * and GMAC/s, next to the same matrix for one token. Thread CPU time with
 * -t 1, else wall time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/kernels.h"
#include "kernels/matmul.h"

/* With one thread, the thread's CPU time: on a shared machine the time
 * slices other processes take do not count. */
static int g_cpu_clock;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(g_cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_seed = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    g_seed ^= g_seed << 13;
    g_seed ^= g_seed >> 7;
    g_seed ^= g_seed << 17;
    return g_seed;
}

/* Random weights: quantize random floats with the reference quantizer. */
static void *make_weights(int type, int64_t n_cols, int64_t n_rows, size_t *row_bytes)
{
    *row_bytes = lms_row_size(type, n_cols);
    uint8_t *w = aligned_alloc(64, (*row_bytes * (size_t)n_rows + 63) / 64 * 64);
    float *f = malloc((size_t)n_cols * sizeof *f);
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t c = 0; c < n_cols; c++)
            f[c] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
        lms_kernels_ref()->from_float[type](f, w + (size_t)r * *row_bytes, n_cols);
    }
    free(f);
    return w;
}

typedef struct opts {
    int threads, reps, decode, batched;
    int64_t k, m, n;
    int64_t job_rows; /* -d: rows per gemv call */
} opts;

/* Read bandwidth of buf (n_bytes, a multiple of 64) with the team, GB/s:
 * the ceiling the decode kernels are measured against. */
static double read_gbs(const uint8_t *buf, size_t n_bytes)
{
    const uint64_t *p = (const uint64_t *)buf;
    const size_t n = n_bytes / 8;
    uint64_t sink = 0;
    const double t0 = now_s();
#pragma omp parallel for schedule(static) reduction(^ : sink)
    for (size_t i = 0; i < n; i += 8) {
        uint64_t a = p[i] + p[i + 1], b = p[i + 2] + p[i + 3];
        uint64_t c = p[i + 4] + p[i + 5], d = p[i + 6] + p[i + 7];
        sink ^= a ^ b ^ c ^ d;
    }
    const double dt = now_s() - t0;
    return (double)n_bytes / dt * 1e-9 + (sink == 42 ? 1e-12 : 0.0);
}

#define DECODE_DISTINCT_ROWS 64

/* n_rows x n_cols weights of `type` repeating a few distinct random rows
 * (quick to build at any size); *row_bytes gets the row size. */
static uint8_t *make_big_weights(int type, int64_t n_cols, int64_t n_rows, size_t *row_bytes)
{
    const int64_t nd = n_rows < DECODE_DISTINCT_ROWS ? n_rows : DECODE_DISTINCT_ROWS;
    size_t rb;
    uint8_t *w0 = make_weights(type, n_cols, nd, &rb);
    const size_t bytes = (rb * (size_t)n_rows + 63) / 64 * 64;
    uint8_t *w = aligned_alloc(64, bytes);
    memset(w + bytes - 64, 0, 64);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n_rows; r++)
        memcpy(w + (size_t)r * rb, w0 + (size_t)(r % nd) * rb, rb);
    free(w0);
    *row_bytes = rb;
    return w;
}

static void bench_batched(const opts *o, int type)
{
    const lms_type_traits *tt = lms_type_get(type);
    size_t rb;
    uint8_t *w = make_big_weights(type, o->k, o->m, &rb);
    float *x = malloc((size_t)(o->k * o->n) * sizeof *x);
    for (int64_t i = 0; i < o->k * o->n; i++)
        x[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
    float *s = malloc((size_t)(o->m * o->n) * sizeof *s);
    void *scratch = aligned_alloc(64, (lms_matmul_scratch(type, o->k, o->n) + 63) / 64 * 64 + 64);
    const lms_mat mat = {w, type, o->k, o->m, rb};
    double best_n = 1e30, best_1 = 1e30;
    for (int rep = 0; rep < o->reps; rep++) {
        double t0 = now_s();
        lms_matmul(&mat, x, o->n, s, scratch);
        double t1 = now_s();
        best_n = t1 - t0 < best_n ? t1 - t0 : best_n;
        t0 = now_s();
        lms_matmul(&mat, x, 1, s, scratch);
        t1 = now_s();
        best_1 = t1 - t0 < best_1 ? t1 - t0 : best_1;
    }
    const double macs = (double)o->m * (double)o->k;
    printf("%-5s %6lldx%-5lld batched %d threads (%.0f MB): n=%-3lld %8.3f ms %6.1f GMAC/s"
           " | n=1 %7.3f ms %6.1f GB/s | n=%lld / n=1 time x%.2f\n",
           tt->name, (long long)o->m, (long long)o->k, o->threads, (double)rb * (double)o->m * 1e-6,
           (long long)o->n, best_n * 1e3, macs * (double)o->n / best_n * 1e-9, best_1 * 1e3,
           (double)rb * (double)o->m / best_1 * 1e-9, (long long)o->n, best_n / best_1);
    free(w);
    free(x);
    free(s);
    free(scratch);
}

static void bench_decode(const opts *o, int type)
{
    const lms_kernel_table *kt = lms_kernels_get();
    const lms_type_traits *tt = lms_type_get(type);
    const int vt = tt->vec_dot_type;
    size_t rb;
    uint8_t *w = make_big_weights(type, o->k, o->m, &rb);
    const size_t bytes = (rb * (size_t)o->m + 63) / 64 * 64;
    float *x = malloc((size_t)o->k * sizeof *x);
    for (int64_t i = 0; i < o->k; i++)
        x[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
    const size_t ldx = vt == LMS_TYPE_F32 ? (size_t)o->k * 4 : lms_row_size(vt, o->k);
    uint8_t *xq = aligned_alloc(64, (ldx + 63) / 64 * 64);
    kt->from_float[vt](x, xq, o->k);
    float *s = malloc((size_t)o->m * sizeof *s);
    double best_rd = 0, best_mm = 1e30, best_vd = 1e30;
    for (int rep = 0; rep < o->reps; rep++) {
        const double rd = read_gbs(w, bytes);
        best_rd = rd > best_rd ? rd : best_rd;
        double t0 = now_s(), t1;
        if (kt->gemv[type]) {
            const int64_t jr = o->job_rows;
#pragma omp parallel for schedule(static)
            for (int64_t j = 0; j < (o->m + jr - 1) / jr; j++) {
                const int64_t r0 = j * jr;
                const int64_t nr = o->m - r0 < jr ? o->m - r0 : jr;
                kt->gemv[type](o->k, nr, w + (size_t)r0 * rb, rb, xq, s + r0);
            }
            t1 = now_s();
            best_mm = t1 - t0 < best_mm ? t1 - t0 : best_mm;
        }
        t0 = now_s();
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < o->m; r++)
            kt->vec_dot[type](o->k, &s[r], w + (size_t)r * rb, xq);
        t1 = now_s();
        best_vd = t1 - t0 < best_vd ? t1 - t0 : best_vd;
    }
    const double mb = (double)rb * (double)o->m;
    printf("%-5s %6lldx%-5lld decode %d threads (%.0f MB): read %6.1f GB/s | gemv %6.1f GB/s"
           " (%3.0f%%) | vec_dot rows %6.1f GB/s (%3.0f%%)\n",
           tt->name, (long long)o->m, (long long)o->k, o->threads, mb * 1e-6, best_rd,
           mb / best_mm * 1e-9, 100 * mb / best_mm * 1e-9 / best_rd,
           mb / best_vd * 1e-9, 100 * mb / best_vd * 1e-9 / best_rd);
    free(w);
    free(x);
    free(xq);
    free(s);
}

static void bench_type(const opts *o, int type)
{
    const lms_kernel_table *kt = lms_kernels_get();
    const lms_type_traits *tt = lms_type_get(type);
    const int vt = tt->vec_dot_type;
    size_t rb;
    void *w = make_weights(type, o->k, o->m, &rb);
    float *x = malloc((size_t)(o->k * o->n) * sizeof *x);
    for (int64_t i = 0; i < o->k * o->n; i++)
        x[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
    const size_t ldx = vt == LMS_TYPE_F32 ? (size_t)o->k * 4 : lms_row_size(vt, o->k);
    uint8_t *xq = aligned_alloc(64, (ldx * (size_t)o->n + 63) / 64 * 64);
    for (int64_t t = 0; t < o->n; t++)
        kt->from_float[vt](x + t * o->k, xq + (size_t)t * ldx, o->k);
    const int64_t tile = o->m < 64 ? o->m : 64;
    float *s = malloc((size_t)(o->m * o->n) * sizeof *s);
    void *scratch = aligned_alloc(64, (lms_matmul_scratch(type, o->k, o->n) + 63) / 64 * 64 + 64);

    double best_dot = 1e30, best_hot = 1e30, best_gemm = 1e30, best_mm = 1e30, best_tg = 1e30;
    for (int rep = 0; rep < o->reps; rep++) {
        double t0 = now_s();
        for (int64_t t = 0; t < o->n; t++)
            for (int64_t r = 0; r < tile; r++)
                kt->vec_dot[type](o->k, &s[t * tile + r], (uint8_t *)w + (size_t)r * rb,
                                  xq + (size_t)t * ldx);
        double t1 = now_s();
        if (t1 - t0 < best_dot)
            best_dot = t1 - t0;
        /* the same tile 20 times over, from cache: the kernel's own speed */
        t0 = now_s();
        for (int it = 0; it < 20; it++)
            for (int64_t t = 0; t < o->n; t++)
                for (int64_t r = 0; r < tile; r++)
                    kt->vec_dot[type](o->k, &s[t * tile + r], (uint8_t *)w + (size_t)r * rb,
                                      xq + (size_t)t * ldx);
        t1 = now_s();
        if ((t1 - t0) / 20 < best_hot)
            best_hot = (t1 - t0) / 20;
        if (kt->gemm[type]) {
            t0 = now_s();
            kt->gemm[type](o->k, tile, o->n, w, rb, xq, ldx, s, (size_t)tile);
            t1 = now_s();
            if (t1 - t0 < best_gemm)
                best_gemm = t1 - t0;
        }
        const lms_mat mat = {w, type, o->k, o->m, rb};
        t0 = now_s();
        lms_matmul(&mat, x, o->n, s, scratch);
        t1 = now_s();
        if (t1 - t0 < best_mm)
            best_mm = t1 - t0;
        t0 = now_s();
        for (int i = 0; i < 10; i++)
            lms_matmul(&mat, x, 1, s, scratch);
        t1 = now_s();
        if ((t1 - t0) / 10 < best_tg)
            best_tg = (t1 - t0) / 10;
    }
    const double tile_macs = (double)tile * (double)o->k * (double)o->n;
    const double all_macs = (double)o->m * (double)o->k * (double)o->n;
    printf("%-5s %5lldx%-5lld n=%-4lld 1 thread: vec_dot %7.1f (hot %5.1f) GMAC/s"
           "  gemm %7.1f GMAC/s (x%.2f) | %d threads: matmul %7.1f GMAC/s  decode %6.1f GB/s %7.1f us\n",
           tt->name, (long long)o->m, (long long)o->k, (long long)o->n, tile_macs / best_dot * 1e-9,
           tile_macs / best_hot * 1e-9,
           kt->gemm[type] ? tile_macs / best_gemm * 1e-9 : 0.0,
           kt->gemm[type] ? best_dot / best_gemm : 0.0, o->threads, all_macs / best_mm * 1e-9,
           (double)rb * (double)o->m / best_tg * 1e-9, best_tg * 1e6);
    free(w);
    free(x);
    free(xq);
    free(s);
    free(scratch);
}

int main(int argc, char **argv)
{
    opts o = {2, 5, 0, 0, 2048, 2048, 0, 16};
    int types[16], n_types = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "-t") == 0)
            o.threads = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "-k") == 0)
            o.k = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "-m") == 0)
            o.m = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "-n") == 0)
            o.n = atoll(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "-r") == 0)
            o.reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "-d") == 0)
            o.decode = 1;
        else if (strcmp(argv[i], "-b") == 0)
            o.batched = 1;
        else if (i + 1 < argc && strcmp(argv[i], "-j") == 0)
            o.job_rows = atoll(argv[++i]);
        else if (n_types < 16 && lms_type_from_name(argv[i]) >= 0)
            types[n_types++] = lms_type_from_name(argv[i]);
        else {
            fprintf(stderr, "usage: kbench [-d [-j rows_per_call] | -b] [-t threads] [-k n_cols] "
                            "[-m n_rows] [-n n_tok] [-r reps] [type...]\n");
            return 2;
        }
    }
    if (n_types == 0) {
        const int def[] = {LMS_TYPE_Q4_K, LMS_TYPE_Q6_K, LMS_TYPE_Q8_0, LMS_TYPE_F16};
        memcpy(types, def, sizeof def);
        n_types = 4;
    }
    if (o.n == 0)
        o.n = o.batched ? 8 : 512;
    if (o.n < 1 || o.m < 1 || o.k < 256 || o.k % 256 || o.reps < 1 || o.job_rows < 1) {
        fprintf(stderr, "kbench: need n_cols a multiple of 256, n_rows, n_tok, reps >= 1\n");
        return 2;
    }
#ifdef _OPENMP
    omp_set_num_threads(o.threads);
#endif
    g_cpu_clock = o.threads == 1 && !o.decode;
    printf("kernels %s, %s time\n", lms_kernels_get()->isa, g_cpu_clock ? "thread CPU" : "wall");
    for (int i = 0; i < n_types; i++)
        if (o.decode)
            bench_decode(&o, types[i]);
        else if (o.batched)
            bench_batched(&o, types[i]);
        else
            bench_type(&o, types[i]);
    return 0;
}
