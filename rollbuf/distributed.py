"""The estimators on rows sharded in time across ranks (context parallelism over ``torch.distributed``).

Each rank of ``group`` holds a contiguous time shard ``[*B, T_r]`` of the same rows, rank order =
time order (rank 0 holds the first steps); shards may be uneven and empty (``T_r = 0``). Every
function here takes the arguments of its :mod:`rollbuf.functional` namesake plus ``group=`` and
returns on each rank exactly that rank's slice of what the functional estimator returns on the
unsharded rows. The ranks exchange one ``all_gather`` of ``O(N)`` numbers per call, never the data
(``docs/distributed.md``: the communication model and the expected scaling).

**How** (``docs/distributed.md``, "How it works"). Every estimator is an affine scan, so a shard is
one affine map from the state past its end (in scan order) to the state at its start. Each rank
computes its shard's map (:func:`rollbuf.backends.torch_backend.window_map`, on every backend: a
difference of two kernel runs would lose the relative precision of ``b``) and, backward, its
candidate window-end state with a priority (the row's window end, its last unmasked step, may be on
an earlier rank); all-gathers them; composes the later (backward) or earlier (forward) ranks' maps
into its own carry; and runs the local estimator on its shard with that carry.

**Window-level arguments** (``gamma``, ``lam``, ..., ``window_end``, ``carry``, ``initial``, a
``[*B]`` ``bootstrap_values``) are passed identically on every rank; each rank's call is validated
like a functional call on its shard (so ``bootstrap_values`` is required on every rank unless
``carry=`` or ``window_end="terminal"`` is given: any rank may hold a row's window end). ``carry=``
is read from the last rank, ``initial=`` from rank 0. ``bootstrap_values[..., -1]`` of a rank that
does not hold the row's window end is not read (unless that step is truncated). A ``[*B]``
``bootstrap_values`` is the window-end column only, as in :mod:`rollbuf.functional`: a truncation at
the last live step of a rank that does not hold the row's window end reads NaN, and the row is NaN
from that step back, on every rank that holds part of it (found with the exchange: no device sync).
``return_carry=True`` returns the carry of the *whole* window (the state at rank 0's first step) on
every rank, and the forward estimators' ``final`` is the whole window's ``final`` on every rank:
both chain the next window without further communication.

Validation happens before the exchange: a rank that raises leaves the others waiting in the
collective (as with any collective). ``backend="reference"`` is rejected (it computes whole rows).
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from rollbuf import backends, functional, windows
from rollbuf.backends import scan, torch_backend
from rollbuf.boundary import coefficients as C
from rollbuf.problem import Family, Problem

__all__ = [
    "gae",
    "advantages",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_sums",
]

_PAIR = 5  # coefficients (p, q, s, a, w) of a V-trace map


def _group_info(group):
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "rollbuf.distributed needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group); for one process use rollbuf.functional"
        )
    return dist, dist.get_rank(group), dist.get_world_size(group)


def _all_gather(dist, payload, world, group):
    """``[N, k]`` on every rank -> ``[N, k, world]`` (gloo and NCCL both have list all_gather)."""
    payload = payload.contiguous()
    out = [torch.empty_like(payload) for _ in range(world)]
    dist.all_gather(out, payload, group=group)
    return torch.stack(out, dim=-1)


def _apply(maps, z, pair):
    """Apply the (batched) map ``maps`` to the state ``z`` (``[N]``, or ``[N, 2]`` for V-trace)."""
    if pair:
        P, Q, S, A, W = maps
        u, v = z[:, 0], z[:, 1]
        return torch.stack([A + P * u + Q * v, W + S * v], -1)
    a, b = maps
    return a + b * z


def _exchange(p: Problem, backend, *, group, column=False):
    """The backend seam of a sharded call: this rank's validated shard problem in, its outputs and
    the whole window's carry out (``run`` of :func:`rollbuf.functional.call`). ``column``: the call
    gave a ``[*B]`` ``bootstrap_values`` with truncations (validation placed it at this shard's
    window end)."""
    if backend == "reference":
        raise ValueError(
            "rollbuf.distributed runs the torch or triton backend on each shard; backend='reference' "
            "computes whole rows only (gather the shards and call rollbuf.functional)"
        )
    dist, rank, world = _group_info(group)
    dt = p.compute_dtype
    # 1. this shard's map, and (backward) its window-end candidate with its priority
    maps = tuple(torch.as_tensor(x, dtype=dt, device=p.main.device) for x in torch_backend.window_map(p))
    if p.family == Family.FORWARD:
        # 2. the exchange: one all_gather of O(N) numbers per rank; 3. the carries; 4. the local run
        g = _all_gather(dist, _forward_payload(p, maps, rank), world, group)
        local, final = _forward_carry(p, g, rank)
        outs, carry = backends.run(local, backend)
        return (*outs[:-1], final.to(dt)), carry  # the whole window's final, on every rank
    g = _all_gather(dist, _backward_payload(p, maps, rank, world, column), world, group)
    local, whole = _backward_carry(p, g, rank, column)
    outs, carry = backends.run(local, backend)
    return outs, (whole.to(dt) if p.want_carry else carry)


def _forward_payload(p: Problem, maps, rank):
    """``[N, F + 1]``: this shard's forward map ``(a, b)``; rank 0 folds ``initial`` in (its map
    becomes a constant)."""
    a, b = maps
    a = a.reshape(p.main.shape[0], math.prod(p.feature_shape))
    if rank == 0:
        if p.carry is not None:
            a = a + b.unsqueeze(-1) * p.carry.reshape(a.shape).to(a.dtype)
        b = torch.zeros_like(b)
    return torch.cat([a, b.unsqueeze(-1)], -1)


def _forward_carry(p: Problem, g, rank):
    """This shard's problem with its ``initial`` (the composed maps of the earlier ranks), and the
    whole window's ``final``, from the gathered ``[N, F + 1, R]``."""
    N, Fn = g.shape[0], g.shape[1] - 1
    prefix = scan.doubling_scan((g[:, :Fn, :], g[:, Fn:, :]), C.compose, reverse=False)[0]  # b = 0
    feat = p.feature_shape
    initial = p.carry if rank == 0 else prefix[..., rank - 1].reshape(N, *feat)
    local = p.evolve(carry=None if initial is None else initial.to(p.compute_dtype))
    return local, prefix[..., -1].reshape(N, *feat)


