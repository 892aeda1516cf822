/* The bad-input table: every invalid argument of every entry point returns the right status, a message naming
 * the argument, and leaves every output (indeed every byte of every buffer) untouched. Plus the small API
 * surface: names, versions, tensor helpers, contexts, streams, stats before any call. */
#include "testlib.h"

#include <ctype.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the base problem: b2 sq5 sk7 hq4 hk2 d8 f32, all tensors in one arena so overlaps stay in bounds ---- */
enum { B = 2, SQ = 5, SK = 7, HQ = 4, HK = 2, D = 8 };
enum { NQ = B * SQ * HQ * D, NK = B * SK * HK * D, NL = B * HQ * SQ, GAP = 16 };
enum { OFF_Q = 0, OFF_K = OFF_Q + NQ + GAP, OFF_V = OFF_K + NK + GAP, OFF_O = OFF_V + NK + GAP,
       OFF_DO = OFF_O + NQ + GAP, OFF_DQ = OFF_DO + NQ + GAP, OFF_DK = OFF_DQ + NQ + GAP,
       OFF_DV = OFF_DK + NK + GAP, OFF_L = OFF_DV + NK + GAP, ARENA = OFF_L + NL + GAP };

static float arena[ARENA];
static unsigned char arena_copy[sizeof arena];

typedef struct args {
    fa_context *ctx;
    fa_attn_opts opts;
    const fa_attn_opts *popts;
    fa_tensor q, k, v, o, dout, dq, dk, dv;
    const fa_tensor *pq, *pk, *pv, *po, *pdout, *pdq, *pdk, *pdv;
    float *lse;
    int32_t cuq[8], cuk[8];
} args;

static void base_args(args *a, fa_context *ctx) {
    memset(a, 0, sizeof *a);
    a->ctx = ctx;
    a->opts = fa_attn_opts_default();
    a->popts = &a->opts;
    a->q = fa_tensor_bshd(arena + OFF_Q, FA_DTYPE_F32, B, SQ, HQ, D);
    a->k = fa_tensor_bshd(arena + OFF_K, FA_DTYPE_F32, B, SK, HK, D);
    a->v = fa_tensor_bshd(arena + OFF_V, FA_DTYPE_F32, B, SK, HK, D);
    a->o = fa_tensor_bshd(arena + OFF_O, FA_DTYPE_F32, B, SQ, HQ, D);
    a->dout = fa_tensor_bshd(arena + OFF_DO, FA_DTYPE_F32, B, SQ, HQ, D);
    a->dq = fa_tensor_bshd(arena + OFF_DQ, FA_DTYPE_F32, B, SQ, HQ, D);
    a->dk = fa_tensor_bshd(arena + OFF_DK, FA_DTYPE_F32, B, SK, HK, D);
    a->dv = fa_tensor_bshd(arena + OFF_DV, FA_DTYPE_F32, B, SK, HK, D);
    a->pq = &a->q, a->pk = &a->k, a->pv = &a->v, a->po = &a->o;
    a->pdout = &a->dout, a->pdq = &a->dq, a->pdk = &a->dk, a->pdv = &a->dv;
    a->lse = arena + OFF_L;
}

/* The same memory as a packed batch: b1, seqlen 10 / 14, sequences (3, 7) and (7, 7). */
static void varlen(args *a) {
    fa_tensor *qs[] = {&a->q, &a->o, &a->dout, &a->dq}, *ks[] = {&a->k, &a->v, &a->dk, &a->dv};
    for (int i = 0; i < 4; i++) {
        qs[i]->batch = 1, qs[i]->seqlen = B * SQ;
        ks[i]->batch = 1, ks[i]->seqlen = B * SK;
    }
    a->cuq[0] = 0, a->cuq[1] = 3, a->cuq[2] = B * SQ;
    a->cuk[0] = 0, a->cuk[1] = 7, a->cuk[2] = B * SK;
    a->opts.cu_seqlens_q = a->cuq, a->opts.cu_seqlens_k = a->cuk, a->opts.n_seqs = 2;
}

#define MUT(fn) static void fn(args *a)
MUT(nothing) { (void)a; }
MUT(ctx_null) { a->ctx = NULL; }
MUT(opts_null) { a->popts = NULL; }
MUT(q_null) { a->pq = NULL; }
MUT(k_null) { a->pk = NULL; }
MUT(v_null) { a->pv = NULL; }
MUT(o_null) { a->po = NULL; }
MUT(q_data_null) { a->q.data = NULL; }
MUT(k_data_null) { a->k.data = NULL; }
MUT(v_data_null) { a->v.data = NULL; }
MUT(o_data_null) { a->o.data = NULL; }
MUT(q_dtype_7) { a->q.dtype = (fa_dtype)7; }
MUT(all_dtype_7) { a->q.dtype = a->k.dtype = a->v.dtype = a->o.dtype = (fa_dtype)7;
                   a->dout.dtype = a->dq.dtype = a->dk.dtype = a->dv.dtype = (fa_dtype)7; }
