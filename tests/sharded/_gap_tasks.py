"""Rank tasks for the op and metadata gaps of issue 12: backward through indexing, the
strides of contiguous()/clone(), and a property test that every op family gives the global
strides the dense tensor would have. Each task compares with dense references every rank
computes alike and raises on the first mismatch."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, distribute

close = torch.testing.assert_close


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


# The views autograd differentiates with a *_backward op (slice_backward, select_backward,
# diagonal_backward) or with cat/stack of the pieces plus zeros for the unused ones.
VIEWS = {
    "slice dim 0": lambda t: t[2:5],
    "slice dim 1 step": lambda t: t[:, 1:6:2],
    "negative slice": lambda t: t[-3:],
    "select dim 0": lambda t: t[2],
    "select dim 1": lambda t: t[:, -1],
    "narrow": lambda t: t.narrow(1, 2, 3),
    "diagonal": lambda t: t.diagonal(1),
    "split piece": lambda t: t.split(3, dim=0)[1],
    "unbind piece": lambda t: t.unbind(1)[2],
    "chunk piece": lambda t: t.chunk(2, dim=1)[0],
}


def backward_through_views(backend: str, placements=("Shard(0)", "Shard(1)", "Replicate()")) -> dict:
    """For each placement and view: the view's value and the gradient of a weighted sum
    through it equal dense, eagerly and compiled (``backend``, fullgraph)."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(12)
    D = torch.randn(8, 6, generator=g)
    weights = {name: torch.randn(fn(D).shape, generator=g) for name, fn in VIEWS.items()}

    def loss(t):
        return sum((fn(t) * weights[name]).sum() for name, fn in VIEWS.items())

    dense = D.clone().requires_grad_(True)
    loss(dense).backward()
    frames = {}
    for pl in [eval(p) for p in placements]:  # noqa: S307  (placement reprs)
        for name, fn in VIEWS.items():
            x = distribute(D, mesh, [pl]).requires_grad_(True)
            v = fn(x)
            close(v.full_tensor(), fn(D), msg=f"{name} of {pl}")
            (v * weights[name]).sum().backward()
            d = D.clone().requires_grad_(True)
            (fn(d) * weights[name]).sum().backward()
            close(x.grad.full_tensor(), d.grad, msg=f"grad of {name} of {pl}")
            assert x.grad.shape == D.shape and x.grad.stride() == d.grad.stride(), (name, pl)
        # Compiled: every view in one graph, the backward traced by AOTAutograd.
        cnt = CompileCounterWithBackend(backend)
        x = distribute(D, mesh, [pl]).requires_grad_(True)
        out = torch.compile(loss, backend=cnt, fullgraph=True)(x)
        close(out.full_tensor(), loss(D))
        out.backward()
        close(x.grad.full_tensor(), dense.grad, msg=f"compiled grad of {pl}")
        frames[repr(pl)] = cnt.frame_count
    # A Partial gradient passes through slice_backward unreduced (the op is linear).
    p = ShardedTensor.from_local(torch.full((3, 6), float(dist.get_rank() + 1)), mesh, [Partial("sum")])
    grad_in = torch.ops.aten.slice_backward.default(p, [8, 6], 0, 2, 5, 1)
    k = dist.get_world_size()
    expect = torch.zeros(8, 6)
    expect[2:5] = k * (k + 1) / 2
    close(grad_in.full_tensor(), expect)
    return {"frames": frames, "partial slice_backward": repr(grad_in.placements)}


