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
 *   Di = rowsum(dOi ∘ Oi) recomputed on every step (V1 has no pre-pass); the tile step of tiles/bwd_tile.c;
 *   write dQi back; after the inner loop write dKj, dVj. */
#include "cpu/cpu.h"

#include <string.h>

/* ---- forward ---- */

/* A thread's slice: the fast tiles (Qi, Qiᵀ; Oi, P̃Vj (dv wide); Kj, Vj; Sᵀ; ℓi, mi, ℓ̃, m̃, α) and the head's ℓ, m
 * and (for f16/bf16) fp32 O in slow memory. */
typedef struct fwd_tiles {
    float *Qi, *QiT, *Oi, *PV, *Kj, *Vj, *ST, *li, *mi, *lt, *mt, *al;
    float *l_slow, *m_slow, *o_ws;
} fwd_tiles;

static void fwd_thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *tiles) {
    const fa_problem *p = problem;
    fwd_tiles *t = tiles;
    const size_t d = (size_t)p->d, dv = (size_t)p->d_v, brp = (size_t)fa_pad16(pl->block_q);
    const size_t bc = (size_t)pl->block_k;
    t->Qi = fa_take_f32(a, brp * d);
    t->QiT = fa_take_f32(a, brp * d);
    t->Oi = fa_take_f32(a, brp * dv);
    t->PV = fa_take_f32(a, brp * dv);
    t->Kj = fa_take_f32(a, bc * d);
    t->Vj = fa_take_f32(a, bc * dv);
    t->ST = fa_take_f32(a, brp * bc);
    t->li = fa_take_f32(a, brp);
    t->mi = fa_take_f32(a, brp);
    t->lt = fa_take_f32(a, brp);
    t->mt = fa_take_f32(a, brp);
    t->al = fa_take_f32(a, brp);
    t->l_slow = fa_take_f32(a, (size_t)p->sq_max);
    t->m_slow = fa_take_f32(a, (size_t)p->sq_max);
    t->o_ws = p->dtype == FA_DTYPE_F32 ? NULL : fa_take_f32(a, (size_t)p->sq_max * dv);
}

static void fwd_run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    const int d = (int)p->d, dv = (int)p->d_v, br = pl->block_q, bc = pl->block_k, brp = fa_pad16(br);
    const size_t es = fa_dtype_size(p->dtype);
    const int o_in_place = p->dtype == FA_DTYPE_F32;
    const int64_t items = p->batch * p->hq;
    /* base-2 softmax with the scale folded in, as in flash2.c (negative scale moved into the Qi packing) */
    const float sgn = p->scale < 0 ? -1.0f : 1.0f, unit = p->softcap > 0 ? 1.0f : fabsf(p->scale);
    const float c = unit * FA_LOG2E, cap_mul = p->softcap > 0 ? fabsf(p->scale) / p->softcap : 1.0f;

