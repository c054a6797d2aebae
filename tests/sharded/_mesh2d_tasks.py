"""Rank tasks for the rule families on a 2-D (2, 2) mesh of 4 gloo ranks: every rule decides
per mesh dim, so the layouts here mix them -- two tensor dims sharded by the two mesh dims, a
shard on one mesh dim and a Replicate or a Partial on the other, a shard each rule keeps next
to one it must gather. Each case compares values and gradients with dense references every
rank computes alike (raising on the first mismatch) and reports the result's placements, the
gradients' placements, the collectives of the forward (by name, with the largest size one
call carried) and the ops that took the generic gathering fallback; the tests check those."""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, distribute
from subclass_kit.sharded._ops.generic import gathered_ops

from sharded._tp_upstream_tasks import Comms
from sharded._meshes import strides as _strides

close = torch.testing.assert_close
R, P = Replicate(), Partial("sum")
S0, S1, S2, S3 = Shard(0), Shard(1), Shard(2), Shard(3)

_MESH: list = []


def mesh():
    """The (2, 2) mesh, built once per rank process (each build creates new subgroups)."""
    if not _MESH:
        from torch.distributed.device_mesh import init_device_mesh

        _MESH.append(init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b")))
    return _MESH[0]


def place(D: torch.Tensor, pls) -> ShardedTensor:
    """``D`` laid out on ``pls``: a ``Partial('sum')`` mesh dim holds an equal addend per rank
    (halves: exact in float64), a ``Partial('max')`` the value itself on every rank."""
    m = mesh()
    x = distribute(D, m, [R if p.is_partial() else p for p in pls])
    k = math.prod(m.shape[i] for i, p in enumerate(pls) if p.is_partial() and p.op == "sum")
    if k == 1 and any(p.is_partial() for p in pls):
        return ShardedTensor.from_local(x.to_local(), m, list(pls), shape=D.shape, stride=_strides(D.shape))
    if k == 1:
        return x
    return ShardedTensor.from_local(x.to_local() / k, m, list(pls), shape=D.shape, stride=_strides(D.shape))


def _pl(t) -> str:
    return repr(tuple(t.placements)) if isinstance(t, ShardedTensor) else "plain"


def _full(t):
    return t.full_tensor() if isinstance(t, ShardedTensor) else t


def _like(w: torch.Tensor, y) -> torch.Tensor:
    """``w`` laid out as ``y`` (Replicate where ``y`` is Partial)."""
    if not isinstance(y, ShardedTensor):
        return w
    return distribute(w, mesh(), [R if p.is_partial() else p for p in y.placements])


def _outs(y) -> tuple:
    return tuple(y) if isinstance(y, (tuple, list)) else (y,)


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _conv2d(x, w, b):
    return F.conv2d(x, w, b, padding=1)


def _image(g):
    # (N, C, H, W): C = 5 and H = 6 are uneven or odd-chunked over a mesh dim of 2 (3 + 2).
    return torch.randn(4, 5, 6, 6, generator=g, dtype=torch.float64)


def _spd(g):
    # A (4, 6) batch of well-conditioned SPD 3x3 matrices.
    a = torch.randn(4, 6, 3, 3, generator=g, dtype=torch.float64)
    return a @ a.mT + 3 * torch.eye(3, dtype=torch.float64)


# (4, 6, 3) positions into dim 2 (size 5) of a cube; (4, 6, 5) positions into dim 1 (size 6)
_GATHER_INDEX = torch.arange(72).reshape(4, 6, 3) % 5
_SCATTER_INDEX = (torch.arange(120).reshape(4, 6, 5) * 7) % 6


def _cube_t(g):
    return torch.randn(4, 5, 3, generator=g, dtype=torch.float64)


def _cube_sq(g):
    return torch.randn(4, 6, 3, generator=g, dtype=torch.float64)


def _vector6(g):
    return torch.randn(6, generator=g, dtype=torch.float64)


def _table(g):
    return torch.randn(10, 6, generator=g, dtype=torch.float64)


def _w5(g):
    return torch.randn(5, generator=g, dtype=torch.float64)


def _logits(g):
    return torch.randn(6, 7, generator=g, dtype=torch.float64)


def _qkv(g):
    return torch.randn(4, 4, 5, 8, generator=g, dtype=torch.float64)


_IDS = torch.tensor([[1, 9, 3], [0, 4, 4]])
_TARGET = torch.tensor([0, 6, 3, 2, 2, 5])
_CW = torch.linspace(0.5, 2.0, 7, dtype=torch.float64)


def _image1(g):
    return torch.randn(1, 5, 6, 6, generator=g, dtype=torch.float64)


def _image4(g):
    return torch.randn(4, 8, 3, 3, generator=g, dtype=torch.float64)


_SAMPLES = torch.linspace(0.05, 0.95, 40, dtype=torch.float64).reshape(4, 5, 2)


def _rhs(g):
    return torch.randn(4, 6, 3, 2, generator=g, dtype=torch.float64)


def _grid(g):
    return torch.rand(4, 3, 4, 2, generator=g, dtype=torch.float64) * 2 - 1


def _tweight(g):
    return torch.randn(5, 4, 3, 3, generator=g, dtype=torch.float64)


def _cube(g):
    return torch.randn(4, 6, 5, generator=g, dtype=torch.float64)


def _weight(g):
    return torch.randn(6, 5, 3, 3, generator=g, dtype=torch.float64)


def _bias(g):
    return torch.randn(6, generator=g, dtype=torch.float64)


def _matrix(g):
    return torch.randn(6, 4, generator=g, dtype=torch.float64)


def _square(g):
    return torch.randn(4, 4, generator=g, dtype=torch.float64)


def _vector(g):
    return torch.randn(4, generator=g, dtype=torch.float64)


def _bilinear_weight(g):
    return torch.randn(5, 4, 4, generator=g, dtype=torch.float64)


_CLASSES = torch.tensor([3, 0, 1, 1, 2, 0])
_BAGS = torch.tensor([[0, 5, 2], [1, 1, 4], [3, 2, 0]])


class Case(NamedTuple):
    family: str
    fn: Callable
    inputs: tuple  # (maker, placements) per operand
    grad: tuple | None = None  # the incoming gradient's placements (default: the result's)


def _fft(t):
    return torch.view_as_real(torch.fft.fft(t, dim=-1))


def _fft2(t):
    return torch.view_as_real(torch.fft.fft2(t))


def _median(t):
    return torch.median(t, dim=1).values


def _median0(t):
    return torch.median(t, dim=0).values


CASES: dict = {
    # independent dims: pooling, interpolation, fft, batched linear algebra
    "avg_pool2d S0,S1": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (S0, S1)),)),
    "avg_pool2d R,S1": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (R, S1)),)),
    "avg_pool2d S1,S3": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (S1, S3)),)),
    "avg_pool2d S1,P": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (S1, P)),)),
    "avg_pool2d P,P": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (P, P)),)),
    "avg_pool2d Pavg,S1": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (Partial("avg"), S1)),)),
    "fft Pavg,S0": Case("independent", _fft, ((_image, (Partial("avg"), S0)),)),
    "conv2d x Pavg,S0": Case("conv", lambda x, w: F.conv2d(x, w), ((_image, (Partial("avg"), S0)), (_weight, (R, R)))),
    "var dim1 S0,Pavg": Case("reduction", lambda t: torch.var(t, dim=1), ((_cube, (S0, Partial("avg"))),)),
    "max_pool2d S0,P": Case("independent", lambda t: F.max_pool2d(t, 3, 2, 1), ((_image, (S0, P)),)),
    "max_pool2d S2,S1": Case("independent", lambda t: F.max_pool2d(t, 3, 2, 1), ((_image, (S2, S1)),)),
    "interpolate S0,S1": Case("independent", lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"),
                              ((_image, (S0, S1)),)),
    "interpolate P,S0": Case("independent", lambda t: F.interpolate(t, size=(7, 5), mode="nearest"),
                             ((_image, (P, S0)),)),
    "fft S0,S1": Case("independent", _fft, ((_image, (S0, S1)),)),
    "fft S3,S0": Case("independent", _fft, ((_image, (S3, S0)),)),
    "fft2 S1,P": Case("independent", _fft2, ((_image, (S1, P)),)),
    "inv S0,S1": Case("independent", torch.linalg.inv, ((_spd, (S0, S1)),)),
    "inv S2,S1": Case("independent", torch.linalg.inv, ((_spd, (S2, S1)),)),
    "inv P,S0": Case("independent", torch.linalg.inv, ((_spd, (P, S0)),)),
    # convolution: batch shard of the input, out-channel shard of the weight
    "conv2d x S0,R w R,S0": Case("conv", _conv2d,
                                 ((_image, (S0, R)), (_weight, (R, S0)), (_bias, (R, R)))),
    "conv2d x R,S0 w S0,R b S0,R": Case("conv", _conv2d,
                                        ((_image, (R, S0)), (_weight, (S0, R)), (_bias, (S0, R)))),
    "conv2d x R,S0 w R,S0": Case("conv", _conv2d,
                                 ((_image, (R, S0)), (_weight, (R, S0)), (_bias, (R, R)))),
    "conv2d x S0,S2": Case("conv", _conv2d,
                           ((_image, (S0, S2)), (_weight, (R, R)), (_bias, (R, R)))),
    "conv2d x S0,S1": Case("conv", _conv2d,
                           ((_image, (S0, S1)), (_weight, (R, R)), (_bias, (R, R)))),
    "conv2d x S0,P": Case("conv", _conv2d,
                          ((_image, (S0, P)), (_weight, (R, R)), (_bias, (R, R)))),
    # var / std over sharded dims: result-sized statistics, one all-gather per mesh dim
    "var dim1 S0,S1": Case("reduction", lambda t: torch.var(t, dim=1), ((_cube, (S0, S1)),)),
    "std dims01 S0,S1": Case("reduction", lambda t: torch.std(t, dim=(0, 1)), ((_cube, (S0, S1)),)),
    "var_mean dim0 S1,S0": Case("reduction", lambda t: torch.var_mean(t, dim=0, correction=0),
                                ((_cube, (S1, S0)),)),
    "std keepdim S2,S0": Case("reduction", lambda t: torch.std(t, dim=2, keepdim=True), ((_cube, (S2, S0)),)),
    "var dim2 S0,S1": Case("reduction", lambda t: torch.var(t, dim=2), ((_cube, (S0, S1)),)),
    "std dim1 S0,P": Case("reduction", lambda t: torch.std(t, dim=1), ((_cube, (S0, P)),)),
    # along dims: kthvalue, median, mode
    "median dim1 S0,S1": Case("along", _median, ((_cube, (S0, S1)),)),
    "median dim0 S1,S0": Case("along", _median0, ((_cube, (S1, S0)),)),
    "kthvalue dim2 S0,S1": Case("along", lambda t: torch.kthvalue(t, 2, dim=2).values, ((_cube, (S0, S1)),)),
    "mode dim2 S1,P": Case("along", lambda t: torch.mode(t.round(), dim=2).values, ((_cube, (S1, P)),)),
    "max dim1 S0,S2": Case("along", lambda t: torch.max(t, dim=1).values, ((_cube, (S0, S2)),)),
    "gather dim2 S1,S0": Case("along", lambda t: torch.gather(t, 2, _GATHER_INDEX), ((_cube, (S1, S0)),)),
    "scatter_add dim1 S0,S2": Case("along", lambda t, s: t.scatter_add(1, _SCATTER_INDEX, s),
                                   ((_cube, (S0, S2)), (_cube, (R, S2)))),
    # decompositions: each step by its rule
    "mv S0,S1 x R,S0": Case("decompose", torch.mv, ((_matrix, (S0, S1)), (_vector, (R, S0)))),
    "smooth_l1 S0,S1": Case("decompose", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5),
                            ((_cube, (S0, S1)), (_cube, (S0, S1)))),
    "hardswish S1,S0": Case("decompose", F.hardswish, ((_cube, (S1, S0)),)),
    # shared dims: a batch, point sets' rows, features, a table's columns
    "bilinear a,b S0,R w R,S0": Case("shared_dims", F.bilinear,
                                     ((_matrix, (S0, R)), (_matrix, (S0, R)), (_bilinear_weight, (R, S0)))),
    "cdist x1 S0,R x2 R,S0": Case("shared_dims", torch.cdist, ((_matrix, (S0, R)), (_square, (R, S0)))),
    "multi_margin_loss S0,P": Case("shared_dims", lambda x: F.multi_margin_loss(x, _CLASSES), ((_matrix, (S0, P)),)),
    "embedding_bag w R,S1": Case("shared_dims", lambda w: F.embedding_bag(_BAGS, w, mode="max"), ((_matrix, (R, S1)),)),
    "embedding_bag w S0,R sum": Case("shared_dims", lambda w: F.embedding_bag(_BAGS, w), ((_matrix, (S0, R)),)),
    # probes
    "avg_pool2d P,S3": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (P, S3)),)),
    "avg_pool2d Pmax,S1": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (Partial("max"), S1)),)),
    "avg_pool2d N=1 S0,S1": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image1, (S0, S1)),)),
    "fractional_max_pool2d S0,S1": Case("independent", lambda t: F.fractional_max_pool2d(
        t, 2, output_size=(3, 3), _random_samples=_SAMPLES), ((_image, (S0, S1)),)),
    "fft n=8 norm S1,S0": Case("independent", lambda t: torch.view_as_real(torch.fft.fft(t, n=8, dim=2, norm="ortho")),
                               ((_image, (S1, S0)),)),
    "irfft P,S1": Case("independent", lambda t: torch.fft.irfft(t.to(torch.complex128), dim=-1), ((_image, (P, S1)),)),
    "solve A S0,S1 B S1,S0": Case("independent", torch.linalg.solve, ((_spd, (S0, S1)), (_rhs, (S1, S0)))),
    "lu_factor S1,S0": Case("independent", lambda t: torch.linalg.lu_factor(t).LU, ((_spd, (S1, S0)),)),
    "pixel_shuffle S0,S1": Case("independent", lambda t: F.pixel_shuffle(t, 2), ((_image4, (S0, S1)),)),
    "grid_sample x S0,R grid R,S0": Case("independent", lambda x, g: F.grid_sample(x, g, align_corners=False),
                                        ((_image, (S0, R)), (_grid, (R, S0)))),
    "conv2d x S0,R w S0,R": Case("conv", _conv2d,
                                 ((_image, (S0, R)), (_weight, (S0, R)), (_bias, (R, R)))),
    "conv_transpose2d x S0,R w R,S1": Case("conv", lambda x, w: F.conv_transpose2d(x, w, stride=2),
                                           ((_image, (S0, R)), (_tweight, (R, S1)))),
    "conv2d x P,S0": Case("conv", lambda x, w: F.conv2d(x, w), ((_image, (P, S0)), (_weight, (R, R)))),
    "var dims02 S2,S0": Case("reduction", lambda t: torch.var(t, dim=(0, 2)), ((_cube, (S2, S0)),)),
    "mv S0,S1 x S0,R": Case("decompose", torch.mv, ((_matrix, (S0, S1)), (_vector, (S0, R)))),
    "instance_norm S0,S1": Case("decompose", lambda t: F.instance_norm(t), ((_image, (S0, S1)),)),
    # an incoming gradient laid out otherwise than the result
    "conv2d x S0,R grad R,S0": Case("conv", lambda x, w: F.conv2d(x, w, padding=1),
                                    ((_image, (S0, R)), (_weight, (R, R))), grad=(R, S0)),
    "conv2d x S0,R w R,S0 grad S1,S0": Case("conv", lambda x, w: F.conv2d(x, w, padding=1),
                                            ((_image, (S0, R)), (_weight, (R, S0))), grad=(S1, S0)),
    "avg_pool2d S0,R grad R,S0": Case("independent", lambda t: F.avg_pool2d(t, 2), ((_image, (S0, R)),),
                                      grad=(R, S0)),
    "interpolate S1,R grad R,S1": Case("independent", lambda t: F.interpolate(t, scale_factor=2),
                                       ((_image, (S1, R)),), grad=(R, S1)),
    "max_pool2d S0,S1 grad S1,S0": Case("independent", lambda t: F.max_pool2d(t, 2), ((_image, (S0, S1)),),
                                        grad=(S1, S0)),
    "inv S0,R grad R,S0": Case("independent", torch.linalg.inv, ((_spd, (S0, R)),), grad=(R, S0)),
    "median dim1 S0,R grad R,S0": Case("along", _median, ((_cube, (S0, R)),), grad=(R, S0)),
    "var dim1 S1,S0 grad S0,R": Case("reduction", lambda t: torch.var(t, dim=1), ((_cube, (S1, S0)),), grad=(S0, R)),
    "mm a S1,R b R,S0": Case("decompose", torch.mm, ((_matrix, (S1, R)), (_square, (R, S0)))),
    "mv S1,R x R,S0": Case("decompose", torch.mv, ((_matrix, (S1, R)), (_vector, (R, S0)))),
    "bmm a S2,R b R,S1": Case("decompose", torch.bmm, ((_cube, (S2, R)), (_cube_t, (R, S1)))),
    "baddbmm S0,S1": Case("decompose", lambda c, a, b: torch.baddbmm(c, a, b),
                          ((_cube_sq, (S0, S1)), (_cube, (S0, S1)), (_cube_t, (S0, R)))),
    "bce S0,S1 vs S1,S0": Case("decompose", lambda a, b: F.binary_cross_entropy(torch.sigmoid(a), torch.sigmoid(b)),
                               ((_cube, (S0, S1)), (_cube, (S1, S0)))),
    "addmv S0,R": Case("decompose", lambda v, m, x: torch.addmv(v, m, x),
                       ((_vector6, (R, S0)), (_matrix, (S0, R)), (_vector, (R, S0)))),
    "embedding S0,S1 table": Case("others", lambda w: F.embedding(_IDS, w), ((_table, (S0, S1)),)),
    "embedding R,S1 table": Case("others", lambda w: F.embedding(_IDS, w), ((_table, (R, S1)),)),
    "layer_norm S0,S1": Case("others", lambda x, w: F.layer_norm(x, (5,), w), ((_cube, (S0, S1)), (_w5, (R, R)))),
    "cross_entropy S0,S1": Case("others", lambda x: F.cross_entropy(x, _TARGET), ((_logits, (S0, S1)),)),
    "cross_entropy S0,R w": Case("others", lambda x: F.cross_entropy(x, _TARGET, weight=_CW), ((_logits, (R, S0)),)),
    "softmax S0,S1": Case("others", lambda x: torch.softmax(x, -1), ((_cube, (S0, S1)),)),
    "group_norm S0,S1": Case("others", lambda x: F.group_norm(x, 5), ((_image, (S0, S1)),)),
    "sdpa heads,batch": Case("others", lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                             ((_qkv, (S1, S0)), (_qkv, (S1, S0)), (_qkv, (S0, S1)))),
    # a pointwise op whose operands shard one tensor dim on different mesh dims
    "add S0,R + R,S0": Case("pointwise", torch.add, ((_cube, (S0, R)), (_cube, (R, S0)))),
}


