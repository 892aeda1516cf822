/* The decode kernel built for avx512 (flags in src/cpu/sources.cmake); the body is attend_impl.h. */
#define FA_DEC_KERNEL_NAME fa_dec_kernel_avx512
#include "cpu/decode/attend_impl.h"
