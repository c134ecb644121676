/*
 * fastmath.h - math for hot loops that must vectorize (no libm calls).
 */
#ifndef LMS_FASTMATH_H
#define LMS_FASTMATH_H

#include <stdint.h>

/* exp(x) for x <= 0: x = n ln2 + r, e^r by a degree-6 polynomial on
 * |r| <= ln2/2 (relative error about 2e-7), 2^n put into the exponent
 * bits. Values under -87 give ~0. The rounding to n uses the 1.5 * 2^23
 * trick (round to nearest even under the default rounding mode). */
static inline float lms_exp_neg(float x)
{
    const float shift = 12582912.0f;
    x = x < -87.0f ? -87.0f : x;
    float n = (x * 1.44269504f + shift) - shift;
    float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666418f +
                                                  r * (0.00833332818f + r * 0.00138889f)))));
    union {
        float f;
        uint32_t u;
    } v = {.f = p};
    v.u += (uint32_t)(int32_t)n << 23; /* unsigned: a negative n wraps, as intended */
    return v.f;
}

#endif
