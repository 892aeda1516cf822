/*
 * flashattn — exact attention in C: standard attention, FlashAttention-1 and FlashAttention-2,
 * forward and backward, on the CPU and (when built) on NVIDIA Hopper GPUs.
 *
 * This header is the manual. Everything a caller may use is declared here; everything else is internal.
 *
 *   O = softmax(scale · Q Kᵀ + mask) V
 *
 * Conventions used by every declaration below:
 *  - Shapes are [batch, seqlen, heads, head_dim]; head_dim is always contiguous (stride 1). The other three
 *    strides are given in ELEMENTS (not bytes) and may be any non-negative value for inputs (0 broadcasts);
 *    output tensors must not overlap themselves (no zero stride over a dimension of size > 1, no rows that
 *    share elements).
 *  - Data pointers are host pointers for a CPU context and device pointers for a CUDA context.
 *  - Zero extents are valid: batch and seqlen may be 0 (heads and head_dim are >= 1), and a tensor (or LSE) of zero
 *    elements may have a NULL data pointer, as PyTorch gives it; NULL with elements is FA_ERR_INVALID_ARGUMENT.
 *    A call without a single (query, key) pair writes the outputs it defines — out = 0, LSE = -INFINITY,
 *    dq = dk = dv = 0 — and nothing else, whatever algorithm the backend offers (fa_stats.kernel "cpu.zero_fill" /
 *    "cuda.zero_fill", no FLOPs).
 *  - The library never prints, never exits, never aborts. Every entry point validates all of its arguments
 *    before it touches any output: on error it returns a status, writes nothing to outputs, and keeps a
 *    message naming the argument, its value and the reason (fa_context_last_error).
 *  - A context is used by one thread at a time; distinct contexts are independent.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(FA_BUILD_SHARED)
#define FA_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------------
 * Version (the one place it is written: CMake and the Python package read these lines)
 * ------------------------------------------------------------------------------------------------------- */
#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0
#define FA_VERSION_NUMBER (FA_VERSION_MAJOR * 10000 + FA_VERSION_MINOR * 100 + FA_VERSION_PATCH)

/* "0.1.0 (cpu: avx512, cuda: sm_90a)" — the version and what this build contains. Static storage. */
FA_API const char *fa_version_string(void);

/* ---------------------------------------------------------------------------------------------------------
 * Status codes (values are pinned: they never change between releases)
 * ------------------------------------------------------------------------------------------------------- */
typedef enum fa_status {
    FA_OK = 0,
    FA_ERR_INVALID_ARGUMENT = 1,   /* a NULL pointer, bad dimension, stride, shape mismatch, overflow, ... */
    FA_ERR_UNSUPPORTED = 2,        /* valid request this backend/algorithm cannot do (dtype, head_dim, option) */
    FA_ERR_OUT_OF_MEMORY = 3,      /* workspace allocation failed */
    FA_ERR_BACKEND_UNAVAILABLE = 4,/* e.g. CUDA asked for but not built, or no GPU present */
    FA_ERR_DEVICE = 5,             /* a CUDA call failed; the CUDA message is in fa_context_last_error */
    FA_ERR_INTERNAL = 6            /* a bug in flashattn: please report it */
} fa_status;

/* "FA_OK", "FA_ERR_INVALID_ARGUMENT", ...; "unknown fa_status" for other values. Static storage. */
FA_API const char *fa_status_string(fa_status status);

/* ---------------------------------------------------------------------------------------------------------
 * Element types, backends, algorithms
 * ------------------------------------------------------------------------------------------------------- */
typedef enum fa_dtype {
    FA_DTYPE_F32 = 0,   /* IEEE binary32 */
    FA_DTYPE_F16 = 1,   /* IEEE binary16 */
    FA_DTYPE_BF16 = 2,  /* bfloat16 */
    FA_DTYPE_F8_E4M3 = 3 /* OCP FP8 E4M3 "fn" (torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
                          * infinities, NaN = 0x7f / 0xff, largest finite ±448. Forward inputs q, k, v only, each with
                          * fp32 descale factors (fa_attn_opts.q_descale ...); outputs are f32, f16 or bf16. */
} fa_dtype;
/* Storage size of one element in bytes (4, 2 or 1), 0 for an unknown dtype. */
FA_API size_t fa_dtype_size(fa_dtype dtype);
/* "f32", "f16", "bf16", "f8_e4m3"; "?" for an unknown dtype. */
FA_API const char *fa_dtype_name(fa_dtype dtype);

typedef enum fa_backend {
    FA_BACKEND_CPU = 0,
    FA_BACKEND_CUDA = 1
} fa_backend;
/* "cpu", "cuda"; "?" otherwise. */
FA_API const char *fa_backend_name(fa_backend backend);
/* 1 if this build contains the backend AND it can run here (for CUDA: a device is present), else 0. */
FA_API int fa_backend_available(fa_backend backend);

