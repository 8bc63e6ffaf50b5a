"""The TD(λ) family's registry entries (:mod:`rollbuf.estimators`): GAE, advantages, TD(λ) returns,
bootstrapped discounted returns (λ = 1) and Monte-Carlo returns, with their rows of the docs table."""

from rollbuf import spec as S
from rollbuf.boundary.coefficients import EstimatorSpec
from rollbuf.kernels.td_lambda import reference as ref
from rollbuf.problem import Family


def _gae(f, p):
    return ref.gae(*S.base(f), p.gamma, p.lam, p.window_end)


_Z = "Z_t = (1−λ)V_t + λG_t"
_END = "scan carry Z_T = V(s_T) (0 if window_end='terminal')"
_VALUES_UNREAD = (S.Field("rewards"), S.Field("values", required=False, read=False))

ESTIMATORS = (
    S.Estimator(
        "gae", Family.TD_LAMBDA, "backward", S.BACKWARD, (S.GAMMA, S.LAM), ("advantages", "returns"), S.GAEResult,
        S.backward_ref(_gae),
        EstimatorSpec("gae", "backward", _Z, "(1−λ)V_t + λ·local_t", "γλ·nd_t",
                      "G_t = local_t + γ·nd_t·Z_{t+1}; A_t = G_t − V_t", _END, "Z_0 = V_0 + λA_0 of the next window",
                      ("advantages", "returns")),
    ),
    S.Estimator(
        "advantages", Family.TD_LAMBDA, "backward", S.BACKWARD, (S.GAMMA, S.LAM), ("advantages",), None,
        S.backward_ref(lambda f, p: _gae(f, p)[0]),
    ),
    S.Estimator(
        "lambda_returns", Family.TD_LAMBDA, "backward", S.BACKWARD, (S.GAMMA, S.LAM), ("returns",), None,
        S.backward_ref(lambda f, p: ref.lambda_returns(*S.base(f), p.gamma, p.lam, p.window_end)),
        EstimatorSpec("lambda_returns", "backward", _Z, "(1−λ)V_t + λ·local_t", "γλ·nd_t",
                      "G_t = local_t + γ·nd_t·Z_{t+1}", _END, "Z_0 = (1−λ)V_0 + λG_0 of the next window", ("returns",)),
    ),
    S.Estimator(
        "discounted_returns", Family.TD_LAMBDA, "backward", (*_VALUES_UNREAD, *S.BACKWARD[2:]), (S.GAMMA,),
        ("returns",), None,
        S.backward_ref(lambda f, p: ref.discounted_returns(*S.base(f), p.gamma, True, p.window_end)),
        EstimatorSpec("discounted_returns", "backward", "Z_t = G_t (TD(1))", "local_t", "γ·nd_t",
                      "G_t = local_t + γ·nd_t·Z_{t+1}", _END, "Z_0 = G_0 of the next window", ("returns",)),
        fixed={"bootstrap": True}, problem_params=lambda params: dict(params, lam=1.0),
    ),
    S.Estimator(
        "monte_carlo_returns", Family.TD_LAMBDA, "backward",
        (*_VALUES_UNREAD, *S.FLAGS[:2], S.Field("bootstrap_values", "bootstrap", False, read=False), S.FLAGS[2]),
        (S.GAMMA,), ("returns",), None,
        S.backward_ref(lambda f, p: ref.discounted_returns(f["rewards"], None, f.get("terminated"), f.get("truncated"),
                                                           None, f.get("mask"), p.gamma, False, "terminal")),
        EstimatorSpec("monte_carlo_returns", "backward", "Z_t = G_t", "r_t", "γ·nd_t",
                      "G_t = r_t + γ·nd_t·Z_{t+1} (truncation cuts, no bootstrap)",
                      "scan carry Z_T = 0 (G past the window is 0)", "Z_0 = G_0 of the next window", ("returns",)),
        function="discounted_returns", fixed={"bootstrap": False},
        problem_params=lambda params: dict(params, lam=1.0, no_bootstrap=True, window_end="terminal"),
    ),
)
