"""Gradients of the ``*_autograd`` collectives against a dense single-process reference.

Every rank rebuilds all ranks' inputs, replays the collective densely (stack, cat,
chunk), and differentiates the *total* loss (the sum of every rank's loss) with ordinary
autograd; the distributed gradient of this rank's input must match it. One function holds
every case, so eager and compiled runs each cost one forward, one backward and (compiled)
one compile.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

from kit_helpers.harness import world
from collectives._impls import IMPLS, rank_input, uneven_splits

pytestmark = pytest.mark.dist


def _cases(impl_name: str, n: int):
    """(name, input shape, distributed fn, dense fn(xs, rank) -> that rank's output)."""
    I = IMPLS[impl_name]
    in_s, out_s = uneven_splits(n)
    cases = [
        ("all_reduce sum", (3, 2), lambda x: I.all_reduce_ag(x, "sum"), lambda xs, r: torch.stack(xs).sum(0)),
        ("all_gather dim0", (2, 3), lambda x: I.all_gather_ag(x, 0), lambda xs, r: torch.cat(xs, 0)),
        ("all_gather dim1", (2, 3), lambda x: I.all_gather_ag(x, 1), lambda xs, r: torch.cat(xs, 1)),
        ("reduce_scatter sum dim0", (2 * n, 3), lambda x: I.reduce_scatter_ag(x, "sum", 0),
         lambda xs, r: torch.chunk(torch.stack(xs).sum(0), n, 0)[r]),
        ("reduce_scatter sum dim1", (2, 2 * n), lambda x: I.reduce_scatter_ag(x, "sum", 1),
         lambda xs, r: torch.chunk(torch.stack(xs).sum(0), n, 1)[r]),
        ("all_to_all even", (2 * n, 3), lambda x: I.all_to_all_ag(x, None, None),
         lambda xs, r: torch.cat([torch.chunk(x, n)[r] for x in xs])),
        ("all_to_all uneven", None, lambda x, r=None: None, None),  # filled below (shape per rank)
    ]
    cases[-1] = (
        "all_to_all uneven", lambda r: (sum(in_s[r]), 3),
        lambda x: I.all_to_all_ag(x, out_s[dist.get_rank()], in_s[dist.get_rank()]),
        lambda xs, r: torch.cat([torch.split(x, in_s[s])[r] for s, x in enumerate(xs)]),
    )
    if impl_name == "kit":
        # torch's functional collectives define no gradient for these.
        cases += [
            ("all_reduce avg", (3, 2), lambda x: I.all_reduce_ag(x, "avg"), lambda xs, r: torch.stack(xs).mean(0)),
            # Rounded inputs make ties across ranks likely: the gradient is split among them.
            ("all_reduce max", (4, 3), lambda x: I.all_reduce_ag(x, "max"), lambda xs, r: torch.stack(xs).amax(0)),
            ("all_reduce min", (4, 3), lambda x: I.all_reduce_ag(x, "min"), lambda xs, r: torch.stack(xs).amin(0)),
            ("reduce_scatter avg dim0", (2 * n, 3), lambda x: I.reduce_scatter_ag(x, "avg", 0),
             lambda xs, r: torch.chunk(torch.stack(xs).mean(0), n, 0)[r]),
        ]
    return cases


def _shape(shape, r):
    return shape(r) if callable(shape) else shape


def _input(i, shape, r, name):
    x = rank_input(r, _shape(shape, r), seed=10 + i)
    return torch.round(2 * x) if name.startswith("all_reduce m") else x


def _weight(i, out, r):
    return rank_input(r, out.shape, seed=50 + i)


def _check_grads(impl_name: str, backend: str):
    n, rank = dist.get_world_size(), dist.get_rank()
    cases = _cases(impl_name, n)
    xs = [_input(i, shape, rank, name).requires_grad_() for i, (name, shape, _, _) in enumerate(cases)]

    # Dense reference: total loss over every rank's output, differentiated w.r.t. our input.
    # Weights are made here, outside any compiled region (it cannot create a Generator).
    refs, ws = [], []
    for i, (name, shape, _, dense) in enumerate(cases):
        all_x = [_input(i, shape, r, name).requires_grad_() for r in range(n)]
        outs = [dense(all_x, r) for r in range(n)]
        total = sum((_weight(i, y, r) * y).sum() for r, y in enumerate(outs))
        refs.append(torch.autograd.grad(total, all_x[rank])[0])
        ws.append(_weight(i, outs[rank], rank))

    def losses(xs, ws):
        out = 0.0
        for (name, _, fn, _), x, w in zip(cases, xs, ws):
            out = out + (w * fn(x)).sum()
        return out

    counter = None
    if backend != "eager":
        counter = CompileCounterWithBackend(backend)
        losses = torch.compile(losses, backend=counter, fullgraph=True)
    losses(xs, ws).backward()
    for (name, *_), x, ref in zip(cases, xs, refs):
        torch.testing.assert_close(x.grad, ref, msg=lambda m: f"{impl_name} {backend} grad of {name}: {m}")
    if counter is not None:
        assert counter.frame_count == 1
    return [c[0] for c in cases]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("impl,backend", [("kit", "eager"), ("torch", "eager"), ("kit", "aot_eager")])
def test_gradients_against_dense_reference(impl, backend, size):
    names = world(size).run(_check_grads, impl, backend)[0]
    assert "all_to_all uneven" in names and (impl != "kit" or "all_reduce max" in names)


@pytest.mark.slow
def test_gradients_inductor():
    world(2).run(_check_grads, "kit", "inductor", timeout=600)
