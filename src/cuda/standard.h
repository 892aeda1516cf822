/* STANDARD (cuBLAS + softmax kernels) entry points, called by backend.cu. */
#ifndef FA_CUDA_STANDARD_H
#define FA_CUDA_STANDARD_H

#include "params.h"

#include <cublas_v2.h>

typedef struct fa_std_status {
    cudaError_t cuda;
    cublasStatus_t blas;
} fa_std_status;

/* Workspace bytes for the longest sequence of p (dtype 0 = f32, 1 = f16, 2 = bf16). */
size_t fa_standard_ws_bytes(const fa_cuda_params *p, int dtype, int backward);
/* cu_q / cu_k: the HOST cu_seqlens (or NULL); ws: at least fa_standard_ws_bytes. */
fa_std_status fa_standard_forward(const fa_cuda_params *p, int dtype, const int *cu_q, const int *cu_k,
                                  cublasHandle_t hd, cudaStream_t st, void *ws);
fa_std_status fa_standard_backward(const fa_cuda_params *p, int dtype, const int *cu_q, const int *cu_k,
                                   cublasHandle_t hd, cudaStream_t st, void *ws);

#endif
