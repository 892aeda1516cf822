/* CPU tile-kernel lab: checks every entry of every kernel table this CPU runs against a float64 loop,
 * then times the attention-shaped products, exp2 and the bf16 dot-product kernel, on 1 thread and on all threads.
 *
 *   cpu_kernels            check + timings
 *   cpu_kernels --peak     machine ceilings: our fp32 / bf16 micro-kernel GFLOP/s (and OpenBLAS sgemm when linked)
 *   cpu_kernels --check    correctness only (exit status 1 on a mismatch)
 *
 * Not a test (timings are not asserted); built by bench/lab/CMakeLists.txt, run by scripts/bench-cpu.sh. */
#include "cpu/simd/kernels.h"
#include "cpu/simd/portable.h"
#include "peak.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef FA_HAVE_CBLAS
#include <cblas.h>
#endif


static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *fbuf(size_t n) {
    float *p = aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64);
    for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}
static uint16_t bf16bits(float x) {
    uint32_t u;
    x = fa_port_bf16(x);
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

static int failures = 0;
static void report(const char *isa, const char *what, double err, double tol) {
    int ok = err <= tol;
    if (!ok) failures++;
    printf("  %-7s %-34s max err %.3g (tol %.3g) %s\n", isa, what, err, tol, ok ? "ok" : "FAIL");
}

/* ---- correctness ---- */

/* max |C − (C0 +) A·B| in double, A(i, p) = A[i·ars + p·acs], B(p, j) = B[p·brs + j·bcs]; C0 NULL = no accumulate. */
static double gemm_err(int m, int n, int k, const float *A, int ars, int acs, const float *B, int brs, int bcs,
                       const float *C0, const float *C, int ldc) {
    double e = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double r = C0 ? C0[i * ldc + j] : 0;
            for (int p = 0; p < k; p++) r += (double)A[i * ars + p * acs] * B[p * brs + j * bcs];
            e = fmax(e, fabs(r - C[i * ldc + j]));
        }
    return e;
}

static void check_gemms(const fa_cpu_kernels *K) {
    static const int shapes[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 64, 128}, {13, 70, 33}, {6, 64, 64}, {67, 129, 17}, {5, 300, 260}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        int lda = k + 3, ldb = n + 5, ldc = n + 1, ldbt = k + 2, ldat = m + 4;
        float *A = fbuf((size_t)m * lda), *B = fbuf((size_t)k * ldb), *Bt = fbuf((size_t)n * ldbt);
        float *At = fbuf((size_t)k * ldat), *C = fbuf((size_t)m * ldc), *C0 = malloc(sizeof(float) * m * ldc);
        memcpy(C0, C, sizeof(float) * m * ldc);
        char name[64];
        /* abt */
        K->gemm_abt(m, n, k, A, lda, Bt, ldbt, C, ldc);
        const double e1 = gemm_err(m, n, k, A, lda, 1, Bt, 1, ldbt, NULL, C, ldc);
        /* A·B, acc = 1 */
        memcpy(C, C0, sizeof(float) * m * ldc);
        K->gemm_nn(m, n, k, A, lda, 1, B, ldb, C, ldc, 1);
        const double e2 = gemm_err(m, n, k, A, lda, 1, B, ldb, 1, C0, C, ldc);
        /* Aᵀ·B, acc = 1 */
        memcpy(C, C0, sizeof(float) * m * ldc);
        K->gemm_nn(m, n, k, At, 1, ldat, B, ldb, C, ldc, 1);
        const double e3 = gemm_err(m, n, k, At, 1, ldat, B, ldb, 1, C0, C, ldc);
        /* gemm_nn, acc = 0, Aᵀ addressing; the padding column after n must stay untouched */
        memcpy(C, C0, sizeof(float) * m * ldc);
        K->gemm_nn(m, n, k, At, 1, ldat, B, ldb, C, ldc, 0);
        double e4 = gemm_err(m, n, k, At, 1, ldat, B, ldb, 1, NULL, C, ldc);
        for (int i = 0; i < m; i++)
            if (ldc > n && C[i * ldc + n] != C0[i * ldc + n]) e4 = INFINITY;
        double tol = 4e-7 * (k + 1);
        snprintf(name, sizeof name, "gemm_abt %dx%dx%d", m, n, k);
        report(K->isa, name, e1, tol);
        snprintf(name, sizeof name, "gemm_nn(A, acc=1) %dx%dx%d", m, n, k);
        report(K->isa, name, e2, tol);
        snprintf(name, sizeof name, "gemm_nn(At, acc=1) %dx%dx%d", m, n, k);
        report(K->isa, name, e3, tol);
        snprintf(name, sizeof name, "gemm_nn(At, acc=0) %dx%dx%d", m, n, k);
        report(K->isa, name, e4, tol);
        free(A); free(B); free(Bt); free(At); free(C); free(C0);
    }
}

