/* fa_last_stats: the slow-memory bytes each CPU algorithm reports against the formulas of its loop structure
 * (src/cpu/algo/standard.c, flash1.c, flash2.c document them), the FLOP count against 4·D·Hq·(visible pairs)
 * (x2.5 backward), the block sizes, threads and kernel name; and the ordering the FlashAttention paper is about:
 * STANDARD moves the most bytes, FLASH1 more than FLASH2.
 *
 * Notation per (sequence, query head): N = Sq = Sk, d = head_dim, e = bytes per element, Tr = ⌈N/Br⌉, Tc = ⌈N/Bc⌉,
 * g = Hq/Hk (query heads per K/V head). Slow-memory fp32 state (S, P, O/ℓ/m of FLASH1, dQ accumulators, D, LSE)
 * is 4 bytes per element. */
#include "testlib.h"

#include <stdlib.h>
#include <string.h>

typedef struct io { int64_t r, w; } io;

/* Keys [lo, hi) visible to query row i (bottom-right aligned mask; the definition, written again here). */
static void key_range(const fa_attn_opts *o, int64_t sq, int64_t sk, int64_t i, int64_t *lo, int64_t *hi) {
    int64_t diag = i + sk - sq, l = 0, h = sk;
    if (o->window_left >= 0 && diag - o->window_left > l) l = diag - o->window_left;
    int64_t wr = o->causal ? 0 : o->window_right;
    if (o->causal && o->window_right >= 0 && o->window_right < wr) wr = o->window_right;
    if (wr >= 0 && diag + wr + 1 < h) h = diag + wr + 1;
    *lo = l, *hi = h > l ? h : l;
}
static int64_t visible_pairs(const fa_attn_opts *o, int64_t sq, int64_t sk) {
    int64_t n = 0, lo, hi;
    for (int64_t i = 0; i < sq; i++) key_range(o, sq, sk, i, &lo, &hi), n += hi - lo;
    return n;
}
/* Does any row of Q block [i0, i0+rows) see a key of K block [j0, j0+cols)? */
static int block_visible(const fa_attn_opts *o, int64_t sq, int64_t sk, int64_t i0, int rows, int64_t j0, int cols) {
    int64_t lo, hi;
    for (int64_t i = i0; i < i0 + rows; i++) {
        key_range(o, sq, sk, i, &lo, &hi);
        if (lo < hi && lo < j0 + cols && hi > j0) return 1;
    }
    return 0;
}

