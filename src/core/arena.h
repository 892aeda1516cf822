/* One way to lay out a workspace on the host side: describe it once, run it twice. A dry run (base NULL) adds up
 * the size; the real run, over a buffer of that size, hands out the same offsets. So a workspace's size and its
 * layout come from one description and cannot drift apart:
 *
 *     static void layout(fa_arena *a, const plan *pl, parts *w) {
 *         w->S = fa_arena_take(a, pl->rows * pl->cols * sizeof(float), 64);
 *         ...
 *     }
 *     fa_arena a = fa_arena_dry(); layout(&a, pl, &w);          // a.size is what to allocate
 *     fa_arena b = fa_arena_over(buf, a.size); layout(&b, pl, &w); // w's pointers into buf
 */
#ifndef FA_ARENA_H
#define FA_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct fa_arena {
    char *base;   /* NULL: a dry run (only size is computed) */
    size_t size;  /* bytes taken so far (including alignment padding) */
    size_t cap;   /* capacity of base (real run) */
} fa_arena;

static inline fa_arena fa_arena_dry(void) {
    fa_arena a = {NULL, 0, 0};
    return a;
}
static inline fa_arena fa_arena_over(void *base, size_t cap) {
    fa_arena a = {(char *)base, 0, cap};
    return a;
}
/* bytes at an offset aligned to align (a power of two); NULL in a dry run, or if the real run would pass cap
 * (which a layout run over the dry run's size never does). */
static inline void *fa_arena_take(fa_arena *a, size_t bytes, size_t align) {
    const size_t off = (a->size + align - 1) & ~(align - 1);
    a->size = off + bytes;
    if (!a->base || a->size > a->cap) return NULL;
    return a->base + off;
}

#endif