static void check_elementwise(const fa_cpu_kernels *K) {
    const int rows = 37, cols = 45, ld = 48;
    float *S = fbuf((size_t)rows * ld), *T = fbuf((size_t)cols * 40), *S0 = malloc(sizeof(float) * rows * ld);
    double e = 0;
    /* pack_t */
    K->pack_t(rows, cols, S, ld, T, 40, 0.5f);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) e = fmax(e, fabs(T[c * 40 + r] - 0.5 * S[r * ld + c]));
    report(K->isa, "pack_t 37x45", e, 0);
    /* exp_rows: values across the whole range, −∞ and large negative */
    for (int i = 0; i < rows * ld; i++) S[i] = 40.0f * S[i] - 20.0f;
    S[5] = -INFINITY;
    S[6] = -200.0f;
    memcpy(S0, S, sizeof(float) * rows * ld);
    float sub[64];
    for (int r = 0; r < rows; r++) sub[r] = 0.25f * r - 3.0f;
    K->exp_rows(rows, cols, S, ld, 0.7f, sub);
    e = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            double x = (double)(float)((double)S0[r * ld + c] * 0.7f - sub[r]); /* rounded once, as the FMA */
            double ref = exp(x);
            double got = S[r * ld + c];
            /* relative error: 4e-7 from exp2, plus the rounding of the exponent x·log2 e (≈ 1e-7·|x|) */
            if (ref < 1e-30) e = fmax(e, got > 1e-30 ? 1.0 : 0.0); /* denormal range: only "tiny" matters */
            else e = fmax(e, fabs(got - ref) / ref / (1.0 + 0.5 * fabs(x)));
        }
    report(K->isa, "exp_rows (rel)", e, 4e-7);
    /* softmax_step_t on a transposed tile, two steps, including an all −∞ column */
    {
        const int nk = 29, nq = 35, lds = 40;
        float *St = fbuf((size_t)nk * lds), *St2 = fbuf((size_t)nk * lds);
        for (int i = 0; i < nk * lds; i++) St[i] *= 8.0f, St2[i] *= 8.0f;
        for (int r = 0; r < nk; r++) St[r * lds + 3] = St2[r * lds + 3] = -INFINITY;
        for (int r = 0; r < nk; r++) St[r * lds + 4] = -INFINITY; /* column 4: first step empty */
        float m[64], l[64], al[64];
        for (int q = 0; q < nq; q++) m[q] = -INFINITY, l[q] = 0;
        const float c = 0.125f * 1.44269504f;
        double em = 0, el = 0, ep = 0;
        K->softmax_step_t(nk, nq, St, lds, c, m, l, al);
        float msave[64];
        memcpy(msave, m, sizeof msave);
        float *S2copy = malloc(sizeof(float) * nk * lds);
        memcpy(S2copy, St2, sizeof(float) * nk * lds);
        K->softmax_step_t(nk, nq, St2, lds, c, m, l, al);
        for (int q = 0; q < nq; q++) {
            double mr = -INFINITY, lr = 0;
            for (int r = 0; r < nk; r++) mr = fmax(mr, (double)S2copy[r * lds + q]);
            mr = fmax(mr, (double)msave[q]);
            double sub2 = isinf(mr) ? 0 : mr;
            double a = exp2((msave[q] - sub2) * (double)c);
            for (int r = 0; r < nk; r++) {
                double p = exp2((S2copy[r * lds + q] - sub2) * (double)c);
                lr += p;
                ep = fmax(ep, fabs(p - St2[r * lds + q]));
            }
            /* l of the first step, recomputed */
            double l1 = 0, s1 = isinf(msave[q]) ? 0 : msave[q] * (double)c;
            (void)s1;
            (void)l1;
            em = fmax(em, (mr == m[q] || (isinf(mr) && isinf(m[q]))) ? 0 : 1);
            ep = fmax(ep, fabs(a - al[q]));
            (void)lr;
        }
        int nan = 0;
        for (int q = 0; q < nq; q++) nan |= isnan(l[q]) || isnan(al[q]);
        el = nan ? 1 : 0;
        el = fmax(el, l[3] == 0 ? 0 : 1); /* all-masked column: l = 0 */
        report(K->isa, "softmax_step_t max", em, 0);
        report(K->isa, "softmax_step_t P, alpha (abs)", ep, 4e-7);
        report(K->isa, "softmax_step_t masked column", el, 0);
        free(St); free(St2); free(S2copy);
    }
    /* qk_softmax_t (tables that have it): two blocks of wide scores, so that m rises inside and across blocks;
     * checked through its invariants P·2^(c·m) = 2^(c·S), ℓ·2^(c·m) = Σ 2^(c·S), alpha = 2^(c·(m_before − m)) */
    if (K->qk_softmax_t) {
        const int nk = 29, nq = 35, d = 20, ldk = 23, ldq = 40, lds = 41;
        float *Kb = fbuf((size_t)2 * nk * ldk), *QT = fbuf((size_t)d * ldq), *P = fbuf((size_t)nk * lds);
        for (int i = 0; i < 2 * nk * ldk; i++) Kb[i] *= 6.0f;
        float m[64], l[64], al[64], m0[64];
        double L[64], ep = 0, el = 0, ea = 0, pmax = 0;
        for (int q = 0; q < nq; q++) m[q] = -INFINITY, l[q] = 0, L[q] = 0;
        const float c = 0.5f;
        int rose[2];
        for (int blk = 0; blk < 2; blk++) {
            const float *Kj = Kb + (size_t)blk * nk * ldk;
            memcpy(m0, m, sizeof m0);
            rose[blk] = K->qk_softmax_t(nk, nq, d, Kj, ldk, QT, ldq, P, lds, c, m, l, al);
            for (int q = 0; q < nq; q++) {
                for (int r = 0; r < nk; r++) {
                    double sr = 0;
                    for (int x = 0; x < d; x++) sr += (double)Kj[r * ldk + x] * QT[x * ldq + q];
                    double e = exp2((double)c * sr);
                    L[q] += e;
                    ep = fmax(ep, fabs(P[r * lds + q] * exp2((double)c * m[q]) / e - 1));
                    pmax = fmax(pmax, P[r * lds + q]);
                }
                el = fmax(el, fabs(l[q] * exp2((double)c * m[q]) / L[q] - 1));
                ea = fmax(ea, fabs(al[q] - (isinf(m0[q]) ? 0 : exp2((double)c * ((double)m0[q] - m[q])))));
            }
        }
        report(K->isa, "qk_softmax_t P (rel)", ep, 1e-5);
        report(K->isa, "qk_softmax_t l (rel)", el, 1e-5);
        report(K->isa, "qk_softmax_t alpha (abs)", ea, 1e-6);
        report(K->isa, "qk_softmax_t P <= 2^slack, rose", pmax <= exp2(FA_SOFTMAX_SLACK) * 1.001 && rose[0] ? 0 : 1, 0);
        free(Kb); free(QT); free(P);
    }
    /* ds_rows, scale_rows */
    {
        float *P = fbuf((size_t)rows * ld), *dP = fbuf((size_t)rows * ld), *dP0 = malloc(sizeof(float) * rows * ld);
        float D[64];
        for (int r = 0; r < rows; r++) D[r] = frand();
        memcpy(dP0, dP, sizeof(float) * rows * ld);
        K->ds_rows(rows, cols, P, ld, dP, ld, D, 0.3f);
        e = 0;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++)
                e = fmax(e, fabs(dP[r * ld + c] - 0.3 * P[r * ld + c] * ((double)dP0[r * ld + c] - D[r])));
        report(K->isa, "ds_rows", e, 1e-6);
        memcpy(dP, dP0, sizeof(float) * rows * ld);
        K->scale_rows(rows, cols, dP, ld, D);
        e = 0;
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) e = fmax(e, fabs(dP[r * ld + c] - (double)dP0[r * ld + c] * D[r]));
        report(K->isa, "scale_rows", e, 1e-7);
        free(P); free(dP); free(dP0);
    }
    free(S); free(T); free(S0);
}

