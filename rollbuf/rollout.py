"""``Rollout``: a TensorDict-backed tensorclass holding one window of experience, time last."""

from __future__ import annotations

import operator
import sys
from collections.abc import ItemsView
from typing import TYPE_CHECKING

import torch
from tensordict import tensorclass

from rollbuf import functional as F
from rollbuf import windows
from rollbuf.boundary import conventions as C


def _index(v) -> int | None:
    """``v`` as an int: a Python int, a NumPy integer or a 0-d integer tensor; ``None`` for anything
    else (a ``bool``, NumPy's or a bool tensor included: a flag is not a size or a step)."""
    if isinstance(v, bool) or (isinstance(v, torch.Tensor) and (v.dtype == torch.bool or v.dim())):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _sizes(name, v) -> tuple[int, ...]:
    """``v`` as a tuple of non-negative ints (an int or a sequence of them), else a ValueError naming it."""
    items = (v,) if not isinstance(v, (tuple, list, torch.Size)) else tuple(v)
    out = []
    for x in items:
        n = _index(x)
        if n is None or n < 0:
            raise ValueError(f"{name} must be a non-negative int or a tuple of them, got {v!r}")
        out.append(n)
    return tuple(out)


def _real_tensor(name, value, device) -> torch.Tensor:
    """``value`` as a tensor on ``device`` (``torch.as_tensor``); a complex value is refused (writing
    it into a real field would drop its imaginary part)."""
    value = torch.as_tensor(value, device=device)
    if value.is_complex():
        raise TypeError(f"{name} must be real, got a complex value ({value.dtype}); its imaginary part "
                        "would be dropped")
    return value


