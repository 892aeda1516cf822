/* FA_ALGO_STANDARD on the CPU — attention as a user would write it from the definition, materialising the
 * N x N matrices in slow memory (the baseline of the FlashAttention paper, its Algorithm 0):
 *   S = scale·Q Kᵀ (+softcap, mask)  -> written to slow memory
 *   P = softmax(S) row by row         -> read S, write P (in place)
 *   O = P V                           -> read P, write O
 * Backward recomputes P the same way, then materialises dP = dO Vᵀ and dS = P ∘ (dP − D) (also N x N) and forms
 * dV = Pᵀ dO, dQ = scale·dS K, dK = scale·dSᵀ Q. Work is parallel over batch × heads (forward) and
 * batch × K/V heads (backward, so dK/dV have one writer); each thread owns its S/P (and dP) buffers: Θ(N²)
 * extra memory per thread. The products go through the same tile kernels as FLASH1/FLASH2. */
#include "cpu/cpu.h"

#include <string.h>

/* S (sq x sk, row stride sk, slow memory) = scores of one head, tile by tile. */
static void materialise_scores(const fa_problem *p, const fa_cpu_kernels *kr, const fa_head *hd, int br, int bc,
                               float *Qi, float *Kj, float *T, float *S, fa_io *io) {
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    for (int64_t i0 = 0; i0 < hd->sq; i0 += br) {
        const int rows = (int)(hd->sq - i0 < br ? hd->sq - i0 : br);
        fa_tile_load(Qi, d, (const char *)hd->q + i0 * hd->ldq * es, p->dtype, hd->ldq, rows, d, io);
        for (int64_t j0 = 0; j0 < hd->sk; j0 += bc) {
            const int cols = (int)(hd->sk - j0 < bc ? hd->sk - j0 : bc);
            fa_tile_load(Kj, d, (const char *)hd->k + j0 * hd->ldk * es, p->dtype, hd->ldk, cols, d, io);
            kr->gemm_abt(rows, cols, d, Qi, d, Kj, d, T, cols);
            fa_cpu_scores(p, T, cols, rows, cols, i0, j0, hd->sq, hd->sk);
            fa_tile_store(S + i0 * hd->sk + j0, FA_DTYPE_F32, hd->sk, T, cols, rows, cols, io);
        }
    }
}

/* C (sq x d, fast tiles, stored to dst) = A (sq x sk, slow) · B (sk x d, tensor rows): O = P V, dQ = dS K. */
static void slow_times_rows(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int br, int bc,
                            const float *A, const void *B, int64_t ldb, void *dst, fa_dtype dst_dt, int64_t ldd,
                            float *Ai, float *Bj, float *Ci, fa_io *io) {
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    for (int64_t i0 = 0; i0 < sq; i0 += br) {
        const int rows = (int)(sq - i0 < br ? sq - i0 : br);
        memset(Ci, 0, (size_t)rows * d * 4);
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Ai, cols, A + i0 * sk + j0, FA_DTYPE_F32, sk, rows, cols, io);
            fa_tile_load(Bj, d, (const char *)B + j0 * ldb * es, p->dtype, ldb, cols, d, io);
            kr->gemm_ab_acc(rows, d, cols, Ai, cols, Bj, d, Ci, d);
        }
        fa_tile_store((char *)dst + i0 * ldd * fa_dtype_size(dst_dt), dst_dt, ldd, Ci, d, rows, d, io);
    }
}

/* C (sk x d) += A (sq x sk, slow)ᵀ · B (sq x d, tensor rows), C an fp32 buffer in slow memory: dV, dK. */
static void slow_t_times_rows(const fa_problem *p, const fa_cpu_kernels *kr, int64_t sq, int64_t sk, int br, int bc,
                              const float *A, const void *B, int64_t ldb, float *C, float *Ai, float *Bi, float *Cj,
                              fa_io *io) {
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    for (int64_t j0 = 0; j0 < sk; j0 += bc) {
        const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
        fa_tile_load(Cj, d, C + j0 * d, FA_DTYPE_F32, d, cols, d, io);
        for (int64_t i0 = 0; i0 < sq; i0 += br) {
            const int rows = (int)(sq - i0 < br ? sq - i0 : br);
            fa_tile_load(Ai, cols, A + i0 * sk + j0, FA_DTYPE_F32, sk, rows, cols, io);
            fa_tile_load(Bi, d, (const char *)B + i0 * ldb * es, p->dtype, ldb, rows, d, io);
            kr->gemm_atb_acc(cols, d, rows, Ai, cols, Bi, d, Cj, d);
        }
        fa_tile_store(C + j0 * d, FA_DTYPE_F32, d, Cj, d, cols, d, io);
    }
}

fa_status fa_cpu_standard_forward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    int br, bc;
    fa_cpu_blocks(p, &br, &bc);
    const size_t tq = fa_align64((size_t)br * d * 4), tk = fa_align64((size_t)bc * d * 4);
    const size_t ts = fa_align64((size_t)br * bc * 4), row = fa_align64((size_t)p->sk_max * 4);
    const size_t sS = fa_align64((size_t)(p->sq_max * p->sk_max) * 4);
    const size_t fast = 2 * tq + tk + ts + row;
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, fast + sS, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int64_t items = p->batch * p->hq;

