"""Ops that act independently along some dims of their operands: pooling, interpolation,
padding, fft, batched linear algebra, pixel and channel shuffles, grid sampling, im2col.

Each op is one entry of ``_RULES``: a function of the arguments giving the op's
*independent* dims -- dims it never mixes (pooling's N and C, an fft's untransformed dims,
the batch dims of a matrix op) -- and the positions of the tensor arguments that carry them.
Independent dims are counted from the left and are the same dims, of the same size, in
every carrying operand and in every result (pooling's output keeps N and C, ``det`` keeps
the batch). Per mesh dim the rule is:

- a shard of an independent dim stays, with no communication: every carrying operand is
  laid out the same way and each rank runs the op on its locals (the shard most operands
  have decides, the first operand's on a tie; a plain or Replicate operand is cut locally);
- a shard of any other dim is gathered first (that operand, that mesh dim), a Partial is
  reduced first -- unless the op is linear in that argument, the others fixed (pooling by
  averages, interpolation, padding, fft, a backward in its incoming gradient): then a
  ``Partial('sum')`` or ``Partial('avg')`` passes through to the result, unreduced; the other
  tensor arguments (a shared matrix of a batched solve) are used whole.

A shard stays only when every rank gets a non-empty chunk (torch's kernels refuse some empty
inputs); a result that does not carry an independent dim is Replicate (an empty ``U`` of an
``svd`` without vectors). Ops that report failures in an ``info`` tensor run with
``check_errors=False`` and check the gathered ``info`` on every rank, so that a failing
matrix on one rank raises on all of them instead of one rank raising alone and the others
hanging in their next collective. (``eigh``, ``eig`` and ``svd`` have no ``info``: their
kernels raise on a matrix that does not converge -- NaN inputs -- on the rank holding it.)
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ... import _compat
from .._layout import chunk_size, contiguous_strides
from ..placements import Replicate
from ..tensor import ShardedTensor, placements_of
from .generic import computed_whole
from ._common import TensorMeta, aten, fast_plan, global_meta, move, move_args, on_locals, planned, spec_of, wrap_out

__all__ = ["independent", "check_errors"]

_SEQ = (list, tuple)


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


_RULES = _overloads({**_pooling(), **_upsampling(), **_LINALG, **_OTHERS})


# ---- the plan -----------------------------------------------------------------------------------
def _results(meta) -> tuple:
    return tuple(meta) if type(meta) in _SEQ else (meta,)


def _carried(d: int, operands, metas, k: int) -> bool:
    """Whether dim ``d`` can stay sharded over ``k`` ranks: every carrying operand has it at
    one size, every rank's chunk of it is non-empty, and every result has it too (or is
    empty, then Replicate)."""
    sizes = {a.shape[d] if a.dim() > d else None for a in operands}
    if len(sizes) != 1 or None in sizes:
        return False
    n = next(iter(sizes))
    if chunk_size(n, k, k - 1) <= 0:  # the chunks shrink towards the last rank
        return False
    return all(_has(m, d, operands[0].shape) or 0 in m.shape for m in metas if type(m) is TensorMeta)


def _linear_partial(p) -> bool:
    return p.is_partial() and getattr(p, "op", None) in ("sum", "avg")


def _has(m: TensorMeta, d: int, shape) -> bool:
    return len(m.shape) > d and m.shape[d] == shape[d]


def _shape_target(a, layout: tuple) -> tuple:
    """``layout`` for an argument read for its shape only, keeping a Partial of it where the
    layout is whole: no all-reduce of values nobody reads."""
    if type(a) is not ShardedTensor:
        return layout
    return tuple(c if c.is_partial() and p.is_replicate() else p for c, p in zip(placements_of(a), layout))


def _decide(func, args, kwargs):
    rule = _RULES[func]
    mesh, coord = spec_of(func, args, kwargs)
    dims, at = rule.split(args, kwargs)
    meta = global_meta(func, args, kwargs) if rule.meta is None else rule.meta(args, kwargs)
    if meta is None:
        return None
    whole_results = {r for r, i in rule.follows if i not in at}
    metas = tuple(None if r in whole_results else m for r, m in enumerate(_results(meta)))
    operands = [args[i] for i in at if isinstance(args[i], torch.Tensor)]
    lay: list = []
    for m in range(mesh.ndim):
        # The shard of an independent dim that most carrying operands already have decides
        # this mesh dim (the fewest moves: a backward's incoming gradient laid out otherwise
        # than its input and indices); on a tie, the first operand's.
        votes: dict = {}
        for p in (placements_of(a)[m] for a in operands if type(a) is ShardedTensor):
            if p in votes:
                votes[p] += 1
            elif (p.shard_dim() in dims and not any(q.shard_dim() == p.shard_dim() for q in lay)
                  and _carried(p.shard_dim(), operands, metas, mesh.shape[m])):
                votes[p] = 1
        lay.append(max(votes, key=votes.__getitem__) if votes else Replicate())
    layout = tuple(lay)
    whole = (Replicate(),) * mesh.ndim
    # Where no shard stays, a pending sum of the argument the op is linear in stays pending.
    lin = args[rule.linear] if rule.linear is not None else None
    passes = tuple(
        type(lin) is ShardedTensor and p.is_replicate() and _linear_partial(placements_of(lin)[m])
        for m, p in enumerate(layout)
    )
    lin_target = tuple(placements_of(lin)[m] if passes[m] else p for m, p in enumerate(layout)) if any(passes) else None
    moves = tuple(
        (i, lin_target if i == rule.linear and lin_target is not None else
         _shape_target(a, layout) if i in rule.shape_only else layout if i in at else whole)
        for i, a in enumerate(args) if isinstance(a, torch.Tensor)
    )
    # A result that does not have a kept dim is empty (checked by _carried), or computed
    # from whole arguments alone: Replicate.
    outs = tuple(
        whole if m is None else
        tuple(placements_of(lin)[d] if passes[d] else
              p if p.is_replicate() or _has(m, p.shard_dim(), operands[0].shape) else Replicate()
              for d, p in enumerate(layout))
        for m in metas
    )
    kept = tuple(p.shard_dim() for p in layout if p.is_shard())
    fast = _fast_path(func, args, kwargs, meta, moves, outs, mesh, coord, rule.fix is not None and bool(kept))
    return meta, moves, outs, mesh, coord, kept, fast


def _fast_path(func, args, kwargs, meta, moves, outs, mesh, coord, fixes: bool):
    """``run(args)`` when nothing moves (the common case: the operands already on the rule's
    layout): the op's C++ callable on the locals, each result built from what the plan knows;
    else None."""
    if fixes or kwargs:
        return None
    for i, target in moves:
        a = args[i]
        if (placements_of(a) != target) if type(a) is ShardedTensor else not all(p.is_replicate() for p in target):
            return None
    if any(type(a) in _SEQ and any(type(b) is ShardedTensor for b in a) for a in args):
        return None
    makes = []
    for m, pl in zip(_results(meta), outs):
        fp = fast_plan(func, m, mesh, pl, coord) if type(m) is TensorMeta else None
        if type(m) is TensorMeta and fp is None:
            return None  # symbolic sizes
        makes.append(None if fp is None else fp[1])
    op = _compat.fast_op(func)
    if type(meta) is TensorMeta:
        return on_locals(op, makes[0], args)
    mk = tuple(makes)

    def run(args):
        res = op(*[a.local if type(a) is ShardedTensor else a for a in args])
        return type(res)(r if f is None else f(r) for r, f in zip(res, mk))

    return run


_plan = planned(_decide)

_CHECKED = {
    # op: the name torch's own check reports
    aten.linalg_cholesky_ex.default: "linalg.cholesky_ex",
    aten.linalg_inv_ex.default: "linalg.inv_ex",
    aten.linalg_lu_factor_ex.default: "linalg.lu_factor_ex",
    aten._linalg_solve_ex.default: "linalg.solve_ex",
    aten.linalg_ldl_factor_ex.default: "linalg.ldl_factor_ex",
}


@ShardedTensor.implements(*_RULES)
def independent(func, types, args, kwargs):
    """Run the op on each rank's locals along its independent dims; see the module docstring."""
    if func is aten.cholesky.default:
        # Its kernel checks the factorization itself, per rank: factor, then check the info
        # of every rank's matrices together.
        upper = args[1] if len(args) > 1 else kwargs.get("upper", False)
        L, info = aten.linalg_cholesky_ex.default(args[0], upper=upper)
        aten._linalg_check_errors.default(info, "cholesky", is_matrix=args[0].dim() == 2)
        return L
    checking = kwargs.get("check_errors", False) and func in _CHECKED
    if checking:
        kwargs = {**kwargs, "check_errors": False}
    plan = _plan(func, args, kwargs)
    if plan is None:  # shapes that depend on the values: computed on whole operands
        return computed_whole(func, types, args, kwargs)
    meta, moves, outs, mesh, coord, kept, fast = plan
    if fast is not None and not checking:
        return fast(args)
    new = move_args(args, moves, mesh, coord)
    whole = (Replicate(),) * mesh.ndim
    for i, a in enumerate(new):
        if type(a) in _SEQ and any(type(b) is ShardedTensor for b in a):  # index tensors
            new[i] = [move(b, whole) if type(b) is ShardedTensor else b for b in a]
    if kwargs:
        kwargs = {k: move(v, whole) if type(v) is ShardedTensor else v for k, v in kwargs.items()}
    rule = _RULES[func]
    if rule.fix is not None and kept:
        new = rule.fix(new, kept)
    res = func(*new, **kwargs)
    if type(res) in _SEQ:
        out = type(res)(
            wrap_out(r, m, mesh, pl, coord) if type(m) is TensorMeta else r
            for r, m, pl in zip(res, meta, outs)
        )
    else:
        out = wrap_out(res, meta, mesh, outs[0], coord)
    if checking:
        info = out[-1]
        aten._linalg_check_errors.default(info, _CHECKED[func], is_matrix=args[0].dim() == 2)
    return out


@ShardedTensor.implements(aten._linalg_check_errors.default)
def check_errors(func, types, args, kwargs):
    """Check a factorization's ``info`` gathered on every rank: all ranks raise together,
    with the error (and the batch element) the dense op reports."""
    info = args[0]
    if type(info) is ShardedTensor:
        info = move(info, (Replicate(),) * len(placements_of(info)))
    return func(info, *args[1:], **kwargs)
