/* The workspace frame of every CPU run (cpu.h): one description, laid out twice through core/arena.h. */
#include "cpu/cpu.h"

#include <string.h>

/* Where the dry runs write the pointers they compute (and nobody reads). */
typedef union scratch {
    max_align_t align;
    char bytes[FA_CPU_LAYOUT_STRUCT_MAX];
} scratch;

/* Slices, counters, shared parts, over a (dry or real). */
static void lay_out(fa_arena *a, fa_cpu_frame *f, const fa_cpu_layout *l, const void *p, const fa_plan *pl) {
    scratch s;
    fa_arena one = fa_arena_dry();
    l->thread(&one, p, pl, &s);
    f->layout = l, f->p = p, f->pl = pl;
    f->threads = pl->threads;
    f->per = (one.size + 63) & ~(size_t)63;
    f->slices = fa_arena_take(a, f->per * (size_t)f->threads, 64);
    f->io = fa_arena_take(a, sizeof(fa_io) * (size_t)f->threads, 64);
    f->shared = NULL, f->shared_bytes = 0;
    if (l->shared) {
        fa_arena parts = fa_arena_dry();
        l->shared(&parts, p, pl, &s);
        f->shared_bytes = parts.size;
        f->shared = fa_arena_take(a, parts.size, 64);
    }
}

size_t fa_cpu_frame_bytes(const fa_cpu_layout *l, const void *p, const fa_plan *pl) {
    fa_arena a = fa_arena_dry();
    fa_cpu_frame f;
    lay_out(&a, &f, l, p, pl);
    return a.size;
}

void fa_cpu_frame_open(fa_cpu_frame *f, const fa_cpu_layout *l, const void *p, const fa_plan *pl, void *ws) {
    fa_arena a = fa_arena_over(ws, pl->workspace_bytes);
    lay_out(&a, f, l, p, pl);
    memset(f->io, 0, sizeof(fa_io) * (size_t)f->threads);
}

/* The shared parts start 64-aligned: laid out from there, their offsets are those of the dry run. */
void fa_cpu_frame_shared(const fa_cpu_frame *f, void *parts) {
    fa_arena a = fa_arena_over(f->shared, f->shared_bytes);
    f->layout->shared(&a, f->p, f->pl, parts);
}

fa_io *fa_cpu_frame_thread(const fa_cpu_frame *f, void *tiles) {
    const int t = fa_thread_id();
    fa_arena a = fa_arena_over(f->slices + (size_t)t * f->per, f->per);
    f->layout->thread(&a, f->p, f->pl, tiles);
    return &f->io[t];
}

void fa_cpu_frame_total(const fa_cpu_frame *f, fa_io *io) {
    for (int t = 0; t < f->threads; t++) {
        io->read += f->io[t].read;
        io->written += f->io[t].written;
        io->uncertified += f->io[t].uncertified;
    }
}
