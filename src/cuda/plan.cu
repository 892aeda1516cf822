/* The CUDA plan: for a validated problem, the one decision of what runs (fa_cuda_plan), or FA_ERR_UNSUPPORTED with
 * the reason naming the argument. The kernel tables are data (sm80/tiles.h); this file picks a row, asks the row's
 * instance for its shared memory, and derives the launch shape, the backward's last-wave split, the workspace (from
 * a dry run of its layout) and the modelled HBM traffic. fa_cuda_run (backend.cu) executes exactly the plan.
 * A new kernel family is one table and one pick function here. Host code only. */
#include "plan.h"
#include "standard.h"
#include "sm80/tiles.h"
#include "sm90/flash3.h"

#include <stdio.h>
#include <string.h>

#define FA_COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

/* ---- the tensors a kernel family accepts ---- */

static int fa_tensor_aligned16(const fa_tensor *t) {
    return ((uintptr_t)t->data % 16) == 0 && t->stride_batch % 8 == 0 && t->stride_seq % 8 == 0 &&
           t->stride_head % 8 == 0;
}
/* cuBLAS takes the sequence stride as a leading dimension (int, >= head_dim). */
static int fa_tensor_blas_ok(const fa_tensor *t) {
    return (t->seqlen <= 1 || t->stride_seq >= t->head_dim) && t->stride_seq < INT32_MAX && t->stride_head < INT32_MAX;
}

/* ---- table rows ---- */

/* FLASH2 forward: the first row for head dim d with tiles bm x bn (0 = any) and nw warps (0 = any; ignored when
 * no matching row has nw). */
static int fa_f2_fwd_find(int d, int bm, int bn, int nw) {
    for (int pass = 0; pass < 2; ++pass)
        for (int i = 0; i < FA_COUNT(fa_f2_fwd_rows); ++i) {
            const fa_f2_fwd_row *r = &fa_f2_fwd_rows[i];
            if (r->d == d && (bm == 0 || bm == r->bm) && (bn == 0 || bn == r->bn) && (pass || !nw || nw == r->nw))
                return i;
        }
    return -1;
}
static int fa_f1_fwd_find(int d, int bm, int bn) {
    for (int i = 0; i < FA_COUNT(fa_f1_fwd_rows); ++i) {
        const fa_f1_fwd_row *r = &fa_f1_fwd_rows[i];
        if (r->d == d && (bm == 0 || bm == r->bm) && (bn == 0 || bn == r->bn)) return i;
    }
    return -1;
}
/* The backward rows built for algo (FA_BWD_F1 / FA_BWD_F2). */
static int fa_bwd_find(int algo, int d, int bm, int bn) {
    for (int i = 0; i < FA_COUNT(fa_bwd_rows); ++i) {
        const fa_bwd_row *r = &fa_bwd_rows[i];
        if ((r->algos & algo) && r->d == d && (bm == 0 || bm == r->bm) && (bn == 0 || bn == r->bn)) return i;
    }
    return -1;
}
static int fa_row_d(int flash2, int backward, int i) {
    if (backward) return (fa_bwd_rows[i].algos & (flash2 ? FA_BWD_F2 : FA_BWD_F1)) ? fa_bwd_rows[i].d : 0;
    return flash2 ? fa_f2_fwd_rows[i].d : fa_f1_fwd_rows[i].d;
}
/* "32, 64, ..." : the head dims the family's table lists, ascending. */
static void fa_built_dims(int flash2, int backward, char *buf, size_t len) {
    const int n = backward ? FA_COUNT(fa_bwd_rows) : flash2 ? FA_COUNT(fa_f2_fwd_rows) : FA_COUNT(fa_f1_fwd_rows);
    size_t used = 0;
    buf[0] = 0;
    for (int last = 0;;) {
        int next = 0;
        for (int i = 0; i < n; ++i) {
            const int d = fa_row_d(flash2, backward, i);
            if (d > last && (!next || d < next)) next = d;
        }
        if (!next) return;
        used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%d", last ? ", " : "", next);
        if (used >= len) return;
        last = next;
    }
}

