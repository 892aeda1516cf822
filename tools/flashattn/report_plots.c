/* flashattn report: the gnuplot plots (a script per figure with its data inline, rendered to PNG beside it).
 *
 * Every series has one style, the same in every figure: each algorithm its colour and its marker, the PyTorch
 * references theirs, the paper's bounds black and dark grey lines wide enough to see (STYLES, written at the top of
 * every script). Legends sit to the right of the plot area, never over the data (below it, gnuplot 5.4 draws them over
 * the x label); titles and tick labels are sized to fit, and the data keep a margin from the axes. */
#include "report.h"

#include <stdlib.h>
#include <string.h>

/* The series styles, by gnuplot line-style number. Colours from the Okabe–Ito palette (distinct for colour-blind
 * readers and in greyscale print), markers filled and distinct, so a series is known by either. */
enum { LS_STANDARD = 1, LS_FLASH1, LS_FLASH2, LS_FLASH3, LS_TORCH_FLASH, LS_TORCH_CUDNN, LS_BOUND, LS_BOUND2, LS_LIMIT, LS_COUNT };
static const struct {
    const char *color;
    int pt, dt;
    double lw, ps;
} STYLES[LS_COUNT] = {
    [LS_STANDARD] = {"#D55E00", 5, 1, 2.0, 1.3},     /* vermillion, filled square */
    [LS_FLASH1] = {"#0072B2", 7, 1, 2.0, 1.3},       /* blue, filled circle */
    [LS_FLASH2] = {"#009E73", 9, 1, 2.0, 1.5},       /* bluish green, filled triangle */
    [LS_FLASH3] = {"#56B4E9", 13, 1, 2.0, 1.5},      /* sky blue, filled diamond */
    [LS_TORCH_FLASH] = {"#CC79A7", 12, 2, 1.5, 1.3}, /* reddish purple, open diamond, dashed */
    [LS_TORCH_CUDNN] = {"#E69F00", 10, 2, 1.5, 1.3}, /* orange, open triangle down, dashed */
    [LS_BOUND] = {"#000000", 0, 2, 2.5, 1.0},        /* black dashed: the standard algorithm's bound */
    [LS_BOUND2] = {"#555555", 0, 4, 2.5, 1.0},       /* dark grey dash-dot: the flash algorithms' bound */
    [LS_LIMIT] = {"#000000", 6, 1, 2.0, 2.5},        /* a limit marker: black open circle */
};
/* The algorithms' names and styles, by fa_algo (STANDARD, FLASH1, FLASH2, FLASH3: the GPU speed panels only). */
static const char *const ALGO_NAMES[5] = {"auto", "standard", "flash1", "flash2", "flash3"};
static const int ALGO_LS[5] = {0, LS_STANDARD, LS_FLASH1, LS_FLASH2, LS_FLASH3};

/* A script NAME.gp of rows × cols panels under `title`. Panels are 620 × 440 pixels with their legend (a single
 * figure 900 × 580). */
static FILE *gp_open(report *R, const char *name, const char *title, int rows, int cols) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s.gp", R->out, name);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    const int single = rows == 1 && cols == 1;
    fprintf(f, "set terminal %s size %d,%d font ',11'\nset output '%s.png'\n", R->gp_term[0] ? R->gp_term : "pngcairo",
            single ? 900 : 620 * cols + 20, single ? 580 : 440 * rows + 40, name);
    fprintf(f, "set termoption noenhanced\nset grid lc rgb '#b0b0b0' dt 3\n");
    for (int i = 1; i < LS_COUNT; i++)
        fprintf(f, "set style line %d lc rgb '%s' pt %d dt %d lw %.1f ps %.1f\n", i, STYLES[i].color, STYLES[i].pt,
                STYLES[i].dt, STYLES[i].lw, STYLES[i].ps);
    /* the legend beside the plot; a margin around the data keeps markers off the axes (not below a y range that
     * starts at 0) */
    fprintf(f, "set key outside right top vertical box samplen 4 spacing 1.2\n");
    fprintf(f, "set offsets graph 0.04, graph 0.04, graph 0.06, 0\n");
    fprintf(f, "set multiplot layout %d,%d title \"%s\" font ',12'\n", rows, cols, title);
    return f;
}

static void gp_close(report *R, FILE *f, const char *name, int *n_png) {
    fprintf(f, "unset multiplot\n");
    fclose(f);
    if (!R->gnuplot) return;
    char cmd[2600];
    snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot '%s.gp' >/dev/null 2>&1", R->out, name);
    if (system(cmd) == 0) (*n_png)++;
    else fprintf(stderr, "flashattn report: gnuplot failed on %s/%s.gp\n", R->out, name);
}

