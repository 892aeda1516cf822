/* FA_ALGO_FLASH2 on the CPU — FlashAttention-2 (Dao 2023, Algorithms 1 and 2).
 *
 * Forward: one work item per (sequence, head, Q block i); items run in parallel (batch × heads × Tr).
 *   load Qi; m = −∞, ℓ = 0, O = 0 (all in fast memory)
 *   for each K/V block j that a row of block i can see (inner loop):
 *     load Kj, Vj;  S = scale·Qi Kjᵀ (+softcap, mask)
 *     m_new = max(m, rowmax S);  P = exp(S − m_new);  ℓ = e^(m − m_new)·ℓ + rowsum P
 *     O = e^(m − m_new)·O + P Vj        (O stays unscaled by 1/ℓ)
 *   O /= ℓ once at the end; store O and LSE = m + log ℓ (no separate ℓ, m in slow memory).
 *   Slow-memory traffic per head: Q and O once, K and V once per (Q block, visible K/V block), LSE once.
 *
 * Backward: D = rowsum(dO ∘ O) in a pre-pass; then per K/V block j (outer loop) dKj, dVj accumulate in fast
 *   memory while the inner loop over Q blocks recomputes P = exp(S − LSE) and adds dS Kj into an fp32 dQ
 *   accumulator in slow memory. One work item per (sequence, K/V head), so dQ, dK, dV have one writer each:
 *   race-free and deterministic without atomics. */
#include "cpu/fast.h"

#include <string.h>

/* Rows of bf16 from slow memory into a fast tile, unconverted (counted as fa_tile_load counts them). */
static void load_bf16_rows(uint16_t *dst, int ld_dst, const uint16_t *src, int64_t ld_src, int rows, int cols, fa_io *io) {
    for (int r = 0; r < rows; r++) memcpy(dst + (int64_t)r * ld_dst, src + r * ld_src, (size_t)cols * 2);
    io->read += (int64_t)rows * cols * 2;
}

/* The forward on bf16 storage with the AVX512_BF16 dot product (CPU_NOTES §5): the same loop as the fp32 path
 * below, with the two tile products on bf16 pairs — Sᵀ = Kj Qiᵀ reduces over d pairs (Qiᵀ packed once per Q block
 * as [d/2][Br] words of two bf16, Kj rows broadcast as words), O += P Vj over key pairs (Pᵀ rounded to bf16 and
 * interleaved by key pairs, Vj interleaved as [Bc/2][d] words). Softmax state, S and O stay fp32. */