def run_case(name: str, seed: int = 50) -> dict:
    """One case: values and gradients against dense, the forward's collectives."""
    case = CASES[name]
    g = _g(seed)
    dense = [make(g) for make, _ in case.inputs]
    ds = [d.clone().requires_grad_(True) for d in dense]
    refs = _outs(case.fn(*ds))
    ws = [torch.randn(r.shape, generator=g, dtype=r.dtype) for r in refs]
    sum((r * w).sum() for r, w in zip(refs, ws)).backward()
    xs = [place(d, pl).requires_grad_(True) for d, (_, pl) in zip(dense, case.inputs)]
    gathered_ops().clear()
    with Comms() as comms:
        ys = _outs(case.fn(*xs))
    for i, (y, r) in enumerate(zip(ys, refs)):
        close(_full(y), r.detach(), msg=f"{name}: result {i}")
    # The incoming gradients laid out as the results (a pending sum settled), so that the
    # backward rules see 2-D layouts too.
    gys = [_like(w, y) if case.grad is None else place(w, case.grad) for w, y in zip(ws, ys)]
    with Comms() as bcomms:
        torch.autograd.backward(ys, gys)
    for i, (x, d) in enumerate(zip(xs, ds)):
        close(_full(x.grad), d.grad, msg=f"{name}: gradient of operand {i}")
    return {
        "out": [_pl(y) for y in ys],
        "grads": [_pl(x.grad) for x in xs],
        "comms": dict(comms.counts),
        "backward comms": dict(bcomms.counts),
        "largest": dict(comms.largest),
        "result numel": ys[0].to_local().numel() if isinstance(ys[0], ShardedTensor) else ys[0].numel(),
        "gathered": sorted(map(str, gathered_ops())),
    }


