/* STANDARD attention on the GPU: the baseline a user would write. Per sequence, with cuBLAS
 * (cublasGemmStridedBatchedEx, 16-bit or fp32 operands, fp32 compute) and our row-softmax kernels:
 *   forward:  S = scale·Q Kᵀ (fp32, materialised: Hq x Sq x Sk) -> P = softmax(mask(softcap(S))) (dtype) + LSE
 *             -> O = P V
 *   backward: S again -> P (dtype) -> dV = Pᵀ dO -> dP = dO Vᵀ (fp32) -> dS = P ∘ (dP − D) [∘ (1 − tanh²)]
 *             -> dQ = scale·dS K, dK = scale·dSᵀ Q; D = rowsum(dO ∘ O) from bwd_util.cu
 * Extra memory: Θ(Hq·Sq·Sk) per sequence (S fp32 + P; backward + dP fp32), reused across the sequences of a batch.
 * GQA: the query heads of one K/V head are one strided batch with a K/V stride of 0; dK, dV per query head in
 * fp32 are then summed (bwd_util.cu). q, k (dq, dk) are d = dqk wide, v, out (dout, dv) d_v: each GEMM takes its
 * operands' width, so any pair of head dims runs. */
#include "family.h"
#include "mma_sync/common.cuh"

#include <stdlib.h>

/* The per-sequence scratch (fa_std_layout; NULL: a part the call does not need). */
typedef struct fa_std_parts {
    float *S, *dP, *dkw, *dvw;
    void *P;
} fa_std_parts;

static cudaDataType fa_cu_type(int dtype) { return dtype == 0 ? CUDA_R_32F : dtype == 1 ? CUDA_R_16F : CUDA_R_16BF; }
static size_t fa_esize(int dtype) { return dtype == 0 ? 4 : 2; }

/* One GEMM per head (row-major thinking, column-major call): operand X of head h is base + hx·stride where
 * hx = h for query-side operands and h / group for K/V-side ones. */
typedef struct fa_gop {
    const void *p;
    int64_t ld, stride; /* leading dimension, per-head stride (elements) */
    int kv;             /* 1: indexed by the K/V head */
    cudaDataType t;
    size_t es;
} fa_gop;