static fa_status flash2_forward_bf16(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d, dp = d / 2;
    int br, bc;
    fa_cpu_tiles(p, &br, &bc);
    const int brp = fa_pad16(br), bcw = (bc + 1) / 2;
    const size_t tq16 = fa_align64((size_t)brp * d * 2), tk16 = fa_align64((size_t)bc * d * 2);
    const size_t tvp = fa_align64((size_t)bcw * d * 4), ts = fa_align64((size_t)brp * bc * 4);
    const size_t tpp = fa_align64((size_t)bcw * brp * 4), to = fa_align64((size_t)brp * d * 4);
    const size_t tv = fa_align64((size_t)brp * 4);
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, 2 * tq16 + 2 * tk16 + tvp + ts + tpp + to + 4 * tv, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int64_t tr = (p->sq_max + br - 1) / br, items = p->batch * p->hq * tr;
    const float unit = p->softcap > 0 ? 1.0f : fabsf(p->scale), c = unit * FA_LOG2E;
    const uint16_t sign = p->scale < 0 ? 0x8000u : 0; /* a negative scale flips the sign of Qi */

#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        uint16_t *Qi = (uint16_t *)mem;
        uint32_t *QiT = (uint32_t *)(mem + tq16);
        uint16_t *Kj = (uint16_t *)(mem + 2 * tq16), *Vj = (uint16_t *)(mem + 2 * tq16 + tk16);
        uint32_t *Vp = (uint32_t *)(mem + 2 * tq16 + 2 * tk16);
        float *ST = (float *)(mem + 2 * tq16 + 2 * tk16 + tvp);
        uint32_t *Pp = (uint32_t *)(mem + 2 * tq16 + 2 * tk16 + tvp + ts);
        float *O = (float *)(mem + 2 * tq16 + 2 * tk16 + tvp + ts + tpp);
        float *m = (float *)(mem + 2 * tq16 + 2 * tk16 + tvp + ts + tpp + to), *l = m + tv / 4, *alpha = l + tv / 4;
        float *lse = alpha + tv / 4;
        fa_io *io = &w.io[t];
        const int64_t b = it / (p->hq * tr), h = (it / tr) % p->hq, i = tr - 1 - it % tr;
        fa_head hd;
        fa_cpu_head(p, b, h, &hd);
        const int64_t i0 = i * br;
        if (i0 >= hd.sq) continue;
        const int rows = (int)(hd.sq - i0 < br ? hd.sq - i0 : br), rp = fa_pad16(rows);

        load_bf16_rows(Qi, d, (const uint16_t *)hd.q + i0 * hd.ldq, hd.ldq, rows, d, io);
        memset(Qi + (int64_t)rows * d, 0, (size_t)(rp - rows) * d * 2);
        if (sign)
            for (int64_t x = 0; x < (int64_t)rows * d; x++) Qi[x] ^= sign;
        kr->pack_t32(rp, dp, (const uint32_t *)Qi, dp, QiT, rp);          /* Qiᵀ as [d/2][rp] bf16 pairs */
        for (int r = 0; r < rp; r++) { m[r] = -INFINITY; l[r] = 0; }
        memset(O, 0, (size_t)rows * d * 4);
        int64_t lo, hi;
        fa_cpu_block_keys(p, hd.sq, hd.sk, i0, i0 + rows, &lo, &hi);
        for (int64_t j0 = lo / bc * bc; j0 < hi; j0 += bc) {
            const int cols = (int)(hd.sk - j0 < bc ? hd.sk - j0 : bc), cw = (cols + 1) / 2;
            load_bf16_rows(Kj, d, (const uint16_t *)hd.k + j0 * hd.ldk, hd.ldk, cols, d, io);
            load_bf16_rows(Vj, d, (const uint16_t *)hd.v + j0 * hd.ldv, hd.ldv, cols, d, io);
            kr->gemm_bf16(cols, rp, dp, (const uint32_t *)Kj, dp, 1, QiT, rp, ST, rp, 0); /* Sᵀ = Kj Qiᵀ */
            if ((p->softcap > 0 || fa_cpu_tile_needs_mask(p, hd.sq, hd.sk, i0, rows, j0, cols)) &&
                fa_cpu_scores_t(p, ST, rp, rows, cols, i0, j0, hd.sq, hd.sk) == 0)
                continue;
            kr->softmax_step_t(cols, rp, ST, rp, c, m, l, alpha);            /* Pᵀ, m, ℓ, α (fp32) */
            kr->pairs_f32_bf16(cols, rp, ST, rp, Pp, rp);                    /* Pᵀ -> bf16 key pairs */
            kr->pairs_bf16(cols, d, Vj, d, Vp, d);                           /* Vj -> bf16 key pairs */
            kr->scale_rows(rows, d, O, d, alpha);                            /* O = diag(α) O */
            kr->gemm_bf16(rows, d, cw, Pp, 1, rp, Vp, d, O, d, 1);           /* O += P Vj */
        }
        for (int r = 0; r < rows; r++) {
            alpha[r] = l[r] > 0 ? 1.0f / l[r] : 0.0f;
            lse[r] = l[r] > 0 ? m[r] * unit + logf(l[r]) : -INFINITY;
        }
        kr->scale_rows(rows, d, O, d, alpha);
        fa_tile_store((char *)hd.o + i0 * hd.ldo * 2, p->dtype, hd.ldo, O, d, rows, d, io);
        if (hd.lse) fa_vec_store(hd.lse + i0, lse, rows, io);
    }
    fa_cpu_ws_finish(&w, st, "cpu.flash2.bf16dot", br, bc, w.per * (size_t)w.threads);
    return FA_OK;
}

