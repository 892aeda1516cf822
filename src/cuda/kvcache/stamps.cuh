/* Per-CTA timestamps of the split-KV kernel, a build option for measuring where a decode call's time goes
 * (`cmake -DCMAKE_CUDA_FLAGS=-DFA_DEC_STAMPS`; off in every normal build, where the macros below are empty).
 * Thread 0 of each CTA records %globaltimer at the points FA_DEC_ST_* and its SM; after each launch the host copies
 * them back and, when FA_DEC_STAMPS_FILE names a file, appends one line per CTA to it (a synchronisation per call:
 * the call's own time is then the GPU's, as every stamp is). bench/lab/decode-stamps.py summarises the file. */
#ifndef FA_CUDA_DECODE_STAMPS_CUH
#define FA_CUDA_DECODE_STAMPS_CUH

#include "kvcache.h"

enum {
    FA_DEC_ST_START,   /* the CTA's first instruction */
    FA_DEC_ST_Q,       /* Q in shared memory, the first tiles' copies in flight */
    FA_DEC_ST_TILE0,   /* warp 0's first tile landed */
    FA_DEC_ST_LOOP,    /* warp 0's key loop done */
    FA_DEC_ST_STATE,   /* the CTA's state written (out, the partial, or the cluster's copy) */
    FA_DEC_ST_EXIT,    /* the CTA's last instruction */
    FA_DEC_ST_COUNTED, /* global merge: the arrival count back */
    FA_DEC_ST_LSE,     /* global merge, the last CTA: the splits' LSEs and weights (register merge: everything in) */
    FA_DEC_ST_PARTS,   /* global merge, the last CTA: the partials in shared memory (register merge: = LSE) */
    FA_DEC_ST_SM,      /* not a time: the SM the CTA ran on */
    FA_DEC_ST_N
};
#define FA_DEC_ST_CTAS 16384 /* CTAs recorded per call (the first ones of the grid) */

#ifdef FA_DEC_STAMPS
#include <stdio.h>
#include <stdlib.h>
__device__ unsigned long long fa_dec_stamps[FA_DEC_ST_CTAS][FA_DEC_ST_N];
__device__ __forceinline__ void fa_dec_stamp(int i) {
    if (threadIdx.x != 0) return;
    const unsigned c = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (c >= FA_DEC_ST_CTAS) return;
    unsigned long long t;
    if (i == FA_DEC_ST_SM) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        t = sm;
    } else {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    }
    fa_dec_stamps[c][i] = t;
}
#define FA_DEC_STAMP(i) fa_dec_stamp(i)
/* FA_DEC_ST_EXIT at every return of the kernel: a local whose destructor stamps it */
struct fa_dec_exit_stamp {
    __device__ ~fa_dec_exit_stamp() { fa_dec_stamp(FA_DEC_ST_EXIT); }
};
#define FA_DEC_STAMP_AT_EXIT() const fa_dec_exit_stamp fa_dec_exit_stamp_

/* After a launch: the stamps of its CTAs appended to $FA_DEC_STAMPS_FILE, a header line first. */
static void fa_dec_stamps_dump(const fa_dec_params *p, cudaStream_t st) {
    static unsigned long long h[FA_DEC_ST_CTAS][FA_DEC_ST_N];
    const char *fn = getenv("FA_DEC_STAMPS_FILE");
    if (!fn) return;
    long n = (long)p->nsplit * p->hk * p->row_tiles * p->batch;
    n = n < FA_DEC_ST_CTAS ? n : FA_DEC_ST_CTAS;
    if (cudaStreamSynchronize(st) != cudaSuccess ||
        cudaMemcpyFromSymbol(h, fa_dec_stamps, sizeof(h[0]) * (size_t)n) != cudaSuccess)
        return;
    FILE *f = fopen(fn, "a");
    if (!f) return;
    fprintf(f, "call batch=%d capacity=%d paged=%d hq=%d hk=%d splits=%d warps=%d cluster=%d ctas=%ld\n", p->batch,
            p->capacity, p->paged, p->hq, p->hk, p->nsplit, p->warps, p->cluster, n);
    for (long c = 0; c < n; c++) {
        fprintf(f, "%ld", c);
        for (int i = 0; i < FA_DEC_ST_N; i++) fprintf(f, " %llu", h[c][i]);
        fputc('\n', f);
    }
    fclose(f);
}
#else
#define FA_DEC_STAMP(i) ((void)0)
#define FA_DEC_STAMP_AT_EXIT() ((void)0)
#endif
#endif
