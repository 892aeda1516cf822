/* FLASH3 lab: checks fa3_fwd against a naive fp32 GPU attention and times it on the protocol shapes. lab test the
 * correctness matrix (odd seqlens, seqlen_q != seqlen_k, GQA, masks, strided views) lab small a few small cases (for
 * compute-sanitizer) lab bench FILE protocol shapes (bf16, 16k tokens, heads = 2048/d), CSV to FILE Build: see
 * run.sh. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "core/visible.h"
#include "cuda/sm90/flash3.h"
#include "../../cuda_check.h"

#define NSCHED 4 /* fa3_fwd_schedule 0..3; NSCHED itself stands for fa3_fwd (the default choice) */

static cudaError_t run_fa3(const fa3_params *p, int sched) {
    return sched == NSCHED ? fa3_fwd(p, 0) : fa3_fwd_schedule(p, sched, 0);
}


static float h2f(uint16_t x, int dtype) {
    if (dtype == FA3_FP16) {
        __half_raw r;
        r.x = x;
        return __half2float(__half(r));
    }
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f2h(float f, int dtype) {
    if (dtype == FA3_FP16) {
        __half h = __float2half_rn(f);
        return ((__half_raw)h).x;
    }
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    return ((__nv_bfloat16_raw)b).x;
}

__device__ float dev_h2f(uint16_t x, int dtype) {
    if (dtype == FA3_FP16) return __half2float(__ushort_as_half(x));
    return __uint_as_float((uint32_t)x << 16);
}

/* One CTA per (query row, head, batch): S row in shared memory, softmax, then O. fp32 throughout. */
__global__ void ref_attn(fa3_params p, float *o, float *lse) {
    extern __shared__ float sh[];
    const int D = p.head_dim, i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / (p.heads_q / p.heads_k);
    float *qs = sh, *srow = sh + D, *red = srow + p.seqlen_k;
    const uint16_t *q =
        (const uint16_t *)p.q + b * p.q_batch_stride + (int64_t)i * p.q_row_stride + h * p.q_head_stride;
    const uint16_t *k = (const uint16_t *)p.k + b * p.k_batch_stride + hk * p.k_head_stride;
    const uint16_t *v = (const uint16_t *)p.v + b * p.v_batch_stride + hk * p.v_head_stride;
    for (int d = threadIdx.x; d < D; d += blockDim.x) qs[d] = dev_h2f(q[d], p.dtype);
    __syncthreads();
    int lo, hi;
    fa_visible_keys32(i, p.seqlen_q, p.seqlen_k, p.window_left, p.causal ? 0 : p.window_right, &lo, &hi);
    float mx = -INFINITY;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        float s = 0.f;
        const uint16_t *kr = k + (int64_t)j * p.k_row_stride;
        for (int d = 0; d < D; d++) s += qs[d] * dev_h2f(kr[d], p.dtype);
        s *= p.scale;
        srow[j] = s;
        mx = fmaxf(mx, s);
    }
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
        __syncthreads();
    }
    mx = red[0];
    __syncthreads();
    float sum = 0.f;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        srow[j] = expf(srow[j] - mx);
        sum += srow[j];
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
        __syncthreads();
    }
    sum = red[0];
    float *orow = o + (((int64_t)b * p.seqlen_q + i) * p.heads_q + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.f;
        for (int j = lo; j < hi; j++) acc += srow[j] * dev_h2f(v[(int64_t)j * p.v_row_stride + d], p.dtype);
        orow[d] = hi > lo ? acc / sum : 0.f;
    }
    if (threadIdx.x == 0) lse[((int64_t)b * p.heads_q + h) * p.seqlen_q + i] = hi > lo ? mx + logf(sum) : -INFINITY;
}

static uint64_t rng_state;
static float frand() { /* uniform [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xFFFFFF) / 8388608.f - 1.f;
}

struct Case {
    const char *name;
    int dtype, D, b, hq, hk, sq, sk, causal, wl, wr;
    float qmul; /* scales Q: large logits */
    int packed; /* Q, K, V views into one [b, s, 3, h, d] tensor; O with padded rows */
};