def eager(names=None) -> dict:
    return {name: run_case(name) for name in names or CASES}


# ---- batch norm: the running statistics too ------------------------------------------------
BN_LAYOUTS = {"S0,S2": (S0, S2), "S1,S0": (S1, S0), "S2,S3": (S2, S3), "R,S0": (R, S0), "S0,P": (S0, P)}


def _bn_data(seed: int):
    g = _g(seed)
    C = 5
    return (torch.randn(4, C, 6, 4, generator=g), torch.randn(C, generator=g), torch.randn(C, generator=g),
            torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5, torch.randn(4, C, 6, 4, generator=g))


def _same_on_every_rank(t: torch.Tensor) -> bool:
    got = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(got, t.contiguous())
    return all(torch.equal(x, got[0]) for x in got[1:])


def batch_norm(layouts=tuple(BN_LAYOUTS)) -> dict:
    """F.batch_norm in training on each 2-D layout (parameters and running statistics
    Replicate): output, input/weight/bias gradients and the updated running statistics
    against dense; the forward's collectives."""
    m = mesh()
    out: dict = {}
    for lname in layouts:
        pl = BN_LAYOUTS[lname]
        D, Wt, B, RM, RV, G = _bn_data(60)
        d, dw, db = (a.clone().requires_grad_(True) for a in (D, Wt, B))
        drm, drv = RM.clone(), RV.clone()
        ref = F.batch_norm(d, drm, drv, dw, db, training=True, momentum=0.3)
        (ref * G).sum().backward()
        x = place(D, pl).requires_grad_(True)
        gy = _like(G, x)
        w, b = (distribute(a, m, [R, R]).requires_grad_(True) for a in (Wt, B))
        rm, rv = (distribute(a, m, [R, R]) for a in (RM, RV))
        gathered_ops().clear()
        with Comms() as comms:
            y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.3)
        close(y.full_tensor(), ref.detach(), msg=f"batch_norm {lname}")
        y.backward(gy)
        for got, want, what in ((x, d, "input"), (w, dw, "weight"), (b, db, "bias")):
            close(_full(got.grad), want.grad, msg=f"batch_norm {lname}: {what} grad")
        for got, want, what in ((rm, drm, "running_mean"), (rv, drv, "running_var")):
            assert got.placements == (R, R), (lname, what, got.placements)
            close(got.to_local(), want, msg=f"batch_norm {lname}: {what}")
            assert _same_on_every_rank(got.to_local()), (lname, what)
        out[lname] = {"out": _pl(y), "comms": dict(comms.counts), "largest": dict(comms.largest),
                      "gathered": sorted(map(str, gathered_ops())),
                      "grads": [_pl(t.grad) for t in (x, w, b)]}
    return out


