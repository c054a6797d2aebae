"""Rank tasks for the ``independent`` rule family (ops that never mix some dims): pooling,
interpolation, padding, fft and batched linear algebra with a shard on an independent dim
that is *not* the first (channels, an untransformed dim, a second batch dim; uneven over 2
ranks) and on a dim the op works along (gathered first), forward and backward against dense,
eagerly and compiled; and factorization errors raised on every rank together. Each task
compares with dense references every rank computes alike and raises on the first mismatch."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import Partial, Shard, ShardedTensor, distribute
from subclass_kit.sharded._ops.generic import gathered_ops

from sharded._tp_upstream_tasks import Comms
from sharded._meshes import strides as _strides

close = torch.testing.assert_close


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _image(g):
    # (N, C, H, W) with C = 5: uneven over 2 ranks.
    return torch.randn(2, 5, 6, 6, generator=g, dtype=torch.float64)


def _spd(g):
    # A (2, 3) batch of well-conditioned symmetric positive-definite 4x4 matrices: the second
    # batch dim (3) is uneven over 2 ranks.
    a = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64)
    return a @ a.mT + 4 * torch.eye(4, dtype=torch.float64)


_TAU = torch.linspace(0.5, 1.5, 18, dtype=torch.float64).reshape(2, 3, 3)
_SAMPLES = torch.linspace(0.05, 0.95, 20, dtype=torch.float64).reshape(2, 5, 2)
_RHS = torch.linspace(-1, 1, 2 * 3 * 4 * 2, dtype=torch.float64).reshape(2, 3, 4, 2)
_SHARED = torch.eye(4, dtype=torch.float64) * 3 + torch.ones(4, 4, dtype=torch.float64)

# name -> (dense input, op, the dim it never mixes (kept), a dim it works along (gathered))
CASES = {
    "avg_pool2d": (_image, lambda t: F.avg_pool2d(t, 2), 1, 3),
    "max_pool2d": (_image, lambda t: F.max_pool2d(t, 3, stride=2, padding=1), 1, 2),
    "adaptive_avg_pool2d": (_image, lambda t: F.adaptive_avg_pool2d(t, (4, 3)), 1, 3),
    "adaptive_max_pool2d": (_image, lambda t: F.adaptive_max_pool2d(t, (3, 4)), 1, 2),
    "interpolate bilinear": (_image, lambda t: F.interpolate(t, scale_factor=2, mode="bilinear"), 1, 3),
    "interpolate nearest": (_image, lambda t: F.interpolate(t, size=(7, 5), mode="nearest"), 1, 2),
    "interpolate bicubic": (_image, lambda t: F.interpolate(t, size=(4, 9), mode="bicubic", align_corners=True), 1, 3),
    "reflect pad": (_image, lambda t: F.pad(t, (1, 2, 2, 1), mode="reflect"), 1, 3),
    "replicate pad": (_image, lambda t: F.pad(t, (3, 1, 0, 2), mode="replicate"), 1, 3),
    "fractional_max_pool2d": (_image, lambda t: F.fractional_max_pool2d(t, 2, output_size=(3, 3), _random_samples=_SAMPLES), 1, 3),
    "rfft last dim": (_image, lambda t: torch.view_as_real(torch.fft.rfft(t, dim=-1)), 1, 3),
    "fft2": (_image, lambda t: torch.fft.fft2(t.to(torch.complex128)).real, 1, 2),
    "rfftn dims 0 and 3": (_image, lambda t: torch.fft.rfftn(t, dim=(0, 3)).imag, 1, 0),
    "cholesky": (_spd, lambda t: torch.linalg.cholesky(t), 1, 2),
    "det": (_spd, lambda t: torch.linalg.det(t), 1, 3),
    "inv": (_spd, lambda t: torch.linalg.inv(t), 1, 2),
    "solve": (_spd, lambda t: torch.linalg.solve(t, _RHS), 1, 3),
    "eigvalsh": (_spd, lambda t: torch.linalg.eigvalsh(t), 1, 2),
    "svdvals": (_spd, lambda t: torch.linalg.svdvals(t), 1, 3),
    "lu_factor": (_spd, lambda t: torch.linalg.lu_factor(t)[0], 1, 2),
    "householder_product": (_spd, lambda t: torch.linalg.householder_product(t, _TAU), 1, 2),
    "shared matrix solve": (_spd, lambda t: torch.linalg.solve(_SHARED, t), 1, 2),
}


# Ops linear in their input: a Partial('sum') passes through.
LINEAR = {"avg_pool2d", "adaptive_avg_pool2d", "interpolate bilinear", "interpolate nearest", "interpolate bicubic",
          "reflect pad", "replicate pad", "rfft last dim", "rfftn dims 0 and 3",
          "fft2"}  # (its cast to complex and its .real are linear too)

# Ops that check their factorization: one all-gather of the per-matrix ``info`` ints, so
# that a failure raises on every rank (see errors_on_every_rank).
CHECKED = {"cholesky", "inv", "solve", "lu_factor"}  # (a shared matrix is whole: so is its info)


def eager(names=None) -> dict:
    """Each case on a shard of its independent dim (kept: the result keeps the shard, no
    collective and no fallback in the forward), of a dim it works along (gathered first) and
    a Partial (reduced first): values and gradients equal dense."""
    mesh = _mesh()
    out: dict = {}
    for name in names or CASES:
        make, fn, kept, along = CASES[name]
        g = torch.Generator().manual_seed(20)
        D = make(g)
        d = D.clone().requires_grad_(True)
        ref = fn(d)
        w = torch.randn(ref.shape, generator=g, dtype=ref.dtype)
        (ref * w).sum().backward()
        for pl in (Shard(kept), Shard(along), Partial("sum")):
            if pl.is_partial():  # an addend per rank (halves: exact in float64)
                x = ShardedTensor.from_local(D / dist.get_world_size(), mesh, [pl], shape=D.shape, stride=_strides(D.shape))
            else:
                x = distribute(D, mesh, [pl])
            x.requires_grad_(True)
            gathered_ops().clear()
            with Comms() as comms:
                y = fn(x)
            placements = repr(tuple(y.placements))
            close(y.full_tensor(), ref.detach(), msg=f"{name} of {pl}")
            (y * w).sum().backward()
            close(x.grad.full_tensor(), d.grad, msg=f"grad of {name} of {pl}")
            out[f"{name} {pl}"] = {
                "placements": placements,
                "comms": comms.total(),
                "gathered": sorted(map(str, gathered_ops())),
            }
    return out


def _image_chain(t):
    y = F.avg_pool2d(t, 2)
    y = F.interpolate(y, scale_factor=2, mode="bilinear")
    y = F.pad(y, (1, 1, 1, 1), mode="reflect")
    return torch.fft.rfft(y, dim=-1).abs()


def _linalg_chain(t):
    return torch.linalg.solve(t, _RHS).sum(-1) * torch.linalg.det(t).unsqueeze(-1)


def compiled(backend: str, chains=("image", "linalg")) -> dict:
    """Pooling, interpolation, padding and fft on a channel shard, and a batched solve and
    det on a second-batch-dim shard, compiled with ``backend`` (fullgraph): one graph, values
    and gradients equal dense, the result keeps the shard."""
    mesh = _mesh()
    out: dict = {}
    for chain in chains:
        fn, make = {"image": (_image_chain, _image), "linalg": (_linalg_chain, _spd)}[chain]
        D = make(torch.Generator().manual_seed(21))
        d = D.clone().requires_grad_(True)
        ref = fn(d)
        w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(22), dtype=ref.dtype)
        (ref * w).sum().backward()
        torch._dynamo.reset()
        cnt = CompileCounterWithBackend(backend)
        x = distribute(D, mesh, [Shard(1)]).requires_grad_(True)
        gathered_ops().clear()
        y = torch.compile(fn, backend=cnt, fullgraph=True)(x)
        close(y.full_tensor(), ref.detach(), msg=f"compiled {chain}")
        (y * w).sum().backward()
        close(x.grad.full_tensor(), d.grad, msg=f"compiled grad of {chain}")
        out[chain] = {"frames": cnt.frame_count, "placements": repr(tuple(y.placements)),
                      "gathered": sorted(map(str, gathered_ops()))}
    return out


def _failing_batch():
    # Four SPD 3x3 matrices, the last one (on rank 1 under Shard(0)) singular and not
    # positive-definite.
    a = torch.randn(4, 3, 3, generator=torch.Generator().manual_seed(23), dtype=torch.float64)
    a = a @ a.mT + 3 * torch.eye(3, dtype=torch.float64)
    a[3] = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [3.0, 6.0, 9.0]], dtype=torch.float64) * -1
    return a


FAILING = {
    "linalg.cholesky": lambda t: torch.linalg.cholesky(t),
    "linalg.cholesky_ex check_errors": lambda t: torch.linalg.cholesky_ex(t, check_errors=True).L,
    "cholesky": lambda t: torch.cholesky(t),
    "linalg.inv": lambda t: torch.linalg.inv(t),
    "linalg.inv_ex check_errors": lambda t: torch.linalg.inv_ex(t, check_errors=True).inverse,
    "linalg.solve": lambda t: torch.linalg.solve(t, torch.ones(4, 3, dtype=t.dtype)),
    "linalg.lu_factor": lambda t: torch.linalg.lu_factor(t).LU,
}


def errors_on_every_rank() -> dict:
    """A batch whose failing matrix is in rank 1's shard only: every rank raises the error
    the dense op raises (same type and message, naming the global batch element), and the
    ranks stay in step (a collective after each error completes)."""
    mesh = _mesh()
    D = _failing_batch()
    out: dict = {}
    for name, fn in FAILING.items():
        try:
            fn(D)
            dense = None
        except Exception as e:  # noqa: BLE001  (the dense op's error is the reference)
            dense = (type(e).__name__, str(e))
        x = distribute(D, mesh, [Shard(0)])
        try:
            fn(x)
            got = None
        except Exception as e:  # noqa: BLE001
            got = (type(e).__name__, str(e))
        assert got == dense, (name, got, dense)
        # In step: every rank reaches this collective.
        close(distribute(D, mesh, [Shard(0)]).full_tensor(), D)
        out[name] = "raised" if got is not None else "passed"
    return out


_ROWS = torch.tensor([4, 0, 2, 2])

# name -> (op, whether a Partial('sum') passes): ops that only move, copy or zero elements
# keep a pending reduction pending (the along-dims rule's ``_PASSES``); a nonzero pad value
# passes max/min/avg (every rank pads with it) but not a sum (counted once per rank).
MOVERS = {
    "flip": (lambda t: t.flip(1), True),
    "fliplr": (torch.fliplr, True),
    "flipud": (torch.flipud, True),
    "rot90": (lambda t: torch.rot90(t, 1, (1, 2)), True),
    "roll": (lambda t: t.roll(2, 1), True),
    "fftshift": (lambda t: torch.fft.fftshift(t, dim=(1, 2)), True),
    "ifftshift": (lambda t: torch.fft.ifftshift(t), True),
    "pad zeros": (lambda t: F.pad(t, (1, 2, 0, 1)), True),
    "pad 1.5": (lambda t: F.pad(t, (1, 2), value=1.5), False),
    "tile": (lambda t: t.tile(2, 1), True),
    "repeat new dim": (lambda t: t.repeat(2, 1, 1, 3), True),
    "tril": (lambda t: t.tril(-1), True),
    "index_select": (lambda t: t.index_select(2, _ROWS), True),
}


def _movers_chain(t):
    return F.pad(torch.rot90(t, 1, (1, 2)).roll(1, 2), (1, 1)).tile(1, 2, 1).tril()


def movers(backend: str = "aot_eager") -> dict:
    """Each ``MOVERS`` op on a Partial('sum') (halves: exact in float64) and a Partial('max')
    (each rank's addend at most the value, one rank's equal), and ``tile``/``repeat`` on a
    shard of a dim they do not repeat: values and (for the sum) gradients equal dense, the
    result's placements and the forward's collectives. And a chain of them on a
    Partial('sum') compiled with ``backend`` (fullgraph): one graph, values and gradients
    equal dense, the result still Partial."""
    mesh = _mesh()
    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    g = torch.Generator().manual_seed(21)
    D = torch.randn(3, 5, 6, generator=g, dtype=torch.float64)
    below = torch.rand(D.shape, generator=g, dtype=torch.float64)
    for name, (fn, _) in MOVERS.items():
        d = D.clone().requires_grad_(True)
        ref = fn(d)
        w = torch.randn(ref.shape, generator=g, dtype=ref.dtype)
        (ref * w).sum().backward()
        for op in ("sum", "max"):
            local = D / n if op == "sum" else (D if rank == (1 if n > 1 else 0) else D - below)
            x = ShardedTensor.from_local(local, mesh, [Partial(op)], shape=D.shape, stride=_strides(D.shape))
            x.requires_grad_(op == "sum")
            with Comms() as comms:
                y = fn(x)
            placements = repr(tuple(y.placements))
            close(y.full_tensor(), ref.detach(), msg=f"{name} of Partial({op})")
            if op == "sum":
                (y * w).sum().backward()
                close(x.grad.full_tensor(), d.grad, msg=f"grad of {name} of Partial({op})")
            out[f"{name} {op}"] = {"placements": placements, "comms": comms.total()}
    for name, fn in (("tile", lambda t: t.tile(1, 2)), ("repeat", lambda t: t.repeat(1, 1, 3))):
        x = distribute(D, mesh, [Shard(1)])
        with Comms() as comms:
            y = fn(x)
        close(y.full_tensor(), fn(D), msg=f"{name} of Shard(1)")
        out[f"{name} Shard(1)"] = {"placements": repr(tuple(y.placements)), "comms": comms.total()}
    d = D.clone().requires_grad_(True)
    ref = _movers_chain(d)
    w = torch.randn(ref.shape, generator=g, dtype=ref.dtype)
    (ref * w).sum().backward()
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend(backend)
    x = ShardedTensor.from_local(D / n, mesh, [Partial("sum")], shape=D.shape, stride=_strides(D.shape)).requires_grad_(True)
    y = torch.compile(_movers_chain, backend=cnt, fullgraph=True)(x)
    close(y.full_tensor(), ref.detach(), msg="compiled chain")
    (y * w).sum().backward()
    close(x.grad.full_tensor(), d.grad, msg="compiled grad of the chain")
    out["compiled chain"] = {"frames": cnt.frame_count, "placements": repr(tuple(y.placements))}
    return out
