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
 * With a system CBLAS (FA_HAVE_CBLAS, set by src/cpu/sources.cmake when OpenBLAS is found) the products are
 * cblas_sgemm calls on whole heads — the baseline a user would write (kernel "cpu.standard.blas"); without it they
 * go through the same tile kernels as FLASH1/FLASH2 (kernel "cpu.standard"). The counted traffic is the same
 * model either way: S and P (and dP, dS) are N x N fp32 matrices in slow memory. */
#include "cpu/fast.h"

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

static fa_status standard_forward_tiled(fa_context *ctx, const fa_problem *p, fa_stats *st) {
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

static fa_status standard_backward_tiled(fa_context *ctx, const fa_problem *p, fa_stats *st) {
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

#ifdef FA_HAVE_CBLAS
#include <cblas.h>
#include <limits.h>

/* Rows of one head as a dense fp32 matrix: the tensor itself (f32) or a converted copy in buf (f16/bf16).
 * Not counted here: the callers count each operand where a product reads it. */
static const float *head_f32(const fa_problem *p, const void *src, int64_t ld, int64_t rows, float *buf, int64_t *ldo,
                             fa_io *io) {
    const int d = (int)p->d;
    if (p->dtype == FA_DTYPE_F32) {
        *ldo = ld;
        return (const float *)src;
    }
    fa_io scratch = *io;
    for (int64_t r0 = 0; r0 < rows; r0 += 4096) {
        const int n = (int)(rows - r0 < 4096 ? rows - r0 : 4096);
        fa_tile_load(buf + r0 * d, d, (const char *)src + r0 * ld * 2, p->dtype, ld, n, d, &scratch);
    }
    *ldo = d;
    return buf;
}

/* Keys visible to rows [i0, i1): [*lo, *hi), rounded out to 16 (whole vectors for the row passes). */
static void panel_keys(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int64_t i1, int64_t *lo, int64_t *hi) {
    fa_cpu_block_keys(p, sq, sk, i0, i1, lo, hi);
    *lo = *lo / 16 * 16;
    if (*hi < *lo) *hi = *lo;
}

/* S[i][lo..hi) = scale·Q Kᵀ for a panel of query rows, then softcap and the mask (−∞); returns nothing. */
static void scores_blas(const fa_problem *p, int64_t sq, int64_t sk, int64_t i0, int rows, int64_t lo, int64_t hi,
                        const float *Q, int64_t ldq, const float *K, int64_t ldk, float *S, int64_t lds) {
    const int d = (int)p->d;
    if (hi <= lo) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, (int)(hi - lo), d, p->scale, Q + i0 * ldq, (int)ldq,
                K + lo * ldk, (int)ldk, 0.0f, S + i0 * lds + lo, (int)lds);
    for (int r = 0; r < rows; r++) {
        float *s = S + (i0 + r) * lds;
        if (p->softcap > 0) {
            const float cap = p->softcap, inv = 1.0f / cap;
            for (int64_t c = lo; c < hi; c++) s[c] = cap * tanhf(s[c] * inv);
        }
        int64_t a, b;
        fa_key_range(p, sq, sk, i0 + r, &a, &b);
        for (int64_t c = lo; c < hi && c < a; c++) s[c] = -INFINITY;
        for (int64_t c = b > lo ? b : lo; c < hi; c++) s[c] = -INFINITY;
    }
}

/* The OpenMP OpenBLAS sizes its own team from the calling task's nthreads-var: give it the context's thread count
 * (one head at a time) or 1 (one head per thread). The ICV is private to this region's implicit task, so the
 * caller's setting is untouched. Without it a --threads 1 context still ran a 2-thread BLAS team. */
static void fa_cpu_blas_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

#define STD_PANEL 256 /* query rows per sgemm panel (lets a causal mask skip the masked key range) */

/* BLAS chooses its own blocking: explicit tile sizes (--block-q/--block-k, the stats tests) and varlen batches run
 * the tiled loop instead, whose counted traffic follows the per-tile model exactly. */
/* sgemm takes a leading dimension in [d, INT_MAX] only (else it prints and does nothing): f32 views outside that
 * range (stride_seq 0 broadcasts, overlapping rows, huge strides) run the tiled loop too; f16/bf16 are converted
 * into dense buffers first. With these checks every sgemm argument below is valid: BLAS's error handler is
 * unreachable. */
static int blas_ld(const fa_problem *p, const fa_tensor *t) {
    return p->dtype != FA_DTYPE_F32 || (t->stride_seq >= p->d && t->stride_seq <= INT_MAX);
}
static int use_blas(const fa_problem *p) {
    return !p->cu_q && !p->cu_k && !p->block_q && !p->block_k && p->k.seqlen <= INT_MAX && blas_ld(p, &p->q) &&
           blas_ld(p, &p->k) && blas_ld(p, &p->v) && blas_ld(p, &p->o) &&
           (!p->is_backward || (blas_ld(p, &p->dout) && blas_ld(p, &p->dq)));
}

fa_status fa_cpu_standard_forward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    if (!use_blas(p)) return standard_forward_tiled(ctx, p, st);
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t sq = p->q.seqlen, sk = p->k.seqlen, items = p->batch * p->hq;
    const int conv = p->dtype != FA_DTYPE_F32;
    const size_t sS = fa_align64((size_t)(sq * sk) * 4), sQ = conv ? fa_align64((size_t)(sq * d) * 4) : 0;
    const size_t sK = conv ? fa_align64((size_t)(sk * d) * 4) : 0;
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, sS + 2 * sQ + 2 * sK + fa_align64((size_t)sq * 4), 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    /* many heads: one head per thread, single-threaded BLAS inside; one head: BLAS threads inside the head */
    const int outer = items >= w.threads ? w.threads : 1;

#pragma omp parallel for schedule(dynamic, 1) num_threads(outer)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        fa_cpu_blas_threads(outer == 1 ? w.threads : 1);
        char *mem = fa_cpu_ws_thread(&w, t);
        float *S = (float *)mem, *Qb = (float *)(mem + sS), *Ob = (float *)(mem + sS + sQ);
        float *Kb = (float *)(mem + sS + 2 * sQ), *Vb = (float *)(mem + sS + 2 * sQ + sK);
        float *L = (float *)(mem + sS + 2 * sQ + 2 * sK);
        fa_io *io = &w.io[t];
        fa_head hd;
        fa_cpu_head(p, it / p->hq, it % p->hq, &hd);
        int64_t ldq, ldk, ldv;
        const float *Q = head_f32(p, hd.q, hd.ldq, sq, Qb, &ldq, io);
        const float *K = head_f32(p, hd.k, hd.ldk, sk, Kb, &ldk, io);
        const float *V = head_f32(p, hd.v, hd.ldv, sk, Vb, &ldv, io);
        float *O = conv ? Ob : (float *)hd.o;
        const int64_t ldo = conv ? d : hd.ldo;
        for (int64_t i0 = 0; i0 < sq; i0 += STD_PANEL) {
            const int rows = (int)(sq - i0 < STD_PANEL ? sq - i0 : STD_PANEL);
            int64_t lo, hi;
            panel_keys(p, sq, sk, i0, i0 + rows, &lo, &hi);
            scores_blas(p, sq, sk, i0, rows, lo, hi, Q, ldq, K, ldk, S, sk);       /* S = scale·Q Kᵀ */
            io->read += ((int64_t)rows + (hi - lo)) * d * (int64_t)es;             /* Q panel, K range */
            io->written += (int64_t)rows * (hi - lo) * 4;
            for (int r = 0; r < rows; r++) {                                       /* P = softmax(S) */
                float *s = S + (i0 + r) * sk + lo, mx = -INFINITY, sum = 0;
                const int n = (int)(hi - lo);
                for (int c = 0; c < n; c++) mx = s[c] > mx ? s[c] : mx;
                if (mx == -INFINITY) {
                    memset(s, 0, (size_t)n * 4);
                    L[i0 + r] = -INFINITY;
                    continue;
                }
                kr->exp_rows(1, n, s, n, 1.0f, &mx);
                for (int c = 0; c < n; c++) sum += s[c];
                const float inv = 1.0f / sum;
                kr->scale_rows(1, n, s, n, &inv);
                L[i0 + r] = mx + logf(sum);
            }
            io->read += (int64_t)rows * (hi - lo) * 4;
            io->written += (int64_t)rows * (hi - lo) * 4;
            if (hi > lo)                                                           /* O = P V */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, (int)(hi - lo), 1.0f, S + i0 * sk + lo,
                            (int)sk, V + lo * ldv, (int)ldv, 0.0f, O + i0 * ldo, (int)ldo);
            else
                for (int r = 0; r < rows; r++) memset(O + (i0 + r) * ldo, 0, (size_t)d * 4);
            io->read += (int64_t)rows * (hi - lo) * 4 + (hi - lo) * d * (int64_t)es;
        }
        if (conv)
            for (int64_t r0 = 0; r0 < sq; r0 += 4096) {
                const int n = (int)(sq - r0 < 4096 ? sq - r0 : 4096);
                fa_tile_store((char *)hd.o + r0 * hd.ldo * es, p->dtype, hd.ldo, O + r0 * d, d, n, d, io);
            }
        else
            io->written += sq * d * 4;
        if (hd.lse) fa_vec_store(hd.lse, L, (int)sq, io);
    }
    fa_cpu_ws_finish(&w, st, "cpu.standard.blas", (int)(sq < STD_PANEL ? sq : STD_PANEL), (int)sk,
                     w.per * (size_t)w.threads);
    return FA_OK;
}