static cublasStatus_t fa_gemm_heads(cublasHandle_t hd, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                    float alpha, fa_gop A, fa_gop B, float beta, void *C, cudaDataType ct, size_t ces,
                                    int64_t ldc, int64_t cstride, int hq, int group) {
    const int calls = group == 1 ? 1 : hq / group, per = group == 1 ? hq : group;
    for (int g = 0; g < calls; ++g) {
        const char *a = (const char *)A.p + (size_t)(A.kv ? g : (int64_t)g * per) * A.stride * A.es;
        const char *b = (const char *)B.p + (size_t)(B.kv ? g : (int64_t)g * per) * B.stride * B.es;
        char *c = (char *)C + (size_t)g * per * cstride * ces;
        const long long sa = (A.kv && group > 1) ? 0 : A.stride, sb = (B.kv && group > 1) ? 0 : B.stride;
        cublasStatus_t s = cublasGemmStridedBatchedEx(hd, ta, tb, m, n, k, &alpha, a, A.t, (int)A.ld, sa, b, B.t, (int)B.ld,
                                                      sb, &beta, c, ct, (int)ldc, cstride, per, CUBLAS_COMPUTE_32F,
                                                      CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* Per-row mask + softcap on S (already scaled). */
struct fa_std_row {
    int sq, sk, wl, wr, chunk;
    float cap;
};
/* Keys [*lo, *hi) visible to row i (core/visible.h). */
FA_DEV void fa_std_keys(const fa_std_row &r, int i, int *lo, int *hi) {
    fa_visible_keys32(i, r.sq, r.sk, r.wl, r.wr, lo, hi);
    fa_chunk_keys32(i + r.sk - r.sq, i + r.sk - r.sq, r.chunk, lo, hi);
}
FA_DEV float fa_std_val(const fa_std_row &r, int lo, int hi, int j, float s, bool *vis) {
    *vis = j >= lo && j < hi;
    return r.cap > 0.f ? r.cap * tanhf(s / r.cap) : s;
}

FA_DEV float fa_block_reduce(float v, bool is_max, float *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = red[0];
    for (int i = 1; i < nw; ++i) v = is_max ? fmaxf(v, red[i]) : v + red[i];
    return v;
}

/* Forward softmax of one row per block: P = exp(S − max) / Σ, LSE = max + ln Σ. */
template <typename T>
__global__ void fa_std_softmax_kernel(const float *S, void *Pv, fa_std_row r, float *lse, int64_t lse_hs) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const int h = (int)(row / r.sq), i = (int)(row % r.sq);
    const float *s = S + row * r.sk;
    T *pr = (T *)Pv + row * r.sk;
    int lo, hi;
    fa_std_keys(r, i, &lo, &hi);
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < r.sk; j += blockDim.x) {
        bool vis;
        float x = fa_std_val(r, lo, hi, j, s[j], &vis);
        if (vis) mx = fmaxf(mx, x);
    }
    mx = fa_block_reduce(mx, true, red);
    const float mu = mx == -INFINITY ? 0.f : mx;
    float sum = 0.f;
    for (int j = threadIdx.x; j < r.sk; j += blockDim.x) {
        bool vis;
        float x = fa_std_val(r, lo, hi, j, s[j], &vis);
        if (vis) sum += expf(x - mu);
    }
    sum = fa_block_reduce(sum, false, red);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int j = threadIdx.x; j < r.sk; j += blockDim.x) {
        bool vis;
        float x = fa_std_val(r, lo, hi, j, s[j], &vis);
        pr[j] = fa_from_f32<T>(vis ? expf(x - mu) * inv : 0.f);
    }
    if (lse && threadIdx.x == 0) lse[(int64_t)h * lse_hs + i] = sum > 0.f ? mu + logf(sum) : -INFINITY;
}

/* Backward, element-wise per row: mode 0: P = exp(S − LSE) -> out; mode 1: dS = P ∘ (dP − D) [∘ (1 − tanh²)] -> out. */
template <typename T>
__global__ void fa_std_bwd_kernel(const float *S, const float *dP, void *outv, fa_std_row r, const float *lse,
                                  const float *dsum, int64_t lse_hs, int mode) {
    const int64_t row = blockIdx.x;
    const int h = (int)(row / r.sq), i = (int)(row % r.sq);
    float L = lse[(int64_t)h * lse_hs + i];
    if (L == -INFINITY) L = INFINITY;
    const float Dv = mode ? dsum[(int64_t)h * lse_hs + i] : 0.f;
    int lo, hi;
    fa_std_keys(r, i, &lo, &hi);
    for (int j = threadIdx.x; j < r.sk; j += blockDim.x) {
        bool vis;
        const float x = fa_std_val(r, lo, hi, j, S[row * r.sk + j], &vis);
        float v = vis ? expf(x - L) : 0.f;
        if (mode) {
            v *= dP[row * r.sk + j] - Dv;
            if (r.cap > 0.f) {
                const float t = x / r.cap;
                v *= 1.f - t * t;
            }
        }
        ((T *)outv)[row * r.sk + j] = fa_from_f32<T>(v);
    }
}

#define FA_STD_DT(dtype, KERNEL, grid, block, st, ...)                                \
    do {                                                                             \
        if ((dtype) == 0) KERNEL<float><<<grid, block, 0, st>>>(__VA_ARGS__);        \
        else if ((dtype) == 1) KERNEL<__half><<<grid, block, 0, st>>>(__VA_ARGS__);  \
        else KERNEL<__nv_bfloat16><<<grid, block, 0, st>>>(__VA_ARGS__);            \
    } while (0)

/* The scratch of one sequence (sq x sk per query head), described once for its size and its pointers: S (fp32),
 * P (dtype); backward also dP (fp32) and, for GQA, dK (d wide), dV (dv wide) per query head (fp32). */