/* Kj, Vj rows [a, z) of a head, converted to fp32 and packed contiguously ([z − a][d] each) into the thread's
 * workspace: counted as read from the tensors and written to slow memory. */
static void pack_kv(const fa_problem *p, const fa_head *hd, int64_t a, int64_t z, float *Kp, float *Vp, fa_io *io) {
    const int d = (int)p->d, n = (int)(z - a);
    const size_t es = fa_dtype_size(p->dtype);
    fa_tile_load(Kp, d, (const char *)hd->k + a * hd->ldk * es, p->dtype, hd->ldk, n, d, io);
    fa_tile_load(Vp, d, (const char *)hd->v + a * hd->ldv * es, p->dtype, hd->ldv, n, d, io);
    io->written += 2 * (int64_t)n * d * 4;
}

/* Keys [*k0, *k1) of the tile j0.. (cols keys) that some query of rows [a, b) of the Q block i0.. can see. */
static void tile_keys(const fa_problem *p, const fa_head *hd, int64_t i0, int a, int b, int64_t j0, int cols, int *k0,
                      int *k1) {
    int64_t lo, hi;
    fa_cpu_block_keys(p, hd->sq, hd->sk, i0 + a, i0 + b, &lo, &hi);
    fa_cpu_tile_cols(lo, hi, j0, cols, k0, k1);
}

/* Sᵀ = Kj Qiᵀ on a masked tile, per 64-query panel only over the keys the panel can see (the causal diagonal tile:
 * ~¾ of the work); the rest of a panel is left for fa_cpu_scores_t to mask (padded query columns stay unset). */
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
    const int d = (int)p->d;
    for (int r0 = 0; r0 < rows; r0 += 48) {
        const int nr = rows - r0 < 48 ? rows - r0 : 48;
        int k0, k1;
        tile_keys(p, hd, i0, r0, r0 + nr, j0, cols, &k0, &k1);
        if (k1 > k0)
            kr->gemm_nn(nr, d, k1 - k0, ST + (int64_t)k0 * rp + r0, 1, rp, Vj + (int64_t)k0 * d, d, O + (int64_t)r0 * d, d, 1);
    }
}

