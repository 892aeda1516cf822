/* The testing library (tests/lib, built as fa_testlib; never part of libflashattn): the float64 oracle, test
 * tensors with poisoning, test-side fp16/bf16 conversions, the seeded random streams, the case generator, the
 * tolerance rule and the check.h harness. Used by tests/, tests/gpu/ and `flashattn check`; docs/testing.md. */
#ifndef FA_TESTLIB_H
#define FA_TESTLIB_H

#include "cases.h"
#include "check.h"
#include "dtype.h"
#include "oracle.h"
#include "rng.h"
#include "run.h"
#include "tensor.h"
#include "tolerance.h"

#endif
