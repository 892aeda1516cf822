/* FP8 on CUDA: fa_quantize_fp8 on the device gives the CPU's bits (codes and descales) for every option (per head,
 * per block, grouped heads, per tensor, the Hadamard rotation; f32, f16, bf16; strided views); the FLASH3 FP8 forward
 * (e4m3 q, k, v with descales, out f16/bf16) against the float64 oracle on the same e4m3 values (masks, softcap, GQA,
 * odd lengths, strided views, descales NULL), its refusals with a reason and nothing written. P goes through e4m3
 * (3 mantissa bits, RNE: a relative error of at most 2^-4 per weight), so out is held to 8 % of max|V·vd| and its
 * RMS to 1.5 %; a wrong key order between P and Vᵀ misses both by far. Run by scripts/test-gpu.sh. */
#include "testlib.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* A host t_buf's whole allocation on the device, and its view there. */
static void *d_up(const t_buf *h, fa_tensor *t) {
    void *d;
    cuda_ok(cudaMalloc(&d, h->mem_bytes), "cudaMalloc");
    cuda_ok(cudaMemcpy(d, h->mem, h->mem_bytes, cudaMemcpyHostToDevice), "up");
    *t = h->t;
    t->data = (char *)d + h->offset;
    return d;
}

static void one(fa_context *cpu, fa_context *gpu, fa_dtype dt, int64_t B, int64_t S, int64_t H, int64_t D,
                t_layout lay, fa_quant_opts qo) {
    snprintf(t_case_label, sizeof t_case_label, "quantize %s b%lld s%lld h%lld d%lld block %lld group %lld%s%s",
             fa_dtype_name(dt), (long long)B, (long long)S, (long long)H, (long long)D, (long long)qo.block_rows,
             (long long)qo.heads_per_scale, qo.per_tensor ? " per-tensor" : "", qo.hadamard ? " hadamard" : "");
    t_buf x = t_buf_new(dt, B, S, H, D, lay);
    t_rng same = t_default_rng; /* the two outputs in one layout: a strided layout draws its padding at random */
    t_buf y = t_buf_new(FA_DTYPE_F8_E4M3, B, S, H, D, lay), yg = t_buf_new_r(&same, FA_DTYPE_F8_E4M3, B, S, H, D, lay);
    memcpy(yg.mem, y.mem, y.mem_bytes);
    t_buf_randn(&x, 2);
    if (B > 0 && S > 0) t_set(&x.t, 0, S - 1, H - 1, D - 1, 500);
    const int64_t nblk = qo.block_rows ? (S + qo.block_rows - 1) / qo.block_rows : 1, nd = B * H / qo.heads_per_scale * nblk;
    float *ds = malloc(sizeof(float) * (size_t)(nd + 1)), *dsg = malloc(sizeof(float) * (size_t)(nd + 1)), *dd;
    CHECK_STATUS(fa_quantize_fp8(cpu, &qo, &x.t, &y.t, ds), FA_OK);
    fa_tensor xt, yt;
    void *dx = d_up(&x, &xt), *dy = d_up(&yg, &yt);
    cuda_ok(cudaMalloc((void **)&dd, sizeof(float) * (size_t)(nd + 1)), "cudaMalloc");
    CHECK_STATUS(fa_quantize_fp8(gpu, &qo, &xt, &yt, dd), FA_OK);
    cuda_ok(cudaDeviceSynchronize(), "sync");
    cuda_ok(cudaMemcpy(yg.mem, dy, yg.mem_bytes, cudaMemcpyDeviceToHost), "down");
    cuda_ok(cudaMemcpy(dsg, dd, sizeof(float) * (size_t)nd, cudaMemcpyDeviceToHost), "down");
    int64_t first = -1; /* the views' codes, and the padding left alone alike */
    for (size_t i = 0; i < y.mem_bytes && first < 0; i++)
        if (((uint8_t *)y.mem)[i] != ((uint8_t *)yg.mem)[i]) first = (int64_t)i;
    CHECK_MSG(first < 0, "byte %lld of %lld: CPU 0x%02x, CUDA 0x%02x", (long long)first, (long long)y.mem_bytes,
              first < 0 ? 0 : ((uint8_t *)y.mem)[first], first < 0 ? 0 : ((uint8_t *)yg.mem)[first]);
    int64_t bad = -1;
    for (int64_t i = 0; i < nd && bad < 0; i++)
        if (ds[i] != dsg[i]) bad = i;
    CHECK_MSG(bad < 0, "descale %lld: CPU %a, CUDA %a", (long long)bad, bad < 0 ? 0. : ds[bad], bad < 0 ? 0. : dsg[bad]);
    cudaFree(dx), cudaFree(dy), cudaFree(dd);
    free(ds), free(dsg);
    t_buf_free(&x), t_buf_free(&y), t_buf_free(&yg);
}

