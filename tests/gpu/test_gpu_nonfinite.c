/* The numerics contract of docs/numerics.md on the CUDA backend (run on an H200 by `make test-gpu`): for STANDARD,
 * FLASH1 and FLASH2, f16 and bf16, head_dim 64:
 *   - finite inputs with huge scales (1e20, 1e30, ±FLT_MAX), denormal scale·softcap, logits beyond the fp32 range:
 *     no NaN in out or LSE, LSE finite, out inside the convex hull of V; no NaN in dq, dk, dv;
 *   - NaN/±inf in q row 5 (or key row 5): exactly the rows that see it are NaN (out and LSE), the others as in the
 *     clean run; NaN/inf in v[4][2] reaches column 2 of exactly the rows that see key 4.
 * Each failure prints one line "FAIL <case>: <what>"; the summary line counts them. Exit 1 on any failure. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "core/half.h"
#include "flashattn.h"

enum { S = 64, H = 2, D = 64, N = S * H * D };

static int failures, checks;
static char label[256];
static fa_context *ctx;

#define EXPECT(cond, ...)                                                                                            \
    do {                                                                                                             \
        checks++;                                                                                                    \
        if (!(cond)) {                                                                                               \
            failures++;                                                                                              \
            printf("FAIL %s: ", label);                                                                              \
            printf(__VA_ARGS__);                                                                                     \
            printf("\n");                                                                                            \
        }                                                                                                            \
    } while (0)

static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "CUDA error in test harness (%s): %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
}

/* Host copies (float, the values as rounded to the dtype) and device buffers of one problem, BSHD contiguous. */
typedef struct prob {
    fa_dtype dt;
    float q[N], k[N], v[N], o[N], dout[N], dq[N], dk[N], dv[N], lse[H * S];
    void *dq_d, *dk_d, *dv_d, *do_d, *o_d, *q_d, *k_d, *v_d;
    float *lse_d;
} prob;

static uint16_t to16(fa_dtype dt, float x) { return dt == FA_DTYPE_F16 ? fa_f32_to_f16(x) : fa_f32_to_bf16(x); }
static float from16(fa_dtype dt, uint16_t x) { return dt == FA_DTYPE_F16 ? fa_f16_to_f32(x) : fa_bf16_to_f32(x); }

static void up(fa_dtype dt, void *dev, float *x) { /* rounds x to the dtype in place, copies it up */
    static uint16_t tmp[N];
    for (int i = 0; i < N; i++) tmp[i] = to16(dt, x[i]), x[i] = from16(dt, tmp[i]);
    cuda_ok(cudaMemcpy(dev, tmp, sizeof tmp, cudaMemcpyHostToDevice), "up");
}
static void down(fa_dtype dt, float *x, const void *dev) {
    static uint16_t tmp[N];
    cuda_ok(cudaMemcpy(tmp, dev, sizeof tmp, cudaMemcpyDeviceToHost), "down");
    for (int i = 0; i < N; i++) x[i] = from16(dt, tmp[i]);
}
static void poison(void *dev, size_t bytes) { cuda_ok(cudaMemset(dev, 0xFF, bytes), "memset"); }

static double randn(void) {
    double u = (rand() + 1.0) / (RAND_MAX + 2.0), w = (rand() + 1.0) / (RAND_MAX + 2.0);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * w);
}

static prob *P;

static void fill(fa_dtype dt, double sigma) {
    P->dt = dt;
    for (int i = 0; i < N; i++) P->q[i] = (float)(sigma * randn()), P->k[i] = (float)(sigma * randn());
    for (int i = 0; i < N; i++) P->v[i] = (float)randn(), P->dout[i] = (float)randn();
}

static fa_tensor T(void *data, fa_dtype dt) { return fa_tensor_bshd(data, dt, 1, S, H, D); }

