/*
 * test_quant_ref.c - the type table and the scalar reference kernels.
 *
 * Hand-built blocks are decoded and compared exactly with values derived
 * here from the format descriptions (written loop by loop the way the
 * formats are usually explained, not with quant_ref.c's index helpers);
 * dot products are compared with the dot of the dequantized rows; the
 * activation quantizers are checked on rounding ties; pack(unpack(b)) must
 * give b back byte for byte.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp16.h"
#include "kernels/cpu/quant_ref.h"
#include "kernels/kernels.h"
#include "testutil.h"

static const lms_kernel_table *ref(void)
{
    return lms_kernels_ref();
}

static uint16_t h(float v)
{
    return lms_f32_to_f16(v);
}

static void fill_bytes(void *p, size_t n, uint64_t *seed)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)tu_rand_u64(seed);
}

/* Fails with the index when got != want (bitwise equal floats). */
static void expect_values(const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            print_error("element %d: got %.9g, want %.9g\n", i, got[i], want[i]);
            fail();
        }
    }
}

/* ---- type table -------------------------------------------------------------------- */

static void test_type_traits(void **state)
{
    (void)state;
    static const struct {
        int type;
        const char *name;
        int64_t blck;
        size_t size;
        int vdt;
    } want[] = {
        {LMS_TYPE_F32, "f32", 1, 4, LMS_TYPE_F32},
        {LMS_TYPE_F16, "f16", 1, 2, LMS_TYPE_F16},
        {LMS_TYPE_BF16, "bf16", 1, 2, LMS_TYPE_BF16},
        {LMS_TYPE_Q4_0, "q4_0", 32, 18, LMS_TYPE_Q8_0},
        {LMS_TYPE_Q4_1, "q4_1", 32, 20, LMS_TYPE_Q8_1},
        {LMS_TYPE_Q5_0, "q5_0", 32, 22, LMS_TYPE_Q8_0},
        {LMS_TYPE_Q5_1, "q5_1", 32, 24, LMS_TYPE_Q8_1},
        {LMS_TYPE_Q8_0, "q8_0", 32, 34, LMS_TYPE_Q8_0},
        {LMS_TYPE_Q8_1, "q8_1", 32, 36, -1},
        {LMS_TYPE_Q2_K, "q2_K", 256, 84, LMS_TYPE_Q8_K},
        {LMS_TYPE_Q3_K, "q3_K", 256, 110, LMS_TYPE_Q8_K},
        {LMS_TYPE_Q4_K, "q4_K", 256, 144, LMS_TYPE_Q8_K},
        {LMS_TYPE_Q5_K, "q5_K", 256, 176, LMS_TYPE_Q8_K},
        {LMS_TYPE_Q6_K, "q6_K", 256, 210, LMS_TYPE_Q8_K},
        {LMS_TYPE_Q8_K, "q8_K", 256, 292, -1},
        {LMS_TYPE_IQ4_NL, "iq4_nl", 32, 18, LMS_TYPE_Q8_0},
        {LMS_TYPE_IQ4_XS, "iq4_xs", 256, 136, LMS_TYPE_Q8_K},
        {LMS_TYPE_I8, "i8", 1, 1, -1},
        {LMS_TYPE_F64, "f64", 1, 8, -1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const lms_type_traits *tt = lms_type_get(want[i].type);
        assert_non_null(tt);
        assert_string_equal(tt->name, want[i].name);
        assert_int_equal(tt->blck_size, want[i].blck);
        assert_int_equal(tt->type_size, want[i].size);
        assert_int_equal(tt->vec_dot_type, want[i].vdt);
        assert_int_equal(tt->is_quantized, want[i].blck > 1);
    }
    static const int bad[] = {-1, 4, 5, 16, 21, 22, 29, 31, LMS_TYPE_COUNT, 1000};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_null(lms_type_get(bad[i]));
}

static void test_type_from_name(void **state)
{
    (void)state;
    assert_int_equal(lms_type_from_name("Q4_K"), LMS_TYPE_Q4_K);
    assert_int_equal(lms_type_from_name("q4_k"), LMS_TYPE_Q4_K);
    assert_int_equal(lms_type_from_name("q4_K"), LMS_TYPE_Q4_K);
    assert_int_equal(lms_type_from_name("bf16"), LMS_TYPE_BF16);
    assert_int_equal(lms_type_from_name("BF16"), LMS_TYPE_BF16);
    assert_int_equal(lms_type_from_name("F32"), LMS_TYPE_F32);
    assert_int_equal(lms_type_from_name("q8_0"), LMS_TYPE_Q8_0);
    assert_int_equal(lms_type_from_name("Q6_K"), LMS_TYPE_Q6_K);
    assert_int_equal(lms_type_from_name("q4_k_m"), -1);
    assert_int_equal(lms_type_from_name("q4"), -1);
    assert_int_equal(lms_type_from_name("f32 "), -1);
    assert_int_equal(lms_type_from_name(""), -1);
    assert_int_equal(lms_type_from_name(NULL), -1);
}

static void test_row_size(void **state)
{
    (void)state;
    assert_int_equal(lms_row_size(LMS_TYPE_F32, 10), 40);
    assert_int_equal(lms_row_size(LMS_TYPE_F16, 7), 14);
    assert_int_equal(lms_row_size(LMS_TYPE_Q4_0, 64), 36);
    assert_int_equal(lms_row_size(LMS_TYPE_Q4_K, 4096), 16 * 144);
    assert_int_equal(lms_row_size(LMS_TYPE_Q8_K, 256), 292);
    assert_int_equal(lms_row_size(LMS_TYPE_F32, 0), 0);
    /* not a multiple of the block size */
    assert_int_equal(lms_row_size(LMS_TYPE_Q4_0, 33), 0);
    assert_int_equal(lms_row_size(LMS_TYPE_Q4_K, 255), 0);
    assert_int_equal(lms_row_size(LMS_TYPE_Q6_K, 172), 0);
    /* negative, unknown type */
    assert_int_equal(lms_row_size(LMS_TYPE_F32, -4), 0);
    assert_int_equal(lms_row_size(4, 32), 0);
    assert_int_equal(lms_row_size(-1, 32), 0);
    /* overflow of size_t */
    assert_int_equal(lms_row_size(LMS_TYPE_F32, INT64_MAX), 0);
    assert_int_equal(lms_row_size(LMS_TYPE_F64, INT64_MAX / 2), 0);
    assert_int_equal(lms_row_size(LMS_TYPE_F32, (int64_t)1 << 62), 0);
    /* largest that fits */
    assert_int_equal(lms_row_size(LMS_TYPE_I8, INT64_MAX), (size_t)INT64_MAX);
    assert_int_equal(lms_row_size(LMS_TYPE_F32, (int64_t)1 << 61), (size_t)1 << 63);
}

/* ---- hand-built 32-element blocks ------------------------------------------------------ */

static void test_dequant_q4_0_q4_1(void **state)
{
    (void)state;
    lms_block_q4_0 a[2];
    lms_block_q4_1 b;
    float y[64], want[64];

    a[0].d = h(0.5f);
    a[1].d = h(-3.0f);
    for (int j = 0; j < 16; j++) {
        a[0].qs[j] = (uint8_t)(j | (15 - j) << 4); /* low nibble: x[j]; high: x[j + 16] */
        a[1].qs[j] = 0xF0;
        want[j] = (j - 8) * 0.5f;
        want[16 + j] = (15 - j - 8) * 0.5f;
        want[32 + j] = -8 * -3.0f;
        want[48 + j] = 7 * -3.0f;
    }
    ref()->to_float[LMS_TYPE_Q4_0](a, y, 64);
    expect_values(y, want, 64);

    b.d = h(0.25f);
    b.m = h(-1.5f);
    for (int j = 0; j < 16; j++) {
        b.qs[j] = (uint8_t)((j * 5) & 0xF) | (uint8_t)(((j * 3) & 0xF) << 4);
        want[j] = ((j * 5) & 0xF) * 0.25f - 1.5f;
        want[16 + j] = ((j * 3) & 0xF) * 0.25f - 1.5f;
    }
    ref()->to_float[LMS_TYPE_Q4_1](&b, y, 32);
    expect_values(y, want, 32);
}

static void test_dequant_q5_0_q5_1(void **state)
{
    (void)state;
    lms_block_q5_0 a;
    lms_block_q5_1 b;
    const uint8_t qh[4] = {0x0F, 0xF0, 0x55, 0xAA};
    const uint32_t bits = 0xAA55F00Fu; /* qh read as a little-endian u32 */
    float y[32], want[32];
    int code[32];

    a.d = h(2.0f);
    b.d = h(0.125f);
    b.m = h(3.0f);
    memcpy(a.qh, qh, 4);
    memcpy(b.qh, qh, 4);
    for (int j = 0; j < 16; j++) {
        /* low nibble: element j, high nibble: j + 16; bit i of qh: bit 4 of element i */
        a.qs[j] = b.qs[j] = (uint8_t)(j * 7 + 3);
        code[j] = ((j * 7 + 3) & 0xF) | (int)((bits >> j) & 1) << 4;
        code[j + 16] = (((j * 7 + 3) >> 4) & 0xF) | (int)((bits >> (j + 16)) & 1) << 4;
    }
    for (int j = 0; j < 32; j++)
        want[j] = (code[j] - 16) * 2.0f;
    ref()->to_float[LMS_TYPE_Q5_0](&a, y, 32);
    expect_values(y, want, 32);

    for (int j = 0; j < 32; j++)
        want[j] = code[j] * 0.125f + 3.0f;
    ref()->to_float[LMS_TYPE_Q5_1](&b, y, 32);
    expect_values(y, want, 32);
}

static void test_dequant_q8(void **state)
{
    (void)state;
    lms_block_q8_0 a;
    lms_block_q8_1 b;
    lms_block_q8_K k;
    float y[256], want[256];

    a.d = b.d = h(0.125f);
    b.s = h(1000.0f); /* not used by dequantization */
    for (int j = 0; j < 32; j++) {
        a.qs[j] = b.qs[j] = (int8_t)(j * 8 - 128);
        want[j] = (j * 8 - 128) * 0.125f;
    }
    ref()->to_float[LMS_TYPE_Q8_0](&a, y, 32);
    expect_values(y, want, 32);
    ref()->to_float[LMS_TYPE_Q8_1](&b, y, 32);
    expect_values(y, want, 32);

    k.d = -0.0078125f;
    for (int j = 0; j < 256; j++) {
        k.qs[j] = (int8_t)(j - 128);
        want[j] = (j - 128) * -0.0078125f;
    }
    ref()->to_float[LMS_TYPE_Q8_K](&k, y, 256);
    expect_values(y, want, 256);
}

static void test_dequant_plain(void **state)
{
    (void)state;
    const float x[6] = {1.0f, -2.5f, 65504.0f, 5.9604644775390625e-8f, 0.0f, -0.0f};
    lms_f16 hx[6];
    lms_bf16 bx[6];
    float y[6];
    for (int i = 0; i < 6; i++) {
        hx[i] = h(x[i]);
        bx[i] = lms_f32_to_bf16(x[i]);
    }
    ref()->to_float[LMS_TYPE_F16](hx, y, 6);
    expect_values(y, x, 6);
    ref()->to_float[LMS_TYPE_F32](x, y, 6);
    expect_values(y, x, 6);
    ref()->to_float[LMS_TYPE_BF16](bx, y, 6);
    for (int i = 0; i < 6; i++)
        assert_true(y[i] == lms_bf16_to_f32(bx[i]));
    assert_true(y[0] == 1.0f && y[1] == -2.5f && y[2] == 65536.0f);
}

/* ---- hand-built K-quant blocks ------------------------------------------------------------ */

/* 16 six-bit Q3_K scale codes (stored value + 32) into the 12 bytes, from the
 * description: low 4 bits in bytes 0-7 (low nibble for scales 0-7, high
 * nibble for 8-15), high 2 bits in bytes 8-11 (scale s: byte 8 + s % 4, bit
 * pair s / 4). */
static void write_q3_scales(const int codes[16], uint8_t out[12])
{
    memset(out, 0, 12);
    for (int s = 0; s < 8; s++)
        out[s] = (uint8_t)((codes[s] & 0xF) | (codes[s + 8] & 0xF) << 4);
    for (int s = 0; s < 16; s++)
        out[8 + s % 4] |= (uint8_t)((codes[s] >> 4) << (2 * (s / 4)));
}

/* Q4_K/Q5_K: scales 0-3 and mins 0-3 are whole 6-bit fields of bytes 0-3
 * and 4-7; scales/mins 4-7 take their low 4 bits from bytes 8-11 (scale
 * low nibble, min high nibble) and their top 2 bits from bits 6-7 of bytes
 * 0-3 (scales) and 4-7 (mins). */
static void write_k4_scales(const int sc[8], const int mn[8], uint8_t out[12])
{
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        out[j + 4] = (uint8_t)(mn[j] | (mn[j + 4] >> 4) << 6);
        out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
    }
}