/* ---- the models, per query head (forward) or per K/V head (backward) ---- */
static io standard_fwd(int64_t N, int64_t d, int64_t e, int64_t Tr, int lse) {
    /* S = QKᵀ tile by tile (Q once, K once per Q block), S written; softmax reads S, writes P (+LSE);
     * O = PV: P read, V once per Q block, O written. */
    io x = {N * d * e * (1 + 2 * Tr) + 8 * N * N, 8 * N * N + N * d * e + (lse ? 4 * N : 0)};
    return x;
}
static io flash1_fwd(const fa_attn_opts *o, int64_t N, int64_t d, int64_t e, int Br, int Bc, int lse) {
    /* init O, ℓ, m; per K/V block: Kj, Vj; per visible (j, i): Qi, Oi, ℓi, mi read and Oi, ℓi, mi written back;
     * end: (f16/bf16) the fp32 O is converted into the output; LSE from ℓ, m. */
    int f32 = e == 4;
    io x = {2 * N * d * e, 4 * N * d + 8 * N};
    for (int64_t j0 = 0; j0 < N; j0 += Bc)
        for (int64_t i0 = 0; i0 < N; i0 += Br) {
            int rows = (int)(N - i0 < Br ? N - i0 : Br), cols = (int)(N - j0 < Bc ? N - j0 : Bc);
            if (!block_visible(o, N, N, i0, rows, j0, cols)) continue;
            x.r += rows * d * e + rows * d * 4 + 8 * rows;
            x.w += rows * d * 4 + 8 * rows;
        }
    if (!f32) x.r += 4 * N * d, x.w += N * d * e;
    if (lse) x.r += 8 * N, x.w += 4 * N;
    return x;
}
static io flash2_fwd(const fa_attn_opts *o, int64_t N, int64_t d, int64_t e, int Br, int Bc, int lse, int64_t heads,
                     int threads) {
    /* per Q block: Qi once, then Kj, Vj for every K/V block from the first to the last it can see; O (+LSE) once.
     * With blocks = heads·Tr Q blocks in the call (heads = batch·Hq) and items = max(16, 8·threads) work items, the
     * f32 path groups G = min(16, blocks/items) Q blocks per work item and packs the K/V rows they visit once per
     * group (read in the dtype, written as fp32; the Kj, Vj reads are then fp32 too), here always within the pack
     * limit. */
    const int64_t items = 8 * (int64_t)threads > 16 ? 8 * (int64_t)threads : 16;
    const int64_t Tr = (N + Br - 1) / Br, G = heads * Tr / items > 16 ? 16 : heads * Tr / items;
    const int64_t ekv = G > 1 ? 4 : e;
    io x = {N * d * e, N * d * e + (lse ? 4 * N : 0)};
    for (int64_t i0 = 0; i0 < N; i0 += Br) {
        int rows = (int)(N - i0 < Br ? N - i0 : Br);
        int64_t lo, hi, l2, h2;
        key_range(o, N, N, i0, &lo, &hi);
        key_range(o, N, N, i0 + rows - 1, &l2, &h2);
        for (int64_t j0 = lo / Bc * Bc; j0 < h2; j0 += Bc) x.r += 2 * d * ekv * (N - j0 < Bc ? N - j0 : Bc);
        if (G > 1 && (i0 / Br) % G == 0) { /* the group's pack: its first block's first key tile to its last key */
            int64_t last = i0 + G * Br < N ? i0 + G * Br - 1 : N - 1, l3, h3;
            key_range(o, N, N, last, &l3, &h3);
            int64_t klo = lo / Bc * Bc, khi = klo + (h3 - klo + Bc - 1) / Bc * Bc;
            if (khi > N) khi = N;
            x.r += 2 * d * e * (khi - klo), x.w += 2 * d * 4 * (khi - klo);
        }
    }
    return x;
}
static io flash2_bwd(int64_t N, int64_t d, int64_t e, int64_t Tc, int64_t g) {
    /* per K/V head, no mask, no split: per K/V block Kj, Vj once, then per (query head, Q block) Qi, dOi, LSEi read;
     * at a Q block's first K/V block Oi read (D computed, written for the later blocks) and dQi started at 0, at the
     * others Di and dQi (fp32) read; dQi written; dKj, dVj written; (f16/bf16) dQ converted at the end. */
    int f32 = e == 4;
    io x = {2 * N * d * e + g * N * (Tc * (2 * d * e + 4) + (Tc - 1) * (4 * d + 4) + d * e),
            Tc * g * 4 * N * d + (Tc > 1 ? g * 4 * N : 0) + 2 * N * d * e};
    if (!f32) x.r += g * 4 * N * d, x.w += g * N * d * e;
    return x;
}
static io flash1_bwd(int64_t N, int64_t d, int64_t e, int64_t Tc, int64_t g) {
    /* Algorithm 4: dQ zeroed in slow memory; per K/V block Kj, Vj; per (query head, Q block) Qi, Oi, dOi, LSEi and
     * dQi read (D recomputed every step), dQi written; dKj, dVj written. */
    int f32 = e == 4;
    io x = {2 * N * d * e + Tc * g * N * (3 * d * e + 4 + 4 * d), g * 4 * N * d + Tc * g * 4 * N * d + 2 * N * d * e};
    if (!f32) x.r += g * 4 * N * d, x.w += g * N * d * e;
    return x;
}
static io standard_bwd(int64_t N, int64_t d, int64_t e, int64_t Tr, int64_t Tc, int64_t g) {
    /* per K/V head: dK, dV zeroed (fp32); per query head: S as in the forward; dP = dO Vᵀ written; P, dP read and
     * P, dS written; dV += Pᵀ dO and dK += dSᵀ Q (fp32 accumulators read and written per K block, P/dS read, dO/Q
     * once per K block); dQ = dS K (K once per Q block); dK, dV converted at the end. */
    io x = {g * (N * d * e * (3 + 3 * Tr + 2 * Tc) + 4 * N + 20 * N * N + 8 * N * d) + 8 * N * d,
            8 * N * d + 2 * N * d * e + g * (16 * N * N + 8 * N * d + N * d * e)};
    return x;
}

static fa_context *ctx;

typedef struct run {
    t_buf q, k, v, o, dout, dq, dk, dv;
    float *lse;
} run;

