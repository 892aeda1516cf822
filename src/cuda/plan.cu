/* The CUDA plan: for a validated problem, the one decision of what runs (fa_cuda_plan), or FA_ERR_UNSUPPORTED with
 * the reason naming the argument. It picks a row of the family table (family.h): an explicit algorithm its row or
 * the row's reason, FA_ALGO_AUTO the first row in the table's order that runs the call. The row fills the kernel,
 * tiles and launch shape; its traffic model and workspace layout (a dry run) complete the plan, which fa_cuda_run
 * (backend.cu) executes. Host code only. */
#include "plan.h"

#include <stdio.h>
#include <string.h>

/* Row i's pick, on a plan zeroed but for its algorithm and family. */
static fa_status fa_try_row(const fa_cuda_tuning *tu, const fa_problem *p, int i, fa_plan *plan, char *why,
                            size_t why_len) {
    const fa_cuda_family *f = fa_cuda_families[i];
    memset(plan, 0, sizeof *plan);
    plan->algo = f->algo;
    plan->family = i;
    fa_status rc = f->pick(tu, p, plan, why, why_len);
    if (rc == FA_OK) f->traffic(p, plan);
    return rc;
}

/* An explicit algorithm: its row for the pass and the inputs' dtype (a FLASH3 FP8 row would sit beside the 16-bit
 * one), else its first row for the pass, whose pick says why; or why there is none. */
static fa_status fa_plan_explicit(const fa_cuda_tuning *tu, const fa_problem *p, int pass, fa_plan *plan, char *why,
                                  size_t why_len) {
    const char *other = NULL;
    int first = -1;
    for (int i = 0; i < FA_CUDA_FAMILIES; ++i) {
        const fa_cuda_family *f = fa_cuda_families[i];
        if (f->algo != p->algo) continue;
        if (!(f->passes & pass)) {
            other = f->name;
            continue;
        }
        if (f->dtypes & FA_CUDA_DT(p->dtype)) return fa_try_row(tu, p, i, plan, why, why_len);
        if (first < 0) first = i;
    }
    if (first >= 0) return fa_try_row(tu, p, first, plan, why, why_len);
    const char *dir = pass == FA_CUDA_BWD ? "backward" : "forward";
    if (other) /* a forward-only family: the backward of its out and LSE is FLASH2's */
        return fa_cuda_unsupported(why, why_len,
                                   "FA_ALGO_%s has no %s yet: run the %s with FA_ALGO_FLASH2 or FA_ALGO_AUTO "
                                   "(%s's LSE is FLASH2's)",
                                   other, dir, dir, other);
    return fa_cuda_unsupported(why, why_len, "algo %s is not implemented on CUDA", fa_algo_name(p->algo));
}

/* FA_ALGO_AUTO: the first auto_pick row of the pass that runs the call. The reasons of the rows from FLASH2's on
 * (the algorithm AUTO stands for) are reported when none does. */
static fa_status fa_plan_auto(const fa_cuda_tuning *tu, const fa_problem *p, int pass, fa_plan *plan, char *why,
                              size_t why_len) {
    char all[512] = "", one[256];
    size_t used = 0;
    int reported = 0;
    for (int i = 0; i < FA_CUDA_FAMILIES; ++i) {
        const fa_cuda_family *f = fa_cuda_families[i];
        if (!f->auto_pick || !(f->passes & pass)) continue;
        reported |= f->algo == p->algo;
        one[0] = 0;
        const fa_status rc = fa_try_row(tu, p, i, plan, one, sizeof one);
        if (rc != FA_ERR_UNSUPPORTED) return rc;
        if (reported && used < sizeof all)
            used += (size_t)snprintf(all + used, sizeof all - used, "; %s: %s", f->name, one);
    }
    return fa_cuda_unsupported(why, why_len, "FA_ALGO_AUTO: no CUDA algorithm runs the call%s", all);
}

extern "C" fa_status fa_cuda_plan(const fa_context *ctx, const fa_problem *p, fa_plan *plan, char *why, size_t why_len) {
    memset(plan, 0, sizeof *plan);
    plan->algo = p->algo;
    if (fa_problem_empty(p)) { /* no (query, key) pair: constant outputs, whatever the algorithm (zero_fill.cu) */
        plan->zero_fill = 1;
        plan->kernel = "cuda.zero_fill";
        plan->write_bytes = fa_zero_fill_bytes(p);
        return FA_OK;
    }
    if (p->sq_max > INT32_MAX / 2 || p->sk_max > INT32_MAX / 2 || p->q.seqlen > INT32_MAX / 2 ||
        p->k.seqlen > INT32_MAX / 2)
        return fa_cuda_unsupported(why, why_len, "seqlen: CUDA kernels index rows with int32 (seqlen must be < 2^30)");
    if (p->batch > 65535 || p->hq > 65535)
        return fa_cuda_unsupported(why, why_len, "batch %lld x heads %lld: CUDA grid limit is 65535 per dimension",
                                   (long long)p->batch, (long long)p->hq);
    const fa_cuda_tuning *tu = fa_cuda_tuning_of(ctx);
    const int pass = p->is_backward ? FA_CUDA_BWD : FA_CUDA_FWD;
    const fa_status rc = p->algo_auto ? fa_plan_auto(tu, p, pass, plan, why, why_len)
                                      : fa_plan_explicit(tu, p, pass, plan, why, why_len);
    if (rc != FA_OK) return rc;
    fa_contract_traffic(p, fa_cuda_families[plan->family]->checks_outputs, plan);
    fa_arena a = fa_arena_dry();
    fa_cuda_ws w;
    fa_cuda_ws_layout(&a, p, plan, &w);
    plan->workspace_bytes = a.size;
    return FA_OK;
}