static void fa_std_layout(fa_arena *a, int hq, int d, int dv, int group, int64_t sq, int64_t sk, size_t es,
                          int backward, fa_std_parts *w) {
    const size_t hss = (size_t)hq * sq * sk, kv = (size_t)hq * sk * 4;
    w->S = (float *)fa_arena_take(a, hss * 4, 256);
    w->dP = backward ? (float *)fa_arena_take(a, hss * 4, 256) : NULL;
    w->P = fa_arena_take(a, hss * es, 256);
    w->dkw = backward && group > 1 ? (float *)fa_arena_take(a, kv * d, 256) : NULL;
    w->dvw = backward && group > 1 ? (float *)fa_arena_take(a, kv * dv, 16) : NULL;
}

/* Scratch bytes for a sequence of sq queries and sk keys (the longest of the call; dtype 0 = f32, 1 = f16,
 * 2 = bf16): the layout's dry run. */
static size_t fa_standard_ws_bytes(int hq, int d, int dv, int group, int64_t sq, int64_t sk, int dtype, int backward) {
    fa_arena a = fa_arena_dry();
    fa_std_parts w;
    fa_std_layout(&a, hq, d, dv, group, sq, sk, fa_esize(dtype), backward, &w);
    return a.size;
}

/* Packed rows [*row, *row + *n) of sequence b: clamped into the tensor and to the bound the workspace was sized
 * for, as the kernels' fa_packed_seq (the arrays are the caller's, copied back unchecked). */
static void fa_std_rows(const int *cu, int b, int total, int bound, int64_t *row, int *n) {
    const int lo = cu[b] < 0 ? 0 : cu[b] > total ? total : cu[b];
    const int hi = cu[b + 1] < lo ? lo : cu[b + 1] > total ? total : cu[b + 1];
    *row = lo;
    *n = hi - lo < bound ? hi - lo : bound;
}

/* The HOST copies of a packed batch's arrays: cu_seqlens, and seqused (NULL when not given). */
typedef struct fa_std_cu { const int *q, *k, *used_q, *used_k; } fa_std_cu;

/* Sequence b's offsets; with seqused its first used rows, clamped into the span (seqused.cu writes the rest). */
static void fa_std_seq(const fa_cuda_params *p, const fa_std_cu *cu, int b, int *sq, int *sk, int64_t *qr, int64_t *kr,
                       int64_t *lse0, int64_t *lse_hs) {
    if (cu->q) {
        fa_std_rows(cu->q, b, p->total_q, p->sq, qr, sq);
        fa_std_rows(cu->k, b, p->total_k, p->sk, kr, sk);
        if (cu->used_q && cu->used_q[b] < *sq) *sq = cu->used_q[b] < 0 ? 0 : cu->used_q[b];
        if (cu->used_k && cu->used_k[b] < *sk) *sk = cu->used_k[b] < 0 ? 0 : cu->used_k[b];
        *lse0 = *qr, *lse_hs = p->total_q;
    } else {
        *qr = 0, *kr = 0, *sq = p->sq, *sk = p->sk;
        *lse0 = (int64_t)b * p->hq * p->sq, *lse_hs = p->sq;
    }
}
#define FA_OFF(P, X, b, row) ((cu->q ? (row) * (P)->X##_ss : (int64_t)(b) * (P)->X##_sb))

