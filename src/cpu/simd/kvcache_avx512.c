/* The KV-cache attend kernel built for avx512 (flags in src/cpu/sources.cmake), reached as fa_cpu_kernels_avx512.kvcache;
 * the body is kvcache_impl.h. */
#define FA_KV_KERNEL_NAME fa_kv_kernel_avx512
#include "cpu/simd/kvcache_impl.h"