static void setup(run *r, fa_dtype dt, int64_t b, int64_t n, int64_t hq, int64_t hk, int64_t d) {
    r->q = t_buf_new(dt, b, n, hq, d, T_BSHD), r->k = t_buf_new(dt, b, n, hk, d, T_BSHD);
    r->v = t_buf_new(dt, b, n, hk, d, T_BSHD), r->o = t_buf_new(dt, b, n, hq, d, T_BSHD);
    r->dout = t_buf_new(dt, b, n, hq, d, T_BSHD), r->dq = t_buf_new(dt, b, n, hq, d, T_BSHD);
    r->dk = t_buf_new(dt, b, n, hk, d, T_BSHD), r->dv = t_buf_new(dt, b, n, hk, d, T_BSHD);
    t_buf_randn(&r->q, 1), t_buf_randn(&r->k, 1), t_buf_randn(&r->v, 1), t_buf_randn(&r->dout, 1);
    r->lse = calloc((size_t)(b * hq * n), sizeof(float));
}
static void teardown(run *r) {
    t_buf_free(&r->q), t_buf_free(&r->k), t_buf_free(&r->v), t_buf_free(&r->o);
    t_buf_free(&r->dout), t_buf_free(&r->dq), t_buf_free(&r->dk), t_buf_free(&r->dv);
    free(r->lse);
}

static fa_stats forward(run *r, const fa_attn_opts *o, int with_lse) {
    fa_stats s;
    memset(&s, 0, sizeof s);
    fa_status st = fa_forward(ctx, o, &r->q.t, &r->k.t, &r->v.t, &r->o.t, with_lse ? r->lse : NULL);
    CHECK_STATUS(st, FA_OK);
    if (st) fprintf(stderr, "  %s\n", fa_context_last_error(ctx));
    CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
    return s;
}
static fa_stats backward(run *r, const fa_attn_opts *o) {
    fa_stats s;
    memset(&s, 0, sizeof s);
    forward(r, o, 1);
    fa_status st = fa_backward(ctx, o, &r->q.t, &r->k.t, &r->v.t, &r->o.t, r->lse, &r->dout.t, &r->dq.t, &r->dk.t, &r->dv.t);
    CHECK_STATUS(st, FA_OK);
    if (st) fprintf(stderr, "  %s\n", fa_context_last_error(ctx));
    CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
    return s;
}

static void check_io(const char *what, const fa_stats *s, io want) {
    printf("  %-8s %-22s read %10lld (model %10lld)  written %10lld (model %10lld)\n", what, s->kernel ? s->kernel : "?",
           (long long)s->slow_read_bytes,
           (long long)want.r, (long long)s->slow_write_bytes, (long long)want.w);
    CHECK_MSG(s->slow_read_bytes == want.r, "%s: slow_read_bytes %lld, model %lld", what, (long long)s->slow_read_bytes,
              (long long)want.r);
    CHECK_MSG(s->slow_write_bytes == want.w, "%s: slow_write_bytes %lld, model %lld", what,
              (long long)s->slow_write_bytes, (long long)want.w);
}

/* br, bc: the requested tiles, clipped to the sequence (N) as the CPU backend does. */
static void check_common(const fa_stats *s, fa_algo a, int bwd, int br, int bc, double flops) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "cpu.%s", fa_algo_name(a));
    CHECK_EQ_INT(s->backend, FA_BACKEND_CPU);
    CHECK_EQ_INT(s->algo, a);
    CHECK_EQ_INT(s->is_backward, bwd);
    CHECK_MSG(s->kernel && strncmp(s->kernel, prefix, strlen(prefix)) == 0, "kernel \"%s\" should start with %s",
              s->kernel ? s->kernel : "(null)", prefix);
    if (br) CHECK_EQ_INT(s->block_q, br);
    if (bc) CHECK_EQ_INT(s->block_k, bc);
    CHECK_EQ_INT(s->threads, fa_context_threads(ctx));
    CHECK_MSG(s->flops == flops, "flops %.0f, want %.0f", s->flops, flops);
    CHECK(s->extra_bytes >= 0);
}

