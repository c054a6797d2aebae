"""torch's ``test/distributed/tensor/test_math_ops.py`` (DistMathOpsTest), first half:
reductions, softmax, losses, the layer norm under sequence parallelism; ported to the kit and
run on DTensor alike (see _dtensor_unit_ops1_tasks for the pattern)."""

from __future__ import annotations

import copy
import itertools

import torch
import torch.nn.functional as F

from sharded._dtensor_unit_ops1_tasks import _count, _is_kit, _mesh, _mesh2d, _pls, _seed, close
from sharded._tp_upstream_tasks import Comms


# ---- test_math_ops.py: DistMathOpsTest ---------------------------------------------------------
def _linear_op_reductions(L, op_str):
    mesh = _mesh()
    tensor = torch.randn(12, 8, 8)
    if op_str in ("any", "all"):
        tensor = tensor < 0
    dtensor = L.distribute(tensor, mesh, [L.Shard(0)])
    op, op_dt = getattr(tensor, op_str), getattr(dtensor, op_str)
    counts = {}
    for dim in range(tensor.ndim):
        for keep_dim in (True, False, None):
            args = (dim, keep_dim) if keep_dim is not None else (dim,)
            with Comms() as c:
                want, got = op(*args), op_dt(*args)
            if op_str in ("max", "min"):
                want, got = want[0], got[0]
            close(got.full_tensor(), want)
            if op_str not in ("all", "any"):
                # over a sharded dim the kit reduces these at once (a bool all/any would be
                # a Partial of bools; upstream counts no collectives here), DTensor keeps them
                # pending; prod is a Partial('product') on both
                counts[f"{op_str} {args}"] = c.total()
    close(op_dt().full_tensor(), op())
    return counts


def test_linear_op_reductions(L):
    _seed()
    out = {}
    for op_str in ("all", "sum", "prod", "max", "min", "any", "amax", "amin"):
        out.update(_linear_op_reductions(L, op_str))
    return out


def test_mean(L):
    _seed()
    return _linear_op_reductions(L, "mean")


def _softmax_cases(L, bwd: bool):
    mesh = _mesh()
    out = {}
    for softmax_dim, shard_dim in itertools.product([-1, 0, 1, 2], [-1, 0, 1, 2]):
        _seed(softmax_dim * 7 + shard_dim)
        x = torch.rand(8, 12, 16, requires_grad=bwd)
        local_y = F.softmax(x, dim=softmax_dim, dtype=torch.float32)
        dist_x = L.distribute(x.detach(), mesh, [L.Shard(shard_dim)]).requires_grad_(bwd)
        same = shard_dim % 3 == softmax_dim % 3
        with Comms() as c:
            dist_y = F.softmax(dist_x, dim=softmax_dim, dtype=torch.float32) if not bwd else dist_x.softmax(dim=softmax_dim)
        assert _pls(dist_y) == (["R"] if same else [f"S{shard_dim % 3}"]), (softmax_dim, shard_dim, _pls(dist_y))
        close(dist_y.full_tensor(), local_y)
        out[f"fwd {softmax_dim},{shard_dim}"] = c.total()
        if bwd:
            local_y.sum().backward()
            ys = dist_y.sum()
            assert _pls(ys) == (["R"] if same else ["P(sum)"]), (softmax_dim, shard_dim, _pls(ys))
            close(ys.full_tensor(), local_y.sum())
            assert dist_x.grad is None
            with Comms() as c:
                ys.backward()
            assert _pls(dist_x.grad) == (["R"] if same else [f"S{shard_dim % 3}"])
            close(dist_x.grad.full_tensor(), x.grad)
            out[f"bwd {softmax_dim},{shard_dim}"] = c.total()
    return out


def test_softmax_fwd(L):
    return _softmax_cases(L, bwd=False)


def test_softmax_with_bwd(L):
    return _softmax_cases(L, bwd=True)