MUT(k_dtype_f16) { a->k.dtype = FA_DTYPE_F16; }
MUT(o_dtype_bf16) { a->o.dtype = FA_DTYPE_BF16; }
MUT(q_batch_0) { a->q.batch = 0; }
MUT(q_seqlen_neg) { a->q.seqlen = -1; }
/* zero extents are valid calls (tests/test_empty.c checks what they write); NULL data only with zero elements */
MUT(all_batch_0) {
    fa_tensor *ts[] = {&a->q, &a->k, &a->v, &a->o, &a->dout, &a->dq, &a->dk, &a->dv};
    for (int i = 0; i < 8; i++) ts[i]->batch = 0, ts[i]->data = NULL;
    a->lse = NULL;
}
MUT(no_keys) { a->k.seqlen = a->v.seqlen = a->dk.seqlen = a->dv.seqlen = 0; a->k.data = a->v.data = NULL; }
MUT(no_keys_q_null) { no_keys(a); a->q.data = NULL; }
MUT(vl_no_seqs) {
    varlen(a);
    a->opts.n_seqs = 0;
    fa_tensor *ts[] = {&a->q, &a->k, &a->v, &a->o, &a->dout, &a->dq, &a->dk, &a->dv};
    for (int i = 0; i < 8; i++) ts[i]->seqlen = 0;
}
MUT(q_batch_neg) { a->q.batch = -1; }
MUT(k_seqlen_0) { a->k.seqlen = 0; }
MUT(v_heads_0) { a->v.heads = 0; }
MUT(q_hd_0) { a->q.head_dim = 0; }
MUT(o_hd_neg) { a->o.head_dim = -3; }
MUT(q_sb_neg) { a->q.stride_batch = -1; }
MUT(k_ss_neg) { a->k.stride_seq = -8; }
MUT(v_sh_neg) { a->v.stride_head = -1; }
MUT(q_extent_ovf) { a->q.stride_batch = INT64_MAX; }
MUT(k_extent_ovf) { a->k.stride_seq = INT64_MAX / 3; }
MUT(v_bytes_ovf) { a->v.stride_batch = INT64_MAX / 4; }
MUT(k_batch_3) { a->k.batch = 3; }
MUT(v_batch_1) { a->v.batch = 1; }
MUT(o_batch_1) { a->o.batch = 1; }
MUT(gqa_3) { a->k.heads = a->v.heads = 3; a->dk.heads = a->dv.heads = 3; }
MUT(v_heads_1) { a->v.heads = 1; }
MUT(v_seqlen_6) { a->v.seqlen = 6; }
MUT(k_hd_4) { a->k.head_dim = 4; }
MUT(v_hd_4) { a->v.head_dim = 4; }
MUT(o_hd_4) { a->o.head_dim = 4; }
MUT(vo_hd_4) { a->v.head_dim = a->o.head_dim = 4; } /* v and out with their own head_dim (dv != dqk) */
MUT(vo_dout_dv_hd_4) { a->v.head_dim = a->o.head_dim = a->dout.head_dim = a->dv.head_dim = 4; }
MUT(o_seqlen_4) { a->o.seqlen = 4; }
MUT(o_heads_2) { a->o.heads = 2; }
static void set_hd(args *a, int64_t d) {
    fa_tensor *ts[] = {&a->q, &a->k, &a->v, &a->o, &a->dout, &a->dq, &a->dk, &a->dv};
    for (int i = 0; i < 8; i++) {
        ts[i]->head_dim = d;
        ts[i]->stride_head = d, ts[i]->stride_seq = d * ts[i]->heads, ts[i]->stride_batch = d * ts[i]->heads * ts[i]->seqlen;
    }
}
MUT(hd_257) { set_hd(a, 257); }
MUT(hd_1000) { set_hd(a, 1000); }
MUT(scale_nan) { a->opts.scale = t_nanf(); }
MUT(scale_inf) { a->opts.scale = INFINITY; }
MUT(softcap_neg) { a->opts.softcap = -1.0f; }
MUT(softcap_nan) { a->opts.softcap = t_nanf(); }
MUT(wl_neg2) { a->opts.window_left = -2; }
MUT(wr_neg5) { a->opts.window_right = -5; }
MUT(causal_2) { a->opts.causal = 2; }
MUT(algo_9) { a->opts.algo = (fa_algo)9; }
MUT(algo_neg) { a->opts.algo = (fa_algo)-1; }
MUT(block_q_neg) { a->opts.block_q = -1; }
MUT(block_k_huge) { a->opts.block_k = 1 << 20; }
MUT(vl_ok) { varlen(a); }
MUT(vl_bounds_ok) { varlen(a); a->opts.max_seqlen_q = 7, a->opts.max_seqlen_k = 100; } /* >= the longest: valid */
MUT(vl_bound_short) { varlen(a); a->opts.max_seqlen_q = 6; }                            /* sequence 1 has 7 rows */
MUT(vl_bound_neg) { varlen(a); a->opts.max_seqlen_k = -1; }
MUT(bound_no_varlen) { a->opts.max_seqlen_q = 5; }
MUT(vl_only_q) { varlen(a); a->opts.cu_seqlens_k = NULL; }
MUT(vl_only_k) { varlen(a); a->opts.cu_seqlens_q = NULL; }
MUT(vl_nseqs_0) { varlen(a); a->opts.n_seqs = 0; }
MUT(vl_nseqs_neg) { varlen(a); a->opts.n_seqs = -1; }
MUT(vl_batch_2) { varlen(a); a->q.batch = a->k.batch = a->v.batch = a->o.batch = 2; a->q.seqlen = a->o.seqlen = 5;
                  a->dout.batch = a->dq.batch = a->dk.batch = a->dv.batch = 2; }
MUT(vl_nonmono) { varlen(a); a->opts.n_seqs = 3; a->cuq[1] = 6, a->cuq[2] = 3, a->cuq[3] = B * SQ;
                  a->cuk[1] = 5, a->cuk[2] = 9, a->cuk[3] = B * SK; }
