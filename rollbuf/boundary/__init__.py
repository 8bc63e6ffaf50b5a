"""The boundary model: the arithmetic of every boundary, written once.

* :mod:`rollbuf.boundary.coefficients` — for every estimator, the own-step scan coefficients
  ``(α_t, β_t)`` and the output epilogue. The same functions are compiled into the Triton kernels
  and called by the vectorised torch backend.
* :mod:`rollbuf.boundary.conventions` — converters from the flag conventions users already have
  (episode-start flags, TorchRL TensorDicts, verl response masks).

Where ``bootstrap_values`` is read and where each window ends: :mod:`rollbuf.windows`. The list of
estimators and their rows of the docs table: :mod:`rollbuf.estimators`.
"""

from rollbuf.boundary import coefficients
from rollbuf.boundary.coefficients import EstimatorSpec

__all__ = ["coefficients", "ESTIMATORS", "EstimatorSpec"]


def __getattr__(name):
    # `rollbuf.boundary.ESTIMATORS`, kept for existing users: the docs rows of the registry
    if name == "ESTIMATORS":
        import warnings

        from rollbuf import estimators  # the registry sits above this layer: imported on use only

        warnings.warn("rollbuf.boundary.ESTIMATORS is deprecated: use rollbuf.estimators.REGISTRY "
                      "(each entry's .docs is the row this dict held)", DeprecationWarning, stacklevel=2)
        return {e.name: e.docs for e in estimators.REGISTRY.values() if e.docs is not None}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
