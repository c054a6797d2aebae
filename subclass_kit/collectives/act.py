"""``AsyncCollectiveTensor``: a collective's result, waited at first data use (docs/collectives.md)."""

import atexit
import weakref
from functools import partial
from typing import Any

import torch

from .. import WrapperTensor, _compat, inner, state
from .errors import CollectiveError

__all__ = ["AsyncCollectiveTensor", "Pending"]
_wait_op, _FT = _compat.wait_op, _compat.FunctionalTensor
_WAITED, _EMPTY_LIKE = _compat.WeakTensorKeyDictionary(), torch.ops.aten.empty_like.default  # inners waited in a graph (weak)


class Pending:
    """A collective's wait, shared by its result and all its views; ``what`` names it in errors."""

    __slots__ = ("tensor", "done", "what", "error", "__weakref__")
    _wait = staticmethod(_compat.wait_op)  # on the class: at exit module globals may be gone

    def __init__(self, tensor, what: str):
        self.tensor, self.done, self.what = tensor, False, what
        self.error: CollectiveError | None = None
        _LIVE.add(self)

    def wait(self) -> None:
        """Wait (the first call only); re-raise a failure on every call: the buffer is garbage."""
        if self.done:
            if self.error is not None:
                raise self.error
            return
        self.done = True
        try:
            self._wait(self.tensor)
        except RuntimeError as e:
            self.error = CollectiveError(f"{self.what} did not complete: {e}. Another rank may have exited or "
                                         "may not have issued the same collective; the wait is bounded by the "
                                         "process group's timeout (init_process_group(timeout=...)).")
            raise self.error from e
        finally:
            self.tensor = None  # views keep their own buffer reference

    def __del__(self):  # so no work leaks, and torch's "unwaited collective calls" never fires
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - a finalizer must not raise; the wait was best effort
            pass


_LIVE: "weakref.WeakSet[Pending]" = weakref.WeakSet()  # uncollected cells: waited at exit, before c10d
atexit.register(lambda: [cell.__del__() for cell in list(_LIVE)])


class AsyncCollectiveTensor(WrapperTensor):
    """A collective's output buffer ``elem``, waited at first data use.

    Views stay pending ``AsyncCollectiveTensor``s (``empty_like`` reads no data: a waited one); other ops,
    ``print``, ``tolist``, ``numpy``, ``item``, pickling, deepcopy wait once (plain results). Compiled: ``wait_tensor``.

    Example (rank 0 of a 2-rank process group):
        >>> from subclass_kit.collectives import all_reduce
        >>> y = all_reduce(torch.ones(4), "sum")
        >>> type(y.view(2, 2)).__name__, y.completed, type(y + 1).__name__, y.completed
        ('AsyncCollectiveTensor', False, 'Tensor', True)
    """

    __check_handlers__ = False  # its handlers below return what each op's schema says
    elem: torch.Tensor = inner()
    _pending: Pending | None = state(doc="the wait this instance shares with its views; None once waited")

    def __post_init__(self):
        if isinstance(self.elem, AsyncCollectiveTensor):
            raise TypeError("AsyncCollectiveTensor wraps a collective's plain output, not another one; "
                            "to wait on one, call wait_tensor(t) or t.trigger_wait().")
        self._pending = Pending(self.elem, "A collective")

    def trigger_wait(self) -> torch.Tensor:
        """Wait (once) and return the plain result: use it (under tracing, the wait's output).

        Example:
            >>> AsyncCollectiveTensor(torch.ones(2)).trigger_wait()
            tensor([1., 1.])
        """
        if self.requires_grad and torch.is_grad_enabled():
            return _wait_op(self)  # differentiable (identity backward); lands in _wait below
        return _plain(self)

    wait = trigger_wait  # torch's ACT spells it both ways
    @property
    def completed(self) -> bool:
        """True once waited."""
        return self._pending is None or self._pending.done

    def tolist(self) -> Any: return self.trigger_wait().tolist()
    def numpy(self, *, force: bool = False) -> Any: return self.trigger_wait().numpy(force=force)
    def __repr__(self): return f"AsyncCollectiveTensor({self.trigger_wait()!r})"
    def __reduce_ex__(self, proto): return (super().__reduce_ex__ if self.is_meta else self.trigger_wait().__reduce_ex__)(proto)  # the value; meta has none: stays an ACT
    def __deepcopy__(self, memo): return self.trigger_wait().clone()

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        if expected_type is torch.Tensor:
            return self.trigger_wait()
        return self if expected_type is None or expected_type is type(self) else None

    @classmethod
    def __tensor_unflatten__(cls, inner_tensors, ctx, outer_size, outer_stride):
        elem = inner_tensors["elem"]
        # A graph being recorded waits a pending input first (wait_tensor is side-effectful:
        # never DCE'd), not again on AOTAutograd's second (functionalized) unflatten or retrace.
        if _compat.tracing_into_graph() and not isinstance(elem, _FT) and elem not in _WAITED:
            elem = _wait_op(elem)
            _WAITED[elem] = True
        return super().__tensor_unflatten__({"elem": elem}, ctx, outer_size, outer_stride)

    @classmethod
    def __op_handler__(cls, func):  # no op maps over elem: a view, or empty_like (reads no data), stays an ACT; others wait
        return _viewer(_compat.fast_op(func)) if _compat.is_pure_view(func) or func is _EMPTY_LIKE else partial(_data_use, _compat.fast_op(func))


def _plain(a, wait=True):  # the buffer of an ACT (waited unless wait=False); lists element-wise
    if type(a) is AsyncCollectiveTensor:
        if wait and a._pending is not None:
            if _compat.in_fake_or_proxy_mode():  # a captured eager instance: the graph waits
                return _wait_op(a.elem)
            a._pending.wait()  # re-raises if the collective failed
            a._pending = None
        return a.elem
    return type(a)(_plain(x) for x in a) if wait and type(a) in (list, tuple) else a  # views take no lists


def _data_use(op, func, types, args, kwargs):  # in-place/out= ops return the written wrappers
    out = op(*[_plain(a) for a in args], **{k: _plain(v) for k, v in kwargs.items()})
    return WrapperTensor.correct_aliasing(func, args, kwargs, out)


def _viewer(op):  # op: _compat.fast_op(func); a closure, not a partial: this runs on every view
    def view(func, types, args, kwargs):
        a = args[0]
        if type(a) is AsyncCollectiveTensor and not kwargs:  # the common shape, on every view: shortest
            out = op(a.elem, args[1]) if len(args) == 2 else op(a.elem, *args[1:])  # no slice for view(t, size)
        else:
            a = next(x for x in (*args, *kwargs.values()) if type(x) is AsyncCollectiveTensor)
            out = op(*[_plain(x, False) for x in args], **{k: _plain(v, False) for k, v in kwargs.items()})
        if a._pending is None and type(a.elem) is _FT:
            return out  # in a functionalized trace the input was waited at the top: views are plain
        return a.rewrap(func, args, kwargs, out)
    return view


@AsyncCollectiveTensor.implements(_wait_op)
def _wait(func, types, args, kwargs):  # autograd gives the result history: a new tensor, not elem
    return _plain(args[0]).view_as(args[0].elem) if args[0].requires_grad else _plain(args[0])