fa_status fa_cpu_flash2_forward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    if (p->dtype == FA_DTYPE_BF16 && kr->bf16_dot && p->d % 2 == 0) return flash2_forward_bf16(ctx, p, st);
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    int br, bc, group, seg;
    fa_cpu_tiles(p, &br, &bc);
    const int64_t tr = (p->sq_max + br - 1) / br;
    fa_cpu_kv_pack(p, tr, bc, &group, &seg);
    const int brp = fa_pad16(br);                     /* queries of a transposed tile, padded to whole zmm */
    /* rows of the pack buffer: none (one K/V tile) when no item's keys can fit, as without a mask beyond seg keys */
    const int64_t sk_tiles = (p->sk_max + bc - 1) / bc * bc;
    const int64_t kvrows = seg <= bc || (p->wl < 0 && p->wr < 0 && sk_tiles > seg) ? bc : seg < sk_tiles ? seg : sk_tiles;
    const size_t tq = fa_align64((size_t)brp * d * 4), tkv = fa_align64((size_t)kvrows * d * 4);
    const size_t ts = fa_align64((size_t)brp * bc * 4), tv = fa_align64((size_t)brp * 4);
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, 3 * tq + 2 * tkv + ts + 4 * tv, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int64_t tg = (tr + group - 1) / group, items = p->batch * p->hq * tg;
    /* softmax in base 2 with the scale folded in: P = 2^(c·S − c·m) (CPU_NOTES §4); a negative scale is moved
     * into Qi's packing so that c > 0 and m is a max; with softcap the tile holds the capped (scaled) scores */
    const float sgn = p->scale < 0 ? -1.0f : 1.0f, unit = p->softcap > 0 ? 1.0f : fabsf(p->scale);
    const float c = unit * FA_LOG2E;

    /* One work item = `group` consecutive Q blocks of one (sequence, head). With group > 1 the K/V rows the item
     * visits are packed once (fp32, contiguous, at most seg keys) and shared by its Q blocks: the strided rows of a
     * BSHD tensor are a TLB miss each (one 4 KiB page per row), which made the per-block copy ~8 % of the time.
     * Otherwise each K/V block is loaded into the fast tiles Kp, Vp as it is visited. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        float *Qi = (float *)mem, *QiT = (float *)(mem + tq), *O = (float *)(mem + 2 * tq);
        float *Kp = (float *)(mem + 3 * tq), *Vp = (float *)(mem + 3 * tq + tkv), *ST = (float *)(mem + 3 * tq + 2 * tkv);
        float *m = (float *)(mem + 3 * tq + 2 * tkv + ts), *l = m + tv / 4, *alpha = l + tv / 4, *lse = alpha + tv / 4;
        fa_io *io = &w.io[t];
        /* last Q blocks first: under a causal mask they are the longest (load balance) */
        const int64_t b = it / (p->hq * tg), h = (it / tg) % p->hq, g = tg - 1 - it % tg;
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
        if (packed && khi > klo) pack_kv(p, &hd, klo, khi, Kp, Vp, io);
        for (int64_t i = ib; i < ie; i++) {
            const int64_t i0 = i * br;
            const int rows = (int)(hd.sq - i0 < br ? hd.sq - i0 : br), rp = fa_pad16(rows);
            fa_tile_load(Qi, d, (const char *)hd.q + i0 * hd.ldq * es, p->dtype, hd.ldq, rows, d, io);
            memset(Qi + (int64_t)rows * d, 0, (size_t)(rp - rows) * d * 4);
            kr->pack_t(rp, d, Qi, d, QiT, rp, sgn);                       /* Qiᵀ [d][rp], once per Q block */
            for (int r = 0; r < rp; r++) { m[r] = -INFINITY; l[r] = 0; }
            memset(O, 0, (size_t)rows * d * 4);
            fa_cpu_block_keys(p, hd.sq, hd.sk, i0, i0 + rows, &lo, &hi);
            for (int64_t j0 = lo / bc * bc; j0 < hi; j0 += bc) {
                const int cols = (int)(hd.sk - j0 < bc ? hd.sk - j0 : bc);
                const float *Kj = Kp, *Vj = Vp;
                if (packed) {
                    Kj = Kp + (j0 - klo) * d, Vj = Vp + (j0 - klo) * d;
                    io->read += 2 * (int64_t)cols * d * 4;                /* Kj, Vj from the packed rows */
                } else {
                    fa_tile_load(Kp, d, (const char *)hd.k + j0 * hd.ldk * es, p->dtype, hd.ldk, cols, d, io);
                    fa_tile_load(Vp, d, (const char *)hd.v + j0 * hd.ldv * es, p->dtype, hd.ldv, cols, d, io);
                }
                const int plain = p->softcap == 0 && !fa_cpu_tile_needs_mask(p, hd.sq, hd.sk, i0, rows, j0, cols);
                if (plain && kr->qk_softmax_t) {
                    /* Sᵀ = Kj Qiᵀ and Pᵀ = 2^(c·(Sᵀ − m)), ℓ += colsum Pᵀ in registers; m rises lazily (kernels.h) */
                    if (kr->qk_softmax_t(cols, rp, d, Kj, d, QiT, rp, ST, rp, c, m, l, alpha))
                        kr->scale_rows(rows, d, O, d, alpha);             /* O = diag(α) O, only if m rose */
                } else {
                    if (plain) kr->gemm_nn(cols, rp, d, Kj, d, 1, QiT, rp, ST, rp, 0); /* Sᵀ = Kj Qiᵀ */
                    else masked_qk(p, kr, &hd, i0, rows, rp, j0, cols, Kj, QiT, ST);
                    if (!plain && fa_cpu_scores_t(p, ST, rp, rows, cols, i0, j0, hd.sq, hd.sk) == 0) continue;
                    /* m_new = max(m, colmax Sᵀ); Pᵀ = 2^(c·(Sᵀ − m_new)); ℓ = α·ℓ + colsum Pᵀ, α = 2^(c·(m − m_new)) */
                    kr->softmax_step_t(cols, rp, ST, rp, c, m, l, alpha);
                    kr->scale_rows(rows, d, O, d, alpha);                 /* O = diag(α) O  */
                }
                if (plain) kr->gemm_nn(rows, d, cols, ST, 1, rp, Vj, d, O, d, 1); /* O += P Vj */
                else masked_pv(p, kr, &hd, i0, rows, rp, j0, cols, ST, Vj, O);
            }
            for (int r = 0; r < rows; r++) {                              /* O /= ℓ, once   */
                alpha[r] = l[r] > 0 ? 1.0f / l[r] : 0.0f;
                lse[r] = l[r] > 0 ? m[r] * unit + logf(l[r]) : -INFINITY; /* scale·max S + ln ℓ */
            }
            kr->scale_rows(rows, d, O, d, alpha);
            fa_tile_store((char *)hd.o + i0 * hd.ldo * es, p->dtype, hd.ldo, O, d, rows, d, io);
            if (hd.lse) fa_vec_store(hd.lse + i0, lse, rows, io);
        }
    }
    fa_cpu_ws_finish(&w, st, "cpu.flash2", br, bc, w.per * (size_t)w.threads);
    return FA_OK;
}