/* x tics at the powers of two from lo to hi, labelled 512, 1k, 2k, … so that none is cut at the right edge. */
static void gp_pow2_xtics(FILE *f, double lo, double hi) {
    fprintf(f, "set xtics (");
    int first = 1;
    for (double x = 1; x <= hi * 1.0001; x *= 2) {
        if (x < lo * 0.9999) continue;
        if (x >= 1024) fprintf(f, "%s\"%.0fk\" %.0f", first ? "" : ", ", x / 1024, x);
        else fprintf(f, "%s\"%.0f\" %.0f", first ? "" : ", ", x, x);
        first = 0;
    }
    fprintf(f, ")\n");
}

/* The x of a row in a speed panel: 0 seqlen, 1 batch × heads, 2 block_k. */
static double row_x(const bench_row *r, int xkind) {
    const bench_config *c = &r->cfg;
    return xkind == 0 ? (double)c->seqlen_q : xkind == 1 ? (double)(c->batch * c->heads) : (double)r->block_k;
}

/* One panel of speed vs x for the three algorithms; with R (CUDA), PyTorch SDPA rows of the same (d, causal, pass)
 * as reference lines. */
static void gp_panel(FILE *f, const rows_t *rs, int xkind, int64_t d, int causal, int bwd, int bq, const char *title,
                     const char *ylabel, double yscale, const report *R) {
    static int id = 0;
    int ids[5] = {0}, have[5] = {0};
    double xlo = 0, xhi = 0;
    for (int a = 1; a <= 4; a++) {
        ids[a] = ++id;
        fprintf(f, "$d%d << EOD\n", ids[a]);
        for (int i = 0; i < rs->n; i++) {
            const bench_row *r = &rs->v[i];
            const bench_config *c = &r->cfg;
            if ((int)r->algo != a || !r->ok || (d > 0 && c->head_dim != d) || (causal >= 0 && c->causal != causal) ||
                (bwd >= 0 && c->backward != bwd) || (bq > 0 && c->block_q != bq))
                continue;
            const double x = row_x(r, xkind);
            fprintf(f, "%g %g\n", x, r->gflops * yscale);
            if (!xlo || x < xlo) xlo = x;
            if (x > xhi) xhi = x;
            have[a] = 1;
        }
        fprintf(f, "EOD\n");
    }
    fprintf(f, "set title \"%s\"\nset xlabel \"%s\"\nset ylabel \"%s\"\nset logscale x 2\nset yrange [0:*]\n", title,
            xkind == 0 ? "sequence length" : xkind == 1 ? "batch × heads" : "Bc (block_k)", ylabel);
    if (xhi > 0) gp_pow2_xtics(f, xlo, xhi);
    static const char *TN[2] = {"torch-flash", "torch-cudnn"};
    int tid[2] = {0, 0}, thave[2] = {0, 0};
    for (int t = 0; R && t < 2; t++) {
        tid[t] = ++id;
        fprintf(f, "$d%d << EOD\n", tid[t]);
        for (int i = 0; i < R->n_torch; i++) {
            const torch_row *x = &R->torch[i];
            if (strcmp(x->name, TN[t]) != 0 || x->d != d || x->causal != causal || x->bwd != bwd) continue;
            fprintf(f, "%lld %g\n", (long long)x->n, x->tflops * 1e3 * yscale);
            thave[t] = 1;
        }
        fprintf(f, "EOD\n");
    }
    int first = 1;
    for (int a = 1; a <= 4; a++) {
        if (!have[a]) continue;
        fprintf(f, "%s $d%d with linespoints ls %d title '%s'", first ? "plot" : ",", ids[a], ALGO_LS[a], ALGO_NAMES[a]);
        first = 0;
    }
    for (int t = 0; t < 2; t++) {
        if (!thave[t]) continue;
        fprintf(f, "%s $d%d with linespoints ls %d title '%s'", first ? "plot" : ",", tid[t],
                t ? LS_TORCH_CUDNN : LS_TORCH_FLASH, TN[t]);
        first = 0;
    }
    if (first) fprintf(f, "set label 1 'no data' at graph 0.4,0.5\nplot 1/0 notitle\nunset label 1");
    fprintf(f, "\n");
}

