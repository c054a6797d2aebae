"""Rank tasks for ops moved off the generic gathering fallback: the activations' gradients
(elementwise, a Partial gradient kept), views of a whole operand the kit's built-in view
handler serves getting their own signature (narrow inside a decomposition), addbmm. Each
compares with dense and reports placements and the ops that gathered."""

from __future__ import annotations

import torch
import torch.distributed as dist

from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, distribute
from subclass_kit.sharded._ops.generic import gathered_ops

close = torch.testing.assert_close
aten = torch.ops.aten


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _partial(t, mesh):
    """``t`` as a Partial('sum') whose ranks hold different addends."""
    k, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(5)
    parts = [torch.randn(t.shape, generator=g) for _ in range(k - 1)]
    parts.append(t - sum(parts))
    return ShardedTensor.from_local(parts[r], mesh, [Partial("sum")])


BACKWARDS = {
    "elu_backward": lambda g, x: aten.elu_backward.default(g, 1.0, 1.0, 1.0, False, x),
    "hardtanh_backward": lambda g, x: aten.hardtanh_backward.default(g, x, -0.5, 0.5),
    "leaky_relu_backward": lambda g, x: aten.leaky_relu_backward.default(g, x, 0.1, False),
    "softplus_backward": lambda g, x: aten.softplus_backward.default(g, x, 1.0, 20.0),
    "hardsigmoid_backward": lambda g, x: aten.hardsigmoid_backward.default(g, x),
    "hardshrink_backward": lambda g, x: aten.hardshrink_backward.default(g, x, 0.5),
    "softshrink_backward": lambda g, x: aten.softshrink_backward.default(g, x, 0.5),
    "log_sigmoid_backward": lambda g, x: aten.log_sigmoid_backward.default(g, x, aten.log_sigmoid_forward.default(x)[1]),
}


def activation_backwards() -> dict:
    """Each activation gradient with the incoming gradient Partial and the input whole, or
    both sharded alike: dense values; the placements of the result."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(3)
    X, G = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    res = {}
    gathered_ops().clear()
    for name, fn in BACKWARDS.items():
        want = fn(G, X)
        got = fn(_partial(G, mesh), distribute(X, mesh, [Replicate()]))
        close(got.full_tensor(), want, msg=f"{name}, Partial gradient")
        res[f"{name} Partial"] = repr(got.placements)
        got = fn(distribute(G, mesh, [Shard(1)]), distribute(X, mesh, [Shard(1)]))
        close(got.full_tensor(), want, msg=f"{name}, Shard(1)")
        res[f"{name} Shard(1)"] = repr(got.placements)
    res["gathered"] = sorted(map(str, gathered_ops()))
    return res


def views_and_small_ops() -> dict:
    mesh = _mesh()
    g = torch.Generator().manual_seed(4)
    res = {}
    gathered_ops().clear()
    # After a plan was cached for the base's signature, the view's own metadata (not the
    # base's) serves the next op.
    C = torch.randn(4, 3, generator=g, dtype=torch.complex64)
    a = distribute(C, mesh, [Replicate()])
    _ = a * 2
    y = torch.view_as_real(a) * 2
    close(y.full_tensor(), torch.view_as_real(C) * 2)
    assert y.shape == (4, 3, 2) and y.to_local().shape == (4, 3, 2), (y.shape, y.to_local().shape)
    # narrow reached inside a decomposition (narrow_copy), then an op on a same-shaped base.
    D = torch.randn(5, 5, 5, generator=g)
    n = torch.narrow_copy(distribute(D, mesh, [Replicate()]), 1, 1, 2)
    close(n.full_tensor(), torch.narrow_copy(D, 1, 1, 2))
    v = torch.view_copy(distribute(torch.randn(25, 5, generator=g), mesh, [Replicate()]), (5, 5, 5))
    assert v.shape == (5, 5, 5) and v.to_local().shape == (5, 5, 5), (v.shape, v.to_local().shape)
    # view_as_real / view_as_complex keep a shard (a view of the local, no gather).
    s = distribute(C, mesh, [Shard(0)])
    r = torch.view_as_real(s)
    close(r.full_tensor(), torch.view_as_real(C))
    back = torch.view_as_complex(r)
    close(back.full_tensor(), C)
    res["view_as_real Shard(0)"] = (repr(r.placements), r.untyped_storage()._cdata == s.untyped_storage()._cdata)
    res["view_as_complex Shard(0)"] = repr(back.placements)
    # addbmm over a shared batch shard: a local bmm, a Partial sum over the batch.
    B1, B2, I = torch.randn(4, 3, 5, generator=g), torch.randn(4, 5, 2, generator=g), torch.randn(3, 2, generator=g)
    for beta, alpha in ((1, 1), (0.5, 2.0), (0, 1)):
        got = torch.addbmm(distribute(I, mesh, [Replicate()]), distribute(B1, mesh, [Shard(0)]),
                           distribute(B2, mesh, [Shard(0)]), beta=beta, alpha=alpha)
        close(got.full_tensor(), torch.addbmm(I, B1, B2, beta=beta, alpha=alpha), msg=f"addbmm {beta} {alpha}")
    # Order statistics along an unsharded dim keep the shard; along the sharded one they
    # gather it (the along-dims rule), values and indices equal dense either way.
    D = torch.randn(6, 5, generator=g)
    for name, fn in {
        "kthvalue": lambda t, d: torch.kthvalue(t, 2, dim=d),
        "median": lambda t, d: torch.median(t, dim=d),
        "nanmedian": lambda t, d: torch.nanmedian(t, dim=d, keepdim=True),
        "mode": lambda t, d: torch.mode(t.round(), dim=d),
    }.items():
        for d in (0, 1):
            got, want = fn(distribute(D, mesh, [Shard(0)]), d), fn(D, d)
            close(got.values.full_tensor(), want.values, msg=f"{name} dim {d}")
            close(got.indices.full_tensor(), want.indices, msg=f"{name} dim {d} indices")
            res[f"{name} dim {d}"] = repr(got.values.placements)
    close(torch.median(distribute(D, mesh, [Shard(0)])).full_tensor(), torch.median(D))
    res["gathered"] = sorted(map(str, gathered_ops()))
    return res