/* ---- the FLASH2 backward's split last wave ----
 * One CTA per SM, so N equal K/V blocks leave N mod #SMs of them alone in the last wave. Where every block walks
 * the same query blocks (no mask, window or varlen), dK and dV go straight to their outputs (no GQA, not
 * deterministic), there is no softcap and the walks are at least split_rows query rows long, those blocks' walks
 * are dealt out to min(#SMs, their query blocks) CTAs instead (docs/cuda-kernels.md). */
static void fa_bwd_split(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan) {
    const int tr = (int)((p->sq_max + plan->block_q - 1) / plan->block_q);
    const long long n = (long long)plan->grid[0] * p->hq * p->batch;
    const int g = tu->sm_count, r = g > 0 ? (int)(n % g) : 0;
    if (p->deterministic || p->hq != p->hk || p->cu_q || p->cu_k || p->wl >= 0 || p->wr >= 0 || p->softcap > 0.f ||
        tu->split_rows < 0 || (long long)tr * plan->block_q < tu->split_rows || n < g || !r)
        return;
    const long long units = (long long)r * tr;
    plan->aux[FA_CUDA_AUX_SPLIT] = r;
    plan->aux[FA_CUDA_AUX_PIECES] = (int)(units < g ? units : g);
}

/* ---- the device workspace ---- */

/* Rows of the fp32 row statistics (LSE layout): B·Hq·Sq, or Hq·total_q under varlen. */
static size_t fa_stat_rows(const fa_problem *p) { return (size_t)p->hq * p->q.seqlen * (p->cu_q ? 1 : p->batch); }
static size_t fa_krows_q_heads(const fa_problem *p) { return (size_t)p->hq * p->k.seqlen * (p->cu_k ? 1 : p->batch); }
/* fp32 dK, dV of the split blocks */
static size_t fa_tail_bytes(const fa_problem *p, const fa_plan *plan) {
    return (size_t)plan->aux[FA_CUDA_AUX_SPLIT] * 2 * plan->block_k * p->d * sizeof(float);
}

void fa_cuda_ws_layout(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w) {
    const size_t rows = fa_stat_rows(p);
    memset(w, 0, sizeof *w);
    if (plan->algo == FA_ALGO_FLASH3) { /* the dynamic scheduler's tile counter (masked calls) */
        if (p->wl >= 0 || p->wr >= 0) w->tile_counter = (int *)fa_arena_take(a, sizeof(int), 256);
    } else if (plan->algo == FA_ALGO_STANDARD) {
        if (p->is_backward) w->dsum = (float *)fa_arena_take(a, rows * sizeof(float), 256);
        w->standard_bytes = fa_standard_ws_bytes((int)p->hq, (int)p->d, (int)(p->hq / p->hk), p->sq_max, p->sk_max,
                                                 (int)p->dtype, p->is_backward);
        w->standard = fa_arena_take(a, w->standard_bytes, 256);
    } else if (!p->is_backward) {
        if (plan->algo == FA_ALGO_FLASH1) { /* O (fp32), m, ℓ kept in HBM between the outer steps */
            w->o_acc = (float *)fa_arena_take(a, rows * p->d * sizeof(float), 256);
            w->row_m = (float *)fa_arena_take(a, rows * sizeof(float), 4);
            w->row_l = (float *)fa_arena_take(a, rows * sizeof(float), 4);
        }
    } else {
        /* D, LSE·log2(e), the fp32 dQ accumulator, GQA's per-query-head fp32 dK dV, the split blocks' fp32 dK dV;
         * 256-byte aligned parts: the kernels access them as float2 / float4 */
        const size_t kv = p->hq > p->hk ? fa_krows_q_heads(p) * p->d * sizeof(float) : 0, tail = fa_tail_bytes(p, plan);
        w->dsum = (float *)fa_arena_take(a, rows * sizeof(float), 256);
        w->lse2 = (float *)fa_arena_take(a, rows * sizeof(float), 256);
        w->dq_acc = (float *)fa_arena_take(a, rows * p->d * sizeof(float), 256);
        w->dk_acc = (float *)fa_arena_take(a, kv, 256);
        w->dv_acc = (float *)fa_arena_take(a, kv, 16);
        float *t = (float *)fa_arena_take(a, tail, 256);
        w->tail_acc = tail ? t : NULL;
    }
    fa_contract_layout(a, p, &w->contract);
}

