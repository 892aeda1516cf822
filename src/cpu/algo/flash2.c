/* FA_ALGO_FLASH2 on the CPU — FlashAttention-2 (Dao 2023, Algorithms 1 and 2).
 *
 * Forward: one work item per (sequence, head, group of Q blocks i), in parallel; per Q block i:
 *   load Qi; m = −∞, ℓ = 0, O = 0 (all in fast memory)
 *   for each K/V block j that a row of block i can see (inner loop):
 *     load Kj, Vj;  S = scale·Qi Kjᵀ (+softcap, mask)
 *     m_new = max(m, rowmax S);  P = exp(S − m_new);  ℓ = e^(m − m_new)·ℓ + rowsum P
 *     O = e^(m − m_new)·O + P Vj        (O stays unscaled by 1/ℓ)
 *   O /= ℓ once at the end; store O and LSE = m + log ℓ (no separate ℓ, m in slow memory).
 *   Slow-memory traffic per head: Q and O once, K and V once per (Q block, visible K/V block), LSE once.
 *
 * Backward: per K/V block j (outer loop) dKj, dVj accumulate in fast memory while the inner loop over Q blocks
 *   recomputes P = exp(S − LSE) and adds dS Kj into an fp32 dQ accumulator in slow memory; D = rowsum(dO ∘ O) is
 *   computed where a Q block meets its first K/V block (a pre-pass when a head's K/V blocks are split into parts).
 *   One work item per (sequence, K/V head), so dQ, dK, dV have one writer each: race-free and deterministic
 *   without atomics.
 * bf16 storage with a bf16 dot-product kernel runs the forward in flash2_bf16.c. */
#include "cpu/cpu.h"

#include <string.h>

/* Kj, Vj rows [a, z) of a head, converted to fp32 and packed contiguously ([z − a][d], [z − a][dv]) into the thread's
 * workspace: counted as read from the tensors and written to slow memory; max |k|, |v| into mk, mv. */
static void pack_kv(const fa_problem *p, const fa_head *hd, int64_t a, int64_t z, float *Kp, float *Vp, fa_io *io,
                    uint32_t *mk, uint32_t *mv) {
    const int d = (int)p->d, dv = (int)p->d_v, n = (int)(z - a);
    const size_t es = fa_dtype_size(p->dtype);
    fa_tile_load_max(Kp, d, (const char *)hd->k + a * hd->ldk * es, p->dtype, hd->ldk, n, d, io, mk);
    fa_tile_load_max(Vp, dv, (const char *)hd->v + a * hd->ldv * es, p->dtype, hd->ldv, n, dv, io, mv);
    io->written += (int64_t)n * (d + dv) * 4;
}

/* Keys [*k0, *k1) of the tile j0.. (cols keys) that some query of rows [a, b) of the Q block i0.. can see. */
static void tile_keys(const fa_problem *p, const fa_head *hd, int64_t i0, int a, int b, int64_t j0, int cols, int *k0,
                      int *k1) {
    int64_t lo, hi;
    fa_cpu_block_keys(p, hd->sq, hd->sk, i0 + a, i0 + b, &lo, &hi);
    fa_cpu_tile_cols(lo, hi, j0, cols, k0, k1);
}

/* Sᵀ = Kj Qiᵀ on a masked tile, per 64-query panel only over the keys the panel can see (the causal diagonal tile:
 * ~¾ of the work); the rest of a panel is left for fa_cpu_scores to mask (padded query columns stay unset). */
static void masked_qk(const fa_problem *p, const fa_cpu_kernels *kr, const fa_head *hd, int64_t i0, int rows, int rp,
                      int64_t j0, int cols, const float *Kj, const float *QiT, float *ST) {
    const int d = (int)p->d;
    for (int q0 = 0; q0 < rp; q0 += 64) {
        const int nq = rp - q0 < 64 ? rp - q0 : 64;
        int k0 = 0, k1 = 0;
        if (q0 < rows) tile_keys(p, hd, i0, q0, q0 + nq < rows ? q0 + nq : rows, j0, cols, &k0, &k1);
        if (k1 > k0) kr->gemm_nn(k1 - k0, nq, d, Kj + (int64_t)k0 * d, d, 1, QiT + q0, rp, ST + (int64_t)k0 * rp + q0, rp, 0);
    }
}

