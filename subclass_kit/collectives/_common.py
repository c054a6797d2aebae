"""What every collective shares: issuing a native op (pending in eager, waited while
tracing), reduce-op names, argument checks. ``ops`` (the plain collectives), ``autograd``
(their differentiable variants) and ``coalesced`` build on it; it imports none of them.
"""

from __future__ import annotations

import torch

from ..compiling import is_compiling
from .. import _compat
from .act import AsyncCollectiveTensor, Pending
from .errors import CollectiveArgumentError, CollectiveError
from .groups import GroupRef

__all__ = ["REDUCE_OPS"]

_ops = _compat.funcol_ops
_wait_op = _compat.wait_op
_all_reduce = _ops.all_reduce.default
_all_gather = _ops.all_gather_into_tensor.default
_reduce_scatter = _ops.reduce_scatter_tensor.default
_all_to_all = _ops.all_to_all_single.default
_broadcast = _ops.broadcast.default

REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_REDUCE_OPS = frozenset(REDUCE_OPS)


def _tracing() -> bool:
    return is_compiling() or _compat.in_fake_or_proxy_mode()


def _reduce_op(op, where: str) -> str:
    name: str | None
    if isinstance(op, str):
        name = op.lower()
    else:
        # A torch.distributed.ReduceOp member (ReduceOp.SUM) names itself.
        member = getattr(op, "name", None)
        name = member.lower() if isinstance(member, str) else None
    if name not in _REDUCE_OPS:
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: unknown reduce op {op!r}; use one of "
            f"{list(REDUCE_OPS)}."
        )
    return name


# gloo carries float32/64, float16, bfloat16, int8, uint8, int32, int64 and bool ("Invalid
# scalar type" for the rest, raised at the wait); NCCL has no int16/uint16 either. The other
# dtypes travel as one that is carried: the ops that only move bytes (gather, all-to-all,
# broadcast) as a same-size view, bit-exact and still pending; the reductions in a wider
# dtype and back, which waits at once (the cast back needs the data). Integer wrap-around
# is the dense op's: the sum of int16 shards in int64, cast back, wraps as int16 adds do.
_FLOAT8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n))
_MOVE_AS = {torch.int16: torch.float16, torch.uint16: torch.float16, torch.uint32: torch.int32,
            torch.uint64: torch.int64, **{d: torch.uint8 for d in _FLOAT8}}
_REDUCE_AS = {torch.int16: torch.int64, torch.uint16: torch.int64, torch.uint32: torch.int64,
              torch.uint64: torch.int64, **{d: torch.float32 for d in _FLOAT8}}
_COMPLEX = (torch.complex64, torch.complex128)  # gloo's all_to_all refuses them
_MOVES = (_all_gather, _all_to_all, _broadcast)


def _off_wire(fn, dtype) -> bool:
    return dtype in _MOVE_AS or (fn is _all_to_all and dtype in _COMPLEX)


def _issue_as(where: str, group: GroupRef, fn, t: torch.Tensor, rest: tuple):
    """``_issue`` for a dtype the backend does not carry (see ``_MOVE_AS``)."""
    dtype = t.dtype
    if fn in _MOVES:
        def back(o: torch.Tensor) -> torch.Tensor:
            return torch.view_as_complex(o) if dtype in _COMPLEX else o.view(dtype)

        wire = torch.view_as_real(t) if dtype in _COMPLEX else t.view(_MOVE_AS[dtype])
        if _tracing():
            return back(_wait_op(fn(wire, *rest)))
        what = _what(where, group)
        try:
            out = fn(wire, *rest)
        except RuntimeError as e:
            raise CollectiveError(f"{what} could not be issued: {e}") from e
        # The view shares the native output's buffer: pending until that buffer's wait.
        return AsyncCollectiveTensor.from_parts((back(out),), _pending=Pending(out, what))
    op = rest[0]
    if op == "avg":
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: reduce op 'avg' on a {dtype} tensor; an average of "
            f"integers or float8 has no dtype of its own. Reduce with 'sum' and divide, in a "
            f"float dtype (t.float())."
        )
    if dtype == torch.uint64:
        # Same width: sum/product/bitwise ops are the same bits in int64 (mod 2**64); for
        # max/min, flipping the top bit maps unsigned order onto signed order.
        flip = op in ("max", "min")
        wire = t.view(torch.int64)
        wire = wire ^ _TOP_BIT if flip else wire
        out = _issue(where, group, fn, wire.contiguous(), *rest)
        out = out.trigger_wait() if isinstance(out, AsyncCollectiveTensor) else out
        return (out ^ _TOP_BIT if flip else out).view(dtype)
    out = _issue(where, group, fn, t.to(_REDUCE_AS[dtype]), *rest)
    out = out.trigger_wait() if isinstance(out, AsyncCollectiveTensor) else out
    return out.to(dtype)


