/* CPU backend: the kernel table picked at context creation, the one plan of a call (algorithm, kernel name,
 * tiles, threads, K/V packing, workspace from the layout's dry run, modelled traffic), and the run that executes
 * exactly that plan. docs/cpu-kernels.md describes the layout of src/cpu. */
#include "cpu/cpu.h"
#include "core/half.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

fa_status fa_cpu_init(fa_context *ctx) {
    char why[FA_ERR_LEN];
    const fa_cpu_kernels *kr = NULL;
    const fa_status st = fa_cpu_kernels_select(&kr, why, sizeof why);
    if (st != FA_OK) return fa_fail(ctx, st, "%s", why);
    ctx->kernels = kr;
    return FA_OK;
}

/* The implementation of each entry, forward and backward (NULL: that pass has none). */
static const fa_cpu_algo *const algos[FA_CPU_ENTRIES][2] = {
    [FA_CPU_STANDARD] = {&fa_cpu_standard_fwd, &fa_cpu_standard_bwd},
#ifdef FA_HAVE_CBLAS
    [FA_CPU_STANDARD_BLAS] = {&fa_cpu_standard_blas_fwd, &fa_cpu_standard_blas_bwd},
#endif
    [FA_CPU_FLASH1] = {&fa_cpu_flash1_fwd, &fa_cpu_flash1_bwd},
    [FA_CPU_FLASH2] = {&fa_cpu_flash2_fwd, &fa_cpu_flash2_bwd},
    [FA_CPU_FLASH2_BF16] = {&fa_cpu_flash2_bf16_fwd, NULL},
    [FA_CPU_FLASH2_AMX] = {&fa_cpu_flash2_amx_fwd, NULL},
};

/* The kernel name fa_stats reports: the entry and the level of the table that runs (static strings). */
static const char *const kernel_names[FA_CPU_ENTRIES][FA_CPU_ISA_COUNT] = {
    [FA_CPU_STANDARD] = FA_CPU_ISA_NAMES("cpu.standard."),
    [FA_CPU_STANDARD_BLAS] = FA_CPU_ISA_NAMES("cpu.standard.blas."),
    [FA_CPU_FLASH1] = FA_CPU_ISA_NAMES("cpu.flash1."),
    [FA_CPU_FLASH2] = FA_CPU_ISA_NAMES("cpu.flash2."),
    [FA_CPU_FLASH2_BF16] = FA_CPU_ISA_NAMES("cpu.flash2.bf16dot."),
    [FA_CPU_FLASH2_AMX] = FA_CPU_ISA_NAMES("cpu.flash2.bf16tile."),
};
/* The same for FP8 inputs, which run the f32 entries on widened copies (fp8.c). */
static const char *const kernel_names_fp8[FA_CPU_ENTRIES][FA_CPU_ISA_COUNT] = {
    [FA_CPU_STANDARD] = FA_CPU_ISA_NAMES("cpu.fp8.standard."),
    [FA_CPU_STANDARD_BLAS] = FA_CPU_ISA_NAMES("cpu.fp8.standard.blas."),
    [FA_CPU_FLASH1] = FA_CPU_ISA_NAMES("cpu.fp8.flash1."),
    [FA_CPU_FLASH2] = FA_CPU_ISA_NAMES("cpu.fp8.flash2."),
};

#ifdef FA_HAVE_CBLAS
/* sgemm takes a leading dimension in [d, INT_MAX] only (else it prints and does nothing): f32 views outside that
 * range (stride_seq 0 broadcasts, overlapping rows, huge strides) run the tiled STANDARD; f16/bf16 are converted
 * into dense buffers first. So every sgemm argument is valid and BLAS's error handler is unreachable. */
