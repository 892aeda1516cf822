/* FA_ALGO_FLASH1 on the CPU — FlashAttention-1 (Dao et al. 2022), Algorithm 1 (forward) and Algorithm 4
 * (backward), faithfully: the outer loop runs over K/V blocks and the inner loop over Q blocks, so the running
 * output O and the softmax statistics ℓ, m live in slow memory and are read and written back on every inner step.
 * Work is parallel over batch × heads only (one head is one sequential Algorithm 1).
 *
 * Forward, per (sequence, head):
 *   O = 0, ℓ = 0, m = −∞ in slow memory (fp32: O is the output itself; f16/bf16: an fp32 copy in the workspace)
 *   for each K/V block j (outer):  load Kj, Vj
 *     for each Q block i that sees block j (inner):  load Qi, Oi, ℓi, mi
 *       S = scale·Qi Kjᵀ;  m̃ = rowmax S;  P̃ = exp(S − m̃);  ℓ̃ = rowsum P̃
 *       m_new = max(mi, m̃);  ℓ_new = e^(mi − m_new) ℓi + e^(m̃ − m_new) ℓ̃
 *       Oi = diag(ℓ_new)⁻¹ (diag(ℓi) e^(mi − m_new) Oi + e^(m̃ − m_new) P̃ Vj);  store Oi, ℓ_new, m_new
 *   LSE = m + log ℓ (and, for f16/bf16, O rounded into the output).
 * Backward (Algorithm 4, with LSE standing in for the pair ℓ, m: diag(ℓ)⁻¹ exp(S − m) = exp(S − LSE)):
 *   for each K/V block j (outer): dKj = dVj = 0; for each Q block i (inner): load Qi, Oi, dOi, dQi, LSEi;
 *   Di = rowsum(dOi ∘ Oi) recomputed on every step (V1 has no pre-pass); the tile step of fa_cpu_bwd_tile;
 *   write dQi back; after the inner loop write dKj, dVj. */
#include "cpu/fast.h"

#include <string.h>

fa_status fa_cpu_flash1_forward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    int br, bc;
    fa_cpu_tiles(p, &br, &bc);
    const int brp = fa_pad16(br);
    const size_t tq = fa_align64((size_t)brp * d * 4), tk = fa_align64((size_t)bc * d * 4);
    const size_t ts = fa_align64((size_t)brp * bc * 4), tv = fa_align64((size_t)brp * 4);
    const int o_in_place = p->dtype == FA_DTYPE_F32;
    const size_t fast = 4 * tq + 2 * tk + ts + 5 * tv;
    const size_t slow_lm = 2 * fa_align64((size_t)p->sq_max * 4);
    const size_t slow_o = o_in_place ? 0 : fa_align64((size_t)(p->sq_max * d) * 4);
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, fast + slow_lm + slow_o, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int64_t items = p->batch * p->hq;
    /* base-2 softmax with the scale folded in, as in flash2.c (negative scale moved into the Qi packing) */
    const float sgn = p->scale < 0 ? -1.0f : 1.0f, unit = p->softcap > 0 ? 1.0f : fabsf(p->scale);
    const float c = unit * FA_LOG2E;