_TOP_BIT = -(2**63)


def _issue(where: str, group: GroupRef, fn, *args):
    """Run the native op; in eager wrap its output as a pending AsyncCollectiveTensor."""
    if _off_wire(fn, args[0].dtype):
        return _issue_as(where, group, fn, args[0], args[1:])
    if _tracing():
        return _wait_op(fn(*args))
    what = _what(where, group)
    try:
        out = fn(*args)
    except RuntimeError as e:
        raise CollectiveError(f"{what} could not be issued: {e}") from e
    return AsyncCollectiveTensor.from_parts((out,), _pending=Pending(out, what))


def _what(where: str, group: GroupRef) -> str:
    # How errors name a collective: when it cannot be issued, and when its wait fails.
    return f"subclass_kit.collectives.{where} on group {group.name!r} ({group.size} ranks)"


def _issue_many(where: str, group: GroupRef, fn, *args) -> list:
    """Run a native coalesced op (a list of outputs); in eager each output is pending."""
    if _tracing():
        return [_wait_op(o) for o in fn(*args)]
    what = _what(where, group)
    try:
        outs = fn(*args)
    except RuntimeError as e:
        raise CollectiveError(f"{what} could not be issued: {e}") from e
    return [AsyncCollectiveTensor.from_parts((o,), _pending=Pending(o, what)) for o in outs]


def _nograd(t: torch.Tensor) -> torch.Tensor:
    # torch 2.13 registers autograd on the native ops; the plain ops are issued on a
    # detached input (a differentiable call goes to the *_autograd variant instead).
    return t.detach() if t.requires_grad else t


def _wants_grad(t: torch.Tensor) -> bool:
    return t.requires_grad and torch.is_grad_enabled()


def _check_dim(t: torch.Tensor, dim: int, where: str, what: str) -> int:
    nd = t.dim()
    if not -nd <= dim < max(nd, 1):
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: {what}={dim} is out of range for a "
            f"{nd}-D tensor of shape {tuple(t.shape)}."
        )
    return dim % nd if nd else 0


def _chunk_cat(out: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    return torch.cat(torch.chunk(out, n, dim=0), dim=dim)


def _splits(t, output_split_sizes, input_split_sizes, g: GroupRef, where: str):
    if (output_split_sizes is None) != (input_split_sizes is None):
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: pass both output_split_sizes and "
            "input_split_sizes, or neither (even splits)."
        )
    if output_split_sizes is None:
        if t.dim() == 0 or t.size(0) % g.size != 0:
            raise CollectiveArgumentError(
                f"subclass_kit.collectives.{where}: even splits need dim 0 (size "
                f"{t.size(0) if t.dim() else 'scalar'}) divisible by the group size {g.size}; "
                "pass explicit split sizes."
            )
        even = [t.size(0) // g.size] * g.size
        return even, even
    out_s, in_s = list(output_split_sizes), list(input_split_sizes)
    if len(out_s) != g.size or len(in_s) != g.size:
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: need one split size per rank ({g.size}); got "
            f"{len(out_s)} output and {len(in_s)} input split sizes."
        )
    if not is_compiling() and sum(in_s) != t.size(0):
        raise CollectiveArgumentError(
            f"subclass_kit.collectives.{where}: input_split_sizes {in_s} sum to {sum(in_s)} "
            f"but dim 0 of the input is {t.size(0)}."
        )
    return out_s, in_s
