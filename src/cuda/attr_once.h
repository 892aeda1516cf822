/* cudaFuncSetAttribute once per kernel and device: the call costs host time on every launch (it takes the driver's
 * lock), and a kernel's attributes (its dynamic shared memory, the same every call) outlive the launch. */
#ifndef FA_CUDA_ATTR_ONCE_H
#define FA_CUDA_ATTR_ONCE_H

#include <cuda_runtime.h>

/* ready: the kernel's own flags (a static array beside its launch), one per device; a race sets the same value twice */
static inline cudaError_t fa_cuda_attr_once(unsigned char ready[64], const void *fn, cudaFuncAttribute attr,
                                            int value) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess || (dev < 64 && ready[dev])) return e;
    e = cudaFuncSetAttribute(fn, attr, value);
    if (e == cudaSuccess && dev < 64) ready[dev] = 1;
    return e;
}
#endif
