"""Converters from the flag conventions users already have to rollbuf's fields, and back.

rollbuf's layout (docs/semantics.md): every per-step field is ``[*B, T]``, time last; flags are
*transition-aligned* as in Gymnasium and TorchRL's ``("next", "done")``: a flag at ``t`` says what
happened after ``a_t``; ``done = terminated | truncated``; terminated wins when both are set.

Three conventions are covered:

* **Observation-aligned episode-start flags** (CleanRL ``dones``/``next_done``, SB3
  ``episode_starts``, PufferLib): :func:`done_from_episode_starts`, :func:`episode_starts_from_done`.
* **Time-major buffers** (CleanRL, SB3 store ``[T, N]``): rollbuf takes the transposed view
  (``x.mT`` for ``[T, N]``, ``x.transpose(0, 1)`` for ``[T, N, *F]``), never a copy:
  :func:`from_time_major`, :func:`to_time_major`.
* **TorchRL TensorDicts**: :func:`fields_from_torchrl`, :func:`torchrl_from_fields`.
* **verl response masks**: :func:`fields_from_verl`.

Every function is plain torch: no Python loop over time, no device synchronisation (nothing reads a
tensor's values on the host; flag values are therefore not validated to be 0/1, any nonzero value
counts as ``True``), and views wherever the layout allows. Bad input raises ``TypeError`` (not a
tensor / wrong dtype) or ``ValueError`` (wrong shape, device, missing key) naming the argument.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = [
    "done_from_episode_starts",
    "episode_starts_from_done",
    "from_time_major",
    "to_time_major",
    "fields_from_torchrl",
    "torchrl_from_fields",
    "fields_from_verl",
    "TORCHRL_LOG_PROB_KEYS",
]

#: Keys searched (in this order) for the behaviour log-probability in a TorchRL TensorDict.
#: ``"action_log_prob"`` is what recent tensordict versions write by default for an ``"action"``
#: sample (``composite_lp_aggregate() == False``, checked on 0.15); ``"sample_log_prob"`` is the
#: older / aggregated key.
TORCHRL_LOG_PROB_KEYS = ("action_log_prob", "sample_log_prob")

_Key = str | tuple


# ----------------------------------------------------------------------------------- validation


def _tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _float(x, name: str) -> torch.Tensor:
    x = _tensor(x, name)
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


def as_flags(x, name: str) -> torch.Tensor:
    """bool → itself (no copy); integer / float 0-1 flags → ``x != 0`` (one copy)."""
    x = _tensor(x, name)
    if x.dtype == torch.bool:
        return x
    if x.is_complex():
        raise TypeError(f"{name} must be a flag tensor (bool, integer or 0/1 float), got dtype {x.dtype}")
    return x != 0


def _check_flag_dtype(x, name: str) -> torch.Tensor:
    x = _tensor(x, name)
    if x.is_complex():
        raise TypeError(f"{name} must be a flag tensor (bool, integer or 0/1 float), got dtype {x.dtype}")
    return x


def _time_axis(x: torch.Tensor, name: str, *, nonempty: bool) -> None:
    if x.ndim < 1:
        raise ValueError(f"{name} must have shape [*B, T] (time last), got a 0-d tensor")
    if nonempty and x.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one time step, got shape {tuple(x.shape)}")


def _one_device(*named) -> None:
    """Raise a ValueError naming the tensor of ``named`` (``(name, tensor)`` pairs, None skipped) whose
    device differs from the one most of them are on (ties: the first's)."""
    named = tuple((n, t) for n, t in named if t is not None)
    devices = [t.device for _, t in named]
    if all(d == devices[0] for d in devices):
        return
    ref = max(devices, key=devices.count)  # max keeps the first of the most frequent
    odd_name, odd = next((n, t) for n, t in named if t.device != ref)
    ref_name = next(n for n, t in named if t.device == ref)
    raise ValueError(f"{odd_name} is on {odd.device} but {ref_name} is on {ref}")


def _same(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str, shape=None) -> None:
    expected = tuple(ref.shape) if shape is None else tuple(shape)
    if tuple(x.shape) != expected:
        raise ValueError(
            f"{name} must have shape {expected} (matching {ref_name}), got {tuple(x.shape)}; "
            "nothing is broadcast"
        )
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}")


