/*
 * ckd.h - checked integer arithmetic for sizes that come from files or the
 * wire. Each returns true on overflow (like C23 ckd_*), leaving *r set to
 * the wrapped value, which callers must not use.
 */
#ifndef LMS_CKD_H
#define LMS_CKD_H

#include <stdbool.h>
#include <stdint.h>

#define lms_ckd_add(r, a, b) __builtin_add_overflow((a), (b), (r))
#define lms_ckd_mul(r, a, b) __builtin_mul_overflow((a), (b), (r))
#define lms_ckd_sub(r, a, b) __builtin_sub_overflow((a), (b), (r))

#endif