static void test_dequant_q2_K(void **state)
{
    (void)state;
    lms_block_q2_K b;
    float y[256], want[256];
    uint64_t seed = 11;
    fill_bytes(b.qs, sizeof b.qs, &seed);
    for (int s = 0; s < 16; s++)
        b.scales[s] = (uint8_t)(s | (15 - s) << 4); /* scale s, min 15 - s */
    b.d = h(0.5f);
    b.dmin = h(0.25f);

    /* Each 32-byte half of qs holds 128 elements: bit pair 0 of the 32
     * bytes gives elements 0-31, pair 1 gives 32-63, and so on. */
    int e = 0;
    for (int half = 0; half < 2; half++)
        for (int shift = 0; shift < 8; shift += 2)
            for (int l = 0; l < 32; l++, e++) {
                int q = (b.qs[32 * half + l] >> shift) & 3;
                int s = e / 16;
                want[e] = (0.5f * (float)s) * (float)q - 0.25f * (float)(15 - s);
            }
    ref()->to_float[LMS_TYPE_Q2_K](&b, y, 256);
    expect_values(y, want, 256);
}

static void test_dequant_q3_K(void **state)
{
    (void)state;
    lms_block_q3_K b;
    float y[256], want[256];
    int codes[16];
    uint64_t seed = 12;
    fill_bytes(b.qs, sizeof b.qs, &seed);
    fill_bytes(b.hmask, sizeof b.hmask, &seed);
    for (int s = 0; s < 16; s++)
        codes[s] = (s * 23 + 5) % 64; /* covers both signs after -32 */
    write_q3_scales(codes, b.scales);
    b.d = h(0.75f);

    int e = 0;
    for (int half = 0; half < 2; half++)
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++, e++) {
                int lo = (b.qs[32 * half + l] >> (2 * g)) & 3;
                int hbit = (b.hmask[l] >> (4 * half + g)) & 1;
                int q = lo - (hbit ? 0 : 4);
                want[e] = (0.75f * (float)(codes[e / 16] - 32)) * (float)q;
            }
    ref()->to_float[LMS_TYPE_Q3_K](&b, y, 256);
    expect_values(y, want, 256);
}

