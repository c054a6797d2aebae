"""``AsyncCollectiveTensor``: the pending result of a collective, waited at first data use.

A collective issued in eager returns at once; its output buffer is filled in the background
until the collective's work is waited on. The wrapper holds that buffer (``elem``) and waits
exactly when the data is first needed:

- view ops (``view``, ``t``, ``transpose``, ``detach``, slicing, ``split`` ...) only touch
  metadata: they return a new ``AsyncCollectiveTensor`` over a view of the buffer, sharing
  the one pending wait, and do not wait (``aten.view`` has a fast path: it is what most
  reshapes end in);
- any other op waits once and computes on the plain buffer; its result is a plain tensor;
- ``print``/``repr``, ``tolist``, ``numpy``, ``item`` wait;
- ``trigger_wait()`` waits and returns the plain tensor, to be used in place of the wrapper;
- an instance that is garbage-collected unwaited is waited then, so no work leaks.

Where this deliberately differs from torch's ``AsyncCollectiveTensor`` (which AOTAutograd
special-cases by type, so we do not subclass it):

- As a compiled-graph input it becomes a ``_c10d_functional.wait_tensor`` on its buffer at
  the start of the traced graph: ``__tensor_unflatten__`` emits the wait whenever it runs
  while a graph is being recorded, and the rest of the graph reads the wait's *result*. Since
  FX treats ``wait_tensor`` as side-effectful, dead-code elimination cannot drop it even when
  nothing else would keep it alive, and inductor cannot read the buffer early (the failure
  that made losses go NaN when an eager embedding fed a compiled transformer block).
- One pending wait is shared by an instance and all its views: whichever is used first waits
  for the collective, the others then read without waiting again.

Exercises: a wrapper whose state (pending or not) is per instance and not part of the ctx,
an op table that classifies every aten op (view or compute) instead of mapping over inners,
and an unflatten that emits an op into the graph being traced.
"""

from __future__ import annotations

import torch

from .. import SubclassCtx, WrapperTensor, _compat as _kit_compat, inner
from . import _compat
from ._pending import Pending
from ..dispatch import find_registered

__all__ = ["AsyncCollectiveTensor"]

aten = torch.ops.aten
_wait_op = _compat.wait_op
_Tensor = torch.Tensor
_FunctionalTensor = _compat.FunctionalTensor
_STRIDED = torch.strided
_VIEW = aten.view.default
_make = _kit_compat.make_wrapper_subclass


