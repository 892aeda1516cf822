/* The mma.sync families' rows (family.h): FLASH1 and FLASH2 forward, their shared backward. Each picks a row of its
 * tile table (tiles.h), asks the row's instance for its shared memory and derives the launch shape, the FLASH2
 * backward's last-wave split, its workspace and its modelled HBM traffic. Host code. */
#include "cuda/family.h"
#include "tiles.h"

#include <stdio.h>
#include <string.h>

#define FA_COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

/* ---- tile rows ---- */

/* FLASH2 forward: the first row for head dims d (q, k) and dv (v, out) with tiles bm x bn (0 = any) and nw warps
 * (0 = any; ignored when no matching row has nw). */
static int fa_f2_fwd_find(int d, int dv, int bm, int bn, int nw) {
    for (int pass = 0; pass < 2; ++pass)
        for (int i = 0; i < FA_COUNT(fa_f2_fwd_rows); ++i) {
            const fa_f2_fwd_row *r = &fa_f2_fwd_rows[i];
            if (r->d == d && r->dv == dv && (bm == 0 || bm == r->bm) && (bn == 0 || bn == r->bn) &&
                (pass || !nw || nw == r->nw))
                return i;
        }
    return -1;
}
/* "(192, 128)": the (d, dv) pairs with dv != d the FLASH2 forward's table (backward: FLASH2's rows of the backward
 * table) builds, each once. */
static void fa_built_pairs(int backward, char *buf, size_t len) {
    size_t used = 0;
    const int n = backward ? FA_COUNT(fa_bwd_rows) : FA_COUNT(fa_f2_fwd_rows);
    buf[0] = 0;
    for (int i = 0; i < n && used < len; ++i) {
        const int d = backward ? fa_bwd_rows[i].d : fa_f2_fwd_rows[i].d;
        const int dv = backward ? fa_bwd_rows[i].dv : fa_f2_fwd_rows[i].dv;
        int seen = dv == d || (backward && !(fa_bwd_rows[i].algos & FA_BWD_F2));
        for (int j = 0; j < i && !seen; ++j)
            seen = backward ? fa_bwd_rows[j].d == d && fa_bwd_rows[j].dv == dv && (fa_bwd_rows[j].algos & FA_BWD_F2)
                            : fa_f2_fwd_rows[j].d == d && fa_f2_fwd_rows[j].dv == dv;
        if (!seen) used += (size_t)snprintf(buf + used, len - used, "%s(%d, %d)", used ? ", " : "", d, dv);
    }
}
static int fa_f1_fwd_find(int d, int bm, int bn) {
    for (int i = 0; i < FA_COUNT(fa_f1_fwd_rows); ++i) {
        const fa_f1_fwd_row *r = &fa_f1_fwd_rows[i];
        if (r->d == d && (bm == 0 || bm == r->bm) && (bn == 0 || bn == r->bn)) return i;
    }
    return -1;
}
/* The backward rows built for algo (FA_BWD_F1 / FA_BWD_F2) and head dims d (q, k), dv (v, out, dout). */
static int fa_bwd_find(int algo, int d, int dv, int bm, int bn) {
    for (int i = 0; i < FA_COUNT(fa_bwd_rows); ++i) {
        const fa_bwd_row *r = &fa_bwd_rows[i];
        if ((r->algos & algo) && r->d == d && r->dv == dv && (bm == 0 || bm == r->bm) && (bn == 0 || bn == r->bn))
            return i;
    }
    return -1;
}
/* The head dims the family's table lists. */
static void fa_built_dims(int flash2, int backward, char *buf, size_t len) {
    int d[FA_COUNT(fa_f2_fwd_rows) + FA_COUNT(fa_bwd_rows) + FA_COUNT(fa_f1_fwd_rows)], n = 0;
    if (backward) {
        for (int i = 0; i < FA_COUNT(fa_bwd_rows); ++i)
            d[n++] = (fa_bwd_rows[i].algos & (flash2 ? FA_BWD_F2 : FA_BWD_F1)) && fa_bwd_rows[i].dv == fa_bwd_rows[i].d
                         ? fa_bwd_rows[i].d
                         : 0;
    } else if (flash2) {
        for (int i = 0; i < FA_COUNT(fa_f2_fwd_rows); ++i)
            d[n++] = fa_f2_fwd_rows[i].dv == fa_f2_fwd_rows[i].d ? fa_f2_fwd_rows[i].d : 0;
    } else {
        for (int i = 0; i < FA_COUNT(fa_f1_fwd_rows); ++i) d[n++] = fa_f1_fwd_rows[i].d;
    }
    fa_cuda_dims_list(d, n, buf, len);
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
    if (p->deterministic || p->hq != p->hk || p->cu_q || p->cu_k || fa_problem_masked(p) || p->softcap > 0.f ||
        tu->split_rows < 0 || (long long)tr * plan->block_q < tu->split_rows || n < g || !r)
        return;
    const long long units = (long long)r * tr;
    plan->aux[FA_CUDA_AUX_SPLIT] = r;
    plan->aux[FA_CUDA_AUX_PIECES] = (int)(units < g ? units : g);
}