/* Q4_K (qh NULL) and Q5_K: 4 chunks of 64 elements; in chunk c the 32 bytes
 * qs[32c..32c+31] give elements 64c..64c+31 (low nibbles, sub-block 2c) and
 * 64c+32..64c+63 (high nibbles, sub-block 2c+1); the fifth bit of those is
 * bit 2c, resp. 2c+1, of qh[l]. */
static void k4_expected(const uint8_t *qs, const uint8_t *qh, const int sc[8], const int mn[8],
                        float d, float dmin, float *want)
{
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
            if (qh) {
                lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            want[64 * c + l] = (d * (float)sc[2 * c]) * (float)lo - dmin * (float)mn[2 * c];
            want[64 * c + 32 + l] =
                (d * (float)sc[2 * c + 1]) * (float)hi - dmin * (float)mn[2 * c + 1];
        }
}

static void test_dequant_q4_K_q5_K(void **state)
{
    (void)state;
    lms_block_q4_K a;
    lms_block_q5_K b;
    float y[256], want[256];
    const int sc[8] = {1, 63, 17, 32, 48, 5, 60, 33}, mn[8] = {0, 7, 63, 31, 16, 47, 2, 59};
    uint64_t seed = 13;

    fill_bytes(a.qs, sizeof a.qs, &seed);
    write_k4_scales(sc, mn, a.scales);
    a.d = h(0.0625f);
    a.dmin = h(1.5f);
    k4_expected(a.qs, NULL, sc, mn, 0.0625f, 1.5f, want);
    ref()->to_float[LMS_TYPE_Q4_K](&a, y, 256);
    expect_values(y, want, 256);

    fill_bytes(b.qs, sizeof b.qs, &seed);
    fill_bytes(b.qh, sizeof b.qh, &seed);
    write_k4_scales(sc, mn, b.scales);
    b.d = h(-0.375f);
    b.dmin = h(0.0078125f);
    k4_expected(b.qs, b.qh, sc, mn, -0.375f, 0.0078125f, want);
    ref()->to_float[LMS_TYPE_Q5_K](&b, y, 256);
    expect_values(y, want, 256);
}

