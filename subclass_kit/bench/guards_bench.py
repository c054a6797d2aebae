"""Cost of ``GuardSet.check`` beside dynamo's own guard evaluation and call overhead.

Groups of rows, each measured in one run:

- ``check``: ``GuardSet.check`` on a plain tensor, torch's TwoTensor and the kit's
  TwoTensor (two inner tensors), passing and failing;
- ``inner_count``: a wrapper holding k inner tensors, k = 1..16 (cost should grow linearly);
- ``depth``: a chain of wrappers d deep, each holding the next (linear in d);
- ``dynamo``: on the same two-inner input, dynamo's own guard manager check, and the
  per-call cost of a dynamo-compiled ``x * 2`` minus the same op run eagerly.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import guards

from ..examples import TwoTensor

__all__ = ["Many", "Box", "run"]


class Many(torch.Tensor):
    """A wrapper with any number of inner tensors (``t0 .. t{k-1}``), torch's protocol only."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, tensors):
        a = tensors[0]
        return torch.Tensor._make_wrapper_subclass(cls, a.shape, strides=a.stride(), dtype=a.dtype, device=a.device)

    def __init__(self, tensors):
        self._names = tuple(f"t{i}" for i in range(len(tensors)))
        for n, t in zip(self._names, tensors):
            setattr(self, n, t)

    def __tensor_flatten__(self):
        return list(self._names), len(self._names)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Many([inner[f"t{i}"] for i in range(ctx)])

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        unwrap = lambda v: v.t0 if isinstance(v, Many) else v  # noqa: E731
        return func(*[unwrap(a) for a in args], **(kwargs or {}))


class Box(torch.Tensor):
    """A wrapper holding one inner tensor (which may be another Box): nesting depth."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
                                                   device=inner.device)

    def __init__(self, inner):
        self.x = inner

    def __tensor_flatten__(self):
        return ["x"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Box(inner["x"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        unwrap = lambda v: unwrap(v.x) if isinstance(v, Box) else v  # noqa: E731
        return func(*[unwrap(a) for a in args], **(kwargs or {}))


def _median_us(fn, number: int, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number * 1e6)
    return statistics.median(times), min(times)


def _row(group, name, impl, fn, number, repeat, **extra):
    med, best = _median_us(fn, number, repeat)
    return {"group": group, "name": name, "impl": impl, "median_us": round(med, 3), "best_us": round(best, 3), **extra}


def _two(kind, rows=4):
    a, b = torch.randn(rows, 3), torch.randn(rows, 3)
    return TwoTensor(a, b) if kind == "kit" else TorchTwoTensor(a, b)


def run(quick: bool) -> list[dict]:
    """Benchmark rows (``group``, ``name``, ``impl``, ``median_us``, ``best_us``, ...).

    Example:
        >>> rows = run(quick=True)  # doctest: +SKIP
    """
    number, repeat = (2000, 5) if quick else (20000, 15)
    rows: list[dict] = []

    inputs = {"plain": torch.randn(4, 3), "torch TwoTensor": _two("torch"), "kit TwoTensor": _two("kit")}
    for impl, x in inputs.items():
        gs = guards.build(x)
        same = type(x)(x.a.clone(), x.b.clone()) if impl != "plain" else x.clone()
        assert gs.check(same)
        rows.append(_row("check", "pass", impl, lambda gs=gs, v=same: gs.check(v), number, repeat, inner=len(gs.guards)))
        bad = _two("torch" if impl == "torch TwoTensor" else "kit", rows=5) if impl != "plain" else torch.randn(5, 3)
        assert not gs.check(bad)
        rows.append(_row("check", "fail (size)", impl, lambda gs=gs, v=bad: gs.check(v), number, repeat))

    for k in (1, 2, 4, 8, 16) if not quick else (1, 2, 8):
        x = Many([torch.randn(4, 3) for _ in range(k)])
        y = Many([torch.randn(4, 3) for _ in range(k)])
        gs = guards.build(x)
        assert gs.check(y)
        rows.append(_row("inner_count", f"k={k}", "Many", lambda gs=gs, v=y: gs.check(v), number, repeat, tensors=k + 1))

    for d in (1, 2, 4, 8) if not quick else (1, 2, 4):
        def chain():
            t = torch.randn(4, 3)
            for _ in range(d):
                t = Box(t)
            return t
        x, y = chain(), chain()
        gs = guards.build(x)
        assert gs.check(y)
        rows.append(_row("depth", f"d={d}", "Box", lambda gs=gs, v=y: gs.check(v), number, repeat, tensors=d + 1))

    # Side by side on the same two-inner input: dynamo's own guard evaluation, and the
    # per-call overhead of the compiled function over running its op eagerly.
    for impl in ("torch TwoTensor", "kit TwoTensor"):
        x = _two("torch" if impl.startswith("torch") else "kit")
        torch._dynamo.reset()

        def f(x):
            return x * 2

        cf = torch.compile(f, backend="eager", fullgraph=True, dynamic=False)
        cf(x)
        from guards import _compat

        (entry,) = _compat.cache_entries(f)
        mgr = entry.guard_manager
        assert mgr.check({"x": x})
        rows.append(_row("dynamo", "guard_manager.check", impl, lambda m=mgr, v=x: m.check({"x": v}), number, repeat))
        gs = guards.build(x)
        rows.append(_row("dynamo", "GuardSet.check", impl, lambda gs=gs, v=x: gs.check(v), number, repeat))
        n2 = max(200, number // 10)
        comp, _ = _median_us(lambda: cf(x), n2, repeat)
        eager, _ = _median_us(lambda: f(x), n2, repeat)
        rows.append({"group": "dynamo", "name": "compiled call - eager call", "impl": impl,
                     "median_us": round(comp - eager, 3), "compiled_us": round(comp, 3), "eager_us": round(eager, 3)})
        torch._dynamo.reset()
    return rows
