"""The kernel table: each family's :class:`~rollbuf.kernels.row.Row` by :class:`~rollbuf.problem.Family`."""

from rollbuf.kernels import affine, retrace, td_lambda, traces, vtrace
from rollbuf.kernels.row import Row
from rollbuf.problem import Family

FAMILIES: dict[Family, Row] = {row.family: row for row in (td_lambda.ROW, retrace.ROW, vtrace.ROW, traces.ROW,
                                                           affine.ROW, td_lambda.ADJOINT)}


def row_of(family: Family) -> Row | None:
    """The row of ``family`` (``None``: none), found by comparison rather than by hashing: code that
    ``torch.compile`` traces calls this (Dynamo 2.11 cannot hash an enum that is also a ``str``)."""
    for row in FAMILIES.values():
        if row.family == family:
            return row
    return None
