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
#include "cpu/cpu.h"

#include <string.h>

fa_status fa_cpu_flash2_forward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    int br, bc;
    fa_cpu_blocks(p, &br, &bc);
    const size_t tq = fa_align64((size_t)br * d * 4), tk = fa_align64((size_t)bc * d * 4);
    const size_t ts = fa_align64((size_t)br * bc * 4), tv = fa_align64((size_t)br * 4);
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, 2 * tq + 2 * tk + ts + 3 * tv, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int64_t tr = (p->sq_max + br - 1) / br, items = p->batch * p->hq * tr;

#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        float *Qi = (float *)mem, *O = (float *)(mem + tq), *Kj = (float *)(mem + 2 * tq);
        float *Vj = (float *)(mem + 2 * tq + tk), *S = (float *)(mem + 2 * tq + 2 * tk);
        float *m = (float *)(mem + 2 * tq + 2 * tk + ts), *l = m + tv / 4, *lse = l + tv / 4;
        fa_io *io = &w.io[t];
        /* last Q blocks first: under a causal mask they are the longest (load balance) */
        const int64_t b = it / (p->hq * tr), h = (it / tr) % p->hq, i = tr - 1 - it % tr;
        fa_head hd;
        fa_cpu_head(p, b, h, &hd);
        const int64_t i0 = i * br;
        if (i0 >= hd.sq) continue;
        const int rows = (int)(hd.sq - i0 < br ? hd.sq - i0 : br);

        fa_tile_load(Qi, d, (const char *)hd.q + i0 * hd.ldq * es, p->dtype, hd.ldq, rows, d, io);
        for (int r = 0; r < rows; r++) { m[r] = -INFINITY; l[r] = 0; }
        memset(O, 0, (size_t)rows * d * 4);
        int64_t lo, hi;
        fa_cpu_block_keys(p, hd.sq, hd.sk, i0, i0 + rows, &lo, &hi);
        for (int64_t j0 = lo / bc * bc; j0 < hi; j0 += bc) {
            const int cols = (int)(hd.sk - j0 < bc ? hd.sk - j0 : bc);
            fa_tile_load(Kj, d, (const char *)hd.k + j0 * hd.ldk * es, p->dtype, hd.ldk, cols, d, io);
            fa_tile_load(Vj, d, (const char *)hd.v + j0 * hd.ldv * es, p->dtype, hd.ldv, cols, d, io);
            kr->gemm_abt(rows, cols, d, Qi, d, Kj, d, S, cols);            /* S = Qi Kjᵀ */
            if (fa_cpu_scores(p, S, cols, rows, cols, i0, j0, hd.sq, hd.sk) == 0) continue;
            for (int r = 0; r < rows; r++) {
                float *s = S + (int64_t)r * cols, mx = m[r];
                for (int c = 0; c < cols; c++) mx = s[c] > mx ? s[c] : mx;  /* m_new = max(m, rowmax S) */
                if (mx == -INFINITY) { memset(s, 0, (size_t)cols * 4); continue; }
                const float alpha = expf(m[r] - mx);                        /* e^(m − m_new); 0 when m = −∞ */
                float sum = 0;
                for (int c = 0; c < cols; c++) { s[c] = expf(s[c] - mx); sum += s[c]; } /* P = exp(S − m_new) */
                l[r] = alpha * l[r] + sum;
                m[r] = mx;
                if (alpha != 1.0f)
                    for (int x = 0; x < d; x++) O[(int64_t)r * d + x] *= alpha;
            }
            kr->gemm_ab_acc(rows, d, cols, S, cols, Vj, d, O, d);          /* O += P Vj */
        }
        for (int r = 0; r < rows; r++) {                                    /* O /= ℓ, once */
            const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
            for (int x = 0; x < d; x++) O[(int64_t)r * d + x] *= inv;
            lse[r] = l[r] > 0 ? m[r] + logf(l[r]) : -INFINITY;
        }
        fa_tile_store((char *)hd.o + i0 * hd.ldo * es, p->dtype, hd.ldo, O, d, rows, d, io);
        if (hd.lse) fa_vec_store(hd.lse + i0, lse, rows, io);
    }
    fa_cpu_ws_finish(&w, st, "cpu.flash2", br, bc, w.per * (size_t)w.threads);
    return FA_OK;
}

