"""One estimator call after validation: what every backend receives.

A :class:`Problem` is immutable (a named tuple). ``fields`` hold the caller's tensors with the leading batch
dimensions flattened to one (``[N, T]``; ``x`` of the forward estimators ``[N, T, *F]``), flags in
their own dtype, ``bootstrap_values`` either ``[N, T]`` or ``[N]`` (window-end column only), absent
fields ``None``. The field names say what each tensor holds, per family:

==========================  ===================================================================
family                      fields
==========================  ===================================================================
``TD_LAMBDA``               ``rewards``, ``values`` (``None`` for discounted returns), flags,
                            ``bootstrap_values``, ``mask``
``RETRACE``                 the above and ``log_probs``, ``target_log_probs``, ``q_values``
``VTRACE``                  the above without ``q_values``
``FORWARD``                 ``x`` ``[N, T, *F]``, flags, ``mask``
``AFFINE``                  ``alpha``, ``beta``: the scan coefficients given as data
``TD_LAMBDA_ADJOINT``       ``grad_returns`` (``Ḡ``), ``grad_advantages`` (``ḡ_A`` or ``None``),
                            flags, ``mask``: the backward pass of the ``TD_LAMBDA`` family
``TURN``                    ``rewards``, ``model`` (a row's model tokens, nonzero flags), ``values``
                            (``None`` for returns): turn-level returns and GAE on the kernel
                            (``rollbuf.integrations.llm.turn_returns``, ``turn_gae``)
``TURN_GAE``                the same with ``values`` (turn GAE's first pass; its own strategy entries)
``TURN_FILL``               ``start_advantages``, ``model``: a value at each turn's first token
                            carried over the turn (``turn_gae``'s second pass)
``GENERIC``                 whatever the estimator's registry entry declares; its coefficient
                            function (``Problem.estimator``) turns them into ``(α, β)``
==========================  ===================================================================

Flags: ``terminated``, ``truncated`` (bool, uint8 or 0/1 float).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import torch


class Family(str, enum.Enum):
    """Which scan an estimator is. The value is the short name used in kernel tables and logs."""

    TD_LAMBDA = "lambda"  # GAE, TD(λ) returns, discounted returns (bootstrapped and Monte Carlo)
    RETRACE = "retrace"
    VTRACE = "vtrace"  # the pair state (u, V)
    FORWARD = "trace"  # eligibility traces, episodic sums: forward in time, features allowed
    AFFINE = "affine"  # the public primitive affine_scan: α and β given as data
    TD_LAMBDA_ADJOINT = "lambda_adjoint"  # the TD(λ) family's backward pass (forward in time)
    TURN = "turn"  # turn-level returns and GAE: the coefficients from the rewards, values and model-token flags
    TURN_GAE = "turn_gae"  # the same with values (turn-level GAE's first pass): its own strategy entries
    TURN_FILL = "turn_fill"  # a turn's first-token value carried over the turn (turn GAE's second pass)
    GENERIC = "generic"  # an estimator defined by a coefficient function (registry extensions)

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value



# the field that fixes [N, T], per family (a generic estimator's: its first field); module constants,
# since reading an enum member off its class costs a Python-level lookup on Python 3.11
_MAIN_FIELD = ((Family.TD_LAMBDA, "rewards"), (Family.VTRACE, "rewards"), (Family.RETRACE, "rewards"),
               (Family.FORWARD, "x"), (Family.AFFINE, "alpha"), (Family.TD_LAMBDA_ADJOINT, "grad_returns"),
               (Family.TURN, "rewards"), (Family.TURN_GAE, "rewards"), (Family.TURN_FILL, "model"))


class Problem(NamedTuple):
    """Immutable (a named tuple, which ``torch.compile`` traces through); :meth:`evolve` returns a
    copy with some fields replaced."""

    family: Family
    outputs: tuple[str, ...]  # names of the per-step outputs, in order ("final" last if any)
    fields: Mapping[str, torch.Tensor | None]
    gamma: float = 1.0
    lam: float = 1.0
    rho_bar: float = 1.0
    c_bar: float = 1.0
    pg_rho_bar: float = 1.0
    decay: float = 1.0
    window_end: str = "bootstrap"  # "bootstrap" | "terminal"
    no_bootstrap: bool = False  # Monte-Carlo returns: truncation cuts, nothing is ever read
    carry: torch.Tensor | None = None  # chained window: the scan state past the window (forward: `initial`)
    want_carry: bool = False  # return_carry=True: the backend also returns the row's carry out
    compute_dtype: torch.dtype = torch.float32
    out_dtype: torch.dtype = torch.float32
    batch_shape: tuple[int, ...] = ()
    feature_shape: tuple[int, ...] = ()
    reverse: bool = True  # the direction of the scan (read by AFFINE and GENERIC)
    estimator: Any = None  # the registry entry (rollbuf.estimators.Estimator) this call came from
    params: Mapping[str, Any] = MappingProxyType({})  # parameters of GENERIC estimators

    def evolve(self, **changes) -> Problem:
        """A copy with ``changes`` applied (the problem itself never changes)."""
        return self._replace(**changes)

    @property
    def pair(self) -> bool:
        """Whether the scan state is a pair (V-trace's ``(u, V)``)."""
        return self.family == Family.VTRACE

    @property
    def main(self) -> torch.Tensor:
        """The field that fixes ``[N, T]``: ``x`` (forward), ``alpha`` (affine), ``grad_returns``
        (adjoint), the estimator's first field (generic), else ``rewards``."""
        # comparisons (a tuple is searched by ==), not a dict keyed by Family: Dynamo (torch 2.11)
        # cannot hash an enum whose __hash__ is overridden, and torch.compile traces this property
        f, name = self.family, None
        for fam, field in _MAIN_FIELD:
            if f == fam:
                name = field
                break
        if name is None:  # generic: its first field
            name = self.estimator.fields[0].name
        x = self.fields[name]
        if x is None:
            raise ValueError(f"the problem has no {name}, the field that fixes [N, T]")
        return x

    @property
    def num_rows(self) -> int:
        return self.main.shape[0]

    @property
    def num_steps(self) -> int:
        return self.main.shape[1]

    @property
    def features(self) -> int:
        return math.prod(self.feature_shape)

    def flag(self, name: str) -> torch.Tensor | None:
        """Flag ``name`` as a bool tensor (``None`` if absent)."""
        f = self.fields.get(name)
        if f is None:
            return None
        return f if f.dtype == torch.bool else f != 0
