/* FA_ALGO_STANDARD on the CPU — attention as a user would write it from the definition, materialising the
 * N x N matrices in slow memory (the baseline of the FlashAttention paper, its Algorithm 0):
 *   S = scale·Q Kᵀ (+softcap, mask)  -> written to slow memory
 *   P = softmax(S) row by row         -> read S, write P (in place)
 *   O = P V                           -> read P, write O
 * Backward recomputes P the same way, then materialises dP = dO Vᵀ and dS = P ∘ (dP − D) (also N x N) and forms
 * dV = Pᵀ dO, dQ = scale·dS K, dK = scale·dSᵀ Q. Work is parallel over batch × heads (forward) and
 * batch × K/V heads (backward, so dK/dV have one writer); each thread owns its S/P (and dP) buffers: Θ(N²)
 * extra memory per thread.
 *
 * This file runs the products tile by tile through the same micro-kernels as FLASH1/FLASH2 (kernel
 * "cpu.standard"); with a system CBLAS the plan picks standard_blas.c instead where it applies. The counted traffic
 * is the same model either way: S and P (and dP, dS) are N x N fp32 matrices in slow memory. */
#include "cpu/cpu.h"

#include <string.h>

/* S (sq x sk, row stride sk, slow memory) = scores of one head, tile by tile. */
static void materialise_scores(const fa_problem *p, const fa_cpu_kernels *kr, const fa_head *hd, int br, int bc,
                               float *Qi, float *Kj, float *T, float *S, fa_io *io) {
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    const float inv_cap = p->softcap > 0 ? 1.0f / p->softcap : 0;
    for (int64_t i0 = 0; i0 < hd->sq; i0 += br) {
        const int rows = (int)(hd->sq - i0 < br ? hd->sq - i0 : br);
        fa_tile_load(Qi, d, (const char *)hd->q + i0 * hd->ldq * es, p->dtype, hd->ldq, rows, d, io);
        for (int64_t j0 = 0; j0 < hd->sk; j0 += bc) {
            const int cols = (int)(hd->sk - j0 < bc ? hd->sk - j0 : bc);
            fa_tile_load(Kj, d, (const char *)hd->k + j0 * hd->ldk * es, p->dtype, hd->ldk, cols, d, io);
            kr->gemm_abt(rows, cols, d, Qi, d, Kj, d, T, cols);
            fa_cpu_scores(p, T, cols, 1, rows, cols, i0, j0, hd->sq, hd->sk, p->scale, inv_cap);
            fa_tile_store(S + i0 * hd->sk + j0, FA_DTYPE_F32, hd->sk, T, cols, rows, cols, io);
        }
    }
}

/* C (sq x d, fast tiles, stored to dst) = A (sq x sk, slow) · B (sk x d, tensor rows): O = P V (d = dv),
 * dQ = dS K (d = dqk). */
static void slow_times_rows(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int br, int bc, int d,
                            const float *A, const void *B, int64_t ldb, void *dst, fa_dtype dst_dt, int64_t ldd,
                            float *Ai, float *Bj, float *Ci, fa_io *io) {
    const size_t es = fa_dtype_size(p->dtype);
    for (int64_t i0 = 0; i0 < sq; i0 += br) {
        const int rows = (int)(sq - i0 < br ? sq - i0 : br);
        memset(Ci, 0, (size_t)rows * d * 4);
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Ai, cols, A + i0 * sk + j0, FA_DTYPE_F32, sk, rows, cols, io);
            fa_tile_load(Bj, d, (const char *)B + j0 * ldb * es, p->dtype, ldb, cols, d, io);
            kr->gemm_nn(rows, d, cols, Ai, cols, 1, Bj, d, Ci, d, 1);
        }
        fa_tile_store((char *)dst + i0 * ldd * fa_dtype_size(dst_dt), dst_dt, ldd, Ci, d, rows, d, io);
    }
}

/* C (sk x d) += A (sq x sk, slow)ᵀ · B (sq x d, tensor rows), C an fp32 buffer in slow memory: dV (d = dv), dK
 * (d = dqk). */
static void slow_t_times_rows(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int br, int bc,
                              int d, const float *A, const void *B, int64_t ldb, float *C, float *Ai, float *Bi,
                              float *Cj, fa_io *io) {
    const size_t es = fa_dtype_size(p->dtype);
    for (int64_t j0 = 0; j0 < sk; j0 += bc) {
        const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
        fa_tile_load(Cj, d, C + j0 * d, FA_DTYPE_F32, d, cols, d, io);
        for (int64_t i0 = 0; i0 < sq; i0 += br) {
            const int rows = (int)(sq - i0 < br ? sq - i0 : br);
            fa_tile_load(Ai, cols, A + i0 * sk + j0, FA_DTYPE_F32, sk, rows, cols, io);
            fa_tile_load(Bi, d, (const char *)B + i0 * ldb * es, p->dtype, ldb, rows, d, io);
            kr->gemm_nn(cols, d, rows, Ai, 1, cols, Bi, d, Cj, d, 1);
        }
        fa_tile_store(C + j0 * d, FA_DTYPE_F32, d, Cj, d, cols, d, io);
    }
}