/* O += P Vj on a masked tile, per 48-row chunk only over the keys the chunk can see (P = 0 elsewhere). */
static void masked_pv(const fa_problem *p, const fa_cpu_kernels *kr, const fa_head *hd, int64_t i0, int rows, int rp,
                      int64_t j0, int cols, const float *ST, const float *Vj, float *O) {
    const int dv = (int)p->d_v;
    for (int r0 = 0; r0 < rows; r0 += 48) {
        const int nr = rows - r0 < 48 ? rows - r0 : 48;
        int k0, k1;
        tile_keys(p, hd, i0, r0, r0 + nr, j0, cols, &k0, &k1);
        if (k1 > k0)
            kr->gemm_nn(nr, dv, k1 - k0, ST + (int64_t)k0 * rp + r0, 1, rp, Vj + (int64_t)k0 * dv, dv,
                        O + (int64_t)r0 * dv, dv, 1);
    }
}

/* ---- forward ---- */

/* A thread's fast tiles: Qi, Qiᵀ (Br padded to whole zmm, x d), O (x dv), the K/V tiles or pack (kvrows x d, dv),
 * Sᵀ, and the softmax state m, ℓ, α, LSE. */
typedef struct fwd_tiles {
    float *Qi, *QiT, *O, *Kp, *Vp, *ST, *m, *l, *alpha, *lse;
} fwd_tiles;

static void fwd_thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *tiles) {
    const fa_problem *p = problem;
    fwd_tiles *t = tiles;
    const size_t d = (size_t)p->d, dv = (size_t)p->d_v, brp = (size_t)fa_pad16(pl->block_q);
    const size_t kvrows = (size_t)pl->aux[FA_CPU_AUX_KVROWS];
    t->Qi = fa_take_f32(a, brp * d);
    t->QiT = fa_take_f32(a, brp * d);
    t->O = fa_take_f32(a, brp * dv);
    t->Kp = fa_take_f32(a, kvrows * d);
    t->Vp = fa_take_f32(a, kvrows * dv);
    t->ST = fa_take_f32(a, brp * (size_t)pl->block_k);
    t->m = fa_take_f32(a, brp);
    t->l = fa_take_f32(a, brp);
    t->alpha = fa_take_f32(a, brp);
    t->lse = fa_take_f32(a, brp);
}

/* One work item = `group` consecutive Q blocks of one (sequence, head). With group > 1 the K/V rows the item visits
 * are packed once (fp32, contiguous, at most kvrows keys) and shared by its Q blocks; otherwise each K/V block is
 * loaded into the tiles Kp, Vp as it is visited. */
static void fwd_run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    const int d = (int)p->d, dv = (int)p->d_v, br = pl->block_q, bc = pl->block_k;
    const int group = pl->aux[FA_CPU_AUX_GROUP], kvrows = pl->aux[FA_CPU_AUX_KVROWS];
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t tr = (p->sq_max + br - 1) / br;
    const int64_t tg = (tr + group - 1) / group, items = p->batch * p->hq * tg;
    /* softmax in base 2 with the scale folded in: P = 2^(c·S − c·m); a negative scale is moved into Qi's packing
     * so that c > 0 and m is a max; with softcap the tile holds the capped (scaled) scores */
    const float sgn = p->scale < 0 ? -1.0f : 1.0f, unit = p->softcap > 0 ? 1.0f : fabsf(p->scale);
    const float c = unit * FA_LOG2E, cap_mul = p->softcap > 0 ? fabsf(p->scale) / p->softcap : 1.0f;