static void plots_device(report *R, const dev_data *D, int *n_png, char names[][64], int *n_names) {
    const char *dn = fa_backend_name(D->dev);
    int cuda = D->dev == FA_BACKEND_CUDA;
    const char *yl = cuda ? "TFLOP/s" : "GFLOP/s";
    double ys = cuda ? 1e-3 : 1;
    char name[64], t[160];
    for (int bwd = 0; bwd < 2; bwd++) {
        snprintf(name, sizeof name, "speed_%s_%s", dn, bwd ? "bwd" : "fwd");
        snprintf(t, sizeof t, "%s, %s: speed vs sequence length (%s)", dn, bwd ? "backward" : "forward",
                 cuda ? "bf16" : "fp32");
        FILE *f = gp_open(R, name, t, 2, 2);
        if (!f) continue;
        for (int d = 64; d <= 128; d *= 2)
            for (int c = 0; c < 2; c++) {
                char pt[64];
                snprintf(pt, sizeof pt, "d = %d, %s", d, c ? "causal" : "not causal");
                gp_panel(f, &D->speed, 0, d, c, bwd, 0, pt, yl, ys, cuda ? R : NULL);
            }
        gp_close(R, f, name, n_png);
        snprintf(names[(*n_names)++], 64, "%s", name);
    }
    snprintf(name, sizeof name, "parallel_%s", dn);
    snprintf(t, sizeof t, "%s: speed vs batch × heads (batch 1, N = %lld, d = 64)", dn,
             D->par.n ? (long long)D->par.v[0].cfg.seqlen_q : 0LL);
    FILE *f = gp_open(R, name, t, 1, 2);
    if (f) {
        gp_panel(f, &D->par, 1, 64, -1, 0, 0, "forward", yl, ys, NULL);
        gp_panel(f, &D->par, 1, 64, -1, 1, 0, "backward", yl, ys, NULL);
        gp_close(R, f, name, n_png);
        snprintf(names[(*n_names)++], 64, "%s", name);
    }
    snprintf(name, sizeof name, "blocks_%s", dn);
    snprintf(t, sizeof t, "%s: forward speed vs tile size (N = %lld, d = 64)", dn,
             D->blocks.n ? (long long)D->blocks.v[0].cfg.seqlen_q : 0LL);
    int bqs[8], nbq = 0;
    for (int i = 0; i < D->blocks.n; i++) {
        int bq = D->blocks.v[i].cfg.block_q, seen = 0;
        for (int j = 0; j < nbq; j++) seen |= bqs[j] == bq;
        if (!seen && nbq < 8) bqs[nbq++] = bq;
    }
    f = gp_open(R, name, t, 1, nbq > 0 ? nbq : 1);
    if (f) {
        for (int j = 0; j < nbq; j++) {
            char pt[64];
            snprintf(pt, sizeof pt, "Br = %d", bqs[j]);
            gp_panel(f, &D->blocks, 2, 64, -1, 0, bqs[j], pt, yl, ys, NULL);
        }
        gp_close(R, f, name, n_png);
        snprintf(names[(*n_names)++], 64, "%s", name);
    }
    snprintf(name, sizeof name, "memory_%s", dn);
    f = gp_open(R, name, "peak extra memory vs sequence length (batch 1, 1 head, d = 64, forward)", 1, 1);
    if (f) {
        fprintf(f, "set logscale x 2\nset logscale y 10\nset format y '%%g'\nset offsets graph 0.04, graph 0.04, 0, 0\n"
                   "set xlabel 'sequence length'\nset ylabel 'extra memory (MB)'\nset title ''\n");
        double xlo = 0, xhi = 0;
        for (int a = 1; a <= 3; a++) {
            fprintf(f, "$m%d << EOD\n", a);
            for (int i = 0; i < D->mem.n; i++)
                if ((int)D->mem.v[i].algo == a && D->mem.v[i].ok && D->mem.v[i].extra_bytes > 0) {
                    const double x = (double)D->mem.v[i].cfg.seqlen_q;
                    fprintf(f, "%lld %g\n", (long long)x, (double)D->mem.v[i].extra_bytes / 1e6);
                    if (!xlo || x < xlo) xlo = x;
                    if (x > xhi) xhi = x;
                }
            fprintf(f, "EOD\n");
        }
        const bench_row *probe = D->probe_n ? find_row(&D->mem, FA_ALGO_STANDARD, 64, D->probe_n, 0, 0, 1, -1, -1) : NULL;
        const int shown = probe && !probe->ok;
        if (shown) {
            fprintf(f, "$probe << EOD\n%lld %g\nEOD\n", (long long)D->probe_n, D->probe_need / 1e6);
            if ((double)D->probe_n > xhi) xhi = (double)D->probe_n;
        }
        if (xhi > 0) gp_pow2_xtics(f, xlo, xhi);
        int first = 1;
        for (int a = 1; a <= 3; a++) {
            fprintf(f, "%s $m%d with linespoints ls %d title '%s'", first ? "plot" : ",", a, ALGO_LS[a], ALGO_NAMES[a]);
            first = 0;
        }
        if (shown)
            fprintf(f, ", $probe with points ls %d title 'standard would need %.0f GB: %s'", LS_LIMIT, D->probe_need / 1e9,
                    probe->status);
        fprintf(f, "\n");
        gp_close(R, f, name, n_png);
        snprintf(names[(*n_names)++], 64, "%s", name);
    }
}

