/* fa_quantize_fp8 (flashattn.h): validate everything, then the backend's quantiser writes y and the descales. The
 * rounding rules live in core/fp8.h, shared by the CPU and CUDA quantisers. docs/numerics.md ("FP8"). */
#include "core/entry.h"

#include <string.h>

fa_status fa_quant_opts_init(fa_quant_opts *opts, size_t struct_size) {
    if (!opts || struct_size < sizeof(size_t)) return FA_ERR_INVALID_ARGUMENT;
    fa_quant_opts d;
    memset(&d, 0, sizeof d);
    d.heads_per_scale = 1;
    memcpy(opts, &d, struct_size < sizeof d ? struct_size : sizeof d);
    opts->struct_size = struct_size;
    return FA_OK;
}

/* The caller's options over the defaults (as fa_entry_attn_opts: unknown set bytes are FA_ERR_UNSUPPORTED). */
static fa_status read_opts(fa_context *ctx, const fa_quant_opts *in, fa_quant_opts *o) {
    fa_quant_opts_init(o, sizeof *o);
    if (!in) return FA_OK;
    const size_t n = in->struct_size;
    if (n < sizeof(size_t))
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.struct_size: %zu: initialise opts with "
                       "fa_quant_opts_default()", n);
    for (size_t i = sizeof *o; i < n; i++)
        if (((const unsigned char *)in)[i])
            return fa_fail(ctx, FA_ERR_UNSUPPORTED, "opts: fields beyond this library's fa_quant_opts (%zu of %zu "
                           "bytes) are set", sizeof *o, n);
    memcpy(o, in, n < sizeof *o ? n : sizeof *o);
    o->struct_size = sizeof *o;
    return FA_OK;
}

fa_status fa_quantize_fp8(fa_context *ctx, const fa_quant_opts *opts_in, const fa_tensor *x, const fa_tensor *y,
                          float *descale) {
    if (!ctx) return FA_ERR_INVALID_ARGUMENT;
    ctx->err[0] = 0;
    fa_quant_opts o;
    fa_status st = read_opts(ctx, opts_in, &o);
    if (st != FA_OK) return st;
    fa_span sx, sy, sd;
    if ((st = fa_entry_tensor(ctx, "x", x, 0, &sx)) || (st = fa_entry_tensor(ctx, "y", y, 1, &sy))) return st;
    if (x->dtype == FA_DTYPE_F8_E4M3)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "x: dtype f8_e4m3: the input must be f32, f16 or bf16");
    if (y->dtype != FA_DTYPE_F8_E4M3)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "y: dtype %s: the output must be f8_e4m3",
                       fa_dtype_name(y->dtype));
    const int64_t want[4] = {x->batch, x->seqlen, x->heads, x->head_dim};
    if ((st = fa_entry_shape(ctx, "y", y, FA_DTYPE_F8_E4M3, want, "x"))) return st;
    if (o.heads_per_scale < 1 || x->heads % o.heads_per_scale)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.heads_per_scale: %lld must be >= 1 and divide x.heads = %lld",
                       (long long)o.heads_per_scale, (long long)x->heads);
    if (o.block_rows < 0 || o.block_rows > INT32_MAX)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.block_rows: %lld must be in 0..2^31-1",
                       (long long)o.block_rows);
    if (o.per_tensor != 0 && o.per_tensor != 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.per_tensor: %d must be 0 or 1", o.per_tensor);
    if (o.per_tensor && o.block_rows)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.block_rows: %lld with per_tensor (one scale for the whole "
                       "tensor has no blocks)", (long long)o.block_rows);
    if (o.hadamard != 0 && o.hadamard != 1)
        return fa_fail(ctx, FA_ERR_INVALID_ARGUMENT, "opts.hadamard: %d must be 0 or 1", o.hadamard);
    if (o.hadamard && (x->head_dim & (x->head_dim - 1)))
        return fa_fail(ctx, FA_ERR_UNSUPPORTED, "x: head_dim %lld: the Walsh-Hadamard rotation (opts.hadamard) needs "
                       "a power of two", (long long)x->head_dim);
    if ((st = fa_entry_head_dim(ctx, "x", x->head_dim))) return st;
    fa_quant_problem q;
    memset(&q, 0, sizeof q);
    q.x = *x, q.y = *y, q.descale = descale;
    q.group = o.heads_per_scale;
    q.block_rows = o.block_rows ? o.block_rows : (x->seqlen ? x->seqlen : 1);
    q.nblk = o.block_rows ? (x->seqlen + o.block_rows - 1) / o.block_rows : 1;
    q.per_tensor = o.per_tensor, q.hadamard = o.hadamard, q.seed = o.seed;
    if ((st = fa_entry_f32(ctx, "descale", descale, x->batch, x->heads / q.group, q.nblk, &sd))) return st;
    static const char *const names[2] = {"x", "descale"};
    const fa_span in[2] = {sx, sd};
    if ((st = fa_entry_disjoint(ctx, "y", sy, names, in, 2)) ||
        (st = fa_entry_disjoint(ctx, "descale", sd, names, in, 1)))
        return st;
    if (x->batch == 0 || q.nblk == 0) return FA_OK; /* no block: nothing to write (no rows: descales of 1) */
    return ctx->backend == FA_BACKEND_CUDA ? fa_cuda_quantize(ctx, &q) : fa_cpu_quantize(ctx, &q);
}