# ---- random ops: the dense draw, shard by shard ------------------------------------------------
RANDOM = {
    "dropout S0,S1": (lambda t: F.dropout(t, 0.4, training=True), (S0, S1)),
    "dropout S0,P": (lambda t: F.dropout(t, 0.4, training=True), (S0, P)),
    "dropout S1,R": (lambda t: F.dropout(t, 0.4, training=True), (S1, R)),
    "rand_like S1,S0": (torch.rand_like, (S1, S0)),
    "rand_like R,R": (torch.rand_like, (R, R)),
    "randn_like S0,P": (torch.randn_like, (S0, P)),
    "normal_ S1,S0": (lambda t: t.detach().clone().normal_(), (S1, S0)),
    "bernoulli_ R,S1": (lambda t: t.detach().clone().bernoulli_(0.3), (R, S1)),
}


def random_ops(names=None) -> dict:
    """Each random op under one seed on every rank: the ShardedTensor's values are the dense
    op's (so each shard holds the dense draw's part, and a Replicate result is equal on every
    rank), with no collective; dropout's gradient is the dense one."""
    out: dict = {}
    for name in names or RANDOM:
        fn, pl = RANDOM[name]
        D = torch.randn(6, 5, generator=_g(70), dtype=torch.float64)
        d = D.clone().requires_grad_(True)
        torch.manual_seed(71)
        ref = fn(d)
        x = place(D, pl).requires_grad_(True)
        torch.manual_seed(71)
        with Comms() as comms:
            y = fn(x)
        local = y.to_local()
        close(y.full_tensor(), ref.detach(), msg=name)
        if ref.requires_grad:
            ref.sum().backward()
            y.sum().backward()
            close(x.grad.full_tensor(), d.grad, msg=f"{name}: gradient")
        whole = all(p.is_replicate() for p in y.placements)
        out[name] = {"out": _pl(y), "comms": comms.total(),
                     "same on every rank": _same_on_every_rank(local) if whole else None}
    return out