static void test_dequant_q6_K(void **state)
{
    (void)state;
    lms_block_q6_K b;
    float y[256], want[256];
    uint64_t seed = 14;
    fill_bytes(&b, sizeof b, &seed);
    b.d = h(0.01f);
    const float d = lms_f16_to_f32(b.d);

    /* Per 128-element half: ql[64 bytes], qh[32 bytes]. For l < 32, the four
     * elements l, l+32, l+64, l+96 take low nibble of ql[l], low of
     * ql[l+32], high of ql[l], high of ql[l+32], and bit pairs 0, 1, 2, 3 of
     * qh[l]; the 6-bit value minus 32 is the code; scale e / 16. */
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b.ql + 64 * half, *qh = b.qh + 32 * half;
        for (int l = 0; l < 32; l++) {
            const int q[4] = {(ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4,
                              (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
                              (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
                              (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
            for (int k = 0; k < 4; k++) {
                int e = 128 * half + 32 * k + l;
                want[e] = (d * (float)b.scales[e / 16]) * (float)(q[k] - 32);
            }
        }
    }
    ref()->to_float[LMS_TYPE_Q6_K](&b, y, 256);
    expect_values(y, want, 256);
}

/* ---- codecs: pack(unpack(b)) == b ----------------------------------------------------- */

/* Gives the f16 fields of a random block finite values (random bytes may
 * hold NaNs, whose payload a float round trip does not keep). */
static void sanitize_f16(int type, void *blk, uint16_t v)
{
    switch (type) {
    case LMS_TYPE_Q4_0: ((lms_block_q4_0 *)blk)->d = v; break;
    case LMS_TYPE_Q5_0: ((lms_block_q5_0 *)blk)->d = v; break;
    case LMS_TYPE_Q8_0: ((lms_block_q8_0 *)blk)->d = v; break;
    case LMS_TYPE_Q4_1: ((lms_block_q4_1 *)blk)->d = ((lms_block_q4_1 *)blk)->m = v; break;
    case LMS_TYPE_Q5_1: ((lms_block_q5_1 *)blk)->d = ((lms_block_q5_1 *)blk)->m = v; break;
    case LMS_TYPE_Q2_K: ((lms_block_q2_K *)blk)->d = ((lms_block_q2_K *)blk)->dmin = v; break;
    case LMS_TYPE_Q3_K: ((lms_block_q3_K *)blk)->d = v; break;
    case LMS_TYPE_Q4_K: ((lms_block_q4_K *)blk)->d = ((lms_block_q4_K *)blk)->dmin = v; break;
    case LMS_TYPE_Q5_K: ((lms_block_q5_K *)blk)->d = ((lms_block_q5_K *)blk)->dmin = v; break;
    case LMS_TYPE_Q6_K: ((lms_block_q6_K *)blk)->d = v; break;
    case LMS_TYPE_IQ4_NL: ((lms_block_iq4_nl *)blk)->d = v; break;
    case LMS_TYPE_IQ4_XS: ((lms_block_iq4_xs *)blk)->d = v; break;
    default: fail();
    }
}

/* A format's codec: exactly one of the two pairs is set. */
typedef struct codec {
    int type;
    void (*lq_unpack)(const void *, lms_lq_block *);
    void (*lq_pack)(const lms_lq_block *, void *);
    void (*kq_unpack)(const void *, lms_kq_block *);
    void (*kq_pack)(const lms_kq_block *, void *);
} codec;

static const codec k_codecs[] = {
    {LMS_TYPE_Q4_0, lms_unpack_q4_0, lms_pack_q4_0, NULL, NULL},
    {LMS_TYPE_Q4_1, lms_unpack_q4_1, lms_pack_q4_1, NULL, NULL},
    {LMS_TYPE_Q5_0, lms_unpack_q5_0, lms_pack_q5_0, NULL, NULL},
    {LMS_TYPE_Q5_1, lms_unpack_q5_1, lms_pack_q5_1, NULL, NULL},
    {LMS_TYPE_Q8_0, lms_unpack_q8_0, lms_pack_q8_0, NULL, NULL},
    {LMS_TYPE_Q2_K, NULL, NULL, lms_unpack_q2_K, lms_pack_q2_K},
    {LMS_TYPE_Q3_K, NULL, NULL, lms_unpack_q3_K, lms_pack_q3_K},
    {LMS_TYPE_Q4_K, NULL, NULL, lms_unpack_q4_K, lms_pack_q4_K},
    {LMS_TYPE_Q5_K, NULL, NULL, lms_unpack_q5_K, lms_pack_q5_K},
    {LMS_TYPE_Q6_K, NULL, NULL, lms_unpack_q6_K, lms_pack_q6_K},
    {LMS_TYPE_IQ4_NL, lms_unpack_iq4_nl, lms_pack_iq4_nl, NULL, NULL},
    {LMS_TYPE_IQ4_XS, NULL, NULL, lms_unpack_iq4_xs, lms_pack_iq4_xs},
};

static void test_pack_unpack(void **state)
{
    (void)state;
    uint8_t in[512], out[512];
    uint64_t seed = 15;
    for (int rep = 0; rep < 200; rep++) {
        const uint16_t v = (uint16_t)(tu_rand_u64(&seed) & 0xFBFF); /* exponent < 31 */
        for (size_t i = 0; i < sizeof k_codecs / sizeof k_codecs[0]; i++) {
            const codec *c = &k_codecs[i];
            const size_t n = lms_type_get(c->type)->type_size;
            fill_bytes(in, n, &seed);
            sanitize_f16(c->type, in, v);
            memset(out, 0xA5, n);
            if (c->lq_unpack) {
                lms_lq_block b;
                c->lq_unpack(in, &b);
                c->lq_pack(&b, out);
            } else {
                lms_kq_block b;
                c->kq_unpack(in, &b);
                c->kq_pack(&b, out);
            }
            assert_memory_equal(in, out, n);
        }
    }
}

/* ---- activation quantizers: exact rounding -------------------------------------------- */

static void test_q8_0_rounding(void **state)
{
    (void)state;
    float x[64] = {0};
    lms_block_q8_0 y[2];
    /* Block 0: amax 127, so x * 127 / amax = x: ties go to even. */
    const float v[] = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, 1.5f, -0.5f, 126.5f, -126.5f};
    const int8_t q[] = {127, 2, 4, -2, -4, 0, 2, 0, 126, -126};
    for (int i = 0; i < 10; i++)
        x[i] = v[i];
    /* Block 1: amax 254, scale 0.5: 5 -> 2.5 -> 2, 7 -> 3.5 -> 4, -254 -> -127. */
    x[32] = 5.0f;
    x[33] = 7.0f;
    x[34] = -254.0f;
    ref()->from_float[LMS_TYPE_Q8_0](x, y, 64);
    assert_int_equal(y[0].d, h(1.0f));
    for (int i = 0; i < 10; i++)
        assert_int_equal(y[0].qs[i], q[i]);
    for (int i = 10; i < 32; i++)
        assert_int_equal(y[0].qs[i], 0);
    assert_int_equal(y[1].d, h(2.0f));
    assert_int_equal(y[1].qs[0], 2);
    assert_int_equal(y[1].qs[1], 4);
    assert_int_equal(y[1].qs[2], -127);

    /* The scale is amax / 127 rounded to half; the codes use 127 / amax. */
    float z[32];
    for (int i = 0; i < 32; i++)
        z[i] = 0.013f * (float)(i - 16);
    ref()->from_float[LMS_TYPE_Q8_0](z, y, 32);
    const float amax = 0.013f * 16.0f;
    assert_int_equal(y[0].d, h(amax / 127.0f));
    for (int i = 0; i < 32; i++)
        assert_int_equal(y[0].qs[i], (int8_t)nearbyintf(z[i] * (127.0f / amax)));

    /* All zero: d 0 and codes 0. */
    memset(z, 0, sizeof z);
    ref()->from_float[LMS_TYPE_Q8_0](z, y, 32);
    assert_int_equal(y[0].d, 0);
    for (int i = 0; i < 32; i++)
        assert_int_equal(y[0].qs[i], 0);
}

static void test_q8_1_sum(void **state)
{
    (void)state;
    float x[32];
    lms_block_q8_1 y;
    uint64_t seed = 16;
    for (int i = 0; i < 32; i++)
        x[i] = tu_rand_f32(&seed, -3.0f, 2.0f);
    ref()->from_float[LMS_TYPE_Q8_1](x, &y, 32);
    lms_block_q8_0 y0;
    ref()->from_float[LMS_TYPE_Q8_0](x, &y0, 32);
    assert_int_equal(y.d, y0.d);
    assert_memory_equal(y.qs, y0.qs, 32);
    float amax = 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; i++) {
        amax = fmaxf(amax, fabsf(x[i]));
        sum += y.qs[i];
    }
    assert_int_equal(y.s, h(amax / 127.0f * (float)sum));
}

static void test_q8_K_rounding(void **state)
{
    (void)state;
    float x[512] = {0};
    lms_block_q8_K y[2];
    /* Block 0: m = -127, iscale = 1: plain half-to-even rounding. */
    const float v[] = {-127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, 1.5f, 126.5f, 100.0f};
    const int8_t q[] = {-127, 2, 4, -2, -4, 0, 2, 126, 100};
    for (int i = 0; i < 9; i++)
        x[i] = v[i];
    /* Block 1: m = +127 (largest magnitude, positive), iscale = -1. The
     * first of two equal magnitudes wins. */
    x[256] = 2.5f;
    x[257] = 127.0f;
    x[258] = -127.0f;
    x[300] = 3.5f;
    ref()->from_float[LMS_TYPE_Q8_K](x, y, 512);
    assert_true(y[0].d == 1.0f);
    for (int i = 0; i < 9; i++)
        assert_int_equal(y[0].qs[i], q[i]);
    assert_true(y[1].d == -1.0f);
    assert_int_equal(y[1].qs[0], -2);
    assert_int_equal(y[1].qs[1], -127);
    assert_int_equal(y[1].qs[2], 127);
    assert_int_equal(y[1].qs[44], -4);

    /* d is 1 / iscale in float; bsums are sums of 16 codes. */
    uint64_t seed = 17;
    for (int i = 0; i < 256; i++)
        x[i] = tu_rand_f32(&seed, -0.7f, 0.9f);
    x[77] = 1.3f;
    ref()->from_float[LMS_TYPE_Q8_K](x, y, 256);
    const float iscale = -127.0f / 1.3f;
    assert_true(y[0].d == 1.0f / iscale);
    for (int i = 0; i < 256; i++)
        assert_int_equal(y[0].qs[i], (int8_t)nearbyintf(iscale * x[i]));
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++)
            s += y[0].qs[16 * j + i];
        assert_int_equal(y[0].bsums[j], s);
    }

    memset(x, 0, 256 * sizeof x[0]);
    ref()->from_float[LMS_TYPE_Q8_K](x, y, 256);
    assert_true(y[0].d == 0.0f);
    for (int j = 0; j < 16; j++)
        assert_int_equal(y[0].bsums[j], 0);
}

