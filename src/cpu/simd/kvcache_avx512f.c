/* The KV-cache attend kernel of the avx512f level (AVX-512 F/BW/VL/DQ, no AVX512_BF16: bf16 rows widened by a shift
 * or a mask per pair, f16 by vcvtph2ps; flags in src/cpu/sources.cmake), reached as fa_cpu_kernels_avx512f.kvcache;
 * the body is kvcache_impl.h. */
#define FA_KV_KERNEL_NAME fa_kv_kernel_avx512f
#define FA_KV_KERNEL_STATS "cpu.kvcache.avx512f"
#include "cpu/simd/kvcache_impl.h"