# ---- one aot_eager compile per family ----------------------------------------------------------
def _independent_chain(x):
    y = F.avg_pool2d(x, 2)
    y = F.interpolate(y, scale_factor=2, mode="bilinear")
    return torch.fft.rfft(y, dim=-1).abs()


def _linalg_chain(x):
    return torch.linalg.inv(x).sum(-1) * torch.linalg.det(x).unsqueeze(-1)


def _conv_chain(x, w, b):
    return F.relu(F.conv2d(x, w, b, padding=1))


def _bn_chain(x, w, b):
    return F.batch_norm(x, None, None, w, b, training=True)


def _var_chain(x):
    return torch.std(x, dim=1) + torch.var(x, dim=(0, 1), keepdim=True).squeeze(1)


def _median_chain(x):
    return torch.median(x, dim=1).values + torch.kthvalue(x, 3, dim=2).values.sum(-1, keepdim=True)


def _decompose_chain(a, b, v):
    return F.smooth_l1_loss(F.hardswish(a), b) + torch.mv(a.sum(-1), v).sum()


def _dropout_chain(x):
    return F.dropout(x * 2, 0.3, training=True)


COMPILED = {
    "independent": (_independent_chain, ((_image, (S0, S1)),)),
    "linalg": (_linalg_chain, ((_spd, (S1, S0)),)),
    "conv": (_conv_chain, ((_image, (S0, R)), (_weight, (R, S0)), (_bias, (R, R)))),
    "batch_norm": (_bn_chain, ((lambda g: torch.randn(4, 5, 6, 4, generator=g, dtype=torch.float64), (S0, S2)),
                               (lambda g: torch.randn(5, generator=g, dtype=torch.float64), (R, R)),
                               (lambda g: torch.randn(5, generator=g, dtype=torch.float64), (R, R)))),
    "var": (_var_chain, ((_cube, (S0, S1)),)),
    "median": (_median_chain, ((_cube, (S0, S1)),)),
    "decompose": (_decompose_chain, ((_cube, (S0, S1)), (_cube, (S0, S1)),
                                     (lambda g: torch.randn(6, generator=g, dtype=torch.float64), (R, S0)))),
    "random": (_dropout_chain, ((lambda g: torch.randn(6, 5, generator=g, dtype=torch.float64), (S0, S1)),)),
    "shared_dims": (lambda a, b, w: torch.cdist(F.bilinear(a, b, w), F.bilinear(b, a, w).tanh()),
                    ((_matrix, (S0, R)), (_matrix, (S0, R)), (_bilinear_weight, (R, S0)))),
}


