/*
 * cu_mmq_host_check.cu - host check of the tensor-core fragment code of
 * cu_mmvq.cuh (mmq_q4k_sb, mmq_q6k_sb) without a GPU: the per-lane
 * functions run for all 32 lanes of a warp with an emulated mma.sync
 * (pass 1 records every lane's A/B fragments, the products are formed per
 * the PTX fragment layouts, pass 2 hands each lane its C fragment), and
 * the results are compared with the CPU reference dequantization dotted
 * with the same q8 activations; a second run reads the activations from
 * their lane-ordered copy (q8_perm, mq::perm4_at/perm6_at/perme_at) and
 * must give identical sums. It also checks the one-token 64-element units
 * (mq::unit) and the IQ4_NL / IQ4_XS chunk code (mq::ops, with its table
 * lookup) against the same reference. A development tool, built by hand:
 *
 *   nvcc -O1 -std=c++17 -DLMS_HAVE_CUDA=1 -Isrc -Iinclude -diag-suppress 20011 \
 *     -Xcompiler -fopenmp tests/cuda/cu_mmq_host_check.cu build-cuda/liblms_kernels.a \
 *     build-cuda/liblms_base.a -o /tmp/mmq_check && /tmp/mmq_check
 *
 * (20011: the emulated mma is host-only code called from the shared
 * __host__ __device__ functions, which is what this check wants.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "kernels/cuda/cu_mmvq.cuh"
extern "C" {
#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels.h"
}

struct frag {
    int k, a[4], b[2];
};

/* pass 0: record fragments; pass 1: return the products. */
struct mma_emu {
    int pass = 0, lane = 0, idx = 0;
    std::vector<std::vector<frag>> rec; /* [call][lane] */
    std::vector<std::vector<int>> res;  /* [call][lane * 4 + i] */
    void put(int kk, const int *a, const int *b, int (&c)[4])
    {
        if (pass == 0) {
            if ((int)rec.size() <= idx)
                rec.resize(idx + 1, std::vector<frag>(32));
            frag &f = rec[idx][lane];
            f.k = kk;
            memcpy(f.a, a, sizeof f.a);
            memcpy(f.b, b, sizeof f.b);
            c[0] = c[1] = c[2] = c[3] = 0;
        } else {
            for (int i = 0; i < 4; i++)
                c[i] = res[idx][lane * 4 + i];
        }
        idx++;
    }
    void k32(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1)
    {
        const int a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
        put(32, a, b, c);
    }
    void k16(int (&c)[4], int a0, int a1, int b0)
    {
        const int a[4] = {a0, a1, 0, 0}, b[2] = {b0, 0};
        put(16, a, b, c);
    }
    static int byte(int w, int i) { return (int)(int8_t)(w >> (8 * i)); }
    void solve()
    {
        res.assign(rec.size(), std::vector<int>(128));
        for (size_t n = 0; n < rec.size(); n++) {
            int A[16][32] = {{0}}, B[32][8] = {{0}};
            for (int l = 0; l < 32; l++) {
                const frag &f = rec[n][l];
                const int g = l >> 2, t = l & 3;
                for (int i = 0; i < 4; i++) {
                    A[g][4 * t + i] = byte(f.a[0], i);
                    A[g + 8][4 * t + i] = byte(f.a[1], i);
                    B[4 * t + i][g] = byte(f.b[0], i);
                    if (f.k == 32) {
                        A[g][16 + 4 * t + i] = byte(f.a[2], i);
                        A[g + 8][16 + 4 * t + i] = byte(f.a[3], i);
                        B[16 + 4 * t + i][g] = byte(f.b[1], i);
                    }
                }
            }
            for (int l = 0; l < 32; l++) {
                const int g = l >> 2, t = l & 3;
                for (int i = 0; i < 4; i++) {
                    const int r = g + 8 * (i >> 1), col = 2 * t + (i & 1);
                    int s = 0;
                    for (int k = 0; k < 32; k++)
                        s += A[r][k] * B[k][col];
                    res[n][l * 4 + i] = s;
                }
            }
        }
    }
};

