/* Ring-attention shards for the tests (include/flashattn_ring.h's layout): which global row a rank's local row is,
 * cutting a whole-sequence tensor into a rank's shard, and the error of a shard against a whole-sequence reference. */
#ifndef FA_TEST_SHARD_H
#define FA_TEST_SHARD_H

#include "flashattn.h"
#include "tensor.h"

#include <stdint.h>

/* Global row of rank r's local row i (of S_l): zigzag with causal, contiguous without. */
int64_t t_shard_row(int r, int W, int64_t S_l, int causal, int64_t i);
/* dst (rank r's shard) := its rows of src (the whole sequence). */
void t_shard_scatter(const fa_tensor *src, const fa_tensor *dst, int r, int W, int causal);
/* max |shard − ref| over the shard's rows; ref contiguous [B, S, H, D] of the whole sequence; inf for a NaN. */
double t_shard_err(const fa_tensor *t, const double *ref, int64_t S, int r, int W, int causal);
/* The same for a shard's LSE [BH, S_l] against ref [BH, S]; equal values (−inf included) count as 0. */
double t_shard_lse_err(const float *lse, const double *ref, int64_t BH, int64_t S, int64_t S_l, int r, int W,
                       int causal);

/* A ring case's whole sequence: random q, k, v, dout (contiguous BSHD, the default stream) and the float64 oracle's
 * out [B, S, Hq, D], LSE [B, Hq, S] and gradients on it (with opts.sinks, dsinks [Hq] and its terms' size
 * dsinks_mag [Hq] too, tests/lib/oracle.h; else NULL). Returns the oracle's status. */
typedef struct t_whole {
    t_buf q, k, v, dout;
    double *out, *lse, *dq, *dk, *dv, *dsinks, *dsinks_mag;
} t_whole;

fa_status t_whole_new(t_whole *w, const fa_attn_opts *opts, fa_dtype dt, int64_t B, int64_t S, int64_t Hq, int64_t Hk,
                      int64_t D);
void t_whole_free(t_whole *w);

#endif