MUT(vl_start_1) { varlen(a); a->cuq[0] = 1; }
MUT(vl_k_short) { varlen(a); a->cuk[2] = B * SK - 1; }
MUT(vl_q_long) { varlen(a); a->cuq[2] = B * SQ + 1; }
/* forward only: out is an output there */
MUT(o_is_q) { a->o.data = a->q.data; }
MUT(o_in_k) { a->o.data = arena + OFF_K + 3; }
MUT(o_tail_over_v) { a->o.data = arena + OFF_V - NQ + 1; }
MUT(o_ss_0) { a->o.stride_seq = 0; }
MUT(o_sb_0) { a->o.stride_batch = 0; }
MUT(o_sh_4) { a->o.stride_head = 4; }
MUT(o_rows_share) { a->o.stride_seq = D; a->o.stride_head = D; } /* [s, h] and [s+1, h-1] coincide */
MUT(lse_in_q) { a->lse = arena + OFF_Q + 5; }
MUT(lse_in_o) { a->lse = arena + OFF_O + NQ - 3; }
/* backward only */
MUT(lse_null) { a->lse = NULL; }
MUT(dout_null) { a->pdout = NULL; }
MUT(dq_null) { a->pdq = NULL; }
MUT(dk_data_null) { a->dk.data = NULL; }
MUT(dv_data_null) { a->dv.data = NULL; }
MUT(dout_f16) { a->dout.dtype = FA_DTYPE_F16; }
MUT(dq_dtype_7) { a->dq.dtype = (fa_dtype)7; }
MUT(dq_seqlen_4) { a->dq.seqlen = 4; }
MUT(dk_heads_4) { a->dk.heads = 4; a->dk.stride_seq = 4 * D; a->dk.stride_batch = 4 * D * SK; }
MUT(dv_hd_4) { a->dv.head_dim = 4; }
MUT(dout_batch_1) { a->dout.batch = 1; }
MUT(dv_seqlen_5) { a->dv.seqlen = 5; }
MUT(dq_ss_0) { a->dq.stride_seq = 0; }
MUT(dk_sh_0) { a->dk.stride_head = 0; }
MUT(dv_ss_neg) { a->dv.stride_seq = -1; }
MUT(dk_is_dq) { a->dk.data = a->dq.data; }
MUT(dq_is_dout) { a->dq.data = a->dout.data; }
MUT(dv_is_v) { a->dv.data = a->v.data; }
MUT(dk_in_o) { a->dk.data = arena + OFF_O + 8; }
MUT(dq_in_lse) { a->lse = arena + OFF_DQ + 17; }
MUT(dq_extent_ovf) { a->dq.stride_seq = INT64_MAX / 2; }
/* Inputs broadcast (stride 0) over a huge batch x seqlen are valid views, but lse ([batch, heads, seqlen]) and the
 * contiguous outputs of that shape cannot be addressed: 2^64 rows. */
MUT(huge_broadcast) {
    fa_tensor *ts[] = {&a->q, &a->k, &a->v, &a->o, &a->dout, &a->dq, &a->dk, &a->dv};
    for (int i = 0; i < 8; i++) {
        ts[i]->batch = (int64_t)1 << 32, ts[i]->seqlen = (int64_t)1 << 32;
        if (i < 5) { /* inputs (out is one in backward; as forward's output it is rejected for its stride 0 ...) */
            ts[i]->stride_batch = ts[i]->stride_seq = 0;
        } else {
            ts[i]->stride_seq = ts[i]->heads * D, ts[i]->stride_batch = ((int64_t)1 << 32) * ts[i]->heads * D;
        }
    }
}
/* ... so forward gets a contiguous out of that shape, whose extent overflows */
MUT(huge_broadcast_fwd) {
    huge_broadcast(a);
    a->o.stride_seq = HQ * D, a->o.stride_batch = ((int64_t)1 << 32) * HQ * D;
}

enum { FWD = 1, BWD = 2 };
typedef struct row {
    const char *name;
    int entries;
    void (*mut)(args *);
    fa_status want;
    const char *needle; /* '&'-separated words that must all appear in the message (case-insensitive) */
} row;

