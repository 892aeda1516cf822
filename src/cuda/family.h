/* The CUDA backend's kernel families, in the CPU's shape (src/cpu/cpu.h): one row per family, each saying which
 * algorithm and pass it runs, whether it takes a call (or the reason it does not) with what tiles and launch shape,
 * its device workspace, its modelled HBM traffic and its launch. plan.cu picks a row, backend.cu runs the picked
 * row; nothing else branches on the family. A new family is one row, defined in its folder, and its place in
 * fa_cuda_families (family.cu). Host code. */
#ifndef FA_CUDA_FAMILY_H
#define FA_CUDA_FAMILY_H

#include "contract.h"
#include "params.h"
#include "state.h"

#include <cublas_v2.h>

extern "C" {
#include "core/arena.h"
}

/* The device workspace of a plan, described once: a dry run (fa_arena_dry) gives plan->workspace_bytes, the run
 * over the context's cached buffer hands out these pointers (NULL where the plan needs no such part). */
typedef struct fa_cuda_ws {
    float *dsum, *lse2, *dq_acc, *dk_acc, *dv_acc, *tail_acc; /* backward */
    float *o_acc, *row_m, *row_l;                             /* FLASH1 forward */
    void *standard;                                           /* STANDARD's per-sequence scratch */
    int *tile_counter;                                        /* FLASH3's dynamic scheduler (masked calls) */
    int *dq_turns;                                            /* FLASH3 deterministic backward's dQ order */
    void *v_t;                                                /* FLASH3 FP8 forward: Vᵀ */
    size_t standard_bytes;
    fa_contract_ws contract;                                  /* every call: the numerics contract (contract.h) */
} fa_cuda_ws;

/* What a launch gets: the problem, its plan, the parameter block (workspace parts filled in), the workspace itself
 * (STANDARD's scratch is not in the block), the stream and the cuBLAS handle. */
typedef struct fa_cuda_launch {
    const fa_problem *p;
    const fa_plan *plan;
    const fa_cuda_params *c;
    const fa_cuda_ws *w;
    cudaStream_t stream;
    cublasHandle_t blas;
} fa_cuda_launch;
/* A launch's outcome: the first CUDA error and the cuBLAS status (cudaSuccess, CUBLAS_STATUS_SUCCESS when it ran). */
typedef struct fa_cuda_result {
    cudaError_t cuda;
    cublasStatus_t blas;
} fa_cuda_result;

enum { FA_CUDA_FWD = 1, FA_CUDA_BWD = 2 };
#define FA_CUDA_DT(dtype) (1u << (dtype))
#define FA_CUDA_DT_16 (FA_CUDA_DT(FA_DTYPE_F16) | FA_CUDA_DT(FA_DTYPE_BF16))

typedef struct fa_cuda_family {
    const char *name; /* the algorithm as messages name it ("FLASH2") */
    fa_algo algo;
    int passes;       /* FA_CUDA_FWD, FA_CUDA_BWD or both */
    int auto_pick;    /* 1: FA_ALGO_AUTO may pick it (fa_cuda_families' order) */
    unsigned dtypes;  /* FA_CUDA_DT(dtype) of the inputs it takes: which row of an algorithm a call asks for */
    /* FA_OK with plan's kernel, entry (the tile row), tiles, threads, grid, smem_bytes and aux filled; or
     * FA_ERR_UNSUPPORTED with the reason naming the argument. plan arrives zeroed but for algo and family. */
    fa_status (*pick)(const fa_cuda_tuning *tu, const fa_problem *p, fa_plan *plan, char *why, size_t why_len);
    /* takes the row's parts of the workspace (NULL: none) */
    void (*workspace)(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w);
    /* plan->read_bytes, write_bytes: the modelled HBM traffic (no cache) of the picked plan */
    void (*traffic)(const fa_problem *p, fa_plan *plan);
    fa_cuda_result (*launch)(const fa_cuda_launch *l);
    /* forward: 1 when the kernel checks its own logits and outputs for the numerics contract (marks an item through
     * fa_cuda_params.o_check), so that the contract skips its scan of k and its read of out and LSE (contract.h) */
    int checks_outputs;
    /* forward: 1 when the kernel joins opts.sinks into out and LSE in its epilogue (core/sink.h), so that backend.cu
     * runs no join pass after it and the contract's recompute joins its own rows (fa_cuda_params.sinks_joined) */
    int joins_sinks;
} fa_cuda_family;

/* The rows, each in its family's folder. */
extern const fa_cuda_family fa_cuda_standard;                        /* standard.cu */
extern const fa_cuda_family fa_cuda_flash1_fwd, fa_cuda_flash2_fwd;  /* mma_sync/family.cu */
extern const fa_cuda_family fa_cuda_flash1_bwd, fa_cuda_flash2_bwd;  /* mma_sync/family.cu */
extern const fa_cuda_family fa_cuda_flash3_fwd, fa_cuda_flash3_bwd;  /* wgmma/family.cu */

/* The table in AUTO's order of preference (family.cu); fa_plan.family indexes it. */
#define FA_CUDA_FAMILIES 7
extern const fa_cuda_family *const fa_cuda_families[FA_CUDA_FAMILIES];

/* ---- helpers the rows share (family.cu) ---- */

fa_status fa_cuda_unsupported(char *why, size_t why_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The answer to FP8 inputs of every row but the FLASH3 forward: FA_ERR_UNSUPPORTED, why. */
fa_status fa_cuda_fp8_refusal(char *why, size_t why_len);
/* The call's first view (forward: q, k, v, out; backward also dout, dq, dk, dv) that fails ok, with its name; NULL
 * when every view passes. */
const fa_tensor *fa_cuda_view_failing(const fa_problem *p, int (*ok)(const fa_tensor *), const char **name);
/* 16-byte aligned rows: data pointer % 16 == 0 and every stride a multiple of 8 elements. */
int fa_cuda_aligned16(const fa_tensor *t);
/* Rows of the fp32 row statistics (LSE layout): B·Hq·Sq, or Hq·total_q under varlen. */
size_t fa_cuda_stat_rows(const fa_problem *p);
/* Key rows over the query heads (GQA's per-query-head dK, dV): B·Hq·Sk, or Hq·total_k under varlen. */
size_t fa_cuda_krows_q_heads(const fa_problem *p);
/* Visited (query block, key block) pairs and query blocks visited, summed over sequences and query heads. */
void fa_cuda_model_pairs(const fa_problem *p, int bm, int bn, double *pairs, double *qblocks);
/* Element bytes, head dims (q/k's d, v/out's dv), query-side rows (B·Hq·Sq), K/V rows (B·Hk·Sk) of the traffic
 * models. */
typedef struct fa_cuda_traffic_in {
    double e, d, dv, qrows, kvrows;
} fa_cuda_traffic_in;
fa_cuda_traffic_in fa_cuda_traffic_of(const fa_problem *p);
/* "32, 64, ...": the distinct non-zero values of d[0..n), ascending (the head dims a tile table lists). */
void fa_cuda_dims_list(const int *d, int n, char *buf, size_t len);
/* FLASH2's forward loops (FLASH3's too): Qi once per query block, Kj Vj once per visited pair; O and LSE once. */
void fa_cuda_traffic_q_outer(const fa_problem *p, fa_plan *plan);

/* The whole device workspace of a plan: the picked row's parts, then the numerics contract's. */
void fa_cuda_ws_layout(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w);

#endif
