/* The CUDA plan (plan.cu): the one place that decides, for a validated problem, what runs — support, the table
 * row, tiles, launch shape, shared memory, workspace, modelled HBM traffic — and what the run reads from it.
 * Host code. */
#ifndef FA_CUDA_PLAN_H
#define FA_CUDA_PLAN_H

#include "contract.h"
#include "params.h"
#include "sm90/flash3.h"

extern "C" {
#include "core/arena.h"
}

/* Settings read once at context creation (backend.cu) and consulted by the plan. */
typedef struct fa_cuda_tuning {
    int sm_count;   /* the device's SMs (the FLASH2 backward's last-wave split) */
    int fwd_warps;  /* FA_CUDA_FLASH2_FWD_WARPS (0 = the table's default): benchmarks only */
    int split_rows; /* FA_CUDA_BWD_SPLIT_ROWS: split the FLASH2 backward's last wave for walks of at least this many
                     * query rows; < 0 = never. Tests, benchmarks */
} fa_cuda_tuning;
/* The default of split_rows (the split's measurements: docs/cuda-kernels.md). */
#define FA_CUDA_BWD_SPLIT_ROWS 2048
const fa_cuda_tuning *fa_cuda_tuning_of(const fa_context *ctx); /* backend.cu */
/* For the decode path (src/cuda/decode/host.cu), backend.cu: the context's stream, and its cached workspace grown
 * to at least bytes (an allocation and a stream sync when it grows). */
cudaStream_t fa_cuda_stream_of(const fa_context *ctx);
fa_status fa_cuda_workspace_of(fa_context *ctx, size_t bytes, void **ws);
/* The context's split counters (n ints, zero between calls: every kernel that counts leaves them at zero). */
fa_status fa_cuda_counters_of(fa_context *ctx, size_t n, int **out);

/* plan->aux of a FLASH1/FLASH2 backward. */
enum {
    FA_CUDA_AUX_DET = 0,    /* 1: FLASH2's deterministic path (dQ by a second kernel) */
    FA_CUDA_AUX_SPLIT = 1,  /* K/V blocks of FLASH2's split last wave (0: no split) */
    FA_CUDA_AUX_PIECES = 2, /* CTAs of the split launch */
};

/* The device workspace of a plan, described once: a dry run (fa_arena_dry) gives plan->workspace_bytes, the run
 * over the context's cached buffer hands out these pointers (NULL where the plan needs no such part). */
typedef struct fa_cuda_ws {
    float *dsum, *lse2, *dq_acc, *dk_acc, *dv_acc, *tail_acc; /* backward */
    float *o_acc, *row_m, *row_l;                             /* FLASH1 forward */
    void *standard;                                           /* STANDARD's per-sequence scratch */
    int *tile_counter;                                        /* FLASH3's dynamic scheduler (masked calls) */
    size_t standard_bytes;
    fa_contract_ws contract;                                  /* every call: the numerics contract (contract.h) */
} fa_cuda_ws;
/* FLASH3's parameter block for a problem, with the plan's persistent CTAs. */
void fa_flash3_params(const fa_problem *p, int ctas, fa3_params *f);
void fa_cuda_ws_layout(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w);

#endif