/* cu: the HOST arrays (cu->q NULL without varlen); ws: ws_bytes >= fa_standard_ws_bytes. */
static fa_cuda_result fa_standard_forward(const fa_cuda_params *p, int dtype, const fa_std_cu *cu,
                                         cublasHandle_t hd, cudaStream_t st, void *ws, size_t ws_bytes) {
    const cudaDataType t = fa_cu_type(dtype);
    const size_t es = fa_esize(dtype);
    fa_cuda_result r = {cudaSuccess, CUBLAS_STATUS_SUCCESS};
    for (int b = 0; b < p->batch; ++b) {
        int sq, sk;
        int64_t qr, kr, lse0, lse_hs;
        fa_std_seq(p, cu, b, &sq, &sk, &qr, &kr, &lse0, &lse_hs);
        if (sq == 0) continue;
        const char *q = (const char *)p->q + FA_OFF(p, q, b, qr) * es;
        const char *k = (const char *)p->k + FA_OFF(p, k, b, kr) * es;
        const char *v = (const char *)p->v + FA_OFF(p, v, b, kr) * es;
        char *o = (char *)p->out + FA_OFF(p, o, b, qr) * es;
        fa_arena a = fa_arena_over(ws, ws_bytes);
        fa_std_parts w;
        fa_std_layout(&a, p->hq, p->d, p->d_v, p->group, sq, sk, es, 0, &w);
        float *S = w.S;
        void *P = w.P;
        const fa_std_row rw = {sq, sk, p->wl, p->wr, p->chunk, p->softcap};
        if (sk == 0) { /* no keys: O = 0, LSE = -inf */
            for (int h = 0; h < p->hq; ++h) {
                r.cuda = cudaMemset2DAsync(o + (size_t)h * p->o_sh * es, p->o_ss * es, 0, p->d_v * es, sq, st);
                if (r.cuda != cudaSuccess) return r;
            }
            if (p->lse) {
                FA_STD_DT(dtype, fa_std_softmax_kernel, (unsigned)(p->hq * sq), 32, st, S, P, rw, p->lse + lse0, lse_hs);
                if ((r.cuda = cudaGetLastError()) != cudaSuccess) return r;
            }
            continue;
        }
        /* Sᵀ (col-major sk x sq) = (K as col-major d x sk)ᵀ · (Q as col-major d x sq), alpha = scale */
        fa_gop A = {k, p->k_ss, p->k_sh, 1, t, es}, B = {q, p->q_ss, p->q_sh, 0, t, es};
        r.blas = fa_gemm_heads(hd, CUBLAS_OP_T, CUBLAS_OP_N, sk, sq, p->d, p->scale, A, B, 0.f, S, CUDA_R_32F, 4, sk,
                               (int64_t)sq * sk, p->hq, p->group);
        if (r.blas != CUBLAS_STATUS_SUCCESS) return r;
        FA_STD_DT(dtype, fa_std_softmax_kernel, (unsigned)(p->hq * sq), 256, st, S, P, rw,
                  p->lse ? p->lse + lse0 : (float *)0, lse_hs);
        if ((r.cuda = cudaGetLastError()) != cudaSuccess) return r;
        /* Oᵀ (col-major dv x sq) = (V as col-major dv x sk) · (P as col-major sk x sq) */
        fa_gop A2 = {v, p->v_ss, p->v_sh, 1, t, es}, B2 = {P, sk, (int64_t)sq * sk, 0, t, es};
        r.blas = fa_gemm_heads(hd, CUBLAS_OP_N, CUBLAS_OP_N, p->d_v, sq, sk, 1.f, A2, B2, 0.f, o, t, es, p->o_ss,
                               p->o_sh, p->hq, p->group);
        if (r.blas != CUBLAS_STATUS_SUCCESS) return r;
    }
    return r;
}

