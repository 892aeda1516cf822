/* The numerics contract of docs/numerics.md on the CUDA backend (run on an H200 by `make test-gpu`): for STANDARD,
 * FLASH1, FLASH2 and FLASH3, f16 and bf16 (STANDARD also f32), head_dim 64:
 *   - finite inputs with huge scales (1e20, 1e30, ±FLT_MAX), denormal scale·softcap, logits beyond the fp32 range:
 *     no NaN in out or LSE, LSE finite, out inside the convex hull of V; no NaN in dq, dk, dv;
 *   - NaN/±inf in q row 5 (or key row 5), with and without a softcap: exactly the rows that see it are NaN (out
 *     and LSE), the others as in the clean run; NaN/inf in v[4][2] reaches column 2 of exactly the rows that see key 4;
 *   - the same for a key row inside a packed (varlen) batch with GQA, an empty query sequence, fully masked rows
 *     and padded rows (odd strides for STANDARD): out, LSE and dQ of exactly the rows that see it are NaN, fully
 *     masked rows stay O = 0 / LSE = −∞, every other row and gradient as in the clean run (FLASH3's tiles cover
 *     rows of the next sequence: its TMA boxes must stop at the sequence's end); NaN/inf in a value there reaches
 *     exactly one column of exactly the rows that see it (forward).
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

static size_t esize(fa_dtype dt) { return dt == FA_DTYPE_F32 ? 4 : 2; }
static float round_to(fa_dtype dt, float x, void *dst, size_t i) { /* x rounded to dt, stored at dst[i] */
    if (dt == FA_DTYPE_F32) return ((float *)dst)[i] = x;
    const uint16_t h = dt == FA_DTYPE_F16 ? fa_f32_to_f16(x) : fa_f32_to_bf16(x);
    ((uint16_t *)dst)[i] = h;
    return dt == FA_DTYPE_F16 ? fa_f16_to_f32(h) : fa_bf16_to_f32(h);
}
static float value_of(fa_dtype dt, const void *src, size_t i) {
    if (dt == FA_DTYPE_F32) return ((const float *)src)[i];
    const uint16_t h = ((const uint16_t *)src)[i];
    return dt == FA_DTYPE_F16 ? fa_f16_to_f32(h) : fa_bf16_to_f32(h);
}
static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
}
/* n elements: x rounded to the dtype in place, copied up; copied down into x. */
static void up_n(fa_dtype dt, void *dev, float *x, size_t n) {
    void *tmp = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = round_to(dt, x[i], tmp, i);
    cuda_ok(cudaMemcpy(dev, tmp, n * esize(dt), cudaMemcpyHostToDevice), "up");
    free(tmp);
}
static void down_n(fa_dtype dt, float *x, const void *dev, size_t n) {
    void *tmp = malloc(n * 4);
    cuda_ok(cudaMemcpy(tmp, dev, n * esize(dt), cudaMemcpyDeviceToHost), "down");
    for (size_t i = 0; i < n; i++) x[i] = value_of(dt, tmp, i);
    free(tmp);
}
static void up(fa_dtype dt, void *dev, float *x) { up_n(dt, dev, x, N); }
static void down(fa_dtype dt, float *x, const void *dev) { down_n(dt, x, dev, N); }
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
    poison(P->o_d, N * esize(P->dt)), poison(P->lse_d, sizeof P->lse);
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
    poison(P->dq_d, N * esize(P->dt)), poison(P->dk_d, N * esize(P->dt)), poison(P->dv_d, N * esize(P->dt));
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

