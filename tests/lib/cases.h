/* Test cases: shapes, dtype, layouts and options of one attention call, made by hand or drawn at random. */
#ifndef FA_TESTLIB_CASES_H
#define FA_TESTLIB_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "rng.h"
#include "tensor.h"

#define T_MAX_SEQS 8
#define T_MAX_SINK_HEADS 64

typedef struct t_case {
    int64_t b, sq, sk, hq, hk, d; /* varlen: b = 1, sq/sk = totals, opts.cu_seqlens_* set; d: q/k's head_dim */
    int64_t dv;                    /* v/out's head_dim; 0 = d (t_case_dv) */
    fa_dtype dt;
    t_layout lay_q, lay_kv, lay_o; /* lay_o is used for out, dout and the gradients */
    fa_attn_opts opts;             /* opts.algo is set per run */
    double sigma;                  /* q and k are sigma · N(0,1); v and dout are N(0,1). 0 = 1. */
    double relax;                  /* multiplies the ceiling's relative part (f32: the 1e-5 bound); 0 = 1 */
    double grad_rel;               /* > 0: gradients are held to err <= 2·err_std + grad_rel·max|ref| only, for
                                    * ill-conditioned cases (logits of 1e4) where rounding S alone moves P by ~1% */
    int32_t cu_q[T_MAX_SEQS + 1], cu_k[T_MAX_SEQS + 1]; /* a drawn varlen case's offsets (see t_case_bind) */
    int with_sinks;                /* opts.sinks = sinks (see t_case_bind) */
    int nonfinite_padding;         /* seqused: the padding rows of q, k, v and dout hold NaN and ±inf (t_case_pad) */
    float sinks[T_MAX_SINK_HEADS];
} t_case;

/* v's (and out's) head_dim of the case. */
static inline int64_t t_case_dv(const t_case *c) { return c->dv > 0 ? c->dv : c->d; }

t_case t_case_make(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, fa_dtype dt);
/* The same with the layouts of q (and dq), k/v (and dk/dv) and out (and dout) given. */
t_case t_case_laid(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, fa_dtype dt, t_layout lq,
                   t_layout lkv, t_layout lo);
void t_case_describe(const t_case *c, char *buf, size_t n);

/* With c->nonfinite_padding set, fills the rows of each sequence's span at and past its used length (opts.seqused_q
 * for q and dout, seqused_k for k and v; host arrays) with NaN, +inf and -inf, mixed: that padding may hold anything
 * and must reach no output. Call after the inputs are drawn; dout may be NULL (a forward). */
void t_case_pad(const t_case *c, t_buf *q, t_buf *k, t_buf *v, t_buf *dout);

/* What t_case_draw may produce. */
typedef struct t_space {
    int max_seqlen, max_d; /* seqlens and head dims come from awkward lists (1, 3, 113, 239...; 1, 31, 80, 256...) */
    int bcast;             /* K/V may be T_BCAST */
    int tiles;             /* block_q/block_k may be set (1..70) */
    unsigned dtypes;       /* bit (1u << dtype) per allowed dtype; 0 = f32, f16 and bf16 */
    int varlen_pct;        /* percent of cases that are packed varlen batches, empty sequences included */
    double max_work;       /* > 0: fewer heads, then batches, until b·hq·sq·sk·d ≤ max_work (the oracle's cost) */
    int sinks_pct;         /* percent of cases with learnable sinks (opts.sinks) */
    int chunk_pct;         /* percent of cases with attention_chunk (1..40) */
    int dv_pct;            /* percent of cases whose v/out head_dim is drawn apart from q/k's (MLA: dqk != dv) */
} t_space;

/* A random case: seqlen_q ≠ seqlen_k, GQA/MQA, every layout, causal/window/softcap/scale/sigma/sinks/dv drawn at
 * random.
 * A varlen case keeps its offsets in c.cu_q/cu_k (and sinks in c.sinks): call t_case_bind once the case is where it
 * will be used. */
t_case t_case_draw(t_rng *r, const t_space *sp);
void t_case_bind(t_case *c);
/* Give the case sinks: one logit per query head drawn from [lo, hi] (bound by t_case_bind). */
void t_case_sinks(t_case *c, t_rng *r, double lo, double hi);
/* t_case_draw from the default stream with tiles, all dtypes, no varlen. */
t_case t_case_random(int max_seqlen, int max_d, int allow_bcast);

#endif