static int blas_ld(const fa_problem *p, const fa_tensor *t) {
    return p->dtype != FA_DTYPE_F32 || (t->stride_seq >= t->head_dim && t->stride_seq <= INT_MAX);
}
static int blas_takes(const fa_problem *p) {
    return p->k.seqlen <= INT_MAX && blas_ld(p, &p->q) && blas_ld(p, &p->k) && blas_ld(p, &p->v) &&
           blas_ld(p, &p->o) && (!p->is_backward || (blas_ld(p, &p->dout) && blas_ld(p, &p->dq)));
}
#endif

/* BLAS chooses its own blocking: explicit tile sizes (--block-q/--block-k, the stats tests) and varlen batches run
 * the tiled STANDARD instead, whose counted traffic follows the per-tile model exactly. */
static fa_cpu_entry pick_entry(const fa_problem *p, const fa_cpu_kernels *kr) {
    switch (p->algo) {
    case FA_ALGO_STANDARD:
#ifdef FA_HAVE_CBLAS
        if (!p->cu_q && !p->cu_k && !p->block_q && !p->block_k && blas_takes(p)) return FA_CPU_STANDARD_BLAS;
#endif
        return FA_CPU_STANDARD;
    case FA_ALGO_FLASH1: return FA_CPU_FLASH1;
    default:
        if (!p->is_backward && p->dtype == FA_DTYPE_BF16 && kr->bf16_dot && p->d % 2 == 0) /* Qi pairs along dqk */
            return kr->bf16_tiles ? FA_CPU_FLASH2_AMX : FA_CPU_FLASH2_BF16;
        return FA_CPU_FLASH2;
    }
}

/* FLASH2 forward: the K/V pack of a work item (aux). The pack buffer holds no more than one K/V tile when no
 * item's keys can fit in it, as without a mask beyond seg keys. */
static void plan_kv_pack(const fa_problem *p, fa_plan *pl) {
    const int bc = pl->block_k;
    int group, seg;
    fa_cpu_kv_pack(p, (p->sq_max + pl->block_q - 1) / pl->block_q, bc, pl->threads, &group, &seg);
    const int64_t sk_tiles = (p->sk_max + bc - 1) / bc * bc;
    const int64_t kvrows =
        seg <= bc || (!fa_problem_masked(p) && sk_tiles > seg) ? bc : seg < sk_tiles ? seg : sk_tiles;
    pl->aux[FA_CPU_AUX_GROUP] = group;
    pl->aux[FA_CPU_AUX_KVROWS] = (int)kvrows;
}

/* FLASH2 backward: with fewer (sequence, K/V head) items than threads and >= 16 K/V blocks, a head's K/V blocks
 * are dealt round-robin to parts, each adding into its own fp32 dQ partial, summed in a fixed order afterwards
 * (deterministic; balanced under a causal mask). */
static int plan_bwd_split(const fa_problem *p, const fa_plan *pl) {
    const int64_t heads = p->batch * p->hk;
    if (heads < pl->threads && p->sk_max >= 16 * (int64_t)pl->block_k) return (int)((pl->threads + heads - 1) / heads);
    return 1;
}