def compiled(backend: str = "aot_eager", names=None) -> dict:
    """Each family's chain compiled (fullgraph) on its 2-D layout, called with two sets of
    values: values and gradients equal dense (the random chain under one seed) both times,
    one frame."""
    out: dict = {}
    for name in names or COMPILED:
        fn, inputs = COMPILED[name]
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        cf = torch.compile(fn, backend=cnt, fullgraph=True)
        gathered_ops().clear()
        for step in range(2):
            g = _g(80 + step)
            dense = [make(g) for make, _ in inputs]
            ds = [d.clone().requires_grad_(True) for d in dense]
            torch.manual_seed(81 + step)
            ref = fn(*ds)
            w = torch.randn(ref.shape, generator=g, dtype=ref.dtype)
            (ref * w).sum().backward()
            xs = [place(d, pl).requires_grad_(True) for d, (_, pl) in zip(dense, inputs)]
            torch.manual_seed(81 + step)
            y = cf(*xs)
            close(_full(y), ref.detach(), msg=f"compiled {name}, call {step}")
            y.backward(_like(w, y))
            for i, (x, d) in enumerate(zip(xs, ds)):
                close(_full(x.grad), d.grad, msg=f"compiled {name}, call {step}: gradient of operand {i}")
        out[name] = {"frames": cnt.frame_count, "out": _pl(y), "gathered": sorted(map(str, gathered_ops()))}
    return out