static void check_bf16(const fa_cpu_kernels *K) {
    /* S = K · Qᵀ-style product with pairs along the reduction dim, built through the packing entries */
    const int m = 29, n = 67, k = 38, kp = k / 2; /* A[m][k], B[k][n] */
    float *A = fbuf((size_t)m * k), *B = fbuf((size_t)k * n);
    uint16_t *Ab = malloc(2 * (size_t)m * k);
    for (int i = 0; i < m * k; i++) Ab[i] = bf16bits(A[i]), A[i] = fa_port_bf16(A[i]);
    uint32_t *Bp = malloc(4 * (size_t)kp * n), *Bp2 = malloc(4 * (size_t)kp * n);
    K->pairs_f32_bf16(k, n, B, n, Bp, n);
    uint16_t *Bb = malloc(2 * (size_t)k * n);
    for (int i = 0; i < k * n; i++) Bb[i] = bf16bits(B[i]), B[i] = fa_port_bf16(B[i]);
    K->pairs_bf16(k, n, Bb, n, Bp2, n);
    report(K->isa, "pairs_f32_bf16 == pairs_bf16", memcmp(Bp, Bp2, 4 * (size_t)kp * n) ? 1 : 0, 0);
    float *C = malloc(sizeof(float) * m * n);
    K->gemm_bf16(m, n, kp, (const uint32_t *)Ab, kp, 1, Bp, n, C, n, 0);
    double e = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double r = 0;
            for (int p = 0; p < k; p++) r += (double)A[i * k + p] * B[p * n + j];
            e = fmax(e, fabs(r - C[i * n + j]));
        }
    report(K->isa, "gemm_bf16 29x67x38 (A rows)", e, 4e-7 * k);
    /* Aᵀ addressing: A stored as pairs [kp][m] via pack_t32 of the row-major bf16 A */
    uint32_t *At = malloc(4 * (size_t)kp * m);
    K->pack_t32(m, kp, (const uint32_t *)Ab, kp, At, m);
    float *C2 = malloc(sizeof(float) * m * n);
    K->gemm_bf16(m, n, kp, At, 1, m, Bp, n, C2, n, 0);
    e = 0;
    for (int i = 0; i < m * n; i++) e = fmax(e, fabs(C2[i] - C[i]));
    report(K->isa, "gemm_bf16 via pack_t32", e, 4e-7 * k);
    free(A); free(B); free(Ab); free(Bp); free(Bp2); free(Bb); free(C); free(At); free(C2);

    /* whole tiles and edges of a tile kernel: row-major A with a stride, kp over one 256-word chunk, acc = 1 on a
     * strided C (the shapes of S = Qi Kjᵀ and O += P Vj, and one that is neither) */
    static const int shapes[][3] = {{64, 128, 64}, {256, 128, 32}, {50, 70, 300}, {16, 16, 16}, {33, 17, 5}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int M = shapes[sh][0], N = shapes[sh][1], KP = shapes[sh][2], lda = KP + 3, ldb = N + 5, ldc = N + 7;
        uint32_t *Aw = malloc(4 * (size_t)M * lda), *Bw = malloc(4 * (size_t)KP * ldb);
        float *Cw = malloc(sizeof(float) * (size_t)M * ldc), *C0 = malloc(sizeof(float) * (size_t)M * ldc);
        for (int i = 0; i < M * lda; i++) Aw[i] = (uint32_t)bf16bits(frand()) | (uint32_t)bf16bits(frand()) << 16;
        for (int i = 0; i < KP * ldb; i++) Bw[i] = (uint32_t)bf16bits(frand()) | (uint32_t)bf16bits(frand()) << 16;
        for (int i = 0; i < M * ldc; i++) C0[i] = Cw[i] = frand();
        K->gemm_bf16(M, N, KP, Aw, lda, 1, Bw, ldb, Cw, ldc, 1);
        double eg = 0;
        for (int i = 0; i < M; i++)
            for (int j = 0; j < ldc; j++) {
                double r = C0[i * ldc + j];
                if (j < N)
                    for (int q = 0; q < KP; q++) {
                        uint32_t a = Aw[i * lda + q], b = Bw[q * ldb + j];
                        r += (double)fa_port_lo(a) * fa_port_lo(b) + (double)fa_port_hi(a) * fa_port_hi(b);
                    }
                eg = fmax(eg, fabs(r - Cw[i * ldc + j])); /* the padding columns stay as they were */
            }
        char what[64];
        snprintf(what, sizeof what, "gemm_bf16 %dx%dx%d acc, strided", M, N, 2 * KP);
        report(K->isa, what, eg, 4e-7 * 2 * KP);
        free(Aw); free(Bw); free(Cw); free(C0);
    }

    /* rows_f32_bf16: equal to the portable rounding, odd cols paired with 0 */
    {
        const int rows = 5, cols = 37, lds = 40, ldd = 21;
        float *X = fbuf((size_t)rows * lds);
        uint32_t *W1 = calloc((size_t)rows * ldd, 4), *W2 = calloc((size_t)rows * ldd, 4);
        K->rows_f32_bf16(rows, cols, X, lds, W1, ldd);
        port_rows_f32_bf16(rows, cols, X, lds, W2, ldd);
        report(K->isa, "rows_f32_bf16 == portable", memcmp(W1, W2, 4 * (size_t)rows * ldd) ? 1 : 0, 0);
        free(X); free(W1); free(W2);
    }

    /* softmax_rows_bf16 over two blocks (m rises in the second, one row fully masked, odd cols) */
    /* 7 rows: the row-by-row path; 37: two blocks of 16 rows (a masked row in one) and 5 more */
    for (int rows = 7; rows <= 37; rows += 30) {
        const int cols = 45, lds = 48, ldp = 24;
        float *S1 = fbuf((size_t)rows * lds), m[40], l[40], al[40];
        uint32_t *P = malloc(4 * (size_t)rows * ldp);
        double L[40], Mx[40], ep = 0, el = 0, ea = 0;
        const float c = 1.3f;
        for (int r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0, L[r] = 0, Mx[r] = -INFINITY;
        for (int blk = 0; blk < 2; blk++) {
            for (int i = 0; i < rows * lds; i++) S1[i] = frand() * (blk ? 8.0f : 1.0f);
            for (int j = 0; j < cols; j++) S1[3 * lds + j] = -INFINITY;
            if (rows > 20)
                for (int j = 0; j < cols; j++) S1[20 * lds + j] = -INFINITY;
            double mold[40];
            for (int r = 0; r < rows; r++) mold[r] = m[r];
            K->softmax_rows_bf16(rows, cols, S1, lds, c, m, l, al, P, ldp);
            for (int r = 0; r < rows; r++) {
                double mx = Mx[r];
                for (int j = 0; j < cols; j++) mx = fmax(mx, S1[r * lds + j]);
                double sub = isinf(mx) ? 0 : mx, a = isinf(mold[r]) ? 0 : exp2(c * (mold[r] - sub));
                L[r] = L[r] * a;
                for (int j = 0; j < cols + 1; j++) {
                    double pr = j < cols ? exp2(c * (S1[r * lds + j] - sub)) : 0;
                    uint32_t wd = P[r * ldp + j / 2];
                    double got = j % 2 ? fa_port_hi(wd) : fa_port_lo(wd);
                    ep = fmax(ep, fabs(got - pr) / fmax(pr, 1e-30) * (pr > 0) + (pr == 0 && got != 0));
                    L[r] += j < cols ? pr : 0;
                }
                Mx[r] = mx;
                ea = fmax(ea, fabs(al[r] - a));
                el = fmax(el, L[r] > 0 ? fabs(l[r] / L[r] - 1) : l[r] != 0);
                el = fmax(el, m[r] == (float)mx || (isinf(mx) && isinf(m[r])) ? 0 : 1);
            }
        }
        report(K->isa, "softmax_rows_bf16 P (rel, bf16)", ep, 1.0 / 256);
        report(K->isa, "softmax_rows_bf16 l, m (rel)", el, 1e-5);
        report(K->isa, "softmax_rows_bf16 alpha (abs)", ea, 1e-6);
        free(S1); free(P);
    }
}