#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        float *Qi = (float *)mem, *Oi = Qi + tq / 4, *Kj = Oi + tq / 4, *T = Kj + tk / 4, *R = T + ts / 4;
        float *S = (float *)(mem + fast);
        fa_io *io = &w.io[t];
        fa_head hd;
        fa_cpu_head(p, it / p->hq, it % p->hq, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;
        materialise_scores(p, kr, &hd, br, bc, Qi, Kj, T, S, io);           /* S = scale·Q Kᵀ */
        for (int64_t i = 0; i < sq; i++) {                                  /* P = softmax(S), in place */
            fa_vec_load(R, S + i * sk, (int)sk, io);
            float mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < sk; j++) mx = R[j] > mx ? R[j] : mx;
            for (int64_t j = 0; j < sk; j++) { R[j] = mx == -INFINITY ? 0.0f : expf(R[j] - mx); sum += R[j]; }
            const float inv = sum > 0 ? 1.0f / sum : 0.0f;
            for (int64_t j = 0; j < sk; j++) R[j] *= inv;
            fa_vec_store(S + i * sk, R, (int)sk, io);
            if (hd.lse) {
                float l = sum > 0 ? mx + logf(sum) : -INFINITY;
                fa_vec_store(hd.lse + i, &l, 1, io);
            }
        }
        slow_times_rows(p, kr, sq, sk, br, bc, S, hd.v, hd.ldv, hd.o, p->dtype, hd.ldo, T, Kj, Oi, io); /* O = P V */
    }
    fa_cpu_ws_finish(&w, st, "cpu.standard", br, bc, w.per * (size_t)w.threads);
    return FA_OK;
}

fa_status fa_cpu_standard_backward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    const int64_t group = p->hq / p->hk;
    const size_t es = fa_dtype_size(p->dtype);
    int br, bc;
    fa_cpu_blocks(p, &br, &bc);
    const size_t tq = fa_align64((size_t)br * d * 4), tk = fa_align64((size_t)bc * d * 4);
    const size_t ts = fa_align64((size_t)br * bc * 4), tv = fa_align64((size_t)br * 4);
    const size_t sS = fa_align64((size_t)(p->sq_max * p->sk_max) * 4);
    const size_t sKV = fa_align64((size_t)(p->sk_max * d) * 4);
    const size_t fast = 3 * tq + 2 * tk + 2 * ts + 2 * tv;
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, fast + 2 * sS + 2 * sKV, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int64_t items = p->batch * p->hk;

#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        float *Qi = (float *)mem, *Oi = Qi + tq / 4, *Ci = Oi + tq / 4, *Kj = Ci + tq / 4, *Vj = Kj + tk / 4;
        float *T = Vj + tk / 4, *U = T + ts / 4, *L = U + ts / 4, *D = L + tv / 4;
        float *P = (float *)(mem + fast), *dS = P + sS / 4, *dK = dS + sS / 4, *dV = dK + sKV / 4;
        fa_io *io = &w.io[t];
        const int64_t b = it / p->hk, hk = it % p->hk;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;
        memset(Kj, 0, tk);                                                  /* dK = dV = 0 (fp32, slow) */
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_store(dK + j0 * d, FA_DTYPE_F32, d, Kj, d, cols, d, io);
            fa_tile_store(dV + j0 * d, FA_DTYPE_F32, d, Kj, d, cols, d, io);
        }
        for (int64_t g = 0; g < group; g++) {
            fa_head hq;
            fa_cpu_head(p, b, hk * group + g, &hq);
            materialise_scores(p, kr, &hq, br, bc, Qi, Kj, T, P, io);       /* S */
            for (int64_t i0 = 0; i0 < sq; i0 += br) {                       /* dP = dO Vᵀ, stored in dS */
                const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                fa_tile_load(Qi, d, (const char *)hq.dout + i0 * hq.lddo * es, p->dtype, hq.lddo, rows, d, io);
                for (int64_t j0 = 0; j0 < sk; j0 += bc) {
                    const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
                    fa_tile_load(Vj, d, (const char *)hq.v + j0 * hq.ldv * es, p->dtype, hq.ldv, cols, d, io);
                    kr->gemm_abt(rows, cols, d, Qi, d, Vj, d, T, cols);
                    fa_tile_store(dS + i0 * sk + j0, FA_DTYPE_F32, sk, T, cols, rows, cols, io);
                }
                /* D = rowsum(dO ∘ O) */
                fa_tile_load(Oi, d, (const char *)hq.o + i0 * hq.ldo * es, p->dtype, hq.ldo, rows, d, io);
                for (int r = 0; r < rows; r++) {
                    float acc = 0;
                    for (int x = 0; x < d; x++) acc += Qi[(int64_t)r * d + x] * Oi[(int64_t)r * d + x];
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
            slow_t_times_rows(p, kr, sq, sk, br, bc, P, hq.dout, hq.lddo, dV, T, Qi, Kj, io);   /* dV += Pᵀ dO */
            slow_t_times_rows(p, kr, sq, sk, br, bc, dS, hq.q, hq.ldq, dK, T, Qi, Kj, io);      /* dK += dSᵀ Q */
            slow_times_rows(p, kr, sq, sk, br, bc, dS, hq.k, hq.ldk, hq.dq, p->dtype, hq.lddq, T, Vj, Ci, io); /* dQ */
        }
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {                           /* dK, dV in the dtype */
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Kj, d, dK + j0 * d, FA_DTYPE_F32, d, cols, d, io);
            fa_tile_store((char *)hd.dk + j0 * hd.lddk * es, p->dtype, hd.lddk, Kj, d, cols, d, io);
            fa_tile_load(Kj, d, dV + j0 * d, FA_DTYPE_F32, d, cols, d, io);
            fa_tile_store((char *)hd.dv + j0 * hd.lddv * es, p->dtype, hd.lddv, Kj, d, cols, d, io);
        }
    }
    fa_cpu_ws_finish(&w, st, "cpu.standard", br, bc, w.per * (size_t)w.threads);
    return FA_OK;
}