#define INV FA_ERR_INVALID_ARGUMENT
#define UNS FA_ERR_UNSUPPORTED
static const row rows[] = {
    {"valid call (control)", FWD | BWD, nothing, FA_OK, ""},
    {"opts NULL = defaults (control)", FWD | BWD, opts_null, FA_OK, ""},
    {"valid varlen call (control)", FWD | BWD, vl_ok, FA_OK, ""},
    {"ctx NULL", FWD | BWD, ctx_null, INV, "ctx"},
    {"q NULL", FWD | BWD, q_null, INV, "q:"},
    {"k NULL", FWD | BWD, k_null, INV, "k:"},
    {"v NULL", FWD | BWD, v_null, INV, "v:"},
    {"out NULL", FWD | BWD, o_null, INV, "out:"},
    {"q.data NULL", FWD | BWD, q_data_null, INV, "q:&data"},
    {"k.data NULL", FWD | BWD, k_data_null, INV, "k:&data"},
    {"v.data NULL", FWD | BWD, v_data_null, INV, "v:&data"},
    {"out.data NULL", FWD | BWD, o_data_null, INV, "out:&data"},
    {"q.dtype 7", FWD | BWD, q_dtype_7, UNS, "q:&dtype"},
    {"every dtype 7", FWD | BWD, all_dtype_7, UNS, "dtype"},
    {"k.dtype f16 with q f32", FWD | BWD, k_dtype_f16, INV, "dtype"},
    {"out.dtype bf16 with q f32", FWD | BWD, o_dtype_bf16, INV, "dtype"},
    {"q.batch 0 (k.batch 2)", FWD | BWD, q_batch_0, INV, "k:&batch&q.batch = 0"},
    {"q.batch -1", FWD | BWD, q_batch_neg, INV, "q:&batch"},
    {"q.seqlen -1", FWD | BWD, q_seqlen_neg, INV, "q:&seqlen"},
    {"k.seqlen 0 (v.seqlen 7)", FWD | BWD, k_seqlen_0, INV, "v:&seqlen&k.seqlen = 0"},
    {"every batch 0, data NULL (empty)", FWD | BWD, all_batch_0, FA_OK, ""},
    {"k, v seqlen 0, data NULL (no keys)", FWD | BWD, no_keys, FA_OK, ""},
    {"q.data NULL with rows, k empty", FWD | BWD, no_keys_q_null, INV, "q:&data"},
    {"varlen: n_seqs 0, every seqlen 0 (empty)", FWD | BWD, vl_no_seqs, FA_OK, ""},
    {"v.heads 0", FWD | BWD, v_heads_0, INV, "v:&heads"},
    {"q.head_dim 0", FWD | BWD, q_hd_0, INV, "q:&head_dim"},
    {"out.head_dim -3", FWD | BWD, o_hd_neg, INV, "out:&head_dim"},
    {"q.stride_batch -1", FWD | BWD, q_sb_neg, INV, "q:&stride_batch"},
    {"k.stride_seq -8", FWD | BWD, k_ss_neg, INV, "k:&stride_seq"},
    {"v.stride_head -1", FWD | BWD, v_sh_neg, INV, "v:&stride_head"},
    {"q.stride_batch INT64_MAX (extent overflows)", FWD | BWD, q_extent_ovf, INV, "q:&overflow"},
    {"k.stride_seq INT64_MAX/3 x 6 (extent overflows)", FWD | BWD, k_extent_ovf, INV, "k:&overflow"},
    {"v.stride_batch INT64_MAX/4 (bytes overflow)", FWD | BWD, v_bytes_ovf, INV, "v:&overflow"},
    {"k.batch 3 vs q.batch 2", FWD | BWD, k_batch_3, INV, "k:&batch"},
    {"v.batch 1 vs q.batch 2", FWD | BWD, v_batch_1, INV, "v:&batch"},
    {"out.batch 1 vs q.batch 2", FWD | BWD, o_batch_1, INV, "out:&batch"},
    {"q.heads 4 not divisible by k.heads 3", FWD | BWD, gqa_3, INV, "heads"},
    {"v.heads 1 vs k.heads 2", FWD | BWD, v_heads_1, INV, "v:&heads"},
    {"v.seqlen 6 vs k.seqlen 7", FWD | BWD, v_seqlen_6, INV, "seqlen"},
    {"k.head_dim 4 vs 8", FWD | BWD, k_hd_4, INV, "k:&head_dim"},
    {"v.head_dim 4 vs out's 8", FWD | BWD, v_hd_4, INV, "out:&head_dim 8&v's head_dim 4"},
    {"v, out head_dim 4 vs q's 8", FWD, vo_hd_4, FA_OK, ""},
    {"v, out head_dim 4, dout 8", BWD, vo_hd_4, INV, "dout:&head_dim 8&out's head_dim 4"},
    {"v, out, dout, dv head_dim 4 vs q's 8", BWD, vo_dout_dv_hd_4, FA_OK, ""},
    {"out.head_dim 4 vs 8", FWD | BWD, o_hd_4, INV, "out:&head_dim"},
    {"out.seqlen 4 vs 5", FWD | BWD, o_seqlen_4, INV, "out:&seqlen"},
    {"out.heads 2 vs 4", FWD | BWD, o_heads_2, INV, "out:&heads"},
    {"head_dim 257", FWD | BWD, hd_257, UNS, "head_dim&257"},
    {"head_dim 1000", FWD | BWD, hd_1000, UNS, "head_dim&1000"},
    {"opts.scale NaN", FWD | BWD, scale_nan, INV, "opts.scale"},
    {"opts.scale inf", FWD | BWD, scale_inf, INV, "opts.scale"},
    {"opts.softcap -1", FWD | BWD, softcap_neg, INV, "opts.softcap"},
    {"opts.softcap NaN", FWD | BWD, softcap_nan, INV, "opts.softcap"},
    {"opts.window_left -2", FWD | BWD, wl_neg2, INV, "opts.window_left"},
    {"opts.window_right -5", FWD | BWD, wr_neg5, INV, "opts.window&right"},
    {"opts.causal 2", FWD | BWD, causal_2, INV, "opts.causal"},
    {"opts.algo 9", FWD | BWD, algo_9, INV, "opts.algo"},
    {"opts.algo -1", FWD | BWD, algo_neg, INV, "opts.algo"},
    {"opts.block_q -1", FWD | BWD, block_q_neg, INV, "block_q"},
    {"opts.block_k 2^20", FWD | BWD, block_k_huge, INV, "block_k"},
    {"varlen: bounds at or above the longest sequences", FWD | BWD, vl_bounds_ok, FA_OK, ""},
    {"varlen: max_seqlen_q 6 below the longest 7", FWD | BWD, vl_bound_short, INV, "opts.max_seqlen_q"},
    {"varlen: max_seqlen_k -1", FWD | BWD, vl_bound_neg, INV, "max_seqlen"},
    {"max_seqlen_q without cu_seqlens", FWD | BWD, bound_no_varlen, INV, "opts.max_seqlen_q&cu_seqlens"},
    {"varlen: only cu_seqlens_q set", FWD | BWD, vl_only_q, INV, "cu_seqlens_k"},
    {"varlen: only cu_seqlens_k set", FWD | BWD, vl_only_k, INV, "cu_seqlens_q"},
    {"varlen: n_seqs 0 with rows", FWD | BWD, vl_nseqs_0, INV, "cu_seqlens_q[n_seqs]"},
    {"varlen: n_seqs -1", FWD | BWD, vl_nseqs_neg, INV, "n_seqs"},
    {"varlen: batch 2", FWD | BWD, vl_batch_2, INV, "batch"},
    {"varlen: cu_seqlens_q not monotonic", FWD | BWD, vl_nonmono, INV, "cu_seqlens_q"},
    {"varlen: cu_seqlens_q[0] = 1", FWD | BWD, vl_start_1, INV, "cu_seqlens_q"},
    {"varlen: cu_seqlens_k ends before k.seqlen", FWD | BWD, vl_k_short, INV, "cu_seqlens_k"},
    {"varlen: cu_seqlens_q ends after q.seqlen", FWD | BWD, vl_q_long, INV, "cu_seqlens_q"},
    {"out is q", FWD, o_is_q, INV, "out:&overlap&q"},
    {"out inside k", FWD, o_in_k, INV, "out:&overlap&k"},
    {"out's tail overlaps v", FWD, o_tail_over_v, INV, "out:&overlap&v"},
    {"out.stride_seq 0 over seqlen 5", FWD, o_ss_0, INV, "out:&overlap"},
    {"out.stride_batch 0 over batch 2", FWD, o_sb_0, INV, "out:&overlap"},
    {"out.stride_head 4 < head_dim 8", FWD, o_sh_4, INV, "out:&overlap"},
    {"out rows share elements", FWD, o_rows_share, INV, "out:&overlap"},
    {"lse overlaps q", FWD, lse_in_q, INV, "lse&q"},
    {"lse overlaps out", FWD, lse_in_o, INV, "lse&out"},
    {"lse NULL in backward", BWD, lse_null, INV, "lse"},
    {"dout NULL", BWD, dout_null, INV, "dout"},
    {"dq NULL", BWD, dq_null, INV, "dq"},
    {"dk.data NULL", BWD, dk_data_null, INV, "dk:&data"},
    {"dv.data NULL", BWD, dv_data_null, INV, "dv:&data"},
    {"dout.dtype f16 with q f32", BWD, dout_f16, INV, "dout&dtype"},
    {"dq.dtype 7", BWD, dq_dtype_7, UNS, "dq&dtype"},
    {"dq.seqlen 4 vs 5", BWD, dq_seqlen_4, INV, "dq&seqlen"},
    {"dk.heads 4 vs 2", BWD, dk_heads_4, INV, "dk&heads"},
    {"dv.head_dim 4 vs 8", BWD, dv_hd_4, INV, "dv&head_dim"},
    {"dout.batch 1 vs 2", BWD, dout_batch_1, INV, "dout&batch"},
    {"dv.seqlen 5 vs 7", BWD, dv_seqlen_5, INV, "dv&seqlen"},
    {"dq.stride_seq 0", BWD, dq_ss_0, INV, "dq&overlap"},
    {"dk.stride_head 0 over 2 heads", BWD, dk_sh_0, INV, "dk&overlap"},
    {"dv.stride_seq -1", BWD, dv_ss_neg, INV, "dv&stride_seq"},
    {"dk is dq", BWD, dk_is_dq, INV, "dk&overlap&dq"},
    {"dq is dout", BWD, dq_is_dout, INV, "dq&overlap&dout"},
    {"dv is v", BWD, dv_is_v, INV, "dv&overlap&v"},
    {"dk inside out", BWD, dk_in_o, INV, "dk&overlap&out"},
    {"lse inside dq", BWD, dq_in_lse, INV, "dq&overlap&lse"},
    {"dq extent overflows", BWD, dq_extent_ovf, INV, "dq&overflow"},
    {"huge broadcast inputs, out's extent overflows", FWD, huge_broadcast_fwd, INV, "out:&overflow"},
    {"huge broadcast inputs, lse/grad extents overflow", BWD, huge_broadcast, INV, "overflow"},
};

