"""V-trace's registry entry (:mod:`rollbuf.estimators`): its parameters (``pg_rho_bar`` defaults to
``rho_bar``) and its row of the docs table."""

from rollbuf import spec as S
from rollbuf.boundary.coefficients import EstimatorSpec
from rollbuf.kernels.vtrace.reference import vtrace
from rollbuf.problem import Family


def _problem_params(params):
    out = dict(params)
    if out.get("pg_rho_bar") is None:
        out["pg_rho_bar"] = out["rho_bar"]
    return out


def _pg_rho_bar(name, v):
    return None if v is None else S.positive(name, v)


ESTIMATORS = (
    S.Estimator(
        "vtrace", Family.VTRACE, "backward", S.BACKWARD + S.POLICY,
        (S.GAMMA, S.Param("rho_bar", S.positive, 1.0), S.Param("c_bar", S.positive, 1.0),
         S.Param("pg_rho_bar", _pg_rho_bar, None), S.Param("lam", S.unit_interval, 1.0)),
        ("vs", "pg_advantages"), S.VTraceResult,
        S.backward_ref(lambda f, p: vtrace(*S.base(f), (f["log_probs"], f["target_log_probs"]), p.gamma, p.lam,
                                           (p.rho_bar, p.c_bar, p.pg_rho_bar), p.window_end)),
        EstimatorSpec("vtrace", "backward", "(u_t, V_t), u_t = vs_t − V_t", "u: ρ_t(local_t − V_t); V: V_t",
                      "u ← γ·nd_t·(c_t·u + ρ_t·V); V ← 0·V",
                      "vs_t = V_t + ρ_t(local_t − V_t) + γ·nd_t(ρ_t·V_{t+1} + c_t·u_{t+1}); "
                      "pg_t = ρpg_t(local_t + γ·nd_t(V_{t+1} + u_{t+1}) − V_t)",
                      "scan carry (u_T, V_T) = (0, V(s_T)) ((0, 0) if window_end='terminal')",
                      "(u_0, V_0) of the next window", ("vs", "pg_advantages")),
        problem_params=_problem_params,
    ),
)
