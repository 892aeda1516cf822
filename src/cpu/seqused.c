/* seqused_q / seqused_k on the CPU (fa_attn_opts): the algorithms see each packed sequence as its used rows
 * (fa_seqlen_q/k), so the rest of each span — padding — is written here, after them: out rows 0 and LSE -inf
 * (forward), dq rows 0 and dk, dv rows of the padding keys 0 (backward). 0.0 is all-zero bits in every dtype. */
#include "cpu/cpu.h"

#include <string.h>

/* Rows [r0, r1) of every head of t (batch 1, packed) := 0. */
static void zero_rows(const fa_tensor *t, int64_t r0, int64_t r1) {
    const size_t es = fa_dtype_size(t->dtype), row = (size_t)t->head_dim * es;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t h = 0; h < t->heads; h++)
            memset((char *)t->data + (size_t)(r * t->stride_seq + h * t->stride_head) * es, 0, row);
}

void fa_cpu_zero_unused(const fa_problem *p) {
    for (int64_t b = 0; b < p->batch; b++) {
        if (p->used_q) {
            const int64_t r0 = (int64_t)p->cu_q[b] + p->used_q[b], r1 = p->cu_q[b + 1];
            if (p->is_backward) {
                zero_rows(&p->dq, r0, r1);
            } else {
                zero_rows(&p->o, r0, r1);
                for (int64_t h = 0; p->lse && h < p->hq; h++)
                    for (int64_t r = r0; r < r1; r++) p->lse[h * p->q.seqlen + r] = -INFINITY; /* [1, Hq, total] */
            }
        }
        if (p->used_k && p->is_backward) {
            const int64_t r0 = (int64_t)p->cu_k[b] + p->used_k[b], r1 = p->cu_k[b + 1];
            zero_rows(&p->dk, r0, r1);
            zero_rows(&p->dv, r0, r1);
        }
    }
}
