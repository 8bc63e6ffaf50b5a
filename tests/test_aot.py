"""The fused kernel compiles for the H200 (sm_90) in every family and strategy, on any machine.

The kernel tests run the kernel under Triton's interpreter on CPU machines, which accepts some
code the GPU compiler rejects; this compiles the specialisation matrix of
:mod:`rollbuf.kernels.aot` to a cubin with the ``ptxas`` shipped in Triton's wheel (no GPU, no
driver), in a subprocess without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import os
import subprocess
import sys


def test_every_kernel_variant_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "rollbuf.kernels.aot", "--arch", "90", "--jobs", "2"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    from rollbuf.kernels.aot import variants

    assert f"{len(variants())} of {len(variants())} variants compiled for sm_90" in res.stdout
