/* The read ceiling of the GPU at decode sizes: a kernel that only reads a buffer, timed as `flashattn bench --mode
 * decode` times a call (CUDA events around it, after an L2 flush that writes or reads 256 MB), over buffer sizes and
 * launch shapes. It tells what any decode kernel could reach at a size: the bytes of K+V, nothing else.
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a bench/lab/gpu_read.cu -o gpu_read && ./gpu_read [reps]
 * Output: one line per (flush, size, shape): the median GB/s. */
#include "../../tools/flashattn/device_read.cu" /* read_all_kernel: the CLI's read anchor, grid-stride */

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cuda_check.h"

/* contiguous: CTA c reads its own contiguous range (as a decode split does), four loads in flight per thread */
__global__ void read_chunk(const uint4 *__restrict__ p, size_t n, unsigned *sink) {
    const size_t per = (n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = min(n, lo + per);
    unsigned x = 0;
    size_t i = lo + threadIdx.x;
    const size_t st = blockDim.x;
    for (; i + 3 * st < hi; i += 4 * st) {
        const uint4 a = p[i], b = p[i + st], c = p[i + 2 * st], d = p[i + 3 * st];
        x ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < hi; i += st) x ^= p[i].x;
    if (x == 0x9e3779b9u) *sink = x;
}

static int cmp(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t sizes[] = {4u << 20, 32u << 20, 268435456, 536870912, (size_t)4 << 30};
    const size_t maxb = (size_t)4 << 30, fl = (size_t)256 << 20;
    void *buf, *flush;
    unsigned *sink;
    CK(cudaMalloc(&buf, maxb));
    CK(cudaMalloc(&flush, fl));
    CK(cudaMalloc(&sink, 64));
    CK(cudaMemset(buf, 1, maxb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct { const char *name; int per_sm, threads, chunk; } shapes[] = {
        {"stride 4x512/SM", 4, 512, 0}, {"stride 1x128/SM", 1, 128, 0}, {"chunk 1x128/SM", 1, 128, 1},
        {"chunk 1x256/SM", 1, 256, 1},  {"chunk 2x128/SM", 2, 128, 1},  {"chunk 8x256/SM", 8, 256, 1}};
    printf("SMs %d, reps %d; GB/s, median\n", sms, reps);
    for (int f = 0; f < 2; f++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
                float t[200];
                for (int r = -2; r < reps; r++) {
                    if (f == 0) CK(cudaMemsetAsync(flush, r & 0xff, fl));
                    else read_all_kernel<<<sms * 4, 512>>>((const uint4 *)flush, fl / 16, sink);
                    CK(cudaEventRecord(e0));
                    const int grid = sms * shapes[k].per_sm;
                    if (shapes[k].chunk) read_chunk<<<grid, shapes[k].threads>>>((const uint4 *)buf, sizes[si] / 16, sink);
                    else read_all_kernel<<<grid, shapes[k].threads>>>((const uint4 *)buf, sizes[si] / 16, sink);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
                }
                qsort(t, reps, sizeof *t, cmp);
                printf("flush %-5s %8.1f MB  %-16s %7.1f GB/s  (%.2f us)\n", f ? "read" : "write", sizes[si] / 1e6,
                       shapes[k].name, sizes[si] / (t[reps / 2] * 1e6), t[reps / 2] * 1e3);
            }
    return 0;
}
