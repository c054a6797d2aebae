"""The table of the ``independent`` family: per op, its independent dims and the operands
that carry them.

Each op is one entry of ``RULES``, a ``_Rule``: a function of the arguments giving the op's
*independent* dims -- dims it never mixes (pooling's N and C, an fft's untransformed dims,
the batch dims of a matrix op) -- and the positions of the tensor arguments that carry them,
plus what the plan needs to know beyond that: the argument the op is linear in, arguments
read for their shape only, results computed from one argument alone, a rewrite of the local
arguments, the results' metadata where torch has no meta kernel. ``independent`` turns an
entry into a plan and runs it (see its docstring for the rule per mesh dim).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ... import _compat
from .._layout import contiguous_strides
from ._common import TensorMeta, aten

__all__ = ["RULES"]


class _Rule(NamedTuple):
    split: Callable  # (args, kwargs) -> (independent dims, positions of the carrying operands)
    fix: Callable | None = None  # (local args, kept dims) -> the args for the locals
    # result -> the argument it is computed from alone (a solve's LU of A): Replicate when
    # that argument is used whole
    follows: tuple = ()
    # the argument the op is linear in, the others fixed (pooling by averages, interpolation,
    # padding, fft, a backward in its incoming gradient): a Partial('sum'/'avg') of it
    # passes through, unreduced, where no shard stays
    linear: int | None = None
    # arguments a backward reads for their shape only (pooling's and padding's ``self``): a
    # Partial of one stays pending where the layout is whole (its local has that shape)
    shape_only: tuple = ()
    # (args, kwargs) -> the results' global metadata, for an op torch has no meta kernel for
    # (None: shapes that depend on the values -- computed whole)
    meta: Callable | None = None


# ---- the independent dims, as functions of the arguments ------------------------------------
def _leading(k: int, at: tuple = (0,)):
    """All dims but the last ``k`` of ``args[at[0]]`` (pooling's and padding's N and C)."""

    def split(args, kwargs):
        return tuple(range(args[at[0]].dim() - k)), at

    return split


def _first(n: int, at: tuple = (0,)):
    """The first ``n`` dims (the batch of an image op that mixes channels)."""

    def split(args, kwargs):
        return tuple(range(min(n, args[at[0]].dim()))), at

    return split


def _fft(args, kwargs):
    x = args[0]
    nd = x.dim()
    transformed = {d % nd for d in args[1]}
    return tuple(d for d in range(nd) if d not in transformed), (0,)


def _batch(*cores):
    """Leading batch dims of matrix operands: ``cores`` gives, per tensor argument, how many
    trailing dims a matrix (2), a vector (1) or a per-matrix scalar (0) takes, or a function
    of the arguments. Operands without batch dims are used whole; the rest must have one
    batch shape (a broadcast batch is not split: every operand is then used whole)."""

    def split(args, kwargs):
        batches = {}
        for i, c in enumerate(cores):
            a = args[i]
            if c is None or not isinstance(a, torch.Tensor):
                continue
            n = a.dim() - (c(args) if callable(c) else c)
            if n > 0:
                batches[i] = tuple(a.shape[:n])
        if len(set(batches.values())) != 1 or _tensor_kwargs(kwargs):
            return (), ()
        n = len(next(iter(batches.values())))
        return tuple(range(n)), tuple(batches)

    return split


def _tensor_kwargs(kwargs) -> bool:
    # pinv's atol/rtol: a tolerance per matrix would have to be cut like the batch; a scalar
    # one is used whole.
    return any(isinstance(v, torch.Tensor) and v.dim() > 0 for v in kwargs.values())


def _solve_rhs(args):
    # linalg.solve's rule: B is a batch of vectors when it is 1-D or A's shape without its
    # last dim; else a batch of matrices.
    a, b = args[0], args[1]
    return 1 if b.dim() == 1 or (b.dim() == a.dim() - 1 and tuple(b.shape) == tuple(a.shape[:-1])) else 2


def _diagonals(dims_at: int, at: tuple):
    """The dims before a diagonal's two dims (``args[dims_at]``, ``dims_at + 1`` of
    ``args[at[0]]``) when those are its last two: ``diag_embed`` and ``diagonal_scatter`` as
    the matrix ops' backward use them. Elsewhere the dims do not line up: used whole."""

    def split(args, kwargs):
        x = args[at[0]]
        nd = x.dim() + (1 if len(at) == 1 else 0)  # diag_embed adds a dim
        dflt = _DIAG_DEFAULTS[len(at)]
        d1 = args[dims_at] if len(args) > dims_at else kwargs.get("dim1", dflt[0])
        d2 = args[dims_at + 1] if len(args) > dims_at + 1 else kwargs.get("dim2", dflt[1])
        if {d1 % nd, d2 % nd} != {nd - 2, nd - 1}:
            return (), ()
        return tuple(range(nd - 2)), at

    return split