fa_status fa_cpu_flash2_backward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t group = p->hq / p->hk;
    int br, bc;
    fa_cpu_blocks(p, &br, &bc);
    const size_t tq = fa_align64((size_t)br * d * 4), tk = fa_align64((size_t)bc * d * 4);
    const size_t ts = fa_align64((size_t)br * bc * 4), tv = fa_align64((size_t)br * 4);
    /* slow memory per thread: D [group][sq] and the fp32 dQ accumulator [group][sq][d] (not needed for f32: dq is
     * accumulated in place) */
    const int acc_in_place = p->dtype == FA_DTYPE_F32;
    const size_t sD = fa_align64((size_t)(group * p->sq_max) * 4);
    const size_t sQ = acc_in_place ? 0 : fa_align64((size_t)(group * p->sq_max * d) * 4);
    const size_t fast = 3 * tq + 4 * tk + 2 * ts + 2 * tv;
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, fast + sD + sQ, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int64_t items = p->batch * p->hk;

#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        float *Qi = (float *)mem, *dOi = (float *)(mem + tq), *Oi = (float *)(mem + 2 * tq);
        float *Kj = (float *)(mem + 3 * tq), *Vj = Kj + tk / 4, *dKj = Vj + tk / 4, *dVj = dKj + tk / 4;
        float *S = dVj + tk / 4, *dP = S + ts / 4, *lse_i = dP + ts / 4, *D_i = lse_i + tv / 4;
        float *Dall = (float *)(mem + fast), *dQall = (float *)(mem + fast + sD);
        float *dQi = Oi; /* the pre-pass's O tile doubles as the dQ tile of the main loop */
        fa_io *io = &w.io[t];
        const int64_t b = it / p->hk, hk = it % p->hk;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;

        /* pre-pass: D = rowsum(dO ∘ O); zero the dQ accumulator */
        for (int64_t g = 0; g < group; g++) {
            fa_head hq;
            fa_cpu_head(p, b, hk * group + g, &hq);
            for (int64_t i0 = 0; i0 < sq; i0 += br) {
                const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                fa_tile_load(Oi, d, (const char *)hq.o + i0 * hq.ldo * es, p->dtype, hq.ldo, rows, d, io);
                fa_tile_load(dOi, d, (const char *)hq.dout + i0 * hq.lddo * es, p->dtype, hq.lddo, rows, d, io);
                for (int r = 0; r < rows; r++) {
                    float acc = 0;
                    for (int x = 0; x < d; x++) acc += Oi[(int64_t)r * d + x] * dOi[(int64_t)r * d + x];
                    D_i[r] = acc;
                }
                fa_vec_store(Dall + g * sq + i0, D_i, rows, io);
                memset(Qi, 0, (size_t)rows * d * 4);
                if (acc_in_place)
                    fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, FA_DTYPE_F32, hq.lddq, Qi, d, rows, d, io);
                else
                    fa_tile_store(dQall + (g * sq + i0) * d, FA_DTYPE_F32, d, Qi, d, rows, d, io);
            }
        }
        /* main loop: K/V blocks outside, Q blocks inside */
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Kj, d, (const char *)hd.k + j0 * hd.ldk * es, p->dtype, hd.ldk, cols, d, io);
            fa_tile_load(Vj, d, (const char *)hd.v + j0 * hd.ldv * es, p->dtype, hd.ldv, cols, d, io);
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
                    fa_vec_load(D_i, Dall + g * sq + i0, rows, io);
                    float *dq_slow = acc_in_place ? (float *)hq.dq + i0 * hq.lddq : dQall + (g * sq + i0) * d;
                    const int64_t ld_slow = acc_in_place ? hq.lddq : d;
                    fa_tile_load(dQi, d, dq_slow, FA_DTYPE_F32, ld_slow, rows, d, io);
                    fa_cpu_bwd_tile(p, kr, rows, cols, i0, j0, sq, sk, Qi, dOi, lse_i, D_i, Kj, Vj, S, dP, dQi, d,
                                    dKj, dVj);
                    fa_tile_store(dq_slow, FA_DTYPE_F32, ld_slow, dQi, d, rows, d, io);
                }
            }
            fa_tile_store((char *)hd.dk + j0 * hd.lddk * es, p->dtype, hd.lddk, dKj, d, cols, d, io);
            fa_tile_store((char *)hd.dv + j0 * hd.lddv * es, p->dtype, hd.lddv, dVj, d, cols, d, io);
        }
        if (!acc_in_place)                                                  /* dQ = dQacc rounded to the dtype */
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    fa_tile_load(Qi, d, dQall + (g * sq + i0) * d, FA_DTYPE_F32, d, rows, d, io);
                    fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, p->dtype, hq.lddq, Qi, d, rows, d, io);
                }
            }
    }
    fa_cpu_ws_finish(&w, st, "cpu.flash2", br, bc, w.per * (size_t)w.threads);
    return FA_OK;
}