#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t it = 0; it < items; it++) {
        fwd_tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *Qi = t.Qi, *QiT = t.QiT, *O = t.O, *Kp = t.Kp, *Vp = t.Vp, *ST = t.ST;
        float *m = t.m, *l = t.l, *alpha = t.alpha, *lse = t.lse;
        int64_t bh, g;
        fa_cpu_fwd_item(it, p->batch * p->hq, tg, &bh, &g);
        const int64_t b = bh / p->hq, h = bh % p->hq;
        fa_head hd;
        fa_cpu_head(p, b, h, &hd);
        const int64_t ib = g * group, ie = (hd.sq + br - 1) / br < ib + group ? (hd.sq + br - 1) / br : ib + group;
        if (ib >= ie) continue;
        int64_t klo, khi, lo, hi;
        fa_cpu_block_keys(p, hd.sq, hd.sk, ib * br, ib * br + 1, &klo, &hi);
        fa_cpu_block_keys(p, hd.sq, hd.sk, (ie - 1) * br, hd.sq < ie * br ? hd.sq : ie * br, &lo, &khi);
        klo = klo / bc * bc;
        khi = klo + (khi - klo + bc - 1) / bc * bc < hd.sk ? klo + (khi - klo + bc - 1) / bc * bc : hd.sk; /* whole tiles */
        const int packed = group > 1 && khi - klo <= kvrows;                 /* one pack for the whole item */
        /* max |q|, |k|, |v| over what the item reads: the numerics contract's certificate, without its scan */
        uint32_t mq = 0, mk = 0, mv = 0;
        if (packed && khi > klo) pack_kv(p, &hd, klo, khi, Kp, Vp, io, &mk, &mv);
        for (int64_t i = ib; i < ie; i++) {
            const int64_t i0 = i * br;
            const int rows = (int)(hd.sq - i0 < br ? hd.sq - i0 : br), rp = fa_pad16(rows);
            fa_tile_load_max(Qi, d, (const char *)hd.q + i0 * hd.ldq * es, p->dtype, hd.ldq, rows, d, io, &mq);
            memset(Qi + (int64_t)rows * d, 0, (size_t)(rp - rows) * d * 4);
            kr->pack_t(rp, d, Qi, d, QiT, rp, sgn);                       /* Qiᵀ [d][rp], once per Q block */
            for (int r = 0; r < rp; r++) { m[r] = -INFINITY; l[r] = 0; }
            memset(O, 0, (size_t)rows * dv * 4);
            fa_cpu_block_keys(p, hd.sq, hd.sk, i0, i0 + rows, &lo, &hi);
            for (int64_t j0 = lo / bc * bc; j0 < hi; j0 += bc) {
                const int cols = (int)(hd.sk - j0 < bc ? hd.sk - j0 : bc);
                const float *Kj = Kp, *Vj = Vp;
                if (packed) {
                    Kj = Kp + (j0 - klo) * d, Vj = Vp + (j0 - klo) * dv;
                    io->read += (int64_t)cols * (d + dv) * 4;             /* Kj, Vj from the packed rows */
                } else {
                    fa_tile_load_max(Kp, d, (const char *)hd.k + j0 * hd.ldk * es, p->dtype, hd.ldk, cols, d, io, &mk);
                    fa_tile_load_max(Vp, dv, (const char *)hd.v + j0 * hd.ldv * es, p->dtype, hd.ldv, cols, dv, io,
                                     &mv);
                }
                const int plain = p->softcap == 0 && !fa_cpu_tile_needs_mask(p, hd.sq, hd.sk, i0, rows, j0, cols);
                if (plain && kr->qk_softmax_t) {
                    /* Sᵀ = Kj Qiᵀ and Pᵀ = 2^(c·(Sᵀ − m)), ℓ += colsum Pᵀ in registers; m rises lazily (simd/kernels.h) */
                    if (kr->qk_softmax_t(cols, rp, d, Kj, d, QiT, rp, ST, rp, c, m, l, alpha))
                        kr->scale_rows(rows, dv, O, dv, alpha);           /* O = diag(α) O, only if m rose */
                } else {
                    if (plain) kr->gemm_nn(cols, rp, d, Kj, d, 1, QiT, rp, ST, rp, 0); /* Sᵀ = Kj Qiᵀ */
                    else masked_qk(p, kr, &hd, i0, rows, rp, j0, cols, Kj, QiT, ST);
                    if (!plain && fa_cpu_scores(p, ST, 1, rp, rows, cols, i0, j0, hd.sq, hd.sk, cap_mul, 1.0f) == 0)
                        continue;
                    /* m_new = max(m, colmax Sᵀ); Pᵀ = 2^(c·(Sᵀ − m_new)); ℓ = α·ℓ + colsum Pᵀ, α = 2^(c·(m − m_new)) */
                    kr->softmax_step_t(cols, rp, ST, rp, c, m, l, alpha);
                    kr->scale_rows(rows, dv, O, dv, alpha);               /* O = diag(α) O  */
                }
                if (plain) kr->gemm_nn(rows, dv, cols, ST, 1, rp, Vj, dv, O, dv, 1); /* O += P Vj */
                else masked_pv(p, kr, &hd, i0, rows, rp, j0, cols, ST, Vj, O);
            }
            /* O /= ℓ once; LSE = scale·max S + ln ℓ */
            fa_cpu_fwd_finish(kr, rows, dv, O, m, l, unit, hd.sink, alpha, lse);
            fa_tile_store((char *)hd.o + i0 * hd.ldo * es, p->dtype, hd.ldo, O, dv, rows, dv, io);
            if (hd.lse) fa_vec_store(hd.lse + i0, lse, rows, io);
        }
        if (!fa_cpu_certified_bits(p, mq, mk, mv, hd.sk)) io->uncertified++;
    }
}