static void test_half_rounding(void **state)
{
    (void)state;
    /* Ties to even in both 16-bit formats. */
    const float x[4] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f};
    lms_f16 hy[4];
    lms_bf16 by[4];
    ref()->from_float[LMS_TYPE_F16](x, hy, 4);
    ref()->from_float[LMS_TYPE_BF16](x, by, 4);
    assert_true(lms_f16_to_f32(hy[0]) == 1.0f);
    assert_true(lms_f16_to_f32(hy[1]) == 1.0f + 0x1p-9f);
    assert_true(lms_bf16_to_f32(by[2]) == 1.0f);
    assert_true(lms_bf16_to_f32(by[3]) == 1.0f + 0x1p-6f);
}

/* ---- vec_dot against the dot of dequantized rows -------------------------------------------- */

static const int k_weight_types[] = {
    LMS_TYPE_F32,  LMS_TYPE_F16,  LMS_TYPE_BF16, LMS_TYPE_Q4_0, LMS_TYPE_Q4_1,
    LMS_TYPE_Q5_0, LMS_TYPE_Q5_1, LMS_TYPE_Q8_0, LMS_TYPE_Q2_K, LMS_TYPE_Q3_K,
    LMS_TYPE_Q4_K, LMS_TYPE_Q5_K, LMS_TYPE_Q6_K, LMS_TYPE_IQ4_NL, LMS_TYPE_IQ4_XS,
};
#define N_WEIGHT_TYPES (sizeof k_weight_types / sizeof k_weight_types[0])

