"""Cost of ``guards.build`` and ``GuardSet.check`` beside dynamo's own guard evaluation and call overhead.

Groups of rows, each measured in one run:

- ``check``: ``GuardSet.check`` on a plain tensor, torch's TwoTensor and the kit's
  TwoTensor (two inner tensors), passing and failing;
- ``build``: ``guards.build`` (describe, collect, generate and compile the check) on the
  same inputs, and on a ``ScaledTensor`` whose dim 0 is marked dynamic (its
  ``__inner_shapes__`` relations become guards);
- ``inner_count``: a wrapper holding k inner tensors, k = 1..16 (cost should grow linearly);
- ``depth``: a chain of wrappers d deep, each holding the next (linear in d);
- ``dispatcher``: ``GuardedDispatcher`` serving the newest of 1, 8 and 200 entries that
  differ in a meta value (found by key, so the three should cost about the same);
- ``dynamo``: on the same two-inner input, the kit's ``GuardSet.check`` beside dynamo's own
  guard manager check, and a dynamo-compiled ``x * 2`` beside the same op run eagerly.
"""

from __future__ import annotations

import torch

import guards
import symbolic

from .. import _compat
from ..base import WrapperTensor
from ..examples import ScaledTensor, TwoTensor
from ..fields import inner, meta
from . import ratio_rows, side_by_side

TorchTwoTensor = _compat.torch_two_tensor()

__all__ = ["Many", "Box", "Tagged", "run"]