typedef enum fa_algo {
    FA_ALGO_AUTO = 0,      /* the fastest that runs the call: CPU FLASH2; CUDA FLASH3, else FLASH2, else STANDARD */
    FA_ALGO_STANDARD = 1,  /* materialise S = scale·QKᵀ and P = softmax(S) per (batch, head): Θ(N²) memory */
    FA_ALGO_FLASH1 = 2,    /* FlashAttention-1 (Algorithm 1): outer loop K/V blocks, inner loop Q blocks */
    FA_ALGO_FLASH2 = 3,    /* FlashAttention-2: outer loop Q blocks, inner loop K/V blocks, LSE only */
    FA_ALGO_FLASH3 = 4     /* FlashAttention-3: FLASH2's loops on Hopper's asynchrony (wgmma, TMA, warp specialisation);
                            * CUDA sm_90a, D 64, 128 or 256 (fa_forward lists what else it takes) */
} fa_algo;
/* "auto", "standard", "flash1", "flash2", "flash3"; "?" otherwise. */
FA_API const char *fa_algo_name(fa_algo algo);

/* ---------------------------------------------------------------------------------------------------------
 * Tensors: a plain view (the caller owns the memory)
 * ------------------------------------------------------------------------------------------------------- */
typedef struct fa_tensor {
    void *data;            /* host (CPU context) or device (CUDA context) pointer to element [0,0,0,0] */
    fa_dtype dtype;
    int64_t batch, seqlen, heads, head_dim;
    int64_t stride_batch;  /* elements between [b,s,h,0] and [b+1,s,h,0] */
    int64_t stride_seq;    /* elements between [b,s,h,0] and [b,s+1,h,0] */
    int64_t stride_head;   /* elements between [b,s,h,0] and [b,s,h+1,0]; head_dim has stride 1 */
} fa_tensor;

/* Contiguous [batch, seqlen, heads, head_dim] (flash-attn layout). */
FA_API fa_tensor fa_tensor_bshd(void *data, fa_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads,
                                int64_t head_dim);
/* Contiguous [batch, heads, seqlen, head_dim] memory (PyTorch SDPA layout), viewed as [b, s, h, d]. */
FA_API fa_tensor fa_tensor_bhsd(void *data, fa_dtype dtype, int64_t batch, int64_t heads, int64_t seqlen,
                                int64_t head_dim);

/* ---------------------------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------------------------- */
typedef struct fa_context fa_context;

/* Create a context on a backend.
 *   ctx               out: the new context (set to NULL on failure). Must not be NULL.
 *   backend           FA_BACKEND_CPU or FA_BACKEND_CUDA.
 *   device_or_threads CPU: number of threads (0 = all cores; OMP_NUM_THREADS is respected when 0).
 *                     CUDA: device ordinal (>= 0).
 * Returns FA_OK, FA_ERR_INVALID_ARGUMENT, FA_ERR_UNSUPPORTED (FA_CPU_ISA names a level this CPU cannot run),
 * FA_ERR_BACKEND_UNAVAILABLE (CUDA not built / no device), FA_ERR_OUT_OF_MEMORY, FA_ERR_DEVICE. On failure with
 * ctx != NULL the reason is not kept anywhere (there is no context): use fa_create_error() for the message.
 * Environment, read here only (tests and benchmarks): FA_CPU_ISA=scalar|avx2|avx512f|avx512bf16|amx pins the CPU
 * kernel level (default: the highest this CPU has; another name is FA_ERR_INVALID_ARGUMENT, never a fallback);
 * FA_CUDA_FLASH2_FWD_WARPS=4|8 picks FLASH2 forward tiles with that many warps; FA_CUDA_BWD_SPLIT_ROWS=N splits the
 * FLASH2 backward's last wave of K/V blocks for walks of >= N query rows (default 2048, -1 = never);
 * FA_CUDA_FLASH3_CLUSTER=0 keeps the FLASH3 forward off its 2-CTA clusters (default 1: on where its plan takes them);
 * FA_CUDA_FLASH3_QBUF=0 runs the FLASH3 forward without its two Q buffers (head_dim 64 and 128 with 128-key blocks);
 * FA_CUDA_FLASH3_EARLY_TILE=1 has its producer take the next tile's index a tile early (default 0); the results are
 * the same bits either way. FA_CUDA_FLASH3_BWD_PAIRS=1 lets the FLASH3 backward take (dqk, dv) = (192, 128) (default
 * 0: its kernel has not yet run on a GPU; FLASH2's backward runs the pair). FA_CUDA_FLASH3_BWD_FUSED_DQ=0|1|2: the
 * FLASH3 backward converts dQ in a pass of its own (0, default until it has run on a GPU), in its main kernel (1),
 * there also when deterministic (2); the deterministic bits are the same either way. */
FA_API fa_status fa_context_create(fa_context **ctx, fa_backend backend, int device_or_threads);
/* Message of the last failed fa_context_create in this thread ("" if none). Thread-local static storage. */
FA_API const char *fa_create_error(void);
/* Free a context and its workspace. NULL is a no-op. */
FA_API void fa_context_destroy(fa_context *ctx);
/* Message of the last failed call on ctx: which argument, which value, why. "" after a successful call.
 * Valid until the next call on ctx. NULL ctx gives a static message. */