/* ---- timing ---- */

/* GFLOP/s of reps × gemm_nn(m, n, k) per thread, all threads running their own buffers. */
static double time_gemm(const fa_cpu_kernels *K, int threads, int m, int n, int k, int at, double seconds) {
    double best = 0;
    for (int trial = 0; trial < 3; trial++) {
        double t0 = 0, t1 = 0;
        long reps_total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : reps_total)
        {
            float *A = fbuf((size_t)m * k), *B = fbuf((size_t)k * n), *C = fbuf((size_t)m * n);
            long reps = 0;
#pragma omp barrier
#pragma omp master
            t0 = fa_cpu_seconds();
            double end = fa_cpu_seconds() + seconds;
            while (fa_cpu_seconds() < end) {
                for (int r = 0; r < 16; r++) {
                    if (at) K->gemm_nn(m, n, k, A, 1, m, B, n, C, n, 1);
                    else K->gemm_nn(m, n, k, A, k, 1, B, n, C, n, 0);
                }
                reps += 16;
            }
#pragma omp barrier
#pragma omp master
            t1 = fa_cpu_seconds();
            reps_total += reps;
            free(A); free(B); free(C);
        }
        double g = 2.0 * m * n * k * (double)reps_total / (t1 - t0) * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

static double time_bf16(const fa_cpu_kernels *K, int threads, int m, int n, int kp, double seconds) {
    double best = 0;
    for (int trial = 0; trial < 3; trial++) {
        double t0 = 0, t1 = 0;
        long reps_total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : reps_total)
        {
            uint32_t *A = calloc((size_t)m * kp, 4), *B = calloc((size_t)kp * n, 4);
            float *C = fbuf((size_t)m * n);
            long reps = 0;
#pragma omp barrier
#pragma omp master
            t0 = fa_cpu_seconds();
            double end = fa_cpu_seconds() + seconds;
            while (fa_cpu_seconds() < end) {
                for (int r = 0; r < 16; r++) K->gemm_bf16(m, n, kp, A, kp, 1, B, n, C, n, 1);
                reps += 16;
            }
#pragma omp barrier
#pragma omp master
            t1 = fa_cpu_seconds();
            reps_total += reps;
            free(A); free(B); free(C);
        }
        double g = 4.0 * m * n * kp * (double)reps_total / (t1 - t0) * 1e-9;
        if (g > best) best = g;
    }
    return best;
}