class AsyncCollectiveTensor(WrapperTensor):
    """The pending result of a collective; waits at first use of its data.

    ``elem`` is the collective's output buffer. Views do not wait and stay
    ``AsyncCollectiveTensor``; any compute op waits once and returns a plain tensor. As an
    input to a compiled region it becomes a ``wait_tensor`` at the start of the graph.

    Example (rank 0 of a 2-rank process group):
        >>> import torch
        >>> from subclass_kit.collectives import all_reduce
        >>> y = all_reduce(torch.ones(4), "sum")
        >>> type(y.view(2, 2)).__name__, y.completed   # a view: no wait
        ('AsyncCollectiveTensor', False)
        >>> type(y + 1).__name__, y.completed          # data use: waits once
        ('Tensor', True)
        >>> y.trigger_wait()                           # the plain, waited tensor
        tensor([2., 2., 2., 2.])
    """

    elem: torch.Tensor = inner()

    def __new__(cls, elem: torch.Tensor):
        if not isinstance(elem, torch.Tensor) or isinstance(elem, AsyncCollectiveTensor):
            raise TypeError(
                f"AsyncCollectiveTensor wraps the plain output tensor of a collective; got "
                f"{type(elem).__name__}. Collectives in subclass_kit.collectives return one "
                "already; to wait on one, call wait_tensor(t) or t.trigger_wait()."
            )
        return _wrap(elem, Pending(elem, None))

    # ---- waiting ---------------------------------------------------------------------
    def trigger_wait(self) -> torch.Tensor:
        """Wait (once) for the collective and return the plain result tensor.

        Use the returned tensor: it is the waited value (under tracing, the output of the
        ``wait_tensor`` node; ignoring it would leave later ops reading the raw buffer).

        Example (rank 0 of a 2-rank process group):
            >>> import torch
            >>> from subclass_kit.collectives import all_reduce
            >>> y = all_reduce(torch.ones(2), "sum").trigger_wait()
            >>> type(y).__name__, y
            ('Tensor', tensor([2., 2.]))
        """
        d = self.__dict__
        if self.requires_grad and torch.is_grad_enabled():
            # The result of a differentiable collective: the waited value keeps its history
            # (the plain buffer alone would hand back a gradient of None).
            return _WaitKeepGrad.apply(self)
        cell = d["_kit_pending"]
        if cell is not None:
            if _compat.in_fake_or_proxy_mode():
                # A pending eager instance seen while tracing (captured, not an input): the
                # graph must use the wait's result; the eager instance stays as it is.
                return _wait_op(d["elem"])
            cell.wait()  # the collective's first use waits; re-raises if it failed
            d["_kit_pending"] = None
        return d["elem"]

    def wait(self) -> torch.Tensor:
        """Alias of :meth:`trigger_wait` (torch's ACT spells it both ways).

        Example (rank 0 of a 2-rank process group):
            >>> import torch
            >>> from subclass_kit.collectives import all_reduce
            >>> all_reduce(torch.ones(2), "sum").wait()
            tensor([2., 2.])
        """
        return self.trigger_wait()

    @property
    def completed(self) -> bool:
        """True once the collective has been waited on (by this instance or a view)."""
        cell = self.__dict__["_kit_pending"]
        return cell is None or cell.done

    # ---- host-side reads wait -----------------------------------------------------------
    def tolist(self):
        return self.trigger_wait().tolist()

    def numpy(self, *, force: bool = False):
        return self.trigger_wait().numpy(force=force)

    def __repr__(self) -> str:
        return f"AsyncCollectiveTensor({self.trigger_wait()!r})"

    # ---- PT2 protocol -------------------------------------------------------------------
    @classmethod
    def __tensor_unflatten__(cls, inner_tensors, ctx, outer_size, outer_stride):
        elem = inner_tensors["elem"]
        # While a graph is being recorded (AOTAutograd, make_fx, export), an input that was
        # pending in eager must be waited *inside* the graph, first, and the graph must
        # use the waited value; wait_tensor is side-effectful in FX, so it is never DCE'd.
        # AOTAutograd unflattens an input twice (once on the graph's input, once more when
        # functionalizing it); the second time the inner is already the wait's result.
        # With a training partitioner (min-cut) the joint is retraced from the waited value:
        # an inner that is already the output of such a wait is not waited again (that
        # second wait would be an unused node in the forward graph).
        if (
            _compat.tracing_into_graph()
            and not isinstance(elem, _compat.FunctionalTensor)
            and elem not in _WAITED_IN_GRAPH
        ):
            elem = _wait_op(elem)
            _WAITED_IN_GRAPH[elem] = True
        if outer_size is None:
            outer_size, outer_stride = elem.shape, elem.stride()
        r = _make(
            cls, outer_size, strides=outer_stride, storage_offset=elem.storage_offset(),
            dtype=ctx.dtype, device=elem.device, layout=_STRIDED, requires_grad=False,
        )
        d = r.__dict__
        d["elem"] = elem
        d["_kit_ctx"] = ctx
        d["_kit_pending"] = None
        return r

    def __reduce_ex__(self, proto):
        # Pickling reads the data: wait first, then pickle the plain value.
        return self.trigger_wait().__reduce_ex__(proto)

    def __deepcopy__(self, memo):
        return self.trigger_wait().clone()

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        if expected_type is torch.Tensor:
            return self.trigger_wait()
        if expected_type is None or expected_type is type(self):
            return self
        return None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Same table lookup as WrapperTensor's, but ops without a registered handler are
        # classified here (view or compute) rather than sent to the base's built-in
        # handlers, which map ops over inner tensors: right for data wrappers, wrong for a
        # pending buffer (clone/_to_copy must wait; every view must keep the pending wait).
        if func is _VIEW:
            # aten.view, where most reshapes end up: the shortest path, inline.
            d = args[0].__dict__
            elem = d["elem"]
            cell = d["_kit_pending"]
            if cell is None and type(elem) is _FunctionalTensor:
                return elem.view(args[1])
            return _alias(_wrap(elem.view(args[1]), cell), args[0])
        try:
            h = cls._kit_cache[func]
        except KeyError:
            h = cls._kit_cache[func] = _resolve(cls, func)
        return h(func, types, args, kwargs or _NO_KWARGS)


_NO_KWARGS: dict = {}
_CTX: dict = {}


def _ctx(dtype):
    c = _CTX.get(dtype)
    if c is None:
        c = _CTX[dtype] = SubclassCtx.make(
            AsyncCollectiveTensor.__kit_spec__.qualname, (), (), dtype, ("elem",)
        )
    return c


_unsafe_set = _kit_compat.functionalize_unsafe_set


def _alias(view, base):
    # A view must share the wrapper-level storage of its base, as the schema says;
    # AOTAutograd reads that to tell views of inputs from new tensors.
    _unsafe_set(view, base)
    return view


def _wrap(elem, cell):
    """A wrapper over ``elem`` sharing ``cell`` (trusted fast path: no validation).

    This is the hot path of every view op; it skips the base class's validated constructor
    (the parts come from torch, already consistent) and passes only non-default options.
    """
    r = _make(
        AsyncCollectiveTensor, elem.shape, strides=elem.stride(),
        storage_offset=elem.storage_offset(), dtype=elem.dtype, device=elem.device,
    )
    d = r.__dict__
    d["elem"] = elem
    d["_kit_ctx"] = _ctx(elem.dtype)
    d["_kit_pending"] = cell
    return r


# Inner tensors that __tensor_unflatten__ already waited while tracing (weak, by identity).
_WAITED_IN_GRAPH = _compat.WeakTensorKeyDictionary()


