/* The end of a KV-cache attention CTA (splitkv.cu): the numerics contract on each row's split state and the merge of
 * the splits by the last CTA of a row tile to finish. docs/kvcache.md, docs/numerics.md. */
#ifndef FA_CUDA_KVCACHE_FINISH_CUH
#define FA_CUDA_KVCACHE_FINISH_CUH

#include "../convert.cuh"
#include "../mma_sync/mma.cuh"
#include "core/sink.h"
#include "kvcache.h"

extern "C" {
#include "core/fp8.h"
}

#include <cooperative_groups.h>
#include <math.h>

#define FA_KV_LOGIT_SAT 0x1p126 /* |logit| saturates here (the contract) */
#define FA_KV_LOGIT_MAX 0x1p16f /* fp32 exp2(S − m) loses no more than 2^-8 of a weight up to here (log2 units) */

/* Wait for the first kernel (programmatic dependent launch): a no-op when the grid does not follow it. */
__device__ __forceinline__ void fa_kv_wait_first(const fa_kv_params &p) {
    if (p.after_first) asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

/* *cnt += 1 with release and acquire semantics at GPU scope; the value before. */
__device__ __forceinline__ int fa_kv_count_acq_rel(int *cnt) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(cnt) : "memory");
    return old;
}

/* Does a row's fp32 state stand? (Rows that see keys:) its max m finite with |m| ≤ LOGIT_MAX (log2 units),
 * 0 < ℓ < ∞ and O finite — the CPU's rule. Otherwise a NaN/inf input, q·k or scale beyond fp32, or a 0·inf of a
 * masked key reached it, and the row is recomputed in float64. */
__device__ __forceinline__ bool fa_kv_stands(float m, float l, const float *o8) {
    float z = 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) z += o8[e] * 0.f; /* NaN iff some o is NaN or inf */
    return fabsf(m) <= FA_KV_LOGIT_MAX && l > 0.f && l < INFINITY && z == 0.f;
}

/* An element of a cache of type C: T, or an E4M3 byte (exact in fp32; its descale applied by the caller). */
template <typename C> __device__ __forceinline__ float fa_kv_ld(const C *x) {
    if constexpr (sizeof(C) == 1) return fa_e4m3_to_f32(*x);
    else return fa_ld(x);
}
/* Its real value in float64: an E4M3 element times its descale ds (as the CPU's exact row), a T element as it is. */
template <typename C> __device__ __forceinline__ double fa_kv_ld_ds(const C *x, double ds) {
    if constexpr (sizeof(C) == 1) return (double)fa_e4m3_to_f32(*x) * ds;
    else return (double)fa_ld(x);
}

/* Query row i of head hq over keys [lo, hi) from the definition, in float64, by one warp (lane: columns
 * lane + 32 j): o and the natural-log LSE. NaN/inf in q or a visible key makes the row NaN; logits saturate at
 * ±2^126. The same rules as the CPU's exact_row. q, k rows D wide, v and o rows DV; C the cache's type (E4M3:
 * the real values, times the sequence's descales). */
