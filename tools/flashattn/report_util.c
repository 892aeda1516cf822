/* flashattn report: the helpers its parts share (the progress bar, the CSV files, row lists, bench rows without
 * printing). They call only bench/io below them, never a part of the report, so the parts stay a tree under
 * report.c. */
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------------------
 * Progress bar (stderr)
 * ------------------------------------------------------------------------------------------------------- */
void report_progress(report *R, const char *what) {
    double frac = R->work_total > 0 ? R->work_done / R->work_total : 0;
    if (frac > 1) frac = 1;
    double el = (now_ms() - R->t0) / 1e3;
    int w = 30, fill = (int)(frac * w + 0.5);
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    /* on a terminal: one line redrawn; otherwise a line per section (the words before " cpu"/" cuda"/" N=") */
    char section[128];
    snprintf(section, sizeof section, "%s", what);
    char *cut = strstr(section, " cpu");
    if (!cut) cut = strstr(section, " cuda");
    if (!cut) cut = strstr(section, " N=");
    if (cut) *cut = 0;
    if (R->tty)
        fprintf(stderr, "\r[%s] %3.0f%% %5.0fs  %-48.48s", bar, 100 * frac, el, what);
    else if (section[0] && strcmp(section, R->last_section) != 0)
        fprintf(stderr, "[%s] %3.0f%% %5.0fs  %s\n", bar, 100 * frac, el, section);
    snprintf(R->last_section, sizeof R->last_section, "%s", section);
    fflush(stderr);
}

/* ---------------------------------------------------------------------------------------------------------
 * Rows and CSV files
 * ------------------------------------------------------------------------------------------------------- */
/* v (n elements of `size` bytes used of *cap) with room for one more: v itself, a larger block, or NULL when out of
 * memory (v then unchanged). */
static void *grow(void *v, int n, int *cap, size_t size) {
    if (n < *cap) return v;
    const int c = *cap ? 2 * *cap : 64;
    void *p = realloc(v, (size_t)c * size);
    if (p) *cap = c;
    return p;
}

void rows_push(rows_t *r, const bench_row *x, double others) {
    int cap = r->cap;
    bench_row *v = grow(r->v, r->n, &cap, sizeof *x);
    if (!v) return;
    r->v = v;
    if (cap != r->cap) { /* the others array follows the rows' capacity */
        double *o = realloc(r->others, (size_t)cap * sizeof *o);
        if (!o) return;
        r->others = o;
        r->cap = cap;
    }
    r->others[r->n] = others;
    r->v[r->n++] = *x;
}

int io_rows_push(io_rows_t *r, const io_row *x) {
    io_row *v = grow(r->v, r->n, &r->cap, sizeof *x);
    if (!v) return -1;
    r->v = v;
    r->v[r->n++] = *x;
    return 0;
}

static void push_row(const bench_row *r, void *user) { rows_push(user, r, -1); }

void report_bench_rows(int argc, char **argv, rows_t *rows) {
    bench_sink sink = {NULL, NULL, push_row, NULL, rows};
    bench_run_args(argc, argv, &sink);
}

FILE *report_csv(report *R, const char *name, int kind) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", R->out, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "flashattn report: cannot write %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (kind == 0) bench_csv_header(f, 1);
    else if (kind == 1) io_csv_header(f);
    else if (kind == 3) bench_kvcache_csv_header(f);
    else fprintf(f, "algo,batch,heads,seqlen,head_dim,kernels,dram_read_bytes,dram_write_bytes,model_read_bytes,"
                    "model_write_bytes,compulsory_bytes\n");
    return f;
}

void claim_disturbed(claim *c, int busy, int total) {
    c->kind = V_NOT_SETTLED;
    snprintf(c->verdict, sizeof c->verdict,
             "**not settled**: %d of its %d measurements ran while other processes kept the CPUs busy (see the "
             "header); run again on a quiet machine",
             busy, total);
}

double cross_ratio(double a, double a_lo, double a_hi, double b, double b_lo, double b_hi, double *lo, double *hi) {
    const double r = a / b, ha = (a_hi - a_lo) / (2 * a), hb = (b_hi - b_lo) / (2 * b), h = sqrt(ha * ha + hb * hb);
    *lo = r * (1 - h), *hi = r * (1 + h);
    return r;
}
