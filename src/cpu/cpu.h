/* The CPU backend's internal interface: what the plan decides (fa_plan fields as the CPU uses them), the
 * algorithm table the plan picks from, and the frame every algorithm's workspace layout shares.
 * A new algorithm is one file in algo/ providing an fa_cpu_algo per pass and one row in backend.c. */
#ifndef FA_CPU_H
#define FA_CPU_H

#include "core/arena.h"
#include "core/internal.h"
#include "cpu/simd/kernels.h"
#include "cpu/tiles/tile_io.h"
#include "cpu/tiles/tiles.h"

#ifdef _OPENMP
#include <omp.h>
static inline int fa_thread_id(void) { return omp_get_thread_num(); }
#else
static inline int fa_thread_id(void) { return 0; }
#endif

/* The forward's work item `it` of heads x tq Q groups (heads = batch x query heads): Q group g of head bh, last
 * groups first across all heads. Under a causal mask the last groups see the most keys; taken head after head, each
 * head's long groups would come after the previous head's short ones, and the last head's would end the call alone
 * (16 heads of 4 groups on 16 threads: at most 12.8x one thread, 16x in this order). */
static inline void fa_cpu_fwd_item(int64_t it, int64_t heads, int64_t tq, int64_t *bh, int64_t *g) {
    *g = tq - 1 - it / heads;
    *bh = it % heads;
}

/* fa_plan.entry: the implementation that runs. */
typedef enum fa_cpu_entry {
    FA_CPU_STANDARD,      /* tiled, through the micro-kernels */
    FA_CPU_STANDARD_BLAS, /* whole heads through the system CBLAS (built with FA_HAVE_CBLAS) */
    FA_CPU_FLASH1,
    FA_CPU_FLASH2,
    FA_CPU_FLASH2_BF16,   /* forward on bf16 storage with the bf16 dot-product kernel */
    FA_CPU_FLASH2_AMX,    /* forward on bf16 storage with the bf16 tile kernel (row-major S) */
    FA_CPU_ENTRIES
} fa_cpu_entry;

/* fa_plan.aux: FLASH2 forward: Q blocks per work item sharing one K/V pack (1 = no pack), rows of the pack buffer.
 * FLASH2 backward: the parts a head's K/V blocks are dealt to (1 = none). FLASH1/FLASH2 backward: 1 when the five
 * tile products run on bf16 tiles (bf16 storage, a bf16_tiles table, no softcap, even head_dim). */
enum { FA_CPU_AUX_GROUP = 0, FA_CPU_AUX_KVROWS = 1, FA_CPU_AUX_SPLIT = 0, FA_CPU_AUX_BF16T = 2 };

/* Query rows per sgemm panel of STANDARD through BLAS (lets a causal mask skip the masked key range). */
#define FA_CPU_BLAS_PANEL 256

/* One implementation for one pass. workspace: the dry run of its layout. run: lays the workspace out over ws
 * (workspace bytes), executes the plan and adds its counted slow-memory traffic into *io. */
typedef struct fa_cpu_algo {
    size_t (*workspace)(const fa_problem *p, const fa_plan *pl);
    void (*run)(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, void *ws, fa_io *io);
} fa_cpu_algo;

extern const fa_cpu_algo fa_cpu_standard_fwd, fa_cpu_standard_bwd;
extern const fa_cpu_algo fa_cpu_standard_blas_fwd, fa_cpu_standard_blas_bwd;
extern const fa_cpu_algo fa_cpu_flash1_fwd, fa_cpu_flash1_bwd;
extern const fa_cpu_algo fa_cpu_flash2_fwd, fa_cpu_flash2_bwd;
extern const fa_cpu_algo fa_cpu_flash2_bf16_fwd, fa_cpu_flash2_amx_fwd;

/* The tile table (tiles/tile_table.c), read by the plan only: Br x Bc for the call, opts overriding, clipped to
 * the sequences. */
void fa_cpu_tiles(const fa_problem *p, int *br, int *bc);
/* FLASH2 forward K/V packing for tr Q blocks of Bc-key tiles on `threads` threads: *group = Q blocks per work item
 * (they share one packed copy of the K/V rows they visit), *seg = most keys packed at once (a multiple of bc; 0 with
 * group = 1). */
void fa_cpu_kv_pack(const fa_problem *p, int64_t tr, int bc, int threads, int *group, int *seg);

/* The modelled slow-memory traffic of the plan (traffic.c); the run reports the counted bytes instead. */
void fa_cpu_plan_traffic(const fa_problem *p, fa_plan *pl);

/* The frame of every CPU workspace: `threads` slices of one per-thread layout, then the algorithm's shared parts,
 * then one io counter pair per thread (zeroed by fa_cpu_ws_counters in the real run). */
typedef struct fa_cpu_ws {
    char *slices;
    size_t per;
    int threads;
    fa_io *io;
} fa_cpu_ws;

/* Take the slices: per is the size of the thread layout's dry run. */
static inline void fa_cpu_ws_slices(fa_arena *a, fa_cpu_ws *w, size_t per, int threads) {
    w->per = (per + 63) & ~(size_t)63;
    w->threads = threads;
    w->slices = fa_arena_take(a, w->per * (size_t)threads, 64);
}
void fa_cpu_ws_counters(fa_arena *a, fa_cpu_ws *w);
/* Thread t's slice, to run the thread layout over. */
static inline fa_arena fa_cpu_ws_thread(const fa_cpu_ws *w, int t) {
    return fa_arena_over(w->slices + (size_t)t * w->per, w->per);
}
/* Add the threads' counters into *io. */
void fa_cpu_ws_total(const fa_cpu_ws *w, fa_io *io);

/* The numerics contract around any algorithm (docs/numerics.md, src/cpu/contract.c). prepare, before it: scan the
 * inputs; *fix = 1 when some head's fp32 result is not certified (a NaN/inf input, huge scale or values), and then
 * reserve the recompute's workspace (FA_ERR_OUT_OF_MEMORY here, before any output is written). fix, after it (only
 * when *fix): recompute those heads in float64; cannot fail once prepare or fix_bytes' reservation succeeded. */
fa_status fa_cpu_contract_prepare(fa_context *ctx, const fa_problem *p, int *fix);
void fa_cpu_contract_fix(fa_context *ctx, const fa_problem *p);
/* The workspace the recompute may need (prepare reserves it): a forward reserves it before its run when the run
 * certifies its items in its own loads, so that a recompute after the outputs are written cannot fail. */
size_t fa_cpu_contract_fix_bytes(const fa_context *ctx, const fa_problem *p);
/* The contract's certificate for one work item from the maxima of |q|, |k|, |v| (fp32 bits, as fa_tile_load_max
 * gives them) over the rows it read: 1 if its fp32 result stands (a run that certifies all its items spares the
 * contract's own scan: fa_io.scanned). */
int fa_cpu_certified_bits(const fa_problem *p, uint32_t mq, uint32_t mk, uint32_t mv, int64_t sk);

#endif