#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t it = 0; it < items; it++) {
        fwd_tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *Qi = t.Qi, *QiT = t.QiT, *Oi = t.Oi, *PV = t.PV, *Kj = t.Kj, *Vj = t.Vj, *ST = t.ST;
        float *li = t.li, *mi = t.mi, *lt = t.lt, *mt = t.mt, *al = t.al;
        float *l_slow = t.l_slow, *m_slow = t.m_slow, *o_ws = t.o_ws;
        const int64_t b = it / p->hq, h = it % p->hq;
        fa_head hd;
        fa_cpu_head(p, b, h, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;
        /* O lives in slow memory: the output itself (f32) or an fp32 buffer */
        float *o_slow = o_in_place ? (float *)hd.o : o_ws;
        const int64_t ld_o = o_in_place ? hd.ldo : dv;

        /* initialise O = 0, ℓ = 0, m = −∞ in slow memory */
        memset(Oi, 0, (size_t)brp * dv * 4);
        for (int r = 0; r < brp; r++) { li[r] = 0; mi[r] = -INFINITY; }
        for (int64_t i0 = 0; i0 < sq; i0 += br) {
            const int rows = (int)(sq - i0 < br ? sq - i0 : br);
            fa_tile_store(o_slow + i0 * ld_o, FA_DTYPE_F32, ld_o, Oi, dv, rows, dv, io);
            fa_vec_store(l_slow + i0, li, rows, io);
            fa_vec_store(m_slow + i0, mi, rows, io);
        }
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {                           /* outer loop: K/V blocks */
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_tile_load(Kj, d, (const char *)hd.k + j0 * hd.ldk * es, p->dtype, hd.ldk, cols, d, io);
            fa_tile_load(Vj, dv, (const char *)hd.v + j0 * hd.ldv * es, p->dtype, hd.ldv, cols, dv, io);
            for (int64_t i0 = 0; i0 < sq; i0 += br) {                       /* inner loop: Q blocks */
                const int rows = (int)(sq - i0 < br ? sq - i0 : br), rp = fa_pad16(rows);
                if (!fa_cpu_block_sees(p, sq, sk, i0, rows, j0, cols)) continue; /* block (i, j) fully masked */
                fa_tile_load(Qi, d, (const char *)hd.q + i0 * hd.ldq * es, p->dtype, hd.ldq, rows, d, io);
                fa_tile_load(Oi, dv, o_slow + i0 * ld_o, FA_DTYPE_F32, ld_o, rows, dv, io);
                fa_vec_load(li, l_slow + i0, rows, io);
                fa_vec_load(mi, m_slow + i0, rows, io);
                memset(Qi + (int64_t)rows * d, 0, (size_t)(rp - rows) * d * 4);
                kr->pack_t(rp, d, Qi, d, QiT, rp, sgn);
                kr->gemm_nn(cols, rp, d, Kj, d, 1, QiT, rp, ST, rp, 0);       /* Sᵀ = Kj Qiᵀ */
                if (p->softcap > 0 || fa_cpu_tile_needs_mask(p, sq, sk, i0, rows, j0, cols))
                    fa_cpu_scores(p, ST, 1, rp, rows, cols, i0, j0, sq, sk, cap_mul, 1.0f);
                for (int r = 0; r < rp; r++) { mt[r] = -INFINITY; lt[r] = 0; }
                kr->softmax_step_t(cols, rp, ST, rp, c, mt, lt, al);          /* m̃, P̃ = exp(S − m̃), ℓ̃ */
                kr->gemm_nn(rows, dv, cols, ST, 1, rp, Vj, dv, PV, dv, 0);    /* P̃ Vj */
                for (int r = 0; r < rows; r++) {
                    const float mnew = mi[r] > mt[r] ? mi[r] : mt[r];
                    const float a = mnew == -INFINITY ? 0.0f : li[r] * exp2f((mi[r] - mnew) * c);
                    const float bq = mnew == -INFINITY ? 0.0f : exp2f((mt[r] - mnew) * c);
                    const float lnew = a + bq * lt[r], inv = lnew > 0 ? 1.0f / lnew : 0.0f;
                    const float ca = a * inv, cb = bq * inv;
                    float *o = Oi + (int64_t)r * dv;
                    const float *pv = PV + (int64_t)r * dv;
                    for (int x = 0; x < dv; x++) o[x] = ca * o[x] + cb * pv[x]; /* Oi = (ℓ e^.. Oi + e^.. P̃V) / ℓ_new */
                    li[r] = lnew;
                    mi[r] = mnew;
                }
                fa_tile_store(o_slow + i0 * ld_o, FA_DTYPE_F32, ld_o, Oi, dv, rows, dv, io);
                fa_vec_store(l_slow + i0, li, rows, io);
                fa_vec_store(m_slow + i0, mi, rows, io);
            }
        }
        for (int64_t i0 = 0; i0 < sq; i0 += br) {                           /* LSE, and O in the output dtype */
            const int rows = (int)(sq - i0 < br ? sq - i0 : br);
            if (hd.lse || hd.sink) {
                fa_vec_load(li, l_slow + i0, rows, io);
                fa_vec_load(mi, m_slow + i0, rows, io);
                for (int r = 0; r < rows; r++) {
                    if (hd.sink) /* O is normalised over the keys: O ·= ℓ·exp(m − LSE) (core/sink.h) */
                        al[r] = li[r] * fa_sink_join(li[r] > 0 ? (double)mi[r] * unit : -INFINITY, li[r], *hd.sink,
                                                     &lt[r]);
                    else
                        lt[r] = li[r] > 0 ? mi[r] * unit + logf(li[r]) : -INFINITY;
                }
                if (hd.lse) fa_vec_store(hd.lse + i0, lt, rows, io);
            }
            if (!o_in_place || hd.sink) {
                fa_tile_load(Oi, dv, o_slow + i0 * ld_o, FA_DTYPE_F32, ld_o, rows, dv, io);
                if (hd.sink) kr->scale_rows(rows, dv, Oi, dv, al);
                fa_tile_store((char *)hd.o + i0 * hd.ldo * es, p->dtype, hd.ldo, Oi, dv, rows, dv, io);
            }
        }
    }
}

