/* FP8 accuracy, FlashAttention-3's test (its paper, §4.3): Q, K, V ~ N(0, 1) with 0.1 % of the entries drawn from
 * N(0, 10²) instead, and the RMSE of O against the float64 oracle for
 *   (a) FP8 with per-tensor scales    fa_quantize_fp8(per_tensor) of q, k, v, then fa_forward on FP8 (bf16 out);
 *   (a') FP8 with per-head scales     the same with the default (batch, head) scales;
 *   (b) FP8 with per-block scales     fa_quantize_fp8(block_rows) of q, k, v; fa_forward takes one descale per
 *                                     (batch, K/V head), so the blocks' descales are folded in here, exactly as the
 *                                     CPU's FP8 path folds its descales (E4M3 value × descale in fp32), and the f32
 *                                     forward runs on that;
 *   (c) (b) with the Hadamard rotation of q and k (fa_quant_opts.hadamard, one seed): QKᵀ is unchanged, outliers are
 *       spread over each row before quantising;
 *   (c') per-tensor scales with the rotation, through fa_forward's FP8 path alone;
 *   (d) FP8 standard attention with per-tensor scales: S = q8·k8ᵀ, P = softmax(S) quantised to E4M3 with a per-tensor
 *       scale, O = P8·v8 (the naive FP8 attention FA3 compares with; computed here in double apart from the
 *       quantisations);
 *   (e) bf16: q, k, v rounded to bf16, fa_forward FLASH2 on bf16.
 * Every O is rounded to bf16 as FA3's outputs are. The CPU's FP8 path computes P in fp32: unlike a Hopper kernel it does
 * not quantise P, which is (a)'s difference from (d). With --device cuda, (a), (a') and (c') run on the CUDA backend
 * (the FLASH3 FP8 forward, which rounds P to E4M3; head_dim 128) and the rest on the CPU. docs/numerics.md
 * ("FP8 accuracy") has the table.
 * Usage: fp8_accuracy [--seqlen N] [--heads H] [--head-dim D] [--block R] [--seed S] [--device cpu|cuda] */
#include "testlib.h"
#ifdef FA_BENCH_CUDA
#include "cuda_check.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape { int64_t s, h, d; } shape;

static double rmse(const fa_tensor *o, const double *ref) {
    double sum = 0;
    const int64_t n = o->seqlen * o->heads * o->head_dim;
    for (int64_t i = 0; i < n; i++) {
        const double e = t_load(o->data, o->dtype, i) - ref[i];
        sum += e * e;
    }
    return sqrt(sum / (double)n);
}

/* x quantised with opts into y and descales ds (sized for the largest layout: s·h floats). */
static void quant(fa_context *ctx, const fa_quant_opts *qo, const fa_tensor *x, t_buf *y, float *ds) {
    if (fa_quantize_fp8(ctx, qo, x, &y->t, ds) != FA_OK) {
        fprintf(stderr, "fa_quantize_fp8: %s\n", fa_context_last_error(ctx));
        exit(1);
    }
}

/* y's E4M3 values times their block's descale, in fp32, into f (f32, same shape). */
static void dequant(const t_buf *y, const float *ds, int64_t block, t_buf *f) {
    const fa_tensor *t = &y->t;
    const int64_t nblk = block ? (t->seqlen + block - 1) / block : 1;
    for (int64_t s = 0; s < t->seqlen; s++)
        for (int64_t h = 0; h < t->heads; h++)
            for (int64_t i = 0; i < t->head_dim; i++) {
                const float v = (float)t_get(t, 0, s, h, i) * ds[h * nblk + (block ? s / block : 0)];
                t_set(&f->t, 0, s, h, i, v);
            }
}

static void forward(fa_context *ctx, const fa_attn_opts *o, const t_buf *q, const t_buf *k, const t_buf *v, t_buf *out) {
    if (fa_forward(ctx, o, &q->t, &k->t, &v->t, &out->t, NULL) != FA_OK) {
        fprintf(stderr, "fa_forward: %s\n", fa_context_last_error(ctx));
        exit(1);
    }
}

#ifdef FA_BENCH_CUDA
/* The FP8 forward on a CUDA context: q, k, v, the descales (per tensor or per (batch, head): s·h floats at most)
 * and out through device copies. */