/* fp32 dK, dV of the split blocks */
static size_t fa_tail_bytes(const fa_problem *p, const fa_plan *plan) {
    return (size_t)plan->aux[FA_CUDA_AUX_SPLIT] * plan->block_k * (p->d + p->d_v) * sizeof(float);
}

/* ---- the pick ---- */

/* The row of the tile table and its launch shape. */
static fa_status fa_flash_pick(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    const int flash2 = plan->algo == FA_ALGO_FLASH2, d = (int)p->d, dv = (int)p->d_v;
    const char *an = flash2 ? "FLASH2" : "FLASH1", *dir = p->is_backward ? "backward" : "forward";
    const int bwd_algo = flash2 ? FA_BWD_F2 : FA_BWD_F1;
    if (dv != d && !flash2) /* FLASH1 takes one head_dim */
        return fa_cuda_unsupported(why, why_len,
                                   "v: head_dim %d differs from q's %d: the CUDA FA_ALGO_FLASH1 %s takes one head_dim "
                                   "for q, k, v and out; FA_ALGO_STANDARD runs any pair",
                                   dv, d, dir);
    /* FLASH2's forward and backward build a few pairs each (tiles.h) */
    if (dv != d && (p->is_backward ? fa_bwd_find(FA_BWD_F2, d, dv, 0, 0) : fa_f2_fwd_find(d, dv, 0, 0, 0)) < 0) {
        char pairs[64];
        fa_built_pairs(p->is_backward, pairs, sizeof pairs);
        return fa_cuda_unsupported(why, why_len,
                                   "v: head_dim %d differs from q's %d: the CUDA FA_ALGO_FLASH2 %s builds the pairs "
                                   "(d, d_v) %s; FA_ALGO_STANDARD runs any pair",
                                   dv, d, dir, pairs);
    }
    int row = p->is_backward ? fa_bwd_find(bwd_algo, d, dv, 0, 0)
              : flash2       ? fa_f2_fwd_find(d, dv, 0, 0, 0)
                             : fa_f1_fwd_find(d, 0, 0);
    if (row < 0) {
        char dims[64];
        fa_built_dims(flash2, p->is_backward, dims, sizeof dims);
        return fa_cuda_unsupported(why, why_len,
                                   "head_dim %lld is not built for the CUDA FA_ALGO_%s %s (built: %s); FA_ALGO_STANDARD "
                                   "runs any head_dim",
                                   (long long)p->d, an, dir, dims);
    }
    const int bq = p->block_q, bk = p->block_k;
    if (p->is_backward)
        row = fa_bwd_find(bwd_algo, d, dv, bq, bk);
    else
        row = flash2 ? fa_f2_fwd_find(d, dv, bq, bk, tu->fwd_warps) : fa_f1_fwd_find(d, bq, bk);
    if (row < 0)
        return fa_cuda_unsupported(why, why_len,
                                   "block_q %d / block_k %d: no CUDA FA_ALGO_%s %s kernel is built with these tiles "
                                   "for head_dim %lld (0 = the tuned default; see the tile table in src/cuda)",
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
        return fa_cuda_unsupported(why, why_len, "head_dim %lld: CUDA FA_ALGO_%s %s row %d has no kernel instance",
                                   (long long)p->d, an, dir, row);
    plan->smem_bytes = k.smem;
    return FA_OK;
}

/* Every mma.sync row: 16-bit tensors, a built head dim and tile, 16-byte aligned rows. */
static fa_status fa_mma_pick(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    if (p->dtype == FA_DTYPE_F8_E4M3) return fa_cuda_fp8_refusal(why, why_len);
    if (p->dtype == FA_DTYPE_F32)
        return fa_cuda_unsupported(why, why_len,
                                   "dtype f32: CUDA FA_ALGO_%s runs on 16-bit tensor cores (f16, bf16); "
                                   "FA_ALGO_STANDARD accepts f32",
                                   plan->algo == FA_ALGO_FLASH1 ? "FLASH1" : "FLASH2");
    fa_status rc = fa_flash_pick(tu, p, plan, why, why_len);
    if (rc != FA_OK) return rc;
    const char *name;
    if (fa_cuda_view_failing(p, fa_cuda_aligned16, &name))
        return fa_cuda_unsupported(why, why_len,
                                   "%s: CUDA flash kernels need 16-byte aligned rows (data pointer %% 16 == 0 and "
                                   "every stride a multiple of 8 elements); FA_ALGO_STANDARD takes any layout",
                                   name);
    return FA_OK;
}

/* ---- the workspace ---- */

/* FLASH1 forward: O (fp32), m, ℓ kept in HBM between the outer steps. */
static void fa_flash1_fwd_ws(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w) {
    (void)plan;
    const size_t rows = fa_cuda_stat_rows(p);
    w->o_acc = (float *)fa_arena_take(a, rows * p->d * sizeof(float), 256);
    w->row_m = (float *)fa_arena_take(a, rows * sizeof(float), 4);
    w->row_l = (float *)fa_arena_take(a, rows * sizeof(float), 4);
}

/* The backward: D, LSE·log2(e), the fp32 dQ accumulator, GQA's per-query-head fp32 dK dV, the split blocks' fp32
 * dK dV; 256-byte aligned parts: the kernels access them as float2 / float4. */
static void fa_flash_bwd_ws(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w) {
    const size_t rows = fa_cuda_stat_rows(p);
    const size_t kv = p->hq > p->hk ? fa_cuda_krows_q_heads(p) * sizeof(float) : 0, tail = fa_tail_bytes(p, plan);
    w->dsum = (float *)fa_arena_take(a, rows * sizeof(float), 256);
    w->lse2 = (float *)fa_arena_take(a, rows * sizeof(float), 256);
    w->dq_acc = (float *)fa_arena_take(a, rows * p->d * sizeof(float), 256);
    w->dk_acc = (float *)fa_arena_take(a, kv * p->d, 256);
    w->dv_acc = (float *)fa_arena_take(a, kv * p->d_v, 16);
    float *t = (float *)fa_arena_take(a, tail, 256);
    w->tail_acc = tail ? t : NULL;
}

/* ---- the modelled HBM traffic (no cache) ---- */

/* The backward of FLASH1 and FLASH2 (one body): D pre-pass: O, dO read. Per visited pair: Qi, dOi (+ LSE, D) read;
 * dQi fp32 read+written (bulk reduce-adds or RMW). Kj Vj read once per key block; dK dV written once. dQ
 * conversion: fp32 read, dtype written. FLASH2's split blocks: cleared, partial sums added, read back once;
 * deterministic: no dQ traffic per pair, the dQ kernel reads Kj Vj per pair. Q, K rows are d wide, V, O, dO dv. */
static void fa_traffic_flash_bwd(const fa_problem *p, fa_plan *plan) {
    const fa_cuda_traffic_in t = fa_cuda_traffic_of(p);
    const double e = t.e, d = t.d, dv = t.dv, qrows = t.qrows, kvrows = t.kvrows;
    const int bm = plan->block_q;
    const size_t gq = p->hq / p->hk > 1 ? fa_cuda_krows_q_heads(p) * (p->d + p->d_v) : 0;
    const double tail = (double)fa_tail_bytes(p, plan);
    double pairs, qb;
    fa_cuda_model_pairs(p, bm, plan->block_k, &pairs, &qb);
    double rd = 2 * qrows * dv * e + pairs * bm * ((d + dv) * e + 8 + 4 * d) + kvrows * (d + dv) * e * p->hq / p->hk +
                qrows * d * 4;
    double wr = qrows * 4 + pairs * bm * 4 * d + qrows * d * e + kvrows * (d + dv) * e + (double)gq * 4;
    rd += tail, wr += 2.0 * tail;
    if (plan->algo == FA_ALGO_FLASH2 && p->deterministic) {
        rd -= pairs * bm * 4 * d + qrows * d * 4;
        wr -= pairs * bm * 4 * d;
        rd += pairs * bm * (d + dv) * e;
    }
    plan->read_bytes = rd, plan->write_bytes = wr;
}

/* FLASH1 forward: Kj Vj once per (b, h); Qi per pair; Oi (fp32), ℓi, mi read on every visit but the first and
 * written on every visit but the last (which writes O in dtype and LSE). */
static void fa_traffic_flash1_fwd(const fa_problem *p, fa_plan *plan) {
    const fa_cuda_traffic_in t = fa_cuda_traffic_of(p);
    const double e = t.e, d = t.d, qrows = t.qrows;
    const int bm = plan->block_q;
    double pairs, qb;
    fa_cuda_model_pairs(p, bm, plan->block_k, &pairs, &qb);
    const double rmw = (pairs - qb) * bm * (4 * d + 8);
    plan->read_bytes = 2 * (double)p->k.seqlen * (p->cu_k ? 1 : p->batch) * p->hq * d * e + pairs * bm * d * e + rmw;
    plan->write_bytes = rmw + qrows * d * e + (p->lse ? qrows * 4 : 0);
}

/* ---- the launches ---- */

static fa_cuda_result fa_result(cudaError_t e) {
    fa_cuda_result r = {e, CUBLAS_STATUS_SUCCESS};
    return r;
}
static fa_cuda_result fa_flash1_fwd_run(const fa_cuda_launch *l) {
    return fa_result(fa_flash1_fwd_launch(l->c, l->plan, (int)l->p->dtype, l->stream));
}
static fa_cuda_result fa_flash2_fwd_run(const fa_cuda_launch *l) {
    return fa_result(fa_flash2_fwd_launch(l->c, l->plan, (int)l->p->dtype, l->stream));
}
static fa_cuda_result fa_flash1_bwd_run(const fa_cuda_launch *l) {
    return fa_result(fa_flash1_bwd_launch(l->c, l->plan, (int)l->p->dtype, l->stream));
}
static fa_cuda_result fa_flash2_bwd_run(const fa_cuda_launch *l) {
    return fa_result(fa_flash2_bwd_launch(l->c, l->plan, (int)l->p->dtype, l->stream));
}

/* ---- the rows ---- */

const fa_cuda_family fa_cuda_flash1_fwd = {"FLASH1", FA_ALGO_FLASH1, FA_CUDA_FWD, 0, FA_CUDA_DT_16, fa_mma_pick,
                                           fa_flash1_fwd_ws, fa_traffic_flash1_fwd, fa_flash1_fwd_run, 0, 0};
const fa_cuda_family fa_cuda_flash2_fwd = {"FLASH2", FA_ALGO_FLASH2, FA_CUDA_FWD, 1, FA_CUDA_DT_16, fa_mma_pick,
                                           NULL, fa_cuda_traffic_q_outer, fa_flash2_fwd_run, 0, 1};
const fa_cuda_family fa_cuda_flash1_bwd = {"FLASH1", FA_ALGO_FLASH1, FA_CUDA_BWD, 0, FA_CUDA_DT_16, fa_mma_pick,
                                           fa_flash_bwd_ws, fa_traffic_flash_bwd, fa_flash1_bwd_run, 0, 0};
const fa_cuda_family fa_cuda_flash2_bwd = {"FLASH2", FA_ALGO_FLASH2, FA_CUDA_BWD, 1, FA_CUDA_DT_16, fa_mma_pick,
                                           fa_flash_bwd_ws, fa_traffic_flash_bwd, fa_flash2_bwd_run, 0, 0};