# ------------------------------------------------------------ observation-aligned episode starts


def done_from_episode_starts(
    episode_starts: torch.Tensor, next_episode_start: torch.Tensor
) -> torch.Tensor:
    """Transition-aligned ``done`` from observation-aligned episode-start flags.

    **Source convention** (CleanRL ``dones``/``next_done``, SB3 ``RolloutBuffer.episode_starts`` and
    the ``dones`` passed to ``compute_returns_and_advantage``, PufferLib's CleanRL-style buffers):
    ``episode_starts[..., t]`` is ``True`` when *observation* ``t`` is the first of a new episode,
    i.e. the transition ``t − 1`` ended one (the environment auto-reset). CleanRL stores it next to
    ``obs[t]`` *before* acting, under the name ``dones``; ``next_episode_start`` (CleanRL
    ``next_done``) is the same flag for the observation after the window, ``s_T``.

    **Result**: ``done[..., t] = episode_starts[..., t + 1]`` for ``t < T − 1`` and
    ``done[..., T − 1] = next_episode_start``: a ``[*B, T]`` bool tensor. ``episode_starts[..., 0]``
    is not used: it describes the transition before the window (the previous window's
    ``done[..., T − 1]``); :func:`episode_starts_from_done` needs it back as ``first_episode_start``.

    These conventions do not separate terminated from truncated. Pass the result as
    ``terminated=done`` to reproduce what CleanRL and SB3 compute (CleanRL never bootstraps a
    truncation; SB3 folds ``γ·V(terminal_obs)`` of a time-limit truncation into the reward, then
    treats the step as terminal), or as ``truncated=done`` together with ``bootstrap_values``
    (``V(s'_t)`` of the real final observation) when you have them. If your buffer also stores the
    *reward* with the observation it arrives with (``rewards[t + 1]`` is ``r_t``), shift it too.

    CleanRL/SB3 buffers are time-major ``[T, N]``; transpose them first with
    :func:`from_time_major` (a view).

    Example (one env, T = 3; the episode ends after step 1 and after step 2)::

        >>> starts = torch.tensor([False, False, True])  # obs 2 starts a new episode
        >>> next_start = torch.tensor(True)              # obs 3 (after the window) does too
        >>> done_from_episode_starts(starts, next_start)
        tensor([False,  True,  True])

    Args:
        episode_starts: ``[*B, T]`` flags (bool, integer or 0/1 float; nonzero = ``True``).
        next_episode_start: ``[*B]`` flag of the observation after the window.

    Returns:
        ``done``: ``[*B, T]`` bool, a new tensor.
    """
    starts = _check_flag_dtype(episode_starts, "episode_starts")
    nxt = _check_flag_dtype(next_episode_start, "next_episode_start")
    _time_axis(starts, "episode_starts", nonempty=True)
    _same(nxt, "next_episode_start", starts, "episode_starts[..., 0]", shape=starts.shape[:-1])
    done = torch.empty(starts.shape, dtype=torch.bool, device=starts.device)
    done[..., :-1] = starts[..., 1:]  # copy_ casts: nonzero → True
    done[..., -1] = nxt
    return done