FA_API const char *fa_context_last_error(const fa_context *ctx);
/* CUDA: the cudaStream_t all later work of ctx is queued on (NULL = the legacy default stream).
 * CPU: only NULL is accepted. */
FA_API fa_status fa_context_set_stream(fa_context *ctx, void *cuda_stream);
/* The backend and the thread count (CPU) or device ordinal (CUDA) of ctx; -1 for a NULL ctx. */
FA_API fa_backend fa_context_backend(const fa_context *ctx);
FA_API int fa_context_threads(const fa_context *ctx);

/* ---------------------------------------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------------------------------------- */
typedef struct fa_attn_opts {
    size_t struct_size;   /* sizeof(fa_attn_opts) in the header the caller was compiled with, set by
                           * fa_attn_opts_default() / fa_attn_opts_init(). The library reads that many bytes and takes
                           * the defaults for fields added after them, so a caller built against an older header keeps
                           * working; a larger size whose extra bytes are not all zero is FA_ERR_UNSUPPORTED (fields
                           * this library does not know), 0 is FA_ERR_INVALID_ARGUMENT. Fields are only ever appended. */
    float scale;          /* softmax scale; 0 means 1/sqrt(q's head_dim). Must be finite. */
    int causal;           /* 1: query i sees key j iff j <= i + seqlen_k - seqlen_q (bottom-right aligned) */
    int window_left;      /* sliding window: key j visible iff j >= i + seqlen_k - seqlen_q - window_left; -1 = unbounded */
    int window_right;     /* ... and j <= i + seqlen_k - seqlen_q + window_right; -1 = unbounded (causal = right 0) */
    float softcap;        /* 0 = off; else s <- softcap * tanh(s / softcap), applied to scale·QKᵀ. Must be >= 0. */
    fa_algo algo;         /* FA_ALGO_AUTO = the fastest available */
    int block_q, block_k; /* tile sizes Br, Bc; 0 = the tuned default. For experiments (flashattn bench/io). */
    int deterministic;    /* backward: 1 = bitwise reproducible run to run (no atomics) */
    /* Variable-length packed batches (both NULL = off). When set, q/k/v/out have batch == 1 and seqlen = total
     * tokens; sequence s owns rows [cu_seqlens_q[s], cu_seqlens_q[s+1]) of q/out and [cu_seqlens_k[s],
     * cu_seqlens_k[s+1]) of k/v. Arrays of n_seqs + 1 non-decreasing int32 starting at 0 and ending at the
     * tensor's seqlen: host memory on a CPU context, DEVICE memory on a CUDA context (read by the kernels only, with
     * max_seqlen_q/k below). Empty sequences are allowed, and so are n_seqs = 0 and totals of 0 (every query or key
     * sequence empty). lse is then [1, heads, total_q]. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int64_t n_seqs;
    /* The longest query / key sequence of a packed batch (flash-attn's max_seqlen_q/k); 0 = not given, and set only
     * with cu_seqlens. CPU: optional (the library reads the arrays; a value below the longest is
     * FA_ERR_INVALID_ARGUMENT). CUDA: required when the packed tensor has rows — the host never reads the device
     * arrays: the launch is sized from these, so the call neither copies nor synchronises and a captured CUDA graph
     * replays with whatever the arrays hold. A value above the tensor's seqlen counts as its seqlen. The kernels clamp
     * every offset into the packed tensors and every length to these bounds, so no array reads or writes out of
     * bounds; a sequence longer than its bound leaves its rows past the bound unwritten (out, lse, gradients).
     * CUDA FA_ALGO_STANDARD runs one cuBLAS call per sequence and so reads the lengths back (a synchronising copy:
     * not for a captured graph). */
    int64_t max_seqlen_q, max_seqlen_k;
    /* Learnable attention sinks (gpt-oss; NULL = none): fp32 [heads_q], host memory on a CPU context, DEVICE memory on
     * a CUDA context. Head h's sink is one more logit in every row's softmax denominator that attends to nothing:
     *   O_i = Σ_j exp(s_ij − m) v_j / (exp(sinks[h] − m) + Σ_j exp(s_ij − m)),  m over the visible keys and the sink;
     * the sink is taken as given (neither scaled nor softcapped), LSE includes it, and a row that sees no key gives
     * O = 0 and LSE = sinks[h] (its whole weight is on the sink). sinks[h] = -INFINITY is no sink for head h; NaN or
     * +INFINITY makes head h's rows NaN. docs/numerics.md. */
    const float *sinks;
    /* Read by fa_backward only (other entry points ignore it, so one opts serves both passes): NULL, or fp32
     * [heads_q] on the call's device (as sinks) that receives d sinks[h] = −Σ_{b,i} exp(sinks[h] − LSE_bhi) ·
     * rowsum(dO_bhi ∘ O_bhi), summed over the batch and rows; WRITTEN, not accumulated into. Needs sinks. */
    float *d_sinks;
    /* Used lengths of a packed batch (flash-attn's seqused_q / seqused_k; NULL = the whole spans), set only with
     * cu_seqlens: int32 [n_seqs], seqused_q[s] in 0..cu_seqlens_q[s+1] - cu_seqlens_q[s] (seqused_k likewise), host
     * memory on a CPU context (checked) and DEVICE memory on a CUDA context (read by the kernels only, clamped into
     * 0..the span). Sequence s is then its first seqused_q[s] query rows against its first seqused_k[s] keys (masks
     * align to these lengths); the rest of its span is padding: its out rows are 0, its LSE -INFINITY, and the
     * backward writes 0 to dq of the padding query rows and to dk, dv of the padding keys. */
    const int32_t *seqused_q, *seqused_k;
    /* FP8 inputs (q, k, v of dtype FA_DTYPE_F8_E4M3; fa_forward only): the fp32 factors that turn the stored values
     * back into real ones, as flash-attn's q_descale/k_descale/v_descale: each NULL (= 1) or fp32 [batch][heads_k]
     * contiguous (batch = n_seqs for a packed batch) on the call's device; the attention runs on
     * q_real = q · q_descale[b][h / (heads_q / heads_k)] (so a query head takes the factor of its K/V head), k_real =
     * k · k_descale[b][h], v_real = v · v_descale[b][h]. A CPU context rejects a non-finite factor. Set with inputs of
     * another dtype: FA_ERR_INVALID_ARGUMENT. fa_quantize_fp8 produces them. docs/numerics.md ("FP8"). */
    const float *q_descale, *k_descale, *v_descale;
    /* Chunked local attention (Llama 4; flash-attn's attention_chunk): 0 = off; c > 0 = query row i sees only the keys
     * of its own chunk of c positions, those j with floor(j / c) == floor(diag / c), diag = i + seqlen_k − seqlen_q the
     * row's bottom-right diagonal (the chunks start at key 0 of each sequence). It narrows causal and the window (both
     * still apply). Every entry point that takes a mask takes it (fa_forward, fa_backward, fa_forward_kvcache); the FLASH3
     * backward refuses it (FA_ALGO_AUTO then runs FLASH2's); the ring refuses it. Must be >= 0. */
    int attention_chunk;
} fa_attn_opts;