/* ---- forward ---- */

/* A thread's slice: tiles Qi (Br x d), Oi (Br x dv), Kj (Bc rows of K, then of V: max(d, dv) wide), T (Br x Bc), one
 * row R of S, and the head's S (sq x sk, slow memory). */
typedef struct fwd_tiles {
    float *Qi, *Oi, *Kj, *T, *R, *S;
} fwd_tiles;

static void fwd_thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *tiles) {
    const fa_problem *p = problem;
    fwd_tiles *t = tiles;
    const size_t d = (size_t)p->d, dv = (size_t)p->d_v, br = (size_t)pl->block_q, bc = (size_t)pl->block_k;
    t->Qi = fa_take_f32(a, br * d);
    t->Oi = fa_take_f32(a, br * dv);
    t->Kj = fa_take_f32(a, bc * (d > dv ? d : dv));
    t->T = fa_take_f32(a, br * bc);
    t->R = fa_take_f32(a, (size_t)p->sk_max);
    t->S = fa_take_f32(a, (size_t)(p->sq_max * p->sk_max));
}

static void fwd_run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    const int br = pl->block_q, bc = pl->block_k;
    const int64_t items = p->batch * p->hq;

#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t it = 0; it < items; it++) {
        fwd_tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *Qi = t.Qi, *Oi = t.Oi, *Kj = t.Kj, *T = t.T, *R = t.R, *S = t.S;
        fa_head hd;
        fa_cpu_head(p, it / p->hq, it % p->hq, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;
        materialise_scores(p, kr, &hd, br, bc, Qi, Kj, T, S, io);           /* S = scale·Q Kᵀ */
        for (int64_t i = 0; i < sq; i++) {                                  /* P = softmax(S), in place */
            fa_vec_load(R, S + i * sk, (int)sk, io);
            float mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < sk; j++) mx = R[j] > mx ? R[j] : mx;
            for (int64_t j = 0; j < sk; j++) { R[j] = mx == -INFINITY ? 0.0f : expf(R[j] - mx); sum += R[j]; }
            float l = sum > 0 ? mx + logf(sum) : -INFINITY;
            const float inv = hd.sink ? fa_sink_join(sum > 0 ? mx : -INFINITY, sum, *hd.sink, &l) /* core/sink.h */
                                      : sum > 0 ? 1.0f / sum : 0.0f;
            for (int64_t j = 0; j < sk; j++) R[j] *= inv;
            fa_vec_store(S + i * sk, R, (int)sk, io);
            if (hd.lse) fa_vec_store(hd.lse + i, &l, 1, io);
        }
        slow_times_rows(p, kr, sq, sk, br, bc, (int)p->d_v, S, hd.v, hd.ldv, hd.o, p->dtype, hd.ldo, T, Kj, Oi,
                        io);                                                /* O = P V */
    }
}

const fa_cpu_algo fa_cpu_standard_fwd = {FA_CPU_LAYOUT(fwd_thread_layout, fwd_tiles, NULL, char), fwd_run, 0};

/* ---- backward ---- */

/* A thread's slice: tiles Qi, Oi, Ci (Br rows), Kj, Vj (Bc rows), each max(d, dv) wide (they hold rows of q, k, dq,
 * dk or of v, out, dout, dv), T, U (Br x Bc), L, D (Br), and in slow memory the head's P and dS (sq x sk) and fp32 dK
 * (sk x d), dV (sk x dv) accumulators. */
typedef struct bwd_tiles {
    float *Qi, *Oi, *Ci, *Kj, *Vj, *T, *U, *L, *D, *P, *dS, *dK, *dV;
} bwd_tiles;

static void bwd_thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *tiles) {
    const fa_problem *p = problem;
    bwd_tiles *t = tiles;
    const size_t d = (size_t)p->d, dv = (size_t)p->d_v, w = d > dv ? d : dv;
    const size_t br = (size_t)pl->block_q, bc = (size_t)pl->block_k;
    t->Qi = fa_take_f32(a, br * w);
    t->Oi = fa_take_f32(a, br * w);
    t->Ci = fa_take_f32(a, br * w);
    t->Kj = fa_take_f32(a, bc * w);
    t->Vj = fa_take_f32(a, bc * w);
    t->T = fa_take_f32(a, br * bc);
    t->U = fa_take_f32(a, br * bc);
    t->L = fa_take_f32(a, br);
    t->D = fa_take_f32(a, br);
    t->P = fa_take_f32(a, (size_t)(p->sq_max * p->sk_max));
    t->dS = fa_take_f32(a, (size_t)(p->sq_max * p->sk_max));
    t->dK = fa_take_f32(a, (size_t)p->sk_max * d);
    t->dV = fa_take_f32(a, (size_t)p->sk_max * dv);
}

static void bwd_run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    const int d = (int)p->d, dv = (int)p->d_v, br = pl->block_q, bc = pl->block_k;
    const int64_t group = p->hq / p->hk, items = p->batch * p->hk;
    const size_t es = fa_dtype_size(p->dtype);