static uint16_t f2h(float f)
{
    __half h = __float2half(f);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

template <int T, int NM> static int run(const char *name, int misalign, int n_tok)
{
    const int K = 512, R = 16, bb = T == LMS_TYPE_Q4_K ? 144 : 210, nsb = K / 256;
    const size_t rbytes = (size_t)nsb * bb;
    std::vector<uint8_t> buf[NM];
    const uint8_t *rows[NM][R];
    std::vector<float> wf[NM];
    for (int k = 0; k < NM; k++) {
        buf[k].resize(R * rbytes + 8);
        wf[k].resize((size_t)R * K);
        uint8_t *base = buf[k].data() + misalign;
        for (size_t i = 0; i < R * rbytes; i++)
            base[i] = (uint8_t)rand();
        for (int r = 0; r < R; r++)
            for (int b = 0; b < nsb; b++) {
                uint8_t *blk = base + r * rbytes + (size_t)b * bb;
                const uint16_t d = f2h(0.01f + 0.02f * (rand() / (float)RAND_MAX));
                const uint16_t m = f2h(0.005f + 0.01f * (rand() / (float)RAND_MAX));
                memcpy(blk + (T == LMS_TYPE_Q4_K ? 0 : 208), &d, 2);
                if (T == LMS_TYPE_Q4_K)
                    memcpy(blk + 2, &m, 2);
            }
        for (int r = 0; r < R; r++) {
            rows[k][r] = base + r * rbytes;
            lms_kernels_ref()->to_float[T](rows[k][r], wf[k].data() + (size_t)r * K, K);
        }
    }
    /* activations: 8 token rows of q8, scales after all values (lcu_q8 layout) */
    std::vector<int8_t> xs(8 * K);
    std::vector<float2> xd(8 * K / 32);
    std::vector<float> x(K);
    for (int u = 0; u < 8; u++) {
        for (int i = 0; i < K; i++)
            x[i] = (rand() / (float)RAND_MAX - 0.5f) * (i % 7 == 0 ? 8.f : 1.f);
        for (int b = 0; b < K / 32; b++)
            mq::quant_block_host(x.data() + 32 * b, xs.data() + u * K + 32 * b,
                                 xd.data() + u * (K / 32) + b);
    }
    /* the lane-ordered copy of the batch (as the device producers write it);
     * token slots past the batch stay zero */
    std::vector<int8_t> p4(8 * K, 0), p6(8 * K, 0);
    std::vector<float2> pe(8 * K / 32, make_float2(0.0f, 0.0f));
    for (int u = 0; u < n_tok; u++)
        for (int k = 0; k < K; k++) {
            p4[mq::perm4_at(u, k)] = p6[mq::perm6_at(u, k)] = xs[u * K + k];
            if (k % 32 == 0)
                pe[mq::perme_at(u, k)] = xd[u * (K / 32) + k / 32];
        }
    float acc[32][NM][2][2], accp[32][NM][2][2];
    memset(acc, 0, sizeof acc);
    memset(accp, 0, sizeof accp);
    for (int pl = 0; pl < 2; pl++) {
        for (int sb = 0; sb < nsb; sb++) {
            mma_emu e;
            for (int pass = 0; pass < 2; pass++) {
                e.pass = pass;
                for (int lane = 0; lane < 32; lane++) {
                    e.lane = lane;
                    e.idx = 0;
                    const int g = lane >> 2, t = lane & 3;
                    const uint8_t *ra[NM], *rb[NM];
                    for (int k = 0; k < NM; k++)
                        ra[k] = rows[k][g], rb[k] = rows[k][g + 8];
                    const int tg = g < n_tok ? g : n_tok - 1;
                    const int u0 = 2 * t < n_tok ? 2 * t : n_tok - 1;
                    const int u1 = 2 * t + 1 < n_tok ? 2 * t + 1 : n_tok - 1;
                    float dummy[NM][2][2];
                    float(&a)[NM][2][2] = pass ? (pl ? accp[lane] : acc[lane]) : dummy;
                    const uint8_t *const(&cra)[NM] = ra;
                    const uint8_t *const(&crb)[NM] = rb;
                    if (pl && T == LMS_TYPE_Q4_K)
                        mq::mmq_q4k_sb<NM, true>(e, cra, crb, sb, t, p4.data(), pe.data(), NULL, a,
                                                 lane);
                    else if (pl)
                        mq::mmq_q6k_sb<NM, true>(e, cra, crb, sb, t, p6.data(), pe.data(), NULL, a,
                                                 lane);
                    else if (T == LMS_TYPE_Q4_K)
                        mq::mmq_q4k_sb<NM>(e, cra, crb, sb, t, xs.data() + tg * K,
                                           xd.data() + u0 * (K / 32), xd.data() + u1 * (K / 32), a);
                    else
                        mq::mmq_q6k_sb<NM>(e, cra, crb, sb, t, xs.data() + tg * K,
                                           xd.data() + u0 * (K / 32), xd.data() + u1 * (K / 32), a);
                }
                if (pass == 0)
                    e.solve();
            }
        }
    }
    double worst = 0;
    for (int lane = 0; lane < 32; lane++)
        for (int k = 0; k < NM; k++)
            for (int i = 0; i < 4; i++) {
                const int g = lane >> 2, t = lane & 3, r = g + 8 * (i >> 1), u = 2 * t + (i & 1);
                if (u >= n_tok)
                    continue;
                double ref = 0, mag = 0;
                for (int j = 0; j < K; j++) {
                    const double a = (double)xd[u * (K / 32) + j / 32].x * xs[u * K + j];
                    ref += wf[k][(size_t)r * K + j] * a;
                    mag += fabs(wf[k][(size_t)r * K + j] * a);
                }
                const double err = fabs(acc[lane][k][i >> 1][i & 1] - ref) / (mag + 1e-30);
                worst = err > worst ? err : worst;
                /* the lane-ordered loads must give the very same sums */
                if (accp[lane][k][i >> 1][i & 1] != acc[lane][k][i >> 1][i & 1])
                    worst = 1.0;
            }
    const bool ok = worst < 1e-5;
    printf("%-5s NM=%d misalign %d n_tok %d: worst rel.err %.2e %s\n", name, NM, misalign, n_tok,
           worst, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}

/* One q8 token of K random values, and the reference dot product with a
 * dequantized row wf (ref; mag = sum |w x|, the scale of its rounding). */
struct q8_token {
    std::vector<int8_t> xs;
    std::vector<float2> xd;
    double ref = 0, mag = 0;
    q8_token(const std::vector<float> &wf, int K) : xs(K), xd(K / 32)
    {
        std::vector<float> x(K);
        for (int i = 0; i < K; i++)
            x[i] = (rand() / (float)RAND_MAX - 0.5f) * (i % 5 == 0 ? 6.f : 1.f);
        for (int b = 0; b < K / 32; b++)
            mq::quant_block_host(x.data() + 32 * b, xs.data() + 32 * b, xd.data() + b);
        for (int j = 0; j < K; j++) {
            const double a = (double)xd[j / 32].x * xs[j];
            ref += wf[j] * a;
            mag += fabs(wf[j] * a);
        }
    }
};

/* The one-token 64-element units (mq::unit) against the reference: a row
 * of random blocks (2-byte misaligned for Q6_K where asked) dotted with one
 * q8 token, unit by unit in a scrambled order, as the mv1 kernels do. */
template <int T> static int run_units(const char *name, int misalign)
{
    const int K = 2048, bb = T == LMS_TYPE_Q4_K ? 144 : 210, nsb = K / 256; /* every offset mod 16 */
    std::vector<uint8_t> buf((size_t)nsb * bb + 8);
    uint8_t *row = buf.data() + misalign;
    for (size_t i = 0; i < (size_t)nsb * bb; i++)
        row[i] = (uint8_t)rand();
    for (int b = 0; b < nsb; b++) {
        const uint16_t d = f2h(0.01f + 0.02f * (rand() / (float)RAND_MAX));
        const uint16_t m = f2h(0.005f + 0.01f * (rand() / (float)RAND_MAX));
        memcpy(row + (size_t)b * bb + (T == LMS_TYPE_Q4_K ? 0 : 208), &d, 2);
        if (T == LMS_TYPE_Q4_K)
            memcpy(row + (size_t)b * bb + 2, &m, 2);
    }
    std::vector<float> wf(K);
    lms_kernels_ref()->to_float[T](row, wf.data(), K);
    const q8_token x(wf, K);
    double got = 0;
    const int nu = K / 64;
    for (int i = 0; i < nu; i++) {
        const int u = (i * 7 + 3) % nu; /* 7 is prime to nu: every unit once */
        typename mq::unit<T>::raw r;
        mq::unit<T>::load(row, u, r);
        got += mq::unit<T>::dot(r, u, x.xs.data(), x.xd.data());
    }
    const double err = fabs(got - x.ref) / (x.mag + 1e-30);
    const bool ok = err < 1e-5;
    printf("%-5s units misalign %d: rel.err %.2e %s\n", name, misalign, err, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}

/* The 32-element chunk code (mq::ops, the mmvq kernels' path) of the IQ4
 * types against the reference: random blocks (IQ4_NL rows 2-byte
 * misaligned where asked; an odd number of IQ4_XS super-blocks), one q8
 * token, chunks in a scrambled order. Random scale bytes cover every
 * IQ4_XS sub-block scale, random quant bytes every table index. */
template <int T> static int run_ops(const char *name, int misalign)
{
    const int K = T == LMS_TYPE_IQ4_XS ? 3 * 256 : 7 * 32;
    const int bb = T == LMS_TYPE_IQ4_XS ? 136 : 18, nb = T == LMS_TYPE_IQ4_XS ? K / 256 : K / 32;
    std::vector<uint8_t> buf((size_t)nb * bb + 16);
    uint8_t *row = buf.data() + misalign;
    for (size_t i = 0; i < (size_t)nb * bb; i++)
        row[i] = (uint8_t)rand();
    for (int b = 0; b < nb; b++) {
        const uint16_t d = f2h((0.01f + 0.02f * (rand() / (float)RAND_MAX)) * (b % 2 ? -1 : 1));
        memcpy(row + (size_t)b * bb, &d, 2);
    }
    std::vector<float> wf(K);
    lms_kernels_ref()->to_float[T](row, wf.data(), K);
    const q8_token x(wf, K);
    double got = 0;
    const int nc = K / 32;
    for (int i = 0; i < nc; i++) {
        const int c = (i * 5 + 2) % nc; /* 5 is prime to nc (7, 24): every chunk once */
        typename mq::ops<T>::raw r;
        typename mq::ops<T>::prep pp;
        mq::ops<T>::load(row, c, r);
        mq::ops<T>::unpack(r, c, pp);
        got += mq::ops<T>::dot(pp, x.xs.data(), x.xd.data(), c);
    }
    const double err = fabs(got - x.ref) / (x.mag + 1e-30);
    const bool ok = err < 1e-5;
    printf("%-6s chunks misalign %d: rel.err %.2e %s\n", name, misalign, err, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}

/* mq::iq4_lookup and iq4_lookup_nib: every index in every position
 * against the table. */
static int check_iq4_lookup(void)
{
    int bad = 0;
    for (uint32_t v = 0; v < 65536; v++) {
        const uint32_t q = (v & 15) | (v >> 4 & 15) << 8 | (v >> 8 & 15) << 16 | (v >> 12 & 15) << 24;
        const int r = mq::iq4_lookup(q);
        const int r0 = mq::iq4_lookup_nib(v | 0xA5A50000u, 0), r1 = mq::iq4_lookup_nib(v << 16 | 0x5A5Au, 16);
        for (int k = 0; k < 4; k++) {
            bad += (int8_t)(r >> (8 * k)) != lms_iq4_values[(q >> (8 * k)) & 15];
            bad += (int8_t)(r0 >> (8 * k)) != lms_iq4_values[(v >> (4 * k)) & 15];
            bad += (int8_t)(r1 >> (8 * k)) != lms_iq4_values[(v >> (4 * k)) & 15];
        }
    }
    printf("iq4 table lookup: %s\n", bad ? "FAIL" : "ok");
    return bad ? 1 : 0;
}

int main(void)
{
    int f = check_iq4_lookup();
    for (int it = 0; it < 4; it++) {
        f |= run_ops<LMS_TYPE_IQ4_NL>("iq4_nl", 2 * (it & 1));
        f |= run_ops<LMS_TYPE_IQ4_XS>("iq4_xs", 8 * (it & 1));
    }
    for (int it = 0; it < 3; it++) {
        f |= run_units<LMS_TYPE_Q4_K>("q4_K", 0);
        f |= run_units<LMS_TYPE_Q6_K>("q6_K", 0);
        f |= run_units<LMS_TYPE_Q6_K>("q6_K", 2);
        f |= run_units<LMS_TYPE_Q6_K>("q6_K", 6);
    }
    for (int it = 0; it < 2; it++) {
        f |= run<LMS_TYPE_Q4_K, 1>("q4_K", 0, 8);
        f |= run<LMS_TYPE_Q4_K, 2>("q4_K", 0, 5);
        f |= run<LMS_TYPE_Q4_K, 1>("q4_K", 0, 3);
        f |= run<LMS_TYPE_Q6_K, 1>("q6_K", 0, 8);
        f |= run<LMS_TYPE_Q6_K, 1>("q6_K", 2, 6);
        f |= run<LMS_TYPE_Q6_K, 2>("q6_K", 2, 3);
    }
    printf(f ? "HOST MMQ FAIL\n" : "HOST MMQ OK\n");
    return f;
}