const fa_cpu_algo fa_cpu_flash2_fwd = {FA_CPU_LAYOUT(fwd_thread_layout, fwd_tiles, NULL, char), fwd_run, 1};

/* ---- backward ---- */

/* How a call runs: the parts a head's K/V blocks are dealt to (the plan's), and from them where dQ accumulates. */
typedef struct bwd_mode {
    int nsplit;
    int acc_in_place;    /* dQ accumulates in place: f32 without split; else in fp32 partials: per thread (no split)
                            or per item */
    /* without a split, a Q block's first K/V block computes its D from Oi (dOi is in the tiles, and D is stored for
     * the later blocks) and starts its dQ at 0, instead of a pre-pass reading O and dO and zeroing dQ in slow memory;
     * with a split the parts run at once, so D comes from the pre-pass */
    int fused;
    size_t sQ;           /* floats of one dQ accumulator, group · sq_max · d (dqk), padded to 64 bytes */
} bwd_mode;

static bwd_mode mode_of(const fa_problem *p, const fa_plan *pl) {
    bwd_mode m;
    m.nsplit = pl->aux[FA_CPU_AUX_SPLIT];
    m.acc_in_place = p->dtype == FA_DTYPE_F32 && m.nsplit == 1;
    m.fused = m.nsplit == 1;
    m.sQ = ((size_t)(p->hq / p->hk * p->sq_max * p->d) + 15) & ~(size_t)15;
    return m;
}

/* A thread's slice: the backward tiles and, without a split, the thread's fp32 dQ accumulator of one K/V head's
 * query heads unless dQ accumulates in place. */
static void bwd_thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *tiles) {
    const fa_problem *p = problem;
    const bwd_mode m = mode_of(p, pl);
    fa_cpu_bwd_tiles_layout(a, (int)p->d, (int)p->d_v, pl->block_q, pl->block_k, m.fused, pl->aux[FA_CPU_AUX_BF16T],
                            m.nsplit == 1 && !m.acc_in_place ? m.sQ : 0, tiles);
}

/* Shared: D of every query row (padded to whole cache lines), and with a split one fp32 dQ partial per work item. */
typedef struct bwd_parts {
    float *Dall, *dQparts;
} bwd_parts;