# ---- a factorization failing in one rank's shard ---------------------------------------------
def _failing_batch():
    # A (2, 2) batch of SPD 3x3 matrices whose element [1, 1] -- rank 3's alone under
    # (Shard(0), Shard(1)) -- is singular and not positive-definite.
    a = torch.randn(2, 2, 3, 3, generator=_g(90), dtype=torch.float64)
    a = a @ a.mT + 3 * torch.eye(3, dtype=torch.float64)
    a[1, 1] = -torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [3.0, 6.0, 9.0]], dtype=torch.float64)
    return a


FAILING = {
    "linalg.cholesky": torch.linalg.cholesky,
    "linalg.inv": torch.linalg.inv,
    "linalg.solve": lambda t: torch.linalg.solve(t, torch.ones(2, 2, 3, dtype=t.dtype)),
    "linalg.lu_factor": lambda t: torch.linalg.lu_factor(t).LU,
}


def errors_on_every_rank() -> dict:
    """The failing matrix on one rank of four: every rank raises the dense op's error, and the
    ranks stay in step (a collective after each error completes)."""
    D = _failing_batch()
    out: dict = {}
    for name, fn in FAILING.items():
        for pl in ((S0, S1), (S1, S0)):
            try:
                fn(D)
                dense = None
            except Exception as e:  # noqa: BLE001  (the dense op's error is the reference)
                dense = (type(e).__name__, str(e))
            try:
                fn(place(D, pl))
                got = None
            except Exception as e:  # noqa: BLE001
                got = (type(e).__name__, str(e))
            assert got == dense, (name, pl, got, dense)
            close(place(D, pl).full_tensor(), D)  # in step: every rank reaches this collective
            out[f"{name} {_pl(place(D, pl))}"] = "raised" if got is not None else "passed"
    return out


