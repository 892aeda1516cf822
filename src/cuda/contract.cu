/* The numerics contract on CUDA (docs/numerics.md), the same for STANDARD, FLASH1 and FLASH2 (and any kernel that
 * joins them): the fp32 kernels are exact for ordinary inputs but not at the edges (inf − inf in a running max,
 * 0·inf in a masked tile, exp(S − LSE) with an exponent error of ulp(|S|), 16-bit dS beyond the f16 range).
 * Instead of checks in the inner loops:
 *   1. forward: a check of the outputs after the algorithm — almost every failure mode of the forward kernels shows
 *      there: a non-finite O element (NaN/inf inputs, 0·inf in a masked tile, overflow), an LSE that is NaN or +inf,
 *      −inf for a row that sees keys (a NaN hidden as a fully masked row), or beyond ±2^23 (logits where exp2's
 *      exponent error grows), so one read of O and LSE certifies an item; the exception is an inf in k that only
 *      ever meets q of the other sign (−inf logits: weights of 0), so k is scanned too (q, v are not read);
 *      backward: a scan before the algorithm, per item the maxima of |q|, |k|, |v|, |o|, |dO| on the bit patterns,
 *      one read of each input, since wrong gradients need not be non-finite; a decide kernel lists the items
 *      that are not certified;
 *   2. fix-up (after the algorithm): one warp per query row (forward, backward dQ) or key row (backward dK, dV)
 *      of each listed item recomputes it in float64 from the definition with the contract's rules: logits
 *      saturate at ±2^126, a row whose q or any visible key is not finite is NaN, a fully masked row is O = 0,
 *      LSE = −∞. With nothing listed the fix-up kernels read one counter and exit; a forward of at most
 *      FA_FIX_DECIDE_MAX items has no decide kernel: each fix-up CTA reads the items' flags and lists them itself. */
#include "contract.h"
#include "mma_sync/common.cuh"
#include "core/sink.h"

#include <cuda_fp8.h>
#include <string.h>
#include <type_traits>

#define FA_LOGIT_SAT 0x1p126   /* |logit| saturates here: LSE = max + log ℓ stays finite in fp32 */
#define FAST_LOGIT_MAX 0x1p24  /* the kernels' exp2(S·c − LSE·c) keeps an exponent error below 2 up to here */
#define FAST_SUM_MAX 0x1p100   /* fp32 sums of fewer than 2^28 terms bounded by this cannot overflow */
#define FAST_DS_F16_MAX 0x1p15 /* dS = P ∘ (dP − D) goes through 16 bits: within the f16 range */
#define FA_SCAN_ROWS 64        /* rows of one tensor a scan CTA reduces */
#define FA_SCAN_ILP 4          /* 16-byte loads in flight per scan thread */
#define FA_NSLOT 5             /* maxima per item: q, k, v, o, dO */
#define FA_FIX_WARPS 4
#define FA_FIX_DECIDE_MAX 512 /* a forward's items the fix-up kernel lists itself, without the decide kernel */
#define FA_DMAX (FA_MAX_HEAD_DIM / 32) /* elements of a row per lane */

enum { SLOT_Q, SLOT_K, SLOT_V, SLOT_O, SLOT_DO };
static_assert(FA_NSLOT == FA_CONTRACT_STRIDE, "a self-checking kernel steps over the items' slots");

unsigned *fa_contract_o_flags(const fa_contract_ws *w) { return w->scan + 1 + SLOT_O; }

static int64_t fa_items(const fa_problem *p) { return p->batch * (p->is_backward ? p->hk : p->hq); }
static size_t fa_rows(const fa_problem *p) { return (size_t)p->hq * p->q.seqlen * (p->cu_q ? 1 : p->batch); }

void fa_contract_layout(fa_arena *a, const fa_problem *p, fa_contract_ws *w) {
    const size_t items = (size_t)fa_items(p);
    memset(w, 0, sizeof *w);
    w->scan = (unsigned *)fa_arena_take(a, (1 + items * FA_NSLOT) * sizeof(unsigned), 256);
    w->todo = (unsigned *)fa_arena_take(a, items * sizeof(unsigned), 16);
    if (!p->is_backward && !p->lse) /* the forward's check reads the LSE: the kernels write it here */
        w->lse = (float *)fa_arena_take(a, fa_rows(p) * sizeof(float), 256);
    if (p->is_backward) {
        w->row_lse = (double *)fa_arena_take(a, fa_rows(p) * sizeof(double), 256);
        w->row_dsum = (double *)fa_arena_take(a, fa_rows(p) * sizeof(double), 256);
    }
}

