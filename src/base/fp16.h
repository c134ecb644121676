/*
 * fp16.h - IEEE half and bfloat16 conversions (scalar, exact, inline).
 *
 * Round-to-nearest-even in both directions where rounding applies; NaN kept
 * as NaN. These are the reference conversions; SIMD kernels use F16C/NEON
 * instructions that give the same bits.
 */
#ifndef LMS_FP16_H
#define LMS_FP16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t lms_f16;  /* IEEE 754 binary16 bits */
typedef uint16_t lms_bf16; /* bfloat16 bits (top half of a float32) */

static inline uint32_t lms_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float lms_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float lms_f16_to_f32(lms_f16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f)
        return lms_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return lms_bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline lms_f16 lms_f32_to_f16(float f)
{
    uint32_t x = lms_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (lms_f16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (lms_f16)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half (or zero) */
        if (ax < 0x33000000u) /* below 2^-25: rounds to zero */
            return (lms_f16)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t hm = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (hm & 1)))
            hm++;
        return (lms_f16)(sign | hm);
    }
    uint32_t h = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;
    return (lms_f16)(sign | h);
}

static inline float lms_bf16_to_f32(lms_bf16 h)
{
    return lms_bits_f32((uint32_t)h << 16);
}

static inline lms_bf16 lms_f32_to_bf16(float f)
{
    uint32_t x = lms_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* nan: keep it quiet */
        return (lms_bf16)((x >> 16) | 64);
    return (lms_bf16)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

#endif
