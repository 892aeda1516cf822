/* fp32 <-> the storage dtypes on the device (round to nearest even), and element loads/stores through them: the one
 * definition every CUDA kernel uses. */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#ifndef FA_DEV
#define FA_DEV __device__ __forceinline__
#endif

template <typename T> FA_DEV float fa_to_f32(T x);
template <> FA_DEV float fa_to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> FA_DEV float fa_to_f32<__half>(__half x) { return __half2float(x); }
template <> FA_DEV float fa_to_f32<float>(float x) { return x; }
template <typename T> FA_DEV T fa_from_f32(float x);
template <> FA_DEV __nv_bfloat16 fa_from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> FA_DEV __half fa_from_f32<__half>(float x) { return __float2half_rn(x); }
template <> FA_DEV float fa_from_f32<float>(float x) { return x; }

template <typename T> FA_DEV float fa_ld(const T *p) { return fa_to_f32<T>(*p); }
template <typename T> FA_DEV void fa_st(T *p, float x) { *p = fa_from_f32<T>(x); }