fa_status fa_cpu_plan(const fa_context *ctx, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    /* every validated problem runs on the CPU (f32/f16/bf16, FP8 forward inputs, every pair of head dims 1..256 for
     * q/k and v/out), except the Hopper algorithm */
    if (p->algo == FA_ALGO_FLASH3) {
        snprintf(why, why_len, "opts.algo: FA_ALGO_FLASH3 runs on CUDA (Hopper) only; the CPU runs FA_ALGO_FLASH2 "
                               "(or FA_ALGO_AUTO)");
        return FA_ERR_UNSUPPORTED;
    }
    plan->threads = ctx->threads;
    if (fa_problem_empty(p)) { /* no (query, key) pair: constant outputs, no algorithm runs */
        plan->zero_fill = 1;
        plan->kernel = "cpu.zero_fill";
        plan->write_bytes = fa_zero_fill_bytes(p);
        return FA_OK;
    }
    const fa_cpu_kernels *kr = ctx->kernels;
    if (p->dtype == FA_DTYPE_F8_E4M3) { /* the f32 call on widened copies (fp8.c), plus the widening's traffic */
        fa_problem p32;
        fa_cpu_fp8_problem(p, NULL, &p32);
        const fa_status st = fa_cpu_plan(ctx, &p32, plan, why, why_len);
        if (st != FA_OK) return st;
        plan->kernel = kernel_names_fp8[plan->entry][kr->id];
        fa_cpu_fp8_traffic(p, &plan->read_bytes, &plan->write_bytes);
        return FA_OK;
    }
    const fa_cpu_entry e = pick_entry(p, kr);
    plan->entry = e;
    plan->kernel = kernel_names[e][kr->id];
    if (e == FA_CPU_STANDARD_BLAS) { /* BLAS blocks itself; the stats report its row panels */
        plan->block_q = (int)(p->q.seqlen < FA_CPU_BLAS_PANEL ? p->q.seqlen : FA_CPU_BLAS_PANEL);
        plan->block_k = (int)p->k.seqlen;
    } else {
        fa_cpu_tiles(p, &plan->block_q, &plan->block_k);
    }
    if ((e == FA_CPU_FLASH2 || e == FA_CPU_FLASH2_AMX) && !p->is_backward) plan_kv_pack(p, plan);
    if (e == FA_CPU_FLASH2 && p->is_backward) plan->aux[FA_CPU_AUX_SPLIT] = plan_bwd_split(p, plan);
    if ((e == FA_CPU_FLASH1 || e == FA_CPU_FLASH2) && p->is_backward)
        plan->aux[FA_CPU_AUX_BF16T] = kr->bf16_tiles && p->dtype == FA_DTYPE_BF16 && p->softcap == 0 && p->d % 2 == 0 &&
                                      p->d_v % 2 == 0; /* pairs along dqk (S, dQ, dK) and dv (dP, dV) */
    plan->workspace_bytes = fa_cpu_frame_bytes(&algos[e][p->is_backward]->layout, p, plan);
    fa_cpu_plan_traffic(p, plan);
    return FA_OK;
}

/* Every element of a [B, S, H, D] view set to +0 (all-zero bits in every dtype). */
static void zero_view(const fa_tensor *t) {
    const size_t row = (size_t)t->head_dim * fa_dtype_size(t->dtype);
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seqlen; s++)
            for (int64_t h = 0; h < t->heads; h++)
                memset((char *)t->data + (size_t)(b * t->stride_batch + s * t->stride_seq + h * t->stride_head) *
                                             fa_dtype_size(t->dtype), 0, row);
}

/* The outputs of a call without a (query, key) pair (fa_problem_empty): out = 0 and LSE = -inf, or zero gradients. */
static void zero_fill(const fa_problem *p) {
    if (p->is_backward) {
        zero_view(&p->dq), zero_view(&p->dk), zero_view(&p->dv);
        for (int64_t h = 0; p->d_sinks && h < p->hq; h++) p->d_sinks[h] = 0; /* every row's O is 0 */
        return;
    }
    zero_view(&p->o);
    /* a row without keys: LSE = −inf, or its sink's logit (its whole weight on the sink) */
    for (int64_t i = 0, n = p->q.batch * p->hq * p->q.seqlen; p->lse && i < n; i++) {
        const int64_t h = i / p->q.seqlen % p->hq; /* [B, Hq, Sq], or [1, Hq, total] packed */
        p->lse[i] = -INFINITY;
        if (p->sinks) fa_sink_join(-INFINITY, 0, p->sinks[h], &p->lse[i]);
    }
}

/* A head whose sink is NaN or +inf: every row NaN, out and LSE, as for a NaN in q (core/sink.h); the algorithms leave
 * rows without keys at O = 0. */
