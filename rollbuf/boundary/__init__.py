"""The boundary model: the arithmetic of every boundary, written once.

* :mod:`rollbuf.boundary.coefficients` — the scan operators, ``rebind`` (a coefficient function over a
  backend's primitives) and the docs table's row type; each family's own-step coefficients ``(α_t, β_t)``
  and output epilogue are in its folder (``rollbuf/kernels/<family>/coefficients.py``), compiled into the
  Triton kernels and the CPU loop and called by the vectorised torch backend.
* :mod:`rollbuf.boundary.conventions` — converters from the flag conventions users already have
  (episode-start flags, TorchRL TensorDicts, verl response masks).

Where ``bootstrap_values`` is read and where each window ends: :mod:`rollbuf.windows`. The list of
estimators: :mod:`rollbuf.estimators`, which gathers the families' entries and their rows of the docs table
(``rollbuf/kernels/<family>/estimators.py``).
"""

from rollbuf.boundary import coefficients
from rollbuf.boundary.coefficients import EstimatorSpec

__all__ = ["coefficients", "EstimatorSpec"]
