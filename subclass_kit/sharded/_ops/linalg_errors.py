"""Linear-algebra failures raise on every rank together.

A factorization reports a failing matrix in an ``info`` tensor. Each rank holds some of a
batch's matrices, so a check of its local ``info`` would raise on one rank alone and leave
the others hanging in their next collective. The ``*_ex`` ops of ``CHECKED`` asked to check
(and ``cholesky``, whose kernel checks itself) factor with the check off, then check the
``info`` of every rank's matrices together: ``_linalg_check_errors`` on a ShardedTensor
gathers it, so every rank raises the error (and names the batch element) the dense op
reports. (``eigh``, ``eig`` and ``svd`` have no ``info``: their kernels raise on a matrix
that does not converge -- NaN inputs -- on the rank holding it.)
"""

from __future__ import annotations

from ..placements import Replicate
from ..tensor import ShardedTensor, placements_of
from ._common import aten, move

__all__ = ["CHECKED", "checked_cholesky", "check_info", "check_errors"]

CHECKED = {
    # op: the name torch's own check reports
    aten.linalg_cholesky_ex.default: "linalg.cholesky_ex",
    aten.linalg_inv_ex.default: "linalg.inv_ex",
    aten.linalg_lu_factor_ex.default: "linalg.lu_factor_ex",
    aten._linalg_solve_ex.default: "linalg.solve_ex",
    aten.linalg_ldl_factor_ex.default: "linalg.ldl_factor_ex",
}


def checked_cholesky(args, kwargs):
    """``cholesky``'s factor: ``linalg_cholesky_ex``, then its ``info`` checked on every rank."""
    upper = args[1] if len(args) > 1 else kwargs.get("upper", False)
    L, info = aten.linalg_cholesky_ex.default(args[0], upper=upper)
    aten._linalg_check_errors.default(info, "cholesky", is_matrix=args[0].dim() == 2)
    return L


def check_info(func, args, info) -> None:
    """Check ``info``, the last result of ``func`` (one of ``CHECKED``) run with the check off."""
    aten._linalg_check_errors.default(info, CHECKED[func], is_matrix=args[0].dim() == 2)


@ShardedTensor.implements(aten._linalg_check_errors.default)
def check_errors(func, types, args, kwargs):
    """Check a factorization's ``info`` gathered on every rank: all ranks raise together,
    with the error (and the batch element) the dense op reports."""
    info = args[0]
    if type(info) is ShardedTensor:
        info = move(info, (Replicate(),) * len(placements_of(info)))
    return func(info, *args[1:], **kwargs)
