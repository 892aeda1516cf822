/*
 * flashattn ring attention: exact attention over a sequence split across ranks (context parallelism).
 *
 * Each rank holds a shard of the sequence's Q, K and V; the K/V shards travel around a ring of ranks while each
 * rank attends to the block it holds, and the partial results are merged by their LSE (docs/ring.md). The result
 * on each rank is exactly fa_forward / fa_backward on the whole sequence, restricted to that rank's rows.
 *
 * Conventions: those of flashattn.h (shapes [batch, seqlen, heads, head_dim], strides in elements, host pointers
 * on a CPU context and device pointers on a CUDA context, never prints or aborts, nothing written on error).
 *
 * Sharding of a global sequence of S tokens over W ranks (S_local = S / W rows per rank, equal on every rank):
 *  - not causal: contiguous shards; rank r holds global rows [r·S_local, (r+1)·S_local).
 *  - causal (zigzag, head-tail): the sequence is cut into 2W chunks of c = S_local / 2 rows (S_local must be
 *    even); rank r holds chunk r followed by chunk 2W−1−r, i.e. local row i is global row
 *    r·c + i            for i <  c,
 *    (2W−1−r)·c + i − c for i >= c,
 *    so every rank does the same work under the causal mask. q, k, v, out, lse and every gradient follow the
 *    same layout (lse is [B, Hq, S_local] in local row order).
 *
 * Every rank of the ring must make the same call (forward or backward) with the same shapes, dtype and options;
 * the calls meet through the ring's transport. A call that fails on one rank fails on every rank (the ranks agree
 * on the outcome before any output is written), with the same status. A rank that never calls (or passes a NULL
 * context or comm) leaves the others waiting: as with NCCL, the caller keeps the ranks in step.
 */
#ifndef FLASHATTN_RING_H
#define FLASHATTN_RING_H

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------------
 * Communicators: one per rank (its rank, the world size, and the transport that links it to its neighbours)
 * ------------------------------------------------------------------------------------------------------- */
typedef struct fa_ring_comm fa_ring_comm;
/* The in-process transport: world ranks as threads of one process, each with its own comm (and context). */
typedef struct fa_ring_group fa_ring_group;

/* A group of world ranks (1..1024) for fa_ring_comm_thread. *g is set to NULL on failure. The group must outlive
 * its comms. Returns FA_OK, FA_ERR_INVALID_ARGUMENT, FA_ERR_OUT_OF_MEMORY (message: fa_ring_create_error()). */
FA_API fa_status fa_ring_group_create(fa_ring_group **g, int world);
/* Free a group after every comm made from it is destroyed. NULL is a no-op. */
FA_API void fa_ring_group_destroy(fa_ring_group *g);

/* The comm of rank `rank` (0..world−1, each at most once) of group g: the thread transport. Its ranks exchange
 * blocks by copying from the left neighbour's buffer (memcpy on a CPU context; cudaMemcpyAsync on a CUDA
 * context, so ranks on one GPU are a loopback of the ring and ranks on several GPUs copy peer to peer). Use one
 * thread per rank; contexts may be CPU or CUDA (all ranks of a group on the same backend). */
FA_API fa_status fa_ring_comm_thread(fa_ring_comm **c, fa_ring_group *g, int rank);

/* The comm over the caller's NCCL communicator: nccl_comm is an ncclComm_t (the caller keeps it alive and
 * destroys it after this comm), side_stream a cudaStream_t on the communicator's device on which the transfers
 * are queued (NULL: the comm creates and owns one). The rank and world size are the communicator's. Blocks go
 * rank r -> r+1 with ncclSend/ncclRecv on the side stream, overlapped with the attention on the context's stream
 * (events order the two; the host never waits inside the ring except for the two small agreements of a call).
 * Set NCCL_NVLS_ENABLE=0 in the environment before creating the communicator (docs/ring.md).
 * Returns FA_ERR_BACKEND_UNAVAILABLE in a build without NCCL, FA_ERR_DEVICE if a CUDA or NCCL call fails. */
FA_API fa_status fa_ring_comm_nccl(fa_ring_comm **c, void *nccl_comm, void *side_stream);

