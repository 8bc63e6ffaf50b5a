"""The kernel table: each family's :class:`~rollbuf.kernels.row.Row` by :class:`~rollbuf.problem.Family`."""

from rollbuf.kernels import affine, retrace, td_lambda, traces, vtrace
from rollbuf.kernels.row import Row
from rollbuf.problem import Family

FAMILIES: dict[Family, Row] = {row.family: row for row in (td_lambda.ROW, retrace.ROW, vtrace.ROW, traces.ROW,
                                                           affine.ROW, td_lambda.ADJOINT)}