static int run_case(const Case &c, uint64_t seed) {
    rng_state = seed;
    const int D = c.D;
    fa3_params p;
    memset(&p, 0, sizeof p);
    p.batch = c.b;
    p.seqlen_q = c.sq;
    p.seqlen_k = c.sk;
    p.heads_q = c.hq;
    p.heads_k = c.hk;
    p.head_dim = D;
    p.scale = 1.f / sqrtf((float)D);
    p.causal = c.causal;
    p.window_left = c.wl;
    p.window_right = c.wr;
    p.dtype = c.dtype;
    size_t nq, nk, nbuf;
    uint16_t *dbuf, *dq, *dk, *dv;
    if (c.packed) {
        nbuf = (size_t)c.b * c.sq * 3 * c.hq * D;
        CK(cudaMalloc(&dbuf, nbuf * 2));
        dq = dbuf;
        dk = dbuf + (size_t)c.hq * D;
        dv = dbuf + (size_t)2 * c.hq * D;
        p.q_row_stride = p.k_row_stride = p.v_row_stride = 3 * c.hq * D;
        p.q_head_stride = p.k_head_stride = p.v_head_stride = D;
        p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = (int64_t)c.sq * 3 * c.hq * D;
        nq = nk = 0;
    } else {
        nq = (size_t)c.b * c.sq * c.hq * D;
        nk = (size_t)c.b * c.sk * c.hk * D;
        nbuf = nq + 2 * nk;
        CK(cudaMalloc(&dbuf, nbuf * 2));
        dq = dbuf;
        dk = dbuf + nq;
        dv = dk + nk;
        p.q_row_stride = c.hq * D;
        p.q_head_stride = D;
        p.q_batch_stride = (int64_t)c.sq * c.hq * D;
        p.k_row_stride = p.v_row_stride = c.hk * D;
        p.k_head_stride = p.v_head_stride = D;
        p.k_batch_stride = p.v_batch_stride = (int64_t)c.sk * c.hk * D;
    }
    std::vector<uint16_t> hbuf(nbuf);
    for (size_t i = 0; i < nbuf; i++) hbuf[i] = f2h(frand() * 1.7f, c.dtype);
    if (c.qmul != 1.f) { /* scale only the Q elements */
        for (int bi = 0; bi < c.b; bi++)
            for (int s = 0; s < c.sq; s++)
                for (int h = 0; h < c.hq; h++)
                    for (int d = 0; d < D; d++) {
                        size_t idx = (size_t)bi * p.q_batch_stride + (size_t)s * p.q_row_stride + h * D + d;
                        hbuf[idx] = f2h(h2f(hbuf[idx], c.dtype) * c.qmul, c.dtype);
                    }
    }
    CK(cudaMemcpy(dbuf, hbuf.data(), nbuf * 2, cudaMemcpyHostToDevice));
    p.q = dq;
    p.k = dk;
    p.v = dv;
    const int64_t orow = (int64_t)c.hq * D + (c.packed ? 64 : 0);
    const size_t no = (size_t)c.b * c.sq * orow;
    uint16_t *dout;
    float *dlse, *rout, *rlse;
    CK(cudaMalloc(&dout, no * 2));
    CK(cudaMalloc(&dlse, (size_t)c.b * c.hq * c.sq * 4));
    CK(cudaMalloc(&rout, (size_t)c.b * c.sq * c.hq * D * 4));
    CK(cudaMalloc(&rlse, (size_t)c.b * c.hq * c.sq * 4));
    CK(cudaMemset(dout, 0xFF, no * 2)); /* 0xFFFF is NaN in bf16 and fp16 */
    CK(cudaMemset(dlse, 0xFF, (size_t)c.b * c.hq * c.sq * 4));
    p.o = dout;
    p.lse = dlse;
    p.o_row_stride = orow;
    p.o_head_stride = D;
    p.o_batch_stride = (int64_t)c.sq * orow;
    char why[200];
    if (!fa3_supported(&p, 9, 0, why, sizeof why)) {
        printf("FAIL %-28s unsupported: %s\n", c.name, why);
        return 1;
    }
    const size_t rsm = (D + c.sk + 128) * 4;
    CK(cudaFuncSetAttribute(ref_attn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)rsm));
    ref_attn<<<dim3(c.sq, c.hq, c.b), 128, rsm>>>(p, rout, rlse);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> ho(no);
    std::vector<float> hr((size_t)c.b * c.sq * c.hq * D), hl((size_t)c.b * c.hq * c.sq), hrl(hl.size());
    CK(cudaMemcpy(hr.data(), rout, hr.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hrl.data(), rlse, hrl.size() * 4, cudaMemcpyDeviceToHost));
    int fails = 0;
    for (int sched = 0; sched <= NSCHED; sched++) {
        CK(cudaMemset(dout, 0xFF, no * 2));
        CK(cudaMemset(dlse, 0xFF, (size_t)c.b * c.hq * c.sq * 4));
        CK(run_fa3(&p, sched));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ho.data(), dout, no * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hl.data(), dlse, hl.size() * 4, cudaMemcpyDeviceToHost));
        double num = 0, den = 0, maxabs = 0, lse_err = 0;
        long nan = 0, bad_empty = 0, bad_lse = 0, pad_touched = 0;
        for (int bi = 0; bi < c.b; bi++)
            for (int s = 0; s < c.sq; s++)
                for (int h = 0; h < c.hq; h++) {
                    const float rl = hrl[((size_t)bi * c.hq + h) * c.sq + s],
                                ol = hl[((size_t)bi * c.hq + h) * c.sq + s];
                    const bool empty = isinf(rl) && rl < 0;
                    if (empty) {
                        if (!(isinf(ol) && ol < 0)) bad_lse++;
                    } else if (!(fabs(ol - rl) <= 1e-3 * fmax(1.0, fabs(rl)))) {
                        bad_lse++;
                        lse_err = fmax(lse_err, isnan(ol) ? INFINITY : fabs(ol - rl));
                    } else
                        lse_err = fmax(lse_err, fabs(ol - rl));
                    for (int d = 0; d < D; d++) {
                        const float ov = h2f(ho[(size_t)bi * c.sq * orow + (size_t)s * orow + h * D + d], c.dtype);
                        const float rv = hr[(((size_t)bi * c.sq + s) * c.hq + h) * D + d];
                        if (isnan(ov)) {
                            nan++;
                            continue;
                        }
                        if (empty && ov != 0.f) bad_empty++;
                        num += (double)(ov - rv) * (ov - rv);
                        den += (double)rv * rv;
                        maxabs = fmax(maxabs, fabs(ov - rv));
                    }
                    if (c.packed && h == c.hq - 1)
                        for (int d = 0; d < 64; d++)
                            if (ho[(size_t)bi * c.sq * orow + (size_t)s * orow + c.hq * D + d] != 0xFFFF) pad_touched++;
                }
        const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        const double tol = c.dtype == FA3_FP16 ? 3e-3 : 1.2e-2;
        const bool ok = nan == 0 && bad_empty == 0 && bad_lse == 0 && pad_touched == 0 && rel < tol;
        printf("%s s%d %-24s %s d=%3d b=%d h=%d/%d sq=%5d sk=%5d causal=%d "
               "win=%d,%d  rel=%.2e max=%.2e lse=%.1e "
               "nan=%ld empty=%ld badlse=%ld pad=%ld\n",
               ok ? "ok  " : "FAIL", sched, c.name, c.dtype == FA3_FP16 ? "fp16" : "bf16", D, c.b, c.hq, c.hk, c.sq,
               c.sk, c.causal, c.wl, c.wr, rel, maxabs, lse_err, nan, bad_empty, bad_lse, pad_touched);
        fails += !ok;
    }
    cudaFree(dbuf);
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(rout);
    cudaFree(rlse);
    return fails;
}