static fa_status forward(const fa_attn_opts *o) {
    up(P->dt, P->q_d, P->q), up(P->dt, P->k_d, P->k), up(P->dt, P->v_d, P->v);
    poison(P->o_d, N * 2), poison(P->lse_d, sizeof P->lse);
    fa_tensor q = T(P->q_d, P->dt), k = T(P->k_d, P->dt), v = T(P->v_d, P->dt), out = T(P->o_d, P->dt);
    fa_status st = fa_forward(ctx, o, &q, &k, &v, &out, P->lse_d);
    cuda_ok(cudaDeviceSynchronize(), "sync");
    if (st != FA_OK) printf("  forward: %s: %s\n", fa_status_string(st), fa_context_last_error(ctx));
    down(P->dt, P->o, P->o_d);
    cuda_ok(cudaMemcpy(P->lse, P->lse_d, sizeof P->lse, cudaMemcpyDeviceToHost), "lse");
    return st;
}
static fa_status backward(const fa_attn_opts *o) {
    up(P->dt, P->do_d, P->dout);
    poison(P->dq_d, N * 2), poison(P->dk_d, N * 2), poison(P->dv_d, N * 2);
    fa_tensor q = T(P->q_d, P->dt), k = T(P->k_d, P->dt), v = T(P->v_d, P->dt), out = T(P->o_d, P->dt);
    fa_tensor dout = T(P->do_d, P->dt), dq = T(P->dq_d, P->dt), dk = T(P->dk_d, P->dt), dv = T(P->dv_d, P->dt);
    fa_status st = fa_backward(ctx, o, &q, &k, &v, &out, P->lse_d, &dout, &dq, &dk, &dv);
    cuda_ok(cudaDeviceSynchronize(), "sync");
    if (st != FA_OK) printf("  backward: %s: %s\n", fa_status_string(st), fa_context_last_error(ctx));
    down(P->dt, P->dq, P->dq_d), down(P->dt, P->dk, P->dk_d), down(P->dt, P->dv, P->dv_d);
    return st;
}
static int count_nan(const float *x, int n) {
    int c = 0;
    for (int i = 0; i < n; i++) c += isnan(x[i]);
    return c;
}
#define AT(x, s, h, i) (x)[((s) * H + (h)) * D + (i)]

static void finite_never_nan(fa_dtype dt, fa_algo a, float scale, float softcap, double sigma, const char *what) {
    snprintf(label, sizeof label, "%s (scale %g softcap %g sigma %g) %s %s", what, scale, softcap, sigma,
             fa_dtype_name(dt), fa_algo_name(a));
    fill(dt, sigma);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a, o.scale = scale, o.softcap = softcap;
    if (forward(&o) != FA_OK) { EXPECT(0, "forward failed"); return; }
    EXPECT(count_nan(P->o, N) == 0, "%d NaN in out", count_nan(P->o, N));
    int bad = 0, outside = 0;
    for (int i = 0; i < H * S; i++) bad += !isfinite(P->lse[i]);
    EXPECT(bad == 0, "%d of %d LSE values not finite (every row sees keys)", bad, H * S);
    for (int h = 0; h < H; h++)
        for (int x = 0; x < D; x++) {
            float lo = INFINITY, hi = -INFINITY;
            for (int j = 0; j < S; j++) lo = fminf(lo, AT(P->v, j, h, x)), hi = fmaxf(hi, AT(P->v, j, h, x));
            const float slack = 2e-2f * (hi - lo) + 1e-3f;
            for (int s = 0; s < S; s++) outside += !(AT(P->o, s, h, x) >= lo - slack && AT(P->o, s, h, x) <= hi + slack);
        }
    EXPECT(outside == 0, "%d out values outside the convex hull of V", outside);
    if (backward(&o) != FA_OK) { EXPECT(0, "backward failed"); return; }
    EXPECT(count_nan(P->dq, N) == 0, "%d NaN in dq", count_nan(P->dq, N));
    EXPECT(count_nan(P->dk, N) == 0, "%d NaN in dk", count_nan(P->dk, N));
    EXPECT(count_nan(P->dv, N) == 0, "%d NaN in dv", count_nan(P->dv, N));
}