fa_status fa_cpu_flash2_backward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t group = p->hq / p->hk, sq_max = p->sq_max;
    int br, bc;
    fa_cpu_tiles(p, &br, &bc);
    const int bcp = fa_pad16(bc);
    const size_t tq = fa_align64((size_t)br * d * 4), tk = fa_align64((size_t)bc * d * 4);
    const size_t tkt = fa_align64((size_t)d * bcp * 4), ts = fa_align64((size_t)br * bcp * 4);
    const size_t tv = fa_align64((size_t)br * 4);
    /* Work items: (sequence, K/V head), each a whole KV-outer loop. With fewer items than threads (one long
     * head, ≥ 16 K/V blocks) the K/V blocks of a head are dealt round-robin to nsplit parts (balanced under a causal
     * mask), each part adding into its own fp32 dQ partial, summed in a fixed order afterwards (deterministic; the
     * partials add 2·nsplit·N·d·4 bytes of slow-memory traffic and nsplit·N·d·4 bytes of workspace). */
    const int64_t heads = p->batch * p->hk;
    const int nsplit = heads < ctx->threads && p->sk_max >= 16 * (int64_t)bc ? (int)((ctx->threads + heads - 1) / heads) : 1;
    const int64_t items = heads * nsplit;
    /* dQ accumulates in place for f32 without split; else in fp32 partials: per thread (no split) or per item */
    const int acc_in_place = p->dtype == FA_DTYPE_F32 && nsplit == 1;
    const size_t sQ = fa_align64((size_t)(group * sq_max * d) * 4);
    const size_t fast = 3 * tq + 4 * tk + 2 * tkt + 2 * ts + 2 * tv;
    const size_t per = fast + (nsplit == 1 && !acc_in_place ? sQ : 0);
    const size_t sD = fa_align64((size_t)(p->batch * p->hq * sq_max) * 4);
    const size_t shared = sD + (nsplit > 1 ? (size_t)items * sQ : 0);
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, per, shared, &w)) return FA_ERR_OUT_OF_MEMORY;
    float *Dall = (float *)fa_cpu_ws_shared(&w), *dQparts = (float *)(fa_cpu_ws_shared(&w) + sD);

    /* pre-pass, per (sequence, query head): D = rowsum(dO ∘ O) (the FMA order of the tile products, so that
     * dP − D is exactly 0 where it should be); zero the dQ accumulators */
