"""The fused kernel compiles for the H200 (sm_90) in every family and strategy, on any machine.

The kernel tests run the kernel under Triton's interpreter on CPU machines, which accepts some
code the GPU compiler rejects; this compiles the specialisation matrix of
:mod:`tools.aot` to a cubin with the ``ptxas`` shipped in Triton's wheel (no GPU, no
driver), in a subprocess without ``TRITON_INTERPRET``. By default a covering slice of the matrix
(every family in every pass, every mode and every variant option at least once); the whole matrix
with ``-m exhaustive`` (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from covering import covering

ROOT = Path(__file__).resolve().parents[1]  # python -m tools.aot runs from the repository root


def covering_variants() -> list[str]:
    """Names of a covering slice of :func:`tools.aot.variants`: each variant described by
    its kernel (``gae``, ``vtrace``, ..., ``resolve``), mode (the pass, tile and options of
    ``aot.MODES``), option (the name's last part: dtype, strides, window end, ...) and kernel with
    pass; every value of each at least once."""
    from tools.aot import MODES, variants

    cases = {}
    for v in variants():
        kernel, mode, option = v["name"].split("/")
        cfg = v.get("cfg") or MODES.get(v.get("mode"))
        pass_ = None if cfg is None else cfg.pass_
        cases[v["name"]] = [("kernel", kernel), ("mode", mode), ("option", option),
                            ("kernel-pass", f"{kernel}-{pass_}")]
    return sorted(covering(cases, strength=1))


def test_a_covering_slice_of_the_kernel_variants_compiles_for_sm90():
    from tools.aot import MODES, variants

    names = covering_variants()
    vs = [v for v in variants() if v["name"] in names]
    assert {v["family"] for v in vs if "family" in v} == {v["family"] for v in variants() if "family" in v}
    assert {v["mode"] for v in vs if "mode" in v} >= set(MODES)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "tools.aot", "--arch", "90", "--jobs", "2",
                          "--names", ",".join(names)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert f"{len(vs)} of {len(vs)} variants compiled for sm_90" in res.stdout


@pytest.mark.exhaustive
def test_every_kernel_variant_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "tools.aot", "--arch", "90", "--jobs", "2"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    from tools.aot import variants

    assert f"{len(variants())} of {len(variants())} variants compiled for sm_90" in res.stdout


def test_ptx_counts_of_a_flipped_chunk():
    """``--counts`` on the one-row 512-step GAE kernel, in lane order and flipped (compiled with the
    JIT's alignment assumptions): flipping removes the reverse scan's cross-warp shuffles and, with
    descending offsets, the vector loads."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "tools.aot", "--counts", "--only", "row512"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    counts = {}
    for line in res.stdout.splitlines():
        _, name, *kv = line.split()
        counts[name] = {k: int(v) for k, v in (x.split("=") for x in kv)}
    plain, flipped = counts["gae/row512/fp32-adv-endcol"], counts["gae/row512-flip/fp32-adv-endcol"]
    assert flipped["shuffles"] < plain["shuffles"], (plain, flipped)
    assert plain["vector_loads"] > 0 and flipped["vector_loads"] == 0, (plain, flipped)


def test_machine_code_drops_the_scans_dead_components():
    """The carry is folded into the scan's first map (``core._fold``), so a one-chunk backward scan's
    multiplicative components are dead after it and ``ptxas`` drops their flip-back (Triton's reverse
    scan flips each component across the warp, five shuffles per element): the machine code has
    fewer shuffles than the PTX. With the carry applied after the scan, as before the fold, both
    counts were 172 for this variant."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", "tools.aot", "--counts", "--only", "gae/whole/fp32-nomask"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    _, name, *kv = res.stdout.split()
    c = {k: int(v) for k, v in (x.split("=") for x in kv)}
    assert "sass" in c, f"no machine-code counts (nvdisasm missing from Triton's wheel?): {res.stdout}"
    assert name == "gae/whole/fp32-nomask" and c["sass"] > 0, c
    assert c["sass_shuffles"] < c["shuffles"], c
