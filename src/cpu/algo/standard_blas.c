/* FA_ALGO_STANDARD through a system CBLAS (built with FA_HAVE_CBLAS, set by src/cpu/sources.cmake when OpenBLAS
 * is found): the algorithm of standard.c with cblas_sgemm calls on whole heads, in row panels of
 * FA_CPU_BLAS_PANEL queries — the baseline a user would write (kernel "cpu.standard.blas"). The counted traffic
 * follows the same model: S and P (and dP, dS) are N x N fp32 matrices in slow memory. */
#include "cpu/blas.h"
#include "cpu/cpu.h"

#include <cblas.h>
#include <string.h>

/* Rows of one head (d wide: dqk or dv) as a dense fp32 matrix: the tensor itself (f32) or a converted copy in buf
 * (f16/bf16). Not counted here: the callers count each operand where a product reads it. */
static const float *head_f32(const fa_problem *p, int d, const void *src, int64_t ld, int64_t rows, float *buf,
                             int64_t *ldo, fa_io *io) {
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
 * caller's setting is untouched; without it a 1-thread context would still run a BLAS team of several. */
static void fa_cpu_blas_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

#define STD_PANEL FA_CPU_BLAS_PANEL

/* ---- forward ---- */

/* A thread's slice: the head's S (sq x sk), fp32 copies of Q, O, K, V for f16/bf16 (O, V dv wide), and the LSE
 * row. */
typedef struct fwd_bufs {
    float *S, *Qb, *Ob, *Kb, *Vb, *L;
} fwd_bufs;

static void fwd_thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *tiles) {
    const fa_problem *p = problem;
    fwd_bufs *t = tiles;
    (void)pl;
    const size_t sq = (size_t)p->q.seqlen, sk = (size_t)p->k.seqlen, d = (size_t)p->d, dv = (size_t)p->d_v;
    const int conv = p->dtype != FA_DTYPE_F32;
    t->S = fa_take_f32(a, sq * sk);
    t->Qb = conv ? fa_take_f32(a, sq * d) : NULL;
    t->Ob = conv ? fa_take_f32(a, sq * dv) : NULL;
    t->Kb = conv ? fa_take_f32(a, sk * d) : NULL;
    t->Vb = conv ? fa_take_f32(a, sk * dv) : NULL;
    t->L = fa_take_f32(a, sq);
}

static void fwd_run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    (void)pl;
    const int d = (int)p->d, dv = (int)p->d_v;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t sq = p->q.seqlen, sk = p->k.seqlen, items = p->batch * p->hq;
    const int conv = p->dtype != FA_DTYPE_F32;
    /* many heads: one head per thread, single-threaded BLAS inside; one head: BLAS threads inside the head */
    const int outer = items >= f->threads ? f->threads : 1;
    const int blas_was = fa_cpu_blas_set_threads(outer == 1 ? f->threads : 1);

#pragma omp parallel for schedule(dynamic, 1) num_threads(outer)
    for (int64_t it = 0; it < items; it++) {
        fa_cpu_blas_threads(outer == 1 ? f->threads : 1);
        fwd_bufs t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *S = t.S, *Qb = t.Qb, *Ob = t.Ob, *Kb = t.Kb, *Vb = t.Vb, *L = t.L;
        fa_head hd;
        fa_cpu_head(p, it / p->hq, it % p->hq, &hd);
        int64_t ldq, ldk, ldv;
        const float *Q = head_f32(p, d, hd.q, hd.ldq, sq, Qb, &ldq, io);
        const float *K = head_f32(p, d, hd.k, hd.ldk, sk, Kb, &ldk, io);
        const float *V = head_f32(p, dv, hd.v, hd.ldv, sk, Vb, &ldv, io);
        float *O = conv ? Ob : (float *)hd.o;
        const int64_t ldo = conv ? dv : hd.ldo;
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
                    if (hd.sink) fa_sink_join(-INFINITY, 0, *hd.sink, &L[i0 + r]); /* LSE = sink */
                    continue;
                }
                kr->exp_rows(1, n, s, n, 1.0f, &mx);
                for (int c = 0; c < n; c++) sum += s[c];
                L[i0 + r] = mx + logf(sum);
                const float inv = hd.sink ? fa_sink_join(mx, sum, *hd.sink, &L[i0 + r]) : 1.0f / sum; /* core/sink.h */
                kr->scale_rows(1, n, s, n, &inv);
            }
            io->read += (int64_t)rows * (hi - lo) * 4;
            io->written += (int64_t)rows * (hi - lo) * 4;
            if (hi > lo)                                                           /* O = P V */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dv, (int)(hi - lo), 1.0f, S + i0 * sk + lo,
                            (int)sk, V + lo * ldv, (int)ldv, 0.0f, O + i0 * ldo, (int)ldo);
            else
                for (int r = 0; r < rows; r++) memset(O + (i0 + r) * ldo, 0, (size_t)dv * 4);
            io->read += (int64_t)rows * (hi - lo) * 4 + (hi - lo) * dv * (int64_t)es;
        }
        if (conv)
            for (int64_t r0 = 0; r0 < sq; r0 += 4096) {
                const int n = (int)(sq - r0 < 4096 ? sq - r0 : 4096);
                fa_tile_store((char *)hd.o + r0 * hd.ldo * es, p->dtype, hd.ldo, O + r0 * dv, dv, n, dv, io);
            }
        else
            io->written += sq * dv * 4;
        if (hd.lse) fa_vec_store(hd.lse, L, (int)sq, io);
    }
    if (blas_was > 0) fa_cpu_blas_set_threads(blas_was);
}