template <int D, typename T, int DV = D, typename C = T>
__device__ void fa_kv_exact_row(const typename fa_kv_params_of<C>::type &p, int b, int row, int hk, int i, int hq,
                                 int lo, int hi, double (&o)[(DV + 31) / 32], double *lse) {
    /* columns lane + 32 j below D (DV); d = 80: the last j's lanes 16-31 hold none (0 in q and o) */
    constexpr int JQ = (D + 31) / 32, JO = (DV + 31) / 32;
    const int lane = threadIdx.x & 31;
    double q[JQ];
    bool bad = false;
#pragma unroll
    for (int j = 0; j < JQ; j++) {
        const int c = lane + 32 * j;
        q[j] = D % 32 && c >= D ? 0.0
               : p.qrot         ? (double)p.qrot[(((int64_t)b * p.sq + i) * p.hq + hq) * D + c]
                                : (double)fa_ld((const T *)p.q + b * p.q_sb + i * p.q_ss + hq * p.q_sh + c);
        bad |= !isfinite(q[j]);
        if (DV == D) o[j < JO ? j : 0] = 0.0; /* (in this loop: the single-head-dim kernels' code as it was) */
    }
    if (DV != D)
#pragma unroll
        for (int j = 0; j < JO; j++) o[j] = 0.0;
    const C *kc = (const C *)p.kc, *vc = (const C *)p.vc;
    for (int t = lo; t < hi && !__any_sync(0xffffffffu, bad); t++) {
        const C *k = kc + fa_kv_key(p, row, t, hk, p.k_sb, p.k_ss, p.k_sh);
#pragma unroll
        for (int j = 0; j < JQ; j++)
            if (!(D % 32) || lane + 32 * j < D) bad |= !isfinite(fa_kv_ld(k + lane + 32 * j));
    }
    if (__any_sync(0xffffffffu, bad)) {
#pragma unroll
        for (int j = 0; j < JO; j++) o[j] = NAN;
        *lse = NAN;
        return;
    }
    double m = -INFINITY, l = 0.0, kds = 1.0, vds = 1.0;
    if constexpr (sizeof(C) == 1) {
        if (p.ds.k) kds = (double)p.ds.k[(int64_t)b * p.hk + hk];
        if (p.ds.v) vds = (double)p.ds.v[(int64_t)b * p.hk + hk];
    }
    for (int t = lo; t < hi; t++) {
        const C *k = kc + fa_kv_key(p, row, t, hk, p.k_sb, p.k_ss, p.k_sh);
        const C *v = vc + fa_kv_key(p, row, t, hk, p.v_sb, p.v_ss, p.v_sh);
        double s = 0.0;
#pragma unroll
        for (int j = 0; j < JQ; j++)
            if (!(D % 32) || lane + 32 * j < D) s += q[j] * fa_kv_ld_ds(k + lane + 32 * j, kds);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= (double)p.scale;
        if (p.softcap > 0.f) s = (double)p.softcap * tanh(s / (double)p.softcap);
        s = s > FA_KV_LOGIT_SAT ? FA_KV_LOGIT_SAT : s < -FA_KV_LOGIT_SAT ? -FA_KV_LOGIT_SAT : s;
        if (s > m) {
            const double f = exp(m - s);
            l *= f;
#pragma unroll
            for (int j = 0; j < JO; j++) o[j] *= f;
            m = s;
        }
        const double pj = exp(s - m);
        l += pj;
#pragma unroll
        for (int j = 0; j < JO; j++)
            if (!(DV % 32) || lane + 32 * j < DV) o[j] += pj * fa_kv_ld_ds(v + lane + 32 * j, vds);
    }
    if (hi <= lo) {
        *lse = -INFINITY;
        return;
    }
#pragma unroll
    for (int j = 0; j < JO; j++) o[j] /= l;
    *lse = m + log(l);
}

/* A merged state of max LSE M and sum Σ e^(lse − M): the scale of its weighted sum (NaN if any state is NaN, 0 if
 * every state is empty) and its LSE (natural log). */
__device__ __forceinline__ float fa_kv_merged_inv(bool nan, float M, float sum) {
    return nan ? NAN : M == -INFINITY ? 0.f : 1.f / sum;
}
__device__ __forceinline__ float fa_kv_merged_lse(bool nan, float M, float sum) {
    return nan ? NAN : M == -INFINITY ? -INFINITY : M + logf(sum);
}

/* Column c4 (4 values) of query row r of the tile written to out, and its LSE by the thread of column 0: the
 * merged state of the row's splits (every merge ends here), so the sink joins here, once per row. */
template <int D, typename T>
__device__ __forceinline__ void fa_kv_put_column(const fa_kv_params &p, int b, int hk, int r0, int r, int c4,
                                                  float4 v, float lse) {
    const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
    if (p.sinks) {
        const float f = fa_sink_join_lse(lse, p.sinks[hq], &lse);
        v.x *= f, v.y *= f, v.z *= f, v.w *= f;
    }
    uint2 u;
    u.x = fa_pack2<T>(v.x, v.y), u.y = fa_pack2<T>(v.z, v.w);
    *(uint2 *)((T *)p.o + b * p.o_sb + i * p.o_ss + hq * p.o_sh + c4 * 4) = u;
    if (p.lse && c4 == 0) p.lse[((int64_t)b * p.hq + hq) * p.sq + i] = lse;
}

/* The last CTA of a row tile merges more than FA_KV_CLUSTER_MAX splits' partials by their LSEs (fewer:
 * fa_kv_merge_regs): w_s = e^(lse_s − M) / Σ e^(lse − M). A row whose splits are all empty gives 0 / −inf; a NaN
 * LSE makes the row NaN. The partials (L2-resident: other SMs wrote them) come into shared memory by cp.async, as
 * many splits at once as it holds, so the merge costs about one L2 round trip per chunk instead of one per split;
 * the first 128 weights stay in shared memory. With fewer than 128 float4 columns in the tile, groups of threads
 * take every sg-th split and add up at the end. */