static void bwd_shared_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *parts) {
    const fa_problem *p = problem;
    bwd_parts *s = parts;
    const bwd_mode m = mode_of(p, pl);
    const int64_t items = p->batch * p->hk * m.nsplit;
    s->Dall = fa_take_f32(a, ((size_t)(p->batch * p->hq * p->sq_max) + 15) & ~(size_t)15);
    s->dQparts = m.nsplit > 1 ? fa_take_f32(a, (size_t)items * m.sQ) : NULL;
}

static void bwd_run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    const bwd_mode W = mode_of(p, pl);
    bwd_parts sh;
    fa_cpu_frame_shared(f, &sh);
    const int d = (int)p->d, dv = (int)p->d_v, br = pl->block_q, bc = pl->block_k, nsplit = W.nsplit;
    const int acc_in_place = W.acc_in_place;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t group = p->hq / p->hk, sq_max = p->sq_max, items = p->batch * p->hk * nsplit;
    float *Dall = sh.Dall, *dQparts = sh.dQparts;

    /* pre-pass, per (sequence, query head): D = rowsum(dO ∘ O) (the FMA order of the tile products, so that
     * dP − D is exactly 0 where it should be); zero the dQ accumulators */
#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t bh = 0; bh < (W.fused ? 0 : p->batch * p->hq); bh++) {
        fa_cpu_bwd_tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *Oi = t.Qi, *dOi = t.dOi, *Z = t.dQi, *D_i = t.D_i; /* Qi: a row buffer of max(d, dv) floats */
        const int64_t b = bh / p->hq, h = bh % p->hq;
        fa_head hq;
        fa_cpu_head(p, b, h, &hq);
        memset(Z, 0, (size_t)br * d * 4);
        for (int64_t i0 = 0; i0 < hq.sq; i0 += br) {
            const int rows = (int)(hq.sq - i0 < br ? hq.sq - i0 : br);
            fa_tile_load(Oi, dv, (const char *)hq.o + i0 * hq.ldo * es, p->dtype, hq.ldo, rows, dv, io);
            fa_tile_load(dOi, dv, (const char *)hq.dout + i0 * hq.lddo * es, p->dtype, hq.lddo, rows, dv, io);
            kr->rowdots(rows, dv, dOi, dv, Oi, dv, D_i);
            fa_vec_store(Dall + bh * sq_max + i0, D_i, rows, io);
            if (acc_in_place)
                fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, FA_DTYPE_F32, hq.lddq, Z, d, rows, d, io);
        }
    }

    /* main loop: K/V blocks outside, Q blocks inside (FA2 Algorithm 2); one work item per (sequence, K/V head,
     * part), so dQ, dK, dV have one writer each: race-free and deterministic without atomics */