/* Fill the first struct_size bytes of *opts with the defaults (scale 0, no mask, no softcap, FA_ALGO_AUTO, default
 * tiles, not deterministic, not varlen) and set opts->struct_size = struct_size. For bindings that build the struct
 * themselves; C and C++ callers use fa_attn_opts_default(). FA_ERR_INVALID_ARGUMENT for a NULL opts or a size
 * smaller than the struct_size field. */
FA_API fa_status fa_attn_opts_init(fa_attn_opts *opts, size_t struct_size);

/* The defaults, sized for the header this caller is compiled with. */
static inline fa_attn_opts fa_attn_opts_default(void) {
    fa_attn_opts o;
    fa_attn_opts_init(&o, sizeof o);
    return o;
}

/* ---------------------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------------------- */
/* Non-finite numbers, the same for every algorithm, dtype and backend (docs/numerics.md):
 *   - finite q, k, v (and dout) with a finite scale and softcap never give NaN: a logit scale·q·kᵀ (after softcap)
 *     beyond the fp32 range saturates at ±2^126, so every row's softmax is defined, out stays inside the convex hull
 *     of the V rows the row sees and LSE is finite; a gradient whose value exceeds the fp32 range rounds to ±inf;
 *   - NaN or ±inf in q row i, or in a key row that row i sees, makes exactly row i NaN: out and LSE (and its
 *     gradients), never silently 0; a fully masked row stays out = 0, LSE = -INFINITY;
 *   - NaN or ±inf in v row j reaches, column by column, exactly the output rows that see key j.
 * Forward: out = softmax(scale · q kᵀ + mask) v.
 *   ctx   a context (not NULL).
 *   opts  options (NULL = fa_attn_opts_default()).
 *   q     [B, Sq, Hq, D];  k [B, Sk, Hk, D];  v [B, Sk, Hk, Dv] with Hq % Hk == 0 (GQA/MQA: query head h reads K/V
 *         head h / (Hq / Hk)). q, k, v, out share one dtype; q and k share D, v and out share Dv, which may differ
 *         (MLA: D 192, Dv 128). Each of D, Dv is 1..256 on the CPU (any pair); on CUDA: STANDARD any D and Dv,
 *         FLASH1 f16/bf16 with D 32, 64, 96 or 128, FLASH2 f16/bf16 with D 32, 64, 96, 128 or 256, FLASH3
 *         f16/bf16 with D 64, 128 or 256 (varlen and seqused too; the forward also e4m3 at D 128, 256; chunk: forward),
 *         16-byte aligned rows, no broadcast (stride 0) views; the flash algorithms with Dv = D but for FLASH2's
 *         (D, Dv) = (192, 128), forward and backward (another pair is FA_ERR_UNSUPPORTED naming v).
 *   out   [B, Sq, Hq, Dv], written in full. Must not overlap q, k, v or lse.
 *   lse   NULL, or fp32 [B, Hq, Sq] contiguous: natural-log log-sum-exp of each row of scale·QKᵀ (after softcap and
 *         mask); -INFINITY for a row that sees no key (its output row is 0).
 * Returns FA_OK, FA_ERR_INVALID_ARGUMENT, FA_ERR_UNSUPPORTED, FA_ERR_OUT_OF_MEMORY, FA_ERR_BACKEND_UNAVAILABLE,
 * FA_ERR_DEVICE. */