template <int D, typename T, int NT>
__device__ void fa_kv_merge_tile(const fa_kv_params &p, unsigned char *smem, int smem_bytes, int b, int hk, int r0,
                                  int R, int ns) {
    constexpr int C4 = D / 4, UPT = (16 * C4 + NT - 1) / NT, WCH = FA_KV_MAX_SPLITS;
    __shared__ float s_M[16], s_inv[16], s_lse[16];
    __shared__ int64_t s_pr[16]; /* row r's first partial */
    float *w_s = (float *)smem;                                  /* [16][WCH]: weights of splits < WCH */
    float4 *part = (float4 *)(smem + 16 * WCH * sizeof(float));  /* [sg][units] when sg > 1 */
    float4 *stage = part + NT;                                   /* [R][nc][C4] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < R; r += NT / 32) {
        const int gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
        const int64_t rr = ((int64_t)b * p.hq + hq) * p.sq + i;
        const float *pl = p.part_lse + rr * p.nsplit;
        float *wr = w_s + r * WCH;
        float M = -INFINITY, sum = 0.f;
        bool nan = false;
        for (int s = lane; s < ns; s += 32) {
            const float x = __ldcg(pl + s);
            if (s < WCH) wr[s] = x;
            nan |= isnan(x), M = fmaxf(M, x);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
        nan = __any_sync(0xffffffffu, nan);
        if (M != -INFINITY)
            for (int s = lane; s < ns; s += 32) {
                const float x = s < WCH ? wr[s] : __ldcg(pl + s);
                sum += x == -INFINITY ? 0.f : expf(x - M);
            }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        const float inv = fa_kv_merged_inv(nan, M, sum);
        for (int s = lane; s < ns && s < WCH; s += 32) {
            wr[s] = fa_kv_weight(wr[s], M, inv);
        }
        if (lane == 0) {
            s_M[r] = M, s_inv[r] = inv, s_lse[r] = fa_kv_merged_lse(nan, M, sum), s_pr[r] = rr * p.nsplit;
        }
    }
    const int units = R * C4, sg = units >= NT ? 1 : NT / units;
    const int gi = threadIdx.x / units; /* this thread's split group (sg > 1: one unit per thread) */
    const int room = (smem_bytes - (int)(16 * WCH * sizeof(float)) - NT * 16) / (R * D * 4);
    const int step = room < 1 ? 1 : room;
    float4 acc[UPT];
#pragma unroll
    for (int k = 0; k < UPT; k++) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int c0 = 0; c0 < ns; c0 += step) {
        const int nc = min(step, ns - c0);
        __syncthreads(); /* the weights written; the previous chunk read */
        for (int e = threadIdx.x; e < R * nc * C4; e += NT) {
            const int r = e / (nc * C4), j = e / C4 % nc, c4 = e % C4;
            fa_cp_async16(stage + e, p.part_o + (s_pr[r] + c0 + j) * D + c4 * 4, 16);
        }
        fa_cp_async_commit();
        fa_cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int k = 0; k < UPT; k++) {
            const int u = sg > 1 ? threadIdx.x % units : threadIdx.x + k * NT;
            if (u >= units || gi >= sg || (sg > 1 && k > 0)) continue;
            const int r = u / C4, c4 = u % C4;
            float4 a = acc[k];
            for (int j = gi; j < nc; j += sg) {
                const int sj = c0 + j;
                const float w = sj < WCH ? w_s[r * WCH + sj]
                                         : fa_kv_weight(__ldcg(p.part_lse + s_pr[r] + sj), s_M[r], s_inv[r]);
                const float4 x = stage[(r * nc + j) * C4 + c4];
                if (w != 0.f || isnan(w)) /* a split of weight 0 adds nothing (its partial may be 0 / −inf) */
                    a.x += w * x.x, a.y += w * x.y, a.z += w * x.z, a.w += w * x.w;
            }
            acc[k] = a;
        }
    }
    if (sg > 1) {
        if (gi < sg) part[gi * units + threadIdx.x % units] = acc[0];
        __syncthreads();
        if (threadIdx.x >= units) return;
        for (int g2 = 1; g2 < sg; g2++) {
            const float4 x = part[g2 * units + threadIdx.x];
            acc[0].x += x.x, acc[0].y += x.y, acc[0].z += x.z, acc[0].w += x.w;
        }
    }
#pragma unroll
    for (int k = 0; k < UPT; k++) {
        const int u = threadIdx.x + k * NT;
        if (u >= units || (sg > 1 && k > 0)) continue;
        fa_kv_put_column<D, T>(p, b, hk, r0, u / C4, u % C4, acc[k], s_lse[u / C4]);
    }
}