static void forward_cuda(fa_context *gpu, const fa_attn_opts *o, const t_buf *q, const t_buf *k, const t_buf *v,
                         t_buf *out, int64_t nds) {
    const t_buf *in[3] = {q, k, v};
    const float *hds[3] = {o->q_descale, o->k_descale, o->v_descale};
    void *d[4];
    float *dds[3];
    fa_tensor t[4];
    for (int i = 0; i < 3; i++) {
        CK(cudaMalloc(&d[i], in[i]->mem_bytes));
        CK(cudaMemcpy(d[i], in[i]->mem, in[i]->mem_bytes, cudaMemcpyHostToDevice));
        t[i] = in[i]->t, t[i].data = (char *)d[i] + in[i]->offset;
        CK(cudaMalloc((void **)&dds[i], sizeof(float) * (size_t)nds));
        CK(cudaMemcpy(dds[i], hds[i], sizeof(float) * (size_t)nds, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&d[3], out->mem_bytes));
    t[3] = out->t, t[3].data = (char *)d[3] + out->offset;
    fa_attn_opts od = *o;
    od.q_descale = dds[0], od.k_descale = dds[1], od.v_descale = dds[2];
    if (fa_forward(gpu, &od, &t[0], &t[1], &t[2], &t[3], NULL) != FA_OK) {
        fprintf(stderr, "fa_forward (cuda): %s\n", fa_context_last_error(gpu));
        exit(1);
    }
    CK(cudaMemcpy(out->mem, d[3], out->mem_bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4; i++) CK(cudaFree(d[i]));
    for (int i = 0; i < 3; i++) CK(cudaFree(dds[i]));
}
#endif

/* f32 forward into a bf16-rounded copy. */
static double rmse_f32(fa_context *ctx, shape sh, const t_buf *q, const t_buf *k, const t_buf *v, const double *ref) {
    t_buf o32 = t_buf_new(FA_DTYPE_F32, 1, sh.s, sh.h, sh.d, T_BSHD), ob = t_buf_new(FA_DTYPE_BF16, 1, sh.s, sh.h, sh.d, T_BSHD);
    fa_attn_opts o = fa_attn_opts_default();
    forward(ctx, &o, q, k, v, &o32);
    for (int64_t i = 0; i < sh.s * sh.h * sh.d; i++) t_store(ob.t.data, FA_DTYPE_BF16, i, ((float *)o32.t.data)[i]);
    const double r = rmse(&ob.t, ref);
    t_buf_free(&o32), t_buf_free(&ob);
    return r;
}

/* (d): naive FP8 attention from per-tensor FP8 q8, k8, v8 (descales dq, dk, dv): P per tensor to E4M3. */
static double rmse_naive(shape sh, const t_buf *q8, const t_buf *k8, const t_buf *v8, float dq, float dk, float dv,
                         const double *ref) {
    const int64_t S = sh.s, H = sh.h, D = sh.d;
    double *P = malloc(sizeof(double) * (size_t)(H * S * S)), pmax = 0;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < S; i++) {
            double *p = P + (h * S + i) * S, m = -INFINITY, l = 0;
            for (int64_t j = 0; j < S; j++) {
                double s = 0;
                for (int64_t x = 0; x < D; x++)
                    s += t_get(&q8->t, 0, i, h, x) * dq * t_get(&k8->t, 0, j, h, x) * dk;
                p[j] = s / sqrt((double)D);
                m = p[j] > m ? p[j] : m;
            }
            for (int64_t j = 0; j < S; j++) l += (p[j] = exp(p[j] - m));
            for (int64_t j = 0; j < S; j++) p[j] /= l, pmax = p[j] > pmax ? p[j] : pmax;
        }
    const double dp = pmax / 448;
    t_buf o = t_buf_new(FA_DTYPE_BF16, 1, S, H, D, T_BSHD);
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < S; i++)
            for (int64_t x = 0; x < D; x++) {
                double acc = 0;
                for (int64_t j = 0; j < S; j++)
                    acc += t_decode_e4m3(t_encode_e4m3(P[(h * S + i) * S + j] / dp)) * dp * t_get(&v8->t, 0, j, h, x) * dv;
                t_set(&o.t, 0, i, h, x, acc);
            }
    const double r = rmse(&o.t, ref);
    free(P), t_buf_free(&o);
    return r;
}

int main(int argc, char **argv) {
    shape sh = {1024, 4, 128};
    int64_t block = 128;
    uint64_t seed = 1;
    int cuda = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seqlen")) sh.s = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) sh.h = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-dim")) sh.d = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--block")) block = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--device")) cuda = !strcmp(argv[i + 1], "cuda");
        else return fprintf(stderr, "unknown option %s\n", argv[i]), 2;
    }
    fa_context *ctx, *gpu = NULL;
    if (fa_context_create(&ctx, FA_BACKEND_CPU, 0) != FA_OK) return fprintf(stderr, "%s\n", fa_create_error()), 1;
#ifdef FA_BENCH_CUDA
    if (cuda && fa_context_create(&gpu, FA_BACKEND_CUDA, 0) != FA_OK)
        return fprintf(stderr, "%s\n", fa_create_error()), 1;
#else
    if (cuda) return fprintf(stderr, "--device cuda: this build has no CUDA backend\n"), 2;