# (dim1, dim2) defaults: diag_embed's (one operand), diagonal_scatter's (two)
_DIAG_DEFAULTS = {1: (-2, -1), 2: (0, 1)}


def _untouched(idx_at: int = 1, values_at: int | None = None, mask_at: int | None = None):
    """The dims before the indexed ones of ``_unsafe_index`` / ``_unsafe_index_put`` and
    their masked forms (what compiled interpolation, padding and grid sampling and their
    backward become): with adjacent indexed dims the result keeps those leading dims in
    place. The index tensors and a mask (over the indexed block) are used whole."""

    def split(args, kwargs):
        x, idx = args[0], args[idx_at]
        used = [i for i, t in enumerate(idx) if t is not None]
        if not used or used != list(range(used[0], used[-1] + 1)):
            return (), ()  # apart, the indexed dims move to the front
        block = len(torch.broadcast_shapes(*[tuple(idx[i].shape) for i in used]))
        if mask_at is not None and args[mask_at].dim() > block:
            return (), ()  # a mask with the leading dims: not whole-able
        at: tuple = (0,)
        if values_at is not None:
            v = args[values_at]
            if not isinstance(v, torch.Tensor) or v.dim() != x.dim() - len(used) + block:
                return (), ()  # values broadcast from fewer dims: not aligned with self's
            at = (0, values_at)
        return tuple(range(used[0])), at

    return split


def _except(dim: Callable, at: tuple, *, after: bool = False):
    """Every dim but the one ``dim(args, kwargs)`` names -- the dim an ``index_reduce`` or a
    ``segment_reduce`` indexes; ``after``: only the dims after it (a segment reduction's
    lengths and offsets carry the dims before it)."""

    def split(args, kwargs):
        nd = args[at[0]].dim()
        if nd == 0:
            return (), ()
        d = dim(args, kwargs) % nd
        return tuple(i for i in range(d + 1 if after else 0, nd) if i != d), at

    return split


def _indexed(args, kwargs) -> int:
    return args[1]


def _axis(args, kwargs) -> int:
    return kwargs.get("axis", 0)


def _lstsq_rhs(args):
    return 1 if args[1].dim() == args[0].dim() - 1 else 2


def _lstsq_meta(args, kwargs):
    """``linalg_lstsq``'s results as LAPACK leaves them: the solution a narrowed column-major
    buffer of ``max(m, n)`` rows per right-hand side; residuals (``gels`` with m > n), ranks
    (every driver but ``gels``) and singular values (``gelsd``/``gelss``), else empty. None
    where they depend on the values (``gelsd``/``gelss`` with m > n: residuals only when
    every matrix has full rank) or on broadcasting."""
    a, b = args[0], args[1]
    driver = args[3] if len(args) > 3 else kwargs.get("driver")
    driver = driver or ("gelsy" if a.device.type == "cpu" else "gels")
    m, n = a.shape[-2], a.shape[-1]
    vector = b.dim() == a.dim() - 1
    batch = tuple(a.shape[:-2])
    if (driver in ("gelsd", "gelss") and m > n) or tuple(b.shape[:len(batch)]) != batch:
        return None
    k = 1 if vector else b.shape[-1]
    rows = max(m, n)
    real = a.real.dtype if a.is_complex() else a.dtype
    if vector:
        solution = ((*batch, n), contiguous_strides((*batch, rows))[:-1] + (1,))
    else:
        solution = ((*batch, n, k), contiguous_strides((*batch, k, rows))[:-2] + (1, rows))
    residuals = (*batch, k) if driver == "gels" and m > n else (0,)
    ranks = batch if driver != "gels" else (0,)
    singular = (*batch, min(m, n)) if driver in ("gelsd", "gelss") else (0,)
    return (TensorMeta(solution[0], solution[1], a.dtype, 0),
            *(TensorMeta(s, contiguous_strides(s), dt, 0)
              for s, dt in ((residuals, real), (ranks, torch.int64), (singular, real))))