def _is_numpy(v) -> bool:
    """Whether ``v`` is a NumPy array or scalar (NumPy is not imported for this: without it loaded,
    nothing is one)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(v, (np.ndarray, np.number))


def _stamp(t: torch.Tensor) -> tuple:
    """``(t, its version counter, its storage address)``: a later stamp of the same tensor differs
    once it was written in place (``x[...] = y``, ``copy_``, ...) or given new storage (``x.data = y``).
    Both are host-side counters: no device sync."""
    return (t, t._version, t.data_ptr())


class _Placeholders(dict):
    """A rollout's never-written fields by name (:func:`_stamp` of each). Tied to this rollout's
    tensors, so a copy of the rollout starts without any (it counts as built from tensors)."""

    def __copy__(self):
        return _Placeholders()

    def __deepcopy__(self, memo):
        return _Placeholders()

    def __reduce__(self):
        return _Placeholders, ()


# The fields Rollout.empty allocates as NaN placeholders, and the call that writes each: an
# estimator that reads one that was never written raises, naming it (no NaN outputs to chase).
_WRITTEN_BY = {
    "rewards": "record(t, rewards=...)",
    "values": "record(t, values=...)",
    "log_probs": "record(t, log_probs=...)",
    "bootstrap_values": "Rollout.bootstrap(last_values)",
}


_STEP_FIELDS = ("rewards", "values", "terminated", "truncated", "log_probs", "bootstrap_values", "mask")
_OWN = ("rewards", "values", "terminated", "truncated", "bootstrap_values", "mask")  # what estimator_fields() passes
_OWN_SET = frozenset(_OWN)
_FLAG_FIELDS = frozenset(("terminated", "truncated", "mask"))
_FLAG_DTYPES = (torch.bool, torch.uint8)
# entries of a rollout's placeholders that are not fields: the window was closed by bootstrap(), and
# recorded again since
_CLOSED, _REOPENED = "(closed)", "(reopened)"


_ROLLOUT_DOC = """A window of ``[*B, T]`` steps (``B`` = envs, or envs × agents; time is the last dim).

    Fields (docs/semantics.md), all ``[*B, T]``: ``rewards``, ``values`` (V(s_t)), ``terminated``,
    ``truncated``, ``log_probs`` (behaviour policy), ``bootstrap_values`` (V(s'_t), read only
    after truncations and at the window end) and an optional ``mask`` (``False`` = not an agent
    step). Flags are transition-aligned: a flag at ``t`` says what happened after ``a_t``.

    Fill it while collecting with :meth:`record`, close the window with :meth:`bootstrap`, then call
    an estimator (one that reads a field :meth:`empty` left unwritten, or the window end of a window
    never closed, raises a ``ValueError`` naming it and the call that writes it). Tensorclass
    indexing (``ro[:16]``, ``ro[..., :64]``), ``ro.to(device)``, ``torch.stack`` and ``torch.cat``
    work as for any tensorclass.
    """


@tensorclass(shadow=True)  # shadow: `values` is a reserved TensorDict name
class Rollout:
    __doc__ = _ROLLOUT_DOC  # (set again below: tensordict < 0.15 replaces it)

    rewards: torch.Tensor
    values: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor | None = None  # None: no step was truncated (e.g. verl's rows)
    log_probs: torch.Tensor | None = None
    bootstrap_values: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    if TYPE_CHECKING:  # what @tensorclass adds at runtime, as a type checker should see it
        batch_size: torch.Size

        def __init__(self, *, rewards: torch.Tensor, values: torch.Tensor, terminated: torch.Tensor,
                     truncated: torch.Tensor | None = None, log_probs: torch.Tensor | None = None,
                     bootstrap_values: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                     batch_size=None, device=None) -> None: ...

        def items(self) -> ItemsView[str, torch.Tensor]: ...

    def __post_init__(self):
        # every construction path (direct, indexing, stacking, .to) ends here: the batch must be the
        # fields' own shape [*B, T], or every estimator would read a wrong T
        r = self.rewards
        if isinstance(r, torch.Tensor) and tuple(self.batch_size) != tuple(r.shape):
            raise ValueError(
                f"Rollout needs batch_size=[*B, T] equal to the fields' shape: rewards has shape "
                f"{tuple(r.shape)} but batch_size is {list(self.batch_size)}; pass "
                f"batch_size={list(r.shape)}"
            )

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def empty(cls, num_envs, horizon, *, device=None, dtype=torch.float32, with_mask=False):
        """A window to fill with :meth:`record`: float fields NaN (so a step never recorded shows
        up), flags False. ``num_envs`` may be an int or a tuple of leading batch dims; it and
        ``horizon`` take Python ints, NumPy integers and 0-d integer tensors (never a bool).

        The rollout tracks which float fields were written — recorded, written in place or
        assigned — by their version counters (host-side, no device sync, the data never read):
        an estimator method that reads one never written raises a ``ValueError`` naming it and
        ``record(t, <field>=...)``; one that reads the window end (``window_end='bootstrap'``,
        no ``carry=``) before :meth:`bootstrap` closed the window raises naming
        ``Rollout.bootstrap(last_values)`` (bootstrap values recorded with :meth:`record`, V(s'_t)
        after truncations, do not close it). A rollout built from tensors has no such placeholder."""
        B = _sizes("num_envs", num_envs)
        T = _index(horizon)
        if T is None or T < 0:
            raise ValueError(f"horizon must be a non-negative int, got {horizon!r}")
        horizon = T
        if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
        shape = (*B, horizon)
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError, TypeError) as e:  # e.g. "cuda" without CUDA: torch's bare assertion
            raise ValueError(f"Rollout.empty: device={device!r} cannot hold tensors here ({e})") from None

        def nan():
            return torch.full(shape, float("nan"), dtype=dtype, device=device)

        def false():
            return torch.zeros(shape, dtype=torch.bool, device=device)

        ro = cls(
            rewards=nan(), values=nan(), terminated=false(), truncated=false(), log_probs=nan(),
            bootstrap_values=nan(), mask=torch.ones(shape, dtype=torch.bool, device=device) if with_mask else None,
            batch_size=list(shape), device=device,
        )
        # the NaN placeholders, each with its version counter (bumped by every in-place write, on
        # the host: no device sync) and storage address: one counts as written once it is recorded,
        # written in place or assigned (:meth:`_unwritten`); bootstrap_values once the window is closed
        pending = _Placeholders()
        for name in _WRITTEN_BY:
            pending[name] = _stamp(getattr(ro, name))
        object.__setattr__(ro, "_pending", pending)  # an instance attribute, not a field
        return ro

    def _unwritten(self, name, current=None) -> bool:
        """Whether field ``name`` is still the NaN placeholder :meth:`empty` allocated, never written:
        not recorded, not written in place, not assigned (``bootstrap_values``: the window never
        closed with :meth:`bootstrap`). A rollout built from tensors (the constructor,
        :meth:`from_torchrl`, or indexing, ``.to``, stacking another rollout) has none."""
        pending = self.__dict__.get("_pending")
        if pending is None:
            return False
        hit = pending.get(name)
        if hit is None:
            return False
        if (getattr(self, name) if current is None else current) is hit[0] and _stamp(hit[0]) == hit:
            return True
        del pending[name]  # assigned, or written in place, since
        return False

    def _require(self, method, names):
        """Raise a ValueError naming the first of ``names`` that :meth:`method` would read unwritten."""
        if not self.__dict__.get("_pending"):
            return
        for name in names:
            if not self._unwritten(name):
                continue
            if name == "bootstrap_values":
                raise ValueError(
                    f"Rollout.{method} reads bootstrap_values at the window end (V(s_T)), but this "
                    "rollout's window was never closed: call Rollout.bootstrap(last_values) first "
                    "(or pass window_end='terminal' if the window ends in terminal states, or carry= "
                    "to chain it)"
                )
            raise ValueError(
                f"Rollout.{method} reads {name}, which was never written (Rollout.empty fills it with "
                f"NaN): record it with {_WRITTEN_BY[name]}, or assign it"
            )

    def record(self, t, **step):
        """Write step ``t`` of every env: ``record(t, rewards=r, values=v, terminated=te, ...)``.

        Each value is ``[*B]`` (one entry per env; anything ``torch.as_tensor`` takes, but not a
        complex value: a TypeError naming the field). ``t`` is an integer in ``[-T, T)`` (negative:
        from the end). ``bootstrap_values`` is V(s'_t) of the *true* successor (Gymnasium's final
        observation on truncation); record it where truncated.
        """
        T = self.batch_size[-1]
        t_in = t
        t = _index(t)  # ints, NumPy integers, 0-d integer tensors; never a bool
        if t is None or not -T <= t < T:
            raise IndexError(f"t must be an int step index in [{-T}, {T}) (negative: from the end), got {t_in!r}")
        for name, value in step.items():
            if name not in _STEP_FIELDS:
                raise TypeError(f"record() got an unknown field {name!r}; fields: {_STEP_FIELDS}")
            if value is None:
                continue
            col = getattr(self, name)
            if col is None:
                raise ValueError(f"{name} was not allocated for this rollout; construct it with that field")
            x = _real_tensor(f"{name} at step {t}", value, col.device)
            if name in _FLAG_FIELDS and not (x.dtype in _FLAG_DTYPES or x.is_floating_point()):
                raise TypeError(
                    f"{name} at step {t} must be a bool, uint8 or floating-point flag (nonzero = set, as "
                    f"every estimator reads a flag), got dtype {x.dtype}; pass a bool array"
                )
            if tuple(x.shape) != tuple(col.shape[:-1]):
                raise ValueError(f"{name} at step {t} must have shape {tuple(col.shape[:-1])}, "
                                 f"got {tuple(x.shape)}")
            # a recorded bootstrap value (V(s'_t) after a truncation) does not close the window:
            # bootstrap_values stays unwritten for the window end until bootstrap()
            end_open = name == "bootstrap_values" and self._unwritten(name, col)
            col[..., t] = x
            if end_open:
                self.__dict__["_pending"][name] = _stamp(col)
            elif name in _WRITTEN_BY:
                self._unwritten(name, col)  # drops it from the placeholders (written in place now)
        if step and self._closed_once():  # a new window recorded over a closed one: closed again by bootstrap()
            self.__dict__["_pending"][_REOPENED] = True
        return self

    def _closed_once(self) -> bool:
        """Whether :meth:`bootstrap` closed this rollout's window (and it was not reopened since)."""
        pending = self.__dict__.get("_pending")
        return pending is not None and pending.get(_CLOSED) is True and _REOPENED not in pending

    def bootstrap(self, last_values):
        """Close the window: ``V(s_T)``, the value of the state after the last step, ``[*B]`` (a
        tensor or a NumPy array, as :meth:`record` takes them).

        Written into ``bootstrap_values`` at each row's window end — the last step, or the last
        unmasked step when there is a ``mask`` (that is where the estimators read it) —
        where that step did not end its episode (a truncated last step keeps the value of its true
        final state recorded with it). A row with no unmasked step gets it in its last column.
        """
        if _is_numpy(last_values):  # as record() takes them
            last_values = torch.as_tensor(last_values, device=self.values.device)
        if not isinstance(last_values, torch.Tensor):
            raise TypeError(f"last_values must be a torch.Tensor or a NumPy array, got {type(last_values).__name__}")
        if last_values.is_complex():
            raise TypeError(f"last_values must be real, got a complex value ({last_values.dtype}); its "
                            "imaginary part would be dropped")
        B = tuple(self.batch_size[:-1])
        if tuple(last_values.shape) != B:
            raise ValueError(f"last_values must have shape {B}, got {tuple(last_values.shape)}")
        if self.bootstrap_values is None:
            self.bootstrap_values = torch.full_like(self.values, float("nan"))
        T = self.batch_size[-1]
        if T == 0:
            return self._closed()
        j = windows.window_end_index(self.mask, self.batch_size, self.values.device)
        live_end = (j >= 0).unsqueeze(-1)  # a row with no unmasked step: its last column, flags ignored
        j = torch.where(j < 0, T - 1, j).unsqueeze(-1)
        done = self.terminated != 0
        if self.truncated is not None:
            done = done | (self.truncated != 0)
        done = done.gather(-1, j) & live_end  # flags at a masked step are ignored
        col = self.bootstrap_values.gather(-1, j)
        new = torch.where(done, col, last_values.unsqueeze(-1).to(col.dtype))
        self.bootstrap_values.scatter_(-1, j, new)
        return self._closed()

    def _closed(self):
        """Mark the window closed (bootstrap_values written for the window end); returns ``self``."""
        pending = self.__dict__.get("_pending")
        if pending is None:
            pending = _Placeholders()
            object.__setattr__(self, "_pending", pending)
        pending.pop("bootstrap_values", None)
        pending.pop(_REOPENED, None)
        pending[_CLOSED] = True
        return self

    # -- estimators -----------------------------------------------------------------------------
    # Each method is the functional call on the rollout's fields as they are now (read through the
    # public tensorclass API on every call: writes in place, assigned fields and new storage are all
    # seen), after the host-side check that no field it reads was left unwritten (:meth:`_check`).

    def _field_tensors(self) -> dict:
        """The rollout's fields by name, as they are now (absent ones missing)."""
        if torch.compiler.is_compiling():  # Dynamo traces the fields one by one
            return {name: getattr(self, name) for name in _STEP_FIELDS}
        return dict(self.items())

    def estimator_fields(self):
        """The fields the TD(λ)-family methods pass to :mod:`rollbuf.functional`, by name: the tensors
        themselves (no copy), absent ones ``None``; ``F.gae(0.99, 0.95, **ro.estimator_fields())``
        is ``ro.gae(0.99, 0.95)`` without the unwritten-field check."""
        d = self._field_tensors()
        return {name: d.get(name) for name in _OWN}

    def _check(self, method, d: dict, names, args=None):
        """Raise a ValueError naming the first of ``names`` (and ``bootstrap_values``, where ``args``
        make the window end bootstrap: ``window_end='bootstrap'``, no ``carry=``) that ``method`` would
        read unwritten (:meth:`_require`); ``d``: the fields, as :meth:`_field_tensors` gives them."""
        pending = self.__dict__.get("_pending")
        if not pending:
            return
        if args is not None and args.get("window_end", "bootstrap") == "bootstrap" and args.get("carry") is None:
            names = (*names, "bootstrap_values")
        for name in names:
            hit = pending.get(name)
            if hit is not None and d.get(name) is hit[0]:  # still the placeholder tensor: was it written?
                self._require(method, (name,))
            if name == "bootstrap_values" and _REOPENED in pending:
                raise ValueError(
                    f"Rollout.{method} reads bootstrap_values at the window end (V(s_T)), but the window was "
                    "recorded again since Rollout.bootstrap closed it: call Rollout.bootstrap(last_values) "
                    "for the new window (to keep the old V(s_T), pass it again), or pass window_end='terminal' "
                    "or carry="
                )

    def _run(self, call, method, args: dict, names=("rewards", "values")):
        """``call`` (an estimator of :mod:`rollbuf.plans`) on ``args`` and the rollout's own fields."""
        d = self._field_tensors()
        if _OWN_SET.isdisjoint(args):  # (a field given twice: the call raises the TypeError)
            self._check(method, d, names, args)
        else:
            raise TypeError(f"Rollout.{method}() got multiple values for the rollout's own field(s) "
                            f"{sorted(_OWN_SET & args.keys())} as arguments")
        for name in _OWN:
            args[name] = d.get(name)
        return call(args)

    def gae(self, gamma, lam, **kw):
        """GAE advantages and returns: :func:`rollbuf.functional.gae`."""
        kw["gamma"] = gamma
        kw["lam"] = lam
        return self._run(F.GAE, "gae", kw)

    def advantages(self, gamma, lam, **kw):
        """The default advantage estimator (GAE): :func:`rollbuf.functional.advantages`."""
        kw["gamma"] = gamma
        kw["lam"] = lam
        return self._run(F.ADVANTAGES, "advantages", kw)

    def lambda_returns(self, gamma, lam, **kw):
        """TD(λ) returns: :func:`rollbuf.functional.lambda_returns`."""
        kw["gamma"] = gamma
        kw["lam"] = lam
        return self._run(F.LAMBDA_RETURNS, "lambda_returns", kw)

    def discounted_returns(self, gamma, bootstrap=True, **kw):
        """Discounted returns: :func:`rollbuf.functional.discounted_returns`."""
        kw["gamma"] = gamma
        if bootstrap is True:
            return self._run(F.DISCOUNTED_RETURNS, "discounted_returns", kw, ("rewards",))
        d = self._field_tensors()
        if not _OWN_SET.isdisjoint(kw):
            raise TypeError(f"Rollout.discounted_returns() got multiple values for the rollout's own field(s) "
                            f"{sorted(_OWN_SET & kw.keys())} as arguments")
        if bootstrap is not False:
            return F.discounted_returns(bootstrap=bootstrap, **kw, **{n: d.get(n) for n in _OWN})
        self._check("discounted_returns", d, ("rewards",))  # Monte Carlo reads no bootstrap value
        f = {n: d.get(n) for n in _OWN}
        f["bootstrap_values"] = None
        return F.discounted_returns(bootstrap=False, **kw, **f)

    def vtrace(self, target_log_probs, gamma, rho_bar=1.0, c_bar=1.0, pg_rho_bar=None, lam=1.0, **kw):
        """V-trace: :func:`rollbuf.functional.vtrace` (``log_probs`` is the behaviour policy)."""
        kw.update(target_log_probs=target_log_probs, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar,
                  pg_rho_bar=pg_rho_bar, lam=lam)
        return self._policy(F.VTRACE, "vtrace", kw)

    def retrace(self, q_values, target_log_probs, gamma, lam=1.0, c_bar=1.0, **kw):
        """Retrace(λ): :func:`rollbuf.functional.retrace` (``values`` = E_π Q(s_t, ·))."""
        kw.update(q_values=q_values, target_log_probs=target_log_probs, gamma=gamma, lam=lam, c_bar=c_bar)
        return self._policy(F.RETRACE, "retrace", kw)

    def _policy(self, call, method, kw):
        """An off-policy estimator on the own fields and the behaviour policy's ``log_probs`` (a
        ValueError naming it when absent)."""
        d = self._field_tensors()
        self._check(method, d, ("rewards", "values", "log_probs"), kw)
        if d.get("log_probs") is None:
            raise ValueError("log_probs (the behaviour policy's log-probabilities) is required by this estimator")
        if not _OWN_SET.isdisjoint(kw) or "log_probs" in kw:
            raise TypeError(f"Rollout.{method}() got multiple values for the rollout's own field(s) "
                            f"{sorted((_OWN_SET | {'log_probs'}) & kw.keys())} as arguments")
        for name in (*_OWN, "log_probs"):
            kw[name] = d.get(name)
        return call(kw)

    def eligibility_traces(self, x, gamma, lam, initial=None, **kw):
        """Eligibility traces of ``x`` ``[*B, T, *F]``: :func:`rollbuf.functional.eligibility_traces`."""
        d = self._field_tensors()
        return F.eligibility_traces(x, gamma, lam, initial, terminated=d.get("terminated"),
                                    truncated=d.get("truncated"), mask=d.get("mask"), **kw)

    def episodic_sums(self, x=None, initial=None, **kw):
        """Running within-episode sums (default: of rewards): :func:`rollbuf.functional.episodic_sums`."""
        d = self._field_tensors()
        if x is None:
            self._check("episodic_sums", d, ("rewards",))
        return F.episodic_sums(d.get("rewards") if x is None else x, initial, terminated=d.get("terminated"),
                               truncated=d.get("truncated"), mask=d.get("mask"), **kw)

    # -- TorchRL interop ------------------------------------------------------------------------
    # Not named from_tensordict/to_tensordict: those are tensorclass's own API (the decorator
    # overwrites a from_tensordict defined here, and Rollout.from_dict and nested assignment call
    # it; to_tensordict returns the field-keyed TensorDict).

    @classmethod
    def from_torchrl(cls, td, *, log_prob_key=None, mask_key=("collector", "mask")):
        """A rollout from a TorchRL TensorDict (``td.batch_size = [*B, T]``, time last).

        Keys as in :func:`rollbuf.boundary.conventions.fields_from_torchrl`: ``("next", "reward")``,
        ``"state_value"``, ``("next", "state_value")`` (→ ``bootstrap_values``),
        ``("next", "terminated")``, ``("next", "truncated")``, the behaviour log-probability
        (``log_prob_key``, default the first of ``"action_log_prob"``/``"sample_log_prob"``
        present) and, when ``mask_key`` is present (``split_trajectories``' padding mask), ``mask``.
        Trailing singleton feature dims are squeezed; the fields are views of ``td``'s entries
        where the dtypes allow.
        """
        f = C.fields_from_torchrl(td, log_prob_key=log_prob_key)
        mask = None
        if mask_key is not None:
            m = C.td_entry(td, mask_key)
            if m is not None:
                mask = C.as_flags(m, f"td[{mask_key!r}]")
        return cls(**f, mask=mask, batch_size=list(td.batch_size), device=td.device)

    def to_torchrl(self, *, log_prob_key="action_log_prob", mask_key=("collector", "mask")):
        """This rollout as a TorchRL TensorDict (``batch_size = [*B, T]``, time last, per-step
        scalars ``[*B, T, 1]``): :func:`rollbuf.boundary.conventions.torchrl_from_fields`, plus
        ``mask`` under ``mask_key`` when the rollout has one.

        ``("next", "state_value")`` (written when ``bootstrap_values`` is not ``None``) holds
        ``V(s'_t)`` at *every* step, as TorchRL's estimators read it: ``bootstrap_values`` where
        rollbuf reads it (truncations and the window end, i.e. the last unmasked step), the value of
        the next (unmasked) step inside an episode, and 0 after a termination and on masked steps
        (TorchRL multiplies it by ``1 - terminated``; a NaN would survive that).
        """
        bv = self.bootstrap_values
        if bv is not None:
            T = self.values.shape[-1]
            mask = torch.ones_like(self.terminated, dtype=torch.bool) if self.mask is None else self.mask != 0
            steps = torch.arange(T, device=self.values.device).expand(mask.shape)
            first_at_or_after = torch.where(mask, steps, T).flip(-1).cummin(-1).values.flip(-1)
            nxt = torch.cat([first_at_or_after[..., 1:], torch.full_like(steps[..., :1], T)], -1)
            inside = self.values.gather(-1, nxt.clamp(max=T - 1))
            boundary = (nxt >= T) if self.truncated is None else (nxt >= T) | (self.truncated != 0)
            bv = torch.where(boundary, bv, inside.to(bv.dtype))
            bv = torch.where((self.terminated != 0) | ~mask, torch.zeros_like(bv), bv)
        truncated = torch.zeros_like(self.terminated, dtype=torch.bool) if self.truncated is None else self.truncated
        td = C.torchrl_from_fields(self.rewards, self.values, self.terminated, truncated,
                                   bv, self.log_probs, log_prob_key=log_prob_key)
        if self.mask is not None:
            td.set(mask_key, C.as_flags(self.mask, "mask"))
        return td


# tensordict < 0.15's @tensorclass replaces the class docstring with its signature: keep ours
Rollout.__doc__ = _ROLLOUT_DOC
