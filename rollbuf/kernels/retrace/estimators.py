"""Retrace's registry entry (:mod:`rollbuf.estimators`) and its row of the docs table."""

from rollbuf import spec as S
from rollbuf.boundary.coefficients import EstimatorSpec
from rollbuf.kernels.retrace.reference import retrace
from rollbuf.problem import Family

ESTIMATORS = (
    S.Estimator(
        "retrace", Family.RETRACE, "backward", S.BACKWARD + S.POLICY + (S.Field("q_values"),),
        (S.GAMMA, S.Param("lam", S.unit_interval, 1.0), S.Param("c_bar", S.positive, 1.0)), ("q_targets",), None,
        S.backward_ref(lambda f, p: retrace(*S.base(f), (f["log_probs"], f["target_log_probs"]), f["q_values"],
                                            p.gamma, p.lam, p.c_bar, p.window_end)),
        EstimatorSpec("retrace", "backward", "W_t = V_t + c_t(Q^ret_t − q_t)", "V_t + c_t(local_t − q_t)",
                      "γ·nd_t·c_t", "Q^ret_t = local_t + γ·nd_t·W_{t+1}",
                      "scan carry W_T = V(s_T) (0 if window_end='terminal')",
                      "W_0 = V_0 + c_0(Q^ret_0 − q_0) of the next window", ("q_targets",)),
    ),
)