class Many(torch.Tensor):
    """A wrapper with any number of inner tensors (``t0 .. t{k-1}``), torch's protocol only."""

    __torch_function__ = _compat.disabled_torch_function_impl  # type: ignore[assignment]  # torch types it as a method

    @staticmethod
    def __new__(cls, tensors):
        a = tensors[0]
        return _compat.make_wrapper_subclass(cls, a.shape, strides=a.stride(), dtype=a.dtype, device=a.device)

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

    __torch_function__ = _compat.disabled_torch_function_impl  # type: ignore[assignment]  # torch types it as a method

    @staticmethod
    def __new__(cls, inner):
        return _compat.make_wrapper_subclass(cls, inner.shape, strides=inner.stride(), dtype=inner.dtype,
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


class Tagged(WrapperTensor):
    """One inner tensor and an int meta value: the ctx the dispatcher rows vary."""

    a: torch.Tensor = inner()
    tag: int = meta(default=0)


def _dispatcher_serving(n: int):
    """A dispatcher holding ``n`` artifacts (tags 1..n), and a call that serves the newest."""
    base = torch.randn(4, 3)
    d = guards.GuardedDispatcher(lambda x: (lambda x: x), limit=max(n, 1))
    for tag in range(1, n + 1):
        d(Tagged(base, tag=tag))
    newest = Tagged(base, tag=n)
    assert len(d) == n and d.lookup(newest) is d.entries[-1]
    return lambda d=d, v=newest: d(v)


def _two(kind, rows=4):
    a, b = torch.randn(rows, 3), torch.randn(rows, 3)
    return TwoTensor(a, b) if kind == "kit" else TorchTwoTensor(a, b)


def run(quick: bool) -> list[dict]:
    """Benchmark rows (see ``subclass_kit.bench``), the groups the module lists.

    Example:
        >>> rows = run(quick=True)  # doctest: +SKIP
    """
    rounds, min_run_time = (3, 0.02) if quick else (7, 0.1)
    timed = lambda fns: side_by_side(fns, rounds=rounds, min_run_time=min_run_time)  # noqa: E731
    rows: list[dict] = []

    # GuardSet.check on three inputs, passing and failing; ratios to the plain tensor.
    inputs = {"plain tensor": torch.randn(4, 3), "torch TwoTensor": _two("torch"), "kit TwoTensor": _two("kit")}
    passing, failing = {}, {}
    for impl, x in inputs.items():
        gs = guards.build(x)
        same = type(x)(x.a.clone(), x.b.clone()) if impl != "plain tensor" else x.clone()
        assert gs.check(same)
        bad = _two("torch" if impl == "torch TwoTensor" else "kit", rows=5) if impl != "plain tensor" else torch.randn(5, 3)
        assert not gs.check(bad)
        passing[f"on {impl}"] = lambda gs=gs, v=same: gs.check(v)
        failing[f"on {impl}"] = lambda gs=gs, v=bad: gs.check(v)
    # Every impl here is the kit's GuardSet.check; what differs is the input.
    kinds = dict.fromkeys(passing, "kit")
    rows += ratio_rows("check", "GuardSet.check passes", timed(passing), reference="on plain tensor", kinds=kinds)
    rows += ratio_rows("check", "GuardSet.check fails (size)", timed(failing), reference="on plain tensor",
                       kinds=kinds)

    # guards.build on the same inputs, plus a wrapper whose relations become guards.
    scaled = ScaledTensor.from_float(torch.randn(16, 8))
    symbolic.mark_dynamic(scaled, 0)
    builds = {f"on {impl}": lambda x=x: guards.build(x) for impl, x in inputs.items()}
    builds["on kit ScaledTensor, dim 0 dynamic"] = lambda x=scaled: guards.build(x)
    assert guards.build(scaled).check(scaled)
    rows += ratio_rows("build", "guards.build", timed(builds), reference="on plain tensor",
                       kinds=dict.fromkeys(builds, "kit"))

    # Growth: k inner tensors, and d levels of nesting; ratios to the smallest.
    counts = {}
    for k in (1, 2, 4, 8, 16) if not quick else (1, 2, 8):
        x = Many([torch.randn(4, 3) for _ in range(k)])
        y = Many([torch.randn(4, 3) for _ in range(k)])
        gs = guards.build(x)
        assert gs.check(y)
        counts[f"k={k}"] = lambda gs=gs, v=y: gs.check(v)
    rows += ratio_rows("inner_count", "Many, k inner tensors", timed(counts), reference="k=1",
                       kinds=dict.fromkeys(counts, "scaling"))

    depths = {}
    for d in (1, 2, 4, 8) if not quick else (1, 2, 4):
        def chain(d=d):
            t = torch.randn(4, 3)
            for _ in range(d):
                t = Box(t)
            return t
        x, y = chain(), chain()
        gs = guards.build(x)
        assert gs.check(y)
        depths[f"d={d}"] = lambda gs=gs, v=y: gs.check(v)
    rows += ratio_rows("depth", "Box, d levels deep", timed(depths), reference="d=1",
                       kinds=dict.fromkeys(depths, "scaling"))

    serving = {f"{n} ctx value{'s' if n > 1 else ''}": _dispatcher_serving(n) for n in (1, 8, 200)}
    rows += ratio_rows("dispatcher", "GuardedDispatcher serves the newest entry", timed(serving),
                       reference="1 ctx value", kinds=dict.fromkeys(serving, "scaling"))

    # Side by side on the same two-inner input: dynamo's own guard evaluation, the kit's
    # GuardSet.check, and a dynamo-compiled ``x * 2`` beside the same op run eagerly.
    for impl in ("torch TwoTensor", "kit TwoTensor"):
        x = _two("torch" if impl.startswith("torch") else "kit")
        _compat.dynamo_reset()

        def f(x):
            return x * 2

        cf = torch.compile(f, backend="eager", fullgraph=True, dynamic=False)
        cf(x)
        from guards import _compat as guards_compat

        (entry,) = guards_compat.cache_entries(f)
        mgr = entry.guard_manager
        assert mgr.check({"x": x})
        gs = guards.build(x)
        res = timed({
            "dynamo guard_manager.check": lambda m=mgr, v=x: m.check({"x": v}),
            "kit GuardSet.check": lambda gs=gs, v=x: gs.check(v),
        })
        rows += ratio_rows("dynamo", f"guard check on {impl}", res, reference="dynamo guard_manager.check",
                           kinds={"dynamo guard_manager.check": "torch", "kit GuardSet.check": "kit"})
        res = timed({"eager x * 2": lambda x=x: f(x), "compiled x * 2": lambda cf=cf, x=x: cf(x)})
        rows += ratio_rows("dynamo", f"call on {impl}", res, reference="eager x * 2",
                           kinds={"eager x * 2": "plain", "compiled x * 2": "torch"})
        _compat.dynamo_reset()
    return rows