static void bad_input_rows(fa_dtype dt, fa_algo a, int in_k, float bad, int masked) {
    snprintf(label, sizeof label, "%s[5][1] = %g%s %s %s", in_k ? "k" : "q", bad, masked ? " causal window 2" : "",
             fa_dtype_name(dt), fa_algo_name(a));
    fill(dt, 1);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a;
    if (masked) o.causal = 1, o.window_left = 2; /* row i sees keys i-2..i */
    float *x = in_k ? P->k : P->q;
    AT(x, 5, 1, 1) = 0.5f;
    if (forward(&o) != FA_OK) { EXPECT(0, "forward failed"); return; }
    static float clean[N], clse[H * S];
    memcpy(clean, P->o, sizeof clean), memcpy(clse, P->lse, sizeof clse);
    AT(x, 5, 1, 1) = bad;
    if (forward(&o) != FA_OK) { EXPECT(0, "forward failed"); return; }
    int wrong = 0;
    for (int s = 0; s < S; s++)
        for (int h = 0; h < H; h++) {
            const int hit = h == 1 && (in_k ? (!masked || (s >= 5 && s <= 7)) : s == 5);
            const float l = P->lse[h * S + s];
            int row_bad = hit ? !isnan(l) : !(fabsf(l - clse[h * S + s]) <= 3e-2f * (1 + fabsf(clse[h * S + s])));
            for (int i = 0; i < D; i++) {
                const float v = AT(P->o, s, h, i), c = AT(clean, s, h, i);
                row_bad |= hit ? !isnan(v) : !(fabsf(v - c) <= 3e-2f * (1 + fabsf(c)));
            }
            if (row_bad && wrong < 3)
                printf("  %s: row %d head %d: %s (LSE %g, out[0] %g)\n", label, s, h,
                       hit ? "should be NaN (out and LSE)" : "should equal the clean run", l, AT(P->o, s, h, 0));
            wrong += row_bad;
        }
    EXPECT(wrong == 0, "%d rows break the contract", wrong);
}

static void bad_v(fa_dtype dt, fa_algo a, float bad, int masked) {
    snprintf(label, sizeof label, "v[4][2] = %g%s %s %s", bad, masked ? " causal" : "", fa_dtype_name(dt),
             fa_algo_name(a));
    fill(dt, 1);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a, o.causal = masked;
    AT(P->v, 4, 0, 2) = bad;
    if (forward(&o) != FA_OK) { EXPECT(0, "forward failed"); return; }
    int wrong = 0;
    for (int s = 0; s < S; s++) {
        wrong += !isfinite(P->lse[s]);
        for (int i = 0; i < D; i++) {
            const float v = AT(P->o, s, 0, i);
            if (i != 2 || (masked && s < 4)) wrong += !isfinite(v);
            else wrong += isfinite(v);
        }
    }
    EXPECT(wrong == 0, "%d values break the contract (column 2 of rows that see key 4 non-finite, the rest finite)",
           wrong);
}

int main(void) {
    srand(20);
    if (fa_context_create(&ctx, FA_BACKEND_CUDA, 0) != FA_OK) {
        fprintf(stderr, "test_gpu_nonfinite: no CUDA context: %s\n", fa_create_error());
        return 2;
    }
    P = calloc(1, sizeof *P);
    void **dev[] = {&P->q_d, &P->k_d, &P->v_d, &P->o_d, &P->do_d, &P->dq_d, &P->dk_d, &P->dv_d};
    for (int i = 0; i < 8; i++) cuda_ok(cudaMalloc(dev[i], N * 2), "cudaMalloc");
    cuda_ok(cudaMalloc((void **)&P->lse_d, sizeof P->lse), "cudaMalloc");
    static const fa_algo algos[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2};
    static const fa_dtype dts[] = {FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int ai = 0; ai < 3; ai++)
        for (int di = 0; di < 2; di++) {
            const fa_algo a = algos[ai];
            const fa_dtype dt = dts[di];
            finite_never_nan(dt, a, 1e20f, 0, 1, "huge scale");
            finite_never_nan(dt, a, 1e30f, 0, 1, "huge scale");
            finite_never_nan(dt, a, FLT_MAX, 0, 1, "huge scale");
            finite_never_nan(dt, a, -FLT_MAX, 0, 1, "huge negative scale");
            finite_never_nan(dt, a, 1.4013e-45f, 1.4013e-45f, 1, "denormal scale and softcap");
            finite_never_nan(dt, a, 1e30f, 1e-30f, 1, "huge scale, tiny softcap");
            if (dt == FA_DTYPE_BF16) finite_never_nan(dt, a, 0, 0, 1e19, "logits beyond fp32 range");
            for (int m = 0; m <= 1; m++) {
                const float bads[3] = {INFINITY, -INFINITY, NAN};
                for (int b = 0; b < 3; b++) bad_input_rows(dt, a, 0, bads[b], m), bad_input_rows(dt, a, 1, bads[b], m);
                bad_v(dt, a, INFINITY, m);
                bad_v(dt, a, NAN, m);
            }
        }
    for (int i = 0; i < 8; i++) cudaFree(*dev[i]);
    cudaFree(P->lse_d);
    free(P);
    fa_context_destroy(ctx);
    printf("test_gpu_nonfinite: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