#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t bh = 0; bh < p->batch * p->hq; bh++) {
        const int t = fa_thread_id();
        float *Oi = (float *)fa_cpu_ws_thread(&w, t), *dOi = Oi + tq / 4, *Z = dOi + tq / 4, *D_i = Z + tq / 4;
        fa_io *io = &w.io[t];
        const int64_t b = bh / p->hq, h = bh % p->hq;
        fa_head hq;
        fa_cpu_head(p, b, h, &hq);
        memset(Z, 0, (size_t)br * d * 4);
        for (int64_t i0 = 0; i0 < hq.sq; i0 += br) {
            const int rows = (int)(hq.sq - i0 < br ? hq.sq - i0 : br);
            fa_tile_load(Oi, d, (const char *)hq.o + i0 * hq.ldo * es, p->dtype, hq.ldo, rows, d, io);
            fa_tile_load(dOi, d, (const char *)hq.dout + i0 * hq.lddo * es, p->dtype, hq.lddo, rows, d, io);
            for (int r = 0; r < rows; r++) D_i[r] = fa_cpu_rowdot(d, dOi + (int64_t)r * d, Oi + (int64_t)r * d);
            fa_vec_store(Dall + bh * sq_max + i0, D_i, rows, io);
            if (acc_in_place)
                fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, FA_DTYPE_F32, hq.lddq, Z, d, rows, d, io);
        }
    }

    /* main loop: K/V blocks outside, Q blocks inside (FA2 Algorithm 2) */
