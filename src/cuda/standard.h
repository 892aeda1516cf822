/* STANDARD (cuBLAS + softmax kernels) entry points, called by backend.cu. */
#ifndef FA_CUDA_STANDARD_H
#define FA_CUDA_STANDARD_H

#include "params.h"

#include <cublas_v2.h>

extern "C" {
#include "core/arena.h"
}

typedef struct fa_std_status {
    cudaError_t cuda;
    cublasStatus_t blas;
} fa_std_status;

/* The per-sequence scratch (standard.cu lays it out; NULL: a part the call does not need). */
typedef struct fa_std_parts {
    float *S, *dP, *dkw, *dvw;
    void *P;
} fa_std_parts;
/* Scratch bytes for a sequence of sq queries and sk keys (the longest of the call; dtype 0 = f32, 1 = f16,
 * 2 = bf16): the layout's dry run. */
size_t fa_standard_ws_bytes(int hq, int d, int group, int64_t sq, int64_t sk, int dtype, int backward);
/* cu_q / cu_k: the HOST cu_seqlens (or NULL); ws: ws_bytes >= fa_standard_ws_bytes. */
fa_std_status fa_standard_forward(const fa_cuda_params *p, int dtype, const int *cu_q, const int *cu_k,
                                  cublasHandle_t hd, cudaStream_t st, void *ws, size_t ws_bytes);
fa_std_status fa_standard_backward(const fa_cuda_params *p, int dtype, const int *cu_q, const int *cu_k,
                                   cublasHandle_t hd, cudaStream_t st, void *ws, size_t ws_bytes);

#endif
