/* What both fuzz harnesses share: the input read as a stream of choices (bytes, then a xorshift stream seeded from
 * them), the buffers a harness hands the library (memory and a snapshot), and FAIL. Define FUZZ_NAME first. */
#ifndef FA_FUZZ_INPUT_H
#define FA_FUZZ_INPUT_H

#include "flashattn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static char desc[512]; /* the call being checked, printed with a finding */
#define FAIL(...) (fprintf(stderr, FUZZ_NAME ": " __VA_ARGS__), fprintf(stderr, "\n  call: %s\n", desc), abort())

typedef struct rd { const uint8_t *p; size_t n, i; uint64_t s; } rd;
static unsigned byte(rd *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static unsigned pick(rd *r, unsigned n) { return byte(r) % n; }
static uint64_t rnd(rd *r) { r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17; return r->s; }
static double uni(rd *r) { return (double)(rnd(r) >> 11) / 9007199254740992.0 * 2 - 1; }

typedef struct buf { fa_tensor t; uint8_t *mem, *copy; size_t bytes; } buf;

static size_t es_of(fa_dtype dt) { return dt == FA_DTYPE_F32 ? 4 : 2; }

#endif