#endif
    t_rng r;
    t_rng_seed(&r, seed);
    const int64_t n = sh.s * sh.h * sh.d;
    t_buf x[3], x8[3], xf[3], xb[3];
    for (int t = 0; t < 3; t++) {
        x[t] = t_buf_new(FA_DTYPE_F32, 1, sh.s, sh.h, sh.d, T_BSHD);
        x8[t] = t_buf_new(FA_DTYPE_F8_E4M3, 1, sh.s, sh.h, sh.d, T_BSHD);
        xf[t] = t_buf_new(FA_DTYPE_F32, 1, sh.s, sh.h, sh.d, T_BSHD);
        xb[t] = t_buf_new(FA_DTYPE_BF16, 1, sh.s, sh.h, sh.d, T_BSHD);
        for (int64_t i = 0; i < n; i++) {
            const double z = t_rng_uniform(&r) < 0.001 ? 10 * t_rng_randn(&r) : t_rng_randn(&r);
            ((float *)x[t].t.data)[i] = (float)z;
            t_store(xb[t].t.data, FA_DTYPE_BF16, i, (float)z);
        }
    }
    double *ref = malloc(sizeof(double) * (size_t)n);
    fa_attn_opts o = fa_attn_opts_default();
    t_oracle_forward(&o, &x[0].t, &x[1].t, &x[2].t, ref, NULL);
    float *ds[3];
    for (int t = 0; t < 3; t++) ds[t] = malloc(sizeof(float) * (size_t)(sh.s * sh.h));
    t_buf ob = t_buf_new(FA_DTYPE_BF16, 1, sh.s, sh.h, sh.d, T_BSHD);
    double res[7];
    /* (a), (a'), (c'): through fa_forward's FP8 path */
    for (int mode = 0; mode < 3; mode++) {
        fa_quant_opts qo = fa_quant_opts_default();
        qo.per_tensor = mode != 1;
        for (int t = 0; t < 3; t++) {
            qo.hadamard = mode == 2 && t < 2, qo.seed = 42;
            quant(ctx, &qo, &x[t].t, &x8[t], ds[t]);
        }
        o.q_descale = ds[0], o.k_descale = ds[1], o.v_descale = ds[2];
#ifdef FA_BENCH_CUDA
        if (gpu)
            forward_cuda(gpu, &o, &x8[0], &x8[1], &x8[2], &ob, sh.s * sh.h);
        else
#endif
            forward(ctx, &o, &x8[0], &x8[1], &x8[2], &ob);
        res[mode] = rmse(&ob.t, ref);
        if (mode == 0) res[5] = rmse_naive(sh, &x8[0], &x8[1], &x8[2], ds[0][0], ds[1][0], ds[2][0], ref);
    }
    /* (b), (c): block scales folded in here */
    for (int mode = 0; mode < 2; mode++) {
        fa_quant_opts qo = fa_quant_opts_default();
        qo.block_rows = block;
        for (int t = 0; t < 3; t++) {
            qo.hadamard = mode == 1 && t < 2, qo.seed = 42;
            quant(ctx, &qo, &x[t].t, &x8[t], ds[t]);
            dequant(&x8[t], ds[t], block, &xf[t]);
        }
        res[3 + mode] = rmse_f32(ctx, sh, &xf[0], &xf[1], &xf[2], ref);
    }
    o = fa_attn_opts_default();
    o.algo = FA_ALGO_FLASH2;
    forward(ctx, &o, &xb[0], &xb[1], &xb[2], &ob);
    res[6] = rmse(&ob.t, ref);
    printf("FP8 accuracy (FA3's test): seqlen %lld, heads %lld, head_dim %lld, block %lld rows, seed %llu; RMSE of O "
           "(bf16) against float64; (a), (a'), (c') on %s\n", (long long)sh.s, (long long)sh.h, (long long)sh.d,
           (long long)block, (unsigned long long)seed, gpu ? "CUDA (P in e4m3)" : "the CPU");
    static const char *const names[7] = {
        "(a)  FP8, per-tensor scales", "(a') FP8, per-head scales", "(c') FP8, per-tensor scales + rotation",
        "(b)  FP8, per-block scales", "(c)  FP8, per-block scales + rotation",
        "(d)  FP8 standard attention, per-tensor scales (P in FP8)", "(e)  bf16"};
    static const int order[7] = {0, 1, 3, 4, 2, 5, 6};
    printf("| case | RMSE |\n|---|---|\n");
    for (int i = 0; i < 7; i++) printf("| %s | %.3e |\n", names[order[i]], res[order[i]]);
    printf("(d) / (c) = %.2f\n", res[5] / res[4]);
    for (int t = 0; t < 3; t++) t_buf_free(&x[t]), t_buf_free(&x8[t]), t_buf_free(&xf[t]), t_buf_free(&xb[t]), free(ds[t]);
    t_buf_free(&ob), free(ref);
    fa_context_destroy(ctx);
    if (gpu) fa_context_destroy(gpu);
    return 0;
}