static fa_cuda_result fa_standard_backward(const fa_cuda_params *p, int dtype, const fa_std_cu *cu,
                                          cublasHandle_t hd, cudaStream_t st, void *ws, size_t ws_bytes) {
    const cudaDataType t = fa_cu_type(dtype);
    const size_t es = fa_esize(dtype);
    fa_cuda_result r = {cudaSuccess, CUBLAS_STATUS_SUCCESS};
    r.cuda = fa_bwd_dsum_launch(p, dtype, 0, st);
    if (r.cuda != cudaSuccess) return r;
    for (int b = 0; b < p->batch; ++b) {
        int sq, sk;
        int64_t qr, kr, lse0, lse_hs;
        fa_std_seq(p, cu, b, &sq, &sk, &qr, &kr, &lse0, &lse_hs);
        const char *q = (const char *)p->q + FA_OFF(p, q, b, qr) * es;
        const char *k = (const char *)p->k + FA_OFF(p, k, b, kr) * es;
        const char *v = (const char *)p->v + FA_OFF(p, v, b, kr) * es;
        const char *dO = (const char *)p->dout + FA_OFF(p, do, b, qr) * es;
        char *dq = (char *)p->dq + FA_OFF(p, dq, b, qr) * es;
        char *dk = (char *)p->dk + FA_OFF(p, dk, b, kr) * es;
        char *dv = (char *)p->dv + FA_OFF(p, dv, b, kr) * es;
        fa_arena a = fa_arena_over(ws, ws_bytes);
        fa_std_parts w;
        fa_std_layout(&a, p->hq, p->d, p->d_v, p->group, sq, sk, es, 1, &w);
        float *S = w.S, *dP = w.dP, *dkw = w.dkw, *dvw = w.dvw;
        void *P = w.P;
        const int gqa = p->group > 1;
        const fa_std_row rw = {sq, sk, p->wl, p->wr, p->chunk, p->softcap};
        if (sq == 0 || sk == 0) {
            for (int h = 0; h < p->hq && sq > 0; ++h) {
                r.cuda = cudaMemset2DAsync(dq + (size_t)h * p->dq_sh * es, p->dq_ss * es, 0, p->d * es, sq, st);
                if (r.cuda != cudaSuccess) return r;
            }
            for (int h = 0; h < p->hk && sk > 0; ++h) {
                r.cuda = cudaMemset2DAsync(dk + (size_t)h * p->dk_sh * es, p->dk_ss * es, 0, p->d * es, sk, st);
                if (r.cuda == cudaSuccess)
                    r.cuda = cudaMemset2DAsync(dv + (size_t)h * p->dv_sh * es, p->dv_ss * es, 0, p->d_v * es, sk, st);
                if (r.cuda != cudaSuccess) return r;
            }
            continue;
        }
        /* S = scale·Q Kᵀ; P = exp(S − LSE) */
        r.blas = fa_gemm_heads(hd, CUBLAS_OP_T, CUBLAS_OP_N, sk, sq, p->d, p->scale, (fa_gop){k, p->k_ss, p->k_sh, 1, t, es},
                               (fa_gop){q, p->q_ss, p->q_sh, 0, t, es}, 0.f, S, CUDA_R_32F, 4, sk, (int64_t)sq * sk,
                               p->hq, p->group);
        if (r.blas != CUBLAS_STATUS_SUCCESS) return r;
        FA_STD_DT(dtype, fa_std_bwd_kernel, (unsigned)(p->hq * sq), 256, st, S, dP, P, rw, p->lse + lse0,
                  p->dsum + lse0, lse_hs, 0);
        if ((r.cuda = cudaGetLastError()) != cudaSuccess) return r;
        /* dVᵀ (col-major dv x sk) = (dO col-major dv x sq) · (P col-major sk x sq)ᵀ */
        fa_gop Pop = {P, sk, (int64_t)sq * sk, 0, t, es};
        r.blas = fa_gemm_heads(hd, CUBLAS_OP_N, CUBLAS_OP_T, p->d_v, sk, sq, 1.f,
                               (fa_gop){dO, p->do_ss, p->do_sh, 0, t, es}, Pop, 0.f, gqa ? (void *)dvw : (void *)dv,
                               gqa ? CUDA_R_32F : t, gqa ? 4 : es, gqa ? p->d_v : p->dv_ss,
                               gqa ? (int64_t)sk * p->d_v : p->dv_sh, p->hq, gqa ? 1 : 1);
        if (r.blas != CUBLAS_STATUS_SUCCESS) return r;
        /* dPᵀ (col-major sk x sq) = (V col-major dv x sk)ᵀ · (dO col-major dv x sq) */
        r.blas = fa_gemm_heads(hd, CUBLAS_OP_T, CUBLAS_OP_N, sk, sq, p->d_v, 1.f, (fa_gop){v, p->v_ss, p->v_sh, 1, t, es},
                               (fa_gop){dO, p->do_ss, p->do_sh, 0, t, es}, 0.f, dP, CUDA_R_32F, 4, sk, (int64_t)sq * sk,
                               p->hq, p->group);
        if (r.blas != CUBLAS_STATUS_SUCCESS) return r;
        FA_STD_DT(dtype, fa_std_bwd_kernel, (unsigned)(p->hq * sq), 256, st, S, dP, P, rw, p->lse + lse0,
                  p->dsum + lse0, lse_hs, 1);
        if ((r.cuda = cudaGetLastError()) != cudaSuccess) return r;
        /* dQᵀ (col-major d x sq) = scale · (K col-major d x sk) · (dS col-major sk x sq) */
        r.blas = fa_gemm_heads(hd, CUBLAS_OP_N, CUBLAS_OP_N, p->d, sq, sk, p->scale, (fa_gop){k, p->k_ss, p->k_sh, 1, t, es},
                               Pop, 0.f, dq, t, es, p->dq_ss, p->dq_sh, p->hq, p->group);
        if (r.blas != CUBLAS_STATUS_SUCCESS) return r;
        /* dKᵀ (col-major d x sk) = scale · (Q col-major d x sq) · (dS col-major sk x sq)ᵀ */
        r.blas = fa_gemm_heads(hd, CUBLAS_OP_N, CUBLAS_OP_T, p->d, sk, sq, p->scale, (fa_gop){q, p->q_ss, p->q_sh, 0, t, es},
                               Pop, 0.f, gqa ? (void *)dkw : (void *)dk, gqa ? CUDA_R_32F : t, gqa ? 4 : es,
                               gqa ? p->d : p->dk_ss, gqa ? (int64_t)sk * p->d : p->dk_sh, p->hq, 1);
        if (r.blas != CUBLAS_STATUS_SUCCESS) return r;
        if (gqa) {
            /* sum the query heads of each K/V head: reuse the reduction kernel on a one-sequence view */
            fa_cuda_params s1 = *p;
            s1.cu_q = s1.cu_k = 0;
            s1.batch = 1;
            s1.sk = sk;
            s1.total_k = sk;
            s1.dk_acc = dkw;
            s1.dv_acc = dvw;
            s1.dk = dk;
            s1.dv = dv;
            r.cuda = fa_bwd_dkv_reduce_launch(&s1, dtype, st);
            if (r.cuda != cudaSuccess) return r;
        }
    }
    return r;
}