const fa_cpu_algo fa_cpu_standard_blas_fwd = {FA_CPU_LAYOUT(fwd_thread_layout, fwd_bufs, NULL, char), fwd_run, 0};

/* ---- backward ---- */

/* A thread's slice: the head's P, dS (sq x sk); fp32 copies of Q, dO, dQ, O, K, V for f16/bf16 (dO, O, V dv wide);
 * fp32 dK, dV accumulators; the LSE and D rows. */
typedef struct bwd_bufs {
    float *P, *dS, *Qb, *dOb, *dQb, *Ob, *Kb, *Vb, *dK, *dV, *L, *Dr;
} bwd_bufs;

static void bwd_thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *tiles) {
    const fa_problem *p = problem;
    bwd_bufs *t = tiles;
    (void)pl;
    const size_t sq = (size_t)p->q.seqlen, sk = (size_t)p->k.seqlen, d = (size_t)p->d, dv = (size_t)p->d_v;
    const int conv = p->dtype != FA_DTYPE_F32;
    t->P = fa_take_f32(a, sq * sk);
    t->dS = fa_take_f32(a, sq * sk);
    t->Qb = conv ? fa_take_f32(a, sq * d) : NULL;
    t->dOb = conv ? fa_take_f32(a, sq * dv) : NULL;
    t->dQb = conv ? fa_take_f32(a, sq * d) : NULL;
    t->Ob = conv ? fa_take_f32(a, sq * dv) : NULL;
    t->Kb = conv ? fa_take_f32(a, sk * d) : NULL;
    t->Vb = conv ? fa_take_f32(a, sk * dv) : NULL;
    t->dK = fa_take_f32(a, sk * d);
    t->dV = fa_take_f32(a, sk * dv);
    t->L = fa_take_f32(a, sq);
    t->Dr = fa_take_f32(a, sq);
}

static void bwd_run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    (void)pl;
    const int d = (int)p->d, dv = (int)p->d_v;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t sq = p->q.seqlen, sk = p->k.seqlen, group = p->hq / p->hk, items = p->batch * p->hk;
    const int conv = p->dtype != FA_DTYPE_F32;
    const int outer = items >= f->threads ? f->threads : 1;
    const int blas_was = fa_cpu_blas_set_threads(outer == 1 ? f->threads : 1);

#pragma omp parallel for schedule(dynamic, 1) num_threads(outer)
    for (int64_t it = 0; it < items; it++) {
        fa_cpu_blas_threads(outer == 1 ? f->threads : 1);
        bwd_bufs t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *P = t.P, *dS = t.dS, *Qb = t.Qb, *dOb = t.dOb, *dQb = t.dQb, *Ob = t.Ob, *Kb = t.Kb, *Vb = t.Vb;
        float *dK = t.dK, *dV = t.dV, *L = t.L, *Dr = t.Dr;
        const int64_t b = it / p->hk, hk = it % p->hk;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        int64_t ldk, ldv;
        const float *K = head_f32(p, d, hd.k, hd.ldk, sk, Kb, &ldk, io);
        const float *V = head_f32(p, dv, hd.v, hd.ldv, sk, Vb, &ldv, io);
        memset(dK, 0, (size_t)sk * d * 4);                                          /* dK = dV = 0 (fp32, slow) */
        memset(dV, 0, (size_t)sk * dv * 4);
        io->written += sk * (d + dv) * 4;
        for (int64_t g = 0; g < group; g++) {
            fa_head hq;
            fa_cpu_head(p, b, hk * group + g, &hq);
            int64_t ldq, lddo;
            const float *Q = head_f32(p, d, hq.q, hq.ldq, sq, Qb, &ldq, io);
            const float *dO = head_f32(p, dv, hq.dout, hq.lddo, sq, dOb, &lddo, io);
            fa_vec_load(L, hq.lse, (int)sq, io);
            if (conv) { /* f16/bf16: D = rowsum(dO ∘ O) from the rounded output, as FLASH1/FLASH2 must (below) */
                int64_t ldo;
                const float *O = head_f32(p, dv, hq.o, hq.ldo, sq, Ob, &ldo, io);
                kr->rowdots((int)sq, dv, dO, (int)lddo, O, (int)ldo, Dr);
                io->read += sq * dv * (int64_t)es;
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
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, dv, 1.0f, dO + i0 * lddo, (int)lddo,
                            V + lo * ldv, (int)ldv, 0.0f, dS + i0 * sk + lo, (int)sk); /* dP = dO Vᵀ */
                io->read += ((int64_t)rows + n) * (d + dv) * (int64_t)es;              /* Q, dO panels; K, V ranges */
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
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, dv, rows, 1.0f, P + i0 * sk + lo, (int)sk,
                            dO + i0 * lddo, (int)lddo, 1.0f, dV + lo * dv, dv);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, rows, 1.0f, dS + i0 * sk + lo, (int)sk,
                            Q + i0 * ldq, (int)ldq, 1.0f, dK + lo * d, d);
                io->read += 2 * (int64_t)rows * n * 4 + (int64_t)rows * (d + dv) * es + (int64_t)n * (d + dv) * 4;
                io->written += (int64_t)n * (d + dv) * 4;
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
            fa_tile_store((char *)hd.dv + r0 * hd.lddv * es, p->dtype, hd.lddv, dV + r0 * dv, dv, n, dv, io);
        }
    }
    if (blas_was > 0) fa_cpu_blas_set_threads(blas_was);
}

const fa_cpu_algo fa_cpu_standard_blas_bwd = {FA_CPU_LAYOUT(bwd_thread_layout, bwd_bufs, NULL, char), bwd_run, 0};