#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        float *Qi = (float *)mem, *QiT = (float *)(mem + tq), *Oi = (float *)(mem + 2 * tq);
        float *PV = (float *)(mem + 3 * tq), *Kj = (float *)(mem + 4 * tq), *Vj = Kj + tk / 4, *ST = Vj + tk / 4;
        float *li = ST + ts / 4, *mi = li + tv / 4, *lt = mi + tv / 4, *mt = lt + tv / 4, *al = mt + tv / 4;
        float *l_slow = (float *)(mem + fast), *m_slow = l_slow + slow_lm / 8;
        float *o_ws = (float *)(mem + fast + slow_lm);
        fa_io *io = &w.io[t];
        const int64_t b = it / p->hq, h = it % p->hq;
        fa_head hd;
        fa_cpu_head(p, b, h, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;
        /* O lives in slow memory: the output itself (f32) or an fp32 buffer */
        float *o_slow = o_in_place ? (float *)hd.o : o_ws;
        const int64_t ld_o = o_in_place ? hd.ldo : d;

        /* initialise O = 0, ℓ = 0, m = −∞ in slow memory */
        memset(Oi, 0, tq);
        for (int r = 0; r < brp; r++) { li[r] = 0; mi[r] = -INFINITY; }
        for (int64_t i0 = 0; i0 < sq; i0 += br) {
            const int rows = (int)(sq - i0 < br ? sq - i0 : br);
            fa_tile_store(o_slow + i0 * ld_o, FA_DTYPE_F32, ld_o, Oi, d, rows, d, io);
            fa_vec_store(l_slow + i0, li, rows, io);
            fa_vec_store(m_slow + i0, mi, rows, io);
        }
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {                           /* outer loop: K/V blocks */
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Kj, d, (const char *)hd.k + j0 * hd.ldk * es, p->dtype, hd.ldk, cols, d, io);
            fa_tile_load(Vj, d, (const char *)hd.v + j0 * hd.ldv * es, p->dtype, hd.ldv, cols, d, io);
            for (int64_t i0 = 0; i0 < sq; i0 += br) {                       /* inner loop: Q blocks */
                const int rows = (int)(sq - i0 < br ? sq - i0 : br), rp = fa_pad16(rows);
                int64_t lo, hi;
                fa_cpu_block_keys(p, sq, sk, i0, i0 + rows, &lo, &hi);
                if (hi <= j0 || lo >= j0 + cols) continue;                  /* block (i, j) fully masked */
                fa_tile_load(Qi, d, (const char *)hd.q + i0 * hd.ldq * es, p->dtype, hd.ldq, rows, d, io);
                fa_tile_load(Oi, d, o_slow + i0 * ld_o, FA_DTYPE_F32, ld_o, rows, d, io);
                fa_vec_load(li, l_slow + i0, rows, io);
                fa_vec_load(mi, m_slow + i0, rows, io);
                memset(Qi + (int64_t)rows * d, 0, (size_t)(rp - rows) * d * 4);
                kr->pack_t(rp, d, Qi, d, QiT, rp, sgn);
                kr->gemm_nn(cols, rp, d, Kj, d, 1, QiT, rp, ST, rp, 0);       /* Sᵀ = Kj Qiᵀ */
                if (p->softcap > 0 || fa_cpu_tile_needs_mask(p, sq, sk, i0, rows, j0, cols))
                    fa_cpu_scores_t(p, ST, rp, rows, cols, i0, j0, sq, sk);
                for (int r = 0; r < rp; r++) { mt[r] = -INFINITY; lt[r] = 0; }
                kr->softmax_step_t(cols, rp, ST, rp, c, mt, lt, al);          /* m̃, P̃ = exp(S − m̃), ℓ̃ */
                kr->gemm_nn(rows, d, cols, ST, 1, rp, Vj, d, PV, d, 0);       /* P̃ Vj */
                for (int r = 0; r < rows; r++) {
                    const float mnew = mi[r] > mt[r] ? mi[r] : mt[r];
                    const float a = mnew == -INFINITY ? 0.0f : li[r] * exp2f((mi[r] - mnew) * c);
                    const float bq = mnew == -INFINITY ? 0.0f : exp2f((mt[r] - mnew) * c);
                    const float lnew = a + bq * lt[r], inv = lnew > 0 ? 1.0f / lnew : 0.0f;
                    const float ca = a * inv, cb = bq * inv;
                    float *o = Oi + (int64_t)r * d;
                    const float *pv = PV + (int64_t)r * d;
                    for (int x = 0; x < d; x++) o[x] = ca * o[x] + cb * pv[x]; /* Oi = (ℓ e^.. Oi + e^.. P̃V) / ℓ_new */
                    li[r] = lnew;
                    mi[r] = mnew;
                }
                fa_tile_store(o_slow + i0 * ld_o, FA_DTYPE_F32, ld_o, Oi, d, rows, d, io);
                fa_vec_store(l_slow + i0, li, rows, io);
                fa_vec_store(m_slow + i0, mi, rows, io);
            }
        }
        for (int64_t i0 = 0; i0 < sq; i0 += br) {                           /* LSE, and O in the output dtype */
            const int rows = (int)(sq - i0 < br ? sq - i0 : br);
            if (!o_in_place) {
                fa_tile_load(Oi, d, o_slow + i0 * ld_o, FA_DTYPE_F32, ld_o, rows, d, io);
                fa_tile_store((char *)hd.o + i0 * hd.ldo * es, p->dtype, hd.ldo, Oi, d, rows, d, io);
            }
            if (hd.lse) {
                fa_vec_load(li, l_slow + i0, rows, io);
                fa_vec_load(mi, m_slow + i0, rows, io);
                for (int r = 0; r < rows; r++) lt[r] = li[r] > 0 ? mi[r] * unit + logf(li[r]) : -INFINITY;
                fa_vec_store(hd.lse + i0, lt, rows, io);
            }
        }
    }
    fa_cpu_ws_finish(&w, st, "cpu.flash1", br, bc, w.per * (size_t)w.threads);
    return FA_OK;
}