/* ---- the family row (family.h): cuBLAS's GEMMs over materialised S and P, forward and backward ---- */

/* cuBLAS takes the sequence stride as a leading dimension (int, >= head_dim). */
static int fa_tensor_blas_ok(const fa_tensor *t) {
    return (t->seqlen <= 1 || t->stride_seq >= t->head_dim) && t->stride_seq < INT32_MAX && t->stride_head < INT32_MAX;
}

static fa_status fa_std_pick(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    if (p->dtype == FA_DTYPE_F8_E4M3) return fa_cuda_fp8_refusal(why, why_len);
    (void)tu;
    const char *name;
    const fa_tensor *t = fa_cuda_view_failing(p, fa_tensor_blas_ok, &name);
    if (t)
        return fa_cuda_unsupported(why, why_len,
                                   "%s: CUDA FA_ALGO_STANDARD (cuBLAS) needs stride_seq >= head_dim and strides < 2^31 "
                                   "(stride_seq %lld, head_dim %lld)",
                                   name, (long long)t->stride_seq, (long long)t->head_dim);
    plan->kernel = "cuda.standard.cublas"; /* block_q/block_k: cuBLAS picks its own tiles; ignored as on the CPU */
    return FA_OK;
}

/* The backward's D (LSE layout), then the per-sequence scratch. */
static void fa_std_ws(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w) {
    (void)plan;
    if (p->is_backward) w->dsum = (float *)fa_arena_take(a, fa_cuda_stat_rows(p) * sizeof(float), 256);
    w->standard_bytes = fa_standard_ws_bytes((int)p->hq, (int)p->d, (int)p->d_v, (int)(p->hq / p->hk), p->sq_max,
                                             p->sk_max, (int)p->dtype, p->is_backward);
    w->standard = fa_arena_take(a, w->standard_bytes, 256);
}