def setitem(backend: str) -> dict:
    """``y[1:3] = s`` (rows) and ``y[:, 2] = c`` (a column) equal dense, with gradients,
    eagerly and compiled (functionalized into slice_scatter/select_scatter), when the
    written dim is not sharded; when it is, the view gathered a copy and the write raises
    (eagerly and compiled) instead of silently missing the base."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(5)
    B, S, C = torch.randn(6, 4, generator=g), torch.randn(2, 4, generator=g), torch.randn(6, generator=g)

    def rows(b, s, c):
        y = b * 2
        y[1:3] = s
        return (y * y).sum() + c.sum()

    def col(b, s, c):
        y = b * 2
        y[:, 2] = c
        return (y * y).sum() + s.sum()

    out = {}
    for f, pl, ok in ((rows, Shard(1), True), (rows, Replicate(), True), (col, Shard(0), True),
                      (col, Replicate(), True), (rows, Shard(0), False), (col, Shard(1), False)):
        dense = [t.clone().requires_grad_(True) for t in (B, S, C)]
        f(*dense).backward()
        for mode in ("eager", "compiled"):
            args = [distribute(t, mesh, [pl if t.dim() == 2 else Replicate()]).requires_grad_(True) for t in (B, S, C)]
            cnt = CompileCounterWithBackend(backend)
            run = f if mode == "eager" else torch.compile(f, backend=cnt, fullgraph=True)
            key = f"{f.__name__} {pl} {mode}"
            if not ok:
                try:
                    run(*args)
                except Exception as e:  # compiled: wrapped by dynamo, the message kept
                    assert "would not reach the base tensor" in str(e), str(e)
                    out[key] = "raises"
                    continue
                raise AssertionError(f"{key}: a write into a gathered view did not raise")
            r = run(*args)
            close(r.full_tensor(), f(B, S, C))
            r.backward()
            for a, d in zip(args, dense):
                close(a.grad.full_tensor(), d.grad, msg=key)
            out[key] = "ok" if mode == "eager" else cnt.frame_count
    return out


def contiguous_strides(backend: str) -> dict:
    """contiguous()/clone(memory_format=contiguous_format) of a permuted ShardedTensor has
    the dense tensor's global strides, so a later view (inside linear) works; eager and
    compiled."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(7)
    D = torch.randn(4, 6, 8, generator=g)
    W = torch.randn(5, 8, generator=g)
    dense = D.permute(1, 0, 2).contiguous()

    def f(x):
        y = x.permute(1, 0, 2).contiguous()
        z = x.permute(1, 0, 2).clone(memory_format=torch.contiguous_format)
        return y, z, torch.nn.functional.linear(y.view(-1, 8), w), y.stride(), z.stride()

    seen = {}
    for pl in (Shard(0), Shard(1), Replicate()):
        w = distribute(W, mesh, [Replicate()])
        x = distribute(D, mesh, [pl])
        y, z, lin, ys, zs = f(x)
        assert y.stride() == dense.stride() == z.stride(), (pl, y.stride(), z.stride(), dense.stride())
        assert y.is_contiguous() and y.local.is_contiguous()
        close(y.full_tensor(), dense)
        close(z.full_tensor(), dense)
        close(lin.full_tensor(), dense.view(-1, 8) @ W.t())
        cnt = CompileCounterWithBackend(backend)
        yc, zc, linc, ysc, zsc = torch.compile(f, backend=cnt, fullgraph=True)(x)
        assert ysc == zsc == dense.stride() and yc.stride() == dense.stride(), (pl, ysc, yc.stride())
        close(linc.full_tensor(), dense.view(-1, 8) @ W.t())
        seen[repr(pl)] = cnt.frame_count
    return seen


# ---- ops along dims and ops by positions --------------------------------------------------
# Issue 12's "other *_backward ops": each value and its gradient (index_backward,
# gather/scatter_add, index_add, unfold_backward, sort/topk's value-selecting backward, pad's
# negative pad, ...) against dense.
_IDX = torch.tensor([0, 2, 2, 6, 5])
POSITIONS = {
    "index": lambda t: t[_IDX],
    "index cols": lambda t: t[:, torch.tensor([1, 1, 4])],
    "index_select 0": lambda t: t.index_select(0, _IDX),
    "index_select 1": lambda t: t.index_select(1, torch.tensor([3, 0])),
    "gather 1": lambda t: t.gather(1, (torch.arange(7 * 2) % 6).view(7, 2)),
    "take_along_dim 0": lambda t: torch.take_along_dim(t, (torch.arange(3 * 6) % 7).view(3, 6), 0),
    "unfold 0": lambda t: t.unfold(0, 3, 2),
    "unfold 1": lambda t: t.unfold(1, 2, 1),
    "roll": lambda t: t.roll(2, 0),
    "roll flat": lambda t: t.roll(5),
    "flip 1": lambda t: t.flip(1),
    "cumsum 0": lambda t: t.cumsum(0),
    "cumsum 1": lambda t: t.cumsum(1),
    "sort 0": lambda t: t.sort(0).values,
    "topk 1": lambda t: t.topk(2, 1).values,
    "max dim 0": lambda t: t.max(0).values,
    "max dim 1 keepdim": lambda t: t.max(1, keepdim=True).values,
    "tril": lambda t: t.tril(),
    "triu 1": lambda t: t.triu(1),
    "pad": lambda t: torch.nn.functional.pad(t, (1, 2, 0, 1)),
    "pad last": lambda t: torch.nn.functional.pad(t, (2, 0)),
    "repeat": lambda t: t.repeat(2, 1),
    "where mask": lambda t: torch.where(t > 0, t, t * 0.5),
}
# Data-dependent output sizes: eager only (a compiled graph would need unbacked sizes).
EAGER_ONLY = {"masked_select": lambda t: t[t > 0]}