static void plots_io(report *R, int *n_png, char names[][64], int *n_names) {
    FILE *f = gp_open(R, "io_seqlen", "slow-memory bytes (counted) vs sequence length, d = 64, forward", 1, 1);
    if (f) {
        fprintf(f, "set logscale x 2\nset logscale y 10\nset format y '%%g'\nset offsets graph 0.04, graph 0.04, 0, 0\n"
                   "set xlabel 'sequence length N'\nset ylabel 'MB moved'\nset title ''\n");
        double xlo = 0, xhi = 0;
        for (int a = 1; a <= 3; a++) {
            fprintf(f, "$c%d << EOD\n", a);
            for (int i = 0; i < R->io_seqlen.n; i++)
                if ((int)R->io_seqlen.v[i].algo == a && R->io_seqlen.v[i].ok) {
                    const double x = (double)R->io_seqlen.v[i].seqlen;
                    fprintf(f, "%lld %g %g\n", (long long)x,
                            (double)(R->io_seqlen.v[i].read_bytes + R->io_seqlen.v[i].write_bytes) / 1e6,
                            R->io_seqlen.v[i].paper_bytes / 1e6);
                    if (!xlo || x < xlo) xlo = x;
                    if (x > xhi) xhi = x;
                }
            fprintf(f, "EOD\n");
        }
        if (xhi > 0) gp_pow2_xtics(f, xlo, xhi);
        fprintf(f, "plot $c1 u 1:2 w lp ls %d t 'standard (counted)', $c2 u 1:2 w lp ls %d t 'flash1 (counted)', "
                   "$c3 u 1:2 w lp ls %d t 'flash2 (counted)', $c1 u 1:3 w l ls %d t 'bound Nd + N² (×4 B)', "
                   "$c2 u 1:3 w l ls %d t 'bound N²d²/M (×4 B)'\n",
                LS_STANDARD, LS_FLASH1, LS_FLASH2, LS_BOUND, LS_BOUND2);
        gp_close(R, f, "io_seqlen", n_png);
        snprintf(names[(*n_names)++], 64, "io_seqlen");
    }
    f = gp_open(R, "io_sram", "slow-memory bytes vs fast-memory size M, d = 64 (the paper's blocks: Bc = M/4d, Br = min(Bc, d))",
                1, 1);
    if (f) {
        fprintf(f, "set logscale x 2\nset logscale y 10\nset format y '%%g'\nset offsets graph 0.04, graph 0.04, 0, 0\n"
                   "set xlabel 'M (KiB)'\nset ylabel 'MB moved'\nset title ''\n");
        double xlo = 0, xhi = 0;
        for (int a = 2; a <= 3; a++) {
            fprintf(f, "$s%d << EOD\n", a);
            for (int i = 0; i < R->io_sram.n; i++)
                if ((int)R->io_sram.v[i].algo == a && R->io_sram.v[i].ok) {
                    const double x = (double)R->io_sram.v[i].sram_bytes / 1024;
                    fprintf(f, "%g %g %g\n", x, (double)(R->io_sram.v[i].read_bytes + R->io_sram.v[i].write_bytes) / 1e6,
                            R->io_sram.v[i].paper_bytes / 1e6);
                    if (!xlo || x < xlo) xlo = x;
                    if (x > xhi) xhi = x;
                }
            fprintf(f, "EOD\n");
        }
        if (xhi > 0) gp_pow2_xtics(f, xlo, xhi);
        fprintf(f, "plot $s2 u 1:2 w lp ls %d t 'flash1 (counted)', $s3 u 1:2 w lp ls %d t 'flash2 (counted)', "
                   "$s2 u 1:3 w l ls %d t 'bound N²d²/M (×4 B)'\n",
                LS_FLASH1, LS_FLASH2, LS_BOUND2);
        gp_close(R, f, "io_sram", n_png);
        snprintf(names[(*n_names)++], 64, "io_sram");
    }
}

int report_plots(report *R, char names[][64], int *n_names) {
    int n_png = 0;
    if (R->cpu.present) {
        plots_device(R, &R->cpu, &n_png, names, n_names);
        plots_io(R, &n_png, names, n_names);
    }
    if (R->cuda) plots_device(R, &R->gpu, &n_png, names, n_names);
    return n_png;
}
