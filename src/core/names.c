/* The names and sizes of the public enums and the version: below every layer (the entry, the backends, the CLI
 * and the ring all print or size by them), and calling nothing. */
#include "core/internal.h"

const char *fa_version_string(void) {
#ifdef FA_HAVE_CUDA
    return FA_VERSION_TEXT " (cpu, cuda sm_90a)";
#else
    return FA_VERSION_TEXT " (cpu)";
#endif
}

const char *fa_status_string(fa_status s) {
    switch (s) {
    case FA_OK: return "FA_OK";
    case FA_ERR_INVALID_ARGUMENT: return "FA_ERR_INVALID_ARGUMENT";
    case FA_ERR_UNSUPPORTED: return "FA_ERR_UNSUPPORTED";
    case FA_ERR_OUT_OF_MEMORY: return "FA_ERR_OUT_OF_MEMORY";
    case FA_ERR_BACKEND_UNAVAILABLE: return "FA_ERR_BACKEND_UNAVAILABLE";
    case FA_ERR_DEVICE: return "FA_ERR_DEVICE";
    case FA_ERR_INTERNAL: return "FA_ERR_INTERNAL";
    }
    return "unknown fa_status";
}

size_t fa_dtype_size(fa_dtype t) {
    switch (t) {
    case FA_DTYPE_F32: return 4;
    case FA_DTYPE_F16:
    case FA_DTYPE_BF16: return 2;
    case FA_DTYPE_F8_E4M3: return 1;
    }
    return 0;
}

const char *fa_dtype_name(fa_dtype t) {
    switch (t) {
    case FA_DTYPE_F32: return "f32";
    case FA_DTYPE_F16: return "f16";
    case FA_DTYPE_BF16: return "bf16";
    case FA_DTYPE_F8_E4M3: return "f8_e4m3";
    }
    return "?";
}

const char *fa_backend_name(fa_backend b) {
    switch (b) {
    case FA_BACKEND_CPU: return "cpu";
    case FA_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

const char *fa_algo_name(fa_algo a) {
    switch (a) {
    case FA_ALGO_AUTO: return "auto";
    case FA_ALGO_STANDARD: return "standard";
    case FA_ALGO_FLASH1: return "flash1";
    case FA_ALGO_FLASH2: return "flash2";
    case FA_ALGO_FLASH3: return "flash3";
    }
    return "?";
}