/* ---- the modelled HBM traffic (no cache), one function per algorithm ---- */

/* Visited (query block, key block) pairs and query blocks visited, summed over sequences, per head. */
static void fa_model_pairs(const fa_problem *p, int bm, int bn, double *pairs, double *qblocks) {
    *pairs = 0, *qblocks = 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        const int64_t sq = fa_seqlen_q(p, b), sk = fa_seqlen_k(p, b);
        for (int64_t m0 = 0; m0 < sq; m0 += bm) {
            int64_t lo, hi;
            fa_visible_block(m0, m0 + bm < sq ? m0 + bm : sq, sq, sk, p->wl, p->wr, &lo, &hi);
            if (hi <= lo) continue;
            *pairs += (double)((hi + bn - 1) / bn - lo / bn);
            *qblocks += 1;
        }
    }
    *pairs *= (double)p->hq;
    *qblocks *= (double)p->hq;
}

struct fa_traffic_in {
    double e, d, qrows, kvrows; /* element bytes, head dim, query-side rows (B·Hq·Sq), K/V rows (B·Hk·Sk) */
};
static fa_traffic_in fa_traffic_of(const fa_problem *p) {
    fa_traffic_in t;
    t.e = (double)fa_dtype_size(p->dtype), t.d = (double)p->d;
    t.qrows = (double)fa_stat_rows(p), t.kvrows = (double)p->k.seqlen * (p->cu_k ? 1 : p->batch) * p->hk;
    return t;
}

static void fa_traffic_standard(const fa_problem *p, fa_plan *plan) {
    const fa_traffic_in t = fa_traffic_of(p);
    const double e = t.e, d = t.d, qrows = t.qrows, kvrows = t.kvrows;
    double ss = 0;
    for (int64_t b = 0; b < p->batch; ++b) ss += (double)fa_seqlen_q(p, b) * fa_seqlen_k(p, b);
    ss *= (double)p->hq;
    if (!p->is_backward) { /* Q, K, V; S written (fp32) and read by the softmax; P written and read by the PV GEMM; O, LSE */
        plan->read_bytes = qrows * d * e + 2 * kvrows * d * e + ss * 4 + ss * e;
        plan->write_bytes = ss * 4 + ss * e + qrows * d * e + (p->lse ? qrows * 4 : 0);
    } else { /* inputs once (Q, K, V, O, dO, LSE); S, dP (fp32) and P/dS written and read back */
        plan->read_bytes = 3 * qrows * d * e + 2 * kvrows * d * e + qrows * 4 + ss * (4 + 4 + 4 + 3 * e);
        plan->write_bytes = ss * (4 + 4 + 2 * e) + qrows * d * e + 2 * kvrows * d * e;
    }
}

/* The backward of FLASH1 and FLASH2 (one body): D pre-pass: O, dO read. Per visited pair: Qi, dOi (+ LSE, D) read;
 * dQi fp32 read+written (bulk reduce-adds or RMW). Kj Vj read once per key block; dK dV written once. dQ
 * conversion: fp32 read, dtype written. FLASH2's split blocks: cleared, partial sums added, read back once;
 * deterministic: no dQ traffic per pair, the dQ kernel reads Kj Vj per pair. */