void fa_contract_traffic(const fa_problem *p, int self_checked, fa_plan *plan) {
    const double e = (double)fa_dtype_size(p->dtype), d = (double)p->d, dv = (double)p->d_v, qrows = (double)fa_rows(p);
    const double kvrows = (double)p->k.seqlen * (p->cu_k ? 1 : p->batch) * p->hk;
    if (!p->is_backward) { /* K (and q with a softcap) scanned, O and LSE read once, unless the kernel checks itself;
                            * LSE written by the kernel when the caller gave none */
        if (!self_checked)
            plan->read_bytes += qrows * (dv * e + 4 + (p->softcap > 0.f ? d * e : 0)) + kvrows * d * e;
        plan->write_bytes += (double)(1 + fa_items(p) * FA_NSLOT) * sizeof(unsigned) + (p->lse ? 0 : qrows * 4);
        return;
    }
    plan->read_bytes += (qrows * (d + 2 * dv) + kvrows * (d + dv)) * e; /* q, o, dout; k, v */
    plan->write_bytes += (double)(1 + fa_items(p) * FA_NSLOT) * sizeof(unsigned);
}

/* ---- the scan ---- */

typedef struct fa_scan_tensor {
    const void *data;
    int64_t sb, ss, sh;
    int heads, is_k; /* is_k: rows from cu_k / sk, else cu_q / sq */
    int d;           /* the tensor's head_dim (q, k: dqk; v, o, dO: dv) */
    int n, div;      /* head h feeds items (h / div)·n .. + n − 1 (forward K/V: the group's query heads) */
    int slot, vec;   /* vec: 16-byte aligned rows (d·size a multiple of 16) */
} fa_scan_tensor;
typedef struct fa_scan_args {
    fa_scan_tensor t[FA_NSLOT];
    int nt, chunks, item_heads, dtype, sq, sk, total_q, total_k;
    const int *cu_q, *cu_k;
    const int *used_q, *used_k; /* seqused: scan the used rows only, as the kernels read them */
    unsigned *scan;
} fa_scan_args;

/* |x| as bits: f32 one element per word, f16/bf16 two (their abs bits order as their magnitudes, NaN/inf on top).
 * A 1-byte dtype (FP8 E4M3: no inf, NaN = 0x7f) needs its own case here, in fa_bits_value and in fa_certified. */
__device__ __forceinline__ unsigned fa_abs_bits(unsigned w, int dtype) {
    if (dtype == 0) return w & 0x7fffffffu;
    return max(w & 0x7fffu, (w >> 16) & 0x7fffu);
}

__global__ void __launch_bounds__(256) fa_contract_scan_kernel(const fa_scan_args a) {
    __shared__ unsigned red[8];
    const int ti = blockIdx.x / a.chunks, chunk = blockIdx.x % a.chunks, h = blockIdx.y, b = blockIdx.z;
    fa_scan_tensor t = a.t[0];
    for (int i = 1; i < FA_NSLOT; ++i) /* a constant index per copy: no local-memory copy of the array */
        if (i == ti) t = a.t[i];
    if (h >= t.heads) return;
    const int *cu = t.is_k ? a.cu_k : a.cu_q;
    int64_t row0 = 0;
    int rows = t.is_k ? a.sk : a.sq;
    if (cu) rows = fa_packed_seq(cu, t.is_k ? a.used_k : a.used_q, b, t.is_k ? a.total_k : a.total_q, rows, &row0);
    const int r0 = chunk * FA_SCAN_ROWS;
    if (r0 >= rows) return;
    const int nr = min(FA_SCAN_ROWS, rows - r0), es = a.dtype == 0 ? 4 : 2;
    const int64_t base = (cu ? row0 * t.ss : (int64_t)b * t.sb) + (int64_t)h * t.sh + (int64_t)r0 * t.ss;
    const char *g = (const char *)t.data;
    unsigned mx = 0;
    if (t.vec) { /* 16-byte chunks, FA_SCAN_ILP loads in flight per thread */
        const int cpr = t.d * es / 16, n = nr * cpr;
        for (int i0 = threadIdx.x; i0 < n; i0 += FA_SCAN_ILP * blockDim.x) {
            uint4 w[FA_SCAN_ILP];
#pragma unroll
            for (int u = 0; u < FA_SCAN_ILP; ++u) {
                const int idx = i0 + u * blockDim.x, r = idx / cpr, c = idx % cpr;
                w[u] = idx < n ? *(const uint4 *)(g + (base + (int64_t)r * t.ss) * es + c * 16) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < FA_SCAN_ILP; ++u) {
                mx = max(max(mx, fa_abs_bits(w[u].x, a.dtype)), fa_abs_bits(w[u].y, a.dtype));
                mx = max(max(mx, fa_abs_bits(w[u].z, a.dtype)), fa_abs_bits(w[u].w, a.dtype));
            }
        }
    } else {
        for (int idx = threadIdx.x; idx < nr * t.d; idx += blockDim.x) {
            const int r = idx / t.d, x = idx % t.d;
            const int64_t e = base + (int64_t)r * t.ss + x;
            const unsigned w = es == 4 ? ((const unsigned *)g)[e] : ((const unsigned short *)g)[e];
            mx = max(mx, fa_abs_bits(w, a.dtype));
        }
    }
    mx = __reduce_max_sync(0xffffffffu, mx);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) mx = max(mx, red[w]);
    for (int k = threadIdx.x; k < t.n; k += blockDim.x) {
        const int64_t item = (int64_t)b * a.item_heads + (int64_t)(h / t.div) * t.n + k;
        atomicMax(a.scan + 1 + item * FA_NSLOT + t.slot, mx);
    }
}

