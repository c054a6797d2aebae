"""torch's ``test_embedding_ops.py`` (``TestEmbeddingOp``), ``test_convolution_ops.py``
(``DistConvolutionOpsTest``) and ``test_experimental_ops.py`` (``DistOtherOpsTest``), ported
to the kit: each port runs on the kit and on DTensor (see _dtensor_unit_ops2_tasks), asserts
upstream's values, and returns the placements and collectives per case."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sharded._dtensor_unit_ops2_tasks import Comms, close, mesh_1d, pl, record


# ---- test_embedding_ops.py ------------------------------------------------------------------------
def _shard_embedding(L, mod, shard_dim, mesh):
    def fn(name, module, mesh):
        for pname, p in list(module.named_parameters()):
            module.register_parameter(pname, nn.Parameter(L.distribute(p, mesh, [L.Shard(shard_dim)])))

    return L.distribute_module(mod, mesh, fn)


def _run_embedding(L, r, mesh, shard_dim, input_size, num, dim, compile_backend=None, count=True, **kwargs):
    """upstream's _run_embedding_op_test: no collective in forward or backward, the output
    and the weight's gradient equal the dense module's, F.embedding too."""
    torch.manual_seed(0)
    local = nn.Embedding(num, dim, **kwargs)
    sharded = nn.Embedding(num, dim, **kwargs)
    sharded.weight = nn.Parameter(local.weight.detach().clone())
    sharded = _shard_embedding(L, sharded, shard_dim, mesh)
    call = torch.compile(sharded, backend=compile_backend, fullgraph=True) if compile_backend else sharded
    torch.manual_seed(10)
    inp = torch.randint(0, num, tuple(input_size))
    target = torch.empty(*inp.size(), dim, dtype=torch.float).random_(0, 1)
    dist_inp = L.distribute(inp, mesh, [L.Replicate()])
    # (a counting dispatch mode cannot be active while dynamo traces: compiled calls uncounted)
    count = count and not compile_backend
    with Comms() as fwd:
        out = call(dist_inp) if count else None
    if not count:
        out = call(dist_inp)
    case = f"S{shard_dim}:{input_size}:{num}x{dim}:{kwargs}"
    record(r, case + ":fwd", out, fwd)
    assert not count or fwd.total() == 0, dict(fwd.counts)
    full = out.full_tensor()
    local_out = local(inp)
    close(full, local_out)
    loss = nn.CrossEntropyLoss()
    loss(local_out, target).backward()
    with Comms() as bwd:
        loss(full, target).backward()
    assert not count or bwd.total() == 0, dict(bwd.counts)
    close(sharded.weight.grad.full_tensor(), local.weight.grad)
    emb = torch.compile(F.embedding, backend=compile_backend, fullgraph=True) if compile_backend else F.embedding
    y = emb(L.from_local(inp, mesh, [L.Replicate()], run_check=False), sharded.weight, **kwargs)
    close(y.full_tensor(), F.embedding(inp, local.weight, **kwargs))


def test_sharded_embedding_colwise(L):
    mesh, r = mesh_1d(), {}
    for args, kw in (((1, [5, 4], 17, 12), {}), ((1, [6, 7, 6], 21, 11), {}), ((1, [8, 6, 5, 4], 23, 13), {}),
                     ((1, [8, 6, 5, 4, 7], 23, 16), {}), ((1, [4], 15, 14), {}),
                     ((1, [34], 15, 14), {"padding_idx": 10}), ((1, [8, 6, 5, 4], 23, 13), {"padding_idx": 12})):
        _run_embedding(L, r, mesh, *args, **kw)
    return r


def test_sharded_embedding_colwise_max_norm_errors(L):
    """Upstream: DTensor refuses max_norm (embedding_renorm_ has no sharding strategy).
    Returns "refused" or, where the op runs, "dense" once its values equal the dense op's."""
    r: dict = {}
    try:
        _run_embedding(L, r, mesh_1d(), 1, [8, 6, 5, 4], 23, 13, count=False, padding_idx=12, max_norm=2.0)
    except NotImplementedError as e:
        assert "embedding_renorm_" in str(e), e
        return "refused"
    return "dense"


