/* flashattn CLI: a read-only pass over device memory, the CUDA anchor of `bench --mode kvcache` (the rate a kernel
 * that only reads reaches on a buffer of the cache's size) and its read flush (evicts the L2 without leaving dirty
 * lines to write back during the timed call). Built only with the CUDA tools (FA_TOOLS_CUDA). */
#include <cuda_runtime.h>
#include <stdint.h>

/* Every 16-byte word of p[0, n) once: four independent loads in flight per thread, a grid-stride loop. */
__global__ void read_all_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned x = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        x ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n; i += stride) x ^= p[i].x;
    if (x == 0x9e3779b9u) *sink = x; /* keeps the loads; the value almost never matches */
}

extern "C" int dev_read_all(const void *ptr, size_t bytes, void *sink4) {
    static int sms_of[64]; /* SMs per device, asked once: this runs before every timed call */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return -1;
    int sms = dev < 64 ? sms_of[dev] : 0;
    if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return -1;
    if (dev < 64) sms_of[dev] = sms;
    /* four CTAs of 512 threads per SM: a full SM, 128 KB of loads in flight on each */
    read_all_kernel<<<sms * 4, 512>>>((const uint4 *)ptr, bytes / 16, (unsigned *)sink4);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