FA_API fa_status fa_forward(fa_context *ctx, const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k,
                            const fa_tensor *v, const fa_tensor *out, float *lse);
/* FP8 (FA_DTYPE_F8_E4M3) forward: q, k and v all FP8 with opts.q_descale/k_descale/v_descale; out f32, f16 or bf16
 * (never FP8); lse as above. The CPU runs every algorithm on the inputs widened to fp32 with the descales folded in (the
 * rounding reference); CUDA refuses FP8 with FA_ERR_UNSUPPORTED until its Hopper kernel exists. fa_backward,
 * fa_merge_states and the ring take no FP8 tensors, nor do fa_forward_kvcache's q / out (FA_ERR_UNSUPPORTED); its
 * cache may be FP8 (fa_kv_opts.k_descale). */

/* Backward: the gradients of L(out) given dout = ∂L/∂out.
 *   q, k, v, out, lse  exactly as given to / produced by fa_forward with the same opts (lse must not be NULL unless
 *         it has zero elements).
 *   dout  [B, Sq, Hq, Dv] (out's shape).
 *   dq    [B, Sq, Hq, D]; dk [B, Sk, Hk, D]; dv [B, Sk, Hk, Dv] — written in full (with GQA, dk/dv sum over the Hq/Hk query
 *         heads sharing a K/V head). Outputs must not overlap each other or any input.
 * All tensors share one dtype; gradients are accumulated in fp32 and rounded once. A row that sees no key
 * contributes zero to every gradient.
 * Returns as fa_forward. */
FA_API fa_status fa_backward(fa_context *ctx, const fa_attn_opts *opts, const fa_tensor *q, const fa_tensor *k,
                             const fa_tensor *v, const fa_tensor *out, const float *lse, const fa_tensor *dout,
                             const fa_tensor *dq, const fa_tensor *dk, const fa_tensor *dv);

/* ---------------------------------------------------------------------------------------------------------
 * What the last call did
 * ------------------------------------------------------------------------------------------------------- */
typedef struct fa_stats {
    fa_backend backend;
    fa_algo algo;              /* the algorithm that ran (never FA_ALGO_AUTO) */
    int is_backward;
    const char *kernel;        /* the kernel that ran, e.g. "cpu.flash2.avx512f"; static storage */
    int block_q, block_k;      /* Br, Bc actually used */
    int threads;               /* CPU threads used (CUDA: 0) */
    double flops;              /* matmul FLOPs of the call: 2·Sq·Sk_visible·(D + Dv) per head (x2.5 for backward);
                                * CUDA decoding counts every sequence at the cache's capacity, and a CUDA packed batch
                                * every sequence at max_seqlen_q/k (their lengths are on the device): upper bounds */
    int64_t slow_read_bytes;   /* bytes moved from slow memory (main memory / HBM): counted on CPU, modelled on CUDA */
    int64_t slow_write_bytes;  /* bytes moved to slow memory */
    int64_t extra_bytes;       /* memory the call needed beyond its inputs and outputs (workspace, S/P, ...) */
} fa_stats;

/* Copy the stats of the last successful fa_forward/fa_backward/fa_forward_kvcache on ctx into *stats.
 * Returns FA_ERR_INVALID_ARGUMENT for NULL arguments or when no call has succeeded yet. */
FA_API fa_status fa_last_stats(const fa_context *ctx, fa_stats *stats);

/* ---------------------------------------------------------------------------------------------------------
 * KV-cache decoding: split-KV (FlashDecoding), paged caches (PagedAttention), in-place append (docs/kvcache.md)
 * ------------------------------------------------------------------------------------------------------- */
/* A KV cache, in one of two layouts (the caller owns every array):
 *   contiguous  block_table == NULL: k, v are [cache_batch, capacity, heads_k, head_dim] (fa_tensor batch, seqlen,
 *               heads, head_dim; any strides). Sequence b uses cache row batch_idx ? batch_idx[b] : b, and its
 *               capacity is k.seqlen keys.
 *   paged       block_table != NULL: k, v are [num_pages, page_size, heads_k, head_dim] (fa_tensor batch = num_pages,
 *               seqlen = page_size, any page_size >= 1). block_table is int32 [rows, max_pages] with rows of
 *               block_table_stride entries (0 = max_pages); key t of sequence b is row t % page_size of page
 *               block_table[r·stride + t / page_size], r = batch_idx ? batch_idx[b] : b. Capacity is
 *               max_pages · page_size keys. Entries past a sequence's last used page are never read.
 * seqlens       int32 [batch]: keys already in the cache for each sequence (before this call's append); may be NULL
 *               when batch is 0. A paged cache's page_size is >= 1; a cache of no rows, no pages or capacity 0 holds
 *               no key (every sequence's length must then be 0, or the call is an index error).
 * batch_idx     NULL, or int32 [batch]: the cache row (contiguous) or block-table row (paged) of sequence b; rows
 *               must be < cache_rows. Two sequences that append must not share a row or a page.
 * cache_rows    contiguous: ignored (k.batch is the number of rows); paged: the rows of block_table (0 = batch).
 * seqlens, block_table and batch_idx are host memory on a CPU context and DEVICE memory on a CUDA context. */