/* Q8_1 stores s = f16(d * sum q) with d before its rounding to f16, so a
 * Q4_1/Q5_1 dot differs from the dot of the dequantized rows by
 * m * (s - f16(d) * sum q) per block: the format's definition. */
static double q8_1_offset_term(int type, int64_t n, const void *w, const void *xq)
{
    const lms_block_q8_1 *a = xq;
    double r = 0.0;
    for (int64_t b = 0; b < n / 32; b++) {
        lms_lq_block wb;
        if (type == LMS_TYPE_Q4_1)
            lms_unpack_q4_1((const lms_block_q4_1 *)w + b, &wb);
        else
            lms_unpack_q5_1((const lms_block_q5_1 *)w + b, &wb);
        int sum = 0;
        for (int i = 0; i < 32; i++)
            sum += a[b].qs[i];
        r += wb.m * ((double)lms_f16_to_f32(a[b].s) - (double)lms_f16_to_f32(a[b].d) * sum);
    }
    return r;
}

/* vec_dot(w, xq) must equal sum dequant(w) * dequant(xq) up to float
 * rounding of the per-block scaling and accumulation. */
static void check_dot(int type, int64_t n, const void *w, const void *xq)
{
    const int vt = lms_type_get(type)->vec_dot_type;
    float *wd = malloc((size_t)n * sizeof *wd), *xd = malloc((size_t)n * sizeof *xd);
    assert_non_null(wd);
    assert_non_null(xd);
    ref()->to_float[type](w, wd, n);
    ref()->to_float[vt](xq, xd, n);
    double want = vt == LMS_TYPE_Q8_1 ? q8_1_offset_term(type, n, w, xq) : 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; i++) {
        want += (double)wd[i] * xd[i];
        mag += fabs((double)wd[i] * xd[i]);
    }
    float got = NAN;
    ref()->vec_dot[type](n, &got, w, xq);
    if (!(fabs(got - want) <= 2e-6 * mag * sqrt((double)n / 32.0 + 1.0))) {
        print_error("%s n=%lld: vec_dot %.9g, dequantized dot %.9g (sum |.| %.3g)\n",
                    lms_type_get(type)->name, (long long)n, got, want, mag);
        fail();
    }
    free(wd);
    free(xd);
}