static int contains_ci(const char *hay, const char *word, size_t n) {
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)word[i])) i++;
        if (i == n) return 1;
    }
    return 0;
}
/* Every '&'-separated word of needle appears in msg. */
static int has_words(const char *msg, const char *needle) {
    while (*needle) {
        const char *end = strchr(needle, '&');
        size_t n = end ? (size_t)(end - needle) : strlen(needle);
        if (n && !contains_ci(msg, needle, n)) return 0;
        needle += n + (end ? 1 : 0);
    }
    return 1;
}

static void fill_arena(void) {
    for (int i = 0; i < ARENA; i++) arena[i] = (float)t_randn();
    /* lse as the forward would leave it, so a valid backward sees sane values */
    for (int i = 0; i < NL; i++) arena[OFF_L + i] = 2.0f;
}

static void run_rows(fa_context *ctx) {
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        for (int e = FWD; e <= BWD; e <<= 1) {
            if (!(rows[r].entries & e)) continue;
            snprintf(t_case_label, sizeof t_case_label, "%s: %s", e == FWD ? "fa_forward" : "fa_backward", rows[r].name);
            args a;
            base_args(&a, ctx);
            rows[r].mut(&a);
            fill_arena();
            memcpy(arena_copy, arena, sizeof arena);
            fa_status st = e == FWD ? fa_forward(a.ctx, a.popts, a.pq, a.pk, a.pv, a.po, a.lse)
                                    : fa_backward(a.ctx, a.popts, a.pq, a.pk, a.pv, a.po, a.lse, a.pdout, a.pdq, a.pdk, a.pdv);
            const char *msg = fa_context_last_error(a.ctx);
            CHECK_MSG(st == rows[r].want, "got %s, want %s (message: \"%s\")", fa_status_string(st),
                      fa_status_string(rows[r].want), msg ? msg : "(null)");
            if (rows[r].want == FA_OK) {
                CHECK_MSG(msg && msg[0] == 0, "a successful call leaves the message empty, got \"%s\"", msg ? msg : "");
                continue;
            }
            CHECK_MSG(msg && msg[0], "no message for a failed call");
            CHECK_MSG(msg && has_words(msg, rows[r].needle), "message \"%s\" does not name \"%s\"", msg ? msg : "",
                      rows[r].needle);
            CHECK_MSG(memcmp(arena, arena_copy, sizeof arena) == 0, "a failed call wrote to memory");
        }
    }
    t_case_label[0] = 0;
}