typedef struct fa_kvcache {
    fa_tensor k, v;
    const int32_t *seqlens;
    const int32_t *block_table;
    int64_t max_pages;
    int64_t block_table_stride;
    const int32_t *batch_idx;
    int64_t cache_rows;
} fa_kvcache;

/* Decoding options beyond fa_attn_opts (init with fa_kv_opts_default(); struct_size works as in fa_attn_opts). */
typedef struct fa_kv_opts {
    size_t struct_size;
    /* Split-KV: each (sequence, K/V head) is cut into key ranges computed in parallel and merged by their LSE.
     * num_splits 0 = the heuristic of docs/kvcache.md (enough work items for every SM / thread), 1 = no split,
     * n > 1 = n splits (capped at one per 16 keys of capacity). split_size > 0 instead cuts every sequence into
     * ranges of exactly split_size keys (the last one shorter), merged in a fixed order: the result of a sequence
     * then depends only on its own inputs, never on the rest of the batch (batch-invariant decoding). Setting
     * both is FA_ERR_INVALID_ARGUMENT. */
    int num_splits;
    int split_size;
    /* Rotary embedding (NULL = off; needs k_new): fp32 tables cos, sin [rotary_seqlen, rotary_dim / 2] (host memory
     * on a CPU context, device memory on CUDA). New key row i of sequence b is rotated at position seqlens[b] + i, and
     * so is query row i in a causal or windowed call (a window of the capacity or more counts as none); otherwise every
     * query row at seqlens[b], as flash-attn does (docs/kvcache.md); on their first rotary_dim dimensions (even, 2..head_dim): interleaved = 1 rotates pairs
     * (2j, 2j+1) (GPT-J), 0 rotates (j, j + rotary_dim/2) (GPT-NeoX, half-split), as flash-attn's. The rotated k is
     * what is appended. Positions must be < rotary_seqlen. */
    const float *rotary_cos, *rotary_sin;
    int64_t rotary_seqlen;
    int rotary_dim;
    int rotary_interleaved;
    /* Workspace for the split partial results: NULL = the context's (grown when too small, as are its CUDA split
     * counters: on CUDA that is an allocation, so before a graph capture make one call of the largest shape or pass
     * a buffer here); else
     * workspace_bytes >= fa_kvcache_workspace_size(...) bytes of host (CPU) or device (CUDA) memory, 256-aligned. */
    void *workspace;
    size_t workspace_bytes;
    /* CUDA: 1 = copy seqlens / block_table / batch_idx to the host and validate them as the CPU does before the
     * launch (synchronises the stream: a debug option). 0 = trusted: the kernels check them on the device, clamp an
     * index out of range so that nothing is read or written out of bounds, and record it for fa_kvcache_check. */
    int check_indices;
    /* flash-attn's cache_leftpad (NULL = none; appended): int32 [batch] on the call's device, sequence b's keys start
     * at cache position leftpad[b] instead of 0 (0 <= leftpad[b] <= seqlens[b]): the keys before it are never attended
     * to, the mask (causal, window, attention_chunk) aligns to the keys [leftpad[b], seqlens[b] + new keys), and
     * rotary positions stay the cache positions (as flash-attn's). CPU only for now (CUDA: FA_ERR_UNSUPPORTED). */
    const int32_t *cache_leftpad;
    /* FP8 caches (cache.k and cache.v both FA_DTYPE_F8_E4M3, q / k_new / v_new / out f32, f16 or bf16): fp32
     * [batch][heads_k] on the call's device, NULL = 1, as flash-attn's k_descale / v_descale: the real value of a cached
     * element of sequence b (cache row batch_idx[b] or its pages), K/V head h is e4m3 · descale[b][h]. Appended rows are
     * quantised with the same factor: x / descale rounded to nearest-even in E4M3, saturating at ±448, NaN kept (as
     * fa_quantize_fp8). A factor that is not finite and > 0: FA_ERR_INVALID_ARGUMENT on a CPU context (and on CUDA
     * with check_indices; without it the call runs and fa_kvcache_check reports the entry); set with a 16/32-bit
     * cache: FA_ERR_INVALID_ARGUMENT. CUDA decodes f16/bf16 q at its head dims with v's equal to q's (a (d, d_v) pair:
     * FA_ERR_UNSUPPORTED). docs/kvcache.md ("FP8 caches"). */
    const float *k_descale, *v_descale;
} fa_kv_opts;