static void nan_sink_heads(const fa_problem *p) {
    for (int64_t h = 0; h < p->hq; h++) {
        if (p->sinks[h] < INFINITY) continue; /* -inf or finite: a sink or none */
        for (int64_t b = 0; b < p->batch; b++) {
            fa_head hd;
            fa_cpu_head(p, b, h, &hd);
            for (int64_t i = 0; i < hd.sq; i++) {
                for (int64_t x = 0; x < p->d_v; x++) fa_store_elem(hd.o, (int)p->o.dtype, i * hd.ldo + x, NAN);
                if (hd.lse) hd.lse[i] = NAN;
            }
        }
    }
}

static fa_status run_algo(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st);

/* FP8 inputs: widened into their own buffer (allocated before any output is touched), the f32 run, the staged out
 * rounded into out (fp8.c). */
static fa_status run_fp8(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st) {
    const size_t bytes = fa_cpu_fp8_bytes(p);
    void *buf = fa_workspace_in(ctx, bytes);
    if (!buf) return FA_ERR_OUT_OF_MEMORY;
    fa_problem p32;
    fa_cpu_fp8_problem(p, buf, &p32);
    fa_cpu_fp8_widen(p, &p32, plan->threads);
    const fa_status s = run_algo(ctx, &p32, plan, st);
    if (s != FA_OK) return s;
    fa_cpu_fp8_finish(p, &p32, plan->threads);
    double rd = (double)st->slow_read_bytes, wr = (double)st->slow_write_bytes;
    fa_cpu_fp8_traffic(p, &rd, &wr);
    st->slow_read_bytes = (int64_t)rd, st->slow_write_bytes = (int64_t)wr;
    st->extra_bytes += (int64_t)bytes;
    return FA_OK;
}

fa_status fa_cpu_run(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st) {
    if (plan->zero_fill) {
        zero_fill(p);
        if (!p->is_backward && p->sinks) nan_sink_heads(p);
        if (p->used_q || p->used_k) fa_cpu_zero_unused(p);
        return FA_OK;
    }
    return p->dtype == FA_DTYPE_F8_E4M3 ? run_fp8(ctx, p, plan, st) : run_algo(ctx, p, plan, st);
}

/* The contract (cpu.h): a forward reserves the recompute's workspace with its own, runs, and is done when its loads
 * certified every item (fa_cpu_algo.certifies, fa_io.uncertified); otherwise — and before every backward, whose recompute can be large — the
 * contract's scan decides, before any output is written when it can fail. */
static fa_status run_algo(fa_context *ctx, const fa_problem *p, const fa_plan *plan, fa_stats *st) {
    int fix = 0, prepared = 0;
    size_t need = plan->workspace_bytes;
    if (p->is_backward) {
        fa_status cs = fa_cpu_contract_prepare(ctx, p, &fix);
        if (cs != FA_OK) return cs;
        prepared = 1;
    } else {
        const size_t fb = fa_cpu_contract_fix_bytes(ctx, p);
        if (fb > need) need = fb;
    }
    void *ws = fa_workspace(ctx, need);
    if (!ws) return FA_ERR_OUT_OF_MEMORY;
    const fa_cpu_algo *algo = algos[plan->entry][p->is_backward];
    fa_cpu_frame frame;
    fa_cpu_frame_open(&frame, &algo->layout, p, plan, ws);
    algo->run(ctx->kernels, p, plan, &frame);
    fa_io io;
    memset(&io, 0, sizeof io);
    fa_cpu_frame_total(&frame, &io);
    if (p->d_sinks) fa_cpu_sinks_grad(p, plan->threads, &io);
    st->slow_read_bytes = io.read;
    st->slow_write_bytes = io.written;
    if (p->is_backward || !algo->certifies || io.uncertified != 0) { /* else the run's loads certified every item */
        if (!prepared && fa_cpu_contract_prepare(ctx, p, &fix) != FA_OK) return FA_ERR_OUT_OF_MEMORY; /* reserved */
        if (fix) fa_cpu_contract_fix(ctx, p);
    }
    if (!p->is_backward && p->sinks) nan_sink_heads(p);
    if (p->used_q || p->used_k) fa_cpu_zero_unused(p);
    return FA_OK;
}
