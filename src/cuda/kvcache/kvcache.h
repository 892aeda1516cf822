/* The CUDA KV-cache path's parameter block, instance table and launchers (src/cuda/kvcache/): the first kernel
 * where one is needed — append + rotary, the zeroing of the split counters of a caller's workspace (append.cu) —,
 * the split-KV attention over a contiguous or paged cache, whose last CTA per row tile merges the splits
 * (splitkv.cu), and fa_merge_states (merge.cu); host.cu plans and runs them. Every length and index read on the
 * device is clamped to the cache, so a bad value never reads or writes out of bounds; the first one met is recorded
 * in the context's fault record (fa_kvcache_check reports it). docs/kvcache.md ("Indices out of range"). */
#ifndef FA_CUDA_KVCACHE_H
#define FA_CUDA_KVCACHE_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/attr_once.h"

#define FA_KV_THREADS 128 /* threads per CTA of the first kernel and the merge (the attention kernel's: its row) */
#define FA_KV_ROWS 16     /* query rows per CTA of the attention kernel (the M of its m16n8k16 products) */
#define FA_KV_KEYS 16     /* keys per tile of the attention kernel */
#define FA_MERGE_MAX 32 /* states per launch of fa_merge_states (the parameter block holds their pointers) */
#define FA_KV_MAX_SPLITS 128 /* the last CTA's merge keeps R x splits weights in shared memory */
#define FA_KV_CLUSTER_MAX 16 /* splits that merge in a cluster: the largest (non-portable) cluster */

/* The fault record (the context's, device memory, zero = none): the first index out of range a call met, as
 * {code, sequence, column, value, limit}. The kernels clamp the index and record it; the first writer wins. */
enum {
    FA_KV_FAULT_SEQLENS = 1,     /* seqlens[b] = value < 0, or > limit = capacity - new keys (column: the new keys) */
    FA_KV_FAULT_BATCH_IDX = 2,   /* batch_idx[b] = value outside 0..limit - 1 (the rows) */
    FA_KV_FAULT_BLOCK_TABLE = 3, /* entry `column` of sequence b's block-table row = value outside 0..limit - 1 */
    FA_KV_FAULT_ROTARY = 4,      /* sequence b needs value rotary positions, the tables have limit */
    FA_KV_FAULT_DESCALE = 5      /* an FP8 cache's descale [b][column] not finite and > 0: value its fp32 bits, limit
                                  * 0 for k_descale, 1 for v_descale */
};
#define FA_KV_FAULT_INTS 5

/* The split-KV kernel's instances, as data: one row per (head dim, warps per CTA). The plan (host.cu) puts the
 * row of the call's head dim and of the warps its rule gives into plan->entry; splitkv.cu reaches the row's
 * template instance through a switch on that index, which fails for any other. The head dims CUDA builds are the
 * ones listed here, each with a 4-warp row (the default); d = 256 has no 8-warp row: its rings would exceed shared
 * memory. */
