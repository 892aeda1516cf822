/* flashattn report: how busy the machine is with other work. The 1-minute load average lags by a minute (after a
 * build it still reads 2-4 on an idle machine) and counts our own threads; what disturbs a timing is CPU time
 * other processes take while it runs, so that is what is measured: the busy time of all CPUs (/proc/stat, niced
 * work and time stolen by the hypervisor included) minus this process's own (getrusage), over a window. Linux
 * only; elsewhere the figures are unknown (-1) and nothing waits. The report's points account for it here. */
#include "report.h"

#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

void cpu_clock_now(cpu_clock *c) {
    c->wall = now_ms() / 1e3;
    c->busy = -1;
    struct rusage ru;
    c->self = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                                                     (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec
                                               : 0;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return;
    unsigned long long user, nice, sys, idle, iowait, irq, softirq, steal;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &sys, &idle, &iowait, &irq, &softirq,
               &steal) == 8) {
        const long hz = sysconf(_SC_CLK_TCK);
        c->busy = (double)(user + nice + sys + irq + softirq + steal) / (double)(hz > 0 ? hz : 100);
    }
    fclose(f);
}

double cpu_others(const cpu_clock *a, const cpu_clock *b) {
    const double dt = b->wall - a->wall;
    if (a->busy < 0 || b->busy < 0 || dt <= 0) return -1;
    const double o = ((b->busy - a->busy) - (b->self - a->self)) / dt;
    return o > 0 ? o : 0; /* the two clocks tick at different times: a quiet window can read slightly below 0 */
}

double quiet_threshold(void) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return 0.1 + 0.1 * (double)(n > 0 ? n : 1);
}

double quiet_wait(double max_wait_s, double *waited_s) {
    const double window = 0.25, limit = quiet_threshold();
    double others = -1, waited = 0;
    for (;;) {
        cpu_clock a, b;
        cpu_clock_now(&a);
        const struct timespec ts = {0, (long)(window * 1e9)};
        nanosleep(&ts, NULL);
        cpu_clock_now(&b);
        others = cpu_others(&a, &b);
        waited += b.wall - a.wall;
        if (others < 0 || others <= limit || waited >= max_wait_s) break;
    }
    if (waited_s) *waited_s = waited;
    return others;
}

int row_disturbed(double others) { return others > quiet_threshold(); }

/* Shortest measuring window: 50 ticks of the kernel's 10 ms busy-time clock, so that a tick more or less is 2 %. */
#define FA_WINDOW_S 0.5

void report_window_close(report *R) {
    if (R->window.wall < 0) return;
    cpu_clock now;
    cpu_clock_now(&now);
    const double o = cpu_others(&R->window, &now), dt = now.wall - R->window.wall;
    for (int k = 0; k < R->n_pending; k++) {
        if (R->pending[k].rows && R->pending[k].i < R->pending[k].rows->n)
            R->pending[k].rows->others[R->pending[k].i] = o;
        else if (R->pending[k].slot)
            *R->pending[k].slot = o;
    }
    R->n_pending = 0;
    R->window.wall = -1;
    if (o < 0) return;
    R->others_mean = (R->others_mean * R->others_weight + o * dt) / (R->others_weight + dt);
    R->others_weight += dt;
    if (o > R->others_max) R->others_max = o;
    R->windows++;
    R->busy_windows += row_disturbed(o);
}

void report_window_row(report *R, rows_t *rows, int i, double *slot) {
    if (R->window.wall < 0) cpu_clock_now(&R->window); /* a row measured outside a window: open one now */
    if (R->n_pending == (int)(sizeof R->pending / sizeof R->pending[0])) report_window_close(R);
    if (R->window.wall < 0) cpu_clock_now(&R->window);
    R->pending[R->n_pending].rows = rows, R->pending[R->n_pending].i = i, R->pending[R->n_pending].slot = slot;
    R->n_pending++;
}

/* A point is about to be measured. A window at least FA_WINDOW_S long is closed; if other processes kept the CPUs
 * busy in it, first wait for them to leave (each wait at most a quarter of the run's allowance, so that one long job
 * does not use all of it at once). Then the point joins the open window, or opens one. */
static void window_begin(report *R) {
    if (R->window.wall >= 0) {
        cpu_clock now;
        cpu_clock_now(&now);
        if (now.wall - R->window.wall < FA_WINDOW_S) return;
        const int busy0 = R->busy_windows;
        report_window_close(R);
        const double left = R->p.max_wait - R->waited;
        if (R->busy_windows > busy0 && left > 0) {
            double w = 0;
            quiet_wait(left < R->p.max_wait / 4 ? left : R->p.max_wait / 4, &w);
            R->waited += w;
        }
    }
    cpu_clock_now(&R->window);
}

void report_probe_reading(report *R) {
    if (!R->probe.ctx) return;
    const int i = probe_add(&R->probe, probe_time(&R->probe));
    if (i >= 0) report_window_row(R, NULL, 0, &R->probe.others[i]);
}

/* The speed probe is read in the point's window, so that a reading taken while others were busy is known. */
void report_point_begin(report *R) {
    window_begin(R);
    report_probe_reading(R);
}
