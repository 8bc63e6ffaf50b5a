"""Drop-in replacements for TorchRL's value estimators: ``GAE``, ``TDLambdaEstimator``, ``VTrace``.

Each class subclasses TorchRL's own (``torchrl.objectives.value.GAE`` and so on), so it takes the
same constructor keywords (``gamma``, ``lmbda``, ``value_network``, ``average_gae``,
``differentiable``, ``shifted``, ``time_dim``, ``auto_reset_env``, ...), the same ``set_keys``
names, the same call (``module(tensordict)`` or ``module(tensordict, params=..., target_params=...)``)
and writes the same entries (``"advantage"``, ``"value_target"``). It runs the value network exactly
as TorchRL does (TorchRL's own code is inherited); only the recursion over time is replaced by one
call of :mod:`rollbuf.functional` (``backend="auto"``: the fused kernel on CUDA, the compiled
numba loops on the CPU), with no Python loop over time and no device synchronisation per call (the
``gamma``/``lmbda`` buffers are read once, and again only when they change). A TorchRL loss takes
them like its own estimators::

    from rollbuf.integrations.torchrl import GAE

    advantage_module = GAE(gamma=0.99, lmbda=0.95, value_network=value_module, average_gae=True)
    loss_module = ClipPPOLoss(actor, value_module)
    loss_module.make_value_estimator(advantage_module)   # or call advantage_module(td) yourself

The outputs equal TorchRL's (tests/test_integrations_torchrl.py compares them with TorchRL's own
classes). The places that needed care, because TorchRL's conventions differ from rollbuf's boundary
model (docs/howto/torchrl.md has the full list):

* TorchRL reads ``("next", "state_value")`` (``nv_t``) at **every** step; rollbuf reads
  ``values[t+1]`` inside an episode and ``bootstrap_values`` only after a done and at the window
  end. On a collector's data the two are the same values; where they are not (a value network with
  dropout, multi-step data), TorchRL's numbers are kept: the TD(λ) return only ever reads the
  successor value, so ``TDLambdaEstimator`` passes ``nv`` shifted by one step as rollbuf's
  ``values`` (``values[t+1] = nv_t``) and as ``bootstrap_values``; ``GAE`` and ``VTrace`` read
  ``V_t`` too, so the difference ``γ(1−k_t)(nv_t − V_{t+1})`` is added to the rewards (and, for
  V-trace, taken back out of the policy-gradient advantages).
* ``done`` without ``terminated`` is a truncation (bootstrap from the next state's value; the
  trace is cut). A missing ``terminated`` entry means every ``done`` is terminal, as in TorchRL.
  A step flagged ``terminated`` but not ``done`` does not occur in TorchRL's data; rollbuf treats
  it as done.
* TorchRL stores ``gamma`` and ``lmbda`` as buffers (float32 from Python floats; a tensor passed in
  keeps its dtype) and its GAE multiplies them in their dtype; the values used are the buffers'
  (and ``γλ`` rounded to the buffers' dtype), so float64 data give TorchRL's float64 numbers with
  float32 and with float64 buffers. Its V-trace computes in the dtype that ``gamma`` and the data
  promote to (float64 for float32 data and a float64 ``gamma``); the drop-in's ``VTrace`` too.
* ``time_dim`` and trailing feature dims (``[*B, T, *F]``, ``F`` usually 1) are moved to rollbuf's
  ``[*B, *F, T]`` layout as views.

Not supported (a ``ValueError`` names the cause): ``steps_to_next_obs`` (a per-step γ from
multi-step returns) and a ``gamma``/``lmbda`` with more than one element. TorchRL's ``vectorized``
has no effect (there is one implementation); ``deactivate_vmap`` keeps its meaning for the value
network call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, NamedTuple

try:
    import torch
    from tensordict import TensorDictBase
    from tensordict.nn import dispatch, set_skip_existing
    from torchrl.objectives.utils import hold_out_net
    from torchrl.objectives.value import GAE as _TorchRLGAE
    from torchrl.objectives.value import TDLambdaEstimator as _TorchRLTDLambda
    from torchrl.objectives.value import VTrace as _TorchRLVTrace
except ImportError as exc:  # pragma: no cover - exercised only without torchrl
    raise ImportError(
        "rollbuf.integrations.torchrl needs TorchRL: pip install torchrl (tested with torchrl 0.14.1)"
    ) from exc

from rollbuf import functional as F

__all__ = ["GAE", "TDLambdaEstimator", "VTrace"]


# ----------------------------------------------------------------------------- decorators
# (TorchRL's estimators wrap forward() the same way; re-stated here rather than imported from
# TorchRL's private names.)


def _grad_mode(fun):
    @functools.wraps(fun)
    def wrapped(self, *args, **kwargs):
        with torch.set_grad_enabled(self.differentiable):
            return fun(self, *args, **kwargs)

    return wrapped


def _skip_existing(fun):
    @functools.wraps(fun)
    def wrapped(self, *args, **kwargs):
        if self.skip_existing is not None:
            with set_skip_existing(self.skip_existing):
                return fun(self, *args, **kwargs)
        return fun(self, *args, **kwargs)

    return wrapped


# ----------------------------------------------------------------------------- the numerics


def _time_last(x: torch.Tensor, time_dim: int) -> torch.Tensor:
    """``[*B, T, *F]`` (time at ``time_dim``) → ``[*B, *F, T]``: a view."""
    return x.movedim(time_dim, -1)


def _check_fields(time_dim: int, **fields) -> None:
    shapes = {name: tuple(x.shape) for name, x in fields.items() if x is not None}
    first = next(iter(shapes.values()))
    for shape in shapes.values():
        if shape != first:
            raise ValueError(
                "the value, next value, reward, done and terminated entries must have one shape "
                f"(as TorchRL's estimators require); got {shapes}"
            )
    if not -len(first) <= time_dim < len(first):
        raise ValueError(f"time_dim={time_dim} is out of range for entries of shape {first}")
    for name in ("done", "terminated"):
        x = fields.get(name)
        if x is not None and x.dtype != torch.bool:
            raise TypeError(f"the {name} entry must be a bool tensor (as TorchRL writes it), got {x.dtype}")


def _lambda_return(gamma, lmbda, next_value, reward, done, terminated, time_dim):
    """TorchRL's TD(λ) return, read as TorchRL reads it: ``next_value`` at every step.

    ``G_t = r_t + γ(1−k_t)[(1 − λ(1−d_t))·nv_t + λ(1−d_t)·G_{t+1}]``, ``G`` past the window = ``nv``.
    rollbuf's λ-return reads its ``values`` only as the successor value ``values[t+1]`` (never at
    the step itself), so the next values shifted by one step are exactly TorchRL's ``nv_t`` there,
    and the same tensor as ``bootstrap_values`` covers truncations and the window end.
    """
    _check_fields(time_dim, next_value=next_value, reward=reward, done=done, terminated=terminated)
    nv = _time_last(next_value, time_dim)
    k = _time_last(terminated, time_dim)
    d = _time_last(done, time_dim)
    G = F.lambda_returns(
        gamma, lmbda,
        rewards=_time_last(reward, time_dim),
        values=nv.roll(1, -1),  # values[t+1] = nv[t]; values[0] is never read
        terminated=k,
        truncated=d & ~k,
        bootstrap_values=nv,
        backend="auto",
    )
    return G.movedim(-1, time_dim)


def _successor_correction(gamma, v, nv, d, k):
    """``c_t = γ(1−k_t)(nv_t − V'_t)``, ``V'_t`` the successor value rollbuf reads: ``V_{t+1}``
    inside an episode, ``bootstrap_values[t] = nv_t`` after a done and at the window end (so
    ``c_t`` is 0 there, and everywhere the collector's ``nv_t`` is ``V_{t+1}``)."""
    boundary = d.clone()
    boundary[..., -1] = True
    read = torch.where(boundary, nv, v.roll(-1, -1))
    return torch.where(k, torch.zeros_like(nv), gamma * (nv - read))


def _trace_lambda(gamma: float, lmbda: float, dtype: torch.dtype) -> float:
    """TorchRL's GAE multiplies its ``gamma`` and ``lmbda`` buffers, so its trace decay ``γλ`` is
    rounded to the buffers' (promoted) ``dtype``: float32 for TorchRL's default buffers, float64
    for float64 ones. The λ returned makes rollbuf's ``γ·λ`` that product (float64 data then agree
    to float64 rounding instead of to float32's)."""
    if gamma == 0.0:
        return lmbda
    product = float(torch.tensor(gamma, dtype=dtype) * torch.tensor(lmbda, dtype=dtype))
    return min(1.0, product / gamma)


class _Steps(NamedTuple):
    """The per-step entries of a TorchRL rollout that the estimators read, time at ``time_dim``."""

    value: torch.Tensor
    next_value: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor
    terminated: torch.Tensor
    time_dim: int


def _gae(gamma, lmbda, steps: _Steps, scalar_dtype=torch.float32):
    """TorchRL's GAE: ``δ_t = r_t + γ(1−k_t)·nv_t − V_t``, ``A_t = δ_t + γλ(1−d_t)A_{t+1}``,
    ``value_target = A + V``; ``(advantage, value_target)``. ``scalar_dtype``: the dtype ``γλ`` is
    rounded to (that of TorchRL's ``gamma``·``lmbda`` buffers).

    rollbuf's δ uses ``V_{t+1}`` inside an episode; TorchRL's uses ``nv_t`` at every step. Adding
    the difference (:func:`_successor_correction`) to the rewards makes every δ TorchRL's.
    """
    value, next_value, reward, done, terminated, time_dim = steps
    _check_fields(time_dim, value=value, next_value=next_value, reward=reward, done=done,
                  terminated=terminated)
    v = _time_last(value, time_dim)
    nv = _time_last(next_value, time_dim)
    k = _time_last(terminated, time_dim)
    d = _time_last(done, time_dim)
    r = _time_last(reward, time_dim) + _successor_correction(gamma, v, nv, d, k)
    adv, target = F.gae(gamma, _trace_lambda(gamma, lmbda, scalar_dtype), rewards=r, values=v, terminated=k,
                        truncated=d & ~k, bootstrap_values=nv, backend="auto")
    return adv.movedim(-1, time_dim), target.movedim(-1, time_dim)


def _vtrace(gamma, rho_bar, c_bar, log_pi, log_mu, steps: _Steps, gamma_dtype=torch.float32):
    """TorchRL's ``vtrace_advantage_estimate``: ``(pg_advantage, vs)``, in the dtype that
    ``gamma_dtype`` (that of TorchRL's ``gamma`` buffer) and the float entries promote to, as
    TorchRL's arithmetic promotes them (float32 data with a float64 ``gamma``: float64).

    TorchRL's TD error is ``ρ_t(r_t + γ(1−k_t)·nv_t − V_t)`` at every step; rollbuf's uses
    ``V_{t+1}`` inside an episode. The difference ``c_t`` (:func:`_successor_correction`) is added
    to the rewards, which makes the traces TorchRL's, and ``min(ρ̄, π/μ)·c_t`` is taken back out of
    the policy-gradient advantages, whose ``r_t + γ(1−k_t)vs_{t+1}`` must not see it.
    """
    value, next_value, reward, done, terminated, time_dim = steps
    _check_fields(time_dim, value=value, next_value=next_value, reward=reward, done=done,
                  terminated=terminated, log_pi=log_pi, log_mu=log_mu)
    dt = functools.reduce(torch.promote_types, [x.dtype for x in (log_pi, log_mu, value, next_value, reward)],
                          gamma_dtype)
    value, next_value, reward, log_pi, log_mu = (x.to(dt) for x in (value, next_value, reward, log_pi, log_mu))
    v = _time_last(value, time_dim)
    nv = _time_last(next_value, time_dim)
    k = _time_last(terminated, time_dim)
    d = _time_last(done, time_dim)
    lp, lm = _time_last(log_pi, time_dim), _time_last(log_mu, time_dim)
    corr = _successor_correction(gamma, v, nv, d, k)
    vs, pg = F.vtrace(
        lp, gamma, rho_bar, c_bar, rho_bar, 1.0,
        rewards=_time_last(reward, time_dim) + corr, values=v, log_probs=lm, terminated=k,
        truncated=d & ~k, bootstrap_values=nv, backend="auto",
    )
    pg = pg - (lp - lm).exp().clamp_max(rho_bar) * corr
    return pg.movedim(-1, time_dim), vs.movedim(-1, time_dim)


class _Scalars:
    """The Python float of a scalar buffer (``gamma``, ``lmbda``, ...), read from the device once
    per buffer (not once per call): rollbuf takes its constants as Python floats."""

    # what the mixin reads of TorchRL's estimator base class, which it is mixed into (annotations only)
    tensor_keys: Any
    value_network: Any
    shifted: bool
    vmap_randomness: Any
    _call_value_nets: Callable[..., Any]
    _prepare_shifted_tensordict: Callable[..., Any]

    def scalar(self, name: str) -> float:
        t = getattr(self, name)
        if not isinstance(t, torch.Tensor):
            return float(t)
        if t.numel() != 1:
            raise ValueError(
                f"{name} must be a scalar for rollbuf's estimators, got a tensor of shape "
                f"{tuple(t.shape)}; use TorchRL's own estimator for a per-step or per-env {name}"
            )
        cache = self.__dict__.setdefault("_rollbuf_scalars", {})
        hit = cache.get(name)
        if hit is not None and hit[0] is t and hit[1] == t._version:
            return hit[2]
        value = float(t)
        cache[name] = (t, t._version, value)
        return value

    def scalar_dtype(self, *names: str) -> torch.dtype:
        """The dtype TorchRL's arithmetic on the buffers ``names`` gives (their promoted dtype; a
        non-tensor attribute counts as torch's default dtype, as ``torch.tensor`` would make it)."""
        dtypes = [t.dtype if isinstance(t, torch.Tensor) else torch.get_default_dtype()
                  for t in (getattr(self, name) for name in names)]
        return functools.reduce(torch.promote_types, dtypes)

    def _no_steps_to_next_obs(self, tensordict):
        if tensordict.get(self.tensor_keys.steps_to_next_obs, None) is not None:
            raise ValueError(
                f"the tensordict has {self.tensor_keys.steps_to_next_obs!r} (multi-step returns: a "
                "per-step gamma), which rollbuf's estimators do not take; use TorchRL's own estimator"
            )

    @staticmethod
    def _check_batch(tensordict):
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(f"tensordict must be a TensorDict, got {type(tensordict).__name__}")
        if tensordict.batch_dims < 1:
            raise ValueError(
                "the tensordict must have at least one batch dimension (time), got batch_size "
                f"{tuple(tensordict.batch_size)}"
            )

    def _values(self, tensordict, params, target_params):
        """``(value, next_value)``: the value network run exactly as TorchRL's estimators run it
        (``_call_value_nets``, which also records ``"shifted_valid"`` with ``shifted=True``), or the
        entries already in the tensordict when there is no value network."""
        if self.value_network is not None:
            if params is not None:
                params = params.detach()
                if target_params is None:
                    target_params = params.clone(False)
            held = hold_out_net(self.value_network) if params is None and target_params is None else nullcontext()
            with held:
                value, next_value, valid = self._call_value_nets(
                    data=tensordict, params=params, next_params=target_params,
                    single_call=self.shifted, value_key=self.tensor_keys.value, detach_next=True,
                    vmap_randomness=self.vmap_randomness,
                )
            if valid is not None:
                tensordict.set("shifted_valid", valid)
            return value, next_value
        value = tensordict.get(self.tensor_keys.value, None)
        next_value = tensordict.get(("next", self.tensor_keys.value), None)
        if value is None:
            raise ValueError(f"the tensordict has no {self.tensor_keys.value!r} entry and there is no value network")
        if next_value is None:
            raise ValueError(
                f"the tensordict has no {('next', self.tensor_keys.value)!r} entry and there is no value network"
            )
        return value, next_value

    def _signals(self, tensordict, time_dim):
        valid = tensordict.get("shifted_valid", default=None)
        data = self._prepare_shifted_tensordict(tensordict, valid, time_dim)
        reward = data.get(("next", self.tensor_keys.reward))
        done = data.get(("next", self.tensor_keys.done))
        terminated = data.get(("next", self.tensor_keys.terminated), default=done)
        return valid, reward, done, terminated


# ----------------------------------------------------------------------------- estimators


class GAE(_Scalars, _TorchRLGAE):
    """TorchRL's ``GAE`` computed by rollbuf: same constructor, keys and call; same numbers.

    ``GAE(gamma=0.99, lmbda=0.95, value_network=None, average_gae=False, ...)`` — every keyword of
    ``torchrl.objectives.value.GAE``. Calling it on a ``[*B, T]`` tensordict writes
    ``"advantage"`` and ``"value_target"`` (``set_keys`` renames them), running the value network
    first when there is one. ``average_gae``, ``shifted``, ``auto_reset_env``, ``group_key`` and
    ``time_dim`` behave as in TorchRL: ``δ_t = r_t + γ(1−k_t)·nv_t − V_t`` with ``nv_t`` read from
    ``("next", "state_value")`` at every step, ``A_t = δ_t + γλ(1−d_t)A_{t+1}``,
    ``value_target = A + V``.
    """

    @_skip_existing
    @_grad_mode
    @dispatch
    def forward(self, tensordict: TensorDictBase, *, params=None, target_params=None,
                time_dim: int | None = None) -> TensorDictBase:
        self._check_batch(tensordict)
        self._no_steps_to_next_obs(tensordict)
        gamma, lmbda = self.scalar("gamma"), self.scalar("lmbda")
        value, next_value = self._values(tensordict, params, target_params)
        time_dim = self._get_time_dim(time_dim, tensordict)
        valid, reward, done, terminated = self._signals(tensordict, time_dim)
        reward, done, terminated = self._prepare_signals(reward, done, terminated, value)
        if self.auto_reset_env:
            # TorchRL: a truncated step bootstraps from V(s_t) itself (the next observation of an
            # auto-reset env is the reset one): r + γ·V(s_t), then every done is terminal.
            truncated = self._broadcast_optional(tensordict.get(("next", "truncated")), value)
            reward = reward + gamma * value * truncated
            terminated = done
        adv, value_target = _gae(gamma, lmbda, _Steps(value, next_value, reward, done, terminated, time_dim),
                                 self.scalar_dtype("gamma", "lmbda"))
        if self.average_gae:
            adv = self._normalize_advantage(adv, valid, groups=self._group_ids(tensordict))
        tensordict.set(self.tensor_keys.advantage, adv)
        tensordict.set(self.tensor_keys.value_target, value_target)
        self._mask_shifted_output(tensordict, valid)
        return tensordict

    def value_estimate(self, tensordict, params=None, target_params=None, time_dim: int | None = None,
                       **kwargs):
        """The value target alone (as TorchRL's ``GAE.value_estimate``, which does not apply
        ``auto_reset_env``)."""
        self._check_batch(tensordict)
        self._no_steps_to_next_obs(tensordict)
        gamma, lmbda = self.scalar("gamma"), self.scalar("lmbda")
        time_dim = self._get_time_dim(time_dim, tensordict)
        if self.is_stateless and params is None:
            raise RuntimeError("Expected params to be passed to advantage module but got none.")
        value, next_value = self._values(tensordict, params, target_params)
        _, reward, done, terminated = self._signals(tensordict, time_dim)
        reward, done, terminated = self._prepare_signals(reward, done, terminated, value)
        return _gae(gamma, lmbda, _Steps(value, next_value, reward, done, terminated, time_dim),
                    self.scalar_dtype("gamma", "lmbda"))[1]


class TDLambdaEstimator(_Scalars, _TorchRLTDLambda):
    """TorchRL's ``TDLambdaEstimator`` computed by rollbuf: same constructor, keys, call, numbers.

    ``TDLambdaEstimator(gamma=..., lmbda=..., value_network=..., average_rewards=False, ...)``.
    Writes ``"value_target"`` (the TD(λ) return, reading ``("next", "state_value")`` at every step)
    and ``"advantage" = value_target − state_value``.
    """

    @_skip_existing
    @_grad_mode
    @dispatch
    def forward(self, tensordict: TensorDictBase, *, params=None, target_params=None) -> TensorDictBase:
        self._check_batch(tensordict)
        if self.is_stateless and params is None:
            raise RuntimeError("Expected params to be passed to advantage module but got none.")
        value, next_value = self._values(tensordict, params, target_params)
        valid = tensordict.get("shifted_valid", default=None)
        data = self._prepare_shifted_tensordict(tensordict, valid, self._get_time_dim(None, tensordict))
        value_target = self.value_estimate(data, next_value=next_value)
        tensordict.set(self.tensor_keys.advantage, value_target - value)
        tensordict.set(self.tensor_keys.value_target, value_target)
        self._mask_shifted_output(tensordict, valid)
        return tensordict

    def value_estimate(self, tensordict, target_params=None, next_value=None, time_dim: int | None = None,
                       **kwargs):
        """The TD(λ) return (TorchRL's ``TDLambdaEstimator.value_estimate``: ``average_rewards``
        standardises the rewards and writes them back; without ``next_value`` the value network is
        run on the next states)."""
        self._check_batch(tensordict)
        self._no_steps_to_next_obs(tensordict)
        gamma, lmbda = self.scalar("gamma"), self.scalar("lmbda")
        reward = tensordict.get(("next", self.tensor_keys.reward))
        if self.average_rewards:
            groups = self._group_ids(tensordict)
            if groups is None:
                reward = reward - reward.mean()
                reward = reward / reward.std().clamp_min(1e-4)
            else:
                from torchrl.objectives.value.advantages import _standardize_by_group

                reward = _standardize_by_group(reward, groups)
            tensordict.set(("next", self.tensor_keys.reward), reward)
        if next_value is None:
            next_value = self._next_value(tensordict, target_params, kwargs=kwargs)
        time_dim = self._get_time_dim(time_dim, tensordict)
        _, reward, done, terminated = self._signals(tensordict, time_dim)
        return _lambda_return(gamma, lmbda, next_value, reward, done, terminated, time_dim)


class VTrace(_Scalars, _TorchRLVTrace):
    """TorchRL's ``VTrace`` computed by rollbuf: same constructor, keys, call and numbers.

    ``VTrace(gamma=..., actor_network=..., value_network=..., rho_thresh=1.0, c_thresh=1.0,
    average_adv=False, ...)``. The behaviour log-probabilities are read from the
    ``sample_log_prob`` key, the target ones come from ``actor_network`` (as in TorchRL). Writes
    ``"advantage"`` (the policy-gradient advantage ``min(ρ̄, π/μ)(r_t + γ(1−k_t)vs_{t+1} − V_t)``)
    and ``"value_target"`` (``vs``).
    """

    @_skip_existing
    @_grad_mode
    @dispatch
    def forward(self, tensordict: TensorDictBase, *, params=None, target_params=None,
                time_dim: int | None = None) -> TensorDictBase:
        from tensordict import is_tensor_collection
        from torchrl.objectives.utils import _maybe_get_or_select
        from torchrl.objectives.value.advantages import _call_actor_net

        self._check_batch(tensordict)
        self._no_steps_to_next_obs(tensordict)
        gamma = self.scalar("gamma")
        rho_bar, c_bar = self.scalar("rho_thresh"), self.scalar("c_thresh")
        value, next_value = self._values(tensordict, params, target_params)
        lp = _maybe_get_or_select(tensordict, self.tensor_keys.sample_log_prob)
        if is_tensor_collection(lp):
            lp = lp.sum(dim="feature", reduce=True)
        log_mu = lp.view_as(value)
        with hold_out_net(self.actor_network):
            log_pi = _call_actor_net(actor_net=self.actor_network, data=tensordict, params=None,
                                     log_prob_key=self.tensor_keys.sample_log_prob).view_as(value)
        time_dim = self._get_time_dim(time_dim, tensordict)
        valid, reward, done, terminated = self._signals(tensordict, time_dim)
        adv, value_target = _vtrace(gamma, rho_bar, c_bar, log_pi, log_mu,
                                    _Steps(value, next_value, reward, done, terminated, time_dim),
                                    self.scalar_dtype("gamma"))
        if self.average_adv:
            groups = self._group_ids(tensordict)
            if groups is None:
                adv = (adv - adv.mean()) / adv.std().clamp_min(1e-5)
            else:
                from torchrl.objectives.value.advantages import _standardize_by_group

                adv = _standardize_by_group(adv, groups, eps=1e-5)
        tensordict.set(self.tensor_keys.advantage, adv)
        tensordict.set(self.tensor_keys.value_target, value_target)
        self._mask_shifted_output(tensordict, valid)
        return tensordict