def _backward_payload(p: Problem, maps, rank, world, column):
    """``[N, k]``: this shard's map, its window-end candidate (the state past the row's window end
    if that were on this rank), whether its last live step reads a ``[*B]`` column, its priority."""
    main, dt = p.main, p.compute_dtype
    N, T = main.shape[0], main.shape[1]
    m = p.fields.get("mask")
    cand = p.carry.to(dt) if p.carry is not None else torch_backend.end_carry(p, dt)
    # priority of this rank as the row's window end: a live step (2) beats a non-empty shard
    # (1, only used by rows with no live step at all: their carry is V(s_T) of the last column)
    if m is None:
        prio = torch.full((N,), 2.0 if T else 0.0, dtype=dt, device=main.device)
    else:
        prio = (m != 0).any(-1).to(dt) + (1.0 if T else 0.0)
    if p.carry is not None and rank == world - 1:
        prio = torch.full_like(prio, 3.0)  # a chained window: the state past it is `carry`
    cand = cand.reshape(N, 2 if p.pair else 1)
    # a [*B] column: whether this shard's last live step is truncated and reads it (interior
    # to the row when another rank holds the row's window end)
    reads = _reads_shard_end(p) if column else torch.zeros(N, dtype=torch.bool, device=main.device)
    return torch.cat([torch.stack(maps, -1), cand, reads.to(dt).unsqueeze(-1), prio.unsqueeze(-1)], -1)