def episode_starts_from_done(
    done: torch.Tensor, first_episode_start: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Observation-aligned episode-start flags from transition-aligned ``done``; inverse of
    :func:`done_from_episode_starts`.

    **Target convention** (CleanRL ``dones``/``next_done``, SB3 ``episode_starts``): ``starts[..., t]``
    is ``True`` when observation ``t`` begins a new episode, i.e. transition ``t − 1`` was done;
    ``next_episode_start`` is that flag for the observation after the window.

    **Result**: ``episode_starts[..., 0] = first_episode_start`` (whether the transition before the
    window ended an episode: the previous window's ``done[..., T − 1]``, ``True`` for the very first
    rollout after ``env.reset()``), ``episode_starts[..., t] = done[..., t − 1]`` for ``t ≥ 1``, and
    ``next_episode_start = done[..., T − 1]``. Pass ``done = terminated | truncated``: this
    convention cannot say which of the two it was.

    Example (one env, T = 3)::

        >>> done = torch.tensor([False, True, True])
        >>> starts, next_start = episode_starts_from_done(done, torch.tensor(False))
        >>> starts, next_start
        (tensor([False, False,  True]), tensor(True))

    Args:
        done: ``[*B, T]`` transition-aligned flags (bool, integer or 0/1 float).
        first_episode_start: ``[*B]`` flag of the window's first observation.

    Returns:
        ``(episode_starts, next_episode_start)``: ``[*B, T]`` bool (a new tensor) and ``[*B]`` bool
        (a view of ``done`` when ``done`` is bool).
    """
    done = _check_flag_dtype(done, "done")
    first = _check_flag_dtype(first_episode_start, "first_episode_start")
    _time_axis(done, "done", nonempty=True)
    _same(first, "first_episode_start", done, "done[..., 0]", shape=done.shape[:-1])
    starts = torch.empty(done.shape, dtype=torch.bool, device=done.device)
    starts[..., 0] = first
    starts[..., 1:] = done[..., :-1]
    return starts, as_flags(done[..., -1], "done")


# --------------------------------------------------------------------------------- time-major


def _transpose01(tensors: tuple, fn: str):
    if not tensors:
        raise TypeError(f"{fn}() needs at least one tensor")
    out = []
    for i, given in enumerate(tensors):
        name = f"tensors[{i}]" if len(tensors) > 1 else "tensor"
        x = _tensor(given, name)
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions, got shape {tuple(x.shape)}")
        out.append(x.transpose(0, 1))
    return out[0] if len(out) == 1 else tuple(out)


def from_time_major(*tensors: torch.Tensor):
    """``[T, N, *F]`` time-major buffers → rollbuf's ``[N, T, *F]``, as views (no copy).

    **Source convention**: CleanRL (``rewards = torch.zeros((num_steps, num_envs))``) and SB3
    (``RolloutBuffer`` arrays of shape ``(buffer_size, n_envs)``) put time first. rollbuf wants time
    last; the transposed view ``x.transpose(0, 1)`` (``x.mT`` for 2-d) is all it takes: rollbuf
    accepts any strides, so nothing is copied. Shapes are not checked against each other.

    Example (T = 3 steps, N = 2 envs)::

        >>> rewards_tn = torch.tensor([[1., 10.], [2., 20.], [3., 30.]])   # [T=3, N=2]
        >>> rewards = from_time_major(rewards_tn)                          # [N=2, T=3] view
        >>> rewards, rewards.data_ptr() == rewards_tn.data_ptr()
        (tensor([[ 1.,  2.,  3.],
                [10., 20., 30.]]), True)

    Returns:
        One view for one argument, a tuple of views for several.
    """
    return _transpose01(tensors, "from_time_major")


def to_time_major(*tensors: torch.Tensor):
    """rollbuf's ``[N, T, *F]`` → time-major ``[T, N, *F]`` views (CleanRL/SB3 layout); the inverse
    of :func:`from_time_major` (the same transpose).

    Example (N = 2 envs, T = 3 steps)::

        >>> adv = torch.tensor([[1., 2., 3.], [10., 20., 30.]])  # [N=2, T=3]
        >>> to_time_major(adv)                                   # [T=3, N=2] view
        tensor([[ 1., 10.],
                [ 2., 20.],
                [ 3., 30.]])

    Returns:
        One view for one argument, a tuple of views for several.
    """
    return _transpose01(tensors, "to_time_major")


# ------------------------------------------------------------------------------------ TorchRL


def _key_str(key: _Key) -> str:
    return repr(key)


def td_entry(td: TensorDictBase, key: _Key) -> torch.Tensor | None:
    """``td[key]`` with a trailing singleton feature dim squeezed (a view); ``None`` if absent."""
    if key not in td.keys(include_nested=True):
        return None
    x = td.get(key)
    name = f"td[{_key_str(key)}]"
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    batch = tuple(td.batch_size)
    if tuple(x.shape) == batch + (1,):
        return x.squeeze(-1)
    if tuple(x.shape) != batch:
        raise ValueError(
            f"{name} must have shape {batch} or {batch + (1,)} (td.batch_size [*B, T], optionally a "
            f"trailing singleton feature dim), got {tuple(x.shape)}"
        )
    return x


def fields_from_torchrl(td: TensorDictBase, *, log_prob_key: _Key | None = None) -> dict:
    """rollbuf fields from a TorchRL rollout TensorDict.

    **Source convention** (TorchRL collectors and value estimators): ``td.batch_size`` is
    ``[*B, T]`` with time the last batch dimension; the ``"next"`` sub-TensorDict holds what
    happened *after* the action at ``t``, which is rollbuf's alignment exactly:

    ========================================  =====================================
    TorchRL key                               rollbuf field
    ========================================  =====================================
    ``("next", "reward")``                    ``rewards``
    ``"state_value"``                         ``values``  (``V(s_t)``)
    ``("next", "state_value")``               ``bootstrap_values``  (``V(s'_t)``)
    ``("next", "terminated")``                ``terminated``
    ``("next", "truncated")``                 ``truncated``
    ``"action_log_prob"`` / ``"sample_log_prob"``  ``log_probs``
    ========================================  =====================================

    Entries may carry TorchRL's trailing singleton feature dim (``[*B, T, 1]``); it is squeezed
    (a view). Missing ``("next", "truncated")`` (older envs): ``truncated = done & ~terminated``
    from ``("next", "done")`` when present, else all ``False``. Missing ``("next", "terminated")``,
    ``"state_value"``, ``("next", "state_value")`` or ``("next", "reward")`` is an error naming the
    key: run the value network on both ``td`` and ``td["next"]`` first (rollbuf never bootstraps
    with 0 because a value is missing). The root ``"done"``/``"terminated"`` entries (TorchRL's
    observation-aligned reset flags) are not read.

    Example (one env, T = 3; the episode terminates after step 1, is truncated after step 2)::

        >>> td = TensorDict({
        ...     "state_value": torch.tensor([[0.5], [0.6], [0.7]]),
        ...     "next": {"reward": torch.tensor([[1.], [2.], [3.]]),
        ...              "terminated": torch.tensor([[False], [True], [False]]),
        ...              "truncated": torch.tensor([[False], [False], [True]]),
        ...              "state_value": torch.tensor([[0.6], [0.0], [0.9]])},
        ... }, batch_size=[3])
        >>> f = fields_from_torchrl(td)
        >>> f["rewards"], f["terminated"], f["truncated"]
        (tensor([1., 2., 3.]), tensor([False,  True, False]), tensor([False, False,  True]))

    Args:
        td: a TensorDict with ``td.batch_size = [*B, T]``, ``T`` last.
        log_prob_key: key of the behaviour log-probability. Default: the first of
            :data:`TORCHRL_LOG_PROB_KEYS` present; both present is ambiguous (with
            ``composite_lp_aggregate`` the aggregate ``"sample_log_prob"`` can sit beside a
            per-component ``"action_log_prob"``) and raises, asking for this argument.

    Returns:
        ``dict`` with ``rewards``, ``values``, ``terminated``, ``truncated``, ``bootstrap_values``
        (``[*B, T]`` views of the entries where possible; flags as bool) and ``log_probs`` when
        present.
    """
    if not isinstance(td, TensorDictBase):
        raise TypeError(f"td must be a TensorDict (TensorDictBase), got {type(td).__name__}")
    if td.batch_dims < 1:
        raise ValueError("td must have at least one batch dimension (time, last), got batch_size []")

    def required(key: _Key, what: str) -> torch.Tensor:
        x = td_entry(td, key)
        if x is None:
            raise ValueError(f"td is missing the key {_key_str(key)} ({what})")
        return x

    out = {
        "rewards": _float(required(("next", "reward"), "rewards r_t"), "td[('next', 'reward')]"),
        "values": _float(required("state_value", "values V(s_t)"), "td['state_value']"),
    }
    terminated = as_flags(
        required(("next", "terminated"), "terminated flags; rollbuf needs terminated separately from done"),
        "td[('next', 'terminated')]",
    )
    truncated = td_entry(td, ("next", "truncated"))
    if truncated is not None:
        truncated = as_flags(truncated, "td[('next', 'truncated')]")
    else:
        done = td_entry(td, ("next", "done"))
        if done is not None:
            truncated = as_flags(done, "td[('next', 'done')]") & ~terminated
        else:
            truncated = torch.zeros(terminated.shape, dtype=torch.bool, device=terminated.device)
    out["terminated"] = terminated
    out["truncated"] = truncated
    out["bootstrap_values"] = _float(
        required(("next", "state_value"), "bootstrap values V(s'_t); run the value network on td['next']"),
        "td[('next', 'state_value')]",
    )

    if log_prob_key is None:
        present = [k for k in TORCHRL_LOG_PROB_KEYS if k in td.keys()]
        if len(present) > 1:
            raise ValueError(
                f"td has both {present[0]!r} and {present[1]!r}; pass log_prob_key= to say which "
                "is the behaviour log-probability log μ(a_t|s_t)"
            )
        log_prob_key = present[0] if present else None
        lp = td_entry(td, log_prob_key) if log_prob_key is not None else None
    else:
        lp = td_entry(td, log_prob_key)
        if lp is None:
            raise ValueError(f"td is missing the key {_key_str(log_prob_key)} (log_prob_key)")
    if lp is not None and log_prob_key is not None:  # lp is read at a key
        out["log_probs"] = _float(lp, f"td[{_key_str(log_prob_key)}]")
    return out


def torchrl_from_fields(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    bootstrap_values: torch.Tensor | None = None,
    log_probs: torch.Tensor | None = None,
    *,
    log_prob_key: _Key = "action_log_prob",
) -> TensorDict:
    """A TorchRL-layout TensorDict from rollbuf fields; inverse of :func:`fields_from_torchrl`.

    **Target convention**: ``batch_size = rewards.shape = [*B, T]`` (time last); per-step scalars
    get TorchRL's trailing singleton feature dim (``[*B, T, 1]``, views via ``unsqueeze``):
    ``("next", "reward")``, ``"state_value"``, ``("next", "state_value")`` (when
    ``bootstrap_values`` is given), ``("next", "terminated")``, ``("next", "truncated")`` and
    ``("next", "done") = terminated | truncated`` (bool). The log-probability is stored without a
    feature dim, ``[*B, T]``, under ``log_prob_key`` (default ``"action_log_prob"``, tensordict's
    default key). Root (observation-aligned) ``"done"`` flags, observations and actions are not
    written.

    Example (one env, T = 3)::

        >>> td = torchrl_from_fields(
        ...     rewards=torch.tensor([1., 2., 3.]), values=torch.tensor([.5, .6, .7]),
        ...     terminated=torch.tensor([False, True, False]),
        ...     truncated=torch.tensor([False, False, True]))
        >>> td["next", "done"].squeeze(-1), td["next", "reward"].shape
        (tensor([False,  True,  True]), torch.Size([3, 1]))

    Args:
        rewards, values: ``[*B, T]`` float.
        terminated, truncated: ``[*B, T]`` flags (bool, integer or 0/1 float).
        bootstrap_values: optional ``[*B, T]`` float, ``V(s'_t)``.
        log_probs: optional ``[*B, T]`` float, ``log μ(a_t|s_t)``.

    Returns:
        ``TensorDict`` with ``batch_size = rewards.shape`` on ``rewards.device``.
    """
    rewards = _float(rewards, "rewards")
    _time_axis(rewards, "rewards", nonempty=False)
    values = _float(values, "values")
    terminated = _check_flag_dtype(terminated, "terminated")
    truncated = _check_flag_dtype(truncated, "truncated")
    _one_device(("rewards", rewards), ("values", values), ("terminated", terminated), ("truncated", truncated))
    _same(values, "values", rewards, "rewards")
    _same(terminated, "terminated", rewards, "rewards")
    _same(truncated, "truncated", rewards, "rewards")
    terminated = as_flags(terminated, "terminated")
    truncated = as_flags(truncated, "truncated")

    nxt = {
        "reward": rewards.unsqueeze(-1),
        "terminated": terminated.unsqueeze(-1),
        "truncated": truncated.unsqueeze(-1),
        "done": (terminated | truncated).unsqueeze(-1),
    }
    if bootstrap_values is not None:
        bootstrap_values = _float(bootstrap_values, "bootstrap_values")
        _same(bootstrap_values, "bootstrap_values", rewards, "rewards")
        nxt["state_value"] = bootstrap_values.unsqueeze(-1)
    root: dict[_Key, torch.Tensor] = {"state_value": values.unsqueeze(-1)}
    if log_probs is not None:
        log_probs = _float(log_probs, "log_probs")
        _same(log_probs, "log_probs", rewards, "rewards")
        root[log_prob_key] = log_probs
    batch = rewards.shape
    td = TensorDict(root, batch_size=batch, device=rewards.device)
    td.set("next", TensorDict(nxt, batch_size=batch, device=rewards.device))
    return td


# --------------------------------------------------------------------------------------- verl


def fields_from_verl(
    token_level_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor
) -> dict:
    """rollbuf fields from verl's PPO inputs (``compute_gae_advantage_return``).

    **Source convention** (verl ``core_algos.compute_gae_advantage_return``, multi-turn version):
    ``token_level_rewards``, ``values`` and ``response_mask`` are ``[bs, response_length]`` (time
    last, like rollbuf); step ``t`` is response token ``t``. ``response_mask[:, t] = 0`` marks
    tokens that are not agent actions (tool/observation tokens in multi-turn rollouts, padding
    after EOS). verl's backward loop carries ``nextvalues`` and ``lastgaelam`` unchanged across
    those positions: they are *skipped*, and the reward/value there is ignored, exactly as
    rollbuf's ``mask`` (carry-forward: as if the masked steps were deleted and the row closed up).
    The loop starts from ``nextvalues = 0``, so the last token with ``response_mask = 1`` is
    **terminal** (no bootstrap): hence ``window_end="terminal"`` in the result, which asks rollbuf
    for a zero bootstrap at the window end explicitly. verl has no episode flags inside a row.

    Differences to keep in mind: verl leaves the carried ``lastgaelam`` at masked positions where
    rollbuf writes 0 (both are discarded by the loss mask), and verl then whitens the advantages
    with ``masked_whiten(advantages, response_mask)``; ``returns = advantages + values`` is taken
    before whitening in both.

    Example (one sequence, 3 tokens: an action token, a tool token, a final action token)::

        >>> f = fields_from_verl(torch.tensor([[0., 0., 1.]]),      # token_level_rewards
        ...                      torch.tensor([[.2, .9, .4]]),      # values
        ...                      torch.tensor([[1, 0, 1]]))         # response_mask
        >>> f["mask"], f["window_end"]
        (tensor([[ True, False,  True]]), 'terminal')

    Args:
        token_level_rewards: ``[*B, T]`` float (verl's score plus any in-reward KL penalty).
        values: ``[*B, T]`` float, the critic's values.
        response_mask: ``[*B, T]`` bool, integer or 0/1 float.

    Returns:
        ``dict(rewards=token_level_rewards, values=values, mask=<bool>, window_end="terminal")``;
        rewards and values are the input tensors themselves, ``mask`` is ``response_mask`` when it
        is bool, else ``response_mask != 0``.
    """
    rewards = _float(token_level_rewards, "token_level_rewards")
    _time_axis(rewards, "token_level_rewards", nonempty=False)
    values = _float(values, "values")
    mask = _check_flag_dtype(response_mask, "response_mask")
    _one_device(("token_level_rewards", rewards), ("values", values), ("response_mask", mask))
    _same(values, "values", rewards, "token_level_rewards")
    _same(mask, "response_mask", rewards, "token_level_rewards")
    return {
        "rewards": rewards,
        "values": values,
        "mask": as_flags(mask, "response_mask"),
        "window_end": "terminal",
    }
