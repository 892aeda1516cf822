"""flashattn and torch coexist in either import order (docs/python.md, "PyTorch's CUDA libraries"): importing
flashattn loads neither NCCL nor a shared CUDA runtime, which a torch imported after it would bind to in place of
its own (it failed with "libtorch_cuda.so: undefined symbol: ncclCommResume")."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

LINUX = sys.platform.startswith("linux")


def run(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"{code!r} failed:\n{r.stderr[-2000:]}"
    return r.stdout


@pytest.mark.parametrize("first", ["flashattn", "torch"])
def test_import_orders(first):
    second = "torch" if first == "flashattn" else "flashattn"
    out = run(f"import {first}, {second}\n"
              "q = torch.randn(1, 4, 2, 8)\n"
              "print(tuple(flashattn.flash_attn_func(q, q, q).shape), torch.cuda.is_available())")
    assert out.startswith("(1, 4, 2, 8)")


@pytest.mark.skipif(not LINUX, reason="reads /proc/self/maps")
def test_import_loads_no_nccl_or_cudart():
    out = run("import flashattn\n"
              "maps = open('/proc/self/maps').read()\n"
              "print(sorted({l.split()[-1] for l in maps.splitlines() if 'libnccl' in l or 'libcudart' in l}))")
    assert out.strip() == "[]", out
