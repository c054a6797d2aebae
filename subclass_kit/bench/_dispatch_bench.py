"""Eager dispatch cost of the kit's TwoTensor beside the Python-dispatch floor and torch's
TwoTensor, and per-call cost of a compiled function taking each (``aot_eager``, ratios to
torch's TwoTensor; and, unless quick, ``inductor``, ratios to the plain call).

The floor is the least a wrapper subclass can do: one ``__torch_dispatch__`` that runs the
op on its two inner tensors and wraps the first result's metadata, no aliasing fix-ups.
"""

from __future__ import annotations

import torch

from .. import _compat

__all__ = ["FloorTwo", "run"]


class FloorTwo(torch.Tensor):
    """The Python-dispatch floor: a hand-written two-tensor wrapper doing the minimum."""

    __torch_function__ = _compat.disabled_torch_function_impl  # type: ignore[assignment]  # torch types it as a method

    @staticmethod
    def __new__(cls, a, b):
        r = _compat.make_wrapper_subclass(
            cls, a.shape, strides=a.stride(), storage_offset=a.storage_offset(), dtype=a.dtype, device=a.device
        )
        r.a = a
        r.b = b
        return r

    def __init__(self, a, b):
        pass

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        args_a = [x.a if type(x) is cls else x for x in args]
        args_b = [x.b if type(x) is cls else x for x in args]
        out_a = func(*args_a, **kwargs)
        out_b = func(*args_b, **kwargs)
        if isinstance(out_a, torch.Tensor):
            return cls(out_a, out_b)
        return out_a


_KINDS = {"plain": "plain", "floor": "floor", "torch TwoTensor": "torch", "kit TwoTensor": "kit"}


def _ops(x, y):
    return {
        "add": lambda: torch.add(x, y),
        "mul": lambda: torch.mul(x, y),
        "view": lambda: x.view(-1),
        "detach": lambda: x.detach(),
    }


def run(quick: bool = False) -> list[dict]:
    """Rows (see ``subclass_kit.bench``) with ratios to torch's TwoTensor.

    Example:
        >>> rows = run(quick=True)  # doctest: +SKIP
    """
    TorchTwo = _compat.torch_two_tensor()

    from ..examples import TwoTensor as KitTwo
    from . import ratio_rows, side_by_side

    rounds, min_run_time = (3, 0.02) if quick else (7, 0.1)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    impls = {
        "plain": (a, a.clone()),
        "floor": (FloorTwo(a, b), FloorTwo(a.clone(), b.clone())),
        "torch TwoTensor": (TorchTwo(a, b), TorchTwo(a.clone(), b.clone())),
        "kit TwoTensor": (KitTwo(a, b), KitTwo(a.clone(), b.clone())),
    }
    rows = []
    for op in ("add", "mul", "view", "detach"):
        res = side_by_side({impl: _ops(x, y)[op] for impl, (x, y) in impls.items()}, rounds=rounds,
                           min_run_time=min_run_time)
        rows += ratio_rows("eager_dispatch", op, res, reference="torch TwoTensor", kinds=_KINDS)

    def f(x, y):
        return x * y + x

    calls = {}
    for impl in ("plain", "torch TwoTensor", "kit TwoTensor"):
        x, y = impls[impl]
        cf = torch.compile(f, backend="aot_eager", fullgraph=True)
        cf(x, y)
        calls[impl] = lambda cf=cf, x=x, y=y: cf(x, y)
    res = side_by_side(calls, rounds=rounds, min_run_time=min_run_time)
    rows += ratio_rows("compiled_call", "x*y+x", res, reference="torch TwoTensor", kinds=_KINDS)
    if quick:
        return rows
    # The same call through inductor, against the plain call: what a wrapper costs around an
    # already-compiled function (unflatten of the inputs, flatten/rebuild of the outputs).
    calls = {}
    for impl in ("plain", "torch TwoTensor", "kit TwoTensor"):
        x, y = impls[impl]
        cf = torch.compile(f, backend="inductor", fullgraph=True)
        cf(x, y)
        calls[impl] = lambda cf=cf, x=x, y=y: cf(x, y)
    res = side_by_side(calls, rounds=rounds, min_run_time=min_run_time)
    rows += ratio_rows("compiled_call inductor", "x*y+x", res, reference="plain", kinds=_KINDS)
    return rows