const fa_cpu_algo fa_cpu_flash1_fwd = {FA_CPU_LAYOUT(fwd_thread_layout, fwd_tiles, NULL, char), fwd_run, 0};

/* ---- backward ---- */

/* A thread's slice: the backward tiles (with Oi, for Di) and, for f16/bf16, the fp32 dQ accumulator of one K/V
 * head's query heads (f32 accumulates into dQ itself). */
static void bwd_thread_layout(fa_arena *a, const void *problem, const fa_plan *pl, void *tiles) {
    const fa_problem *p = problem;
    const size_t dq = p->dtype == FA_DTYPE_F32 ? 0 : (size_t)(p->hq / p->hk * p->sq_max * p->d);
    fa_cpu_bwd_tiles_layout(a, (int)p->d, (int)p->d_v, pl->block_q, pl->block_k, 1, pl->aux[FA_CPU_AUX_BF16T], dq,
                            tiles);
}

static void bwd_run(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f) {
    const int d = (int)p->d, dv = (int)p->d_v, br = pl->block_q, bc = pl->block_k;
    const size_t es = fa_dtype_size(p->dtype);
    const int64_t group = p->hq / p->hk, items = p->batch * p->hk;
    const int acc_in_place = p->dtype == FA_DTYPE_F32;

#pragma omp parallel for schedule(dynamic, 1) num_threads(f->threads)
    for (int64_t it = 0; it < items; it++) {
        fa_cpu_bwd_tiles t;
        fa_io *io = fa_cpu_frame_thread(f, &t);
        float *dQall = t.dQacc;
        const int64_t b = it / p->hk, hk = it % p->hk;
        fa_head hd;
        fa_cpu_head(p, b, hk * group, &hd);
        const int64_t sq = hd.sq, sk = hd.sk;

        memset(t.dQi, 0, (size_t)br * d * 4);                               /* dQ = 0 in slow memory */
        for (int64_t g = 0; g < group; g++) {
            fa_head hq;
            fa_cpu_head(p, b, hk * group + g, &hq);
            for (int64_t i0 = 0; i0 < sq; i0 += br) {
                const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                if (acc_in_place)
                    fa_tile_store((float *)hq.dq + i0 * hq.lddq, FA_DTYPE_F32, hq.lddq, t.dQi, d, rows, d, io);
                else
                    fa_tile_store(dQall + (g * sq + i0) * d, FA_DTYPE_F32, d, t.dQi, d, rows, d, io);
            }
        }
        for (int64_t j0 = 0; j0 < sk; j0 += bc) {                           /* outer loop: K/V blocks */
            const int cols = (int)(sk - j0 < bc ? sk - j0 : bc);
            fa_cpu_bwd_kv_begin(p, kr, &hd, j0, cols, &t, io);
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {                   /* inner loop: Q blocks */
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    if (!fa_cpu_block_sees(p, sq, sk, i0, rows, j0, cols)) continue;
                    fa_cpu_bwd_load_q(p, &hq, i0, rows, &t, io);
                    fa_tile_load(t.Oi, dv, (const char *)hq.o + i0 * hq.ldo * es, p->dtype, hq.ldo, rows, dv, io);
                    kr->rowdots(rows, dv, t.dOi, dv, t.Oi, dv, t.D_i);      /* Di = rowsum(dOi ∘ Oi), every step */
                    float *dq_slow = acc_in_place ? (float *)hq.dq + i0 * hq.lddq : dQall + (g * sq + i0) * d;
                    fa_cpu_bwd_step(p, kr, sq, sk, i0, rows, j0, cols, dq_slow, acc_in_place ? hq.lddq : d, 0, &t, io);
                }
            }
            fa_cpu_bwd_kv_end(p, &hd, j0, cols, &t, io);
        }
        if (!acc_in_place)
            for (int64_t g = 0; g < group; g++) {
                fa_head hq;
                fa_cpu_head(p, b, hk * group + g, &hq);
                for (int64_t i0 = 0; i0 < sq; i0 += br) {
                    const int rows = (int)(sq - i0 < br ? sq - i0 : br);
                    fa_tile_load(t.dQi, d, dQall + (g * sq + i0) * d, FA_DTYPE_F32, d, rows, d, io);
                    fa_tile_store((char *)hq.dq + i0 * hq.lddq * es, p->dtype, hq.lddq, t.dQi, d, rows, d, io);
                }
            }
    }
}

const fa_cpu_algo fa_cpu_flash1_bwd = {FA_CPU_LAYOUT(bwd_thread_layout, fa_cpu_bwd_tiles, NULL, char), bwd_run, 0};
