/* The read ceiling of a paged KV cache on the GPU: a kernel that only reads K and V as the decode kernel's grid does
 * — CTA (split, K/V head, sequence) reads the head's rows of its key range, 256 bytes a row at d = 128 bf16, rows
 * found through a block table — over pages in a shuffled order (as `flashattn bench --mode decode` allocates them)
 * and over the same pages in address order (a contiguous cache). What any decode kernel could read from pages of
 * that size, before its arithmetic. Timed as the CLI times a call: CUDA events, after a 256 MB read flush.
 *   nvcc -O3 -gencode arch=compute_90a,code=sm_90a bench/lab/gpu_read_pages.cu -o gpu_read_pages
 *   ./gpu_read_pages [reps]
 * Output: one line per (batch, cache, page size, order, warps per CTA): the median GB/s of K+V. */
#include "../../tools/flashattn/device_read.cu" /* read_all_kernel: the flush */

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cuda_check.h"

#define HK 8
#define ROWB 256 /* bytes of one K/V row of one head: d = 128, bf16 */

/* Each warp reads a tile of 16 keys a step (two rows per load, 16 bytes a lane: 8 loads of K and 8 of V in flight,
 * 32 KB a 4-warp CTA), keys [s0, s1) of head h of sequence b. */
__global__ void read_pages(const uint4 *__restrict__ k, const uint4 *__restrict__ v, const int *__restrict__ bt,
                           int max_pages, int page, int cap, int nsplit, unsigned *sink) {
    const int s = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int chunk = (cap + nsplit - 1) / nsplit, s0 = s * chunk, s1 = min(cap, s0 + chunk);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned x = 0;
    for (int t0 = s0 + warp * 16; t0 < s1; t0 += nw * 16) {
        uint4 a[16];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int t = min(t0 + 2 * j + (lane >> 4), s1 - 1);
            const int64_t pg = bt[(int64_t)b * max_pages + t / page];
            const int64_t off = ((pg * page + t % page) * HK + h) * (ROWB / 16) + (lane & 15);
            a[j] = k[off], a[8 + j] = v[off];
        }
#pragma unroll
        for (int j = 0; j < 16; j++) x ^= a[j].x ^ a[j].w;
    }
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
    const size_t fl = (size_t)256 << 20;
    void *flush;
    unsigned *sink;
    CK(cudaMalloc(&flush, fl));
    CK(cudaMalloc(&sink, 64));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct { int batch, cache; } shapes[] = {{1, 65536}, {4, 65536}, {16, 1024}, {16, 8192}, {16, 65536}};
    const int pages[] = {16, 256}, warps[] = {4, 8};
    printf("SMs %d, reps %d, K/V heads %d, 256-byte rows; GB/s of K+V, median\n", sms, reps, HK);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int B = shapes[si].batch, cap = shapes[si].cache;
        const size_t bytes = (size_t)B * cap * HK * ROWB; /* of K (and of V) */
        void *k, *v;
        CK(cudaMalloc(&k, bytes));
        CK(cudaMalloc(&v, bytes));
        CK(cudaMemset(k, 1, bytes));
        CK(cudaMemset(v, 2, bytes));
        /* one CTA per SM over the grid, as the decode plan's splits: ceil(sms / (B * HK)) splits, at least 1 */
        int nsplit = (sms + B * HK - 1) / (B * HK);
        if (nsplit > cap / 256) nsplit = cap / 256 > 0 ? cap / 256 : 1;
        for (size_t pi = 0; pi < sizeof pages / sizeof *pages; pi++) {
            const int P = pages[pi], mp = cap / P, np = B * mp;
            int *hbt = (int *)malloc(sizeof(int) * (size_t)np), *dbt;
            for (int order = 0; order < 2; order++) {
                for (int i = 0; i < np; i++) hbt[i] = i;
                uint64_t rng = 12345;
                if (order)
                    for (int i = np - 1; i > 0; i--) {
                        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                        const int j = (int)((rng >> 33) % (uint64_t)(i + 1)), t = hbt[i];
                        hbt[i] = hbt[j], hbt[j] = t;
                    }
                CK(cudaMalloc(&dbt, sizeof(int) * (size_t)np));
                CK(cudaMemcpy(dbt, hbt, sizeof(int) * (size_t)np, cudaMemcpyHostToDevice));
                for (size_t wi = 0; wi < sizeof warps / sizeof *warps; wi++) {
                    float t[200];
                    for (int r = -2; r < reps; r++) {
                        read_all_kernel<<<sms * 4, 512>>>((const uint4 *)flush, fl / 16, sink);
                        CK(cudaEventRecord(e0));
                        read_pages<<<dim3(nsplit, HK, B), 32 * warps[wi]>>>((const uint4 *)k, (const uint4 *)v, dbt,
                                                                            mp, P, cap, nsplit, sink);
                        CK(cudaEventRecord(e1));
                        CK(cudaEventSynchronize(e1));
                        if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
                    }
                    qsort(t, reps, sizeof *t, cmp);
                    printf("batch %2d cache %6d page %3d %-9s splits %2d warps %d  %7.1f GB/s\n", B, cap, P,
                           order ? "shuffled" : "in order", nsplit, warps[wi], 2.0 * bytes / (t[reps / 2] * 1e6));
                }
                CK(cudaFree(dbt));
            }
            free(hbt);
        }
        CK(cudaFree(k));
        CK(cudaFree(v));
    }
    return 0;
}