/* As fa_attn_opts_init: fill the first struct_size bytes with the defaults (heuristic splits, no rotary, the
 * context's workspace, trusted indices). */
FA_API fa_status fa_kv_opts_init(fa_kv_opts *opts, size_t struct_size);
static inline fa_kv_opts fa_kv_opts_default(void) {
    fa_kv_opts o;
    fa_kv_opts_init(&o, sizeof o);
    return o;
}

/* Attention of new queries against a KV cache, after appending the new keys and values in place.
 *   opts     scale, causal, window, softcap, attention_chunk and sinks as fa_forward (NULL = defaults; with split-KV
 *            the sink joins each row once, after the merge); algo, block sizes, seqused and max_seqlen_k must be left
 *            at their defaults. The mask is bottom-right aligned over the sequence's keys after the append: with S_b
 *            query rows, N_b new keys and L = seqlens[b] + N_b, query row i sees key j iff j <= i + L - S_b (causal;
 *            window and chunk as fa_forward; with kv_opts.cache_leftpad over the keys from leftpad[b] on).
 *            Varlen (CPU only for now; CUDA: FA_ERR_UNSUPPORTED): opts.cu_seqlens_q (n_seqs + 1 entries, host memory)
 *            packs the queries — q and out are then [1, total_q, heads_q, head_dim], sequence b owns rows
 *            [cu_seqlens_q[b], cu_seqlens_q[b + 1]), lse is [1, heads_q, total_q], max_seqlen_q optional as in
 *            fa_forward — and opts.cu_seqlens_k (flash-attn's cu_seqlens_k_new) packs k_new / v_new the same way;
 *            either may be set alone, and n_seqs is then the batch.
 *   kv_opts  NULL = fa_kv_opts_default().
 *   q        [batch, S, heads_q, head_dim] (decoding S = 1, speculative decoding a few, chunked prefill more; batch 0
 *            or S = 0: nothing to attend, nothing appended); head_dim up to 576.
 *   cache    the KV cache (above); heads_q % cache.k.heads == 0 (GQA/MQA), cache.k with q's dtype (or both k and v
 *            FA_DTYPE_F8_E4M3 with kv_opts.k_descale / v_descale) and head_dim,
 *            cache.v with the same shape but a head_dim of its own, Dv (up to 512: MLA decodes with 576 / 512; CUDA
 *            takes Dv = head_dim and, with a 16-bit cache, the pairs (576, 512) and (192, 128)).
 *   k_new, v_new  NULL (nothing appended), or both [batch, N, heads_k, head_dim | Dv] (N may differ from S:
 *            speculative decoding, chunked prefill; CUDA: N = S for now): written into the cache at keys seqlens[b] ..
 *            seqlens[b] + N - 1 of each sequence (rotated first with rotary), then attended to. Only those rows of the
 *            cache are written; seqlens is not updated (the caller advances it).
 *   out      [batch, S, heads_q, Dv], written in full; must not overlap q, the cache or k_new/v_new.
 *   lse      NULL, or fp32 [batch, heads_q, S] contiguous, natural log (as fa_forward).
 * Every length, page and row index is validated on the CPU (and on CUDA with check_indices): seqlens[b] >= 0,
 * seqlens[b] + (k_new ? S : 0) <= capacity, batch_idx[b] < rows, used block-table entries in [0, num_pages),
 * rotary positions < rotary_seqlen; on error nothing is written, neither out nor the cache.
 * CUDA: no host synchronisation and no allocation inside the call once the workspace is large enough; the launch
 * shape depends only on the shapes (capacity, not seqlens), so a captured CUDA graph replays at any cache length.
 * The index arrays are device memory, read by the kernels: without check_indices an index out of range is clamped
 * on the device (a length into [0, capacity], a row or page into the cache), so that nothing is read or written out
 * of bounds — the sequence's append is skipped, its output is not meaningful — and the first one is recorded in the
 * context: fa_kvcache_check reports it.
 * Returns as fa_forward. */
FA_API fa_status fa_forward_kvcache(fa_context *ctx, const fa_attn_opts *opts, const fa_kv_opts *kv_opts,
                                    const fa_tensor *q, const fa_kvcache *cache, const fa_tensor *k_new,
                                    const fa_tensor *v_new, const fa_tensor *out, float *lse);

/* Whether a KV-cache call on ctx since the last check met an index out of range (CUDA, without check_indices: the
 * kernels clamp it and record the first one in the context). Waits for ctx's stream (so not while it is being
 * captured into a CUDA graph; after a graph's replay, it reports the replay's), reads the record and clears it:
 * FA_ERR_INVALID_ARGUMENT with a message naming the argument, its value and the sequence ("cache.seqlens[3] = 17:
 * with 1 new keys it must be in 0..15 ...", "cache.block_table: entry 0 of sequence 1's row is 99, outside 0..63 ...",
 * "cache.batch_idx[...]", "kv_opts.rotary_seqlen: ...", an FP8 cache's "kv_opts.k_descale[b][h] = nan ..."), or
 * FA_OK. A CPU context validates every index before a call runs: FA_OK. docs/kvcache.md ("Indices out of range"). */