/* softcap: its tanh turns the ±inf logits of an inf in q or k into finite ones, which the outputs cannot show */
static void bad_input_rows(fa_dtype dt, fa_algo a, int in_k, float bad, int masked, float softcap) {
    snprintf(label, sizeof label, "%s[5][1] = %g%s softcap %g %s %s", in_k ? "k" : "q", bad,
             masked ? " causal window 2" : "", softcap, fa_dtype_name(dt), fa_algo_name(a));
    fill(dt, 1);
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a, o.softcap = softcap;
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

/* ---- a packed batch with GQA: 4 query heads over 2 K/V heads; sequences (sq, sk) = (24, 30), (0, 5), (40, 29);
 * rows padded (STANDARD: by one element, so that no row is 16-byte aligned; flash: by 8), inputs' padding NaN ---- */
enum { PQ = 4, PK = 2, TQ = 64, TK = 64 };
static const int32_t cuq[4] = {0, 24, 24, 64}, cuk[4] = {0, 30, 35, 64};
enum { BAD_SEQ = 2, BAD_KEY = 5, BAD_HK = 1 }; /* key row 5 of sequence 2, K/V head 1 (query heads 2, 3) */

typedef struct packed {
    fa_dtype dt;
    int64_t ldq, ldk; /* row strides */
    float *h[8];      /* host: q, k, v, out, dout, dq, dk, dv */
    void *d[8];
    float lse[PQ * TQ], *lse_d;
} packed;
static size_t pk_elems(const packed *x, int i) { return i == 1 || i == 2 || i == 6 || i == 7 ? TK * x->ldk : TQ * x->ldq; }
static fa_tensor pk_tensor(const packed *x, int i) {
    const int kside = i == 1 || i == 2 || i == 6 || i == 7;
    fa_tensor t = fa_tensor_bshd(x->d[i], x->dt, 1, kside ? TK : TQ, kside ? PK : PQ, D);
    t.stride_seq = kside ? x->ldk : x->ldq, t.stride_batch = t.stride_seq * t.seqlen;
    return t;
}
/* Row r of the packed tensor i, head h: element pointer in the host copy. */
static float *pk_row(packed *x, int i, int r, int h) {
    const int kside = i == 1 || i == 2 || i == 6 || i == 7;
    return x->h[i] + (size_t)r * (kside ? x->ldk : x->ldq) + (size_t)h * D;
}
static int seq_of(const int32_t *cu, int r) {
    int s = 0;
    while (cu[s + 1] <= r) s++;
    return s;
}
/* Does local query row i of sequence s see local key j (bottom-right causal when causal)? */
static int sees(int s, int i, int j, int causal) {
    const int sq = cuq[s + 1] - cuq[s], sk = cuk[s + 1] - cuk[s];
    return j < sk && (!causal || j <= i + sk - sq);
}
static int sees_any(int s, int i, int causal) {
    const int sk = cuk[s + 1] - cuk[s];
    for (int j = 0; j < sk; j++)
        if (sees(s, i, j, causal)) return 1;
    return 0;
}
static int close_to(float v, float c, float tol) {
    if (isinf(c) || isinf(v)) return v == c;
    return fabsf(v - c) <= tol * (1 + fabsf(c));
}

static fa_status pk_run(packed *x, const fa_attn_opts *o, int backward) {
    for (int i = 0; i < (backward ? 5 : 3); i++) up_n(x->dt, x->d[i], x->h[i], pk_elems(x, i));
    fa_tensor t[8];
    for (int i = 0; i < 8; i++) t[i] = pk_tensor(x, i);
    fa_status st;
    if (!backward) {
        poison(x->d[3], pk_elems(x, 3) * esize(x->dt)), poison(x->lse_d, sizeof x->lse);
        st = fa_forward(ctx, o, &t[0], &t[1], &t[2], &t[3], x->lse_d);
    } else {
        for (int i = 5; i < 8; i++) poison(x->d[i], pk_elems(x, i) * esize(x->dt));
        st = fa_backward(ctx, o, &t[0], &t[1], &t[2], &t[3], x->lse_d, &t[4], &t[5], &t[6], &t[7]);
    }
    cuda_ok(cudaDeviceSynchronize(), "sync");
    if (st != FA_OK) printf("  %s: %s: %s\n", backward ? "backward" : "forward", fa_status_string(st), fa_context_last_error(ctx));
    if (!backward) {
        down_n(x->dt, x->h[3], x->d[3], pk_elems(x, 3));
        cuda_ok(cudaMemcpy(x->lse, x->lse_d, sizeof x->lse, cudaMemcpyDeviceToHost), "lse");
    } else {
        for (int i = 5; i < 8; i++) down_n(x->dt, x->h[i], x->d[i], pk_elems(x, i));
    }
    return st;
}

/* in_v: the value in v[seq 2][5] column 1 instead, forward only: column 1 of exactly the rows that see the key is
 * not finite, everything else as in the clean run — the rows of sequence 0, whose key tiles reach past its end into
 * that row, included (0·NaN: a tile must not read the next sequence's v) */
static void packed_bad_input(fa_dtype dt, fa_algo a, int in_v, float bad, int causal) {
    snprintf(label, sizeof label, "packed GQA %s[seq 2][5] = %g%s %s %s", in_v ? "v" : "k", bad, causal ? " causal" : "",
             fa_dtype_name(dt), fa_algo_name(a));
    packed x;
    memset(&x, 0, sizeof x);
    x.dt = dt;
    const int64_t pad = a == FA_ALGO_STANDARD ? 1 : 8;
    x.ldq = PQ * D + pad, x.ldk = PK * D + pad;
    for (int i = 0; i < 8; i++) {
        const size_t n = pk_elems(&x, i);
        x.h[i] = malloc(n * sizeof(float));
        x.d[i] = dev_alloc(n * 4);
        for (size_t e = 0; e < n; e++) x.h[i][e] = NAN; /* padding stays NaN: the scan must not read it */
    }
    x.lse_d = dev_alloc(sizeof x.lse);
    for (int i = 0; i < 5; i++)
        for (int r = 0; r < (i == 1 || i == 2 ? TK : TQ); r++)
            for (int h = 0; h < (i == 1 || i == 2 ? PK : PQ); h++)
                for (int e = 0; e < D; e++) pk_row(&x, i, r, h)[e] = (float)randn();
    /* the offsets on the device, as a CUDA context reads them, with the longest lengths as the bounds */
    int32_t *cu_d = dev_alloc(sizeof cuq + sizeof cuk);
    cuda_ok(cudaMemcpy(cu_d, cuq, sizeof cuq, cudaMemcpyHostToDevice), "cu_seqlens_q up");
    cuda_ok(cudaMemcpy(cu_d + 4, cuk, sizeof cuk, cudaMemcpyHostToDevice), "cu_seqlens_k up");
    fa_attn_opts o = fa_attn_opts_default();
    o.algo = a, o.causal = causal, o.cu_seqlens_q = cu_d, o.cu_seqlens_k = cu_d + 4, o.n_seqs = 3;
    o.max_seqlen_q = 40, o.max_seqlen_k = 30; /* cuq: 24, 0, 40; cuk: 30, 5, 29 */
    float *bad_elem = pk_row(&x, in_v ? 2 : 1, cuk[BAD_SEQ] + BAD_KEY, BAD_HK) + 1;
    *bad_elem = 0.5f;
    static float clean[8][TQ * (PQ * D + 8)], clse[PQ * TQ];
    int ok = pk_run(&x, &o, 0) == FA_OK && (in_v || pk_run(&x, &o, 1) == FA_OK);
    for (int i = 3; i < 8; i++) memcpy(clean[i], x.h[i], pk_elems(&x, i) * sizeof(float));
    memcpy(clse, x.lse, sizeof clse);
    *bad_elem = bad;
    ok = ok && pk_run(&x, &o, 0) == FA_OK && (in_v || pk_run(&x, &o, 1) == FA_OK);
    if (!ok) {
        EXPECT(0, "a call failed");
    } else {
        int wrong = 0;
        for (int r = 0; r < TQ; r++)
            for (int h = 0; h < PQ; h++) {
                const int s = seq_of(cuq, r), i = r - cuq[s];
                const int hit = s == BAD_SEQ && h / (PQ / PK) == BAD_HK && sees(s, i, BAD_KEY, causal);
                const float l = x.lse[h * TQ + r], cl = clse[h * TQ + r];
                int row_bad = hit && !in_v ? !isnan(l) : !close_to(l, cl, 3e-2f);
                if (!sees_any(s, i, causal)) row_bad |= !(l == -INFINITY);
                for (int e = 0; in_v && e < D; e++) { /* out only: column 1 of the hit rows not finite */
                    const float v = pk_row(&x, 3, r, h)[e], c = clean[3][(size_t)r * x.ldq + h * D + e];
                    row_bad |= hit && e == 1 ? isfinite(v) : !close_to(v, c, 3e-2f);
                }
                for (int e = 0; !in_v && e < D; e++) {
                    const float v = pk_row(&x, 3, r, h)[e], c = clean[3][(size_t)r * x.ldq + h * D + e];
                    const float g = pk_row(&x, 5, r, h)[e], cg = clean[5][(size_t)r * x.ldq + h * D + e];
                    row_bad |= hit ? !isnan(v) || !isnan(g) : !close_to(v, c, 3e-2f) || !close_to(g, cg, 5e-2f);
                    if (!sees_any(s, i, causal)) row_bad |= v != 0.f || g != 0.f;
                }
                if (row_bad && wrong < 3)
                    printf("  %s: packed row %d head %d: %s (LSE %g, out[0] %g, dq[0] %g)\n", label, r, h,
                           hit ? "should be NaN (out, LSE, dq)" : "should equal the clean run", l, pk_row(&x, 3, r, h)[0],
                           pk_row(&x, 5, r, h)[0]);
                wrong += row_bad;
            }
        EXPECT(wrong == 0, "%d query rows break the contract", wrong);
        wrong = 0;
        for (int r = 0; !in_v && r < TK; r++)
            for (int hk = 0; hk < PK; hk++) {
                const int s = seq_of(cuk, r), item = s == BAD_SEQ && hk == BAD_HK;
                int row_bad = 0;
                for (int i = 6; i < 8; i++)
                    for (int e = 0; e < D; e++) {
                        const float g = pk_row(&x, i, r, hk)[e], cg = clean[i][(size_t)r * x.ldk + hk * D + e];
                        row_bad |= item ? !isnan(g) : !close_to(g, cg, 5e-2f);
                        if (s == 1) row_bad |= g != 0.f; /* keys no query sees: zero gradients */
                    }
                if (row_bad && wrong < 3)
                    printf("  %s: packed key row %d head %d: dk/dv %s (dk[0] %g, dv[0] %g)\n", label, r, hk,
                           item ? "should be NaN" : "should equal the clean run", pk_row(&x, 6, r, hk)[0],
                           pk_row(&x, 7, r, hk)[0]);
                wrong += row_bad;
            }
        EXPECT(wrong == 0, "%d key rows break the contract", wrong);
    }
    for (int i = 0; i < 8; i++) free(x.h[i]), cudaFree(x.d[i]);
    cudaFree(x.lse_d), cudaFree(cu_d);
}

int main(void) {
    srand(20);
    if (fa_context_create(&ctx, FA_BACKEND_CUDA, 0) != FA_OK) {
        fprintf(stderr, "test_gpu_nonfinite: no CUDA context: %s\n", fa_create_error());
        return 2;
    }
    P = calloc(1, sizeof *P);
    void **dev[] = {&P->q_d, &P->k_d, &P->v_d, &P->o_d, &P->do_d, &P->dq_d, &P->dk_d, &P->dv_d};
    for (int i = 0; i < 8; i++) *dev[i] = dev_alloc(N * 4);
    cuda_ok(cudaMalloc((void **)&P->lse_d, sizeof P->lse), "cudaMalloc");
    static const fa_algo algos[] = {FA_ALGO_STANDARD, FA_ALGO_FLASH1, FA_ALGO_FLASH2, FA_ALGO_FLASH3};
    static const fa_dtype dts[] = {FA_DTYPE_F16, FA_DTYPE_BF16, FA_DTYPE_F32};
    for (int ai = 0; ai < 4; ai++)
        for (int di = 0; di < (algos[ai] == FA_ALGO_STANDARD ? 3 : 2); di++) { /* f32: STANDARD only on CUDA */
            const fa_algo a = algos[ai];
            const fa_dtype dt = dts[di];
            finite_never_nan(dt, a, 1e20f, 0, 1, "huge scale");
            finite_never_nan(dt, a, 1e30f, 0, 1, "huge scale");
            finite_never_nan(dt, a, FLT_MAX, 0, 1, "huge scale");
            finite_never_nan(dt, a, -FLT_MAX, 0, 1, "huge negative scale");
            finite_never_nan(dt, a, 1.4013e-45f, 1.4013e-45f, 1, "denormal scale and softcap");
            finite_never_nan(dt, a, 1e30f, 1e-30f, 1, "huge scale, tiny softcap");
            if (dt != FA_DTYPE_F16) finite_never_nan(dt, a, 0, 0, 1e19, "logits beyond fp32 range");
            if (dt == FA_DTYPE_F32) finite_never_nan(dt, a, 1, 0, 3e37, "products beyond fp32 range");
            for (int m = 0; m <= 1; m++) {
                const float bads[3] = {INFINITY, -INFINITY, NAN};
                for (int b = 0; b < 3; b++)
                    for (int in_k = 0; in_k <= 1; in_k++)
                        for (int cap = 0; cap <= 1; cap++) bad_input_rows(dt, a, in_k, bads[b], m, cap ? 30.f : 0.f);
                bad_v(dt, a, INFINITY, m);
                bad_v(dt, a, NAN, m);
                for (int in_v = 0; in_v <= 1; in_v++) {
                    packed_bad_input(dt, a, in_v, INFINITY, m);
                    packed_bad_input(dt, a, in_v, NAN, m);
                }
            }
        }
    for (int i = 0; i < 8; i++) cudaFree(*dev[i]);
    cudaFree(P->lse_d);
    free(P);
    fa_context_destroy(ctx);
    printf("test_gpu_nonfinite: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
