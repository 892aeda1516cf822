/* The KV-cache attend kernel built for scalar (flags in src/cpu/sources.cmake), reached as fa_cpu_kernels_scalar.kvcache;
 * the body is kvcache_impl.h. */
#define FA_KV_KERNEL_NAME fa_kv_kernel_scalar
#define FA_KV_KERNEL_STATS "cpu.kvcache.scalar"
#include "cpu/simd/kvcache_impl.h"
