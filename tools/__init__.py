"""Developer tools for rollbuf's repository (not part of the installed package), run from the
repository root:

* :mod:`tools.aot`: ``python -m tools.aot`` compiles the family kernels' specialisation matrix for an
  NVIDIA target on any machine (no GPU), so that code the Triton interpreter accepts but the GPU
  compiler would reject is caught on a CPU machine (``tests/test_aot.py``).
"""