/* ---- the small API surface ---- */
static void test_names(void) {
    snprintf(t_case_label, sizeof t_case_label, "names");
    static const char *st_names[] = {"FA_OK", "FA_ERR_INVALID_ARGUMENT", "FA_ERR_UNSUPPORTED", "FA_ERR_OUT_OF_MEMORY",
                                     "FA_ERR_BACKEND_UNAVAILABLE", "FA_ERR_DEVICE", "FA_ERR_INTERNAL"};
    for (int s = 0; s < 7; s++) CHECK(strcmp(fa_status_string((fa_status)s), st_names[s]) == 0);
    CHECK(strcmp(fa_status_string((fa_status)99), "unknown fa_status") == 0);
    CHECK(strcmp(fa_status_string((fa_status)-1), "unknown fa_status") == 0);
    /* pinned values */
    CHECK_EQ_INT(FA_OK, 0);
    CHECK_EQ_INT(FA_ERR_INVALID_ARGUMENT, 1);
    CHECK_EQ_INT(FA_ERR_UNSUPPORTED, 2);
    CHECK_EQ_INT(FA_ERR_OUT_OF_MEMORY, 3);
    CHECK_EQ_INT(FA_ERR_BACKEND_UNAVAILABLE, 4);
    CHECK_EQ_INT(FA_ERR_DEVICE, 5);
    CHECK_EQ_INT(FA_ERR_INTERNAL, 6);
    CHECK_EQ_INT(fa_dtype_size(FA_DTYPE_F32), 4);
    CHECK_EQ_INT(fa_dtype_size(FA_DTYPE_F16), 2);
    CHECK_EQ_INT(fa_dtype_size(FA_DTYPE_BF16), 2);
    CHECK_EQ_INT(fa_dtype_size((fa_dtype)7), 0);
    CHECK(strcmp(fa_dtype_name(FA_DTYPE_F32), "f32") == 0);
    CHECK(strcmp(fa_dtype_name(FA_DTYPE_F16), "f16") == 0);
    CHECK(strcmp(fa_dtype_name(FA_DTYPE_BF16), "bf16") == 0);
    CHECK(strcmp(fa_dtype_name((fa_dtype)7), "?") == 0);
    CHECK(strcmp(fa_backend_name(FA_BACKEND_CPU), "cpu") == 0);
    CHECK(strcmp(fa_backend_name(FA_BACKEND_CUDA), "cuda") == 0);
    CHECK(strcmp(fa_backend_name((fa_backend)5), "?") == 0);
    CHECK(strcmp(fa_algo_name(FA_ALGO_AUTO), "auto") == 0);
    CHECK(strcmp(fa_algo_name(FA_ALGO_STANDARD), "standard") == 0);
    CHECK(strcmp(fa_algo_name(FA_ALGO_FLASH1), "flash1") == 0);
    CHECK(strcmp(fa_algo_name(FA_ALGO_FLASH2), "flash2") == 0);
    CHECK(strcmp(fa_algo_name((fa_algo)9), "?") == 0);
    char ver[32];
    snprintf(ver, sizeof ver, "%d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH);
    CHECK_MSG(strncmp(fa_version_string(), ver, strlen(ver)) == 0, "version \"%s\" should start with %s",
              fa_version_string(), ver);
    CHECK_EQ_INT(FA_VERSION_NUMBER, FA_VERSION_MAJOR * 10000 + FA_VERSION_MINOR * 100 + FA_VERSION_PATCH);
    CHECK_EQ_INT(fa_backend_available(FA_BACKEND_CPU), 1);
    CHECK_EQ_INT(fa_backend_available((fa_backend)7), 0);
    printf("version: %s\n", fa_version_string());
}

static void test_helpers(void) {
    snprintf(t_case_label, sizeof t_case_label, "tensor helpers / opts");
    float x;
    fa_tensor t = fa_tensor_bshd(&x, FA_DTYPE_F16, 3, 5, 7, 11);
    CHECK(t.data == &x);
    CHECK_EQ_INT(t.dtype, FA_DTYPE_F16);
    CHECK_EQ_INT(t.batch, 3); CHECK_EQ_INT(t.seqlen, 5); CHECK_EQ_INT(t.heads, 7); CHECK_EQ_INT(t.head_dim, 11);
    CHECK_EQ_INT(t.stride_batch, 5 * 7 * 11); CHECK_EQ_INT(t.stride_seq, 7 * 11); CHECK_EQ_INT(t.stride_head, 11);
    t = fa_tensor_bhsd(&x, FA_DTYPE_BF16, 3, 7, 5, 11); /* b, h, s, d */
    CHECK_EQ_INT(t.dtype, FA_DTYPE_BF16);
    CHECK_EQ_INT(t.batch, 3); CHECK_EQ_INT(t.seqlen, 5); CHECK_EQ_INT(t.heads, 7); CHECK_EQ_INT(t.head_dim, 11);
    CHECK_EQ_INT(t.stride_batch, 7 * 5 * 11); CHECK_EQ_INT(t.stride_seq, 11); CHECK_EQ_INT(t.stride_head, 5 * 11);
    fa_attn_opts o = fa_attn_opts_default();
    CHECK(o.scale == 0.0f); CHECK_EQ_INT(o.causal, 0); CHECK_EQ_INT(o.window_left, -1);
    CHECK_EQ_INT(o.window_right, -1); CHECK(o.softcap == 0.0f); CHECK_EQ_INT(o.algo, FA_ALGO_AUTO);
    CHECK_EQ_INT(o.block_q, 0); CHECK_EQ_INT(o.block_k, 0); CHECK_EQ_INT(o.deterministic, 0);
    CHECK(o.cu_seqlens_q == NULL && o.cu_seqlens_k == NULL); CHECK_EQ_INT(o.n_seqs, 0);
}

static void test_contexts(void) {
    snprintf(t_case_label, sizeof t_case_label, "contexts");
    fa_context *c = (fa_context *)&c; /* garbage that must be overwritten with NULL on failure */
    CHECK_STATUS(fa_context_create(NULL, FA_BACKEND_CPU, 1), FA_ERR_INVALID_ARGUMENT);
    CHECK_MSG(has_words(fa_create_error(), "ctx"), "fa_create_error: \"%s\"", fa_create_error());
    CHECK_STATUS(fa_context_create(&c, (fa_backend)5, 1), FA_ERR_INVALID_ARGUMENT);
    CHECK(c == NULL);
    CHECK_MSG(has_words(fa_create_error(), "backend"), "fa_create_error: \"%s\"", fa_create_error());
    c = (fa_context *)&c;
    CHECK_STATUS(fa_context_create(&c, FA_BACKEND_CPU, -1), FA_ERR_INVALID_ARGUMENT);
    CHECK(c == NULL);
    CHECK_MSG(has_words(fa_create_error(), "threads"), "fa_create_error: \"%s\"", fa_create_error());

    /* CUDA: unavailable in a CPU-only build, and in a CUDA build on a machine without a GPU */
    int built = strstr(fa_version_string(), "cuda") != NULL;
    c = (fa_context *)&c;
    fa_status st = fa_context_create(&c, FA_BACKEND_CUDA, 0);
    printf("CUDA context: %s (built: %d, available: %d) %s\n", fa_status_string(st), built,
           fa_backend_available(FA_BACKEND_CUDA), st ? fa_create_error() : "");
    if (fa_backend_available(FA_BACKEND_CUDA)) {
        CHECK_STATUS(st, FA_OK);
        CHECK(c != NULL);
        CHECK_EQ_INT(fa_context_backend(c), FA_BACKEND_CUDA);
        fa_context_destroy(c);
    } else {
        if (built)
            CHECK_MSG(st == FA_ERR_BACKEND_UNAVAILABLE || st == FA_ERR_DEVICE, "got %s", fa_status_string(st));
        else
            CHECK_STATUS(st, FA_ERR_BACKEND_UNAVAILABLE);
        CHECK(c == NULL);
        CHECK_MSG(has_words(fa_create_error(), "cuda"), "fa_create_error should mention CUDA: \"%s\"",
                  fa_create_error());
    }
    /* a successful create clears the thread's create error */
    c = NULL;
    CHECK_STATUS(fa_context_create(&c, FA_BACKEND_CPU, 3), FA_OK);
    CHECK(c != NULL);
    CHECK_MSG(fa_create_error()[0] == 0, "fa_create_error after success: \"%s\"", fa_create_error());
    CHECK_EQ_INT(fa_context_backend(c), FA_BACKEND_CPU);
    CHECK_MSG(fa_context_threads(c) >= 1, "threads %d", fa_context_threads(c));
    CHECK_STATUS(fa_context_set_stream(c, NULL), FA_OK);
    CHECK_STATUS(fa_context_set_stream(c, (void *)&c), FA_ERR_INVALID_ARGUMENT);
    CHECK_MSG(has_words(fa_context_last_error(c), "stream"), "\"%s\"", fa_context_last_error(c));
    fa_stats s;
    CHECK_STATUS(fa_last_stats(c, &s), FA_ERR_INVALID_ARGUMENT); /* no call yet */
    fa_context_destroy(c);

    c = NULL;
    CHECK_STATUS(fa_context_create(&c, FA_BACKEND_CPU, 0), FA_OK); /* 0 = all cores */
    CHECK_MSG(c && fa_context_threads(c) >= 1, "threads %d", c ? fa_context_threads(c) : -1);
    fa_context_destroy(c);

    CHECK_STATUS(fa_context_set_stream(NULL, NULL), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_last_stats(NULL, &s), FA_ERR_INVALID_ARGUMENT);
    CHECK_EQ_INT((int)fa_context_backend(NULL), -1);
    CHECK_EQ_INT(fa_context_threads(NULL), -1);
    CHECK(fa_context_last_error(NULL) != NULL);
    fa_context_destroy(NULL); /* no-op */
}

/* Valid-but-unusual arguments that must be accepted: NULL lse, broadcast (stride 0) inputs, a stride 0 output
 * over a dimension of size 1. And a failed call leaves the last stats alone. */
static void test_accepted(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "accepted arguments");
    args a;
    base_args(&a, ctx);
    fill_arena();
    a.opts.algo = FA_ALGO_STANDARD;
    CHECK_STATUS(fa_forward(ctx, &a.opts, &a.q, &a.k, &a.v, &a.o, NULL), FA_OK);
    a.k.stride_batch = 0, a.v.stride_batch = 0, a.q.stride_head = 0;
    CHECK_STATUS(fa_forward(ctx, &a.opts, &a.q, &a.k, &a.v, &a.o, a.lse), FA_OK);
    base_args(&a, ctx);
    a.q.batch = a.k.batch = a.v.batch = a.o.batch = 1;
    a.o.stride_batch = 0;
    a.opts.algo = FA_ALGO_STANDARD;
    CHECK_STATUS(fa_forward(ctx, &a.opts, &a.q, &a.k, &a.v, &a.o, a.lse), FA_OK);
    fa_stats s;
    CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
    CHECK_EQ_INT(s.algo, FA_ALGO_STANDARD);
    CHECK_STATUS(fa_last_stats(ctx, NULL), FA_ERR_INVALID_ARGUMENT);
    a.opts.algo = FA_ALGO_FLASH1;
    a.opts.window_left = -3;
    CHECK_STATUS(fa_forward(ctx, &a.opts, &a.q, &a.k, &a.v, &a.o, a.lse), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
    CHECK_MSG(s.algo == FA_ALGO_STANDARD && !s.is_backward, "stats changed by a failed call: algo %d", (int)s.algo);
    t_case_label[0] = 0;
}

/* fa_attn_opts grows by appending: a caller built against the first header (a struct that ends at n_seqs) gets
 * the defaults for later fields; size 0 is rejected; a larger struct is accepted while its unknown bytes are 0. */
static void test_opts_abi(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "fa_attn_opts struct_size");
    args a;
    base_args(&a, ctx);
    fill_arena();
    const size_t v1 = offsetof(fa_attn_opts, n_seqs) + sizeof(int64_t);
    CHECK_STATUS(fa_attn_opts_init(NULL, sizeof(fa_attn_opts)), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_attn_opts_init(&a.opts, 1), FA_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(fa_attn_opts_init(&a.opts, sizeof a.opts), FA_OK);
    CHECK_EQ_INT(a.opts.struct_size, sizeof a.opts);
    CHECK_EQ_INT(a.opts.window_left, -1);
    CHECK_EQ_INT(a.opts.algo, FA_ALGO_AUTO);
    a.opts.algo = FA_ALGO_FLASH1;
    a.opts.struct_size = v1; /* an old caller: only the bytes it knows are read */
    CHECK_STATUS(fa_forward(ctx, &a.opts, &a.q, &a.k, &a.v, &a.o, a.lse), FA_OK);
    fa_stats s;
    CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
    CHECK_EQ_INT(s.algo, FA_ALGO_FLASH1);
    a.opts.struct_size = 0; /* not initialised through fa_attn_opts_default */
    memcpy(arena_copy, arena, sizeof arena);
    CHECK_STATUS(fa_forward(ctx, &a.opts, &a.q, &a.k, &a.v, &a.o, a.lse), FA_ERR_INVALID_ARGUMENT);
    CHECK_MSG(has_words(fa_context_last_error(ctx), "opts.struct_size"), "\"%s\"", fa_context_last_error(ctx));
    CHECK_MSG(memcmp(arena_copy, arena, sizeof arena) == 0, "a rejected opts wrote to a buffer");
    struct { fa_attn_opts o; unsigned char newer[16]; } big;
    memset(&big, 0, sizeof big);
    big.o = fa_attn_opts_default();
    big.o.struct_size = sizeof big; /* a caller built against a newer header that leaves the new fields alone */
    CHECK_STATUS(fa_forward(ctx, &big.o, &a.q, &a.k, &a.v, &a.o, a.lse), FA_OK);
    big.newer[3] = 1; /* ... and one that sets a field this library does not know */
    CHECK_STATUS(fa_forward(ctx, &big.o, &a.q, &a.k, &a.v, &a.o, a.lse), FA_ERR_UNSUPPORTED);
    CHECK_MSG(has_words(fa_context_last_error(ctx), "opts"), "\"%s\"", fa_context_last_error(ctx));
    t_case_label[0] = 0;
}

/* fa_kv_opts follows the fa_attn_opts rule through the same reader: any prefix from struct_size on is read (the rest
 * keeps the defaults), size 0 is rejected, a larger struct is accepted while its unknown bytes are 0. */
static void test_kv_opts_abi(fa_context *ctx) {
    snprintf(t_case_label, sizeof t_case_label, "fa_kv_opts struct_size");
    args a;
    base_args(&a, ctx);
    fill_arena();
    const int32_t seqlens[B] = {2, 7};
    fa_kvcache cache;
    memset(&cache, 0, sizeof cache);
    cache.k = a.k, cache.v = a.v, cache.seqlens = seqlens;
    fa_kv_opts kv = fa_kv_opts_default();
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, &kv, &a.q, &cache, NULL, NULL, &a.o, a.lse), FA_OK);
    fa_stats s; /* every query row sees all of its sequence's keys: 4·D per pair per query head */
    CHECK_STATUS(fa_last_stats(ctx, &s), FA_OK);
    CHECK_MSG(s.algo == FA_ALGO_FLASH2 && s.flops == 4.0 * D * HQ * SQ * (2 + 7), "algo %d, flops %.0f",
              (int)s.algo, s.flops);
    kv.num_splits = 1;
    kv.struct_size = sizeof kv.struct_size; /* an old caller that knows no field: num_splits is not read */
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, &kv, &a.q, &cache, NULL, NULL, &a.o, a.lse), FA_OK);
    kv.struct_size = 0;
    memcpy(arena_copy, arena, sizeof arena);
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, &kv, &a.q, &cache, NULL, NULL, &a.o, a.lse), FA_ERR_INVALID_ARGUMENT);
    CHECK_MSG(has_words(fa_context_last_error(ctx), "kv_opts.struct_size&fa_kv_opts_default"), "\"%s\"",
              fa_context_last_error(ctx));
    CHECK_MSG(memcmp(arena_copy, arena, sizeof arena) == 0, "a rejected kv_opts wrote to a buffer");
    struct { fa_kv_opts o; unsigned char newer[16]; } big;
    memset(&big, 0, sizeof big);
    big.o = fa_kv_opts_default();
    big.o.struct_size = sizeof big;
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, &big.o, &a.q, &cache, NULL, NULL, &a.o, a.lse), FA_OK);
    big.newer[5] = 1;
    CHECK_STATUS(fa_forward_kvcache(ctx, NULL, &big.o, &a.q, &cache, NULL, NULL, &a.o, a.lse), FA_ERR_UNSUPPORTED);
    CHECK_MSG(has_words(fa_context_last_error(ctx), "kv_opts:&fa_kv_opts&flashattn"), "\"%s\"",
              fa_context_last_error(ctx));
    t_case_label[0] = 0;
}

