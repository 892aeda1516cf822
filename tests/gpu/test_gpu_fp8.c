/* FP8 on CUDA: fa_quantize_fp8 on the device gives the CPU's bits (codes and descales) for every option (per head,
 * per block, grouped heads, per tensor, the Hadamard rotation; f32, f16, bf16; strided views); an FP8 fa_forward is
 * refused with FA_ERR_UNSUPPORTED and nothing written until the Hopper FP8 kernel exists. Run by scripts/test-gpu.sh. */
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
    t_buf x = t_buf_new(dt, B, S, H, D, lay), y = t_buf_new(FA_DTYPE_F8_E4M3, B, S, H, D, lay),
          yg = t_buf_new(FA_DTYPE_F8_E4M3, B, S, H, D, lay);
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

    /* an FP8 forward: refused, out untouched */
    snprintf(t_case_label, sizeof t_case_label, "fp8 forward refused");
    t_buf q = t_buf_new(FA_DTYPE_F8_E4M3, 1, 64, 2, 64, T_BSHD), o = t_buf_new(FA_DTYPE_BF16, 1, 64, 2, 64, T_BSHD);
    fa_tensor qt, ot;
    void *dq = d_up(&q, &qt), *dout = d_up(&o, &ot);
    fa_attn_opts opts = fa_attn_opts_default();
    CHECK_STATUS(fa_forward(gpu, &opts, &qt, &qt, &qt, &ot, NULL), FA_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(fa_context_last_error(gpu), "f8_e4m3");
    t_buf back = t_buf_new(FA_DTYPE_BF16, 1, 64, 2, 64, T_BSHD);
    cuda_ok(cudaMemcpy(back.mem, dout, back.mem_bytes, cudaMemcpyDeviceToHost), "down");
    CHECK(!memcmp(back.mem, o.mem, o.mem_bytes));
    cudaFree(dq), cudaFree(dout);
    t_buf_free(&q), t_buf_free(&o), t_buf_free(&back);
    fa_context_destroy(gpu);
    fa_context_destroy(cpu);
    return t_finish();
}