static int run_tests(bool small) {
    std::vector<Case> cs;
    const int dts[2] = {FA3_BF16, FA3_FP16};
    const int Ds[3] = {64, 128, 256};
    if (small) {
        cs.push_back({"small", FA3_BF16, 128, 1, 2, 1, 113, 77, 1, -1, -1, 1.f, 0});
        cs.push_back({"small-d64", FA3_FP16, 64, 2, 2, 2, 17, 300, 0, -1, -1, 1.f, 0});
        cs.push_back({"small-d256-packed", FA3_BF16, 256, 1, 2, 2, 130, 130, 1, -1, -1, 1.f, 1});
    } else {
        for (int di = 0; di < 3; di++)
            for (int ti = 0; ti < 2; ti++)
                for (int causal = 0; causal < 2; causal++) {
                    const int D = Ds[di], dt = dts[ti];
                    const int sl[4] = {1, 17, 113, 1023};
                    for (int i = 0; i < 4; i++)
                        cs.push_back({"square", dt, D, 2, 4, 4, sl[i], sl[i], causal, -1, -1, 1.f, 0});
                    cs.push_back({"sq<sk", dt, D, 2, 4, 4, 113, 1023, causal, -1, -1, 1.f, 0});
                    cs.push_back({"sq>sk", dt, D, 2, 4, 4, 1023, 113, causal, -1, -1, 1.f, 0});
                    cs.push_back({"gqa4", dt, D, 1, 8, 2, 300, 300, causal, -1, -1, 1.f, 0});
                    cs.push_back({"mqa8", dt, D, 1, 8, 1, 129, 257, causal, -1, -1, 1.f, 0});
                    cs.push_back({"packed-qkv", dt, D, 2, 3, 3, 255, 255, causal, -1, -1, 1.f, 1});
                    cs.push_back({"big-logits", dt, D, 1, 2, 2, 200, 333, causal, -1, -1, 12.f, 0});
                }
        for (int causal = 0; causal < 2; causal++) {
            cs.push_back({"long", FA3_BF16, 128, 1, 2, 2, 4097, 4097, causal, -1, -1, 1.f, 0});
            cs.push_back({"long-d64", FA3_BF16, 64, 1, 2, 2, 4097, 4097, causal, -1, -1, 1.f, 0});
        }
        for (int di = 0; di < 3; di++) { /* more tiles than SMs: each CTA of the persistent grid walks several */
            cs.push_back({"tiles-causal", FA3_BF16, Ds[di], 4, 8, 2, 1000, 700, 1, -1, -1, 1.f, 0});
            cs.push_back({"tiles", FA3_FP16, Ds[di], 3, 16, 16, 777, 1500, 0, -1, -1, 1.f, 0});
        }
        cs.push_back({"window", FA3_BF16, 128, 1, 2, 2, 1023, 1023, 0, 100, 50, 1.f, 0});
        cs.push_back({"window-causal", FA3_FP16, 64, 1, 2, 2, 700, 1000, 1, 200, -1, 1.f, 0});
        cs.push_back({"sk=0", FA3_BF16, 128, 1, 2, 2, 64, 0, 0, -1, -1, 1.f, 0});
    }
    int fails = 0;
    for (size_t i = 0; i < cs.size(); i++) fails += run_case(cs[i], 1234567ull + 7919ull * i);
    printf("%d of %zu runs (cases x schedules) failed\n", fails, (NSCHED + 1) * cs.size());
    return fails ? 1 : 0;
}

