"""The kernel table: each family's :class:`~rollbuf.kernels.row.Row` by :class:`~rollbuf.problem.Family`."""

from rollbuf.kernels import affine, retrace, td_lambda, traces, turns, vtrace
from rollbuf.kernels.row import Row
from rollbuf.problem import Family

ROWS: list[Row] = [td_lambda.ROW, retrace.ROW, vtrace.ROW, traces.ROW, affine.ROW, td_lambda.ADJOINT, turns.ROW,
                   turns.GAE, turns.FILL]
FAMILIES: dict[Family, Row] = {row.family: row for row in ROWS}


def row_of(family: Family) -> Row | None:
    """The row of ``family`` (``None``: none), found in :data:`ROWS` by comparison, not in
    :data:`FAMILIES` by hashing: code that ``torch.compile`` traces calls this (Dynamo 2.11 cannot hash
    an enum that is also a ``str``, and hashes a dict's keys when it reads the dict)."""
    for row in ROWS:
        if row.family == family:
            return row
    return None
