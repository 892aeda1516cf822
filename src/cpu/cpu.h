/* The CPU backend's internal interface: what the plan decides (fa_plan fields as the CPU uses them), the
 * algorithm table the plan picks from, and the workspace frame every CPU run lays out.
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

/* seqused_q/k: the padding rows of a packed batch's spans written as the header defines them (seqused.c). */
void fa_cpu_zero_unused(const fa_problem *p);

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

/* The workspace frame of every CPU run (frame.c), laid out with core/arena.h: `threads` slices of one per-thread
 * layout (each rounded to 64 bytes), one io counter set per thread (zeroed in the real run), then the parts all
 * threads share. An algorithm describes only its two layouts; the frame does the dry run for the size and the real
 * run for the pointers. p is the call's problem: an fa_problem, or the fa_kv_problem of a KV-cache run. */
typedef struct fa_cpu_layout {
    void (*thread)(fa_arena *a, const void *p, const fa_plan *pl, void *tiles); /* one thread's slice into *tiles */
    void (*shared)(fa_arena *a, const void *p, const fa_plan *pl, void *parts); /* NULL: no shared parts */
    size_t tiles_size, parts_size; /* of the structs they fill (the dry runs fill a scratch copy) */
} fa_cpu_layout;

/* The most bytes of the structs a layout fills. */
#define FA_CPU_LAYOUT_STRUCT_MAX 512
/* An fa_cpu_layout from its functions and the types they fill (a struct over FA_CPU_LAYOUT_STRUCT_MAX bytes is a
 * compile error: a negative array size); parts_t: any type when shared is NULL. */
#define FA_CPU_LAYOUT(thread, tiles_t, shared, parts_t)                                                             \
    {(thread), (shared), sizeof(char[sizeof(tiles_t) <= FA_CPU_LAYOUT_STRUCT_MAX ? 1 : -1]) * sizeof(tiles_t),    \
     sizeof(char[sizeof(parts_t) <= FA_CPU_LAYOUT_STRUCT_MAX ? 1 : -1]) * sizeof(parts_t)}

typedef struct fa_cpu_frame {
    const fa_cpu_layout *layout;
    const void *p;
    const fa_plan *pl;
    int threads;     /* pl->threads: the slices, and the num_threads of the run's parallel loops */
    char *slices;
    size_t per;      /* bytes of one slice */
    fa_io *io;       /* threads counter sets */
    char *shared;    /* the shared parts' region, and its bytes */
    size_t shared_bytes;
} fa_cpu_frame;

/* The dry run: the workspace bytes of the layout for this call. */
size_t fa_cpu_frame_bytes(const fa_cpu_layout *l, const void *p, const fa_plan *pl);
/* The real run over ws, of pl->workspace_bytes (the plan's fa_cpu_frame_bytes): the slices, the zeroed counters. */
void fa_cpu_frame_open(fa_cpu_frame *f, const fa_cpu_layout *l, const void *p, const fa_plan *pl, void *ws);
/* The shared parts' pointers into *parts. */
void fa_cpu_frame_shared(const fa_cpu_frame *f, void *parts);
/* The calling thread's slice laid out into *tiles (a few additions: done per work item); returns its counters. */
fa_io *fa_cpu_frame_thread(const fa_cpu_frame *f, void *tiles);
/* Add the threads' counters into *io. */
void fa_cpu_frame_total(const fa_cpu_frame *f, fa_io *io);

/* One implementation for one pass: its workspace layout and its run, which executes the plan over the opened frame
 * (counting its slow-memory traffic in the frame's counters). certifies: the run's loads bound every input it reads
 * and count the items they do not certify (fa_io.uncertified), sparing the numerics contract's scan. */
typedef struct fa_cpu_algo {
    fa_cpu_layout layout;
    void (*run)(const fa_cpu_kernels *kr, const fa_problem *p, const fa_plan *pl, const fa_cpu_frame *f);
    int certifies;
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

/* The backward's d sinks (p->d_sinks set) from out, dout and LSE, after any algorithm (sinks.c); counts its reads. */
void fa_cpu_sinks_grad(const fa_problem *p, int threads, fa_io *io);

/* FP8 inputs (fp8.c): the call runs as an f32 one on q, k, v widened with their descales folded in (and an f16/bf16
 * out staged in fp32). bytes: the buffer of those copies (fa_workspace_in); problem: the f32 problem over buf (NULL
 * while planning: only the shapes and strides are read); widen: fill the copies; finish: the staged out into out;
 * traffic: the bytes the widening and the staging move, added to the f32 run's. */
size_t fa_cpu_fp8_bytes(const fa_problem *p);
void fa_cpu_fp8_problem(const fa_problem *p, void *buf, fa_problem *p32);
void fa_cpu_fp8_widen(const fa_problem *p, const fa_problem *p32, int threads);
void fa_cpu_fp8_finish(const fa_problem *p, const fa_problem *p32, int threads);
void fa_cpu_fp8_traffic(const fa_problem *p, double *read, double *written);

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
 * contract's own scan: fa_cpu_algo.certifies). */
int fa_cpu_certified_bits(const fa_problem *p, uint32_t mq, uint32_t mk, uint32_t mv, int64_t sk);

#endif