def _local_input_size(args, kept):
    """An upsample backward's ``input_size`` (a global size list) with each kept dim's
    local size, as the local ``grad_output`` has it."""
    sizes = list(args[2])
    for d in kept:
        sizes[d] = args[0].shape[d]
    args[2] = sizes
    return args


# ---- the table --------------------------------------------------------------------------------
def _pooling() -> dict:
    rules = {}
    for k in (2, 3):
        # forward: (self, ...); backward: (grad_output, self, ..., [indices])
        for name in (f"avg_pool{k}d", f"_adaptive_avg_pool{k}d", f"adaptive_max_pool{k}d",
                     f"max_pool{k}d_with_indices", f"reflection_pad{k}d", f"replication_pad{k}d"):
            rules[name] = _Rule(_leading(k), linear=None if "max" in name else 0)
        rules[f"max_unpool{k}d"] = _Rule(_leading(k, (0, 1)), linear=0)
        # a backward is linear in its incoming gradient (given the indices of a max)
        rules[f"avg_pool{k}d_backward"] = _Rule(_leading(k, (0, 1)), linear=0, shape_only=(1,))
        rules[f"_adaptive_avg_pool{k}d_backward"] = _Rule(_leading(k, (0, 1)), linear=0, shape_only=(1,))
        rules[f"adaptive_max_pool{k}d_backward"] = _Rule(_leading(k, (0, 1, 2)), linear=0, shape_only=(1,))
        rules[f"max_pool{k}d_with_indices_backward"] = _Rule(_leading(k, (0, 1, 7)), linear=0, shape_only=(1,))
        rules[f"reflection_pad{k}d_backward"] = _Rule(_leading(k, (0, 1)), linear=0, shape_only=(1,))
        rules[f"replication_pad{k}d_backward"] = _Rule(_leading(k, (0, 1)), linear=0, shape_only=(1,))
        # the random samples are per (N, C) plane: (N, C, 2 or 3), cut with the input
        rules[f"fractional_max_pool{k}d"] = _Rule(_leading(k, (0, 3)))
        rules[f"fractional_max_pool{k}d_backward"] = _Rule(_leading(k, (0, 1, 4)), linear=0, shape_only=(1,))
    for pad in ("reflection_pad1d", "replication_pad1d"):
        rules[pad] = _Rule(_leading(1), linear=0)
        rules[pad + "_backward"] = _Rule(_leading(1, (0, 1)), linear=0, shape_only=(1,))
    return rules


def _upsampling() -> dict:
    rules = {}
    for name, k in (("upsample_nearest1d", 1), ("upsample_nearest2d", 2), ("upsample_nearest3d", 3),
                    ("_upsample_nearest_exact1d", 1), ("_upsample_nearest_exact2d", 2),
                    ("_upsample_nearest_exact3d", 3), ("upsample_linear1d", 1), ("upsample_bilinear2d", 2),
                    ("_upsample_bilinear2d_aa", 2), ("upsample_bicubic2d", 2), ("_upsample_bicubic2d_aa", 2),
                    ("upsample_trilinear3d", 3)):
        rules[name] = _Rule(_leading(k), linear=0)
        rules[name + "_backward"] = _Rule(_leading(k), _local_input_size, linear=0)
    return rules


_M, _V = 2, 1  # trailing dims of a matrix, of a vector