static void fa_traffic_flash_bwd(const fa_problem *p, fa_plan *plan) {
    const fa_traffic_in t = fa_traffic_of(p);
    const double e = t.e, d = t.d, qrows = t.qrows, kvrows = t.kvrows;
    const int bm = plan->block_q;
    const size_t gq = p->hq / p->hk > 1 ? fa_krows_q_heads(p) * p->d * 2 : 0;
    const double tail = (double)fa_tail_bytes(p, plan);
    double pairs, qb;
    fa_model_pairs(p, bm, plan->block_k, &pairs, &qb);
    double rd = 2 * qrows * d * e + pairs * bm * (2 * d * e + 8 + 4 * d) + 2 * kvrows * d * e * p->hq / p->hk + qrows * d * 4;
    double wr = qrows * 4 + pairs * bm * 4 * d + qrows * d * e + 2 * kvrows * d * e + (double)gq * 4;
    rd += tail, wr += 2.0 * tail;
    if (p->algo == FA_ALGO_FLASH2 && p->deterministic) {
        rd -= pairs * bm * 4 * d + qrows * d * 4;
        wr -= pairs * bm * 4 * d;
        rd += pairs * 2.0 * bm * d * e;
    }
    plan->read_bytes = rd, plan->write_bytes = wr;
}

/* FLASH1 forward: Kj Vj once per (b, h); Qi per pair; Oi (fp32), ℓi, mi read on every visit but the first and
 * written on every visit but the last (which writes O in dtype and LSE). */
static void fa_traffic_flash1(const fa_problem *p, fa_plan *plan) {
    if (p->is_backward) return fa_traffic_flash_bwd(p, plan);
    const fa_traffic_in t = fa_traffic_of(p);
    const double e = t.e, d = t.d, qrows = t.qrows;
    const int bm = plan->block_q;
    double pairs, qb;
    fa_model_pairs(p, bm, plan->block_k, &pairs, &qb);
    const double rmw = (pairs - qb) * bm * (4 * d + 8);
    plan->read_bytes = 2 * (double)p->k.seqlen * (p->cu_k ? 1 : p->batch) * p->hq * d * e + pairs * bm * d * e + rmw;
    plan->write_bytes = rmw + qrows * d * e + (p->lse ? qrows * 4 : 0);
}

/* FLASH2 forward: Qi once per query block, Kj Vj once per visited pair; O and LSE written once. */
static void fa_traffic_flash2(const fa_problem *p, fa_plan *plan) {
    if (p->is_backward) return fa_traffic_flash_bwd(p, plan);
    const fa_traffic_in t = fa_traffic_of(p);
    const double e = t.e, d = t.d, qrows = t.qrows;
    const int bm = plan->block_q, bn = plan->block_k;
    double pairs, qb;
    fa_model_pairs(p, bm, bn, &pairs, &qb);
    plan->read_bytes = qb * bm * d * e + pairs * 2.0 * bn * d * e;
    plan->write_bytes = qrows * d * e + (p->lse ? qrows * 4 : 0);
}

/* ---- the plan ---- */

