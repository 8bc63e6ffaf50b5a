"""The boundary model: the single place where SPEC §1–2 live.

* :mod:`rollbuf.boundary.coefficients` — for every estimator, the own-step scan coefficients
  ``(α_t, β_t)``, the output epilogue, the window-end carry and the chaining carry. The same
  functions are compiled into the Triton kernels and called by the vectorised torch backend.
* :mod:`rollbuf.boundary.conventions` — converters from the flag conventions users already have
  (episode-start flags, TorchRL TensorDicts, verl response masks).
"""

from rollbuf.boundary import coefficients
from rollbuf.boundary.coefficients import ESTIMATORS, EstimatorSpec

__all__ = ["coefficients", "ESTIMATORS", "EstimatorSpec"]