/* Forward of the three algorithms on one shape, every count against its model. */
static void forward_models(fa_dtype dt, int64_t b, int64_t n, int64_t hq, int64_t hk, int64_t d, int br, int bc,
                           int causal, int with_lse) {
    snprintf(t_case_label, sizeof t_case_label, "stats fwd %s b%lld n%lld h%lld/%lld d%lld tiles%dx%d%s%s",
             fa_dtype_name(dt), (long long)b, (long long)n, (long long)hq, (long long)hk, (long long)d, br, bc,
             causal ? " causal" : "", with_lse ? " lse" : "");
    printf("%s\n", t_case_label);
    run r;
    setup(&r, dt, b, n, hq, hk, d);
    fa_attn_opts o = fa_attn_opts_default();
    o.block_q = br, o.block_k = bc, o.causal = causal;
    const int64_t e = (int64_t)fa_dtype_size(dt), heads = b * hq, Tr = (n + br - 1) / br;
    const double flops = 4.0 * (double)d * (double)heads * (double)visible_pairs(&o, n, n);
    fa_stats s;
    io m;
    if (!causal) {
        o.algo = FA_ALGO_STANDARD;
        s = forward(&r, &o, with_lse);
        check_common(&s, FA_ALGO_STANDARD, 0, br < n ? br : (int)n, bc < n ? bc : (int)n, flops);
        m = standard_fwd(n, d, e, Tr, with_lse);
        m.r *= heads, m.w *= heads;
        check_io("standard", &s, m);
        CHECK_MSG(s.extra_bytes >= n * n * 4, "standard extra_bytes %lld < one N x N fp32 matrix",
                  (long long)s.extra_bytes);
    }
    o.algo = FA_ALGO_FLASH1;
    s = forward(&r, &o, with_lse);
    check_common(&s, FA_ALGO_FLASH1, 0, br < n ? br : (int)n, bc < n ? bc : (int)n, flops);
    m = flash1_fwd(&o, n, d, e, br, bc, with_lse);
    m.r *= heads, m.w *= heads;
    check_io("flash1", &s, m);
    o.algo = FA_ALGO_FLASH2;
    s = forward(&r, &o, with_lse);
    check_common(&s, FA_ALGO_FLASH2, 0, br < n ? br : (int)n, bc < n ? bc : (int)n, flops);
    m = flash2_fwd(&o, n, d, e, br, bc, with_lse, b * hq, fa_context_threads(ctx));
    m.r *= heads, m.w *= heads;
    check_io("flash2", &s, m);
    teardown(&r);
}

static void backward_models(fa_dtype dt, int64_t b, int64_t n, int64_t hq, int64_t hk, int64_t d, int br, int bc) {
    snprintf(t_case_label, sizeof t_case_label, "stats bwd %s b%lld n%lld h%lld/%lld d%lld tiles%dx%d",
             fa_dtype_name(dt), (long long)b, (long long)n, (long long)hq, (long long)hk, (long long)d, br, bc);
    printf("%s\n", t_case_label);
    run r;
    setup(&r, dt, b, n, hq, hk, d);
    fa_attn_opts o = fa_attn_opts_default();
    o.block_q = br, o.block_k = bc;
    const int64_t e = (int64_t)fa_dtype_size(dt), kvheads = b * hk, g = hq / hk;
    const int64_t Tr = (n + br - 1) / br, Tc = (n + bc - 1) / bc;
    const double flops = 2.5 * 4.0 * (double)d * (double)(b * hq) * (double)(n * n);
    static const fa_algo algos[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};
    for (int i = 0; i < 3; i++) {
        o.algo = algos[i];
        fa_stats s = backward(&r, &o);
        check_common(&s, algos[i], 1, br < n ? br : (int)n, bc < n ? bc : (int)n, flops);
        io m = algos[i] == FA_ALGO_STANDARD ? standard_bwd(n, d, e, Tr, Tc, g)
             : algos[i] == FA_ALGO_FLASH1   ? flash1_bwd(n, d, e, Tc, g)
                                            : flash2_bwd(n, d, e, Tc, g);
        m.r *= kvheads, m.w *= kvheads;
        check_io(fa_algo_name(algos[i]), &s, m);
    }
    teardown(&r);
}

/* The paper's point, with default tiles: STANDARD > FLASH1 > FLASH2 in bytes moved; FLASH2 moves Q and O once.
 * And the counts do not depend on the number of threads. */