#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t it = 0; it < items; it++) {
        fa_cpu_bwd_tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *dQacc = nsplit > 1 ? dQparts + (size_t)it * W.sQ : t.dQacc;
        const int64_t b = (it / nsplit) / p->hk, hk = (it / nsplit) % p->hk, part = it % nsplit;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;
        if (!W.fused) { /* zero this item's fp32 dQ partial */
            memset(t.dQi, 0, (size_t)br * d * 4);
            for (int64_t r0 = 0; r0 < group * sq; r0 += br) {
                const int rows = (int)(group * sq - r0 < br ? group * sq - r0 : br);
                fa_tile_store(dQacc + r0 * d, FA_DTYPE_F32, d, t.dQi, d, rows, d, io);
            }
        } else { /* dQ = 0 for the Q blocks that see no key (no K/V block will start them) */
            memset(t.dQi, 0, (size_t)br * d * 4);
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    int64_t lo, hi;
                    fa_cpu_block_keys(p, sq, sk, i0, i0 + rows, &lo, &hi);
                    if (hi > lo) continue;
                    float *dq_slow = acc_in_place ? (float *)hq.dq + i0 * hq.lddq : dQacc + (g * sq + i0) * d;
                    fa_tile_store(dq_slow, FA_DTYPE_F32, acc_in_place ? hq.lddq : d, t.dQi, d, rows, d, io);
                }
            }
        }
        for (int64_t j0 = part * bc; j0 < sk; j0 += (int64_t)nsplit * bc) {
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_cpu_bwd_kv_begin(p, kr, &hd, j0, cols, &t, io);
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    if (!fa_cpu_block_sees(p, sq, sk, i0, rows, j0, cols)) continue; /* block (i, j) fully masked */
                    float *dq_slow = acc_in_place ? (float *)hq.dq + i0 * hq.lddq : dQacc + (g * sq + i0) * d;
                    float *D_slow = Dall + ((b * p->hq) + hk * group + g) * sq_max + i0;
                    int64_t lo, hi;
                    fa_cpu_block_keys(p, sq, sk, i0, i0 + rows, &lo, &hi);
                    const int first = W.fused && j0 == lo / bc * bc; /* the first K/V block this Q block sees */
                    fa_cpu_bwd_load_q(p, &hq, i0, rows, &t, io);
                    if (first) { /* D = rowsum(dO ∘ O) (the FMA order of the tile products: dP − D is exactly 0
                                    where it should be), kept for the later blocks */
                        fa_tile_load(t.Oi, dv, (const char *)hq.o + i0 * hq.ldo * es, p->dtype, hq.ldo, rows, dv,
                                     io);
                        kr->rowdots(rows, dv, t.dOi, dv, t.Oi, dv, t.D_i);
                        if (j0 + bc < hi) fa_vec_store(D_slow, t.D_i, rows, io);
                    } else {
                        fa_vec_load(t.D_i, D_slow, rows, io);
                    }
                    fa_cpu_bwd_step(p, kr, sq, sk, i0, rows, j0, cols, dq_slow, acc_in_place ? hq.lddq : d, first,
                                    &t, io);
                }
            }
            fa_cpu_bwd_kv_end(p, &hd, j0, cols, &t, io);
        }
        if (nsplit == 1 && !acc_in_place)                                   /* dQ = dQacc rounded to the dtype */
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    fa_tile_load(t.Qi, d, dQacc + (g * sq + i0) * d, FA_DTYPE_F32, d, rows, d, io);
                    fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, p->dtype, hq.lddq, t.Qi, d, rows, d, io);
                }
            }
    }

    if (nsplit > 1) { /* dQ = Σ over the parts of a head, in part order, rounded to the dtype */
        const int64_t tr = (sq_max + br - 1) / br, rows_items = p->batch * p->hq * tr;
#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
        for (int64_t it = 0; it < rows_items; it++) {
            fa_cpu_bwd_tiles t;
            fa_io *io = fa_cpu_frame_thread(f, &t);
            float *A = t.Qi, *B = t.dOi; /* row buffers of max(d, dv) floats */
            const int64_t b = it / (p->hq * tr), h = (it / tr) % p->hq, i0 = (it % tr) * br;
            fa_head hq;
            fa_cpu_head(p, b, h, &hq);
            if (i0 >= hq.sq) continue;
            const int rows = (int)(hq.sq - i0 < br ? hq.sq - i0 : br);
            const int64_t head = b * p->hk + h / group, g = h % group;
            for (int part = 0; part < nsplit; part++) {
                const float *src = dQparts + (size_t)(head * nsplit + part) * W.sQ + (g * hq.sq + i0) * d;
                fa_tile_load(part ? B : A, d, src, FA_DTYPE_F32, d, rows, d, io);
                if (part)
                    for (int64_t x = 0; x < (int64_t)rows * d; x++) A[x] += B[x];
            }
            fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, p->dtype, hq.lddq, A, d, rows, d, io);
        }
    }
}

const fa_cpu_algo fa_cpu_flash2_bwd = {FA_CPU_LAYOUT(bwd_thread_layout, fa_cpu_bwd_tiles, bwd_shared_layout, bwd_parts),
                                       bwd_run, 0};