def test_nll_loss_and_cross_entropy(L):
    mesh = _mesh()
    _seed()
    channel_size, channel_dim = 16, 1
    out = {}
    for input_ndim, input_size, target_size in ((2, (8, channel_size), (8,)), (3, (8, channel_size, 12), (8, 12))):
        x = torch.rand(*input_size, requires_grad=True)
        target = torch.randint(channel_size, target_size)
        dist_target = L.distribute(target, mesh, [L.Replicate()])
        for shard_dim, reduction, loss_fn in itertools.product(
                range(input_ndim), ("none", "mean", "sum"), (F.nll_loss, F.cross_entropy)):
            dist_x = L.distribute(x.detach(), mesh, [L.Shard(shard_dim)]).requires_grad_(True)
            y = loss_fn(x, target, reduction=reduction)
            (y.sum() if reduction == "none" else y).backward()
            case = f"{input_ndim},{shard_dim},{reduction},{loss_fn.__name__}"
            with Comms() as c:
                dist_y = loss_fn(dist_x, dist_target, reduction=reduction)
            if shard_dim == channel_dim:
                out[case] = _count(L, c, 1, case)
                assert _pls(dist_y) == ["R"], (case, _pls(dist_y))
                close(dist_y.to_local(), y)
            elif reduction == "mean" and _is_kit(L):
                # documented: the kit all-reduces the global total weight (one all-reduce), so
                # the mean is exact with ignored targets and uneven shards (see the end)
                assert c.total() <= 1 and _pls(dist_y) == ["P(sum)"], (case, dict(c.counts), _pls(dist_y))
                close(dist_y.full_tensor(), y)
            else:
                n = _count(L, c, 0, case)
                if reduction != "mean":  # (the mean's counts differ by the documented choice)
                    out[case] = n
                want = f"S{shard_dim if shard_dim < channel_dim else shard_dim - 1}" if reduction == "none" else "P(sum)"
                assert _pls(dist_y)[0][0] == want[0] and (want[0] == "P" or _pls(dist_y) == [want]), (case, _pls(dist_y))
                close(dist_y.full_tensor(), y)
            (dist_y.sum() if reduction == "none" else dist_y).backward()
            if shard_dim == channel_dim:
                assert _pls(dist_x.grad) == ["R"], (case, _pls(dist_x.grad))
                close(dist_x.grad.to_local(), x.grad)
            else:
                assert _pls(dist_x.grad) == [f"S{shard_dim}"], (case, _pls(dist_x.grad))
                close(dist_x.grad.full_tensor(), x.grad)
            x.grad.zero_()
    if _is_kit(L):
        # the ignored targets all in rank 0's rows: the kit's mean is still the dense one
        # (DTensor's per-rank average of means is not)
        x, target = torch.randn(8, channel_size), torch.randint(channel_size, (8,))
        target[:3] = -100
        for loss_fn in (F.nll_loss, F.cross_entropy):
            got = loss_fn(L.distribute(x, mesh, [L.Shard(0)]), L.distribute(target, mesh, [L.Replicate()]))
            close(got.full_tensor(), loss_fn(x, target))
    return out


def test_shard_math_ops(L):
    mesh = _mesh2d()
    g = torch.ones(4, 4)
    double = L.distribute(g, mesh, [L.Shard(0), L.Shard(0)])
    fully = L.distribute(g, mesh, [L.Shard(0), L.Shard(1)])
    for op in (torch.add, torch.sub, torch.mul, torch.div):
        close(op(double, 2).full_tensor(), op(g, 2))
        close(op(fully, 2).full_tensor(), op(g, 2))
    return {}


def test_layer_norm_bwd_req_grad(L):
    """The (seq, emb) LayerNorm under SequenceParallel between a rowwise embedding and a
    colwise linear: values, gradients and the forward/backward collective counts of every
    requires_grad pattern."""
    mesh = _mesh()
    batch, seq_len, emb, vocab = 8, 8, 10, 32
    out = {}
    for multidim, affine, emb_rg, ln_rg, out_rg in itertools.product(*(((False, True),) * 5)):
        if (ln_rg and not affine) or not any((emb_rg, ln_rg, out_rg)):
            continue
        case = f"md={multidim},aff={affine},emb={emb_rg},ln={ln_rg},out={out_rg}"
        shape = (seq_len, emb) if multidim else (emb,)

        class LnTpBlock(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.preln_embeddings = torch.nn.Embedding(vocab, emb)
                self.layer_norm = torch.nn.LayerNorm(shape, elementwise_affine=affine)
                self.postln_linear = torch.nn.Linear(emb, emb)

            def forward(self, tokens):
                return self.postln_linear(self.layer_norm(self.preln_embeddings(tokens)))

        _seed(3)
        model = LnTpBlock()
        model_local = copy.deepcopy(model)
        plan = {
            "preln_embeddings": L.parallel.RowwiseParallel(input_layouts=L.Replicate(), output_layouts=L.Shard(1)),
            "layer_norm": L.parallel.SequenceParallel(),
            "postln_linear": L.parallel.ColwiseParallel(input_layouts=L.Shard(1), output_layouts=L.Replicate()),
        }
        model_dist = L.parallelize(model, mesh, plan)
        rg = {"preln_embeddings": emb_rg, "postln_linear": out_rg, "layer_norm": ln_rg}
        for m in (model_local, model_dist):
            for n, p in m.named_parameters():
                if not rg.get(n.rpartition(".")[0], False):
                    p.requires_grad_(False)
        x = torch.randint(vocab, (batch, seq_len))
        y_local = model_local(x)
        with Comms() as fwd:
            y_dist = model_dist(x)
        close(y_dist.full_tensor() if isinstance(y_dist, L.T) else y_dist, y_local)
        y_local.sum().backward()
        with Comms() as bwd:
            y_dist.sum().backward()
        local_params = dict(model_local.named_parameters())
        for n, p in model_dist.named_parameters():
            q = local_params[n]
            assert (p.grad is None) == (q.grad is None), (case, n)
            if q.grad is not None:
                close(p.grad.full_tensor() if isinstance(p.grad, L.T) else p.grad, q.grad)
        want_fwd = 3  # upstream: {reduce_scatter: 1, all_gather: 2}
        if out_rg and not (emb_rg or ln_rg):
            want_bwd = 0
        elif ln_rg and not (emb_rg or multidim):
            want_bwd = 1
        elif multidim:
            want_bwd = 1 + (2 if emb_rg else 1)
        else:
            want_bwd = 2
        out[f"fwd {case}"] = _count(L, fwd, want_fwd, "fwd " + case)
        out[f"bwd {case}"] = _count(L, bwd, want_bwd, "bwd " + case)
    return out
