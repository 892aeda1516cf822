/* Per-head views of a validated problem: the row-0 pointers and row strides one work item reads and writes. */
#include "cpu/tiles/tiles.h"

#include <string.h>

void fa_cpu_head(const fa_problem *p, int64_t b, int64_t h, fa_head *hd) {
    size_t es = fa_dtype_size(p->dtype);
    int64_t hk = h / (p->hq / p->hk);
    memset(hd, 0, sizeof *hd);
    hd->sq = fa_seqlen_q(p, b);
    hd->sk = fa_seqlen_k(p, b);
    hd->q = (const char *)p->q.data + fa_row0(p, &p->q, 0, b, h) * es;
    hd->k = (const char *)p->k.data + fa_row0(p, &p->k, 1, b, hk) * es;
    hd->v = (const char *)p->v.data + fa_row0(p, &p->v, 1, b, hk) * es;
    hd->o = (char *)p->o.data + fa_row0(p, &p->o, 0, b, h) * es;
    hd->ldq = p->q.stride_seq;
    hd->ldk = p->k.stride_seq;
    hd->ldv = p->v.stride_seq;
    hd->ldo = p->o.stride_seq;
    hd->lse = p->lse ? p->lse + fa_lse0(p, b, h) : NULL;
    hd->sink = p->sinks ? p->sinks + h : NULL;
    if (p->is_backward) {
        hd->dout = (const char *)p->dout.data + fa_row0(p, &p->dout, 0, b, h) * es;
        hd->dq = (char *)p->dq.data + fa_row0(p, &p->dq, 0, b, h) * es;
        hd->dk = (char *)p->dk.data + fa_row0(p, &p->dk, 1, b, hk) * es;
        hd->dv = (char *)p->dv.data + fa_row0(p, &p->dv, 1, b, hk) * es;
        hd->lddo = p->dout.stride_seq;
        hd->lddq = p->dq.stride_seq;
        hd->lddk = p->dk.stride_seq;
        hd->lddv = p->dv.stride_seq;
    }
}