struct fa_kv_inst {
    int d, nw;
    const char *kernel, *kernel_plain; /* the general instance's name, and the one built without rotary q, softcap
                                        * and tiles that span pages (fa_kv_params.plain) */
    const char *kernel_f8, *kernel_f8_plain; /* the same over an FP8 (E4M3) cache */
};
#define FA_KV_INST(D, NW)                                                                                          \
    {D, NW, "cuda.kvcache.mma.d" #D, "cuda.kvcache.mma.plain.d" #D, "cuda.kvcache.mma.e4m3.d" #D,                  \
     "cuda.kvcache.mma.e4m3.plain.d" #D}
static constexpr fa_kv_inst fa_kv_insts[] = {
    FA_KV_INST(64, 4), FA_KV_INST(64, 8), FA_KV_INST(128, 4), FA_KV_INST(128, 8), FA_KV_INST(256, 4),
    FA_KV_INST(96, 4), FA_KV_INST(80, 4), /* tile rows padded to 128 elements in shared memory (splitkv.cu, KV_DS) */
};
#undef FA_KV_INST
#define FA_KV_NINST ((int)(sizeof fa_kv_insts / sizeof fa_kv_insts[0]))

/* The pair kernel's instances (pair.cu): head dims (d, dv) with dv != d (v, out and v_new rows dv wide), 8 warps
 * that split O's columns. The pairs CUDA decodes are the ones listed here. */
struct fa_kv_pair_inst {
    int d, dv;
    const char *kernel;
};
static constexpr fa_kv_pair_inst fa_kv_pair_insts[] = {
    {576, 512, "cuda.kvcache.pair.d576v512"}, /* MLA's latent K (512 + 64 rotary) and V */
    {192, 128, "cuda.kvcache.pair.d192v128"}, /* MLA's unabsorbed heads (128 + 64 rotary), V 128 */
};
#define FA_KV_NPAIR ((int)(sizeof fa_kv_pair_insts / sizeof fa_kv_pair_insts[0]))

typedef struct fa_kv_params {
    const void *q;           /* [b, sq, hq, d] in the dtype */
    float *qrot;             /* rotary: q rotated, fp32 contiguous [b, sq, hq, d]; else NULL */
    int64_t q_sb, q_ss, q_sh;
    void *kc, *vc;           /* cache: rows [rows, cap, hk, d] or pages [pages, page, hk, d] */
    int64_t k_sb, k_ss, k_sh, v_sb, v_ss, v_sh;
    const void *kn, *vn;     /* new keys / values or NULL */
    int64_t kn_sb, kn_ss, kn_sh, vn_sb, vn_ss, vn_sh;
    void *o;
    int64_t o_sb, o_ss, o_sh;
    float *lse;              /* [b, hq, sq] or NULL */
    const float *sinks;      /* [hq] (device) or NULL: joins each row once, where it is finished (finish.cuh) */
    const int *seqlens, *block_table, *batch_idx; /* device */
    int64_t bt_stride;
    int batch, sq, hq, hk, group, d;
    int paged, page_size, num_pages, capacity, cache_rows;
    int append;
    int kn_vec;              /* no rotary and 16-byte aligned new rows: the append copies 16 bytes a thread */
    const float *rcos, *rsin;
    int rot_dim, rot_interleaved, rot_seqlen;
    int rot_q_rows;          /* 1: q row i rotates at len + i; 0: every q row at len (fa_kv_rotary_q_rows) */
    float qmul;              /* q is multiplied by this: scale·log2 e, or scale / softcap */
    float scale, softcap;    /* as given (the float64 recompute of the numerics contract) */
    float softcap_mul;       /* 0 = off; else s = softcap_mul · tanh(q·k) */
    int wl, wr;
    int attention_chunk;     /* 0 = off (core/visible.h) */
    int nsplit, fixed, chunk;/* splits of the grid; fixed: split of `chunk` keys */
    int row_tiles;           /* tiles of FA_KV_ROWS query rows per K/V head */
    int warps;               /* of the attention kernel's CTA: its row's of fa_kv_insts */
    float *part_o, *part_lse;/* [b, hq, sq, nsplit] x (v's head dim | 1), or NULL with one split */
    int *arrived;            /* [b, hk x row_tiles]: CTAs of the row tile done, zero between calls, or NULL */
    int zero_arrived;        /* the first kernel zeroes arrived (a caller's workspace: its counters' state unknown) */
    int after_first;         /* the attention kernel follows the first kernel by programmatic dependent launch */
    int cluster;             /* the splits of a row tile are one thread-block cluster and merge in it (no partials) */
    int plain;               /* no rotary q, no softcap, whole tiles per page: the kernel built without their code */
    int *fault;              /* the context's fault record (FA_KV_FAULT_INTS ints) */
} fa_kv_params;

/* An E4M3 cache's descales (kv_opts.k_descale / v_descale): [b, hk] fp32 each, device, or NULL = 1. */
typedef struct fa_kv_descales {
    const float *k, *v;
} fa_kv_descales;
#ifdef __cplusplus
/* The parameter block of the kernels over an E4M3 cache (kc, vc bytes, real values e4m3 x descale): the 16-bit
 * kernels' block, whose size stays theirs (their code copies it whole), and the descales. */
struct fa_kv_e4m3_params : fa_kv_params {
    fa_kv_descales ds;
};
/* A kernel's parameter block for cache type C (T, or uint8_t: E4M3). */
template <typename C> struct fa_kv_params_of { typedef fa_kv_params type; };
template <> struct fa_kv_params_of<uint8_t> { typedef fa_kv_e4m3_params type; };
#endif

/* Keys of a sequence after the append, from its seqlens entry, clamped into [0, capacity] (in 64 bits: a length near
 * 2^31 plus the new keys would overflow). */
#ifdef __CUDACC__
static __device__ __forceinline__ int fa_kv_len(const fa_kv_params &p, int len) {
    const int64_t L = (int64_t)(len < 0 ? 0 : len) + (p.append ? p.sq : 0);
    return L < p.capacity ? (int)L : p.capacity;
}
/* Record an index out of range in the fault record, unless one is recorded already (slow path: faults only). */
static __device__ __noinline__ void fa_kv_fault(const fa_kv_params &p, int code, int b, int column, int value,
                                                int limit) {
    if (atomicCAS(p.fault, 0, code) != 0) return;
    p.fault[1] = b, p.fault[2] = column, p.fault[3] = value, p.fault[4] = limit;
}
/* The per-sequence indices, checked once per sequence (the host's fa_kv_check_indices on the device): its length
 * against the capacity, its cache row, its rotary positions. Returns 1 when they are in range. */
static __device__ __forceinline__ int fa_kv_check_seq(const fa_kv_params &p, int b, int len) {
    const int add = p.append ? p.sq : 0;
    int ok = 1;
    if (len < 0 || len > p.capacity - add) fa_kv_fault(p, FA_KV_FAULT_SEQLENS, b, add, len, p.capacity - add), ok = 0;
    if (p.batch_idx) {
        const int r = p.batch_idx[b];
        if (r < 0 || r >= p.cache_rows) fa_kv_fault(p, FA_KV_FAULT_BATCH_IDX, b, 0, r, p.cache_rows), ok = 0;
    }
    if (p.rcos && ok && len > p.rot_seqlen - p.sq)
        fa_kv_fault(p, FA_KV_FAULT_ROTARY, b, 0, len + p.sq, p.rot_seqlen), ok = 0;
    return ok;
}
/* An FP8 cache's descales of sequence b, checked once per sequence: one that is not finite and > 0 is recorded (the
 * host cannot read device memory before the call; the CPU refuses such a call). */
static __device__ __noinline__ void fa_kv_check_descales(const fa_kv_e4m3_params &p, int b) {
    const float *ds[2] = {p.ds.k, p.ds.v};
    for (int i = 0; i < 2; i++)
        for (int h = 0; ds[i] && h < p.hk; h++) {
            const float x = ds[i][(int64_t)b * p.hk + h];
            if (!(isfinite(x) && x > 0.f)) fa_kv_fault(p, FA_KV_FAULT_DESCALE, b, h, __float_as_int(x), i);
        }
}
/* Keys per split and the non-empty splits of a sequence of L keys (host/plan: the same rule as the CPU's). */
static __device__ __forceinline__ void fa_kv_split(const fa_kv_params &p, int L, int *chunk, int *ns) {
    int c;
    if (p.fixed) c = p.chunk;
    else {
        c = (L + p.nsplit - 1) / p.nsplit;
        c = c < 16 ? 16 : (c + 15) / 16 * 16;
    }
    int n = (L + c - 1) / c;
    *chunk = c;
    *ns = n < 1 ? 1 : n;
}
/* The merge weight of a state of LSE lse, with M = max lse and inv = 1 / Σ e^(lse − M) (NaN: a NaN state). */
static __device__ __forceinline__ float fa_kv_weight(float lse, float M, float inv) {
    return isnan(inv) ? NAN : lse == -INFINITY ? 0.f : expf(lse - M) * inv;
}
/* Cache row of sequence b (batch_idx or b), clamped to the cache: core's fa_kv_row on the device. */
static __device__ __forceinline__ int fa_kv_cache_row(const fa_kv_params &p, int b) {
    if (!p.batch_idx) return b;
    int r = p.batch_idx[b];
    return r < 0 ? 0 : r >= p.cache_rows ? p.cache_rows - 1 : r;
}
/* Block-table entry of key t of row `row`, or -1 when it is outside [0, num_pages). */
static __device__ __forceinline__ int fa_kv_page_checked(const fa_kv_params &p, int row, int t) {
    const int pg = p.block_table[(int64_t)row * p.bt_stride + t / p.page_size];
    return pg >= 0 && pg < p.num_pages ? pg : -1;
}
/* Element offset of key t of K/V head h in a cache tensor with strides (sb, ss, sh) (a page outside the cache
 * clamped into it). */
static __device__ __forceinline__ int64_t fa_kv_key(const fa_kv_params &p, int row, int t, int h, int64_t sb,
                                                     int64_t ss, int64_t sh) {
    if (p.paged) {
        int pg = p.block_table[(int64_t)row * p.bt_stride + t / p.page_size];
        pg = pg < 0 ? 0 : pg >= p.num_pages ? p.num_pages - 1 : pg;
        return (int64_t)pg * sb + (int64_t)(t % p.page_size) * ss + (int64_t)h * sh;
    }
    return (int64_t)row * sb + (int64_t)t * ss + (int64_t)h * sh;
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* dtype 1 = f16, 2 = bf16 (merge: 0 = f32 too): q's, out's and the cache's, unless ds (non-NULL) says the cache is
 * E4M3 with these descales. */
/* The first kernel: append (p->append; v rows d_v wide, k rows p->d), rotated q (p->qrot), zeroed counters
 * (p->zero_arrived); needed when any is. d_v is apart from the parameter block, which the attention kernels take. */
cudaError_t fa_kv_first_launch(const fa_kv_params *p, const fa_kv_descales *ds, int d_v, int dtype, cudaStream_t st);
/* The attention kernel of row inst of fa_kv_insts (whose d and warps must be p's: cudaErrorInvalidValue
 * otherwise), launched as the first kernel's programmatic dependent when p->after_first. */
cudaError_t fa_kv_attend_launch(const fa_kv_params *p, const fa_kv_descales *ds, int inst, int dtype, cudaStream_t st);
/* The pair kernel of row inst of fa_kv_pair_insts (whose d and dv must be p->d and d_v: cudaErrorInvalidValue
 * otherwise), launched as the first kernel's programmatic dependent when p->after_first. */
cudaError_t fa_kv_pair_launch(const fa_kv_params *p, int d_v, int inst, int dtype, cudaStream_t st);
/* Clusters of p's launch shape (p->nsplit CTAs each) of row inst (f8: its E4M3-cache instance) that the GPU holds
 * at once; 0 when it holds none (or inst is not p's row). */
int fa_kv_active_clusters(const fa_kv_params *p, int inst, int dtype, int f8);

/* One launch merges n <= FA_MERGE_MAX states. More states run as chunks of them in order over an fp32 running state
 * (run_o [rows, d]: Σ e^(lse − M) · out, unnormalised; run_ml [rows, 2]: M and Σ e^(lse − M), M NaN once a NaN LSE
 * was met): the first chunk starts it, the last writes out and lse. first = last = 1: one launch, no running state. */
typedef struct fa_merge_params {
    int n, heads, seqlen, d;
    int rows;                             /* batch · heads · seqlen */
    int first, last;
    float *run_o, *run_ml;                /* workspace, NULL when first = last = 1 */
    const void *in[FA_MERGE_MAX];
    int64_t in_sb[FA_MERGE_MAX], in_ss[FA_MERGE_MAX], in_sh[FA_MERGE_MAX];
    const float *lse_in[FA_MERGE_MAX];
    void *out;
    int64_t o_sb, o_ss, o_sh;
    float *lse;
} fa_merge_params;
cudaError_t fa_merge_states_launch(const fa_merge_params *p, int dtype, cudaStream_t st);
#ifdef __cplusplus
}
#endif
#endif