def test_sharded_embedding_rowwise(L):
    mesh, r = mesh_1d(), {}
    for args, kw in (((0, [5, 12], 16, 22), {}), ((0, [6, 7, 6], 13, 22), {}), ((0, [34], 15, 14), {"padding_idx": 10})):
        _run_embedding(L, r, mesh, *args, **kw)
    emb = _shard_embedding(L, nn.Embedding(10, 20), 0, mesh)
    out = emb(L.from_local(torch.randint(0, 10, (8, 8)), mesh, [L.Replicate()], run_check=False))
    with Comms() as c:
        out.full_tensor()
    assert c.total() == 1 and c.counts["all_reduce"] == 1, dict(c.counts)
    r.setdefault("pl", {})["rowwise out"] = ["P"] if out.placements[0].is_partial() else pl(out)
    return r


def test_multiple_embeddings_rowwise(L):
    """Row-sharded tables of 23 and 29 columns on the same indices: Partial outputs (DTensor's
    _MaskPartial) whose full_tensor is the dense lookup."""
    mesh = mesh_1d()
    torch.manual_seed(0)
    inp = torch.randint(0, 10, (4, 4))
    x = L.from_local(inp, mesh, [L.Replicate()], run_check=False)
    for dim in (23, 29, 29):
        emb = nn.Embedding(10, dim)
        want = emb(inp)
        out = _shard_embedding(L, emb, 0, mesh)(x)
        assert out.placements[0].is_partial(), out.placements
        close(out.full_tensor(), want)
    return "ok"


def test_embedding_compile(L):
    """Upstream compiles with inductor; the ports use aot_eager (the subclass's trace and
    backward graph, without the inductor codegen time CI has no room for)."""
    mesh, r = mesh_1d(), {}
    _run_embedding(L, r, mesh, 1, [5, 4], 17, 12)
    torch._dynamo.reset()
    _run_embedding(L, r, mesh, 0, [5, 12], 16, 22, compile_backend="aot_eager")
    return r


# ---- test_convolution_ops.py ----------------------------------------------------------------------
def _conv_fn(L):
    def fn(name, module, mesh):
        for pname, p in list(module.named_parameters()):
            module.register_parameter("_".join(pname.split(".")), nn.Parameter(L.distribute(p, mesh, [L.Replicate()])))

    return fn


def test_downsampling_convolution(L, iters=3):
    """SGD on Conv2d(3, C, kernel_size=4, stride=4) with the input's width sharded (Shard(3)):
    the weights equal the dense run's (upstream: 10 steps of a (7, 3, 512, 1024) input and 256
    channels; here 3 steps of (2, 3, 16, 64) and 16 channels, the same sharding)."""
    mesh = mesh_1d()
    torch.manual_seed(0)
    inputs, grads = torch.rand(iters, 2, 3, 16, 64), torch.rand(iters, 2, 16, 4, 16) * 1e-3
    model = nn.Conv2d(3, 16, kernel_size=4, stride=4, padding=0)
    nn.init.ones_(model.weight)
    nn.init.zeros_(model.bias)
    model_gt = copy.deepcopy(model)
    model = L.distribute_module(model, mesh, _conv_fn(L), input_fn=None, output_fn=None)
    opt, opt_gt = torch.optim.SGD(model.parameters(), lr=1e-3), torch.optim.SGD(model_gt.parameters(), lr=1e-3)
    r: dict = {}
    for i in range(iters):
        opt.zero_grad()
        x = L.distribute(inputs[i].requires_grad_(), mesh, [L.Shard(3)])
        with Comms() as c:
            out = model(x)
            out.backward(L.distribute(grads[i], mesh, [L.Shard(3)]))
        record(r, f"step{i}", out, c)
        opt.step()
        opt_gt.zero_grad()
        model_gt(inputs[i]).backward(grads[i])
        opt_gt.step()
    for got, want in ((model.weight, model_gt.weight), (model.bias, model_gt.bias)):
        diff = got.to_local() - want
        rel = diff / (want.abs() + 1e-8)
        assert torch.mean(diff * diff).item() <= 1e-6 and torch.mean(rel * rel).item() <= 1e-6, (
            torch.mean(diff * diff).item(), torch.mean(rel * rel).item(), got.to_local().flatten()[:4], want.flatten()[:4])
    return r


def test_conv_backward_none_grad_inp(L):
    mesh = mesh_1d()
    conv = nn.Conv2d(64, 64, 3, padding=1).train()
    x = L.from_local(torch.randn(1, 64, 32, 32), mesh, [L.Replicate()])
    w = nn.Parameter(L.from_local(conv.weight.detach(), mesh, [L.Replicate()]))
    b = nn.Parameter(L.from_local(conv.bias.detach(), mesh, [L.Replicate()]))
    res = F.conv2d(x, w, b, padding=1)
    res.backward(torch.rand_like(res))
    assert w.grad is not None and b.grad is not None and x.grad is None
    return "ok"


