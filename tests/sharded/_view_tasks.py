"""Rank tasks: a compiled function that returns a view of its input, on every kind of view
(local, gathering the sharded dim, not expressible as slices) and placement -- its value
and its input's gradient against dense, eager and compiled, with the compiles counted.

AOTAutograd regenerates such an output at run time as
``input.as_strided(size, stride, output.storage_offset())`` (and autograd differentiates
that call), so each case checks that the offset it replays names the right global elements.
"""

from __future__ import annotations

import torch
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import ShardedTensor

from ._family_tasks import P, R, S0, S1, S2, _mesh, _place

close = torch.testing.assert_close

#: name -> (view of a (4, 6, 8) tensor, the placements to run it on). Each view on a shard
#: it gathers and on one it keeps (or the input laid out unlike the global tensor).
VIEWS = {
    "rows": (lambda t: t[1:3], (S1, S2, P)),
    "rows, strided cols, select": (lambda t: t[1:3, :, 2:7:2].select(2, 1), (S2, S1, S0)),
    "select": (lambda t: t.select(1, 2), (S1, S2, P)),
    "narrow": (lambda t: t.narrow(1, 1, 3), (S1, S0)),
    "step slice": (lambda t: t[:, ::2], (S1, S2)),
    "diagonal": (lambda t: t[1:].diagonal(1, 1, 2), (S1, S0, R)),
    "transpose, slice": (lambda t: t.transpose(0, 2)[3:7], (S2, S1)),
    "unfold": (lambda t: t[1:].unfold(2, 3, 2), (S2, S1)),
    "rows, flattened": (lambda t: t[1:3].view(2, 48), (S1, S2)),
    # views of an intermediate: AOTAutograd returns the base and regenerates the view
    "rows of an intermediate": (lambda t: (t * 2)[1:3, :, 2:7:2], (S1, S2)),
    "one of unbind": (lambda t: (t * 2).unbind(0)[1], (S1, S0)),
}
_LABEL = {S0: "S0", S1: "S1", S2: "S2", R: "R", P: "P"}


def _dense(f, X, W):
    x = X.clone().requires_grad_()
    y = f(x)
    (y * W).sum().backward()
    return y.detach(), x.grad


def _run(f, X, W, mesh, p, fn):
    x = _place(X, mesh, p).requires_grad_()
    y = fn(x)
    (y * W).sum().backward()
    return y, x.grad


def output_views(backend: str, only: tuple = ()) -> dict:
    """Every (view, placement) of :data:`VIEWS` (or the ``"view placement"`` keys in
    ``only``): eager equals dense; compiled (fullgraph, called twice with new values) equals
    dense, values and the input's gradient. Returns per case the frame count and the
    placements compiled and eager (raises on a wrong value)."""
    mesh = _mesh()
    res = {}
    for n, (name, (f, pls)) in enumerate(VIEWS.items()):
        pls = tuple(p for p in pls if not only or f"{name} {_LABEL[p]}" in only)
        gens = [torch.Generator().manual_seed(300 + 2 * n + i) for i in range(2)]
        Xs = [torch.randn(4, 6, 8, generator=g) for g in gens]
        Ws = [torch.randn(f(X).shape, generator=g) for X, g in zip(Xs, gens)]
        want = [_dense(f, X, W) for X, W in zip(Xs, Ws)]
        for p in pls:
            key = f"{name} {_LABEL[p]}"
            # A Partial input is the dense one split in fractions: equal up to rounding.
            exact = {} if p == P else {"rtol": 0, "atol": 0}
            y, g = _run(f, Xs[0], Ws[0], mesh, p, f)
            close(y.full_tensor(), want[0][0], **exact, msg=lambda m: f"eager {key}: {m}")
            close(g.full_tensor(), want[0][1], msg=lambda m: f"eager {key} grad: {m}")
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend(backend)
            fc = torch.compile(f, backend=cnt, fullgraph=True)
            for X, W, (wy, wg) in zip(Xs, Ws, want):
                yc, gc = _run(f, X, W, mesh, p, fc)
                close(yc.full_tensor(), wy, **exact, msg=lambda m: f"compiled {key}: {m}")
                close(gc.full_tensor(), wg, msg=lambda m: f"compiled {key} grad: {m}")
            res[key] = {"frames": cnt.frame_count, "compiled": repr(yc.placements), "eager": repr(y.placements)}
    return res


def input_views(backend: str) -> dict:
    """The compiled function's input is itself a view (a nonzero global offset, a local
    laid out unlike the global tensor): a gathering view of it, at two input offsets; and
    the same without autograd (AOTAutograd's inference graph)."""
    mesh = _mesh()
    f = VIEWS["rows, strided cols, select"][0]
    X = torch.randn(6, 6, 8, generator=torch.Generator().manual_seed(7))
    res = {}
    for p in (S1, S2):
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        fc = torch.compile(f, backend=cnt, fullgraph=True)
        base = _place(X, mesh, p)
        for lo in (1, 2):
            x = base[lo:lo + 4]
            close(fc(x).full_tensor(), f(X[lo:lo + 4]), rtol=0, atol=0, msg=lambda m: f"input view {lo} {p}: {m}")
        res[f"input view {_LABEL[p]}"] = cnt.frame_count
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend(backend)
    fc = torch.compile(f, backend=cnt, fullgraph=True)
    with torch.no_grad():
        for s in (1, 2):
            X = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(s))
            y = fc(_place(X, mesh, S2))
            close(y.full_tensor(), f(X), rtol=0, atol=0, msg=lambda m: f"no_grad: {m}")
    res["no_grad S2"] = cnt.frame_count
    assert isinstance(y, ShardedTensor)
    return res


