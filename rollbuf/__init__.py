"""rollbuf: exact, fused credit assignment for reinforcement learning.

``Rollout`` holds a window of ``[*B, T]`` steps; :mod:`rollbuf.functional` has the same estimators
on plain tensors; :mod:`rollbuf.boundary` holds the boundary model (docs/semantics.md);
:func:`check_finite` switches on the check that names the first non-finite input an estimator reads.
"""

from rollbuf import functional
from rollbuf.estimators import GAEResult, SumsResult, TracesResult, VTraceResult
from rollbuf.rollout import Rollout
from rollbuf.validation import check_finite

__version__ = "0.1.0"
__all__ = ["Rollout", "functional", "GAEResult", "VTraceResult", "TracesResult", "SumsResult", "check_finite"]