def backward_through_positions(backend: str, placements=("Shard(0)", "Shard(1)", "Replicate()")) -> dict:
    """Each op of POSITIONS (and EAGER_ONLY, eagerly) on an uneven 7x6 tensor: value and the
    gradient of a weighted sum equal dense, eagerly; compiled (``backend``, fullgraph) all
    at once, one graph per placement. Also: integer results (argmax, sort's indices), and an
    in-place write by positions into a shard raises a named error while a Replicate one
    matches dense."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(21)
    D = torch.randn(7, 6, generator=g)
    ops = {**POSITIONS, **EAGER_ONLY}
    weights = {name: torch.randn(fn(D).shape, generator=g) for name, fn in ops.items()}

    def loss(t):
        return sum((fn(t) * weights[name]).sum() for name, fn in POSITIONS.items())

    dense = D.clone().requires_grad_(True)
    loss(dense).backward()
    frames, kept = {}, {}
    for pl in [eval(p) for p in placements]:  # noqa: S307  (placement reprs)
        for name, fn in ops.items():
            x = distribute(D, mesh, [pl]).requires_grad_(True)
            v = fn(x)
            close(v.full_tensor(), fn(D), msg=f"{name} of {pl}")
            kept[f"{name} of {pl}"] = repr(tuple(v.placements))
            (v * weights[name]).sum().backward()
            d = D.clone().requires_grad_(True)
            (fn(d) * weights[name]).sum().backward()
            close(x.grad.full_tensor(), d.grad, msg=f"grad of {name} of {pl}")
        x = distribute(D, mesh, [pl])
        for name, fn in {"argmax 1": lambda t: t.argmax(1), "sort indices": lambda t: t.sort(1).indices}.items():
            r = fn(x)
            assert r.dtype == torch.int64 and torch.equal(r.full_tensor(), fn(D)), (name, pl)
        cnt = CompileCounterWithBackend(backend)
        x = distribute(D, mesh, [pl]).requires_grad_(True)
        out = torch.compile(loss, backend=cnt, fullgraph=True)(x)
        close(out.full_tensor(), loss(D))
        out.backward()
        close(x.grad.full_tensor(), dense.grad, msg=f"compiled grad of {pl}")
        frames[repr(pl)] = cnt.frame_count
    # In place by positions: into a whole tensor it matches dense; into a shard too (computed
    # whole, each rank keeps its rows), and the shard keeps its placements.
    idx, src = torch.tensor([0, 3, 3]), torch.ones(3, 6)
    r = distribute(D, mesh, [Replicate()])
    r.index_add_(0, idx, src)
    close(r.full_tensor(), D.clone().index_add_(0, idx, src))
    s = distribute(D, mesh, [Shard(0)])
    s.index_add_(0, idx, src)
    close(s.full_tensor(), D.clone().index_add_(0, idx, src))
    raised = repr(s.placements)
    return {"frames": frames, "kept": kept, "inplace into shard": raised}


# ---- property: global strides equal the dense tensor's after every op family -------------
def _op_table():
    aten = torch.ops.aten
    return {
        # pointwise
        "add": lambda t: t + t,
        "mul scalar": lambda t: t * 3,
        "relu": lambda t: t.relu(),
        "clone": lambda t: t.clone(),
        "contiguous": lambda t: t.contiguous(),
        "clone contiguous": lambda t: t.clone(memory_format=torch.contiguous_format),
        "to double": lambda t: t.to(torch.float64),
        # view
        "t": lambda t: t.transpose(0, -1),
        "permute": lambda t: t.permute(*reversed(range(t.dim()))),
        "unsqueeze": lambda t: t.unsqueeze(1),
        "squeeze": lambda t: t.squeeze(),
        "slice": lambda t: t[1:],
        "select": lambda t: t[0] if t.dim() > 1 else t,
        "narrow last": lambda t: t.narrow(-1, 0, max(1, t.size(-1) - 1)),
        "flatten": lambda t: t.flatten(),
        "expand": lambda t: t.unsqueeze(0).expand(2, *t.shape),
        # matrix
        "matmul": lambda t: t @ t.transpose(-1, -2) if t.dim() >= 2 else t,
        # reduction
        "sum 0": lambda t: t.sum(0),
        "mean keepdim": lambda t: t.mean(-1, keepdim=True),
        "amax": lambda t: t.amax(0),
        # factory
        "zeros_like": lambda t: torch.zeros_like(t),
        "empty_like": lambda t: torch.empty_like(t).fill_(1),
        "new_zeros": lambda t: t.new_zeros(t.shape),
        # cat/stack
        "cat": lambda t: torch.cat([t, t], -1),
        "stack": lambda t: torch.stack([t, t], 0),
        # backward ops
        "slice_backward": lambda t: aten.slice_backward.default(t, [t.size(0) + 2, *t.shape[1:]], 0, 1, t.size(0) + 1, 1),
        "select_backward": lambda t: aten.select_backward.default(t, [2, *t.shape], 0, 1),
        # along dims / by positions
        "flip": lambda t: t.flip(0),
        "roll": lambda t: t.roll(1, -1),
        "cumsum": lambda t: t.cumsum(-1),
        "sort": lambda t: t.sort(0).values,
        "max dim": lambda t: t.max(-1).values,
        "pad": lambda t: torch.nn.functional.pad(t, (1, 0)),
        "index_select": lambda t: t.index_select(0, torch.tensor([0, 0])),
        "gather": lambda t: t.gather(0, torch.zeros((1, *t.shape[1:]), dtype=torch.long)),
        "index": lambda t: t[torch.tensor([0, 0])],
        "repeat": lambda t: t.repeat(*([2] + [1] * (t.dim() - 1))),
    }


_ZERO_DIM_OK = {"add", "mul scalar", "relu", "clone", "contiguous", "clone contiguous", "to double",
                "unsqueeze", "squeeze", "flatten", "zeros_like", "empty_like", "new_zeros", "stack"}


def _significant(t) -> tuple:
    """Strides of the dims longer than 1: the ones that say anything about the layout (what
    torch's fake-tensor cross-checks compare; a size-1 dim's stride is arbitrary, and fake
    and real kernels pick it differently)."""
    return tuple(st if n > 1 else None for n, st in zip(t.shape, t.stride()))


def strides_property(max_examples: int) -> dict:
    """Hypothesis draws a dense tensor (sizes 1..5, 1-3 dims), a placement and a chain of
    up to 3 ops after each op of the table; after every op the ShardedTensor's shape,
    (significant) strides and storage offset equal the dense result's, and its value does. Every rank draws
    the same examples (derandomized, no shrinking), so the collectives stay in step."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    mesh = _mesh()
    table = _op_table()
    names = sorted(table)
    ran = {n: 0 for n in names}

    @st.composite
    def cases(draw):
        shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
        pl = draw(st.sampled_from([Replicate()] + [Shard(d) for d in range(len(shape))]))
        chain = draw(st.lists(st.sampled_from(names), max_size=3))
        perm = draw(st.booleans())
        return shape, pl, chain, perm

    def run(first: str):
        @settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                  phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
        @given(cases())
        def check(case):
            shape, pl, chain, perm = case
            d = torch.arange(float(torch.Size(shape).numel())).reshape(shape) / 7
            x = distribute(d, mesh, [pl])
            if perm and d.dim() > 1:  # start from a non-contiguous layout too
                d, x = d.transpose(0, -1), x.transpose(0, -1)
            for name in (first, *chain):
                if d.dim() == 0 and name not in _ZERO_DIM_OK:
                    continue
                nd = table[name](d)
                nx = table[name](x)
                assert tuple(nx.shape) == tuple(nd.shape), (case, name, nx.shape, nd.shape)
                assert _significant(nx) == _significant(nd), (case, name, nx.stride(), nd.stride())
                # A view of a view starts where the dense one does (x[2:5][1:2]).
                assert nx.storage_offset() == nd.storage_offset(), (case, name, nx.storage_offset(), nd.storage_offset())
                close(nx.full_tensor(), nd, msg=f"{case} {name}")
                ran[name] += 1
                d, x = nd, nx

        check()

    for first in names:  # every op starts some chains, on every rank in the same order
        run(first)
    return ran


