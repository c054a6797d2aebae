"""Eager dispatch cost of the kit's TwoTensor beside the Python-dispatch floor and torch's
TwoTensor, and per-call cost of a compiled function taking each.

The floor is the least a wrapper subclass can do: one ``__torch_dispatch__`` that runs the
op on its two inner tensors and wraps the first result's metadata, no aliasing fix-ups.
"""

from __future__ import annotations

import torch

from .. import _compat

__all__ = ["FloorTwo", "run"]


class FloorTwo(torch.Tensor):
    """The Python-dispatch floor: a hand-written two-tensor wrapper doing the minimum."""

    __torch_function__ = _compat.disabled_torch_function_impl

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


def _side_by_side(fns: dict, *, number: int, repeat: int) -> dict:
    from . import side_by_side

    return {k: med for k, (med, _best) in side_by_side(fns, number=number, repeat=repeat).items()}


def _ops(x, y):
    return {
        "add": lambda: torch.add(x, y),
        "mul": lambda: torch.mul(x, y),
        "view": lambda: x.view(-1),
        "detach": lambda: x.detach(),
    }


def run(quick: bool = False) -> list[dict]:
    """Rows ``{"group", "name", "impl", "median_us", "ratio_vs_torch", "ratio_vs_floor"}``.

    Example:
        >>> rows = run(quick=True)  # doctest: +SKIP
    """
    from torch.testing._internal.two_tensor import TwoTensor as TorchTwo

    from ..examples import TwoTensor as KitTwo

    number, repeat = (200, 5) if quick else (2000, 9)
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    impls = {
        "plain": (a, a.clone()),
        "floor": (FloorTwo(a, b), FloorTwo(a.clone(), b.clone())),
        "torch_two": (TorchTwo(a, b), TorchTwo(a.clone(), b.clone())),
        "kit_two": (KitTwo(a, b), KitTwo(a.clone(), b.clone())),
    }
    rows = []
    for op in ("add", "mul", "view", "detach"):
        res = _side_by_side({impl: _ops(x, y)[op] for impl, (x, y) in impls.items()}, number=number, repeat=repeat)
        for impl, us in res.items():
            rows.append(
                {
                    "group": "eager_dispatch",
                    "name": op,
                    "impl": impl,
                    "median_us": round(us, 3),
                    "ratio_vs_torch": round(us / res["torch_two"], 3),
                    "ratio_vs_floor": round(us / res["floor"], 3),
                }
            )

    def f(x, y):
        return x * y + x

    calls = {}
    for impl in ("plain", "torch_two", "kit_two"):
        x, y = impls[impl]
        cf = torch.compile(f, backend="aot_eager", fullgraph=True)
        cf(x, y)
        calls[impl] = lambda cf=cf, x=x, y=y: cf(x, y)
    res = _side_by_side(calls, number=max(20, number // 4), repeat=repeat)
    for impl, us in res.items():
        rows.append(
            {
                "group": "compiled_call",
                "name": "x*y+x",
                "impl": impl,
                "median_us": round(us, 3),
                "ratio_vs_torch": round(us / res["torch_two"], 3),
                "ratio_vs_plain": round(us / res["plain"], 3),
            }
        )
    return rows