__device__ __forceinline__ double fa_bits_value(unsigned b, int dtype) {
    if (dtype == 0) return (double)__uint_as_float(b);
    if (dtype == 1) return (double)__half2float(__ushort_as_half((unsigned short)b));
    return (double)__uint_as_float(b << 16);
}

/* Are the fp32 kernels' results certified for this item? (its maxima; the longest sequences bound each item) */
__device__ bool fa_certified(const fa_cuda_params &c, const unsigned *m, int dtype, int backward) {
    if (c.softcap > 0.f && (c.softcap < 0x1p-60f || c.softcap > 0x1p24f)) return false;
    const unsigned inf = dtype == 0 ? 0x7f800000u : dtype == 1 ? 0x7c00u : 0x7f80u;
    if (!backward) /* the output check and the scans of k (and q) found nothing */
        return m[SLOT_O] == 0 && m[SLOT_K] < inf && m[SLOT_Q] < inf;
    for (int s = 0; s < FA_NSLOT; ++s)
        if (m[s] >= inf) return false;
    const double mq = fa_bits_value(m[SLOT_Q], dtype), mk = fa_bits_value(m[SLOT_K], dtype);
    const double mv = fa_bits_value(m[SLOT_V], dtype), d = (double)c.d, dot = d * mq * mk, scale = fabs((double)c.scale);
    if (dot > FAST_SUM_MAX || (double)c.sk * mv > FAST_SUM_MAX || scale * dot > FAST_LOGIT_MAX) return false;
    /* |dS| <= dv·max|dO|·(max|V| + max|O|); dQ, dK sum at most n terms of |scale·dS|·max|q, k|, dV n of |dO| */
    const double mo = fa_bits_value(m[SLOT_O], dtype), mdo = fa_bits_value(m[SLOT_DO], dtype);
    const double n = (double)max(c.sq, c.sk) * c.group, mqk = fmax(fmax(mq, mk), 1.0);
    const double ds = (double)c.d_v * mdo * (mv + mo);
    if (dtype == 1 && ds > FAST_DS_F16_MAX) return false;
    return scale * 2.0 * ds * n * mqk <= FAST_SUM_MAX && 2 * n * mdo <= FAST_SUM_MAX;
}

__global__ void fa_contract_decide_kernel(const fa_cuda_params c, unsigned *scan, unsigned *todo, int64_t items,
                                          int dtype, int backward) {
    const int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (it < items && !fa_certified(c, scan + 1 + it * FA_NSLOT, dtype, backward))
        todo[atomicAdd(scan, 1u)] = (unsigned)it;
}

static fa_scan_tensor fa_scan_of(const fa_tensor *t, int is_k, int n, int div, int slot) {
    fa_scan_tensor s;
    const int64_t es = (int64_t)fa_dtype_size(t->dtype);
    s.data = t->data, s.sb = t->stride_batch, s.ss = t->stride_seq, s.sh = t->stride_head;
    s.heads = (int)t->heads, s.is_k = is_k, s.n = n, s.div = div, s.slot = slot, s.d = (int)t->head_dim;
    s.vec = (uintptr_t)t->data % 16 == 0 && (t->head_dim * es) % 16 == 0 && (t->stride_batch * es) % 16 == 0 &&
            (t->stride_seq * es) % 16 == 0 && (t->stride_head * es) % 16 == 0;
    return s;
}

