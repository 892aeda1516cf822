/* The decode kernel built for scalar (flags in src/cpu/sources.cmake); the body is attend_impl.h. */
#define FA_DEC_KERNEL_NAME fa_dec_kernel_scalar
#include "cpu/decode/attend_impl.h"