def _backward_carry(p: Problem, g, rank, column):
    """This shard's problem with its carry (the later ranks' maps composed with the window-end
    owner's state), and the whole window's carry, from the gathered ``[N, k, R]``."""
    N, world, pair = g.shape[0], g.shape[-1], p.pair
    k, nc = (_PAIR, 2) if pair else (2, 1)
    ranks = torch.arange(world, device=g.device)
    score = g[:, -1, :].round().long() * world + ranks  # last rank of the highest priority
    owner = score.amax(-1) % world  # [N]
    z_end = g[:, k:k + nc, :].gather(-1, owner.view(N, 1, 1).expand(N, nc, 1)).squeeze(-1)  # [N, nc]
    z_end = z_end if pair else z_end.squeeze(-1)
    suffix = scan.doubling_scan(tuple(g[:, i, :] for i in range(k)), C.compose_pair if pair else C.compose,
                                reverse=True)
    whole = _apply(tuple(s[:, 0] for s in suffix), z_end, pair)
    mine = z_end if rank == world - 1 else _apply(tuple(s[:, rank + 1] for s in suffix), z_end, pair)
    if not column:
        return p.evolve(carry=mine), whole
    # a truncation before the row's window end read the column: NaN from there back
    interior = (g[:, k + nc, :] != 0) & (ranks != owner.unsqueeze(-1))  # [N, R]
    later = interior[:, rank + 1:].any(-1)
    nan = torch.full((), float("nan"), dtype=mine.dtype, device=g.device)
    fields = p.fields
    if p.main.shape[1]:  # (an empty shard reads no bootstrap value)
        bv = fields["bootstrap_values"]
        assert bv is not None  # `column`: the call gave a [*B] bootstrap_values
        fields = dict(fields, bootstrap_values=torch.where(interior[:, rank].unsqueeze(-1), nan.to(bv.dtype), bv))
    lift = (N, *([1] * (mine.dim() - 1)))
    local = p.evolve(carry=torch.where(later.view(lift), nan, mine), fields=fields)
    return local, torch.where(interior.any(-1).view(N, *([1] * (whole.dim() - 1))), nan, whole)


def _reads_shard_end(p: Problem):
    """``[N]`` bool: this shard's last live step is truncated, not terminated, and so reads
    ``bootstrap_values`` there."""
    t = windows.bootstrap_read(p.fields.get("terminated"), p.fields.get("truncated"), p.fields.get("mask"))
    if t is None:
        raise ValueError("a [*B] bootstrap_values column is read at truncations: truncated must be given")
    if t.shape[-1] == 0:  # an empty shard: no step
        return torch.zeros(t.shape[:-1], dtype=torch.bool, device=t.device)
    j = windows.window_end_index(p.fields.get("mask"), t.shape, t.device)
    return t.gather(-1, j.clamp(min=0).unsqueeze(-1)).squeeze(-1) & (j >= 0)


def _distributed(fn):
    """``rollbuf.distributed.<name>``: ``fn`` with ``group=``, its shard's carry exchanged."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, group=None, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for p in sig.parameters.values():  # **kwargs of the wrapper: its keyword arguments by name
            if p.kind == inspect.Parameter.VAR_KEYWORD:
                arguments.update(arguments.pop(p.name, {}))
        bv, tr, r = arguments.get("bootstrap_values"), arguments.get("truncated"), arguments.get("rewards")
        column = (isinstance(bv, torch.Tensor) and isinstance(r, torch.Tensor) and tr is not None
                  and bv.dim() == r.dim() - 1)
        return functional.call(fn.__name__, arguments, run=functools.partial(_exchange, group=group, column=column))

    params = list(sig.parameters.values())
    extra = inspect.Parameter("group", inspect.Parameter.KEYWORD_ONLY, default=None)
    at = len(params) - (params[-1].kind == inspect.Parameter.VAR_KEYWORD)
    # set through __dict__: typeshed's type of a functools.wraps wrapper has no __signature__
    wrapper.__dict__["__signature__"] = sig.replace(parameters=params[:at] + [extra] + params[at:])
    wrapper.__doc__ = (
        f"Time-sharded :func:`rollbuf.functional.{fn.__name__}`: this rank's slice of the result on "
        "rows whose time is sharded across ``group`` (rank order = time order); see "
        ":mod:`rollbuf.distributed`.\n\n" + (fn.__doc__ or "")
    )
    wrapper.__module__ = __name__
    return wrapper


gae = _distributed(functional.gae)
advantages = _distributed(functional.advantages)
lambda_returns = _distributed(functional.lambda_returns)
discounted_returns = _distributed(functional.discounted_returns)
vtrace = _distributed(functional.vtrace)
retrace = _distributed(functional.retrace)
eligibility_traces = _distributed(functional.eligibility_traces)
episodic_sums = _distributed(functional.episodic_sums)