/* The merge of up to FA_KV_CLUSTER_MAX states of one float4 column (LSE x[j], normalised O ov[j], j < n): the
 * merged column scaled for out, and the merged LSE. NaN in any LSE makes the row NaN; a state of LSE −inf, or of
 * weight 0, adds nothing (its O may be 0 or inf). The one rule of the cluster and the register merges. */
__device__ __forceinline__ float4 fa_kv_merge_column(const float (&x)[FA_KV_CLUSTER_MAX],
                                                      const float4 (&ov)[FA_KV_CLUSTER_MAX], int n, float *lse) {
    float M = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int j = 0; j < FA_KV_CLUSTER_MAX; j++)
        if (j < n) nan |= isnan(x[j]), M = fmaxf(M, x[j]);
    float sum = 0.f;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int j = 0; j < FA_KV_CLUSTER_MAX; j++) {
        if (j >= n || M == -INFINITY || x[j] == -INFINITY) continue;
        const float e = expf(x[j] - M);
        if (e == 0.f) continue;
        sum += e, a.x += e * ov[j].x, a.y += e * ov[j].y, a.z += e * ov[j].z, a.w += e * ov[j].w;
    }
    const float inv = fa_kv_merged_inv(nan, M, sum);
    *lse = fa_kv_merged_lse(nan, M, sum);
    return make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
}

/* The last CTA's merge of at most FA_KV_CLUSTER_MAX splits through registers: each thread loads every split's LSE
 * and float4 of its columns at once (one L2 round trip; the partials lie in the L2, written by other SMs) and
 * weighs them itself — no shared memory, no barrier, a short chain of instructions: at batch 1 the merge is the
 * call's tail, run by one CTA per row tile while the other SMs idle. */
template <int D, typename T, int NT>
__device__ void fa_kv_merge_regs(const fa_kv_params &p, int b, int hk, int r0, int R, int ns) {
    constexpr int C4 = D / 4;
#pragma unroll 1
    for (int u = threadIdx.x; u < R * C4; u += NT) {
        const int r = u / C4, c4 = u % C4, gr = r0 + r, i = gr / p.group, hq = hk * p.group + gr % p.group;
        const int64_t pr = (((int64_t)b * p.hq + hq) * p.sq + i) * p.nsplit;
        float x[FA_KV_CLUSTER_MAX];
        float4 ov[FA_KV_CLUSTER_MAX];
        /* every load unconditional (splits past ns read the last one again, never used), so that ptxas puts all
         * of them in flight before the first is used (conditional, they went out in three waves, each waiting for
         * the one before). The cluster merge keeps its loads conditional: there 16 loads read slower for clusters
         * of 2-8 CTAs. */
#pragma unroll
        for (int j = 0; j < FA_KV_CLUSTER_MAX; j++) {
            const int64_t sj = pr + min(j, ns - 1);
            x[j] = __ldcg(p.part_lse + sj);
            ov[j] = __ldcg((const float4 *)(p.part_o + sj * D) + c4);
        }
        float lse;
        const float4 v = fa_kv_merge_column(x, ov, ns, &lse);
        fa_kv_put_column<D, T>(p, b, hk, r0, r, c4, v, lse);
    }
}

/* The merge of a cluster's splits (one cluster per row tile, CTA rank = split): every CTA's normalised O [16][D]
 * and LSE [16] (natural log) lie in its shared memory; after a cluster barrier each CTA merges a share of the tile's
 * float4 columns, reading the others' states through distributed shared memory, and a second barrier keeps those
 * states alive until every CTA has read them. */
template <int D, typename T, int NT>
__device__ void fa_kv_cluster_merge(const fa_kv_params &p, const float *o_s, const float *lse_s, int b, int hk,
                                     int r0, int R) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    constexpr int C4 = D / 4;
    const int nb = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    cl.sync(); /* every split's state written */
    for (int u = threadIdx.x * nb + rank; u < R * C4; u += NT * nb) {
        const int r = u / C4, c4 = u % C4;
        /* every split's LSE and columns asked for at once: one round trip through the cluster, not one per split */
        float x[FA_KV_CLUSTER_MAX];
        float4 ov[FA_KV_CLUSTER_MAX];
#pragma unroll
        for (int j = 0; j < FA_KV_CLUSTER_MAX; j++)
            if (j < nb) {
                x[j] = cl.map_shared_rank(lse_s, j)[r];
                ov[j] = *(const float4 *)(cl.map_shared_rank(o_s, j) + r * D + c4 * 4);
            }
        float lse;
        const float4 v = fa_kv_merge_column(x, ov, nb, &lse);
        fa_kv_put_column<D, T>(p, b, hk, r0, r, c4, v, lse);
    }
    cl.sync(); /* the states stay until every CTA has read them */
}

#endif
