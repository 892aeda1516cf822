/* The KV-cache attend kernel built for avx2 (flags in src/cpu/sources.cmake), reached as fa_cpu_kernels_avx2.kvcache;
 * the body is kvcache_impl.h. */
#define FA_KV_KERNEL_NAME fa_kv_kernel_avx2
#define FA_KV_KERNEL_STATS "cpu.kvcache.avx2"
#include "cpu/simd/kvcache_impl.h"