/* The bf16 FLASH2 forward step of algo/flash2_amx.c on one thread, piece by piece, ns per call: S = Qi Kjᵀ,
 * softmax_rows_bf16, scale_rows (O = diag(α) O), O += P Vj — where the step's time goes at each tile size. */
static void time_bf16_step(const fa_cpu_kernels *K, int br, int bc, int d, double seconds) {
    const int dp = d / 2, bcw = (bc + 1) / 2;
    uint32_t *Q = calloc((size_t)br * dp, 4), *KT = calloc((size_t)dp * bc, 4), *VP = calloc((size_t)bcw * d, 4);
    uint32_t *P = calloc((size_t)br * bcw, 4);
    float *S = fbuf((size_t)br * bc), *O = fbuf((size_t)br * d), *m = fbuf(br), *l = fbuf(br), *al = fbuf(br);
    float *half = fbuf(br);
    for (int i = 0; i < br; i++) al[i] = 1.0f, half[i] = 0.5f;
    double ns[4] = {0};
    for (int piece = 0; piece < 4; piece++) {
        long reps = 0;
        const double t0 = fa_cpu_seconds(), end = t0 + seconds;
        while (fa_cpu_seconds() < end) {
            for (int r = 0; r < 8; r++) {
                if (piece == 0) K->gemm_bf16(br, bc, dp, Q, dp, 1, KT, bc, S, bc, 0);
                else if (piece == 1) {
                    for (int i = 0; i < br; i++) m[i] = 4.0f, l[i] = 1.0f;
                    K->softmax_rows_bf16(br, bc, S, bc, 1.0f, m, l, al, P, bcw);
                } else if (piece == 2) K->scale_rows(br, d, O, d, half); /* every row rescaled: the worst case */
                else K->gemm_bf16(br, d, bcw, P, bcw, 1, VP, d, O, d, 1);
            }
            reps += 8;
        }
        ns[piece] = (fa_cpu_seconds() - t0) / (double)reps * 1e9;
    }
    const double total = ns[0] + ns[1] + ns[2] + ns[3], flops = 4.0 * br * bc * d;
    printf("  %-7s bf16 step Br %3d Bc %3d d %3d: QK %7.0f  softmax %7.0f  scale %6.0f  PV %7.0f ns -> %6.1f GFLOP/s\n",
           K->isa, br, bc, d, ns[0], ns[1], ns[2], ns[3], flops / total);
    free(Q), free(KT), free(VP), free(P), free(S), free(O), free(m), free(l), free(al), free(half);
}

