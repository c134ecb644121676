/*
 * cuda_test.h - shared by the CUDA tests: skip cleanly where they cannot
 * run (CI has no GPU).
 */
#ifndef LMS_CUDA_TEST_H
#define LMS_CUDA_TEST_H

#include <stdio.h>
#include <stdlib.h>

#ifdef LMS_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

/* Exits 77 (CTest's "skipped") in a build without CUDA or on a machine
 * without a usable device, saying why. */
static inline void cuda_test_need_device(void)
{
#ifdef LMS_HAVE_CUDA
    lcu *g;
    char err[256];
    if (lcu_create(-1, &g, NULL, err, sizeof err) < 0) {
        printf("SKIP: %s\n", err);
        exit(77);
    }
    lcu_destroy(g);
#else
    printf("SKIP: built without CUDA\n");
    exit(77);
#endif
}

#endif