__global__ void fill_rand(uint16_t *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const float f = (float)(h & 0xFFFF) / 32768.f - 1.f;
        x[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    }
}

static int run_bench(const char *csv) {
    FILE *f = fopen(csv, "w");
    if (!f) return 1;
    fprintf(f, "impl,d,causal,seqlen,batch,heads,ms,tflops\n");
    const int Ds[3] = {128, 64, 256};
    const int Ss[6] = {512, 1024, 2048, 4096, 8192, 16384};
    printf("%-6s %-6s %-6s %-6s %-6s %-9s %-8s\n", "d", "causal", "seqlen", "batch", "heads", "ms", "TFLOP/s");
    for (int di = 0; di < 3; di++)
        for (int causal = 0; causal < 2; causal++)
            for (int si = 0; si < 6; si++) {
                const int D = Ds[di], S = Ss[si], B = 16384 / S, H = 2048 / D;
                const size_t n = (size_t)B * S * H * D;
                uint16_t *q, *k, *v, *o;
                CK(cudaMalloc(&q, n * 2));
                CK(cudaMalloc(&k, n * 2));
                CK(cudaMalloc(&v, n * 2));
                CK(cudaMalloc(&o, n * 2));
                float *lse;
                CK(cudaMalloc(&lse, (size_t)B * H * S * 4));
                fill_rand<<<1024, 256>>>(q, n, 1);
                fill_rand<<<1024, 256>>>(k, n, 2);
                fill_rand<<<1024, 256>>>(v, n, 3);
                fa3_params p;
                memset(&p, 0, sizeof p);
                p.q = q;
                p.k = k;
                p.v = v;
                p.o = o;
                p.lse = lse;
                p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = (int64_t)H * D;
                p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = D;
                p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = (int64_t)S * H * D;
                p.batch = B;
                p.seqlen_q = p.seqlen_k = S;
                p.heads_q = p.heads_k = H;
                p.head_dim = D;
                p.scale = 1.f / sqrtf((float)D);
                p.causal = causal;
                p.window_left = p.window_right = -1;
                p.dtype = FA3_BF16;
                for (int sched = 0; sched <= NSCHED; sched++) {
                    for (int w = 0; w < 3; w++) CK(run_fa3(&p, sched));
                    CK(cudaDeviceSynchronize());
                    const int R = 20;
                    std::vector<float> ts(R);
                    cudaEvent_t e0, e1;
                    CK(cudaEventCreate(&e0));
                    CK(cudaEventCreate(&e1));
                    /* 10 launches per sample, so the host's per-call work (tensor maps)
                     * hides behind the kernels */
                    for (int r = 0; r < R; r++) {
                        CK(cudaEventRecord(e0));
                        for (int l = 0; l < 10; l++) CK(run_fa3(&p, sched));
                        CK(cudaEventRecord(e1));
                        CK(cudaEventSynchronize(e1));
                        CK(cudaEventElapsedTime(&ts[r], e0, e1));
                        ts[r] /= 10.f;
                    }
                    std::sort(ts.begin(), ts.end());
                    const double ms = ts[R / 2];
                    const double tf = 4.0 * B * H * (double)S * S * D / (causal ? 2.0 : 1.0) / (ms * 1e-3) / 1e12;
                    printf("s%d %-6d %-6d %-6d %-6d %-6d %-9.4f %-8.1f\n", sched, D, causal, S, B, H, ms, tf);
                    fprintf(f, "s%d,%d,%d,%d,%d,%d,%.5f,%.2f\n", sched, D, causal, S, B, H, ms, tf);
                    cudaEventDestroy(e0);
                    cudaEventDestroy(e1);
                }
                cudaFree(q);
                cudaFree(k);
                cudaFree(v);
                cudaFree(o);
                cudaFree(lse);
            }
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s test|small|bench FILE\n", argv[0]);
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, cc %d.%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    if (!strcmp(argv[1], "test")) return run_tests(false);
    if (!strcmp(argv[1], "small")) return run_tests(true);
    if (!strcmp(argv[1], "bench") && argc > 2) return run_bench(argv[2]);
    return 2;
}
