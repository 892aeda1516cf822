import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Relative tolerance per storage dtype, against float64 math on the same (rounded) inputs: a few units of the
# dtype's rounding, since accumulation is fp32 everywhere (fp32: the header's 1e-5 relative error).
TOL = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def assert_close(got, ref, dtype, name, factor=1.0):
    got = np.asarray(got, dtype=np.float64)
    err = np.max(np.abs(got - ref)) if got.size else 0.0
    bound = factor * TOL[dtype] * max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g} ({dtype})"


@pytest.fixture
def rng():
    seed = int(os.environ.get("FA_TEST_SEED", "1234"))
    return np.random.default_rng(seed)
