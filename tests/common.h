/* Shared test helpers: the seeded RNG, tensors in every layout (with poisoned padding), the float64 oracle
 * runs, and the tolerance rule of DESIGN.md. */
#ifndef FA_TEST_COMMON_H
#define FA_TEST_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "flashattn.h"

/* ---- seed, RNG, context ---- */
/* Seeds the RNG from FA_TEST_SEED or the clock, and prints "name: seed S (replay: FA_TEST_SEED=S)". */
uint64_t t_init(const char *name);
uint64_t t_rand_u64(void);
double t_uniform(void);            /* [0, 1) */
double t_randn(void);              /* N(0, 1) */
int t_randint(int lo, int hi);     /* [lo, hi] */
/* A CPU context with FA_TEST_THREADS threads (default 2); aborts the test if that fails. */
fa_context *t_cpu_ctx(void);

/* ---- tensors ---- */
typedef enum t_layout {
    T_BSHD,     /* contiguous [b, s, h, d] */
    T_BHSD,     /* contiguous [b, h, s, d] */
    T_STRIDED,  /* a view into a larger buffer: padded strides, an offset, a random dimension order */
    T_BCAST     /* inputs only: stride_batch = 0 (every batch reads batch 0's memory) */
} t_layout;
const char *t_layout_name(t_layout l);

typedef struct t_buf {
    fa_tensor t;        /* the view */
    unsigned char *mem; /* the whole allocation */
    size_t mem_bytes;
    unsigned char *in_view; /* per element of mem: 1 if the view addresses it */
    size_t mem_elems;
} t_buf;

t_buf t_buf_new(fa_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, t_layout lay);
void t_buf_free(t_buf *x);
/* Whole allocation := the dtype's NaN (padding included, so reading it poisons the result). */
void t_buf_poison(t_buf *x);
/* Every element of the view := sigma · N(0, 1), rounded to the dtype. Padding stays NaN. */
void t_buf_randn(t_buf *x, double sigma);
/* Element [b, s, h, i] of the view. */
double t_get(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i);
void t_set(const fa_tensor *t, int64_t b, int64_t s, int64_t h, int64_t i, double x);
/* After a call wrote the (poisoned) view: number of view elements that are not finite plus the number of padding
 * elements that changed. 0 = every element written, nothing outside the view touched. */
int64_t t_buf_check_written(const t_buf *x);
/* max over the view of |t - ref| (ref contiguous [b, s, h, d]); +inf if any is NaN. */
double t_max_diff(const fa_tensor *t, const double *ref);
double t_max_abs(const double *x, int64_t n);
/* NaN-aware max |a - b| over n floats; matching infinities count as equal. */
double t_max_diff_f(const float *a, const double *b, int64_t n);
float t_nanf(void);

/* ---- the tolerance rule ----
 * err <= 2 · err_std + atol, where err_std is the error of FA_ALGO_STANDARD in the same dtype, and
 * atol = one unit in the last place of the dtype at max|ref| (f32: 5e-6 relative — for f32 the criterion that
 * matters is the next one). On top, every algorithm (STANDARD included) must be within a sanity ceiling of the
 * oracle: for f32 the relative error (max abs err / max |ref|) must be < 1e-5; f16/bf16 a few ulps of the dtype.
 * For gradients, max|ref| is taken over dQ, dK and dV together. Returns 1 if the check passed. */
double t_atol(fa_dtype dt, double refmax);
int t_check_err(const char *what, fa_algo algo, fa_dtype dt, double err, double err_std, double refmax,
                int is_grad, double relax);

/* ---- a test case: shapes, dtype, layouts, options ---- */
typedef struct t_case {
    int64_t b, sq, sk, hq, hk, d; /* varlen: b = 1, sq/sk = totals, opts.cu_seqlens_* set */
    fa_dtype dt;
    t_layout lay_q, lay_kv, lay_o; /* lay_o is used for out, dout and the gradients */
    fa_attn_opts opts;             /* opts.algo is set per run */
    double sigma;                  /* q and k are sigma · N(0,1); v and dout are N(0,1). 0 = 1. */
    double relax;                  /* multiplies the sanity ceiling (f32: the 1e-5 relative bound); 0 = 1 */
    double grad_rel;               /* > 0: gradients are held to err <= 2·err_std + grad_rel·max|ref| only, for
                                    * ill-conditioned cases (logits of 1e4) where rounding S alone moves P by ~1% */
} t_case;

t_case t_case_make(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, fa_dtype dt);
/* The same with the layouts of q (and dq), k/v (and dk/dv) and out (and dout) given. */
t_case t_case_laid(int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t d, fa_dtype dt, t_layout lq,
                   t_layout lkv, t_layout lo);
void t_case_describe(const t_case *c, char *buf, size_t n);
/* A random small case: seqlens from {1, 2, 3, 5, ...} up to max_seqlen, head_dim up to max_d, any dtype, layouts,
 * causal/window/softcap/scale/tile options drawn at random; T_BCAST K/V only if allow_bcast. */
t_case t_case_random(int max_seqlen, int max_d, int allow_bcast);

#define T_ALGO_BIT(a) (1u << (a))
#define T_ALL_ALGOS (T_ALGO_BIT(FA_ALGO_STANDARD) | T_ALGO_BIT(FA_ALGO_FLASH1) | T_ALGO_BIT(FA_ALGO_FLASH2))

/* Forward of every algorithm in `algos` (STANDARD always runs: it is the baseline) against the oracle: status,
 * every output element written (NaN-poisoned first), nothing outside the view written, out and lse within the
 * rule. Returns the number of failures. */
int t_run_forward(fa_context *ctx, const t_case *c, unsigned algos);
/* Forward + backward of every algorithm in `algos` against the oracle's gradients. */
int t_run_backward(fa_context *ctx, const t_case *c, unsigned algos);

#endif
