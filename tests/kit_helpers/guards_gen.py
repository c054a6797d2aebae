"""Input descriptions for the differential tests: plain data that hypothesis can shrink,
turned into real (wrapped) tensors only inside the test."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import symbolic
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor

KINDS = ("plain", "torch_two", "two", "scaled", "block", "nested")
LAYOUTS = ("contig", "t", "slice")
MARKS = ("none", "dyn0", "dyn1", "maybe0", "static0", "sym0", "dyn0_range")


@dataclass(frozen=True)
class TDesc:
    """One tensor-like input."""

    kind: str = "plain"
    shape: tuple = (4, 3)
    layout: str = "contig"
    dtype: str = "float32"
    requires_grad: bool = False
    block: int = 2
    marks: str = "none"


@dataclass(frozen=True)
class Call:
    """One call: a tensor-like, an optional leaf and, for packed calls, a second tensor-like
    (``alias``: the very same object as ``x``) inside a list or dict argument."""

    x: TDesc
    leaf: object = None
    y: TDesc | None = None
    alias: bool = False
    pack: str = "args"  # "args": f(x[, leaf]); "list": f([x, y(, leaf)]); "dict": f({"x", "y"(, "n")})


def _dense(shape, layout, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if layout == "t" and len(shape) == 2:
        return torch.randn(shape[1], shape[0], generator=g, dtype=dtype).t()
    if layout == "slice":
        full = torch.randn(*shape[:-1], shape[-1] + 2, generator=g, dtype=dtype)
        return full[..., 1 : 1 + shape[-1]]
    return torch.randn(*shape, generator=g, dtype=dtype)


def _apply_marks(t, marks):
    if marks == "none":
        return
    if marks == "dyn0":
        torch._dynamo.mark_dynamic(t, 0)
    elif marks == "dyn1" and t.dim() > 1:
        torch._dynamo.mark_dynamic(t, 1)
    elif marks == "maybe0":
        torch._dynamo.maybe_mark_dynamic(t, 0)
    elif marks == "static0":
        torch._dynamo.mark_static(t, 0)
    elif marks == "sym0":
        symbolic.mark_dynamic(t, 0)
    elif marks == "dyn0_range":
        torch._dynamo.mark_dynamic(t, 0, min=2, max=64)


def make(d: TDesc, seed: int = 0) -> torch.Tensor:
    """Materialize a description (fresh tensors every time)."""
    dt = getattr(torch, d.dtype)
    shape = d.shape
    if d.kind == "plain":
        t = _dense(shape, d.layout, dt, seed).requires_grad_(d.requires_grad)
    elif d.kind == "torch_two":
        a = _dense(shape, d.layout, dt, seed).requires_grad_(d.requires_grad)
        b = _dense(shape, d.layout, dt, seed + 1).requires_grad_(d.requires_grad)
        t = TorchTwoTensor(a, b)
    elif d.kind == "two":
        a = _dense(shape, d.layout, dt, seed).requires_grad_(d.requires_grad)
        b = _dense(shape, d.layout, dt, seed + 1).requires_grad_(d.requires_grad)
        t = TwoTensor(a, b)
    elif d.kind == "scaled":
        t = ScaledTensor.from_float(_dense(shape, "contig", dt, seed).reshape(shape[0], -1))
    elif d.kind == "block":
        t = BlockScaled.from_float(_dense(shape, "contig", torch.float32, seed).reshape(shape[0], -1), block=d.block)
    elif d.kind == "nested":
        two = lambda s: ScaledTensor.from_float(_dense(shape, "contig", torch.float32, s).reshape(shape[0], -1))  # noqa: E731
        t = TwoTensor(two(seed), two(seed + 1))
    else:  # pragma: no cover
        raise ValueError(d.kind)
    _apply_marks(t, d.marks)
    return t


def args_of(c: Call, seed: int) -> tuple:
    x = make(c.x, seed)
    if c.pack == "args":
        return (x,) if c.leaf is None else (x, c.leaf)
    y = x if c.alias else make(c.y, seed + 7)
    if c.pack == "list":
        return ([x, y] if c.leaf is None else [x, y, c.leaf],)
    d = {"x": x, "y": y}
    if c.leaf is not None:
        d["n"] = c.leaf
    return (d,)


def fn_for(calls):
    c = calls[0]
    if c.pack != "args":
        return fn3
    return fn1 if c.leaf is None else fn2


def fn1(x):
    return x * 2


def fn2(x, leaf):
    if isinstance(leaf, bool):
        return x * 2 if leaf else x * 3
    if isinstance(leaf, (int, float)):
        return x * leaf
    return x * 2 if leaf == "a" else x * 3


def fn3(p):
    if isinstance(p, dict):
        a, b, n = p["x"], p["y"], p.get("n")
    else:
        a, b, n = p[0], p[1], (p[2] if len(p) > 2 else None)
    # Every leaf value is read (dynamo guards only what the function reads).
    if isinstance(n, bool):
        k = 2 if n else 3
    elif isinstance(n, (int, float)):
        k = n
    elif n is None:
        k = 2
    else:
        k = 2 if n == "a" else 3
    return [a * k, b * 3]


def dense(out):
    """Comparable dense value of a result (wrappers flattened to their inner tensors)."""
    if isinstance(out, (list, tuple)):
        return tuple(dense(o) for o in out)
    if isinstance(out, torch.Tensor) and type(out) is not torch.Tensor and hasattr(out, "__tensor_flatten__"):
        names, ctx = out.__tensor_flatten__()
        return (type(out).__name__, repr(ctx), tuple(dense(getattr(out, n)) for n in names))
    if isinstance(out, torch.Tensor):
        return out.detach()


def same(a, b) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, str):
        return a == b
    return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# -- hypothesis strategies -------------------------------------------------------------

_dims = st.sampled_from([1, 2, 3, 4, 5, 6])


@st.composite
def tdescs(draw, kind=None):
    kind = kind or draw(st.sampled_from(KINDS))
    rank = 2 if kind in ("scaled", "block", "nested") else draw(st.sampled_from([1, 2]))
    shape = tuple(draw(_dims) for _ in range(rank))
    layout = draw(st.sampled_from(LAYOUTS)) if kind in ("plain", "torch_two", "two") else "contig"
    dtype = draw(st.sampled_from(["float32", "float64"])) if kind != "block" else "float32"
    rg = draw(st.booleans()) if kind in ("plain", "torch_two", "two") else False
    block = draw(st.sampled_from([2, 4])) if kind == "block" else 2
    marks = draw(st.sampled_from(marks_for(kind)))
    return TDesc(kind, shape, layout, dtype, rg, block, marks)


def marks_for(kind):
    """Marks a user may sensibly put on ``kind``. Excluded, as outside the model: a ranged
    torch mark_dynamic on inner dims that ``__inner_shapes__`` derives (dynamo's solver then
    decides whether to raise), and mark_dynamic on a wrapper nested in a wrapper."""
    if kind == "nested":
        return ("none", "sym0", "maybe0")
    if kind in ("scaled", "block"):
        return ("none", "dyn0", "dyn1", "maybe0", "static0", "sym0")
    return MARKS


_MUTABLE = ("shape0", "shape1", "layout", "dtype", "requires_grad", "block", "marks")


@st.composite
def mutate(draw, d: TDesc):
    """A variation of ``d``: zero to two fields changed (kind kept, so most calls are close)."""
    n = draw(st.integers(0, 2))
    for _ in range(n):
        what = draw(st.sampled_from(_MUTABLE))
        if what == "shape0":
            d = dataclasses.replace(d, shape=(draw(_dims),) + d.shape[1:])
        elif what == "shape1" and len(d.shape) > 1:
            d = dataclasses.replace(d, shape=(d.shape[0], draw(_dims)))
        elif what == "layout" and d.kind in ("plain", "torch_two", "two"):
            d = dataclasses.replace(d, layout=draw(st.sampled_from(LAYOUTS)))
        elif what == "dtype" and d.kind != "block":
            d = dataclasses.replace(d, dtype=draw(st.sampled_from(["float32", "float64"])))
        elif what == "requires_grad" and d.kind in ("plain", "torch_two", "two"):
            d = dataclasses.replace(d, requires_grad=not d.requires_grad)
        elif what == "block" and d.kind == "block":
            d = dataclasses.replace(d, block=6 - d.block)
        elif what == "marks":
            d = dataclasses.replace(d, marks=draw(st.sampled_from(marks_for(d.kind))))
    return d


_leaves = st.one_of(st.none(), st.sampled_from([2, 3, 1, 0, 2.5, True, False, "a", "b"]))


@st.composite
def sequences(draw, max_calls=4):
    """``(dynamic, calls)``: a compile mode and 2..max_calls related calls."""
    dynamic = draw(st.sampled_from([False, None, True]))
    pack = draw(st.sampled_from(["args", "args", "list", "dict"]))
    base = draw(tdescs())
    ybase = draw(tdescs()) if pack != "args" else None
    with_leaf = draw(st.booleans())
    calls = []
    for _ in range(draw(st.integers(2, max_calls))):
        leaf = draw(_leaves) if with_leaf else None
        if with_leaf and leaf is None:
            leaf = "b"
        y = draw(mutate(ybase)) if ybase is not None else None
        alias = pack != "args" and draw(st.integers(0, 4)) == 0
        calls.append(Call(draw(mutate(base)), leaf, y, alias, pack))
    return dynamic, calls
