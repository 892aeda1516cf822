/* The memory and context of the backend a test file is built for (tests/test_empty.c and tests/test_merge.c are
 * built twice: for the CPU, and with FA_TEST_CUDA for CUDA): dev_alloc (NULL for 0 bytes, as PyTorch gives
 * zero-size tensors), dev_free, put (host to backend), get (backend to host, once the device has finished) and
 * t_backend_ctx (the backend's context; exit 1 without one). Header-only: fa_testlib links no CUDA runtime. */
#ifndef T_BACKEND_MEM_H
#define T_BACKEND_MEM_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#ifdef FA_TEST_CUDA
#include <cuda_runtime.h>
#define BACKEND FA_BACKEND_CUDA
static void t_cu_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
}
static void *dev_alloc(size_t n) {
    void *p = NULL;
    if (n) t_cu_ok(cudaMalloc(&p, n), "cudaMalloc");
    return p;
}
static void dev_free(void *p) { cudaFree(p); }
static void put(void *dev, const void *host, size_t n) {
    if (n) t_cu_ok(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice), "to device");
}
static void get(void *host, const void *dev, size_t n) {
    t_cu_ok(cudaDeviceSynchronize(), "synchronize");
    if (n) t_cu_ok(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost), "to host");
}
static fa_context *t_backend_ctx(void) {
    fa_context *ctx = NULL;
    if (fa_context_create(&ctx, FA_BACKEND_CUDA, 0) != FA_OK) {
        fprintf(stderr, "no CUDA context: %s\n", fa_create_error());
        exit(1);
    }
    return ctx;
}
#else
#define BACKEND FA_BACKEND_CPU
static void *dev_alloc(size_t n) { return n ? malloc(n) : NULL; }
static void dev_free(void *p) { free(p); }
static void put(void *dev, const void *host, size_t n) { if (n) memcpy(dev, host, n); }
static void get(void *host, const void *dev, size_t n) { if (n) memcpy(host, dev, n); }
static fa_context *t_backend_ctx(void) { return t_cpu_ctx(); }
#endif

#endif
