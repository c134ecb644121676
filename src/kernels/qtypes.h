/*
 * qtypes.h - tensor element types and quantization block layouts.
 *
 * The numeric ids and the byte layouts are the GGUF/ggml ones, so weights
 * are used in place from a mapped file. Each layout is pinned by a
 * _Static_assert on its size. This header is plain C with no includes
 * beyond <stdint.h>, so CUDA sources can share it.
 *
 *  type   block  bytes  layout (in order)
 *  -----  -----  -----  ----------------------------------------------------
 *  Q4_0     32     18   f16 d; u8 qs[16] (lo nibbles: x0..15, hi: x16..31)
 *  Q4_1     32     20   f16 d, m; u8 qs[16]
 *  Q5_0     32     22   f16 d; u8 qh[4] (bit 5 of each x); u8 qs[16]
 *  Q5_1     32     24   f16 d, m; u8 qh[4]; u8 qs[16]
 *  Q8_0     32     34   f16 d; i8 qs[32]
 *  Q8_1     32     36   f16 d, s (= d * sum qs); i8 qs[32]
 *  Q2_K    256     84   u8 scales[16] (lo 4: scale, hi 4: min); u8 qs[64];
 *                       f16 d, dmin
 *  Q3_K    256    110   u8 hmask[32]; u8 qs[64]; u8 scales[12] (16 x 6 bit);
 *                       f16 d
 *  Q4_K    256    144   f16 d, dmin; u8 scales[12] (8 x (6-bit scale,
 *                       6-bit min)); u8 qs[128]
 *  Q5_K    256    176   f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
 *  Q6_K    256    210   u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
 *  Q8_K    256    292   f32 d; i8 qs[256]; i16 bsums[16] (sums of 16 qs)
 *  IQ4_NL   32     18   f16 d; u8 qs[16] (as Q4_0, but each nibble indexes
 *                       LMS_IQ4_VALUES: x = d * value)
 *  IQ4_XS  256    136   f16 d; u16 scales_h (bits 2s, 2s+1: bits 4-5 of
 *                       sub-block s's scale); u8 scales_l[4] (nibble s % 2
 *                       of byte s / 2: bits 0-3); u8 qs[128] (16 bytes per
 *                       32-element sub-block, nibbles as IQ4_NL);
 *                       x = d * (scale - 32) * value
 */
#ifndef LMS_QTYPES_H
#define LMS_QTYPES_H

#include <stdint.h>

enum lms_type {
    LMS_TYPE_F32 = 0,
    LMS_TYPE_F16 = 1,
    LMS_TYPE_Q4_0 = 2,
    LMS_TYPE_Q4_1 = 3,
    LMS_TYPE_Q5_0 = 6,
    LMS_TYPE_Q5_1 = 7,
    LMS_TYPE_Q8_0 = 8,
    LMS_TYPE_Q8_1 = 9,
    LMS_TYPE_Q2_K = 10,
    LMS_TYPE_Q3_K = 11,
    LMS_TYPE_Q4_K = 12,
    LMS_TYPE_Q5_K = 13,
    LMS_TYPE_Q6_K = 14,
    LMS_TYPE_Q8_K = 15,
    LMS_TYPE_IQ4_NL = 20,
    LMS_TYPE_IQ4_XS = 23,
    LMS_TYPE_I8 = 24,
    LMS_TYPE_I16 = 25,
    LMS_TYPE_I32 = 26,
    LMS_TYPE_I64 = 27,
    LMS_TYPE_F64 = 28,
    LMS_TYPE_BF16 = 30,
    LMS_TYPE_COUNT = 40, /* size of per-type tables; ids above are invalid */
};

#define LMS_QK4_0 32
#define LMS_QK4_1 32
#define LMS_QK5_0 32
#define LMS_QK5_1 32
#define LMS_QK8_0 32
#define LMS_QK8_1 32
#define LMS_QK_K 256
#define LMS_K_SCALE_SIZE 12
#define LMS_QK4_NL 32

/* The 16 values a 4-bit IQ4_NL / IQ4_XS index stands for (ggml's table:
 * non-uniform, denser near zero, asymmetric: -127 .. 113). */
#define LMS_IQ4_VALUES                                                                             \
    {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

typedef struct {
    uint16_t d;
    uint8_t qs[LMS_QK4_0 / 2];
} lms_block_q4_0;

typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qs[LMS_QK4_1 / 2];
} lms_block_q4_1;

typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[LMS_QK5_0 / 2];
} lms_block_q5_0;

typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[LMS_QK5_1 / 2];
} lms_block_q5_1;

typedef struct {
    uint16_t d;
    int8_t qs[LMS_QK8_0];
} lms_block_q8_0;

typedef struct {
    uint16_t d;
    uint16_t s;
    int8_t qs[LMS_QK8_1];
} lms_block_q8_1;

typedef struct {
    uint8_t scales[LMS_QK_K / 16];
    uint8_t qs[LMS_QK_K / 4];
    uint16_t d;
    uint16_t dmin;
} lms_block_q2_K;

typedef struct {
    uint8_t hmask[LMS_QK_K / 8];
    uint8_t qs[LMS_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} lms_block_q3_K;

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[LMS_K_SCALE_SIZE];
    uint8_t qs[LMS_QK_K / 2];
} lms_block_q4_K;

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[LMS_K_SCALE_SIZE];
    uint8_t qh[LMS_QK_K / 8];
    uint8_t qs[LMS_QK_K / 2];
} lms_block_q5_K;

typedef struct {
    uint8_t ql[LMS_QK_K / 2];
    uint8_t qh[LMS_QK_K / 4];
    int8_t scales[LMS_QK_K / 16];
    uint16_t d;
} lms_block_q6_K;

typedef struct {
    float d;
    int8_t qs[LMS_QK_K];
    int16_t bsums[LMS_QK_K / 16];
} lms_block_q8_K;

typedef struct {
    uint16_t d;
    uint8_t qs[LMS_QK4_NL / 2];
} lms_block_iq4_nl;

typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[LMS_QK_K / 64];
    uint8_t qs[LMS_QK_K / 2];
} lms_block_iq4_xs;

_Static_assert(sizeof(lms_block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(lms_block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(lms_block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(lms_block_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(lms_block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(lms_block_q8_1) == 36, "q8_1 block");
_Static_assert(sizeof(lms_block_q2_K) == 84, "q2_K block");
_Static_assert(sizeof(lms_block_q3_K) == 110, "q3_K block");
_Static_assert(sizeof(lms_block_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(lms_block_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(lms_block_q6_K) == 210, "q6_K block");
_Static_assert(sizeof(lms_block_q8_K) == 292, "q8_K block");
_Static_assert(sizeof(lms_block_iq4_nl) == 18, "iq4_nl block");
_Static_assert(sizeof(lms_block_iq4_xs) == 136, "iq4_xs block");

#endif