cudaError_t fa_contract_scan(const fa_cuda_params *c, const fa_problem *p, const fa_contract_ws *w, cudaStream_t st) {
    const int64_t items = fa_items(p);
    cudaError_t e = cudaMemsetAsync(w->scan, 0, (size_t)(1 + items * FA_NSLOT) * sizeof(unsigned), st);
    if (e != cudaSuccess || items == 0) return e;
    fa_scan_args a;
    memset(&a, 0, sizeof a);
    const int group = (int)(p->hq / p->hk), bwd = p->is_backward;
    if (bwd) {
        a.t[0] = fa_scan_of(&p->q, 0, 1, group, SLOT_Q);
        a.t[1] = fa_scan_of(&p->k, 1, 1, 1, SLOT_K);
        a.t[2] = fa_scan_of(&p->v, 1, 1, 1, SLOT_V);
        a.t[3] = fa_scan_of(&p->o, 0, 1, group, SLOT_O);
        a.t[4] = fa_scan_of(&p->dout, 0, 1, group, SLOT_DO);
        a.nt = 5;
    } else if (!c->o_check) {
        /* k: an inf in k gives −inf logits to the rows whose q has the other sign, and a −inf logit is a weight of 0
         * in out and LSE, invisible to the output check (a NaN or inf anywhere else shows there); q too with a
         * softcap, whose tanh turns the ±inf logits of an inf in q into finite ones. A self-checking kernel tests
         * its logits instead (contract.h). */
        a.t[0] = fa_scan_of(&p->k, 1, group, 1, SLOT_K);
        a.nt = 1;
        if (p->softcap > 0.f) a.t[a.nt++] = fa_scan_of(&p->q, 0, 1, 1, SLOT_Q);
    }
    a.item_heads = (int)(bwd ? p->hk : p->hq), a.dtype = (int)p->dtype;
    a.sq = c->sq, a.sk = c->sk, a.cu_q = c->cu_q, a.cu_k = c->cu_k, a.scan = w->scan;
    a.used_q = c->used_q, a.used_k = c->used_k;
    a.total_q = c->total_q, a.total_k = c->total_k;
    a.chunks = (max(c->sq, c->sk) + FA_SCAN_ROWS - 1) / FA_SCAN_ROWS;
    if (a.chunks > 0 && a.nt > 0) {
        const dim3 grid((unsigned)(a.chunks * a.nt), (unsigned)p->hq, (unsigned)p->batch);
        fa_contract_scan_kernel<<<grid, 256, 0, st>>>(a);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (!bwd) return cudaSuccess; /* the forward decides after its output check (fa_contract_fix) */
    fa_contract_decide_kernel<<<(unsigned)((items + 255) / 256), 256, 0, st>>>(*c, w->scan, w->todo, items, a.dtype, bwd);
    return cudaGetLastError();
}

/* ---- the fix-up: float64 from the definition ---- */

template <typename T> __device__ __forceinline__ double fa_ld(const void *base, int64_t i) {
    if constexpr (std::is_same<T, __nv_fp8_e4m3>::value)
        return (double)(float)((const __nv_fp8_e4m3 *)base)[i];
    else
        return (double)fa_to_f32<T>(((const T *)base)[i]);
}
/* FP8 inputs: a row times its (batch, K/V head)'s descale (NULL: 1) */
__device__ __forceinline__ void fa_descale_row(double (&r)[FA_DMAX], const float *descale, int64_t i) {
    if (!descale) return;
    const double f = (double)descale[i];
#pragma unroll
    for (int t = 0; t < FA_DMAX; ++t) r[t] *= f;
}
template <typename T> __device__ __forceinline__ void fa_st(void *base, int64_t i, double x) {
    ((T *)base)[i] = fa_from_f32<T>((float)x);
}
__device__ __forceinline__ double fa_warp_sum(double x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}
/* A row's elements, lane-strided: element lane + 32·t in r[t] (0 beyond d: q, k rows take c.d, v, o, dO rows c.d_v);
 * returns 1 if any is not finite. */
template <typename T> __device__ __forceinline__ int fa_load_row(double (&r)[FA_DMAX], const void *base, int64_t off,
                                                                 int d, int lane) {
    int bad = 0;
#pragma unroll
    for (int t = 0; t < FA_DMAX; ++t) {
        const int x = lane + 32 * t;
        r[t] = x < d ? fa_ld<T>(base, off + x) : 0.0;
        bad |= !isfinite(r[t]);
    }
    return __any_sync(0xffffffffu, bad);
}
/* The contract's logit from the warp's dot product: scale, softcap, saturation (NaN stays NaN). */
__device__ __forceinline__ double fa_logit(const fa_cuda_params &c, double dot) {
    double s = dot * (double)c.scale;
    if (c.softcap > 0.f) s = (double)c.softcap * tanh(s / (double)c.softcap);
    return s > FA_LOGIT_SAT ? FA_LOGIT_SAT : s < -FA_LOGIT_SAT ? -FA_LOGIT_SAT : s;
}
__device__ __forceinline__ double fa_dot(const double (&a)[FA_DMAX], const double (&b)[FA_DMAX]) {
    double s = 0;
#pragma unroll
    for (int t = 0; t < FA_DMAX; ++t) s += a[t] * b[t];
    return fa_warp_sum(s);
}
__device__ __forceinline__ int64_t fa_qoff(const fa_cuda_params &c, const fa_seq &s, int64_t sb, int64_t ss,
                                           int64_t sh, int b, int h, int i) {
    return fa_off(c, sb, ss, sh, b, s.qrow, h) + (int64_t)i * ss;
}
__device__ __forceinline__ int64_t fa_koff(const fa_cuda_params &c, const fa_seq &s, int64_t sb, int64_t ss,
                                           int64_t sh, int b, int h, int j) {
    return fa_off(c, sb, ss, sh, b, s.krow, h) + (int64_t)j * ss;
}

/* The sink joined to a finished row (core/sink.h): *lse becomes log(e^lse + e^sink); returns e^(lse_keys − *lse),
 * the factor of the row's O. Not inlined, and *lse through memory: inlined (or returning both in a struct), its exp
 * and log made ptxas spill in the FP8 instances. */
static __device__ __noinline__ double fa_fix_sink_join(double *lse, float sink) {
    const double L = fa_sink_lse(*lse, sink), f = L == -INFINITY ? 0.0 : exp(*lse - L);
    *lse = L;
    return f;
}

/* Forward row i of (b, h): online softmax in float64 over the visible keys. */
/* TI: q, k, v's type (e4m3: times their descales), TO: out's. */
template <typename TI, typename TO>
__device__ void fa_fix_fwd_row(const fa_cuda_params &c, int b, int h, int i, int lane) {
    const fa_seq s = fa_get_seq(c, b, h);
    const int hk = h / c.group;
    const int64_t di = (int64_t)b * c.hk + hk; /* descales [batch][hk] */
    int lo, hi;
    fa_visible_keys32(i, s.sq, s.sk, c.wl, c.wr, &lo, &hi);
    fa_chunk_keys32(i + s.sk - s.sq, i + s.sk - s.sq, c.chunk, &lo, &hi);
    double q[FA_DMAX], k[FA_DMAX], o[FA_DMAX] = {}, m = -INFINITY, l = 0, lse = -INFINITY;
    int nan_row = fa_load_row<TI>(q, c.q, fa_qoff(c, s, c.q_sb, c.q_ss, c.q_sh, b, h, i), c.d, lane) && hi > lo;
    fa_descale_row(q, c.q_descale, di);
    const double vd = c.v_descale ? (double)c.v_descale[di] : 1.0;
    for (int j = lo; j < hi && !nan_row; ++j) {
        nan_row = fa_load_row<TI>(k, c.k, fa_koff(c, s, c.k_sb, c.k_ss, c.k_sh, b, hk, j), c.d, lane);
        if (nan_row) break;
        fa_descale_row(k, c.k_descale, di);
        const double sj = fa_logit(c, fa_dot(q, k));
        if (sj > m) { /* rescale the running sums to the new maximum */
            const double f = exp(m - sj);
            l *= f;
#pragma unroll
            for (int t = 0; t < FA_DMAX; ++t) o[t] *= f;
            m = sj;
        }
        const double pj = exp(sj - m);
        const int64_t vo = fa_koff(c, s, c.v_sb, c.v_ss, c.v_sh, b, hk, j);
        l += pj;
#pragma unroll
        for (int t = 0; t < FA_DMAX; ++t)
            if (lane + 32 * t < c.d_v) o[t] += pj * vd * fa_ld<TI>(c.v, vo + lane + 32 * t);
    }
    if (nan_row) {
        lse = NAN;
#pragma unroll
        for (int t = 0; t < FA_DMAX; ++t) o[t] = NAN;
    } else {
        if (hi > lo) {
#pragma unroll
            for (int t = 0; t < FA_DMAX; ++t) o[t] /= l;
            lse = m + log(l);
        }
        if (c.sinks_joined) { /* the kernel joined its rows' sinks: so does this row */
            const double f = fa_fix_sink_join(&lse, c.sinks[h]);
#pragma unroll
            for (int t = 0; t < FA_DMAX; ++t) o[t] *= f;
        }
    }
    const int64_t oo = fa_qoff(c, s, c.o_sb, c.o_ss, c.o_sh, b, h, i);
#pragma unroll
    for (int t = 0; t < FA_DMAX; ++t)
        if (lane + 32 * t < c.d_v) fa_st<TO>(c.out, oo + lane + 32 * t, o[t]);
    if (c.lse && lane == 0) c.lse[s.stat0 + i] = (float)lse;
}

/* dS·scale of one (query, key) pair, from the logit, P and dP = dO_i·V_j (softcap: d(c·tanh(s/c))/ds). */
__device__ __forceinline__ double fa_dscore(const fa_cuda_params &c, double sj, double pj, double dp, double D) {
    double ds = pj * (dp - D);
    if (c.softcap > 0.f) {
        const double th = sj / (double)c.softcap;
        ds *= 1.0 - th * th;
    }
    return ds * (double)c.scale;
}

/* Backward query row i of (b, h): its float64 LSE (a NaN or −∞ LSE from the forward stands) and D, kept for the
 * key-row pass, and dQ_i = Σ_j dS_ij K_j. */
template <typename T> __device__ void fa_fix_dq_row(const fa_cuda_params &c, const fa_contract_ws &w, int b, int h, int i,
                                                    int lane) {
    const fa_seq s = fa_get_seq(c, b, h);
    const int hk = h / c.group;
    int lo, hi;
    fa_visible_keys32(i, s.sq, s.sk, c.wl, c.wr, &lo, &hi);
    fa_chunk_keys32(i + s.sk - s.sq, i + s.sk - s.sq, c.chunk, &lo, &hi);
    double q[FA_DMAX], k[FA_DMAX], v[FA_DMAX], dout[FA_DMAX], o[FA_DMAX], dq[FA_DMAX] = {};
    fa_load_row<T>(q, c.q, fa_qoff(c, s, c.q_sb, c.q_ss, c.q_sh, b, h, i), c.d, lane);
    fa_load_row<T>(dout, c.dout, fa_qoff(c, s, c.do_sb, c.do_ss, c.do_sh, b, h, i), c.d_v, lane);
    fa_load_row<T>(o, c.o, fa_qoff(c, s, c.o_sb, c.o_ss, c.o_sh, b, h, i), c.d_v, lane);
    double L = (double)c.lse[s.stat0 + i];
    const double D = fa_dot(dout, o);
    if (!isnan(L) && L != -INFINITY && hi > lo) {
        double m = -INFINITY, l = 0;
        for (int j = lo; j < hi; ++j) {
            fa_load_row<T>(k, c.k, fa_koff(c, s, c.k_sb, c.k_ss, c.k_sh, b, hk, j), c.d, lane);
            const double sj = fa_logit(c, fa_dot(q, k));
            if (sj > m) l *= exp(m - sj), m = sj;
            l += exp(sj - m);
        }
        L = m + log(l);
        if (c.sinks) L = fa_sink_lse(L, c.sinks[h]); /* the forward's LSE holds the sink (core/sink.h) */
    }
    if (lane == 0) w.row_lse[s.stat0 + i] = L, w.row_dsum[s.stat0 + i] = D;
    for (int j = lo; j < hi; ++j) {
        fa_load_row<T>(k, c.k, fa_koff(c, s, c.k_sb, c.k_ss, c.k_sh, b, hk, j), c.d, lane);
        fa_load_row<T>(v, c.v, fa_koff(c, s, c.v_sb, c.v_ss, c.v_sh, b, hk, j), c.d_v, lane);
        const double sj = fa_logit(c, fa_dot(q, k)), pj = L == -INFINITY ? 0.0 : exp(sj - L);
        const double ds = fa_dscore(c, sj, pj, fa_dot(dout, v), D);
#pragma unroll
        for (int t = 0; t < FA_DMAX; ++t) dq[t] += ds * k[t];
    }
    const int64_t qo = fa_qoff(c, s, c.dq_sb, c.dq_ss, c.dq_sh, b, h, i);
#pragma unroll
    for (int t = 0; t < FA_DMAX; ++t)
        if (lane + 32 * t < c.d) fa_st<T>(c.dq, qo + lane + 32 * t, dq[t]);
}

/* Backward key row j of (b, K/V head hk): dK_j = Σ dS_ij Q_i, dV_j = Σ P_ij dO_i over the query heads of the group
 * and the rows that see key j. */
template <typename T> __device__ void fa_fix_dkv_row(const fa_cuda_params &c, const fa_contract_ws &w, int b, int hk,
                                                     int j, int lane) {
    double q[FA_DMAX], k[FA_DMAX], v[FA_DMAX], dout[FA_DMAX], dk[FA_DMAX] = {}, dv[FA_DMAX] = {};
    const fa_seq s0 = fa_get_seq(c, b, hk * c.group);
    fa_load_row<T>(k, c.k, fa_koff(c, s0, c.k_sb, c.k_ss, c.k_sh, b, hk, j), c.d, lane);
    fa_load_row<T>(v, c.v, fa_koff(c, s0, c.v_sb, c.v_ss, c.v_sh, b, hk, j), c.d_v, lane);
    for (int g = 0; g < c.group; ++g) {
        const int h = hk * c.group + g;
        const fa_seq s = fa_get_seq(c, b, h);
        for (int i = 0; i < s.sq; ++i) {
            int lo, hi;
            fa_visible_keys32(i, s.sq, s.sk, c.wl, c.wr, &lo, &hi);
            fa_chunk_keys32(i + s.sk - s.sq, i + s.sk - s.sq, c.chunk, &lo, &hi);
            if (j < lo || j >= hi) continue;
            const double L = w.row_lse[s.stat0 + i], D = w.row_dsum[s.stat0 + i];
            fa_load_row<T>(q, c.q, fa_qoff(c, s, c.q_sb, c.q_ss, c.q_sh, b, h, i), c.d, lane);
            fa_load_row<T>(dout, c.dout, fa_qoff(c, s, c.do_sb, c.do_ss, c.do_sh, b, h, i), c.d_v, lane);
            const double sj = fa_logit(c, fa_dot(q, k)), pj = L == -INFINITY ? 0.0 : exp(sj - L);
            const double ds = fa_dscore(c, sj, pj, fa_dot(dout, v), D);
#pragma unroll
            for (int t = 0; t < FA_DMAX; ++t) dk[t] += ds * q[t], dv[t] += pj * dout[t];
        }
    }
    const int64_t ko = fa_koff(c, s0, c.dk_sb, c.dk_ss, c.dk_sh, b, hk, j);
    const int64_t vo = fa_koff(c, s0, c.dv_sb, c.dv_ss, c.dv_sh, b, hk, j);
#pragma unroll
    for (int t = 0; t < FA_DMAX; ++t) {
        if (lane + 32 * t < c.d) fa_st<T>(c.dk, ko + lane + 32 * t, dk[t]);
        if (lane + 32 * t < c.d_v) fa_st<T>(c.dv, vo + lane + 32 * t, dv[t]);
    }
}

/* The listed items' rows dealt out to every warp of the grid. pass 0: forward; 1: backward dQ (and LSE, D);
 * 2: backward dK, dV (after pass 1, in stream order). T: the inputs' type, TO: out's (another only after FP8
 * inputs, which have no backward). */
template <typename T, typename TO = T>
__global__ void __launch_bounds__(FA_FIX_WARPS * 32) fa_contract_fix_kernel(const fa_cuda_params c, const fa_contract_ws w,
                                                                            int pass, int decide, int dtype) {
    const int lane = threadIdx.x & 31, nwarps = gridDim.x * FA_FIX_WARPS;
    const int wid = blockIdx.x * FA_FIX_WARPS + (threadIdx.x >> 5);
    __shared__ unsigned own[FA_FIX_DECIDE_MAX], own_n;
    const unsigned *todo = w.todo;
    unsigned n;
    if (decide > 0) { /* a forward of at most FA_FIX_DECIDE_MAX items: each CTA lists them itself (one launch less) */
        if (threadIdx.x == 0) own_n = 0;
        __syncthreads();
        for (int it = threadIdx.x; it < decide; it += blockDim.x)
            if (!fa_certified(c, w.scan + 1 + (int64_t)it * FA_NSLOT, dtype, 0)) own[atomicAdd(&own_n, 1u)] = (unsigned)it;
        __syncthreads();
        todo = own, n = own_n;
    } else {
        n = w.scan[0];
    }
    for (unsigned k = 0; k < n; ++k) {
        const int64_t it = todo[k];
        if (pass == 0) {
            const int b = (int)(it / c.hq), h = (int)(it % c.hq), sq = fa_get_seq(c, b, h).sq;
            for (int i = wid; i < sq; i += nwarps) fa_fix_fwd_row<T, TO>(c, b, h, i, lane);
        } else if (pass == 1) {
            const int b = (int)(it / c.hk), hk = (int)(it % c.hk), sq = fa_get_seq(c, b, hk * c.group).sq;
            for (int64_t r = wid; r < (int64_t)sq * c.group; r += nwarps)
                if constexpr (std::is_same<T, TO>::value)
                fa_fix_dq_row<T>(c, w, b, hk * c.group + (int)(r / sq), (int)(r % sq), lane);
        } else {
            const int b = (int)(it / c.hk), hk = (int)(it % c.hk), sk = fa_get_seq(c, b, hk * c.group).sk;
            if constexpr (std::is_same<T, TO>::value)
                for (int j = wid; j < sk; j += nwarps) fa_fix_dkv_row<T>(c, w, b, hk, j, lane);
        }
    }
}

/* The forward's output check: one warp per row of item (b, h); a bad row marks the item (slot O). Non-finite is
 * an all-ones exponent, tested on the bit patterns: 16-byte loads where the rows allow (vec). */
__device__ __forceinline__ int fa_word_nonfinite(unsigned w, int dtype) {
    if (dtype == 0) return (w & 0x7f800000u) == 0x7f800000u;
    const unsigned e = dtype == 1 ? 0x7c00u : 0x7f80u;
    return (w & e) == e || ((w >> 16) & e) == e;
}
__global__ void __launch_bounds__(256) fa_contract_check_kernel(const fa_cuda_params c, unsigned *scan, int dtype,
                                                                int vec) {
    const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x & 31, es = dtype == 0 ? 4 : 2;
    const fa_seq s = fa_get_seq(c, b, h);
    const char *out = (const char *)c.out;
    int bad = 0;
    for (int i = blockIdx.x * 8 + (threadIdx.x >> 5); i < s.sq && !bad; i += gridDim.x * 8) {
        const char *row = out + fa_qoff(c, s, c.o_sb, c.o_ss, c.o_sh, b, h, i) * es;
        int nf = 0;
        if (vec) {
            for (int x = lane; x < c.d_v * es / 16; x += 32) { /* out's rows: d_v wide */
                const uint4 w = reinterpret_cast<const uint4 *>(row)[x];
                nf |= fa_word_nonfinite(w.x, dtype) | fa_word_nonfinite(w.y, dtype) | fa_word_nonfinite(w.z, dtype) |
                      fa_word_nonfinite(w.w, dtype);
            }
        } else {
            for (int x = lane; x < c.d_v; x += 32)
                nf |= fa_word_nonfinite(es == 4 ? ((const unsigned *)row)[x] : ((const unsigned short *)row)[x], dtype);
        }
        if (lane == 0) {
            int lo, hi;
            fa_visible_keys32(i, s.sq, s.sk, c.wl, c.wr, &lo, &hi);
            fa_chunk_keys32(i + s.sk - s.sq, i + s.sk - s.sq, c.chunk, &lo, &hi);
            const float L = c.lse[s.stat0 + i];
            nf |= !(fabsf(L) < FA_LSE_CERTIFIED) && !(L == -INFINITY && hi <= lo);
            /* an LSE that holds the sink hides the keys' −∞ (a NaN row that looks fully masked) or −2^23 behind
             * it: a row that sees keys and carries exactly the sink's LSE is recomputed */
            if (c.sinks_joined) nf |= hi > lo && L == c.sinks[h];
        }
        bad = __any_sync(0xffffffffu, nf);
    }
    if (bad && lane == 0) atomicOr(scan + 1 + ((int64_t)b * c.hq + h) * FA_NSLOT + SLOT_O, 1u);
}

cudaError_t fa_contract_fix(const fa_cuda_params *c, const fa_problem *p, const fa_contract_ws *w, int ctas,
                            cudaStream_t st) {
    const int64_t items = fa_items(p);
    if (items == 0) return cudaSuccess;
    if (!p->is_backward) {
        const unsigned chunks = (unsigned)((c->sq + 8 * FA_SCAN_ROWS - 1) / (8 * FA_SCAN_ROWS));
        if (chunks > 0 && !c->o_check) { /* a self-checking kernel has marked its items */
            const dim3 grid(chunks, (unsigned)p->hq, (unsigned)p->batch);
            const int vec = fa_scan_of(&p->o, 0, 1, 1, SLOT_O).vec;
            fa_contract_check_kernel<<<grid, 256, 0, st>>>(*c, w->scan, (int)p->dtype, vec);
        }
        if (items > FA_FIX_DECIDE_MAX)
            fa_contract_decide_kernel<<<(unsigned)((items + 255) / 256), 256, 0, st>>>(*c, w->scan, w->todo, items,
                                                                                     (int)p->dtype, 0);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    const int decide = !p->is_backward && items <= FA_FIX_DECIDE_MAX ? (int)items : 0, dt = (int)p->dtype;
    const unsigned grid = (unsigned)(ctas > 0 ? ctas : 1), threads = FA_FIX_WARPS * 32;
    for (int pass = p->is_backward ? 1 : 0; pass <= (p->is_backward ? 2 : 0); ++pass) {
        if (p->dtype == FA_DTYPE_F8_E4M3) { /* the forward only; out f32, f16 or bf16 */
            if (p->o.dtype == FA_DTYPE_F32)
                fa_contract_fix_kernel<__nv_fp8_e4m3, float><<<grid, threads, 0, st>>>(*c, *w, pass, decide, dt);
            else if (p->o.dtype == FA_DTYPE_F16)
                fa_contract_fix_kernel<__nv_fp8_e4m3, __half><<<grid, threads, 0, st>>>(*c, *w, pass, decide, dt);
            else
                fa_contract_fix_kernel<__nv_fp8_e4m3, __nv_bfloat16><<<grid, threads, 0, st>>>(*c, *w, pass, decide, dt);
        } else if (p->dtype == FA_DTYPE_F32)
            fa_contract_fix_kernel<float><<<grid, threads, 0, st>>>(*c, *w, pass, decide, dt);
        else if (p->dtype == FA_DTYPE_F16)
            fa_contract_fix_kernel<__half><<<grid, threads, 0, st>>>(*c, *w, pass, decide, dt);
        else
            fa_contract_fix_kernel<__nv_bfloat16><<<grid, threads, 0, st>>>(*c, *w, pass, decide, dt);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