def dynamic_views(backend: str) -> dict:
    """``dynamic=True``, three sizes of the last dim: a returned view's value against dense,
    and the frame count per (view, placement)."""
    mesh = _mesh()
    views = {"cols S0": (lambda t: t[:, 1:3], S0), "last S1": (lambda t: t[:, :, -1], S1),
             "rows S1": (lambda t: t[1:3], S1)}
    res = {}
    for key, (f, p) in views.items():
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        fc = torch.compile(f, backend=cnt, dynamic=True)
        for n in (8, 10, 12):
            X = torch.randn(4, 6, n, generator=torch.Generator().manual_seed(n))
            close(fc(_place(X, mesh, p)).full_tensor(), f(X), rtol=0, atol=0, msg=lambda m: f"dynamic {key} {n}: {m}")
        res[key] = cnt.frame_count
    return res


#: Views reached by the paths below: one keeping the shard, one gathering it.
_KEPT_AND_GATHERED = {"rows S1": (VIEWS["rows"][0], S1),
                      "rows, strided cols, select S2": (VIEWS["rows, strided cols, select"][0], S2)}


def _same_view(got, want, key) -> None:
    close(got.full_tensor(), want, rtol=0, atol=0, msg=lambda m: f"{key}: {m}")
    assert (got.stride(), got.storage_offset()) == (want.stride(), want.storage_offset()), key


def exported_views() -> dict:
    """torch.export (strict and not) of a module returning a view of a ShardedTensor input,
    or of its ShardedTensor parameter (strict export unwraps it in a traced
    ``__tensor_unflatten__``): the exported program's result against dense. Returns the
    placements of each result."""
    mesh = _mesh()
    X = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(11))
    res = {}
    for key, (f, p) in _KEPT_AND_GATHERED.items():
        for strict in (False, True):

            class Input(torch.nn.Module):
                def forward(self, x):
                    return f(x)

            class Param(torch.nn.Module):
                def __init__(self, w):
                    super().__init__()
                    self.w = torch.nn.Parameter(w, requires_grad=False)

                def forward(self, x):
                    return f(self.w), x + 1

            # "view param": the parameter is itself a view (its outer offset, 48 for Shard(1),
            # is not its local's): what the rebuild dynamo records takes no offset for.
            for kind, m, args, want in (("input", Input(), (_place(X, mesh, p),), f(X)),
                                        ("param", Param(_place(X, mesh, p)), (torch.ones(3),), f(X)),
                                        ("view param", Param(_place(X, mesh, p)[1:]), (torch.ones(3),), f(X[1:]))):
                name = f"{key} {kind} {'strict' if strict else 'nonstrict'}"
                with torch.no_grad():
                    out = torch.export.export(m, args, strict=strict).module()(*args)
                out = out if kind == "input" else out[0]
                _same_view(out, want, name)
                res[name] = repr(out.placements)
    return res


def views_across_a_graph_break(backend: str) -> dict:
    """A view made in one compiled frame and used in the next (a graph break between), and
    ``backward()`` through both: values and the input's gradient against dense. Returns
    the frame count per case."""
    mesh = _mesh()
    res = {}
    for key, (f, p) in _KEPT_AND_GATHERED.items():
        for src in ("input", "intermediate"):

            def g(t):
                v = f(t) if src == "input" else f(t * 2)
                torch._dynamo.graph_break()
                return v * 3

            X = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(12))
            W = torch.randn(f(X).shape, generator=torch.Generator().manual_seed(13))
            wy, wg = _dense(g, X, W)
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend(backend)
            y, gr = _run(g, X, W, mesh, p, torch.compile(g, backend=cnt))
            close(y.full_tensor(), wy, rtol=0, atol=0, msg=lambda m: f"{key} {src}: {m}")
            close(gr.full_tensor(), wg, msg=lambda m: f"{key} {src} grad: {m}")
            res[f"{key} {src}"] = cnt.frame_count
    return res


#: ``x.view(dtype)`` returned from a compiled function: to a smaller and a larger element
#: size, and the same size (of a gathered view, whose local is laid out unlike the global).
DTYPE_VIEWS = {
    "cols to int16 S0": (lambda t: t[:, :, -2:].view(torch.int16), S0),
    "rows to int16 S1": (lambda t: t[1:3].view(torch.int16), S1),
    "cols to float64 S2": (lambda t: t[1:, :, 4:].view(torch.float64), S2),
    "gathered to int32 S2": (lambda t: VIEWS["rows, strided cols, select"][0](t).view(torch.int32), S2),
    "rows to int32 S1": (lambda t: t[1:3].view(torch.int32), S1),
}


def dtype_views(backend: str) -> dict:
    """Each of :data:`DTYPE_VIEWS` eager and compiled (static, then ``dynamic=True``), on two
    sizes of the last dim: value, stride and offset against dense. Returns the frame count
    per (view, dynamic)."""
    mesh = _mesh()
    res = {}
    for key, (f, p) in DTYPE_VIEWS.items():
        for dynamic in (False, True):
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend(backend)
            fc = torch.compile(f, backend=cnt, dynamic=dynamic)
            for n in (8, 12):
                X = torch.randn(4, 6, n, generator=torch.Generator().manual_seed(n))
                x = _place(X, mesh, p)
                if not dynamic:
                    _same_view(f(x), f(X), f"eager {key} {n}")
                _same_view(fc(x), f(X), f"compiled {key} dynamic={dynamic} {n}")
            res[f"{key} dynamic={dynamic}"] = cnt.frame_count
    return res
