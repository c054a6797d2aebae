"""Rank tasks for the ``conv`` rule family: nn.Conv2d forward and backward with the input
sharded on the batch, a channel and a spatial dim, a weight sharded on its out-channels,
grouped / transposed / 1d / 3d / unbatched convolutions with uneven shards, against dense,
eagerly and compiled. Each task compares with dense references every rank computes alike
and raises on the first mismatch."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch.func import functional_call

from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, distribute
from subclass_kit.sharded._ops.generic import gathered_ops

from sharded._tp_upstream_tasks import Comms

close = torch.testing.assert_close


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _conv2d():
    torch.manual_seed(0)
    return torch.nn.Conv2d(3, 5, 3, padding=1, dtype=torch.float64)


def _dense_step(conv, x, w_out):
    d = x.clone().requires_grad_(True)
    out = conv(d)
    (out * w_out).sum().backward()
    return out.detach(), d.grad, conv.weight.grad.clone(), conv.bias.grad.clone()


def _sharded_step(fn, conv, x, w_out, mesh, pl, w_pl, comms):
    xs = distribute(x, mesh, [pl]).requires_grad_(True)
    params = {
        "weight": distribute(conv.weight.detach(), mesh, [w_pl]).requires_grad_(True),
        "bias": distribute(conv.bias.detach(), mesh, [Shard(0) if w_pl.is_shard() else Replicate()]).requires_grad_(True),
    }
    sw_out = distribute(w_out, mesh, [Replicate()])
    with comms:  # the convolution's own collectives, not distribute's
        out = fn(params, xs)
        (out * sw_out).sum().backward()
    return out, xs.grad, params["weight"].grad, params["bias"].grad


def module(backend: str | None) -> dict:
    """nn.Conv2d (padding 1) on an uneven (3, 3, 7, 6) input sharded on dim 0, 1 and 2, and
    with the weight sharded on its out-channels: output and every gradient equal dense;
    placements of the output and gradients reported; compiled with ``backend`` (fullgraph)
    once per layout, against dense too."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(20)
    x = torch.randn(3, 3, 7, 6, generator=g, dtype=torch.float64)
    w_out = torch.randn(3, 5, 7, 6, generator=g, dtype=torch.float64)
    conv = _conv2d()
    want = _dense_step(conv, x, w_out)
    res: dict = {}
    layouts = {"S0": (Shard(0), Replicate()), "S1": (Shard(1), Replicate()), "S2": (Shard(2), Replicate()),
               "weight S0": (Replicate(), Shard(0))}
    for name, (pl, w_pl) in layouts.items():
        fns = {"eager": lambda p, t: functional_call(conv, p, (t,))}
        cnt = None
        if backend is not None:
            cnt = CompileCounterWithBackend(backend)
            fns["compiled"] = torch.compile(lambda p, t: functional_call(conv, p, (t,)), backend=cnt, fullgraph=True)
        for how, fn in fns.items():
            gathered_ops().clear()
            comms = Comms() if how == "eager" else contextlib.nullcontext()  # a mode breaks compile
            out, gx, gw, gb = _sharded_step(fn, conv, x, w_out, mesh, pl, w_pl, comms)
            for got, exp, what in zip((out, gx, gw, gb), want, ("out", "grad input", "grad weight", "grad bias")):
                close(got.full_tensor(), exp, msg=f"{what} of {name} {how}")
            res[f"{name} {how}"] = {
                "out": repr(out.placements), "grads": [repr(t.placements) for t in (gx, gw, gb)],
                "gathered": sorted(map(str, gathered_ops())),
                **({"comms": comms.total()} if how == "eager" else {}),  # type: ignore[attr-defined]
            }
        if cnt is not None:
            res[f"{name} frames"] = cnt.frame_count
    return res


def _check(op, x, w, b, kw, mesh, x_pl, w_pl, b_pl, mask_bias=False):
    """``op`` forward and backward on the placements against dense."""
    g = torch.Generator().manual_seed(3)
    dx, dw = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    db = None if b is None else b.clone().requires_grad_(not mask_bias)
    out = op(dx, dw, db, **kw)
    w_out = torch.randn(out.shape, generator=g, dtype=out.dtype)
    (out * w_out).sum().backward()
    if x_pl.is_partial():  # pending sum of rank-weighted pieces of x
        k, rank = dist.get_world_size(), dist.get_rank()
        piece = x * (rank + 1) / (k * (k + 1) / 2)
        sx = ShardedTensor.from_local(piece, mesh, [x_pl]).detach().requires_grad_(True)
    else:
        sx = distribute(x, mesh, [x_pl]).requires_grad_(True)
    sw = distribute(w, mesh, [w_pl]).requires_grad_(True)
    sb = None if b is None else distribute(b, mesh, [b_pl]).requires_grad_(not mask_bias)
    got = op(sx, sw, sb, **kw)
    close(got.full_tensor(), out)
    (got * distribute(w_out, mesh, [Replicate()])).sum().backward()
    close(sx.grad.full_tensor(), dx.grad)
    close(sw.grad.full_tensor(), dw.grad)
    if b is not None:
        assert (sb.grad is None) == mask_bias
        if not mask_bias:
            close(sb.grad.full_tensor(), db.grad)
    return repr(got.placements)


