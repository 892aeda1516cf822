/* The entry layer's checks of FP8 inputs (entry.h): the descale arrays of fa_attn_opts. The rest of the FP8 rules —
 * q, k, v in E4M3, out in f32/f16/bf16, forward only — sit with the dtype checks in api.c. */
#include "core/entry.h"

static const char *const descale_names[3] = {"opts.q_descale", "opts.k_descale", "opts.v_descale"};

fa_status fa_entry_descales(fa_context *ctx, const fa_attn_opts *o, fa_dtype dtype, int64_t batch, int64_t heads_k) {
    const float *ds[3] = {o->q_descale, o->k_descale, o->v_descale};
    for (int i = 0; i < 3; i++) {
        if (!ds[i]) continue; /* NULL: the factor 1 */
        if (dtype != FA_DTYPE_F8_E4M3)
            return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s: set, but q, k, v are %s (descales belong to "
                           "f8_e4m3 inputs)", descale_names[i], fa_dtype_name(dtype));
        fa_span sp;
        fa_status st = fa_entry_f32(ctx, descale_names[i], ds[i], 1, batch, heads_k, &sp);
        if (st != FA_OK) return st;
        if (ctx->backend != FA_BACKEND_CPU) continue; /* device memory: the host cannot read it */
        for (int64_t n = 0; n < batch * heads_k; n++)
            if (!isfinite(ds[i][n]))
                return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "%s[%lld][%lld] = %g is not finite", descale_names[i],
                               (long long)(n / heads_k), (long long)(n % heads_k), (double)ds[i][n]);
    }
    return FA_OK;
}

fa_status fa_entry_descales_apart(fa_context *ctx, const fa_problem *p, fa_span out, const fa_span *lse) {
    const float *ds[3] = {p->q_descale, p->k_descale, p->v_descale};
    fa_span sp[3] = {{0, 0}, {0, 0}, {0, 0}};
    for (int i = 0; i < 3; i++) {
        if (!ds[i]) continue;
        fa_status st = fa_entry_f32(ctx, descale_names[i], ds[i], 1, p->batch, p->hk, &sp[i]);
        if (st != FA_OK) return st;
    }
    fa_status st = fa_entry_disjoint(ctx, "out", out, descale_names, sp, 3);
    if (st == FA_OK && lse) st = fa_entry_disjoint(ctx, "lse", *lse, descale_names, sp, 3);
    return st;
}

fa_status fa_entry_no_fp8(fa_context *ctx, const char *name, const fa_tensor *t, const char *entry) {
    if (t->dtype != FA_DTYPE_F8_E4M3) return FA_OK;
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "%s: dtype f8_e4m3: %s takes no FP8 tensors (FP8 is an input type of "
                   "fa_forward only)", name, entry);
}