class _WaitKeepGrad(torch.autograd.Function):
    """``trigger_wait`` of an instance that requires grad: the waited plain value, with the
    gradient passed through unchanged (a wait is the identity on values)."""

    @staticmethod
    def forward(ctx, x):
        return x.trigger_wait().view_as(x.__dict__["elem"])

    @staticmethod
    def backward(ctx, grad):
        return grad


def pending(elem: torch.Tensor, what) -> AsyncCollectiveTensor:
    """Wrap a just-issued collective's output; ``what`` = (op name, GroupRef) for errors."""
    return _wrap(elem, Pending(elem, what))


# ---- handlers -------------------------------------------------------------------------
# Handlers are built per op (closures over the op's C++ callable ``op._op``, which skips the
# Python frame of OpOverload.__call__): this path runs on every op an ACT sees.


def _unwrap(a):
    """The waited plain tensor of an ACT; lists/tuples element-wise; anything else as is."""
    if isinstance(a, AsyncCollectiveTensor):
        d = a.__dict__
        if d["_kit_pending"] is None:
            return d["elem"]
        return a.trigger_wait()
    t = type(a)
    if t is list or t is tuple:
        return t(_unwrap(x) for x in a)
    return a


def _compute_handler(func):
    """Wait for every ACT argument, run ``func`` on plain tensors, return plain results."""
    op = _compat.raw_op(func)

    def compute(func, types, args, kwargs):
        if kwargs:
            return op(*[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()})
        return op(*[_unwrap(a) for a in args])

    return compute


def _mutate(func, types, args, kwargs):
    """An in-place/out= op: wait, write into the buffers, return the written wrappers."""
    out = func(*[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()})
    return _kit_compat.return_and_correct_aliasing(func, args, kwargs, out)


def _plain_view_in_trace(cell, elem) -> bool:
    # Inside a functionalized trace (AOTAutograd) the input was already waited at the top
    # of the graph; its views are plain values there, so no graph output or tangent is
    # typed AsyncCollectiveTensor (a plain runtime tangent could not be coerced back).
    return cell is None and type(elem) is _FunctionalTensor


def _view_handler(func):
    """A view op: a view of the buffer, still pending (no wait) if the input was."""
    op = _compat.raw_op(func)
    method = _VIEW_METHODS.get(func)

    def view(func, types, args, kwargs):
        a = args[0]
        if not isinstance(a, AsyncCollectiveTensor) or kwargs or any(
            isinstance(x, AsyncCollectiveTensor) for x in args[1:]
        ):
            return _general_view(op, args, kwargs)
        d = a.__dict__
        elem = d["elem"]
        cell = d["_kit_pending"]
        out = method(elem, *args[1:]) if method is not None else op(elem, *args[1:])
        if _plain_view_in_trace(cell, elem):
            return out
        if isinstance(out, _Tensor):
            return _alias(_wrap(out, cell), a)
        return type(out)(_alias(_wrap(o, cell), a) for o in out)

    return view


def _general_view(op, args, kwargs):
    # Rare shapes of a view call (kwargs, or the ACT not first): same result, slower path.
    a = next(x for x in (*args, *kwargs.values()) if isinstance(x, AsyncCollectiveTensor))
    d = a.__dict__
    out = op(*[x.__dict__["elem"] if isinstance(x, AsyncCollectiveTensor) else x for x in args],
             **{k: v.__dict__["elem"] if isinstance(v, AsyncCollectiveTensor) else v for k, v in kwargs.items()})
    if _plain_view_in_trace(d["_kit_pending"], d["elem"]):
        return out
    if isinstance(out, _Tensor):
        return _wrap(out, d["_kit_pending"])
    return type(out)(_wrap(o, d["_kit_pending"]) for o in out)


def _view_fast(func, types, args, kwargs):
    # aten.view: where most reshapes end up, so it gets its own, shortest path.
    d = args[0].__dict__
    elem = d["elem"]
    cell = d["_kit_pending"]
    if cell is None and type(elem) is _FunctionalTensor:
        return elem.view(args[1])
    return _alias(_wrap(elem.view(args[1]), cell), args[0])


def _wait_handler(func, types, args, kwargs):
    return args[0].trigger_wait()


# Tensor methods are much cheaper to call than the OpOverloads they end in.
_VIEW_METHODS = {
    aten.t.default: _Tensor.t,
    aten.detach.default: _Tensor.detach,
    aten.transpose.int: _Tensor.transpose,
    aten.unsqueeze.default: _Tensor.unsqueeze,
    aten.squeeze.dim: _Tensor.squeeze,
    aten.select.int: _Tensor.select,
    aten.permute.default: _Tensor.permute,
}


def _resolve(cls, func):
    h = find_registered(cls, func)
    if h is not None:
        return h
    if _compat.is_pure_view(func):
        return _view_handler(func)
    if _compat.writes_an_argument(func):
        return _mutate
    return _compute_handler(func)


AsyncCollectiveTensor.implements(aten.view.default)(_view_fast)
AsyncCollectiveTensor.implements(_wait_op)(_wait_handler)