/* The FLASH3 FP8 forward against the float64 oracle on the same e4m3 values. nseq > 0: varlen, sequences of lq[i]
 * query and lk[i] key rows packed into batch 1 (sq, sk: the totals), the cu_seqlens on the device with their bounds. */
static void fwd8v(fa_context *gpu, int64_t B, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t D, t_layout lay,
                  fa_attn_opts o, fa_dtype odt, int descales, int nseq, const int *lq, const int *lk) {
    int32_t cu[2][9] = {{0}, {0}}, *dcu = NULL;
    for (int i = 0; i < nseq; i++) cu[0][i + 1] = cu[0][i] + lq[i], cu[1][i + 1] = cu[1][i] + lk[i];
    if (nseq > 0) {
        B = 1, sq = cu[0][nseq], sk = cu[1][nseq];
        cuda_ok(cudaMalloc((void **)&dcu, sizeof cu), "cudaMalloc cu_seqlens");
        cuda_ok(cudaMemcpy(dcu, cu, sizeof cu, cudaMemcpyHostToDevice), "cu_seqlens up");
    }
    snprintf(t_case_label, sizeof t_case_label, "fp8 forward b%lld sq%lld sk%lld hq%lld hk%lld d%lld %s causal %d "
             "window %d/%d softcap %g out %s%s%s block_k %d", (long long)B, (long long)sq, (long long)sk,
             (long long)hq, (long long)hk, (long long)D, t_layout_name(lay), o.causal, o.window_left, o.window_right,
             (double)o.softcap, fa_dtype_name(odt), descales ? "" : " descales NULL", nseq ? " varlen" : "", o.block_k);
    const fa_dtype E = FA_DTYPE_F8_E4M3;
    t_buf q = t_buf_new(E, B, sq, hq, D, lay), k = t_buf_new(E, B, sk, hk, D, lay), v = t_buf_new(E, B, sk, hk, D, lay);
    t_buf out = t_buf_new(odt, B, sq, hq, D, lay);
    t_buf_randn(&q, 40), t_buf_randn(&k, 40), t_buf_randn(&v, 60); /* e4m3, stored saturating by t_set */
    const int64_t nd = (nseq > 0 ? nseq : B) * hk, n = B * sq * hq * D, nl = B * hq * sq;
    float *ds = malloc(sizeof(float) * 3 * (size_t)nd), *dd;
    for (int64_t i = 0; i < nd; i++) /* q·k ≈ 40² · d · qd · kd: logits O(1); V·vd about 1 */
        ds[i] = ds[nd + i] = (float)((0.5 + t_uniform()) * 0.05 / sqrt((double)D)), ds[2 * nd + i] = (float)(0.01 + 0.02 * t_uniform());
    cuda_ok(cudaMalloc((void **)&dd, sizeof(float) * 3 * (size_t)nd), "cudaMalloc");
    cuda_ok(cudaMemcpy(dd, ds, sizeof(float) * 3 * (size_t)nd, cudaMemcpyHostToDevice), "up");
    if (!descales) o.scale = 0.0005f;
    o.algo = FA_ALGO_FLASH3;
    fa_attn_opts oh = o, od = o;
    if (descales) oh.q_descale = ds, oh.k_descale = ds + nd, oh.v_descale = ds + 2 * nd;
    if (descales) od.q_descale = dd, od.k_descale = dd + nd, od.v_descale = dd + 2 * nd;
    if (nseq > 0) {
        oh.cu_seqlens_q = cu[0], oh.cu_seqlens_k = cu[1], oh.n_seqs = od.n_seqs = nseq;
        od.cu_seqlens_q = dcu, od.cu_seqlens_k = dcu + 9;
        for (int i = 0; i < nseq; i++) {
            if (lq[i] > od.max_seqlen_q) od.max_seqlen_q = lq[i];
            if (lk[i] > od.max_seqlen_k) od.max_seqlen_k = lk[i];
        }
    }
    double *ref = malloc(sizeof(double) * (size_t)n), *lref = malloc(sizeof(double) * (size_t)nl);
    CHECK_STATUS(t_oracle_forward(&oh, &q.t, &k.t, &v.t, ref, lref), FA_OK);
    fa_tensor qt, kt, vt, ot;
    void *dq = d_up(&q, &qt), *dk = d_up(&k, &kt), *dv = d_up(&v, &vt), *dout = d_up(&out, &ot);
    float *lse = malloc(sizeof(float) * (size_t)nl), *dl;
    cuda_ok(cudaMalloc((void **)&dl, sizeof(float) * (size_t)nl), "cudaMalloc");
    cuda_ok(cudaMemset(dl, 0xff, sizeof(float) * (size_t)nl), "poison");
    CHECK_STATUS(fa_forward(gpu, &od, &qt, &kt, &vt, &ot, dl), FA_OK);
    cuda_ok(cudaDeviceSynchronize(), "sync");
    fa_stats st;
    if (fa_last_stats(gpu, &st) == FA_OK) {
        char want[32]; /* the row: e4m3 at this head dim, of the asked key block */
        snprintf(want, sizeof want, "e4m3.d%lld.128x", (long long)D);
        CHECK_STR_CONTAINS(st.kernel, want);
        if (o.block_k) {
            snprintf(want, sizeof want, "x%d", o.block_k);
            CHECK_STR_CONTAINS(st.kernel, want);
        }
    }
    cuda_ok(cudaMemcpy(out.mem, dout, out.mem_bytes, cudaMemcpyDeviceToHost), "down");
    cuda_ok(cudaMemcpy(lse, dl, sizeof(float) * (size_t)nl, cudaMemcpyDeviceToHost), "down");
    CHECK_EQ_INT(t_buf_check_written(&out), 0);
    double se = 0, sr = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < sq; s++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t i = 0; i < D; i++) {
                    const double r = ref[((b * sq + s) * hq + h) * D + i], e = t_get(&out.t, b, s, h, i) - r;
                    se += e * e, sr += r * r;
                }
    const double err = t_max_diff(&out.t, ref), vmax = t_max_abs(ref, n), rms = sqrt(se / (double)n);
    CHECK_MSG(err <= 0.08 * vmax + 1e-6, "out: max error %g, max|out| %g", err, vmax);
    CHECK_MSG(rms <= 0.05 * sqrt(sr / (double)n) + 1e-6, "out: RMS error %g, RMS out %g", rms, sqrt(sr / (double)n));
    double lerr = 0;
    for (int64_t i = 0; i < nl; i++) {
        const double e = isinf(lref[i]) ? (lse[i] == lref[i] ? 0 : INFINITY) : fabs(lse[i] - lref[i]) / (1 + fabs(lref[i]));
        lerr = e > lerr ? e : lerr;
    }
    CHECK_MSG(lerr <= 2e-3, "lse: relative error %g", lerr);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dl), cudaFree(dd), cudaFree(dcu);
    free(ds), free(ref), free(lref), free(lse);
    t_buf_free(&q), t_buf_free(&k), t_buf_free(&v), t_buf_free(&out);
}
static void fwd8(fa_context *gpu, int64_t B, int64_t sq, int64_t sk, int64_t hq, int64_t hk, int64_t D, t_layout lay,
                 fa_attn_opts o, fa_dtype odt, int descales) {
    fwd8v(gpu, B, sq, sk, hq, hk, D, lay, o, odt, descales, 0, NULL, NULL);
}