FA_API fa_status fa_kvcache_check(fa_context *ctx);

/* The workspace bytes the same fa_forward_kvcache call would take (CPU: split partials and per-thread scratch; CUDA:
 * split partials and counters unless the splits merge in a thread-block cluster, and with rotary the rotated q — 0
 * without either). Validates the shapes as the call does; the
 * index arrays are not read. docs/kvcache.md. */
FA_API fa_status fa_kvcache_workspace_size(fa_context *ctx, const fa_attn_opts *opts, const fa_kv_opts *kv_opts,
                                           const fa_tensor *q, const fa_kvcache *cache, const fa_tensor *k_new,
                                           size_t *bytes);

/* Merge n partial attention states of the same queries over disjoint key sets into the state over their union:
 *   with w_i = exp(lse_i − M), M = max_i lse_i:  out = Σ w_i out_i / Σ w_i,  lse = M + log Σ w_i  (natural log,
 *   as fa_forward's LSE). A state with lse_i = −inf contributes nothing; if every lse_i is −inf, out = 0, lse = −inf.
 *   outs    n tensors [B, S, H, D] of one dtype (any strides, any head_dim), lses[i] fp32 [B, H, S] contiguous; n >= 1
 *           (CUDA: above 32 states, chunks of 32 over an fp32 running state in the context's workspace, grown as the
 *           KV-cache call's: before a graph capture make one call of the largest shape).
 *   out     [B, S, H, D] of that dtype, written in full; lse NULL or fp32 [B, H, S]. out may be outs[0] exactly
 *           (same data and strides) and lse may be lses[0]; other overlaps are rejected.
 * Use: shared-prefix cascades, ring attention, or any split of the keys across calls. With opts.sinks, the sink must be
 * in exactly one state (the call over one key set with sinks, the others without), or be a state of its own: out = 0
 * (zero strides) and lse = sinks[h] on head h's rows (docs/numerics.md). Returns as fa_forward. */
FA_API fa_status fa_merge_states(fa_context *ctx, int n, const fa_tensor *outs, const float *const *lses,
                                 const fa_tensor *out, float *lse);

/* ---------------------------------------------------------------------------------------------------------
 * FP8 quantisation (docs/numerics.md, "FP8")
 * ------------------------------------------------------------------------------------------------------- */
/* Options of fa_quantize_fp8 (init with fa_quant_opts_default(); struct_size works as in fa_attn_opts). */
typedef struct fa_quant_opts {
    size_t struct_size;
    /* Rows of one scale block: 0 = one scale per (batch, head group) over all of its rows; n > 0 = one per n rows
     * (the last block of a batch may be shorter). */
    int64_t block_rows;
    /* Heads sharing one scale: 1 = a scale per head; for q under GQA pass heads_q / heads_k, so that the descales
     * have fa_attn_opts.q_descale's [batch][heads_k] layout. Must divide x.heads. */
    int64_t heads_per_scale;
    /* 1: one scale over the whole tensor (every descale entry the same; block_rows must then be 0). */
    int per_tensor;
    /* Incoherent processing (FlashAttention-3): 1 = before quantising, each row of head_dim values is multiplied by
     * random signs s_j = ±1 and by the orthonormal Walsh–Hadamard matrix, x ← H·diag(s)·x / sqrt(head_dim)
     * (head_dim a power of two, else FA_ERR_UNSUPPORTED). The signs depend only on seed and j: rotate q and k with the
     * same seed and q·k is unchanged in exact arithmetic, while outliers are spread over the row. Never rotate v
     * (out would come out rotated). */
    int hadamard;
    uint64_t seed;
} fa_quant_opts;
FA_API fa_status fa_quant_opts_init(fa_quant_opts *opts, size_t struct_size);
static inline fa_quant_opts fa_quant_opts_default(void) {
    fa_quant_opts o;
    fa_quant_opts_init(&o, sizeof o);
    return o;
}

/* Quantise x (f32, f16 or bf16; [B, S, H, D], any input strides) into y (FA_DTYPE_F8_E4M3, the same shape; written in
 * full, must not overlap x or descale), with per-block scales written to descale:
 *   descale  fp32 [B][H / heads_per_scale][nblk], contiguous, nblk = block_rows ? ceil(S / block_rows) : 1 (so with
 *            block_rows = 0 it is [B][heads_k] as fa_attn_opts wants it); entry = amax / 448 over the block's finite
 *            |x| (after the rotation), or 1 where that amax is 0;
 *   y        = x / descale rounded to nearest-even in E4M3, saturating at ±448 (±inf too); NaN stays NaN (0x7f/0xff).
 * On the call's device (host pointers on a CPU context, device pointers on CUDA). The arithmetic is in float64 on
 * both, so CPU and CUDA give the same bits. Returns as fa_forward; on error nothing is written. */
FA_API fa_status fa_quantize_fp8(fa_context *ctx, const fa_quant_opts *opts, const fa_tensor *x, const fa_tensor *y,
                                 float *descale);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_H */
