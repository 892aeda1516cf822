/* int64 edges of the addressing that the validator's extent check does not bound: a packed (varlen) batch whose
 * trailing sequence is empty, over seqlen-1 views with a huge stride_seq. The empty sequence's first row is one
 * past the last, cu[n]·stride_seq overflows int64 (and its byte offset the address space); it must never be
 * formed (UBSan reports it in the sanitizer build) and the call gives the one row's exact answer: O = V, LSE = s,
 * dQ = dK = 0, dV = dO. Every CPU algorithm, forward and backward, each dtype. */
#include "testlib.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { D = 8 };

static fa_context *ctx;

/* One row of head_dim D as a seqlen-1 view whose rows are 2^62 elements apart. */
static fa_tensor row(void *buf, fa_dtype dt) {
    fa_tensor t = fa_tensor_bshd(buf, dt, 1, 1, 1, D);
    t.stride_seq = (int64_t)1 << 62;
    return t;
}

static void one(fa_algo a, fa_dtype dt) {
    snprintf(t_case_label, sizeof t_case_label, "empty trailing sequence, stride_seq 2^62, %s %s", fa_algo_name(a),
             fa_dtype_name(dt));
    t_buf q = t_buf_new(dt, 1, 1, 1, D, T_BSHD), k = t_buf_new(dt, 1, 1, 1, D, T_BSHD), v = t_buf_new(dt, 1, 1, 1, D, T_BSHD);
    t_buf o = t_buf_new(dt, 1, 1, 1, D, T_BSHD), dout = t_buf_new(dt, 1, 1, 1, D, T_BSHD);
    t_buf dq = t_buf_new(dt, 1, 1, 1, D, T_BSHD), dk = t_buf_new(dt, 1, 1, 1, D, T_BSHD), dv = t_buf_new(dt, 1, 1, 1, D, T_BSHD);
    t_buf_randn(&q, 1), t_buf_randn(&k, 1), t_buf_randn(&v, 1), t_buf_randn(&dout, 1);
    static const int32_t cu[3] = {0, 1, 1};
    fa_attn_opts opts = fa_attn_opts_default();
    opts.algo = a, opts.cu_seqlens_q = cu, opts.cu_seqlens_k = cu, opts.n_seqs = 2;
    fa_tensor tq = row(q.t.data, dt), tk = row(k.t.data, dt), tv = row(v.t.data, dt), to = row(o.t.data, dt);
    float lse = NAN;
    CHECK_STATUS(fa_forward(ctx, &opts, &tq, &tk, &tv, &to, &lse), FA_OK);
    double s = 0;
    for (int x = 0; x < D; x++) s += t_get(&q.t, 0, 0, 0, x) * t_get(&k.t, 0, 0, 0, x);
    s /= sqrt((double)D);
    CHECK_MSG(fabs(lse - s) <= 1e-2 * (1 + fabs(s)), "LSE %g, expected %g", lse, s);
    double err = 0;
    for (int x = 0; x < D; x++) err = fmax(err, fabs(t_get(&o.t, 0, 0, 0, x) - t_get(&v.t, 0, 0, 0, x)));
    CHECK_MSG(err <= 1e-2, "max |O - V| = %g", err);
    fa_tensor tdo = row(dout.t.data, dt), tdq = row(dq.t.data, dt), tdk = row(dk.t.data, dt), tdv = row(dv.t.data, dt);
    CHECK_STATUS(fa_backward(ctx, &opts, &tq, &tk, &tv, &to, &lse, &tdo, &tdq, &tdk, &tdv), FA_OK);
    double eq = 0, ek = 0, ev = 0;
    for (int x = 0; x < D; x++) {
        eq = fmax(eq, fabs(t_get(&dq.t, 0, 0, 0, x)));
        ek = fmax(ek, fabs(t_get(&dk.t, 0, 0, 0, x)));
        ev = fmax(ev, fabs(t_get(&dv.t, 0, 0, 0, x) - t_get(&dout.t, 0, 0, 0, x)));
    }
    CHECK_MSG(eq <= 1e-2 && ek <= 1e-2 && ev <= 1e-2, "max |dQ| %g, |dK| %g, |dV - dO| %g", eq, ek, ev);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&o);
    t_buf_free(&dout), t_buf_free(&dq), t_buf_free(&dk), t_buf_free(&dv);
}

int main(void) {
    t_init("test_overflow");
    ctx = t_cpu_ctx();
    static const fa_algo algos[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};
    static const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int a = 0; a < 3; a++)
        for (int d = 0; d < 3; d++) one(algos[a], dtypes[d]);
    fa_context_destroy(ctx);
    return t_finish();
}
