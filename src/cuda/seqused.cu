/* seqused_q / seqused_k on CUDA (fa_attn_opts): the kernels see each packed sequence as its used rows (fa_get_seq),
 * so the rest of each span — padding — is written here after them, as the header defines it: out rows 0 and LSE -inf
 * (forward), dq rows 0 and dk, dv rows of the padding keys 0 (backward). One CTA per sequence; the device arrays are
 * clamped as fa_packed_seq (packed.cuh) does, so no value writes outside the tensors. Kernels only: graph-capturable. */
#include "plan.h"

#include <math.h>

typedef struct fa_pad_view {
    char *p;
    int64_t ss, sh;
    int heads, d, es;
} fa_pad_view;

typedef struct fa_pad_args {
    const int *cu_q, *cu_k, *used_q, *used_k;
    int total_q, total_k;
    fa_pad_view q_side, k1, k2; /* out or dq; dk, dv (backward) */
    float *lse;                 /* forward [hq, total_q], or NULL */
} fa_pad_args;

/* Span [*lo, *hi) of sequence b clamped into the tensor, and its first padding row lo + used (clamped into it). */
__device__ void fa_pad_span(const int *cu, const int *used, int b, int total, int *from, int *to) {
    const int lo = min(max(cu[b], 0), total), hi = min(max(cu[b + 1], lo), total);
    *from = lo + min(max(used[b], 0), hi - lo);
    *to = hi;
}

__device__ void fa_pad_zero(const fa_pad_view &v, int r0, int r1) {
    const int64_t n = (int64_t)(r1 - r0) * v.heads * v.d;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
        const int64_t c = e % v.d, h = e / v.d % v.heads, r = r0 + e / ((int64_t)v.d * v.heads);
        char *x = v.p + (r * v.ss + h * v.sh + c) * v.es;
        if (v.es == 4) *(float *)x = 0.f;
        else *(unsigned short *)x = 0;
    }
}

__global__ void __launch_bounds__(256) fa_pad_kernel(const fa_pad_args a) {
    const int b = blockIdx.x;
    int r0, r1;
    if (a.used_q) {
        fa_pad_span(a.cu_q, a.used_q, b, a.total_q, &r0, &r1);
        fa_pad_zero(a.q_side, r0, r1);
        for (int64_t e = threadIdx.x; a.lse && e < (int64_t)(r1 - r0) * a.q_side.heads; e += blockDim.x)
            a.lse[e / (r1 - r0) * a.total_q + r0 + e % (r1 - r0)] = -INFINITY;
    }
    if (a.used_k && a.k1.p) {
        fa_pad_span(a.cu_k, a.used_k, b, a.total_k, &r0, &r1);
        fa_pad_zero(a.k1, r0, r1);
        fa_pad_zero(a.k2, r0, r1);
    }
}

static fa_pad_view view_of(const fa_tensor *t) {
    return {(char *)t->data, t->stride_seq, t->stride_head, (int)t->heads, (int)t->head_dim,
            (int)fa_dtype_size(t->dtype)};
}

cudaError_t fa_cuda_zero_unused(const fa_problem *p, cudaStream_t st) {
    if (!p->cu_q || (!p->used_q && !(p->used_k && p->is_backward)) || p->batch == 0) return cudaSuccess;
    fa_pad_args a = {p->cu_q, p->cu_k, p->used_q, p->used_k, (int)p->q.seqlen, (int)p->k.seqlen, {}, {}, {}, NULL};
    if (p->is_backward) {
        a.q_side = view_of(&p->dq), a.k1 = view_of(&p->dk), a.k2 = view_of(&p->dv);
    } else {
        a.q_side = view_of(&p->o), a.lse = p->lse;
    }
    fa_pad_kernel<<<(unsigned)p->batch, 256, 0, st>>>(a);
    return cudaGetLastError();
}
