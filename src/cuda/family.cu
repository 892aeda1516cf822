/* The CUDA family table (family.h) in AUTO's order of preference, and the helpers its rows share: reasons, the views
 * a layout rule rejects, the traffic model's pieces, the workspace frame. Host code. */
#include "family.h"

#include <stdio.h>
#include <string.h>

/* AUTO takes the first row with auto_pick that runs the call: FLASH3, FLASH2, STANDARD. Refusals of the rows before
 * the one of the algorithm api.c resolved AUTO to (FLASH2) stay unreported: the caller did not ask for them. FP8
 * inputs: the FLASH3 forward's f8 tile rows (wgmma/tiles.h); every other row refuses them. */
const fa_cuda_family *const fa_cuda_families[] = { /* the count: family.h */
    &fa_cuda_flash3_fwd, &fa_cuda_flash3_bwd, &fa_cuda_flash2_fwd, &fa_cuda_flash2_bwd,
    &fa_cuda_standard,   &fa_cuda_flash1_fwd, &fa_cuda_flash1_bwd,
};

fa_status fa_cuda_unsupported(char *why, size_t why_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    return FA_ERR_UNSUPPORTED;
}

fa_status fa_cuda_fp8_refusal(char *why, size_t why_len) {
    return fa_cuda_unsupported(why, why_len, "dtype f8_e4m3: on CUDA only the FA_ALGO_FLASH3 forward takes FP8 inputs "
                               "(FA_ALGO_AUTO runs it where built); a CPU context runs FP8 on every algorithm");
}

const fa_tensor *fa_cuda_view_failing(const fa_problem *p, int (*ok)(const fa_tensor *), const char **name) {
    const fa_tensor *ts[8] = {&p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv};
    static const char *names[8] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
    for (int i = 0; i < (p->is_backward ? 8 : 4); ++i)
        if (!ok(ts[i])) {
            *name = names[i];
            return ts[i];
        }
    return NULL;
}

int fa_cuda_aligned16(const fa_tensor *t) {
    return ((uintptr_t)t->data % 16) == 0 && t->stride_batch % 8 == 0 && t->stride_seq % 8 == 0 &&
           t->stride_head % 8 == 0;
}

void fa_cuda_dims_list(const int *d, int n, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (int last = 0;;) {
        int next = 0;
        for (int i = 0; i < n; ++i)
            if (d[i] > last && (!next || d[i] < next)) next = d[i];
        if (!next) return;
        used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%d", last ? ", " : "", next);
        if (used >= len) return;
        last = next;
    }
}

size_t fa_cuda_stat_rows(const fa_problem *p) { return (size_t)p->hq * p->q.seqlen * (p->cu_q ? 1 : p->batch); }
size_t fa_cuda_krows_q_heads(const fa_problem *p) { return (size_t)p->hq * p->k.seqlen * (p->cu_k ? 1 : p->batch); }

void fa_cuda_model_pairs(const fa_problem *p, int bm, int bn, double *pairs, double *qblocks) {
    *pairs = 0, *qblocks = 0;
    for (int64_t b = 0; b < p->batch; ++b) {
        const int64_t sq = fa_seqlen_q(p, b), sk = fa_seqlen_k(p, b);
        for (int64_t m0 = 0; m0 < sq; m0 += bm) {
            int64_t lo, hi;
            fa_visible_block(m0, m0 + bm < sq ? m0 + bm : sq, sq, sk, p->wl, p->wr, p->chunk, &lo, &hi);
            if (hi <= lo) continue;
            *pairs += (double)((hi + bn - 1) / bn - lo / bn);
            *qblocks += 1;
        }
    }
    *pairs *= (double)p->hq;
    *qblocks *= (double)p->hq;
}

fa_cuda_traffic_in fa_cuda_traffic_of(const fa_problem *p) {
    fa_cuda_traffic_in t;
    t.e = (double)fa_dtype_size(p->dtype), t.d = (double)p->d, t.dv = (double)p->d_v;
    t.qrows = (double)fa_cuda_stat_rows(p), t.kvrows = (double)p->k.seqlen * (p->cu_k ? 1 : p->batch) * p->hk;
    return t;
}

void fa_cuda_traffic_q_outer(const fa_problem *p, fa_plan *plan) {
    const fa_cuda_traffic_in t = fa_cuda_traffic_of(p);
    const double e = t.e, d = t.d, dv = t.dv, qrows = t.qrows;
    const int bm = plan->block_q, bn = plan->block_k;
    double pairs, qb;
    fa_cuda_model_pairs(p, bm, bn, &pairs, &qb);
    plan->read_bytes = qb * bm * d * e + pairs * bn * (d + dv) * e;
    plan->write_bytes = qrows * dv * e + (p->lse ? qrows * 4 : 0);
}

void fa_cuda_ws_layout(fa_arena *a, const fa_problem *p, const fa_plan *plan, fa_cuda_ws *w) {
    memset(w, 0, sizeof *w);
    const fa_cuda_family *f = fa_cuda_families[plan->family];
    if (f->workspace) f->workspace(a, p, plan, w);
    fa_contract_layout(a, p, &w->contract);
}
