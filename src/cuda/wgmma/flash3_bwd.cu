/* FLASH3 backward: the host side and its two small kernels. A call is two or three launches:
 *   fa3b_prep  D = rowsum(dO ∘ O) and LSE·log2e per query row, padded to whole query blocks (D = 0, +inf past sq,
 *              so that the main kernel reads whole aligned pairs and padded rows give P = 0), the fp32 dQ
 *              accumulator and its counters cleared (with opts.d_sinks, d sinks from D after it: sinks.h);
 *   fa3_bwd_kernel (flash3_bwd.cuh; fa3_bwd_wide_kernel, flash3_bwd_wide.cuh, at d = 256), one CTA per key block
 *              and K/V head; at d = 64, 128 it also converts dQ (fused, flash3_bwd_dq.cuh: the plan's
 *              FA3_BWD_AUX_FUSED), saving a pass that reads the accumulator back from memory;
 *   fa3b_dq    otherwise: dQ = scale·accumulator, from the accumulator's register order to the caller's layout.
 * Varlen (cu_seqlens): each launch over every sequence at the bounds max_seqlen_q/k, each block reading its
 * sequence from the device arrays; TMA boxes end at the sequence's last row (ragged maps, tensor_map.h).
 * The plan's row (wgmma/family.cu) has checked everything the launch relies on. */
#include <cudaTypedefs.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda/params.h"
#include "cuda/attr_once.h"
#include "cuda/sinks.h"
#include "flash3_bwd.cuh"
#include "flash3_bwd_wide.cuh"
#include "tensor_map.h"
#include "tiles.h"

template <bool F16> FA_DEV float fa3b_f32(uint16_t x) {
    if constexpr (F16) return __half2float(__ushort_as_half(x));
    else return __bfloat162float(__ushort_as_bfloat16(x));
}

/* Varlen: sequence b's first row in the packed tensors and its length (bounded by the grid's sq; with seqused_q its
 * used rows), clamped as the kernels read cu_seqlens (fa3b_seq_of). */
FA_DEV int fa3b_seq_rows(const fa_cuda_params &p, int b, int *q0) {
    return fa_packed_seq(p.cu_q, p.used_q, b, p.total_q, p.sq, q0);
}

/* One query row (padded layout: [batch][hq][nmb·Br], also under varlen, with the grid's bounds) per TPR = DV/8
 * threads, 8 elements (16 bytes) of O and dO each, D/TPR floats of dQ's accumulator cleared each; the counters of
 * dQ's adds (p.dq_turns, one per query block) cleared. Fused (the main kernel converts dQ): a row that sees no key
 * has no key block to convert it, so its dQ is written 0 here. Varlen: row i of sequence b is packed row q0 + i;
 * LSE is [hq][total_q]. */