/* Random rows (a zero block in each) through the types' own quantizers. */
static void test_vec_dot_quantized_rows(void **state)
{
    (void)state;
    uint64_t seed = 18;
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++) {
        const int type = k_weight_types[t], vt = lms_type_get(type)->vec_dot_type;
        const int64_t blk = lms_type_get(type)->blck_size > 1 ? lms_type_get(type)->blck_size : 32;
        for (int64_t nb = 1; nb <= 7; nb += 2) { /* odd block counts */
            const int64_t n = nb * blk;
            float *w = malloc((size_t)n * sizeof *w), *x = malloc((size_t)n * sizeof *x);
            void *wq = malloc(lms_row_size(type, n)), *xq = malloc(lms_row_size(vt, n));
            for (int64_t i = 0; i < n; i++) {
                w[i] = tu_rand_f32(&seed, -1.0f, 1.0f);
                x[i] = tu_rand_f32(&seed, -4.0f, 4.0f);
            }
            if (nb > 1) {
                memset(w, 0, (size_t)blk * sizeof *w);
                memset(x + n - blk, 0, (size_t)blk * sizeof *x);
            }
            ref()->from_float[type](w, wq, n);
            ref()->from_float[vt](x, xq, n);
            check_dot(type, n, wq, xq);
            free(w), free(x), free(wq), free(xq);
        }
    }
}