static void fa_std_traffic(const fa_problem *p, fa_plan *plan) {
    const fa_cuda_traffic_in t = fa_cuda_traffic_of(p);
    const double e = t.e, d = t.d, dv = t.dv, qrows = t.qrows, kvrows = t.kvrows;
    double ss = 0;
    for (int64_t b = 0; b < p->batch; ++b) ss += (double)fa_seqlen_q(p, b) * fa_seqlen_k(p, b);
    ss *= (double)p->hq;
    if (!p->is_backward) { /* Q, K, V; S written (fp32) and read by the softmax; P written and read by the PV GEMM; O, LSE */
        plan->read_bytes = qrows * d * e + kvrows * (d + dv) * e + ss * 4 + ss * e;
        plan->write_bytes = ss * 4 + ss * e + qrows * dv * e + (p->lse ? qrows * 4 : 0);
    } else { /* inputs once (Q, K, V, O, dO, LSE); S, dP (fp32) and P/dS written and read back */
        plan->read_bytes = qrows * (d + 2 * dv) * e + kvrows * (d + dv) * e + qrows * 4 + ss * (4 + 4 + 4 + 3 * e);
        plan->write_bytes = ss * (4 + 4 + 2 * e) + qrows * d * e + kvrows * (d + dv) * e;
    }
}

/* The sequences' offsets are walked on the host: a packed batch's device cu_seqlens (and seqused) are copied back first (the one
 * synchronising path of a CUDA varlen call, header: fa_attn_opts.max_seqlen_q). */
static fa_cuda_result fa_std_run(const fa_cuda_launch *l) {
    const fa_problem *p = l->p;
    const int dtype = (int)p->dtype;
    fa_cuda_result r = {cudaSuccess, CUBLAS_STATUS_SUCCESS};
    int *host = NULL;
    fa_std_cu cu = {NULL, NULL, NULL, NULL};
    if (p->cu_q) { /* cu_seqlens_q/k of n + 1 entries, then seqused_q/k of n where given */
        const size_t n = (size_t)p->batch + 1;
        const int *src[4] = {p->cu_q, p->cu_k, p->used_q, p->used_k};
        const size_t len[4] = {n, n, n - 1, n - 1};
        if (!(host = (int *)malloc(4 * n * sizeof(int)))) {
            r.cuda = cudaErrorMemoryAllocation;
            return r;
        }
        const int **dst[4] = {&cu.q, &cu.k, &cu.used_q, &cu.used_k};
        for (int i = 0; i < 4 && r.cuda == cudaSuccess; i++) {
            if (!src[i] || !len[i]) continue;
            r.cuda = cudaMemcpyAsync(host + i * n, src[i], len[i] * sizeof(int), cudaMemcpyDeviceToHost, l->stream);
            *dst[i] = host + i * n;
        }
        if (r.cuda == cudaSuccess) r.cuda = cudaStreamSynchronize(l->stream);
        if (r.cuda != cudaSuccess) {
            free(host);
            return r;
        }
    }
    r = p->is_backward ? fa_standard_backward(l->c, dtype, &cu, l->blas, l->stream, l->w->standard,
                                              l->w->standard_bytes)
                       : fa_standard_forward(l->c, dtype, &cu, l->blas, l->stream, l->w->standard,
                                             l->w->standard_bytes);
    free(host);
    return r;
}

const fa_cuda_family fa_cuda_standard = {"STANDARD", FA_ALGO_STANDARD, FA_CUDA_FWD | FA_CUDA_BWD, 1,
                                         FA_CUDA_DT_16 | FA_CUDA_DT(FA_DTYPE_F32), fa_std_pick,
                                         fa_std_ws, fa_std_traffic, fa_std_run, 0, 0};