static double time_exp(const fa_cpu_kernels *K, double seconds) {
    const int nk = 64, nq = 64;
    float *S = fbuf(nk * nq), m[64], l[64], al[64];
    long reps = 0;
    double t0 = fa_cpu_seconds(), end = t0 + seconds;
    while (fa_cpu_seconds() < end) {
        for (int r = 0; r < 64; r++) {
            for (int q = 0; q < nq; q++) m[q] = 4.0f, l[q] = 1.0f;
            K->softmax_step_t(nk, nq, S, nq, 1.0f, m, l, al);
        }
        reps += 64;
    }
    double t = fa_cpu_seconds() - t0;
    free(S);
    return t / ((double)reps * nk * nq) * 1e9; /* ns per score */
}

#ifdef FA_HAVE_CBLAS
static double time_sgemm(int n, int reps) {
    float *A = fbuf((size_t)n * n), *B = fbuf((size_t)n * n), *C = fbuf((size_t)n * n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = fa_cpu_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        double t = fa_cpu_seconds() - t0;
        if (t < best) best = t;
    }
    free(A); free(B); free(C);
    return 2.0 * n * n * (double)n / best * 1e-9;
}
#endif

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int main(int argc, char **argv) {
    int peak = 0, check_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--peak")) peak = 1;
        else if (!strcmp(argv[i], "--check")) check_only = 1;
        else {
            fprintf(stderr, "usage: %s [--peak | --check]\n", argv[0]);
            return 2;
        }
    }
    const fa_cpu_kernels *best = NULL;
    char why[256];
    if (fa_cpu_kernels_select(&best, why, sizeof why) != FA_OK) {
        fprintf(stderr, "%s\n", why);
        return 2;
    }
    const fa_cpu_kernels *tables[FA_CPU_ISA_COUNT]; /* every level this process can run */
    int nt = 0;
    for (int l = 0; l < FA_CPU_ISA_COUNT; l++) {
        const char *lack;
        const fa_cpu_kernels *k = fa_cpu_kernels_level((fa_cpu_isa)l, &lack);
        if (k) tables[nt++] = k;
    }
    int T = max_threads();
    if (peak) {
        printf("peak (selected kernels: %s, %d threads)\n", best->isa, T);
        printf("  fp32 micro-kernel 6x64, k=128, 1 thread : %7.1f GFLOP/s\n", time_gemm(best, 1, 60, 64, 128, 0, 0.3));
        printf("  fp32 micro-kernel 6x64, k=128, %d threads: %7.1f GFLOP/s\n", T, time_gemm(best, T, 60, 64, 128, 0, 0.3));
        if (best->bf16_dot)
            printf("  bf16 vdpbf16ps 6x64, k=128, %d threads  : %7.1f GFLOP/s\n", T, time_bf16(best, T, 60, 64, 64, 0.3));
#ifdef FA_HAVE_CBLAS
        printf("  BLAS sgemm 4096^3 (BLAS threads)       : %7.1f GFLOP/s\n", time_sgemm(4096, 3));
#else
        printf("  BLAS: not linked\n");
#endif
        return 0;
    }
    printf("correctness (float64 reference):\n");
    for (int t = 0; t < nt; t++) {
        check_gemms(tables[t]);
        check_elementwise(tables[t]);
        check_bf16(tables[t]);
    }
    printf("%s\n", failures ? "SOME CHECKS FAILED" : "all checks passed");
    if (check_only) return failures ? 1 : 0;
    printf("\ntimings (best of 3, GFLOP/s; %d threads = all)\n", T);
    printf("  %-7s %-40s %9s %9s\n", "isa", "product", "1 thread", "all");
    for (int t = 0; t < nt; t++) {
        const fa_cpu_kernels *K = tables[t];
        double dur = K == &fa_cpu_kernels_scalar ? 0.1 : 0.2;
        static const struct { const char *name; int m, n, k, at; } sh[] = {
            {"S^T = K Q^T   64x64, d=128 (ab)", 64, 64, 128, 0},
            {"S^T = K Q^T   64x64, d=64  (ab)", 64, 64, 64, 0},
            {"O += P V      64x128, Bc=64 (atb)", 64, 128, 64, 1},
            {"O += P V      64x64,  Bc=64 (atb)", 64, 64, 64, 1},
            {"O += P V      128x128, Bc=128 (atb)", 128, 128, 128, 1},
        };
        for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
            printf("  %-7s %-40s %9.1f %9.1f\n", K->isa, sh[s].name, time_gemm(K, 1, sh[s].m, sh[s].n, sh[s].k, sh[s].at, dur),
                   time_gemm(K, T, sh[s].m, sh[s].n, sh[s].k, sh[s].at, dur));
        if (K->bf16_dot)
            printf("  %-7s %-40s %9.1f %9.1f\n", K->isa, "bf16 64x64, d=128", time_bf16(K, 1, 64, 64, 64, dur),
                   time_bf16(K, T, 64, 64, 64, dur));
        printf("  %-7s %-40s %9.3f ns/score\n", K->isa, "softmax_step_t 64x64 (max+exp2+sum)", time_exp(K, dur));
        if (K->bf16_dot) {
            static const int steps[][3] = {{256, 128, 128}, {128, 128, 128}, {256, 256, 128}, {128, 256, 128},
                                           {64, 64, 128}, {256, 128, 64}};
            for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++)
                time_bf16_step(K, steps[s][0], steps[s][1], steps[s][2], dur / 2);
        }
    }
    return failures ? 1 : 0;
}