template <int D, int Br, bool F16, bool VARLEN, int DV = D>
__global__ void fa3b_prep(const fa_cuda_params p, int nmb, int64_t rows, int fused) {
    constexpr int TPR = DV / 8, CF = D / TPR;
    static_assert((TPR & (TPR - 1)) == 0 && CF % 4 == 0, "the row's threads a power of two, whole float4s");
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / TPR) + threadIdx.x / TPR;
    const int c = (threadIdx.x % TPR) * 8;
    const int64_t per = (int64_t)nmb * Br;
    const int i = (int)(r % per);
    const int64_t bh = r / per;
    const int h = (int)(bh % p.hq), b = (int)(bh / p.hq);
    int q0 = 0, sq = p.total_q;
    if (VARLEN && r < rows) sq = fa3b_seq_rows(p, b, &q0);
    const int ib = VARLEN ? q0 + i : i, bb = VARLEN ? 0 : b; /* the row and batch in the tensors */
    float acc = 0.f;
    if (r < rows && p.dq_turns && i % Br == 0 && c == 0) p.dq_turns[r / Br] = 0;
    if (r < rows && fused && i < sq) {
        int k0, sk = p.sk, lo, hi;
        if (VARLEN) sk = fa_packed_seq(p.cu_k, p.used_k, b, p.total_k, p.sk, &k0);
        fa_visible_keys32(i, sq, sk, p.wl, p.wr, &lo, &hi);
        if (hi <= lo) {
            uint32_t *dq = (uint32_t *)((uint16_t *)p.dq + bb * p.dq_sb + ib * p.dq_ss + h * p.dq_sh + (c / 8) * CF);
#pragma unroll
            for (int k = 0; k < CF / 2; ++k) dq[k] = 0u;
        }
    }
    if (r < rows) {
        if (i < sq) {
            const uint4 o = *(const uint4 *)((const uint16_t *)p.o + bb * p.o_sb + ib * p.o_ss + h * p.o_sh + c);
            const uint4 g = *(const uint4 *)((const uint16_t *)p.dout + bb * p.do_sb + ib * p.do_ss + h * p.do_sh + c);
            const uint16_t *oe = (const uint16_t *)&o, *ge = (const uint16_t *)&g;
#pragma unroll
            for (int k = 0; k < 8; ++k) acc += fa3b_f32<F16>(oe[k]) * fa3b_f32<F16>(ge[k]);
        }
        float4 *q = (float4 *)(p.dq_acc + r * D + (c / 8) * CF);
#pragma unroll
        for (int k = 0; k < CF / 4; ++k) q[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (r < rows && c == 0) {
        const float lse = i >= sq ? -INFINITY : VARLEN ? p.lse[(int64_t)h * p.total_q + ib] : p.lse[bh * p.total_q + i];
        p.dsum[r] = acc;
        p.lse2[r] = lse == -INFINITY ? INFINITY : lse * 1.44269504088896340736f;
    }
}

/* dQ = scale·accumulator: one float4 per thread = registers 4j..4j+3 of one consumer thread, i.e. two columns of
 * two rows 8 apart (flash3_bwd.cuh's order; the pair: warpgroup 0's T::NQ·128 floats of columns 0.. DQ0 − 1, then
 * warpgroup 1's from column DQ0). Varlen: rows of sequence b only, at its packed rows. */
template <int D, int Br, bool F16, bool VARLEN, int DV = D>
__global__ void fa3b_dq(const fa_cuda_params p, int nmb, int64_t n4) {
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= n4) return;
    const int64_t chunk = x / (Br * D / 4);
    const int m = (int)(chunk % nmb), h = (int)((chunk / nmb) % p.hq), b = (int)(chunk / nmb / p.hq);
    int row, col;
    fa3b_dq_place<D, DV>((int)(x % (Br * D / 4)), row, col); /* flash3_bwd_dq.cuh */
    row += m * Br;
    int q0 = 0, sq = p.total_q;
    if (VARLEN) sq = fa3b_seq_rows(p, b, &q0);
    const float4 a = *(const float4 *)(p.dq_acc + 4 * x);
    uint16_t *dq = (uint16_t *)p.dq + (VARLEN ? q0 * p.dq_ss : b * p.dq_sb) + h * p.dq_sh + col;
    if (row < sq) *(uint32_t *)(dq + row * p.dq_ss) = fa3_pack<F16>(a.x * p.scale, a.y * p.scale);
    if (row + 8 < sq) *(uint32_t *)(dq + (row + 8) * p.dq_ss) = fa3_pack<F16>(a.z * p.scale, a.w * p.scale);
}

/* The tile's kernel: the d = 256 split (and the pair's), or one CTA's 128 keys split between the warpgroups. */
template <int D, bool F16, bool DET, bool VARLEN, int DV = D> static auto fa3b_kernel() {
    if constexpr (fa3b_tile<D, DV>::WIDE) return fa3_bwd_wide_kernel<D, F16, DET, VARLEN, DV>;
    else return fa3_bwd_kernel<D, F16, DET, VARLEN>;
}

/* The four maps: [batch, rows, heads, D]; varlen: ragged maps of the packed rows (tensor_map.h), so that a box
 * stops at its sequence's end. */
static int fa3b_map(CUtensorMap *m, bool varlen, const fa_cuda_params *p, const void *base, int rows, int heads,
                    int64_t ss, int64_t sh, int64_t sb, int box, int D) {
    return varlen ? fa3_map_ragged(m, base, p->dtype, D, rows, heads, ss, sh, box)
                  : fa3_map(m, base, p->dtype, D, rows, heads, p->batch, ss, sh, sb, box);
}