# ---- placements and meshes as compile-time constants --------------------------------------
def compile_constants() -> dict:
    """Reading ``.placements``, ``placements[0].is_shard()``/``.dim`` and ``.device_mesh`` of
    an intermediate inside ``torch.compile(fullgraph=True)`` (a branch, a forward hook)
    traces without a graph break and equals eager; a new but equal DeviceMesh does not
    recompile (counted against DTensor on the same meshes), other placements do."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import Replicate as TR
    from torch.distributed.tensor import Shard as TS

    k, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(3)
    D = torch.randn(8, 6, generator=g)
    out = {}

    def branch(x):
        y = x * 2
        pl = y.placements
        if pl[0].is_shard() and pl[0].dim == 0:
            y = y + 1
        elif pl[0].is_replicate():
            y = y - 1
        m = y.device_mesh
        z = y.redistribute(m, [Replicate()])
        return z.to_local(), y.placements == (Shard(0),), m.ndim

    cnt = CompileCounterWithBackend("aot_eager")
    cbranch = torch.compile(branch, backend=cnt, fullgraph=True)
    mesh = _mesh()
    for pl, ref in ((Shard(0), D * 2 + 1), (Shard(1), D * 2), (Replicate(), D * 2 - 1)):
        x = distribute(D, mesh, [pl])
        got, is_s0, nd = cbranch(x)
        e_got, e_s0, e_nd = branch(x)
        close(got, ref)
        close(e_got, ref)
        assert (is_s0, nd) == (e_s0, e_nd) == (pl == Shard(0), 1)
    out["placements frames"] = cnt.frame_count  # one per placement: guarded by value

    # A forward hook reading the placements of a module's output, compiled whole.
    lin = torch.nn.Linear(6, 4)
    seen = []

    def hook(mod, args, output):
        seen.append(output.placements[0].is_shard())
        return output * 2 if output.placements[0].is_shard(0) else output

    lin.register_forward_hook(hook)
    w = distribute(lin.weight.detach(), mesh, [Replicate()])
    b = distribute(lin.bias.detach(), mesh, [Replicate()])
    lin.weight, lin.bias = torch.nn.Parameter(w), torch.nn.Parameter(b)
    cnt_h = CompileCounterWithBackend("aot_eager")
    y = torch.compile(lin, backend=cnt_h, fullgraph=True)(distribute(D, mesh, [Shard(0)]))
    close(y.full_tensor(), (D @ lin.weight.full_tensor().t() + lin.bias.full_tensor()) * 2)
    out["hook frames"] = cnt_h.frame_count

    # New but equal meshes, passed in: count compiles, kit vs DTensor.
    def kit(loc, m):
        x = ShardedTensor.from_local(loc, m, [Shard(0)])
        return (x * 2).redistribute(m, [Replicate()]).to_local()

    def dtensor(loc, m):
        x = DTensor.from_local(loc, m, [TS(0)])
        return (x * 2).redistribute(m, [TR()]).to_local()

    loc = D.chunk(k)[r].clone()
    for name, fn in (("kit", kit), ("dtensor", dtensor)):
        c = CompileCounterWithBackend("aot_eager")
        cf = torch.compile(fn, backend=c, fullgraph=True)
        for i in range(4):
            m = init_device_mesh("cpu", (k,)) if i % 2 == 0 else DeviceMesh("cpu", list(range(k)))
            close(cf(loc, m), D * 2)
        out[f"{name} frames over 4 new meshes"] = c.frame_count
    return out


def async_redistribute() -> dict:
    """``redistribute(..., async_op=True)``: the result's local is a pending
    AsyncCollectiveTensor (as DTensor's); its values, ops on it and gradients through it
    equal dense and the synchronous redistribute; compiled, it is the same graph."""
    from subclass_kit.collectives import AsyncCollectiveTensor

    mesh = _mesh()
    g = torch.Generator().manual_seed(9)
    D, W = torch.randn(6, 4, generator=g), torch.randn(4, 3, generator=g)
    out = {}
    for src, dst in ((Shard(0), Replicate()), (Shard(0), Shard(1)), (Partial("sum"), Replicate())):
        if type(src) is Partial:
            k, r = dist.get_world_size(), dist.get_rank()
            x = ShardedTensor.from_local(D * (r + 1) / (k * (k + 1) / 2), mesh, [src]).detach().requires_grad_(True)
        else:
            x = distribute(D, mesh, [src]).requires_grad_(True)
        y = x.redistribute(mesh, [dst], async_op=True)
        out[f"{src}->{dst} local"] = (type(y.local).__name__, y.placements == (dst,))
        z = (y @ distribute(W, mesh, [Replicate()])).sum()
        close(z.full_tensor(), (D @ W).sum())
        z.full_tensor().backward()
        xs = x.detach().clone().requires_grad_(True)
        zs = (xs.redistribute(mesh, [dst]) @ distribute(W, mesh, [Replicate()])).sum()
        zs.full_tensor().backward()
        close(x.grad.full_tensor(), xs.grad.full_tensor(), msg=f"{src}->{dst}")
        close(y.full_tensor(), D)
        assert type(y.local) is not AsyncCollectiveTensor or y.local.completed
    cnt = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda t: t.redistribute(mesh, [Replicate()], async_op=True).to_local() * 2, backend=cnt, fullgraph=True)
    close(f(distribute(D, mesh, [Shard(0)])), D * 2)
    out["compiled frames"] = cnt.frame_count
    return out


# ---- a reduced dim smaller than the mesh ---------------------------------------------------
def reductions_of_empty_shards() -> dict:
    """max/min reductions over a dim of size 1 on 2 ranks: one rank's shard is empty. Its
    local result is the reduction's identity, so every rank reaches the all-reduce and the
    result equals dense (torch's own amax on the empty shard raises, and the other rank
    would wait in the all-reduce until the timeout)."""
    mesh = _mesh()
    got = {}
    for dtype in (torch.float32, torch.int64, torch.bool):
        d = (torch.arange(6).reshape(1, 6) % 4).to(dtype)
        x = distribute(d, mesh, [Shard(0)])
        got[f"local numel {dtype}"] = x.to_local().numel()
        for name, f in (("amax", lambda t: t.amax(0)), ("amin", lambda t: t.amin(0)),
                        ("max", torch.max), ("min", torch.min), ("amax keepdim", lambda t: t.amax(0, keepdim=True))):
            if dtype == torch.bool and name.startswith("am"):
                continue  # torch has no amax/amin for bool
            out = f(x)
            assert torch.equal(out.full_tensor(), f(d)), (name, dtype)
            got[f"{name} {dtype}"] = str(out.placements)
    return got


# Ops whose planned fast path runs on the local: a shard's local can be 1 long in a dim
# whose global size is 2 or 3 (and 0 long where it is 1), which the local alone cannot tell.
SHORT_LOCAL_OPS = {
    "squeeze()": lambda t: t.squeeze(),
    "squeeze(1)": lambda t: t.squeeze(1),
    "squeeze((1, 2))": lambda t: t.squeeze((1, 2)),
    "squeeze_copy": lambda t: torch.squeeze_copy(t, 1),
    "unsqueeze(-1)": lambda t: t.unsqueeze(-1),
    "expand": lambda t: t.expand(2, *t.shape),
    "expand size-1 dim": lambda t: t.expand(t.shape[0], t.shape[1], 4),
    "select dim 0": lambda t: t.select(0, 1),
    "slice dim 2": lambda t: t[:, :, 0:1],
    "diagonal(0, 0, 2)": lambda t: t.diagonal(0, 0, 2),
    "split dim 0": lambda t: t.split(1, 0),
    "unbind dim 0": lambda t: t.unbind(0),
    "max over dim 0": lambda t: torch.max(t, 0),
    "var_mean dim 0": lambda t: torch.var_mean(t, 0, correction=0),
    "tensordot": lambda t: torch.tensordot(t, t, dims=([0, 2], [0, 2])),
    "double": lambda t: t.double(),
    "zeros_like": torch.zeros_like,
    "new_zeros": lambda t: t.new_zeros(t.shape),
    "view_as_real": lambda t: torch.view_as_real(t.to(torch.complex64)),
}


def short_local_views() -> dict:
    """Every op of SHORT_LOCAL_OPS on a ``(2, n, 1)`` tensor sharded on dim 1 (n = 1, 2, 3: a
    local 0 or 1 long where the global dim is not 1 long), twice (the plan's miss and its hit):
    the value equals dense's on every rank. Returns each case's result placements."""
    mesh = _mesh()
    got = {}
    for n in (1, 2, 3):
        d = torch.arange(2 * n, dtype=torch.float32).reshape(2, n, 1) + 1
        x = distribute(d, mesh, [Shard(1)])
        for name, fn in SHORT_LOCAL_OPS.items():
            want = fn(d)
            for _ in range(2):
                out = fn(x)
                outs, wants = (out, want) if isinstance(want, tuple) else ((out,), (want,))
                for o, w in zip(outs, wants):
                    assert o.shape == w.shape, (name, n, o.shape, w.shape)
                    close(o.full_tensor(), w, msg=lambda m: f"{name} n={n}: {m}")
                got[f"{name} n={n}"] = [str(o.placements) for o in outs]
    return got
