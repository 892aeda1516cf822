/* The CPU kernel levels (docs/cpu-kernels.md, "Runtime dispatch"): FA_CPU_ISA pins a level or context creation
 * fails (never a silent fallback), and the kernels fa_stats names are the pinned level's. The levels this CPU has
 * are read here with the compiler's own CPUID test, apart from the library's dispatcher: each of them must create a
 * context whose calls run that level's kernels, each it lacks must fail with FA_ERR_UNSUPPORTED and a message that
 * names FA_CPU_ISA. AMX also needs the OS's and Linux's consent, which only the library asks for: either outcome
 * passes there, as long as it is one of the two. Without FA_CPU_ISA, the highest level runs. */
#include "testlib.h"

#include <stdlib.h>
#include <string.h>

static const char *const levels[] = {"scalar", "avx2", "avx512f", "avx512bf16", "amx"};
enum { N_LEVELS = 5, AMX = 4 };

/* 1 if the CPU has level i (AMX: -1, unknown here). */
static int cpu_has(int i) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    const int f = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const int bf16 = f && __builtin_cpu_supports("avx512bf16");
    const int has[N_LEVELS] = {1, avx2, f, bf16, -1};
    return has[i];
#else
    return i == 0 ? 1 : i == AMX ? 0 : 0;
#endif
}

/* The kernels of one f32 and one bf16 forward (FLASH2, STANDARD) on ctx; each must end in ".<level>". */
static void run_forwards(fa_context *ctx, const char *level) {
    enum { S = 24, D = 16 };
    static float q[S * D], k[S * D], v[S * D], o[S * D];
    static uint16_t qb[S * D], kb[S * D], vb[S * D], ob[S * D];
    for (int i = 0; i < S * D; i++) {
        q[i] = k[i] = v[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
        t_store(qb, FA_DTYPE_BF16, i, q[i]);
    }
    memcpy(kb, qb, sizeof kb), memcpy(vb, qb, sizeof vb);
    const fa_algo algos[] = {FA_ALGO_FLASH2, FA_ALGO_STANDARD, FA_ALGO_FLASH1};
    for (int dt = 0; dt < 2; dt++)
        for (int a = 0; a < 3; a++) {
            fa_attn_opts opts = fa_attn_opts_default();
            opts.algo = algos[a];
            const fa_dtype t = dt ? FA_DTYPE_BF16 : FA_DTYPE_F32;
            fa_tensor tq = fa_tensor_bshd(dt ? (void *)qb : q, t, 1, S, 1, D),
                      tk = fa_tensor_bshd(dt ? (void *)kb : k, t, 1, S, 1, D),
                      tv = fa_tensor_bshd(dt ? (void *)vb : v, t, 1, S, 1, D),
                      to = fa_tensor_bshd(dt ? (void *)ob : o, t, 1, S, 1, D);
            CHECK_STATUS(fa_forward(ctx, &opts, &tq, &tk, &tv, &to, NULL), FA_OK);
            fa_stats st;
            CHECK_STATUS(fa_last_stats(ctx, &st), FA_OK);
            const char *dot = st.kernel ? strrchr(st.kernel, '.') : NULL;
            CHECK_MSG(dot && !strcmp(dot + 1, level), "FA_CPU_ISA=%s ran %s", level, st.kernel ? st.kernel : "(none)");
        }
}

int main(void) {
    t_init("test_levels");
    const char *saved = getenv("FA_CPU_ISA");
    char keep[64] = "";
    if (saved) snprintf(keep, sizeof keep, "%s", saved);
    int best = 0;
    for (int i = 0; i < N_LEVELS; i++) {
        snprintf(t_case_label, sizeof t_case_label, "FA_CPU_ISA=%s", levels[i]);
        setenv("FA_CPU_ISA", levels[i], 1);
        fa_context *ctx = NULL;
        const fa_status st = fa_context_create(&ctx, FA_BACKEND_CPU, 1);
        const int has = cpu_has(i);
        printf("%s: %s%s\n", t_case_label, st == FA_OK ? "runs" : "refused: ", st == FA_OK ? "" : fa_create_error());
        if (has >= 0) CHECK_MSG((st == FA_OK) == has, "the CPU %s this level, but creation gave %s", has ? "has" : "lacks",
                                fa_status_string(st));
        if (st == FA_OK) {
            best = i;
            run_forwards(ctx, levels[i]);
        } else {
            CHECK_STATUS(st, FA_ERR_UNSUPPORTED);
            CHECK(ctx == NULL);
            CHECK_STR_CONTAINS(fa_create_error(), t_case_label);
        }
        fa_context_destroy(ctx);
    }
    /* a name that is not a level, and the former "avx512" (now two levels): refused, naming the variable */
    const char *bad[] = {"avx512", "AVX2", "sse4"};
    for (int i = 0; i < 3; i++) {
        snprintf(t_case_label, sizeof t_case_label, "FA_CPU_ISA=%s", bad[i]);
        setenv("FA_CPU_ISA", bad[i], 1);
        fa_context *ctx = NULL;
        CHECK_STATUS(fa_context_create(&ctx, FA_BACKEND_CPU, 1), FA_ERR_INVALID_ARGUMENT);
        CHECK(ctx == NULL);
        CHECK_STR_CONTAINS(fa_create_error(), t_case_label);
    }
    /* unset: the highest level this process can run */
    unsetenv("FA_CPU_ISA");
    snprintf(t_case_label, sizeof t_case_label, "FA_CPU_ISA unset");
    fa_context *ctx = NULL;
    CHECK_STATUS(fa_context_create(&ctx, FA_BACKEND_CPU, 1), FA_OK);
    if (ctx) run_forwards(ctx, levels[best]);
    fa_context_destroy(ctx);
    if (saved) setenv("FA_CPU_ISA", keep, 1);
    return t_finish();
}
