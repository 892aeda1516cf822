/* For the standalone CUDA benchmark programs (bench/, bench/lab/); not part of the
 * library. CK(x): a CUDA runtime call that must succeed; on failure the call, its place and the error go to stderr
 * and the program exits with status 1. */
#ifndef FA_BENCH_CUDA_CHECK_H
#define FA_BENCH_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                                      \
    do {                                                                                                           \
        cudaError_t e_ = (x);                                                                                      \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                    \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

#endif