def variants() -> dict:
    """Grouped, transposed, 1d, 3d, unbatched convolutions, a Partial input, a bias without
    gradient (output_mask), each on uneven shards of every dim of the input and on an
    out-channel shard of the weight: equal to dense, no generic fallback."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(21)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64)

    cases = {
        # name: (op, x, w, b, kwargs, weight's out-channel dim)
        "conv1d": (F.conv1d, r(3, 4, 9), r(5, 4, 3), r(5), {"stride": 2, "padding": 1}, 0),
        "conv2d groups": (F.conv2d, r(3, 4, 6, 5), r(6, 2, 3, 2), r(6), {"groups": 2, "dilation": (1, 2)}, None),
        "conv3d": (F.conv3d, r(3, 2, 5, 4, 3), r(3, 2, 2, 2, 2), r(3), {"padding": 1}, 0),
        "conv2d unbatched": (F.conv2d, r(3, 5, 5), r(5, 3, 3, 3), r(5), {}, 0),
        "conv_transpose1d": (F.conv_transpose1d, r(3, 4, 5), r(4, 3, 3), r(3), {"stride": 2, "output_padding": 1}, 1),
        "conv_transpose2d groups": (F.conv_transpose2d, r(3, 4, 5, 4), r(4, 3, 2, 3), r(6), {"groups": 2}, None),
        "conv_transpose3d": (F.conv_transpose3d, r(3, 2, 3, 4, 3), r(2, 3, 2, 2, 2), r(3), {"stride": (1, 2, 1)}, 1),
    }
    res: dict = {}
    gathered_ops().clear()
    for name, (op, x, w, b, kw, wdim) in cases.items():
        for d in range(x.dim()):
            res[f"{name} x Shard({d})"] = _check(op, x, w, b, kw, mesh, Shard(d), Replicate(), Replicate())
        res[f"{name} x Partial"] = _check(op, x, w, b, kw, mesh, Partial("sum"), Replicate(), Replicate())
        if wdim is not None:
            res[f"{name} w Shard({wdim})"] = _check(op, x, w, b, kw, mesh, Replicate(), Shard(wdim), Replicate())
            res[f"{name} w Shard({wdim}) bias Shard(0)"] = _check(op, x, w, b, kw, mesh, Replicate(), Shard(wdim), Shard(0))
        res[f"{name} no bias grad"] = _check(op, x, w, b, kw, mesh, Shard(0), Replicate(), Replicate(), mask_bias=True)
        res[f"{name} no bias"] = _check(op, x, w, None, kw, mesh, Shard(0), Replicate(), Replicate())
    res["partial grad_output"] = _partial_backward(mesh, r(3, 4, 6, 5), r(5, 4, 3, 2))
    res["gathered"] = sorted(map(str, gathered_ops()))
    return res


def _partial_backward(mesh, x, w) -> str:
    """convolution_backward is linear in its incoming gradient: a pending sum passes through
    to every result, unreduced, and reduces to the dense gradients."""
    aten = torch.ops.aten
    args = ([1, 1], [1, 0], [1, 1], False, [0, 0], 1, [True, True, True])
    go = torch.linspace(-1, 1, 3 * 5 * 6 * 4, dtype=torch.float64).reshape(3, 5, 6, 4)
    want = aten.convolution_backward.default(go, x, w, [5], *args)
    k, rank = dist.get_world_size(), dist.get_rank()
    sgo = ShardedTensor.from_local(go * (rank + 1) / (k * (k + 1) / 2), mesh, [Partial("sum")])
    got = aten.convolution_backward.default(
        sgo, distribute(x, mesh, [Replicate()]), distribute(w, mesh, [Replicate()]), [5], *args)
    for gt, wt in zip(got, want):
        close(gt.full_tensor(), wt)
    return str({repr(t.placements) for t in got})