/* Free a comm and the buffers it grew (on the device they were allocated on). NULL is a no-op. */
FA_API void fa_ring_comm_destroy(fa_ring_comm *c);
/* The comm's rank and world size; -1 for a NULL comm. */
FA_API int fa_ring_comm_rank(const fa_ring_comm *c);
FA_API int fa_ring_comm_world(const fa_ring_comm *c);
/* "thread" or "nccl"; "?" for a NULL comm. Static storage. */
FA_API const char *fa_ring_comm_transport(const fa_ring_comm *c);
/* Message of the last failed fa_ring_group_create / fa_ring_comm_* constructor in this thread ("" if none).
 * Thread-local static storage. */
FA_API const char *fa_ring_create_error(void);

/* ---------------------------------------------------------------------------------------------------------
 * Ring attention. A comm is used by one thread at a time; it keeps the ring's buffers (two K/V blocks, the fp32
 * running state; the backward also two fp32 dK/dV blocks), grown to the largest call and reused. fa_last_stats
 * of ctx afterwards describes the ring's last per-block call.
 * ------------------------------------------------------------------------------------------------------- */
/* Forward of this rank's rows of softmax(scale · Q Kᵀ + mask) V over the whole sequence.
 *   ctx   this rank's context; comm  this rank's comm.
 *   opts  as fa_forward (NULL = defaults): scale, causal (with the zigzag layout above), softcap, algo (each
 *         block's fa_forward), block_q/block_k, GQA, sinks (on the context's device; joined by step 0's call,
 *         which has every local row, so the merge counts each once; the same on every rank). A sliding window and varlen (cu_seqlens) are
 *         FA_ERR_UNSUPPORTED.
 *   q     [B, S_local, Hq, D];  k, v  [B, S_local, Hk, D], Hq % Hk == 0; the same S_local on every rank, even
 *         with causal. Any strides (as fa_forward).
 *   out   [B, S_local, Hq, D], written in full, once, from an fp32 running state; must not overlap the inputs.
 *   lse   NULL, or fp32 [B, Hq, S_local] contiguous: the natural-log LSE of each row over the whole sequence
 *         (the backward needs it).
 * Each of the W steps calls fa_forward on one block (rank r at step s holds the K/V of rank (r − s) mod W),
 * while the next block is in flight. Returns as fa_forward, plus FA_ERR_DEVICE / FA_ERR_BACKEND_UNAVAILABLE
 * for a transport failure; an argument rejected on any rank (uneven shards included) is FA_ERR_INVALID_ARGUMENT
 * on every rank, with the argument named on the rank that rejected it. */
FA_API fa_status fa_ring_forward(fa_context *ctx, fa_ring_comm *comm, const fa_attn_opts *opts, const fa_tensor *q,
                                 const fa_tensor *k, const fa_tensor *v, const fa_tensor *out, float *lse);

/* Backward: this rank's dq, dk, dv of L(out) given dout, over the whole sequence.
 *   q, k, v, out, lse  this rank's shards as given to / produced by fa_ring_forward with the same opts (lse not
 *                      NULL).
 *   dout  [B, S_local, Hq, D];  dq [B, S_local, Hq, D];  dk, dv [B, S_local, Hk, D] (GQA: summed over the query
 *         heads of a group), written in full; outputs must not overlap each other or any input.
 *   opts.d_sinks  NULL, or fp32 [Hq] (needs opts.sinks): THIS RANK's rows' share of d sinks, written; the sum
 *         over the ranks is the whole sequence's (docs/ring.md, "Sinks").
 * K/V rotate as in the forward, each block's fp32 dK/dV accumulators travel with it, dQ accumulates locally in
 * fp32; a last hop returns every dK/dV to its owner; each gradient is rounded once. Returns as fa_ring_forward. */
FA_API fa_status fa_ring_backward(fa_context *ctx, fa_ring_comm *comm, const fa_attn_opts *opts, const fa_tensor *q,
                                  const fa_tensor *k, const fa_tensor *v, const fa_tensor *out, const float *lse,
                                  const fa_tensor *dout, const fa_tensor *dq, const fa_tensor *dk,
                                  const fa_tensor *dv);

#ifdef __cplusplus
}
#endif
#endif /* FLASHATTN_RING_H */