#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        float *Qi = (float *)mem, *dOi = (float *)(mem + tq), *dQi = (float *)(mem + 2 * tq);
        float *Kj = (float *)(mem + 3 * tq), *Vj = Kj + tk / 4, *dKj = Vj + tk / 4, *dVj = dKj + tk / 4;
        float *KjT = dVj + tk / 4, *VjT = KjT + tkt / 4, *S = VjT + tkt / 4, *dP = S + ts / 4;
        float *lse_i = dP + ts / 4, *D_i = lse_i + tv / 4;
        float *dQacc = nsplit > 1 ? dQparts + (size_t)it * (sQ / 4) : (float *)(mem + fast);
        fa_io *io = &w.io[t];
        const int64_t b = (it / nsplit) / p->hk, hk = (it / nsplit) % p->hk, part = it % nsplit;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;
        if (!acc_in_place) { /* zero this item's fp32 dQ partial */
            memset(dQi, 0, (size_t)br * d * 4);
            for (int64_t r0 = 0; r0 < group * sq; r0 += br) {
                const int rows = (int)(group * sq - r0 < br ? group * sq - r0 : br);
                fa_tile_store(dQacc + r0 * d, FA_DTYPE_F32, d, dQi, d, rows, d, io);
            }
        }
        for (int64_t j0 = part * bc; j0 < sk; j0 += (int64_t)nsplit * bc) {
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Kj, d, (const char *)hd.k + j0 * hd.ldk * es, p->dtype, hd.ldk, cols, d, io);
            fa_tile_load(Vj, d, (const char *)hd.v + j0 * hd.ldv * es, p->dtype, hd.ldv, cols, d, io);
            kr->pack_t(cols, d, Kj, d, KjT, bcp, 1.0f);                      /* Kjᵀ, Vjᵀ once per K/V block */
            kr->pack_t(cols, d, Vj, d, VjT, bcp, 1.0f);
            memset(dKj, 0, (size_t)cols * d * 4);
            memset(dVj, 0, (size_t)cols * d * 4);
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    int64_t lo, hi;
                    fa_cpu_block_keys(p, sq, sk, i0, i0 + rows, &lo, &hi);
                    if (hi <= j0 || lo >= j0 + cols) continue;              /* block (i, j) fully masked */
                    fa_tile_load(Qi, d, (const char *)hq.q + i0 * hq.ldq * es, p->dtype, hq.ldq, rows, d, io);
                    fa_tile_load(dOi, d, (const char *)hq.dout + i0 * hq.lddo * es, p->dtype, hq.lddo, rows, d, io);
                    fa_vec_load(lse_i, hq.lse + i0, rows, io);
                    fa_vec_load(D_i, Dall + ((b * p->hq) + hk * group + g) * sq_max + i0, rows, io);
                    float *dq_slow = acc_in_place ? (float *)hq.dq + i0 * hq.lddq : dQacc + (g * sq + i0) * d;
                    const int64_t ld_slow = acc_in_place ? hq.lddq : d;
                    fa_tile_load(dQi, d, dq_slow, FA_DTYPE_F32, ld_slow, rows, d, io);
                    if (p->softcap > 0)
                        fa_cpu_bwd_tile(p, kr, rows, cols, i0, j0, sq, sk, Qi, dOi, lse_i, D_i, Kj, Vj, S, dP, dQi, d,
                                        dKj, dVj);
                    else /* S = Qi Kjᵀ, P, dVj += Pᵀ dOi, dP = dOi Vjᵀ, dS, dQi += dS Kj, dKj += dSᵀ Qi */
                        fa_cpu_bwd_tile_fast(p, kr, rows, cols, i0, j0, sq, sk, Qi, dOi, lse_i, D_i, Kj, KjT, VjT,
                                             bcp, S, dP, dQi, d, dKj, dVj);
                    fa_tile_store(dq_slow, FA_DTYPE_F32, ld_slow, dQi, d, rows, d, io);
                }
            }
            fa_tile_store((char *)hd.dk + j0 * hd.lddk * es, p->dtype, hd.lddk, dKj, d, cols, d, io);
            fa_tile_store((char *)hd.dv + j0 * hd.lddv * es, p->dtype, hd.lddv, dVj, d, cols, d, io);
        }
        if (nsplit == 1 && !acc_in_place)                                   /* dQ = dQacc rounded to the dtype */
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    fa_tile_load(Qi, d, dQacc + (g * sq + i0) * d, FA_DTYPE_F32, d, rows, d, io);
                    fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, p->dtype, hq.lddq, Qi, d, rows, d, io);
                }
            }
    }

    if (nsplit > 1) { /* dQ = Σ over the parts of a head, in part order, rounded to the dtype */
        const int64_t tr = (sq_max + br - 1) / br, rows_items = p->batch * p->hq * tr;
#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
        for (int64_t it = 0; it < rows_items; it++) {
            const int t = fa_thread_id();
            float *A = (float *)fa_cpu_ws_thread(&w, t), *B = A + tq / 4;
            fa_io *io = &w.io[t];
            const int64_t b = it / (p->hq * tr), h = (it / tr) % p->hq, i0 = (it % tr) * br;
            fa_head hq;
            fa_cpu_head(p, b, h, &hq);
            if (i0 >= hq.sq) continue;
            const int rows = (int)(hq.sq - i0 < br ? hq.sq - i0 : br);
            const int64_t head = b * p->hk + h / group, g = h % group;
            for (int part = 0; part < nsplit; part++) {
                const float *src = dQparts + (size_t)(head * nsplit + part) * (sQ / 4) + (g * hq.sq + i0) * d;
                fa_tile_load(part ? B : A, d, src, FA_DTYPE_F32, d, rows, d, io);
                if (part)
                    for (int64_t x = 0; x < (int64_t)rows * d; x++) A[x] += B[x];
            }
            fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, p->dtype, hq.lddq, A, d, rows, d, io);
        }
    }
    fa_cpu_ws_finish(&w, st, "cpu.flash2", br, bc, w.per * (size_t)w.threads + shared);
    return FA_OK;
}