def _run_single_arg_fwd(L, model, arg):
    mesh = mesh_1d()
    ref = copy.deepcopy(model)
    out = L.distribute_module(model, mesh, _conv_fn(L))(L.from_local(arg, mesh, [L.Replicate()]))
    full, want = out.full_tensor(), ref(arg)
    assert full.shape == want.shape
    close(full, want)
    return "ok"


def test_conv1d(L):
    torch.manual_seed(0)
    return _run_single_arg_fwd(L, nn.Conv1d(64, 64, 3, padding=1), torch.randn(1, 64, 8))


def test_conv3d(L):
    torch.manual_seed(0)
    return _run_single_arg_fwd(L, nn.Conv3d(64, 64, 3, padding=1), torch.randn(1, 64, 8, 8, 8))


# ---- test_experimental_ops.py ---------------------------------------------------------------------
ITER_TIME = 10


def _mse_ok(got, want):
    diff = got - want
    rel = diff / (want.abs() + 1e-8)
    assert torch.mean(diff * diff).item() <= 1e-6 and torch.mean(rel * rel).item() <= 1e-6


def test_slice(L):
    mesh = mesh_1d()
    torch.manual_seed(0)
    inputs, grads = torch.rand(ITER_TIME, 1024, 10), torch.rand(ITER_TIME, 1024, 5) * 1e-3
    for i in range(ITER_TIME):
        inp = inputs[i].clone().requires_grad_()
        d = L.distribute(inp, mesh, [L.Replicate()])
        out = d[:, :5]
        out.backward(L.distribute(grads[i], mesh, [L.Replicate()]))
        inp[:, :5].backward(grads[i])
        _mse_ok(out.to_local(), inp[:, :5])
        _mse_ok(d.grad.to_local(), inp.grad)
    return "ok"


def test_bernoulli(L):
    """A Replicate bernoulli (and its gradient) is the same on both ranks (exchanged by
    batch_isend_irecv, as upstream)."""
    mesh = mesh_1d()
    rank = dist.get_rank()
    torch.manual_seed(0)
    inputs, grads = torch.rand(ITER_TIME, 1024, 10), torch.rand(ITER_TIME, 1024, 10) * 1e-3
    for i in range(ITER_TIME):
        d = L.distribute(inputs[i].clone().requires_grad_(), mesh, [L.Replicate()])
        out = torch.bernoulli(d)
        out.backward(L.distribute(grads[i], mesh, [L.Replicate()]))
        send_o, send_g = out.to_local().contiguous(), d.grad.to_local().contiguous()
        recv_o, recv_g = torch.zeros_like(send_o), torch.zeros_like(send_g)
        ops = [dist.P2POp(dist.isend, send_o, 1 ^ rank), dist.P2POp(dist.isend, send_g, 1 ^ rank),
               dist.P2POp(dist.irecv, recv_o, 1 ^ rank), dist.P2POp(dist.irecv, recv_g, 1 ^ rank)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        _mse_ok(send_o, recv_o)
        _mse_ok(send_g, recv_g)
    return "ok"


def test_nll(L):
    mesh = mesh_1d()
    torch.manual_seed(0)
    preds, targets = torch.rand(ITER_TIME, 1024, 10), torch.randint(0, 10, (ITER_TIME, 1024))
    criterion = nn.CrossEntropyLoss()
    for i in range(ITER_TIME):
        pred = preds[i].clone().requires_grad_()
        d = L.distribute(pred, mesh, [L.Replicate()])
        loss = criterion(d, L.distribute(targets[i], mesh, [L.Replicate()]))
        loss.backward()
        want = criterion(pred, targets[i])
        want.backward()
        _mse_ok(loss.to_local() if isinstance(loss, L.T) else loss, want)
        _mse_ok(d.grad.to_local(), pred.grad)
    return "ok"


EMBEDDING_PORTS = [test_sharded_embedding_colwise, test_sharded_embedding_colwise_max_norm_errors,
                   test_sharded_embedding_rowwise, test_multiple_embeddings_rowwise, test_embedding_compile]
CONV_PORTS = [test_downsampling_convolution, test_conv_backward_none_grad_inp, test_conv1d, test_conv3d]
EXPERIMENTAL_PORTS = [test_slice, test_bernoulli, test_nll]