/* The converters' 32-bit offsets (flash3_bwd_dq.cuh) hold: the accumulator's floats and the farthest dQ element
 * their arithmetic reaches (a block's rows padded, 8 below) are below 2^31. */
static bool fa3b_fits32(const fa_cuda_params *p, int64_t rows, int nmb, int Br, int D, bool varlen) {
    const int64_t r = (varlen ? (int64_t)p->total_q : 0) + (int64_t)nmb * Br + 8;
    const int64_t span = (varlen ? 0 : (int64_t)(p->batch - 1) * llabs(p->dq_sb)) + r * llabs(p->dq_ss) +
                         (int64_t)(p->hq - 1) * llabs(p->dq_sh) + D;
    return rows * D < INT32_MAX && span < INT32_MAX;
}

/* Varlen: a grid over every sequence at the bounds (max_seqlen_q/k), each CTA reading its sequence from the device
 * cu_seqlens (fa3b_seq_of); the padded rows of D, LSE·log2e and dQ's accumulator per (sequence, head) at those
 * bounds, as for fixed lengths. */
template <int D, bool F16, bool DET, bool VARLEN, int DV = D>
static cudaError_t fa3b_run(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    using T = fa3b_tile<D, DV>;
    constexpr int Br = T::Br, Bc = T::Bc;
    if (p->batch == 0 || p->hq == 0) return cudaSuccess;
    const int nmb = (p->sq + Br - 1) / Br;
    const int64_t rows = (int64_t)p->batch * p->hq * nmb * Br;
    /* the main kernel converts dQ (flash3_bwd_dq.cuh) */
    const int fused = T::FUSE && plan->aux[FA3_BWD_AUX_FUSED] && fa3b_fits32(p, rows, nmb, Br, D, VARLEN);
    cudaError_t e = cudaSuccess;
    if (rows > 0) {
        const int per_block = 256 / (DV / 8);
        fa3b_prep<D, Br, F16, VARLEN, DV><<<(unsigned)((rows + per_block - 1) / per_block), 256, 0, st>>>(
            *p, nmb, rows, fused);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        /* d sinks from the padded D (sinks.h); varlen: with the padded LSE·log2 e beside it (the caller's LSE is
         * packed: [hq][total_q]) */
        const int64_t pad = (int64_t)nmb * Br;
        e = VARLEN ? fa_cuda_sinks_grad(p, p->lse2, 0.69314718055994530942, p->batch, (int)pad, pad, pad, st)
                   : fa_cuda_sinks_grad(p, p->lse, 1.0, p->batch, p->total_q, pad, p->total_q, st);
        if (e != cudaSuccess) return e;
    }
    if (p->sk > 0 && p->total_k > 0) {
        CUtensorMap tq, tk, tv, tdo;
        if (fa3b_map(&tq, VARLEN, p, p->q, p->total_q, p->hq, p->q_ss, p->q_sh, p->q_sb, Br, D) ||
            fa3b_map(&tdo, VARLEN, p, p->dout, p->total_q, p->hq, p->do_ss, p->do_sh, p->do_sb, Br, DV) ||
            fa3b_map(&tk, VARLEN, p, p->k, p->total_k, p->hk, p->k_ss, p->k_sh, p->k_sb, Bc, D) ||
            fa3b_map(&tv, VARLEN, p, p->v, p->total_k, p->hk, p->v_ss, p->v_sh, p->v_sb, Bc, DV))
            return cudaErrorInvalidValue;
        fa3b_kparams kp;
        kp.dk = (uint16_t *)p->dk, kp.dv = (uint16_t *)p->dv;
        kp.dk_sb = p->dk_sb, kp.dk_ss = p->dk_ss, kp.dk_sh = p->dk_sh;
        kp.dv_sb = p->dv_sb, kp.dv_ss = p->dv_ss, kp.dv_sh = p->dv_sh;
        kp.lse2 = p->lse2, kp.dsum = p->dsum, kp.dq_acc = p->dq_acc, kp.turns = p->dq_turns;
        kp.dq = (uint16_t *)p->dq, kp.dq_sb = p->dq_sb, kp.dq_ss = p->dq_ss, kp.dq_sh = p->dq_sh, kp.fuse_dq = fused;
        kp.sq = p->sq, kp.sk = p->sk, kp.hq = p->hq, kp.group = p->hq / p->hk;
        kp.cu_q = VARLEN ? p->cu_q : NULL, kp.cu_k = VARLEN ? p->cu_k : NULL;
        kp.used_q = VARLEN ? p->used_q : NULL, kp.used_k = VARLEN ? p->used_k : NULL;
        kp.total_q = p->total_q, kp.total_k = p->total_k, kp.qrow = kp.krow = 0;
        kp.wl = p->wl, kp.wr = p->wr, kp.nmb = nmb;
        kp.scale = p->scale, kp.scale_log2 = p->scale_log2;
        kp.cap = p->softcap, kp.cap_scale = p->softcap > 0.f ? p->softcap_scale : 0.f;
        const size_t smem = plan->smem_bytes;
        auto kernel = fa3b_kernel<D, F16, DET, VARLEN, DV>();
        static unsigned char ready[64];
        if ((e = fa_cuda_attr_once(ready, (const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem)) != cudaSuccess)
            return e;
        const dim3 grid((unsigned)((p->sk + Bc - 1) / Bc), (unsigned)p->hk, (unsigned)p->batch);
        kernel<<<grid, T::THREADS, smem, st>>>(tq, tk, tv, tdo, kp);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (rows > 0 && !fused) {
        const int64_t n4 = rows * D / 4;
        fa3b_dq<D, Br, F16, VARLEN, DV><<<(unsigned)((n4 + 255) / 256), 256, 0, st>>>(*p, nmb, n4);
        e = cudaGetLastError();
    }
    return e;
}

template <int D, bool F16, bool DET, int DV = D>
static cudaError_t fa3b_launch(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    return p->cu_q ? fa3b_run<D, F16, DET, true, DV>(p, plan, st) : fa3b_run<D, F16, DET, false, DV>(p, plan, st);
}

/* The tile row's instances: f16 and bf16, default and deterministic. */
template <int R> static int fa3_bwd_inst(int det, fa_cuda_instance *k) {
    constexpr fa3_bwd_row r = fa3_bwd_rows[R];
    using T = fa3b_tile<r.d, r.dv>;
    static_assert(T::Br == r.bm && T::Bc == r.bn && T::THREADS == r.threads, "the row is its instance's tile");
    if (det) k->f16 = fa3b_launch<r.d, true, true, r.dv>, k->bf16 = fa3b_launch<r.d, false, true, r.dv>;
    else k->f16 = fa3b_launch<r.d, true, false, r.dv>, k->bf16 = fa3b_launch<r.d, false, false, r.dv>;
    k->smem = (T::WIDE ? sizeof(fa3b_wide_shared<r.d, r.dv>) : sizeof(fa3b_shared<r.d>)) + 1024;
    static_assert(T::WIDE || sizeof(fa3b_shared<r.d>) + 1024 <= 232448, "the tiles fit the 227 KB of an SM");
    return 1;
}
static_assert(sizeof fa3_bwd_rows / sizeof fa3_bwd_rows[0] == 4, "one case per row of fa3_bwd_rows");
extern "C" int fa_flash3_bwd_instance(int row, int deterministic, fa_cuda_instance *k) {
    switch (row) {
    case 0: return fa3_bwd_inst<0>(deterministic, k);
    case 1: return fa3_bwd_inst<1>(deterministic, k);
    case 2: return fa3_bwd_inst<2>(deterministic, k);
    case 3: return fa3_bwd_inst<3>(deterministic, k);
    default: return 0;
    }
}

extern "C" cudaError_t fa_flash3_bwd_launch(const fa_cuda_params *p, const fa_plan *plan, cudaStream_t st) {
    fa_cuda_instance k;
    if (!fa_flash3_bwd_instance(plan->entry, plan->aux[FA3_BWD_AUX_DET], &k)) return cudaErrorInvalidValue;
    return (p->dtype == FA_DTYPE_F16 ? k.f16 : k.bf16)(p, plan, st);
}