static fa_status fa_unsupported(char *why, size_t why_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static fa_status fa_unsupported(char *why, size_t why_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    return FA_ERR_UNSUPPORTED;
}

/* The flash kernels' row and its launch shape. */
static fa_status fa_flash_pick(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    const int flash2 = p->algo == FA_ALGO_FLASH2, d = (int)p->d;
    const char *an = flash2 ? "FLASH2" : "FLASH1", *dir = p->is_backward ? "backward" : "forward";
    const int bwd_algo = flash2 ? FA_BWD_F2 : FA_BWD_F1;
    int row = p->is_backward ? fa_bwd_find(bwd_algo, d, 0, 0) : flash2 ? fa_f2_fwd_find(d, 0, 0, 0) : fa_f1_fwd_find(d, 0, 0);
    if (row < 0) {
        char dims[64];
        fa_built_dims(flash2, p->is_backward, dims, sizeof dims);
        return fa_unsupported(why, why_len,
                              "head_dim %lld is not built for the CUDA FA_ALGO_%s %s (built: %s); FA_ALGO_STANDARD runs "
                              "any head_dim",
                              (long long)p->d, an, dir, dims);
    }
    const int bq = p->block_q, bk = p->block_k;
    if (p->is_backward)
        row = fa_bwd_find(bwd_algo, d, bq, bk);
    else
        row = flash2 ? fa_f2_fwd_find(d, bq, bk, tu->fwd_warps) : fa_f1_fwd_find(d, bq, bk);
    if (row < 0)
        return fa_unsupported(why, why_len,
                              "block_q %d / block_k %d: no CUDA FA_ALGO_%s %s kernel is built with these tiles for "
                              "head_dim %lld (0 = the tuned default; see the tile table in src/cuda)",
                              bq, bk, an, dir, (long long)p->d);
    fa_cuda_instance k = {NULL, NULL, 0};
    int built = 0;
    plan->entry = row;
    plan->grid[0] = (int)p->hq, plan->grid[1] = (int)p->batch, plan->grid[2] = 1; /* FLASH1: one CTA per (b, h) */
    if (!p->is_backward && flash2) {
        const fa_f2_fwd_row *r = &fa_f2_fwd_rows[row];
        plan->kernel = r->kernel;
        plan->block_q = r->bm, plan->block_k = r->bn, plan->threads = r->nw * 32;
        plan->grid[0] = (int)((p->sq_max + r->bm - 1) / r->bm), plan->grid[1] = (int)p->hq, plan->grid[2] = (int)p->batch;
        built = fa_flash2_fwd_instance(row, &k);
    } else if (!p->is_backward) {
        const fa_f1_fwd_row *r = &fa_f1_fwd_rows[row];
        plan->kernel = r->kernel;
        plan->block_q = r->bm, plan->block_k = r->bn, plan->threads = r->nw * 32;
        built = fa_flash1_fwd_instance(row, &k);
    } else {
        const fa_bwd_row *r = &fa_bwd_rows[row];
        plan->block_q = r->bm, plan->block_k = r->bn, plan->threads = 8 * 32;
        if (flash2) { /* one CTA per K/V block */
            plan->kernel = p->deterministic ? "cuda.flash2.bwd.deterministic" : "cuda.flash2.bwd.bulk_reduce_dq";
            plan->aux[FA_CUDA_AUX_DET] = p->deterministic ? 1 : 0;
            plan->grid[0] = (int)((p->sk_max + r->bn - 1) / r->bn), plan->grid[1] = (int)p->hq, plan->grid[2] = (int)p->batch;
            fa_bwd_split(tu, p, plan);
            built = fa_flash2_bwd_instance(row, p->deterministic, &k);
        } else {
            plan->kernel = "cuda.flash1.bwd";
            built = fa_flash1_bwd_instance(row, &k);
        }
    }
    if (!built) /* a table row without its case in the family's switch */
        return fa_unsupported(why, why_len, "head_dim %lld: CUDA FA_ALGO_%s %s row %d has no kernel instance",
                              (long long)p->d, an, dir, row);
    plan->smem_bytes = k.smem;
    return FA_OK;
}

/* FLASH3's parameter block for p (fa3_supported and fa3_fwd take it; the run fills in nothing else). */
void fa_flash3_params(const fa_problem *p, int ctas, fa3_params *f) {
    memset(f, 0, sizeof *f);
    f->q = p->q.data, f->k = p->k.data, f->v = p->v.data, f->o = p->o.data, f->lse = p->lse;
    f->q_batch_stride = p->q.stride_batch, f->q_row_stride = p->q.stride_seq, f->q_head_stride = p->q.stride_head;
    f->k_batch_stride = p->k.stride_batch, f->k_row_stride = p->k.stride_seq, f->k_head_stride = p->k.stride_head;
    f->v_batch_stride = p->v.stride_batch, f->v_row_stride = p->v.stride_seq, f->v_head_stride = p->v.stride_head;
    f->o_batch_stride = p->o.stride_batch, f->o_row_stride = p->o.stride_seq, f->o_head_stride = p->o.stride_head;
    f->batch = (int)p->batch, f->seqlen_q = (int)p->q.seqlen, f->seqlen_k = (int)p->k.seqlen;
    f->heads_q = (int)p->hq, f->heads_k = (int)p->hk, f->head_dim = (int)p->d;
    f->scale = p->scale;
    f->softcap = p->softcap;
    f->causal = 0; /* causal is folded into the right window (wr = 0), which the kernel takes as is */
    f->window_left = p->wl, f->window_right = p->wr;
    f->dtype = p->dtype == FA_DTYPE_F16 ? FA3_FP16 : FA3_BF16;
    f->ctas = ctas;
}

/* FLASH3 (sm90/): forward only, no varlen, its own tiles. With AUTO a call FLASH3 cannot run stays on
 * FLASH2 (the caller did not ask for FLASH3); asked for explicitly, the reason is returned. */
static fa_status fa_flash3_pick(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    const char *r = NULL;
    char buf[200];
    if (p->is_backward)
        r = "FA_ALGO_FLASH3 has no backward yet: run the backward with FA_ALGO_FLASH2 or FA_ALGO_AUTO (FLASH3's LSE "
            "is FLASH2's)";
    else if (p->dtype == FA_DTYPE_F32)
        r = "dtype f32: FA_ALGO_FLASH3 runs on 16-bit tensor cores (f16, bf16)";
    else if (p->cu_q)
        r = "opts.cu_seqlens_q: FA_ALGO_FLASH3 has no varlen yet (FA_ALGO_FLASH2 has)";
    fa3_params f;
    fa3_shape sh;
    fa_flash3_params(p, tu->sm_count, &f);
    fa3_shape_of(&f, &sh);
    if (!r && ((p->block_q && p->block_q != sh.br) || (p->block_k && p->block_k != sh.bc))) {
        snprintf(buf, sizeof buf, "block_q %d / block_k %d: FA_ALGO_FLASH3 at head_dim %lld runs %d x %d tiles only "
                 "(0 = its default)", p->block_q, p->block_k, (long long)p->d, sh.br, sh.bc);
        r = buf;
    }
    if (!r && !fa3_supported(&f, 9, 0, buf, sizeof buf)) r = buf;
    if (r) {
        if (p->algo_auto) return FA_OK; /* plan->algo stays FLASH2 */
        return fa_unsupported(why, why_len, "%s", r);
    }
    plan->algo = FA_ALGO_FLASH3;
    plan->kernel = sh.kernel;
    plan->block_q = sh.br, plan->block_k = sh.bc, plan->threads = sh.threads;
    plan->grid[0] = (int)(sh.tiles < tu->sm_count ? sh.tiles : tu->sm_count), plan->grid[1] = plan->grid[2] = 1;
    plan->smem_bytes = sh.smem;
    fa_traffic_flash2(p, plan); /* the same loops: Qi once, Kj Vj once per visited pair, O and LSE once */
    return FA_OK;
}

/* The call's first view (forward: q, k, v, out; backward also dout, dq, dk, dv) that fails ok, with its name; NULL
 * when every view passes. */
static const fa_tensor *fa_view_failing(const fa_problem *p, int (*ok)(const fa_tensor *), const char **name) {
    const fa_tensor *ts[8] = {&p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv};
    static const char *names[8] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
    for (int i = 0; i < (p->is_backward ? 8 : 4); ++i)
        if (!ok(ts[i])) {
            *name = names[i];
            return ts[i];
        }
    return NULL;
}

/* STANDARD: cuBLAS's GEMMs over materialised S and P. */
static fa_status fa_plan_standard(const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    const char *name;
    const fa_tensor *t = fa_view_failing(p, fa_tensor_blas_ok, &name);
    if (t)
        return fa_unsupported(why, why_len,
                              "%s: CUDA FA_ALGO_STANDARD (cuBLAS) needs stride_seq >= head_dim and strides < 2^31 "
                              "(stride_seq %lld, head_dim %lld)",
                              name, (long long)t->stride_seq, (long long)t->head_dim);
    plan->algo = FA_ALGO_STANDARD;
    plan->kernel = "cuda.standard.cublas"; /* block_q/block_k: cuBLAS picks its own tiles; ignored as on the CPU */
    fa_traffic_standard(p, plan);
    return FA_OK;
}

/* FLASH1 / FLASH2 (sm80/): 16-bit tensors with 16-byte aligned rows, a built head dim and tile. */
static fa_status fa_plan_flash(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why,
                               size_t why_len) {
    if (p->algo != FA_ALGO_FLASH1 && p->algo != FA_ALGO_FLASH2)
        return fa_unsupported(why, why_len, "algo %s is not implemented on CUDA", fa_algo_name(p->algo));
    if (p->dtype == FA_DTYPE_F32)
        return fa_unsupported(why, why_len,
                              "dtype f32: CUDA FA_ALGO_%s runs on 16-bit tensor cores (f16, bf16); FA_ALGO_STANDARD "
                              "accepts f32",
                              p->algo == FA_ALGO_FLASH1 ? "FLASH1" : "FLASH2");
    fa_status rc = fa_flash_pick(tu, p, plan, why, why_len);
    if (rc != FA_OK) return rc;
    const char *name;
    if (fa_view_failing(p, fa_tensor_aligned16, &name))
        return fa_unsupported(why, why_len,
                              "%s: CUDA flash kernels need 16-byte aligned rows (data pointer %% 16 == 0 and every "
                              "stride a multiple of 8 elements); FA_ALGO_STANDARD takes any layout",
                              name);
    if (p->algo == FA_ALGO_FLASH1)
        fa_traffic_flash1(p, plan);
    else
        fa_traffic_flash2(p, plan);
    return FA_OK;
}

/* The plan. An explicit algorithm runs or is refused with the reason; FA_ALGO_AUTO takes the first of FLASH3
 * (forward), FLASH2, STANDARD that runs the call. */
extern "C" fa_status fa_cuda_plan(const fa_context *ctx, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    memset(plan, 0, sizeof *plan);
    plan->algo = p->algo;
    if (p->sq_max > INT32_MAX / 2 || p->sk_max > INT32_MAX / 2 || p->q.seqlen > INT32_MAX / 2 ||
        p->k.seqlen > INT32_MAX / 2)
        return fa_unsupported(why, why_len, "seqlen: CUDA kernels index rows with int32 (seqlen must be < 2^30)");
    if (p->batch > 65535 || p->hq > 65535)
        return fa_unsupported(why, why_len, "batch %lld x heads %lld: CUDA grid limit is 65535 per dimension",
                              (long long)p->batch, (long long)p->hq);
    const fa_cuda_tuning *tu = fa_cuda_tuning_of(ctx);
    fa_status rc;
    if (p->algo == FA_ALGO_STANDARD) {
        rc = fa_plan_standard(p, plan, why, why_len);
    } else {
        rc = FA_OK;
        if (p->algo == FA_ALGO_FLASH3 || (p->algo_auto && !p->is_backward)) rc = fa_flash3_pick(tu, p, plan, why, why_len);
        if (rc == FA_OK && plan->algo != FA_ALGO_FLASH3) rc = fa_plan_flash(tu, p, plan, why, why_len);
        if (rc == FA_ERR_UNSUPPORTED && p->algo_auto) {
            char flash_why[256];
            snprintf(flash_why, sizeof flash_why, "%s", why);
            memset(plan, 0, sizeof *plan);
            rc = fa_plan_standard(p, plan, why, why_len);
            if (rc != FA_OK) {
                char std_why[256];
                snprintf(std_why, sizeof std_why, "%s", why);
                snprintf(why, why_len, "FA_ALGO_AUTO: no CUDA algorithm runs the call; FLASH2: %s; STANDARD: %s",
                         flash_why, std_why);
            }
        }
    }
    if (rc != FA_OK) return rc;
    fa_contract_traffic(p, plan);
    fa_arena a = fa_arena_dry();
    fa_cuda_ws w;
    fa_cuda_ws_layout(&a, p, plan, &w);
    plan->workspace_bytes = a.size;
    return FA_OK;
}