fa_status fa_cpu_standard_backward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    if (!use_blas(p)) return standard_backward_tiled(ctx, p, st);
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t sq = p->q.seqlen, sk = p->k.seqlen, group = p->hq / p->hk, items = p->batch * p->hk;
    const int conv = p->dtype != FA_DTYPE_F32;
    const size_t sS = fa_align64((size_t)(sq * sk) * 4), sQ = fa_align64((size_t)(sq * d) * 4);
    const size_t sK = fa_align64((size_t)(sk * d) * 4);
    /* per thread: P, dS (N x N); Q, dO, dQ (converted, f16/bf16 only); K, V (converted); dK, dV fp32 accumulators */
    const size_t per = 2 * sS + (conv ? 4 * sQ + 2 * sK : 0) + 2 * sK + 2 * fa_align64((size_t)sq * 4);
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, per, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int outer = items >= w.threads ? w.threads : 1;

#pragma omp parallel for schedule(dynamic, 1) num_threads(outer)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        fa_cpu_blas_threads(outer == 1 ? w.threads : 1);
        char *mem = fa_cpu_ws_thread(&w, t);
        float *P = (float *)mem, *dS = (float *)(mem + sS);
        char *x = mem + 2 * sS;
        float *Qb = NULL, *dOb = NULL, *dQb = NULL, *Kb = NULL, *Vb = NULL, *Ob = NULL;
        if (conv) {
            Qb = (float *)x, dOb = (float *)(x + sQ), dQb = (float *)(x + 2 * sQ), Ob = (float *)(x + 3 * sQ);
            Kb = (float *)(x + 4 * sQ), Vb = (float *)(x + 4 * sQ + sK);
            x += 4 * sQ + 2 * sK;
        }
        float *dK = (float *)x, *dV = (float *)(x + sK), *L = (float *)(x + 2 * sK);
        float *Dr = L + fa_align64((size_t)sq * 4) / 4;
        fa_io *io = &w.io[t];
        const int64_t b = it / p->hk, hk = it % p->hk;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        int64_t ldk, ldv;
        const float *K = head_f32(p, hd.k, hd.ldk, sk, Kb, &ldk, io);
        const float *V = head_f32(p, hd.v, hd.ldv, sk, Vb, &ldv, io);
        memset(dK, 0, (size_t)sk * d * 4);                                          /* dK = dV = 0 (fp32, slow) */
        memset(dV, 0, (size_t)sk * d * 4);
        io->written += 2 * sk * d * 4;
        for (int64_t g = 0; g < group; g++) {
            fa_head hq;
            fa_cpu_head(p, b, hk * group + g, &hq);
            int64_t ldq, lddo;
            const float *Q = head_f32(p, hq.q, hq.ldq, sq, Qb, &ldq, io);
            const float *dO = head_f32(p, hq.dout, hq.lddo, sq, dOb, &lddo, io);
            fa_vec_load(L, hq.lse, (int)sq, io);
            if (conv) { /* f16/bf16: D = rowsum(dO ∘ O) from the rounded output, as FLASH1/FLASH2 must (below) */
                int64_t ldo;
                const float *O = head_f32(p, hq.o, hq.ldo, sq, Ob, &ldo, io);
                for (int64_t r = 0; r < sq; r++) Dr[r] = fa_cpu_rowdot(d, dO + r * lddo, O + r * ldo);
                io->read += sq * d * (int64_t)es;
            }
            float *dQ = conv ? dQb : (float *)hq.dq;
            const int64_t lddq = conv ? d : hq.lddq;
            for (int64_t i0 = 0; i0 < sq; i0 += STD_PANEL) {
                const int rows = (int)(sq - i0 < STD_PANEL ? sq - i0 : STD_PANEL);
                int64_t lo, hi;
                panel_keys(p, sq, sk, i0, i0 + rows, &lo, &hi);
                const int n = (int)(hi - lo);
                if (n <= 0) {
                    for (int r = 0; r < rows; r++) memset(dQ + (i0 + r) * lddq, 0, (size_t)d * 4);
                    continue;
                }
                scores_blas(p, sq, sk, i0, rows, lo, hi, Q, ldq, K, ldk, P, sk);   /* S */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, d, 1.0f, dO + i0 * lddo, (int)lddo,
                            V + lo * ldv, (int)ldv, 0.0f, dS + i0 * sk + lo, (int)sk); /* dP = dO Vᵀ */
                io->read += 2 * ((int64_t)rows + n) * d * (int64_t)es;                 /* Q, dO panels; K, V ranges */
                io->written += 2 * (int64_t)rows * n * 4;                              /* S, dP */
                for (int r = 0; r < rows; r++) {
                    float *s = P + (i0 + r) * sk + lo, *dp = dS + (i0 + r) * sk + lo;
                    const float lse = L[i0 + r];
                    if (lse == -INFINITY) { /* a row that sees no key: zero gradients */
                        memset(s, 0, (size_t)n * 4);
                        memset(dp, 0, (size_t)n * 4);
                        continue;
                    }
                    /* D = rowsum(dO ∘ O) = rowsum(P ∘ dP). f32: the second form (O is not rounded; exact zeros for
                     * a one-hot P). f16/bf16: the first, from the rounded O the caller holds, so that STANDARD sees
                     * the same conditioning as FLASH1/FLASH2 (whose tiles cannot form P ∘ dP before dS) */
                    float dsum = 0;
                    if (p->softcap > 0) { /* dS ∘ (1 − (s/cap)²) needs the capped scores: scalar path */
                        for (int c = 0; c < n; c++) dsum += (s[c] == -INFINITY ? 0.0f : expf(s[c] - lse)) * dp[c];
                        if (conv) dsum = Dr[i0 + r];
                        for (int c = 0; c < n; c++) {
                            const float th = s[c] / p->softcap;
                            const float pv = s[c] == -INFINITY ? 0.0f : expf(s[c] - lse);
                            dp[c] = pv == 0 ? 0.0f : p->scale * pv * (dp[c] - dsum) * (1.0f - th * th);
                            s[c] = pv;
                        }
                        continue;
                    }
                    kr->exp_rows(1, n, s, n, 1.0f, &lse);                          /* P = exp(S − LSE) */
                    if (conv) dsum = Dr[i0 + r];
                    else
                        for (int c = 0; c < n; c++) dsum += s[c] * dp[c];
                    kr->ds_rows(1, n, s, n, dp, n, &dsum, p->scale);               /* dS = scale·P ∘ (dP − D) */
                }
                io->read += 4 * (int64_t)rows * n * 4; /* P, dP read for D and for dS */
                io->written += 2 * (int64_t)rows * n * 4;
                /* dV[lo, hi) += Pᵀ dO, dK[lo, hi) += dSᵀ Q (fp32 accumulators, summed over the panels and the group) */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, rows, 1.0f, P + i0 * sk + lo, (int)sk,
                            dO + i0 * lddo, (int)lddo, 1.0f, dV + lo * d, d);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, rows, 1.0f, dS + i0 * sk + lo, (int)sk,
                            Q + i0 * ldq, (int)ldq, 1.0f, dK + lo * d, d);
                io->read += 2 * (int64_t)rows * n * 4 + 2 * (int64_t)rows * d * es + 2 * (int64_t)n * d * 4;
                io->written += 2 * (int64_t)n * d * 4;
                /* dQ = dS K (this panel's rows) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, n, 1.0f, dS + i0 * sk + lo, (int)sk,
                            K + lo * ldk, (int)ldk, 0.0f, dQ + i0 * lddq, (int)lddq);
                io->read += (int64_t)rows * n * 4 + (int64_t)n * d * es;
                io->written += (int64_t)rows * d * 4;
            }
            if (conv)
                for (int64_t r0 = 0; r0 < sq; r0 += 4096) {
                    const int n = (int)(sq - r0 < 4096 ? sq - r0 : 4096);
                    fa_tile_store((char *)hq.dq + r0 * hq.lddq * es, p->dtype, hq.lddq, dQ + r0 * d, d, n, d, io);
                }
        }
        for (int64_t r0 = 0; r0 < sk; r0 += 4096) {                                 /* dK, dV in the dtype */
            const int n = (int)(sk - r0 < 4096 ? sk - r0 : 4096);
            fa_tile_store((char *)hd.dk + r0 * hd.lddk * es, p->dtype, hd.lddk, dK + r0 * d, d, n, d, io);
            fa_tile_store((char *)hd.dv + r0 * hd.lddv * es, p->dtype, hd.lddv, dV + r0 * d, d, n, d, io);
        }
    }
    fa_cpu_ws_finish(&w, st, "cpu.standard.blas", (int)(sq < STD_PANEL ? sq : STD_PANEL), (int)sk,
                     w.per * (size_t)w.threads);
    return FA_OK;
}
#else
fa_status fa_cpu_standard_forward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    return standard_forward_tiled(ctx, p, st);
}
fa_status fa_cpu_standard_backward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    return standard_backward_tiled(ctx, p, st);
}
#endif