# ---- redistribution between every pair of 2-D layouts ---------------------------------------
def _layouts_2d() -> list:
    one = (R, S0, S2, P)  # dim 0 (5) and dim 2 (3): uneven over 2, a first and a last dim
    return [(a, b) for a in one for b in one if not (a.is_shard() and a == b)]


def redistribute_all() -> dict:
    """Every 2-D layout of a (5, 6, 3) tensor (uneven over both mesh dims; 14 layouts) redistributed to
    every other: the placements asked for, the dense value, and a gradient back through it
    equal to the incoming one. Returns the pairs done and any that failed (none expected)."""
    m = mesh()
    D = torch.randn(5, 6, 3, generator=_g(95), dtype=torch.float64)
    G = torch.randn(5, 6, 3, generator=_g(96), dtype=torch.float64)
    bad = []
    n = 0
    for src in _layouts_2d():
        for dst in _layouts_2d():
            x = place(D, src).requires_grad_(True)
            y = x.redistribute(m, list(dst))
            n += 1
            if tuple(y.placements) != dst or not torch.allclose(y.full_tensor(), D):
                bad.append(f"{src} -> {dst}")
                continue
            y.backward(_like(G, y))
            if not torch.allclose(x.grad.full_tensor(), G):
                bad.append(f"grad of {src} -> {dst}")
    return {"pairs": n, "bad": bad}