fa_status fa_cpu_flash1_backward(fa_context *ctx, const fa_problem *p, fa_stats *st) {
    const fa_cpu_kernels *kr = ctx->kernels;
    const int d = (int)p->d;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t group = p->hq / p->hk;
    int br, bc;
    fa_cpu_tiles(p, &br, &bc);
    const int bcp = fa_pad16(bc);
    const size_t tq = fa_align64((size_t)br * d * 4), tk = fa_align64((size_t)bc * d * 4);
    const size_t tkt = fa_align64((size_t)d * bcp * 4);
    const size_t ts = fa_align64((size_t)br * bcp * 4), tv = fa_align64((size_t)br * 4);
    const int acc_in_place = p->dtype == FA_DTYPE_F32;
    const size_t sQ = acc_in_place ? 0 : fa_align64((size_t)(group * p->sq_max * d) * 4);
    const size_t fast = 4 * tq + 4 * tk + 2 * tkt + 2 * ts + 2 * tv;
    fa_cpu_ws w;
    if (fa_cpu_ws_get(ctx, fast + sQ, 0, &w)) return FA_ERR_OUT_OF_MEMORY;
    const int64_t items = p->batch * p->hk;

#pragma omp parallel for schedule(dynamic, 1) num_threads(w.threads)
    for (int64_t it = 0; it < items; it++) {
        const int t = fa_thread_id();
        char *mem = fa_cpu_ws_thread(&w, t);
        float *Qi = (float *)mem, *dOi = Qi + tq / 4, *Oi = dOi + tq / 4, *dQi = Oi + tq / 4;
        float *Kj = dQi + tq / 4, *Vj = Kj + tk / 4, *dKj = Vj + tk / 4, *dVj = dKj + tk / 4;
        float *KjT = dVj + tk / 4, *VjT = KjT + tkt / 4;
        float *S = VjT + tkt / 4, *dP = S + ts / 4, *lse_i = dP + ts / 4, *D_i = lse_i + tv / 4;
        float *dQall = (float *)(mem + fast);
        fa_io *io = &w.io[t];
        const int64_t b = it / p->hk, hk = it % p->hk;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;

        memset(dQi, 0, tq);                                                 /* dQ = 0 in slow memory */
        for (int64_t g = 0; g < group; g++) {
            fa_head hq;
            fa_cpu_head(p, b, hk * group + g, &hq);
            for (int64_t i0 = 0; i0 < sq; i0 += br) {
                const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                if (acc_in_place)
                    fa_tile_store((float *)hq.dq + i0 * hq.lddq, FA_DTYPE_F32, hq.lddq, dQi, d, rows, d, io);
                else
                    fa_tile_store(dQall + (g * sq + i0) * d, FA_DTYPE_F32, d, dQi, d, rows, d, io);
            }
        }
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {                           /* outer loop: K/V blocks */
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Kj, d, (const char *)hd.k + j0 * hd.ldk * es, p->dtype, hd.ldk, cols, d, io);
            fa_tile_load(Vj, d, (const char *)hd.v + j0 * hd.ldv * es, p->dtype, hd.ldv, cols, d, io);
            kr->pack_t(cols, d, Kj, d, KjT, bcp, 1.0f);                      /* Kjᵀ, Vjᵀ for the tile products */
            kr->pack_t(cols, d, Vj, d, VjT, bcp, 1.0f);
            memset(dKj, 0, (size_t)cols * d * 4);
            memset(dVj, 0, (size_t)cols * d * 4);
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {                   /* inner loop: Q blocks */
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    int64_t lo, hi;
                    fa_cpu_block_keys(p, sq, sk, i0, i0 + rows, &lo, &hi);
                    if (hi <= j0 || lo >= j0 + cols) continue;
                    fa_tile_load(Qi, d, (const char *)hq.q + i0 * hq.ldq * es, p->dtype, hq.ldq, rows, d, io);
                    fa_tile_load(Oi, d, (const char *)hq.o + i0 * hq.ldo * es, p->dtype, hq.ldo, rows, d, io);
                    fa_tile_load(dOi, d, (const char *)hq.dout + i0 * hq.lddo * es, p->dtype, hq.lddo, rows, d, io);
                    fa_vec_load(lse_i, hq.lse + i0, rows, io);
                    float *dq_slow = acc_in_place ? (float *)hq.dq + i0 * hq.lddq : dQall + (g * sq + i0) * d;
                    const int64_t ld_slow = acc_in_place ? hq.lddq : d;
                    fa_tile_load(dQi, d, dq_slow, FA_DTYPE_F32, ld_slow, rows, d, io);
                    for (int r = 0; r < rows; r++)                          /* Di = rowsum(dOi ∘ Oi), every step */
                        D_i[r] = fa_cpu_rowdot(d, dOi + (int64_t)r * d, Oi + (int64_t)r * d);
                    if (p->softcap > 0)
                        fa_cpu_bwd_tile(p, kr, rows, cols, i0, j0, sq, sk, Qi, dOi, lse_i, D_i, Kj, Vj, S, dP, dQi, d,
                                        dKj, dVj);
                    else
                        fa_cpu_bwd_tile_fast(p, kr, rows, cols, i0, j0, sq, sk, Qi, dOi, lse_i, D_i, Kj, KjT, VjT,
                                             bcp, S, dP, dQi, d, dKj, dVj);
                    fa_tile_store(dq_slow, FA_DTYPE_F32, ld_slow, dQi, d, rows, d, io);
                }
            }
            fa_tile_store((char *)hd.dk + j0 * hd.lddk * es, p->dtype, hd.lddk, dKj, d, cols, d, io);
            fa_tile_store((char *)hd.dv + j0 * hd.lddv * es, p->dtype, hd.lddv, dVj, d, cols, d, io);
        }
        if (!acc_in_place)
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    fa_tile_load(dQi, d, dQall + (g * sq + i0) * d, FA_DTYPE_F32, d, rows, d, io);
                    fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, p->dtype, hq.lddq, dQi, d, rows, d, io);
                }
            }
    }
    fa_cpu_ws_finish(&w, st, "cpu.flash1", br, bc, w.per * (size_t)w.threads);
    return FA_OK;
}