/* Random bit patterns (every code and sub-block scale) with extreme block
 * scales: the largest half, the smallest subnormal half, and ordinary. */
static void test_vec_dot_random_blocks(void **state)
{
    (void)state;
    static const uint16_t scales[] = {0x7BFF, 0x0001, 0x03FF, 0x2E66, 0xAE66};
    uint64_t seed = 19;
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++) {
        const int type = k_weight_types[t], vt = lms_type_get(type)->vec_dot_type;
        const lms_type_traits *tt = lms_type_get(type);
        if (!tt->is_quantized)
            continue;
        const int64_t nb = 5, n = nb * tt->blck_size;
        uint8_t *w = malloc(lms_row_size(type, n));
        void *xq = malloc(lms_row_size(vt, n));
        float *x = malloc((size_t)n * sizeof *x);
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
            fill_bytes(w, lms_row_size(type, n), &seed);
            for (int64_t b = 0; b < nb; b++)
                sanitize_f16(type, w + b * tt->type_size, scales[(s + (size_t)b) % 5]);
            for (int64_t i = 0; i < n; i++)
                x[i] = tu_rand_f32(&seed, -2.0f, 2.0f);
            ref()->from_float[vt](x, xq, n);
            check_dot(type, n, w, xq);
        }
        free(w), free(xq), free(x);
    }
}

/* ---- the dot product formula itself, on one hand-made Q4_K block ------------------- */

static void test_vec_dot_q4_K_formula(void **state)
{
    (void)state;
    lms_block_q4_K w;
    lms_block_q8_K a;
    const int sc[8] = {3, 1, 4, 1, 5, 9, 2, 6}, mn[8] = {2, 7, 1, 8, 2, 8, 1, 8};
    memset(&w, 0x21, sizeof w); /* codes: 1 in low nibbles, 2 in high */
    write_k4_scales(sc, mn, w.scales);
    w.d = h(0.5f);
    w.dmin = h(0.25f);
    a.d = 0.125f;
    for (int i = 0; i < 256; i++)
        a.qs[i] = (int8_t)(i % 7 - 3);
    for (int j = 0; j < 16; j++) {
        a.bsums[j] = 0;
        for (int i = 0; i < 16; i++)
            a.bsums[j] = (int16_t)(a.bsums[j] + a.qs[16 * j + i]);
    }
    /* sum over sub-blocks s of (0.5 sc[s] code(s) - 0.25 mn[s]) * 0.125 * sum(a) */
    double want = 0.0;
    for (int s = 0; s < 8; s++) {
        int sa = 0;
        for (int i = 32 * s; i < 32 * s + 32; i++)
            sa += a.qs[i];
        want += (0.5 * sc[s] * (s % 2 ? 2 : 1) - 0.25 * mn[s]) * 0.125 * sa;
    }
    float got;
    ref()->vec_dot[LMS_TYPE_Q4_K](256, &got, &w, &a);
    assert_true(fabs(got - want) < 1e-5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_traits),
        cmocka_unit_test(test_type_from_name),
        cmocka_unit_test(test_row_size),
        cmocka_unit_test(test_dequant_q4_0_q4_1),
        cmocka_unit_test(test_dequant_q5_0_q5_1),
        cmocka_unit_test(test_dequant_q8),
        cmocka_unit_test(test_dequant_plain),
        cmocka_unit_test(test_dequant_q2_K),
        cmocka_unit_test(test_dequant_q3_K),
        cmocka_unit_test(test_dequant_q4_K_q5_K),
        cmocka_unit_test(test_dequant_q6_K),
        cmocka_unit_test(test_pack_unpack),
        cmocka_unit_test(test_q8_0_rounding),
        cmocka_unit_test(test_q8_1_sum),
        cmocka_unit_test(test_q8_K_rounding),
        cmocka_unit_test(test_half_rounding),
        cmocka_unit_test(test_vec_dot_quantized_rows),
        cmocka_unit_test(test_vec_dot_random_blocks),
        cmocka_unit_test(test_vec_dot_q4_K_formula),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
