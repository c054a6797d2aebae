"""Wrappers built inside ``torch.export``'s pre-dispatch tracing are recorded in the graph.

Non-strict export (and strict export, after dynamo) traces user code at the *pre-dispatch*
level: ops are recorded on whatever tensors the user code holds, and an op on a tensor the
tracer has never seen is refused (torch's proxy mode returns ``NotImplemented``, which
surfaces as ``RuntimeError: Unable to cast NotImplemented to Tensor``). A wrapper that
the user code *builds* from traced tensors is such a tensor -- the parametrization path
(``unwrap_tensor_subclass_parameters``: each forward rebuilds the weight with
``__tensor_unflatten__``), ``BlockScaled.from_float(w)`` or ``ShardedTensor.from_local``
inside ``forward``.

torch's remedy is to record the constructor call as a ``flat_apply`` node
(``mark_subclass_constructor_exportable_experimental``, which its TwoTensor and DTensor
put on ``__init__``). The kit records it where every construction path meets,
``construct.from_parts``, so all of them are covered (``__tensor_unflatten__`` does not
call ``__init__``). Inside an op's dispatch the torch-function modes are popped, so the
wrappers handlers build are not recorded (the op itself is). Everything that is not a
tensor or a size rides in the node's constant target, a :class:`Rebuild`, so meta values
need not be graph-representable.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from . import _compat

__all__ = ["Rebuild", "maybe_record"]


@dataclasses.dataclass(frozen=True)
class Rebuild:
    """The constant target of a recorded construction: ``Rebuild(...)(inners, size, stride,
    offset)`` rebuilds the wrapper from its traced parts (at run time of the exported
    program, and when ``run_decompositions`` / AOTInductor retrace it).

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor
        >>> t = TwoTensor(torch.ones(2), torch.zeros(2))
        >>> r = Rebuild.of(t)
        >>> u = r((t.a, t.b), (2,), (1,), 0)
        >>> type(u).__name__, u.b.tolist()
        ('TwoTensor', [0.0, 0.0])
    """

    cls: type
    ctx: Any
    dtype: torch.dtype
    device: torch.device
    requires_grad: bool

    @classmethod
    def of(cls, t) -> "Rebuild":
        return cls(type(t), t._kit_ctx, t.dtype, t.device, t.requires_grad)

    def __call__(self, inners, size, stride, offset):
        # The class's trusted rebuild (the ctx carries the dtype; the inners the device).
        return self.cls.from_parts(
            tuple(inners), self.ctx, size=tuple(size), stride=tuple(stride), offset=offset,
            requires_grad=self.requires_grad,
        )


# One graph attribute name per distinct target: torch caches the constant target by name
# and requires the same name to mean the same target.
_NAMES: dict = {}


def maybe_record(out, inners, size, stride, offset) -> None:
    """Record the construction of ``out`` if user code runs under pre-dispatch export."""
    tracer = _compat.pre_dispatch_export_tracer()
    if tracer is None:
        return
    target = Rebuild.of(out)
    name = _NAMES.get(target)
    if name is None:
        name = _NAMES[target] = f"kit_{target.cls.__name__.lower()}_{len(_NAMES)}"
    _compat.emit_flat_apply(
        tracer, name, target, (tuple(inners), tuple(size), tuple(stride), offset), out
    )


# ---- to_plain() on a traced wrapper ---------------------------------------------------
# A wrapper the pre-dispatch tracer follows is one graph value: its inner tensors are not
# (torch proxies them only for subclasses that are inputs of the export). A user-defined
# ``to_plain()`` that reads them would hand untraced tensors to the graph (export fails
# with "fake tensor in the exported program constant's list"). Under export's tracing,
# ``to_plain()`` therefore dispatches one op, ``subclass_kit::to_plain``, which the tracer
# records; lowering runs it on the wrapper, whose handler calls the class's own to_plain.

_LIB = torch.library.Library("subclass_kit", "DEF")
_LIB.define("to_plain(Tensor self) -> Tensor")


def _to_plain_dense(t):
    return t.clone()


for _key in ("CompositeExplicitAutograd", "Meta"):
    _LIB.impl("to_plain", _to_plain_dense, _key)

to_plain_op = torch.ops.subclass_kit.to_plain.default


def exportable_to_plain(fn):
    """Wrap a class's ``to_plain`` so that export's tracers record it as one op, and so that
    on a wrapper that requires grad its result is differentiable (see ``_differentiable``).

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor
        >>> x = TwoTensor(torch.ones(2), torch.zeros(2)).requires_grad_()
        >>> (x.to_plain() * 3).sum().backward()
        >>> x.grad
        tensor([3., 3.])
    """
    if getattr(fn, "_kit_exportable", False):
        return fn

    def to_plain(self):
        if torch.compiler.is_dynamo_compiling():
            if torch.compiler.is_exporting():
                return to_plain_op(self)
            return _differentiable(self, fn(self))
        if _compat.torch_function_mode_enabled() and _compat.pre_dispatch_export_tracer() is not None:
            return to_plain_op(self)
        out = fn(self)
        if self.requires_grad and not _compat.below_autograd():
            return _differentiable(self, out)
        return out

    to_plain.__name__ = fn.__name__
    to_plain.__qualname__ = fn.__qualname__
    to_plain.__doc__ = fn.__doc__
    to_plain.__wrapped__ = fn
    to_plain._kit_exportable = True
    return to_plain


# ---- to_plain() is differentiable -----------------------------------------------------------
# A class's to_plain() reads inner tensors, which autograd does not see: on a wrapper that
# requires grad its result used to have no grad_fn, and a loss through it failed. The
# wrapper's value *is* its dense tensor, so d to_plain(x) / dx is the identity: the dense
# gradient is handed to the wrapper as it is (a quantized leaf's .grad is dense, as the
# gradients of ops through fallbacks.to_plain already are). A to_plain() that is
# differentiable by itself (ShardedTensor's full_tensor) is left alone, and inside an op's
# dispatch (a handler calling a.to_plain()) autograd has already run: nothing is recorded.


class _DenseGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, wrapper, dense):
        # Returning an input: autograd hands back a view of it carrying this node, so the
        # result still shares memory with the inner tensor as it did without grad.
        return dense

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _differentiable(self, out):
    if (
        self.requires_grad
        and isinstance(out, torch.Tensor)
        and not out.requires_grad
        and torch.is_grad_enabled()
    ):
        if tuple(out.shape) != tuple(self.shape):
            from .errors import UnsupportedOpError

            raise UnsupportedOpError(
                f"{type(self).__qualname__}.to_plain() returned shape {tuple(out.shape)} for a "
                f"wrapper of shape {tuple(self.shape)} that requires grad, so its gradient cannot "
                "be handed back to the wrapper. Return the dense tensor of the wrapper's own "
                "shape from to_plain(), or call it on x.detach()."
            )
        return _DenseGrad.apply(self, out)
    return out


def to_plain_handler(func, types, args, kwargs):
    """``subclass_kit::to_plain`` on a wrapper: the class's own ``to_plain()``."""
    x = args[0]
    fn = type(x).to_plain
    out = getattr(fn, "__wrapped__", fn)(x)
    if any(out is v for v in x.__dict__.values()):
        # The op's schema promises a new tensor, not an inner one.
        out = out.clone()
    return out
