/* The entry layer's shared steps: what fa_forward and fa_backward (api.c), the KV-cache entry points (kvcache.c)
 * and the ring's entry points (src/dist/check.c) each do around a backend: read the caller's options, validate a
 * tensor and take its byte span, reject overlaps, count the FLOPs, fill fa_stats from the plan. Only entry files
 * include it; the backends see internal.h and kvcache.h. */
#ifndef FA_CORE_ENTRY_H
#define FA_CORE_ENTRY_H

#include "core/kvcache.h"

/* Bytes [lo, hi) of the caller's memory that an argument covers. */
typedef struct fa_span {
    uintptr_t lo, hi;
} fa_span;

/* Empty spans (tensors of zero elements) overlap nothing. */
static inline int fa_span_overlap(fa_span a, fa_span b) {
    return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

/* The caller's options as this library's struct: the struct_size bytes its header knows, the defaults after them;
 * a size below the first release's, or set bytes beyond this library's struct, fail with a message. NULL in = the
 * defaults. */
FA_HIDDEN fa_status fa_entry_attn_opts(fa_context *ctx, const fa_attn_opts *in, fa_attn_opts *o);
FA_HIDDEN fa_status fa_entry_kv_opts(fa_context *ctx, const fa_kv_opts *in, fa_kv_opts *o);
/* The options every attention entry point takes alike: a finite scale, a finite softcap >= 0, windows >= -1,
 * causal 0 or 1. */
FA_HIDDEN fa_status fa_entry_check_opts(fa_context *ctx, const fa_attn_opts *o);

/* One tensor on its own: dtype, dims (batch, seqlen >= 0; heads, head_dim >= 1), non-negative strides, a data pointer
 * unless it has zero elements, the extent in int64 and in the address space; an output's elements must also be
 * distinct. Fills its byte span (empty for zero elements). */
FA_HIDDEN fa_status fa_entry_tensor(fa_context *ctx, const char *name, const fa_tensor *t, int is_output,
                                    fa_span *sp);
/* t against the dtype and [batch, seqlen, heads, head_dim] the call implies (want[i] < 0: any), each taken from the
 * argument `from`: the first mismatch, naming the argument and the field. */
FA_HIDDEN fa_status fa_entry_shape(fa_context *ctx, const char *name, const fa_tensor *t, fa_dtype dtype,
                                   const int64_t want[4], const char *from);
/* The same shape as like, or that shape with `heads` heads (heads < 0: like's). */
FA_HIDDEN fa_status fa_entry_like(fa_context *ctx, const char *name, const fa_tensor *t, const char *like_name,
                                  const fa_tensor *like, int64_t heads);
/* t's head_dim equal to like's: "<name>: head_dim 64 must equal <like>'s head_dim 128" (q and k share one head_dim,
 * v and out another). */
FA_HIDDEN fa_status fa_entry_head_dims(fa_context *ctx, const char *name, const fa_tensor *t, const fa_tensor *like,
                                       const char *like_name);
/* head_dim within the library's maximum (FA_MAX_HEAD_DIM), else FA_ERR_UNSUPPORTED naming the argument. */
FA_HIDDEN fa_status fa_entry_head_dim(fa_context *ctx, const char *name, int64_t head_dim);
/* The span of a contiguous fp32 [a, b, c] array (an LSE), its extent checked for overflow; x may be NULL only when
 * a·b·c = 0. */
FA_HIDDEN fa_status fa_entry_f32(fa_context *ctx, const char *name, const float *x, int64_t a, int64_t b, int64_t c,
                                 fa_span *sp);
/* "<name>: memory overlaps <names[i]>" for the first of the n spans that o overlaps; FA_OK if none. */
FA_HIDDEN fa_status fa_entry_disjoint(fa_context *ctx, const char *name, fa_span o, const char *const *names,
                                      const fa_span *sp, int n);

/* Host cu_seqlens of n sequences over a packed tensor of `total` rows: cu[0] = 0, non-decreasing, cu[n] = total;
 * *longest (may be NULL) receives the longest sequence. */
FA_HIDDEN fa_status fa_entry_cu_seqlens(fa_context *ctx, const char *name, const int32_t *cu, int64_t n, int64_t total,
                                        int64_t *longest);

/* FP8 descales (fp8_check.c): each of opts' q/k/v_descale NULL or fp32 [batch][heads_k] (on a CPU context every
 * value finite); set only with FP8 inputs (dtype). */
FA_HIDDEN fa_status fa_entry_descales(fa_context *ctx, const fa_attn_opts *o, fa_dtype dtype, int64_t batch,
                                      int64_t heads_k);
/* FA_ERR_UNSUPPORTED naming t and the entry point when t is FP8 (the entry points other than fa_forward). */
FA_HIDDEN fa_status fa_entry_no_fp8(fa_context *ctx, const char *name, const fa_tensor *t, const char *entry);
/* The descales of a validated forward apart from its outputs: out's span, lse's (NULL: none). */
FA_HIDDEN fa_status fa_entry_descales_apart(fa_context *ctx, const fa_problem *p, fa_span out, const fa_span *lse);

/* fa_stats.flops, one formula for every entry point: 2·(dqk + dv) per visible (query, key) pair per query head (QKᵀ
 * and PV; 4·D when the head dims agree), x2.5 for the backward. */
FA_HIDDEN double fa_problem_flops(const fa_problem *p);
/* Decoding's pairs are over each sequence's keys after the append; seqlens NULL (CUDA: the lengths are on the
 * device) counts every sequence at the cache's capacity, the model the CUDA plan's traffic uses. */
FA_HIDDEN double fa_kv_problem_flops(const fa_kv_problem *p, const int32_t *host_seqlens);

/* The stats of a call about to run plan: the plan's algorithm, kernel, tiles, threads (CPU), workspace and modelled
 * traffic. The backend's run may refine the traffic; fa_entry_done records them. */
FA_HIDDEN fa_stats fa_entry_stats(const fa_context *ctx, const fa_plan *plan, int is_backward);
/* A call succeeded: s with its FLOPs becomes what fa_last_stats reports. */
FA_HIDDEN void fa_entry_done(fa_context *ctx, fa_stats *s, double flops);

#endif