static void ordering(int64_t n, int64_t d) {
    snprintf(t_case_label, sizeof t_case_label, "ordering n%lld d%lld", (long long)n, (long long)d);
    run r;
    setup(&r, FA_DTYPE_F32, 1, n, 2, 2, d);
    fa_attn_opts o = fa_attn_opts_default();
    int64_t tot[3];
    static const fa_algo algos[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};
    for (int i = 0; i < 3; i++) {
        o.algo = algos[i];
        fa_stats s = forward(&r, &o, 1);
        tot[i] = s.slow_read_bytes + s.slow_write_bytes;
        CHECK(s.block_q >= 1 && s.block_q <= n && s.block_k >= 1 && s.block_k <= n);
        /* default tiles (the tuned table; STANDARD through BLAS where built, in row panels of block_q): the same
         * models hold with the tile sizes the call reports */
        if (s.block_q >= 1 && s.block_k >= 1) {
            const int64_t Tr = (n + s.block_q - 1) / s.block_q;
            const int th = fa_context_threads(ctx);
            io m = algos[i] == FA_ALGO_STANDARD ? standard_fwd(n, d, 4, Tr, 1)
                 : algos[i] == FA_ALGO_FLASH1   ? flash1_fwd(&o, n, d, 4, s.block_q, s.block_k, 1)
                                                : flash2_fwd(&o, n, d, 4, s.block_q, s.block_k, 1, 2, th);
            m.r *= 2, m.w *= 2;
            check_io(fa_algo_name(algos[i]), &s, m);
        }
        /* the same call on a 1-thread context counts the same bytes */
        fa_context *c1 = NULL;
        CHECK_STATUS(fa_context_create(&c1, FA_BACKEND_CPU, 1), FA_OK);
        fa_stats s1;
        memset(&s1, 0, sizeof s1);
        CHECK_STATUS(fa_forward(c1, &o, &r.q.t, &r.k.t, &r.v.t, &r.o.t, r.lse), FA_OK);
        CHECK_STATUS(fa_last_stats(c1, &s1), FA_OK);
        CHECK_EQ_INT(s1.slow_read_bytes, s.slow_read_bytes);
        CHECK_EQ_INT(s1.slow_write_bytes, s.slow_write_bytes);
        CHECK_EQ_INT(s1.threads, 1);
        fa_context_destroy(c1);
        printf("  %-8s n%lld d%lld: %lld bytes moved, extra %lld\n", fa_algo_name(algos[i]), (long long)n, (long long)d,
               (long long)tot[i], (long long)s.extra_bytes);
    }
    CHECK_MSG(tot[0] > tot[1] && tot[1] > tot[2], "bytes moved: standard %lld, flash1 %lld, flash2 %lld", (long long)tot[0],
              (long long)tot[1], (long long)tot[2]);
    /* AUTO reports FLASH2 and the same counts */
    o.algo = FA_ALGO_AUTO;
    fa_stats s = forward(&r, &o, 1);
    CHECK_EQ_INT(s.algo, FA_ALGO_FLASH2);
    CHECK_EQ_INT(s.slow_read_bytes + s.slow_write_bytes, tot[2]);
    teardown(&r);
}

int main(void) {
    t_init("test_stats");
    ctx = t_cpu_ctx();
    /* tiles dividing N and not, square and not, f32 (FLASH1 keeps O in the output) and f16/bf16 (an fp32 copy) */
    forward_models(FA_DTYPE_F32, 1, 64, 1, 1, 16, 16, 16, 0, 1);
    forward_models(FA_DTYPE_F32, 2, 100, 2, 1, 32, 32, 16, 0, 0);
    forward_models(FA_DTYPE_F16, 1, 77, 4, 2, 8, 16, 24, 0, 1);
    forward_models(FA_DTYPE_BF16, 1, 50, 1, 1, 64, 64, 8, 0, 1);
    forward_models(FA_DTYPE_F32, 1, 96, 2, 2, 16, 16, 16, 1, 1);   /* causal: fully masked blocks are skipped */
    forward_models(FA_DTYPE_F16, 1, 90, 1, 1, 8, 32, 16, 1, 0);
    forward_models(FA_DTYPE_F32, 2, 100, 4, 2, 16, 8, 24, 1, 1);    /* 104 Q blocks: K/V packed per 6 of them */
    forward_models(FA_DTYPE_F16, 1, 130, 4, 1, 8, 4, 16, 0, 0);     /* 132 Q blocks: per 8, f16 -> fp32 pack */
    forward_models(FA_DTYPE_F32, 1, 200, 8, 8, 8, 4, 32, 0, 1);     /* 400 Q blocks: per 16 */
    backward_models(FA_DTYPE_F32, 1, 64, 1, 1, 16, 16, 16);
    backward_models(FA_DTYPE_F32, 2, 70, 4, 2, 8, 32, 16);
    backward_models(FA_DTYPE_F16, 1, 45, 2, 1, 24, 16, 32);
    ordering(512, 64);
    fa_context_destroy(ctx);
    return t_finish();
}
