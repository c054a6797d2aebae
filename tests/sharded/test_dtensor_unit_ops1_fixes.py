"""The op rules the ports of torch's test_math_ops / test_pointwise_ops / test_tensor_ops
showed short of DTensor, each on a one-rank mesh (the placements the rule decides and the
dense value; the ports check the same on 2 ranks against DTensor, with collective counts)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from subclass_kit.sharded import MeshRef, Partial, Replicate, SequenceParallel, Shard, ShardedTensor, distribute, parallelize

close = torch.testing.assert_close


def _pl(x):
    return tuple(x.placements)


def test_maximum_minimum_keep_partial_max_min():
    mesh = MeshRef.local()
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    for op, kind in ((torch.maximum, "max"), (torch.minimum, "min")):
        pa, pb = (ShardedTensor.from_local(t, mesh, [Partial(kind)]) for t in (a, b))
        r = op(pa, pb)
        assert _pl(r) == (Partial(kind),)
        close(r.full_tensor(), op(a, b))
        # with a replicated operand too: max(max_r a_r, b) = max_r max(a_r, b)
        assert _pl(op(pa, distribute(b, mesh, [Replicate()]))) == (Partial(kind),)
    # the other extremum does not distribute over it: reduced first
    pa = ShardedTensor.from_local(a, mesh, [Partial("max")])
    assert _pl(torch.minimum(pa, pa)) == (Replicate(),)


def test_histc_with_range_is_partial_sum():
    mesh = MeshRef.local()
    x = torch.randn(6, 5)
    d = distribute(x, mesh, [Shard(0)])
    r = d.histc(bins=7, min=-1.0, max=1.0)
    assert _pl(r) == (Partial("sum"),)
    close(r.full_tensor(), x.histc(bins=7, min=-1.0, max=1.0))
    # the data's own range (min == max): computed whole
    r = d.histc(bins=7)
    assert _pl(r) == (Replicate(),)
    close(r.full_tensor(), x.histc(bins=7))


def test_index_put_of_partials_stays_partial():
    mesh = MeshRef.local()
    x, v = torch.randn(4, 8), torch.randn(8)
    px, pv = ShardedTensor.from_local(x, mesh, [Partial()]), ShardedTensor.from_local(v, mesh, [Partial()])
    for acc in (True, False):
        r = torch.index_put(px, [torch.tensor(1)], pv, acc)
        assert _pl(r) == (Partial("sum"),)
        close(r.full_tensor(), torch.index_put(x, [torch.tensor(1)], v, acc))
    # a replicated (or plain) value joins the Partial (zero-masked past the first rank, as
    # DTensor's Replicate -> Partial): no all-reduce of x
    for val in (distribute(v, mesh, [Replicate()]), v):
        r = torch.index_put(px, [torch.tensor(1)], val)
        assert _pl(r) == (Partial("sum"),)
        close(r.full_tensor(), torch.index_put(x, [torch.tensor(1)], v))


def test_softmax_backward_keeps_the_output_shard():
    mesh = MeshRef.local()
    x = torch.randn(4, 6, requires_grad=True)
    d = distribute(x.detach(), mesh, [Shard(0)]).requires_grad_(True)
    d.softmax(dim=1).sum().backward()
    x.softmax(dim=1).sum().backward()
    assert _pl(d.grad) == (Shard(0),)
    close(d.grad.full_tensor(), x.grad)


def test_to_empty_of_a_meta_partial_buffer_keeps_it():
    mesh = MeshRef.local()
    m = torch.nn.Module()
    with torch.device("meta"):
        m.register_buffer("b", ShardedTensor.from_local(torch.tensor(0.0), mesh, [Partial()]))
    m.to_empty(device=None)
    assert _pl(m.b) == (Partial("sum"),)
    # a scratch empty_like on the same device (dropout's mask) is still Replicate
    p = ShardedTensor.from_local(torch.zeros(3), mesh, [Partial()])
    assert _pl(torch.empty_like(p)) == (Replicate(),)


def test_sequence_parallel_output_keeps_its_layout():
    # A norm over (seq, emb) under SequenceParallel returns what layer_norm gives (the
    # sequence gathered: Replicate), as DTensor's; a local output is still the sequence shard.
    mesh = MeshRef.local()
    x = torch.randn(2, 4, 3)
    ln = torch.nn.LayerNorm((4, 3))
    dense = copy.deepcopy(ln)
    y = parallelize(ln, mesh, SequenceParallel())(x)
    assert _pl(y) == (Replicate(),)
    close(y.full_tensor(), dense(x))
    y = parallelize(copy.deepcopy(dense), mesh, SequenceParallel(use_local_output=True))(x)
    assert type(y) is torch.Tensor
    close(y, F.layer_norm(x, (4, 3), dense.weight, dense.bias))


def test_stack_and_cat_keep_a_shared_partial():
    # [Partial, Replicate] with [Partial, Partial]: the replicated operand joins the Partial
    mesh = MeshRef.local()
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    pa = ShardedTensor.from_local(a, mesh, [Partial()])
    ra = distribute(b, mesh, [Replicate()])
    for op in (torch.stack, torch.cat):
        r = op([pa, ra])
        assert _pl(r) == (Partial("sum"),)
        close(r.full_tensor(), op([a, b]))
    # two Partial kinds: reduced
    pm = ShardedTensor.from_local(b, mesh, [Partial("max")])
    assert _pl(torch.stack([pa, pm])) == (Replicate(),)


def test_gather_from_the_gathered_dims_shard_is_a_masked_lookup():
    mesh = MeshRef.local()
    x, idx = torch.randn(4, 6, 5), torch.randint(6, (3, 1, 5))
    r = torch.gather(distribute(x, mesh, [Shard(1)]), 1, idx)
    assert _pl(r) == (Partial("sum"),)
    close(r.full_tensor(), torch.gather(x, 1, idx))
    # an index longer than 1 on the dim: by positions, as before
    idx = torch.randint(6, (3, 2, 5))
    assert _pl(torch.gather(distribute(x, mesh, [Shard(1)]), 1, idx)) == (Replicate(),)
    # the index sharded on the gathered dim, the input whole: the index's shard
    idx = torch.randint(6, (3, 4, 5))
    r = torch.gather(distribute(x, mesh, [Replicate()]), 1, distribute(idx, mesh, [Shard(1)]))
    assert _pl(r) == (Shard(1),)
    close(r.full_tensor(), torch.gather(x, 1, idx))


def test_nll_loss2d_over_a_spatial_shard_stays_sharded():
    mesh = MeshRef.local()
    x = torch.randn(2, 5, 4, requires_grad=True)
    t = torch.randint(5, (2, 4))
    for reduction in ("none", "sum", "mean"):
        d = distribute(x.detach(), mesh, [Shard(2)]).requires_grad_(True)
        y = F.nll_loss(d, distribute(t, mesh, [Replicate()]), reduction=reduction)
        want = F.nll_loss(x, t, reduction=reduction)
        assert _pl(y) == ((Shard(1),) if reduction == "none" else (Partial("sum"),))
        close(y.full_tensor(), want)
        y.sum().backward()
        x.grad = None
        want.sum().backward()
        assert _pl(d.grad) == (Shard(2),)
        close(d.grad.full_tensor(), x.grad)