/* The FP8 forward's refusals: a reason naming the argument, out untouched. */
static void refused8(fa_context *gpu, int64_t D, fa_dtype odt, fa_algo algo, const char *why) {
    snprintf(t_case_label, sizeof t_case_label, "fp8 forward refused: d%lld out %s algo %s", (long long)D,
             fa_dtype_name(odt), fa_algo_name(algo));
    t_buf q = t_buf_new(FA_DTYPE_F8_E4M3, 1, 64, 2, D, T_BSHD), o = t_buf_new(odt, 1, 64, 2, D, T_BSHD);
    fa_tensor qt, ot;
    void *dq = d_up(&q, &qt), *dout = d_up(&o, &ot);
    fa_attn_opts opts = fa_attn_opts_default();
    opts.algo = algo;
    CHECK_STATUS(fa_forward(gpu, &opts, &qt, &qt, &qt, &ot, NULL), FA_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(fa_context_last_error(gpu), why);
    t_buf back = t_buf_new(odt, 1, 64, 2, D, T_BSHD);
    cuda_ok(cudaMemcpy(back.mem, dout, back.mem_bytes, cudaMemcpyDeviceToHost), "down");
    CHECK(!memcmp(back.mem, o.mem, o.mem_bytes));
    cudaFree(dq), cudaFree(dout);
    t_buf_free(&q), t_buf_free(&o), t_buf_free(&back);
}

int main(void) {
    t_init("test_gpu_fp8");
    fa_context *cpu = t_cpu_ctx(), *gpu;
    if (fa_context_create(&gpu, FA_BACKEND_CUDA, 0) != FA_OK) {
        fprintf(stderr, "no CUDA context: %s\n", fa_create_error());
        return 1;
    }
    fa_quant_opts qo = fa_quant_opts_default();
    one(cpu, gpu, FA_DTYPE_F32, 2, 37, 4, 24, T_BSHD, qo);
    one(cpu, gpu, FA_DTYPE_BF16, 1, 300, 8, 128, T_STRIDED, qo);
    qo.block_rows = 64;
    one(cpu, gpu, FA_DTYPE_F16, 2, 257, 4, 64, T_BHSD, qo);
    qo.heads_per_scale = 4;
    one(cpu, gpu, FA_DTYPE_BF16, 1, 129, 8, 256, T_BSHD, qo);
    qo.hadamard = 1, qo.seed = 99;
    one(cpu, gpu, FA_DTYPE_F32, 2, 100, 4, 128, T_STRIDED, qo);
    qo = fa_quant_opts_default();
    qo.per_tensor = 1, qo.hadamard = 1, qo.seed = 5;
    one(cpu, gpu, FA_DTYPE_BF16, 3, 77, 6, 64, T_BSHD, qo);
    qo.hadamard = 0;
    one(cpu, gpu, FA_DTYPE_F16, 2, 0, 2, 8, T_BSHD, qo); /* no rows: descales of 1 */

    /* the FLASH3 FP8 forward (d = 128: 128-key blocks below 4096 keys) */
    const fa_attn_opts o0 = fa_attn_opts_default();
    fa_attn_opts o = o0;
    fwd8(gpu, 2, 256, 256, 4, 4, 128, T_BSHD, o, FA_DTYPE_BF16, 1);
    fwd8(gpu, 1, 300, 257, 8, 2, 128, T_BHSD, o, FA_DTYPE_F16, 1); /* GQA, partial tiles, sk not a multiple of 32 */
    fwd8(gpu, 3, 1, 700, 4, 1, 128, T_BSHD, o, FA_DTYPE_BF16, 1);     /* decoding shape, MQA */
    fwd8(gpu, 1, 129, 33, 2, 2, 128, T_BHSD, o, FA_DTYPE_BF16, 0);    /* descales NULL */
    o.causal = 1;
    fwd8(gpu, 2, 333, 333, 4, 2, 128, T_BSHD, o, FA_DTYPE_BF16, 1);
    fwd8(gpu, 1, 200, 517, 2, 2, 128, T_BHSD, o, FA_DTYPE_F16, 1); /* bottom-right causal */
    o = o0, o.window_left = 40, o.window_right = 7, o.softcap = 15;
    fwd8(gpu, 1, 400, 390, 4, 4, 128, T_BSHD, o, FA_DTYPE_BF16, 1);
    /* d = 128's 192-key row (the plan's pick from 4096 keys on; block_k forces it here) */
    o = o0, o.block_k = 192;
    fwd8(gpu, 1, 300, 457, 8, 2, 128, T_BHSD, o, FA_DTYPE_F16, 1); /* partial key blocks: Vᵀ's second panel */
    o.causal = 1;
    fwd8(gpu, 2, 333, 401, 4, 2, 128, T_BSHD, o, FA_DTYPE_BF16, 1);
    o = o0, o.block_k = 192, o.window_left = 40, o.window_right = 7, o.softcap = 15;
    fwd8(gpu, 1, 400, 390, 4, 4, 128, T_BSHD, o, FA_DTYPE_BF16, 1);
    /* d = 256 (96-key blocks) */
    o = o0;
    fwd8(gpu, 2, 256, 300, 4, 4, 256, T_BSHD, o, FA_DTYPE_BF16, 1);
    fwd8(gpu, 1, 129, 33, 4, 1, 256, T_BHSD, o, FA_DTYPE_F16, 0); /* MQA, descales NULL */
    o.causal = 1;
    fwd8(gpu, 1, 300, 517, 4, 2, 256, T_BSHD, o, FA_DTYPE_BF16, 1);
    o = o0, o.window_left = 40, o.window_right = 7, o.softcap = 15;
    fwd8(gpu, 1, 250, 250, 2, 2, 256, T_BSHD, o, FA_DTYPE_F16, 1);
    /* more tiles than SMs (the tile boundary: the producer's hand-off from one tile to the next): causal with sq > sk
     * (tiles without keys handed out after the full ones), and the static order at d = 256 */
    o = o0, o.causal = 1;
    fwd8(gpu, 1, 1200, 300, 24, 8, 128, T_BSHD, o, FA_DTYPE_BF16, 1);
    o = o0;
    fwd8(gpu, 2, 600, 200, 16, 4, 256, T_BSHD, o, FA_DTYPE_F16, 1);
    /* varlen: an empty sequence, one row, lengths across block edges, sq != sk (bottom-right causal per sequence) */
    {
        static const int lq[4] = {100, 0, 300, 1}, lk[4] = {64, 7, 517, 200}, lq2[3] = {257, 1, 130}, lk2[3] = {700, 0, 129};
        o = o0;
        fwd8v(gpu, 1, 0, 0, 4, 2, 128, T_BSHD, o, FA_DTYPE_BF16, 1, 4, lq, lk);
        o.causal = 1;
        fwd8v(gpu, 1, 0, 0, 4, 4, 128, T_BSHD, o, FA_DTYPE_F16, 1, 3, lq2, lk2);
        o = o0, o.block_k = 192, o.window_left = 40, o.window_right = 7;
        fwd8v(gpu, 1, 0, 0, 8, 2, 128, T_BSHD, o, FA_DTYPE_BF16, 0, 4, lq, lk);
        o = o0, o.causal = 1;
        fwd8v(gpu, 1, 0, 0, 4, 2, 256, T_BSHD, o, FA_DTYPE_BF16, 1, 3, lq2, lk2);
    }
    refused8(gpu, 128, FA_DTYPE_F32, FA_ALGO_FLASH3, "out");
    refused8(gpu, 64, FA_DTYPE_BF16, FA_ALGO_FLASH3, "head_dim 64");
    refused8(gpu, 64, FA_DTYPE_BF16, FA_ALGO_AUTO, "f8_e4m3");
    fa_context_destroy(gpu);
    fa_context_destroy(cpu);
    return t_finish();
}