_LINALG = {
    "linalg_cholesky_ex": _Rule(_batch(_M)),
    "cholesky": _Rule(_batch(_M)),
    "cholesky_inverse": _Rule(_batch(_M)),
    "cholesky_solve": _Rule(_batch(_M, _M)),
    "linalg_inv_ex": _Rule(_batch(_M)),
    "_linalg_det": _Rule(_batch(_M)),
    "_linalg_slogdet": _Rule(_batch(_M)),
    "_linalg_eigh": _Rule(_batch(_M)),
    "linalg_eig": _Rule(_batch(_M)),
    "_linalg_svd": _Rule(_batch(_M)),
    "linalg_qr": _Rule(_batch(_M)),
    "geqrf": _Rule(_batch(_M)),
    "ormqr": _Rule(_batch(_M, _V, _M)),
    "linalg_householder_product": _Rule(_batch(_M, _V)),
    "linalg_lu": _Rule(_batch(_M)),
    "linalg_lu_factor_ex": _Rule(_batch(_M)),
    "linalg_lu_solve": _Rule(_batch(_M, _V, _M)),
    "lu_unpack": _Rule(_batch(_M, _V)),
    "linalg_solve_triangular": _Rule(_batch(_M, _M)),
    "triangular_solve": _Rule(_batch(_M, _M), follows=((1, 1),)),
    "_linalg_solve_ex": _Rule(_batch(_M, _solve_rhs), follows=((1, 0), (2, 0), (3, 0))),
    "linalg_ldl_factor_ex": _Rule(_batch(_M)),
    "linalg_ldl_solve": _Rule(_batch(_M, _V, _M)),
    "linalg_matrix_exp": _Rule(_batch(_M)),
    "linalg_pinv.atol_rtol_tensor": _Rule(_batch(_M)),
    "linalg_lstsq": _Rule(_batch(_M, _lstsq_rhs), meta=_lstsq_meta),
}

_OTHERS = {
    "_fft_r2c": _Rule(_fft, linear=0),
    "_fft_c2c": _Rule(_fft, linear=0),
    "_fft_c2r": _Rule(_fft, linear=0),
    "_unsafe_index.Tensor": _Rule(_untouched(), linear=0),
    "_unsafe_index_put": _Rule(_untouched(values_at=2)),
    "_unsafe_masked_index": _Rule(_untouched(2, mask_at=1)),
    "_unsafe_masked_index_put_accumulate": _Rule(_untouched(2, values_at=3, mask_at=1)),
    "diag_embed": _Rule(_diagonals(2, (0,)), linear=0),
    "diagonal_scatter": _Rule(_diagonals(3, (0, 1))),
    # (*, C r^2, H, W) <-> (*, C, H r, W r): the leading dims
    "pixel_shuffle": _Rule(_leading(3), linear=0),
    "pixel_unshuffle": _Rule(_leading(3), linear=0),
    # channels, patches and sampling grids mix everything but the batch
    "channel_shuffle": _Rule(_first(1), linear=0),
    "im2col": _Rule(_first(1), linear=0),
    "col2im": _Rule(_first(1), linear=0),
    "grid_sampler_2d": _Rule(_first(1, (0, 1)), linear=0),
    "grid_sampler_3d": _Rule(_first(1, (0, 1)), linear=0),
    "grid_sampler_2d_backward": _Rule(_first(1, (0, 1, 2))),
    "grid_sampler_3d_backward": _Rule(_first(1, (0, 1, 2))),
    # reductions by an index along one dim: every other dim of self and source is untouched
    "index_reduce": _Rule(_except(_indexed, (0, 3))),
    "segment_reduce": _Rule(_except(_axis, (0,), after=True)),
    "_segment_reduce_backward": _Rule(_except(_axis, (0, 1, 2), after=True), linear=0),
}


def _overloads(table: dict) -> dict:
    out = {}
    for name, rule in table.items():
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        # An op that decomposes itself never reaches the wrapper: its parts do.
        if op is not None and not _compat.is_composite_implicit(op):
            out[op] = rule
    return out


RULES = _overloads({**_pooling(), **_upsampling(), **_LINALG, **_OTHERS})