/* Contexts are independent: an error on one leaves the other's message and stats alone, and interleaved calls on
 * two contexts give the same results as calls on one. */
static void test_two_contexts(void) {
    snprintf(t_case_label, sizeof t_case_label, "two contexts");
    fa_context *a = t_cpu_ctx(), *b = NULL;
    CHECK_STATUS(fa_context_create(&b, FA_BACKEND_CPU, 1), FA_OK);
    args x;
    base_args(&x, a);
    fill_arena();
    x.opts.algo = FA_ALGO_FLASH1;
    CHECK_STATUS(fa_forward(a, &x.opts, &x.q, &x.k, &x.v, &x.o, x.lse), FA_OK);
    float o1[NQ];
    memcpy(o1, x.o.data, sizeof o1);
    fa_attn_opts bad = x.opts;
    bad.softcap = -2;
    CHECK_STATUS(fa_forward(b, &bad, &x.q, &x.k, &x.v, &x.o, x.lse), FA_ERR_INVALID_ARGUMENT);
    CHECK_MSG(fa_context_last_error(a)[0] == 0, "ctx a's message changed by a failure on b: \"%s\"", fa_context_last_error(a));
    CHECK_MSG(has_words(fa_context_last_error(b), "softcap"), "\"%s\"", fa_context_last_error(b));
    fa_stats sa, sb;
    CHECK_STATUS(fa_last_stats(a, &sa), FA_OK);
    CHECK_STATUS(fa_last_stats(b, &sb), FA_ERR_INVALID_ARGUMENT); /* b has had no successful call */
    CHECK_EQ_INT(sa.algo, FA_ALGO_FLASH1);
    x.opts.algo = FA_ALGO_FLASH2;
    CHECK_STATUS(fa_forward(b, &x.opts, &x.q, &x.k, &x.v, &x.o, x.lse), FA_OK);
    x.opts.algo = FA_ALGO_FLASH1;
    CHECK_STATUS(fa_forward(a, &x.opts, &x.q, &x.k, &x.v, &x.o, x.lse), FA_OK);
    CHECK_MSG(memcmp(o1, x.o.data, sizeof o1) == 0, "ctx a's FLASH1 result changed after a call on ctx b");
    CHECK_STATUS(fa_last_stats(b, &sb), FA_OK);
    CHECK_EQ_INT(sb.algo, FA_ALGO_FLASH2);
    CHECK_EQ_INT(sb.threads, 1);
    fa_context_destroy(a);
    fa_context_destroy(b);
    t_case_label[0] = 0;
}

int main(void) {
    t_init("test_api_errors");
    test_two_contexts();
    test_names();
    test_helpers();
    test_contexts();
    fa_context *ctx = t_cpu_ctx();
    test_accepted(ctx);
    test_opts_abi(ctx);
    test_kv_opts_abi(ctx);
    run_rows(ctx);
    printf("%zu rows in the bad-input table\n", sizeof rows / sizeof rows[0]);
    fa_context_destroy(ctx);
    return t_finish();
}