#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t it = 0; it < items; it++) {
        bwd_tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *Qi = t.Qi, *Oi = t.Oi, *Ci = t.Ci, *Kj = t.Kj, *Vj = t.Vj, *T = t.T, *U = t.U, *L = t.L, *D = t.D;
        float *P = t.P, *dS = t.dS, *dK = t.dK, *dV = t.dV;
        const int64_t b = it / p->hk, hk = it % p->hk;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;
        memset(Kj, 0, (size_t)bc * (d > dv ? d : dv) * 4);                  /* dK = dV = 0 (fp32, slow) */
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_store(dK + j0 * d, FA_DTYPE_F32, d, Kj, d, cols, d, io);
            fa_tile_store(dV + j0 * dv, FA_DTYPE_F32, dv, Kj, dv, cols, dv, io);
        }
        for (int64_t g = 0; g < group; g++) {
            fa_head hq;
            fa_cpu_head(p, b, hk * group + g, &hq);
            materialise_scores(p, kr, &hq, br, bc, Qi, Kj, T, P, io);       /* S */
            for (int64_t i0 = 0; i0 < sq; i0 += br) {                       /* dP = dO Vᵀ, stored in dS */
                const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                fa_tile_load(Qi, dv, (const char *)hq.dout + i0 * hq.lddo * es, p->dtype, hq.lddo, rows, dv, io);
                for (int64_t j0 = 0; j0 < sk; j0 += bc) {
                    const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
                    fa_tile_load(Vj, dv, (const char *)hq.v + j0 * hq.ldv * es, p->dtype, hq.ldv, cols, dv, io);
                    kr->gemm_abt(rows, cols, dv, Qi, dv, Vj, dv, T, cols);
                    fa_tile_store(dS + i0 * sk + j0, FA_DTYPE_F32, sk, T, cols, rows, cols, io);
                }
                /* D = rowsum(dO ∘ O) */
                fa_tile_load(Oi, dv, (const char *)hq.o + i0 * hq.ldo * es, p->dtype, hq.ldo, rows, dv, io);
                for (int r = 0; r < rows; r++) {
                    float acc = 0;
                    for (int x = 0; x < dv; x++) acc += Qi[(int64_t)r * dv + x] * Oi[(int64_t)r * dv + x];
                    D[r] = acc;
                }
                fa_vec_load(L, hq.lse + i0, rows, io);
                /* P = exp(S − LSE), dS = scale · P ∘ (dP − D) (∘ (1 − tanh²) with softcap), tile by tile */
                for (int64_t j0 = 0; j0 < sk; j0 += bc) {
                    const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
                    fa_tile_load(T, cols, P + i0 * sk + j0, FA_DTYPE_F32, sk, rows, cols, io);
                    fa_tile_load(U, cols, dS + i0 * sk + j0, FA_DTYPE_F32, sk, rows, cols, io);
                    for (int r = 0; r < rows; r++)
                        for (int c = 0; c < cols; c++) {
                            float s = T[r * cols + c];
                            float pv = (L[r] == -INFINITY || s == -INFINITY) ? 0.0f : expf(s - L[r]);
                            float ds = pv * (U[r * cols + c] - D[r]);
                            if (p->softcap > 0 && pv != 0) { float th = s / p->softcap; ds *= 1.0f - th * th; }
                            T[r * cols + c] = pv;
                            U[r * cols + c] = ds * p->scale;
                        }
                    fa_tile_store(P + i0 * sk + j0, FA_DTYPE_F32, sk, T, cols, rows, cols, io);
                    fa_tile_store(dS + i0 * sk + j0, FA_DTYPE_F32, sk, U, cols, rows, cols, io);
                }
            }
            slow_t_times_rows(p, kr, sq, sk, br, bc, dv, P, hq.dout, hq.lddo, dV, T, Qi, Kj, io); /* dV += Pᵀ dO */
            slow_t_times_rows(p, kr, sq, sk, br, bc, d, dS, hq.q, hq.ldq, dK, T, Qi, Kj, io);     /* dK += dSᵀ Q */
            slow_times_rows(p, kr, sq, sk, br, bc, d, dS, hq.k, hq.ldk, hq.dq, p->dtype, hq.lddq, T, Vj, Ci,
                            io);                                                                    /* dQ = dS K */
        }
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {                           /* dK, dV in the dtype */
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Kj, d, dK + j0 * d, FA_DTYPE_F32, d, cols, d, io);
            fa_tile_store((char *)hd.dk + j0 * hd.lddk * es, p->dtype, hd.lddk, Kj, d, cols, d, io);
            fa_tile_load(Kj, dv, dV + j0 * dv, FA_DTYPE_F32, dv, cols, dv, io);
            fa_tile_store((char *)hd.dv + j0 * hd.lddv * es, p->dtype, hd.lddv, Kj, dv, cols, dv, io);
        }
    }
}

const fa_cpu_algo fa_cpu_standard_bwd = {FA_CPU_LAYOUT(bwd_thread_layout, bwd_tiles, NULL, char), bwd_run, 0};

