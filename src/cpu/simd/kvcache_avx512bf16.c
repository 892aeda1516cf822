/* The KV-cache attend kernel of the avx512bf16 level (bf16 rows on vdpbf16ps as they are; flags in
 * src/cpu/sources.cmake), reached as fa_cpu_kernels_avx512bf16.kvcache and fa_cpu_kernels_amx.kvcache (AMX tiles
 * would gain nothing on one query row per head); the body is kvcache_impl.h. */
#define FA_KV_KERNEL_NAME fa_kv_kernel_avx512bf16
#define FA_KV_KERNEL_STATS "cpu.kvcache.avx512bf16"
#include "cpu/simd/kvcache_impl.h"
