"""Rank tasks for issue 20 item 3: one representative op per rule family, forward and
backward, on Shard / Replicate / Partial inputs -- eager against dense (values and input
gradients), and compiled against eager with the compile counted -- plus the random ops'
consistency and one compiled function that crosses several families (the slow inductor
test). Each task raises on the first mismatch and returns a summary the tests assert on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, distribute
from subclass_kit.sharded._ops.generic import gathered_ops

close = torch.testing.assert_close
S0, S1, S2, R, P = Shard(0), Shard(1), Shard(2), Replicate(), Partial()


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


@dataclass(frozen=True)
class Case:
    """One family's representative: ``make(g)`` builds the dense inputs, ``fn`` the op;
    ``layouts`` maps a label to one placement per input; ``grads`` are the differentiable
    inputs; ``compiled`` the layout compiled (the one the family keeps, or its hard case);
    ``seed``: a random op, reseeded before every call."""

    family: str
    make: Callable[[torch.Generator], list]
    fn: Callable
    layouts: dict
    grads: tuple = (0,)
    compiled: str = ""
    seed: int | None = None
    tol: dict = field(default_factory=dict)


def _randn(*shape):
    return lambda g: torch.randn(*shape, generator=g)


_IDX = torch.tensor([7, 0, 3, 3, 5])
_TAKE = torch.tensor([[0, 95, 17], [40, 17, 191]])  # positions in the flattened (4, 6, 8) tensor


def cases() -> list[Case]:
    x3 = lambda g: [torch.randn(4, 6, 8, generator=g)]  # noqa: E731
    x3y3 = lambda g: [torch.randn(4, 6, 8, generator=g), torch.randn(4, 6, 8, generator=g)]  # noqa: E731
    return [
        Case("pointwise", x3y3, lambda x, y: F.gelu(x) * y + x,
             {"S0,S0": [S0, S0], "S1,R": [S1, R], "R,R": [R, R], "P,R": [P, R]}, (0, 1), "S1,R"),
        Case("reduction", x3, lambda x: x.amax(1) + x.sum(1),
             {"S0": [S0], "S1": [S1], "R": [R], "P": [P]}, (0,), "S1"),
        Case("view", x3, lambda x: x.flatten(1).unflatten(1, (3, 16)).permute(2, 0, 1),
             {"S0": [S0], "S1": [S1], "R": [R], "P": [P]}, (0,), "S0"),
        Case("view_backward", x3, lambda x: x[1:3, :, 2:7:2].select(2, 1),
             {"S0": [S0], "S1": [S1], "S2": [S2], "P": [P]}, (0,), "S1"),
        Case("matrix", lambda g: [torch.randn(4, 6, 8, generator=g), torch.randn(8, 5, generator=g)],
             lambda x, w: x @ w,
             {"S0,R": [S0, R], "S2,S0": [S2, S0], "R,S1": [R, S1], "P,R": [P, R]}, (0, 1), "S2,S0"),
        Case("norm", lambda g: [torch.randn(4, 6, 8, generator=g), torch.randn(8, generator=g), torch.randn(8, generator=g)],
             lambda x, w, b: F.layer_norm(x, (8,), w, b),
             {"S0": [S0, R, R], "S1": [S1, R, R], "S2": [S2, R, R], "R": [R, R, R]}, (0, 1, 2), "S1"),
        Case("norm rms", lambda g: [torch.randn(4, 6, 8, generator=g), torch.randn(8, generator=g)],
             lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6),
             {"S1": [S1, R], "S2": [S2, R]}, (0, 1)),
        Case("norm group", lambda g: [torch.randn(4, 6, 8, generator=g), torch.randn(6, generator=g), torch.randn(6, generator=g)],
             lambda x, w, b: F.group_norm(x, 3, w, b),
             {"S0": [S0, R, R], "S1": [S1, R, R]}, (0, 1, 2)),
        Case("nll", lambda g: [torch.randn(12, 10, generator=g), torch.randint(10, (12,), generator=g)],
             lambda x, t: F.cross_entropy(x, t),
             {"S0,S0": [S0, S0], "S0,R": [S0, R], "S1,R": [S1, R], "R,R": [R, R]}, (0,), "S0,S0"),
        Case("mse", x3y3, lambda x, y: F.mse_loss(x, y),
             {"S0,S0": [S0, S0], "S1,S1": [S1, S1], "S0,R": [S0, R], "R,R": [R, R]}, (0, 1), "S0,S0"),
        Case("embedding", lambda g: [torch.randint(10, (3, 5), generator=g), torch.randn(10, 6, generator=g)],
             lambda i, w: F.embedding(i, w),
             {"R table, S0 ids": [S0, R], "S0 table": [R, S0], "S1 table": [R, S1]}, (1,), "S0 table"),
        Case("attention", lambda g: [torch.randn(2, 4, 6, 8, generator=g) for _ in range(3)],
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             {"heads": [S1, S1, S1], "batch": [S0, S0, S0], "q seq": [S2, R, R], "R": [R, R, R]}, (0, 1, 2), "heads",
             tol=dict(atol=1e-5, rtol=1e-5)),
        Case("random", x3, lambda x: F.dropout(x, 0.3) * x,
             {"S0": [S0], "S1": [S1], "R": [R], "P": [P]}, (0,), "S1", seed=11),
        Case("indexing", x3, lambda x: x.index_select(2, _IDX).cumsum(1),
             {"S0": [S0], "S1": [S1], "S2": [S2], "P": [P]}, (0,), "S0"),
        Case("factory", x3, lambda x: x * torch.ones_like(x) + x.new_full(tuple(x.shape), 2.0) * x,
             {"S0": [S0], "S1": [S1], "P": [P], "R": [R]}, (0,), "S1"),
        Case("decompose", x3y3, lambda x, y: F.huber_loss(x, y, delta=0.5),
             {"S0,S0": [S0, S0], "S1,S1": [S1, S1], "R,R": [R, R]}, (0, 1), "S0,S0"),
        Case("generic", x3, lambda x: torch.take(x, _TAKE) * 2,
             {"S0": [S0], "S1": [S1], "R": [R]}, (0,), "S0"),
    ]


def _place(t: torch.Tensor, mesh, p) -> ShardedTensor:
    if type(p) is Partial:
        # Different operands on every rank that sum to ``t``.
        k, r = dist.get_world_size(), dist.get_rank()
        local = t * (r + 1) / (k * (k + 1) / 2) if t.is_floating_point() else (t if r == 0 else torch.zeros_like(t))
        return ShardedTensor.from_local(local, mesh, [p])
    return distribute(t, mesh, [p])


def _loss(out):
    return (out * out).sum()


def _call(case: Case, args):
    if case.seed is not None:
        torch.manual_seed(case.seed)
    return case.fn(*args)


def _dense(case: Case, ins: list):
    ins = [t.clone().requires_grad_(i in case.grads) for i, t in enumerate(ins)]
    out = _call(case, ins)
    _loss(out).backward()
    return out.detach(), [ins[i].grad for i in case.grads]


def _full(t):
    return t.full_tensor() if isinstance(t, ShardedTensor) else t


def _sharded(case: Case, ins: list, layout: list, mesh):
    args = [_place(t, mesh, p) for t, p in zip(ins, layout)]
    for i in case.grads:
        args[i].requires_grad_(True)
    return args


def _check(case, what, out, grads, want_out, want_grads):
    tol = case.tol or {}
    close(_full(out), want_out, msg=lambda m: f"{case.family} {what} value: {m}", **tol)
    for i, g, w in zip(case.grads, grads, want_grads):
        close(_full(g), w, msg=lambda m: f"{case.family} {what} grad of input {i}: {m}", **tol)


def families(backend: str | None, names: list | None = None) -> dict:
    """Each case of :func:`cases` (or those whose family is in ``names``): for every layout,
    the eager value and input gradients equal dense; with ``backend``, the compiled layout
    runs compiled (fullgraph) -- value and gradients equal eager's, then a second call with
    new values equals dense without a recompile. Returns per case and layout the output's and
    gradients' placements and the overloads that took the gathering fallback, and per
    compiled case its frame count."""
    mesh = _mesh()
    out: dict = {}
    for n, case in enumerate(cases()):
        if names is not None and case.family not in names:
            continue
        g = torch.Generator().manual_seed(100 + n)
        ins = case.make(g)
        want_out, want_grads = _dense(case, ins)
        eager = {}
        for label, layout in case.layouts.items():
            gathered_ops().clear()
            args = _sharded(case, ins, layout, mesh)
            y = _call(case, args)
            _loss(y).backward()
            grads = [args[i].grad for i in case.grads]
            _check(case, f"eager {label}", y, grads, want_out, want_grads)
            eager[label] = (y.detach(), grads)
            out[f"{case.family} {label}"] = {
                "out": repr(y.placements),
                "grads": [repr(gr.placements) if isinstance(gr, ShardedTensor) else "plain" for gr in grads],
                "gathered": sorted(map(str, gathered_ops())),
            }
        if backend is None or not case.compiled:
            continue
        label = case.compiled
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend(backend)

        def step(*a, case=case):
            y = _call(case, a) if case.seed is None else case.fn(*a)
            # y is returned detached: torch materializes the zero gradient of a returned
            # output the loss does not use as a plain tensor, which AOTAutograd refuses for
            # a subclass tangent (DTensor's too). A view of an input (view_backward's) is
            # rebuilt at run time by AOTAutograd through as_strided.
            return y.detach(), _loss(y)

        run = torch.compile(step, backend=cnt, fullgraph=True)
        for call, new_ins in enumerate((ins, case.make(torch.Generator().manual_seed(200 + n)))):
            args = _sharded(case, new_ins, case.layouts[label], mesh)
            if case.seed is not None:
                torch.manual_seed(case.seed)  # outside the compiled region: the same draw as eager's
            y, loss = run(*args)
            loss.backward()
            grads = [args[i].grad for i in case.grads]
            if call == 0:
                # compiled vs eager on the same inputs
                e_out, e_grads = eager[label]
                _check(case, f"compiled {label} vs eager", y, grads, _full(e_out), [_full(x) for x in e_grads])
            else:
                w_out, w_grads = _dense(case, new_ins)
                _check(case, f"compiled {label}, new values", y, grads, w_out, w_grads)
        out[f"frames {case.family} {label}"] = cnt.frame_count
    return out


def random_consistency(backend: str) -> dict:
    """dropout / bernoulli_ / normal_ / uniform_ / rand*_like under one ``torch.manual_seed``
    on every rank: a shard holds the dense op's values for it, Replicate is equal on every
    rank (the ranks' locals are compared through a gather of plain tensors), a Partial target
    of a fill gets the draw as a sum; eager, and compiled with ``backend`` (one frame per op)."""
    mesh = _mesh()
    ops = {
        "dropout": lambda t: F.dropout(t, 0.4),
        "bernoulli_": lambda t: t.bernoulli_(0.3),
        "normal_": lambda t: t.normal_(1.0, 2.0),
        "uniform_": lambda t: t.uniform_(-1, 1),
        "rand_like": lambda t: torch.rand_like(t),
        "randn_like": lambda t: torch.randn_like(t),
        "randint_like": lambda t: torch.randint_like(t, 3, 9),
    }
    res = {}
    k = dist.get_world_size()
    for name, fn in ops.items():
        torch.manual_seed(3)
        dense = fn(torch.ones(6, 4))
        for label, pl in {"S0": S0, "S1": S1, "R": R, "P": P}.items():
            if label == "P" and name == "dropout":
                continue  # dropout of a Partial: reduced first (the generic path), covered by the table
            for compiled in (False, True):
                x = _place(torch.ones(6, 4), mesh, pl)
                f = fn
                if compiled:
                    torch._dynamo.reset()
                    cnt = CompileCounterWithBackend(backend)
                    f = torch.compile(fn, backend=cnt, fullgraph=True)
                torch.manual_seed(3)
                y = f(x)
                close(y.full_tensor(), dense, msg=f"{name} {label} compiled={compiled}")
                if pl == S0:
                    # the shard is exactly the dense op's rows for it
                    r = dist.get_rank()
                    assert torch.equal(y.to_local(), dense.chunk(k, 0)[r]), (name, compiled)
                if pl == R:
                    mine = y.to_local().contiguous()
                    every = [torch.empty_like(mine) for _ in range(k)]
                    dist.all_gather(every, mine)
                    assert all(torch.equal(e, every[0]) for e in every), f"{name} Replicate differs across ranks"
                key = f"{name} {label}" + (" compiled" if compiled else "")
                res[key] = repr(y.placements) if not compiled else cnt.frame_count
    return res


def odd_dtypes(backend: str) -> dict:
    """int16 (and uint16 / uint64) ShardedTensors: gather, Partial reduction and a shard
    move equal dense bit for bit, eager and compiled (gloo carries none of these dtypes)."""
    mesh = _mesh()
    r = dist.get_rank()
    res = {}
    for dtype in (torch.int16, torch.uint16, torch.uint64):
        base = (torch.arange(24).reshape(6, 4) * 2731 - 30000)
        dense = base.to(torch.int16).to(dtype) if dtype != torch.uint64 else base.view(torch.int64).view(torch.uint64)
        x = distribute(dense, mesh, [S0])
        assert torch.equal(x.full_tensor(), dense), dtype
        moved = x.redistribute(mesh, [S1])
        assert torch.equal(moved.full_tensor(), dense) and torch.equal(moved.to_local(), dense.chunk(2, 1)[r]), dtype
        if dtype == torch.int16:
            # a Partial sum that wraps, as int16 additions do
            p = ShardedTensor.from_local(dense, mesh, [Partial()])
            want = dense + dense
            assert torch.equal(p.full_tensor(), want), "int16 Partial sum"
            torch._dynamo.reset()
            cnt = CompileCounterWithBackend(backend)
            f = torch.compile(lambda t, u: t.full_tensor() + u.redistribute(mesh, [R]).to_local(), backend=cnt, fullgraph=True)
            got = f(x, p)
            assert torch.equal(got, dense + want), "int16 compiled"
            res["int16 frames"] = cnt.frame_count
        res[str(dtype)] = "ok"
    return res


def sequence_parallel_block(backend: str) -> dict:
    """One compiled function across families, sequence-parallel style: x (batch, seq, dim)
    sharded on the sequence dim, plus an embedding of the sequence-sharded targets -> layer_norm
    -> linear (Replicate weight) -> dropout (seeded) -> softmax -> cross_entropy. Loss and every input's gradient equal eager's; eager equals
    dense; one frame, and a second call with new values equals dense without a recompile."""
    mesh = _mesh()

    def make(seed):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(2, 8, 16, generator=g), torch.randn(16, generator=g), torch.randn(16, generator=g),
                torch.randn(12, 16, generator=g), torch.randn(12, generator=g), torch.randint(12, (2, 8), generator=g),
                torch.randn(12, 16, generator=g)]

    def block(x, w_ln, b_ln, w, b, target, table):
        h = x + F.embedding(target, table)  # the indices' sequence shard: a local lookup
        h = F.layer_norm(h, (16,), w_ln, b_ln)
        h = F.linear(h, w, b)
        h = F.dropout(h, 0.2)
        h = torch.softmax(h, -1) * 3.0
        return F.cross_entropy(h.flatten(0, 1), target.flatten())

    layout = [S1, R, R, R, R, S1, R]
    grads = (0, 1, 2, 3, 4, 6)

    def dense_ref(ins):
        d = [t.clone().requires_grad_(i in grads) for i, t in enumerate(ins)]
        torch.manual_seed(7)
        loss = block(*d)
        loss.backward()
        return loss.detach(), [d[i].grad for i in grads]

    def sharded(ins):
        a = [distribute(t, mesh, [p]) for t, p in zip(ins, layout)]
        for i in grads:
            a[i].requires_grad_(True)
        return a

    res = {}
    ins = make(1)
    want, want_g = dense_ref(ins)
    a = sharded(ins)
    torch.manual_seed(7)
    loss = block(*a)
    loss.backward()
    close(loss.full_tensor(), want, msg="eager loss")
    for i, gw in zip(grads, want_g):
        close(a[i].grad.full_tensor(), gw, atol=1e-5, rtol=1e-5, msg=f"eager grad {i}")
    eager_g = [a[i].grad.full_tensor() for i in grads]
    res["eager grad of x"] = repr(a[0].grad.placements)

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend(backend)
    run = torch.compile(block, backend=cnt, fullgraph=True)
    # Inductor draws its own random numbers unless told to call the eager ops (dense
    # tensors and DTensor alike); with fallback_random its dropout is eager's.
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fallback_random=True):
        _compiled_calls(run, make, sharded, dense_ref, loss, eager_g, grads)
    res["frames"] = cnt.frame_count
    return res


def _compiled_calls(run, make, sharded, dense_ref, loss, eager_g, grads):
    for call, seed in enumerate((1, 2)):
        ins = make(seed)
        a = sharded(ins)
        torch.manual_seed(7)
        loss_c = run(*a)
        loss_c.backward()
        if call == 0:
            ref, ref_g = loss.full_tensor(), eager_g
        else:
            ref, ref_g = dense_ref(ins)
        close(loss_c.full_tensor(), ref, atol=1e-5, rtol=1e-5, msg=f"compiled loss, call {call}")
        for i, gw in zip(grads, ref_g):
            close(a[i].grad.full_tensor(), gw, atol=1e-5, rtol=1e-5, msg=f"compiled grad {i}, call {call}")


def output_view_of_input(backend: str) -> dict:
    """A compiled function that returns a view of its input with a nonzero storage offset,
    on each placement: the value against dense. AOTAutograd rebuilds such an output at run
    time as ``base.as_strided(size, stride, offset)`` with the traced output's offset."""
    mesh = _mesh()
    X = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(41))
    res = {}
    views = {
        "rows": lambda t: t[1:3],
        "rows, strided cols, select": lambda t: t[1:3, :, 2:7:2].select(2, 1),
        "transposed rows": lambda t: t[2:].transpose(1, 2),
    }
    for label, pl in {"S0": S0, "S1": S1, "S2": S2, "R": R}.items():
        for name, f in views.items():
            if label in ("S0", "R") and name != "rows":
                continue  # local and global layouts agree there: one view says it
            torch._dynamo.reset()
            x = distribute(X, mesh, [pl])
            y = torch.compile(f, backend=backend, fullgraph=True)(x)
            same = bool(torch.equal(y.full_tensor(), f(X)))
            res[f"{name} {label}"] = (same, repr(y.placements), repr(f(x).placements))
    return res
