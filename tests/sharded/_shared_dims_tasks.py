"""Rank tasks for the ops taken off the generic gathering fallback by the ``shared_dims``
family (per-sample losses, ``cdist``, ``bilinear``, ``ctc_loss``, float8 ``_scaled_mm``,
``embedding_bag``),
the chunked ``linear_cross_entropy`` rule, and the ``independent`` family's index reductions
(``index_reduce``, ``segment_reduce``) and ``linalg_lstsq``: each case on the layouts
its rule keeps (a batch shard, a row shard, a feature shard, a Partial passing through) and
on one it must make whole, forward and backward against dense, with the collectives the
forward issued counted; and one compiled case. Each raises on the first mismatch."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, distribute
from subclass_kit.sharded._ops.generic import gathered_ops

from sharded._tp_upstream_tasks import Comms
from sharded._meshes import strides as _strides

close = torch.testing.assert_close
S0, S1, S2, R, P = Shard(0), Shard(1), Shard(2), Replicate(), Partial("sum")
F64 = torch.float64


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _randn(*shape):
    return lambda g: torch.randn(*shape, generator=g, dtype=F64)


def _scores(g):
    """A margin loss's input: 5 samples (uneven over 2 ranks) by 4 classes."""
    return [_randn(5, 4)(g)]


_CLASSES = torch.tensor([2, 0, 3, 3, 1])  # one target class per sample (5 samples: uneven)
_LABELS = torch.tensor([[3, 0, -1, 1], [1, -1, 0, 0], [0, 2, 3, -1], [2, -1, 1, 1], [1, 3, -1, 0]])
_WEIGHT = torch.tensor([0.5, 1.0, 2.0, 1.5], dtype=F64)
# ctc: T=6 frames, N=4 samples, C=4 classes; padded targets (N, 3) and their lengths
_TARGETS = torch.tensor([[1, 2, 2], [3, 1, 0], [2, 0, 0], [1, 3, 2]])
_IN_LENS, _TGT_LENS = [6, 5, 6, 4], [3, 2, 1, 3]
_INDEX = torch.tensor([0, 2, 2, 1, 0, 3])
_LENGTHS = torch.tensor([2, 0, 3, 1])


_CE_TARGETS = torch.tensor([2, 0, 1, 2, 1])
_CE_WEIGHT = torch.tensor([0.5, 2.0, 1.0], dtype=F64)


def _chunked_ce(reduction, **kw):
    opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2, allow_retain_graph=True)
    return lambda x, w, b: F.linear_cross_entropy(x, w, _CE_TARGETS, linear_bias=b, reduction=reduction,
                                                  options=opts, **kw)


_BAG_IDX = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
_BAG_OFF = torch.tensor([0, 2, 2, 5])  # four bags, the second empty
_BAG_ROWS = torch.tensor([[1, 2, 4], [5, 4, 3], [2, 9, 9], [0, 0, 7]])


def _solution_times(res, name: str):
    # residuals and singular values have no gradient: their values scale the solution's
    return res.solution * getattr(res, name).sum(-1)[..., None, None]


def _ctc(lp, reduction):
    return F.ctc_loss(lp.log_softmax(-1), _TARGETS, _IN_LENS, _TGT_LENS, reduction=reduction)


def _ctc_tensor_lengths(lp):
    return F.ctc_loss(lp.log_softmax(-1), _TARGETS, torch.tensor(_IN_LENS), torch.tensor(_TGT_LENS))


# name -> (inputs, op, {layout label: placements of the inputs}); every layout's forward
# expected without a collective unless its label says "gathers" (reduced first or made
# whole by the rule).
CASES = {
    "multi_margin_loss none": (
        _scores,
        lambda x: F.multi_margin_loss(x, _CLASSES, reduction="none"),
        {"S0": [S0], "S1 gathers": [S1], "P gathers": [P]}),
    "multi_margin_loss mean weighted p=2": (
        _scores,
        lambda x: F.multi_margin_loss(x, _CLASSES, p=2, margin=0.7, weight=_WEIGHT),
        {"S0": [S0], "R": [R]}),
    "multi_margin_loss sum": (
        _scores,
        lambda x: F.multi_margin_loss(x, _CLASSES, reduction="sum"),
        {"S0": [S0]}),
    "multilabel_margin_loss mean": (
        _scores,
        lambda x: F.multilabel_margin_loss(x, _LABELS),
        {"S0": [S0], "S1 gathers": [S1]}),
    "multilabel_margin_loss none": (
        _scores,
        lambda x: F.multilabel_margin_loss(x, _LABELS, reduction="none"),
        {"S0": [S0]}),
    "cdist": (
        lambda g: [torch.randn(3, 5, 4, generator=g, dtype=F64), torch.randn(3, 6, 4, generator=g, dtype=F64)],
        lambda a, b: torch.cdist(a, b),
        {"batch S0,S0": [S0, S0], "x1 rows S1,R": [S1, R], "x2 rows R,S1": [R, S1], "features S2,S2 gathers": [S2, S2]}),
    "cdist p=1": (
        lambda g: [torch.randn(5, 4, generator=g, dtype=F64), torch.randn(6, 4, generator=g, dtype=F64)],
        lambda a, b: torch.cdist(a, b, p=1.0),
        {"x1 rows S0,R": [S0, R], "x2 rows R,S0": [R, S0]}),
    "cdist by matrix products": (  # p=2 past 25 rows: torch's _euclidean_dist, decomposed
        lambda g: [_randn(30, 4)(g), _randn(27, 4)(g)],
        lambda a, b: torch.cdist(a, b),
        {"x1 rows S0,R": [S0, R], "x2 rows R,S0": [R, S0]}),
    "bilinear": (
        lambda g: [_randn(5, 3)(g), _randn(5, 4)(g), _randn(6, 3, 4)(g), _randn(6)(g)],
        lambda a, b, w, bias: F.bilinear(a, b, w, bias),
        {"batch S0,S0,R,R": [S0, S0, R, R], "out features R,R,S0,S0": [R, R, S0, S0],
         "in features S1,R,S1,R": [S1, R, S1, R], "P,R,R,R": [P, R, R, R]}),
    "ctc_loss mean": (
        lambda g: [_randn(6, 4, 4)(g)],
        lambda lp: _ctc(lp, "mean"),
        {"batch S1": [S1], "frames S0 gathers": [S0]}),
    "ctc_loss none": (lambda g: [_randn(6, 4, 4)(g)], lambda lp: _ctc(lp, "none"), {"batch S1": [S1]}),
    "ctc_loss tensor lengths": (lambda g: [_randn(6, 4, 4)(g)], _ctc_tensor_lengths, {"batch S1": [S1]}),
    "chunked linear_cross_entropy mean": (
        lambda g: [_randn(5, 4)(g), _randn(3, 4)(g), _randn(3)(g)],
        _chunked_ce("mean", weight=_CE_WEIGHT, ignore_index=1),
        {"rows S0,R,R": [S0, R, R], "features S1,S1,R gathers": [S1, S1, R]}),
    "chunked linear_cross_entropy sum": (
        lambda g: [_randn(5, 4)(g), _randn(3, 4)(g), _randn(3)(g)],
        _chunked_ce("sum"),
        {"rows S0,R,R": [S0, R, R]}),
    "lstsq": (
        lambda g: [_randn(3, 5, 4)(g), _randn(3, 5, 2)(g)],
        lambda a, b: torch.linalg.lstsq(a, b).solution,
        {"batch S0,S0": [S0, S0], "batch S0,R": [S0, R], "rows S1,S1 gathers": [S1, S1]}),
    "lstsq vector gelsd": (
        lambda g: [_randn(3, 2, 3, 4)(g), _randn(3, 2, 3)(g)],  # m < n: no residuals
        lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd").solution,
        {"batch S1,S1": [S1, S1]}),
    "lstsq singular values gelss": (
        lambda g: [_randn(3, 3, 4)(g), _randn(3, 3, 2)(g)],
        lambda a, b: _solution_times(torch.linalg.lstsq(a, b, driver="gelss"), "singular_values"),
        {"batch S0,S0": [S0, S0]}),
    "lstsq residuals gelsd": (  # present only if every matrix has full rank: computed whole
        lambda g: [_randn(3, 5, 4)(g), _randn(3, 5, 2)(g)],
        lambda a, b: _solution_times(torch.linalg.lstsq(a, b, driver="gelsd"), "residuals"),
        {"batch S0,S0 gathers": [S0, S0]}),
    "embedding_bag sum weighted": (
        lambda g: [_randn(10, 5)(g), _randn(8)(g)],
        lambda w, psw: F.embedding_bag(_BAG_IDX, w, _BAG_OFF, mode="sum", per_sample_weights=psw),
        {"columns S1,R": [S1, R], "vocab S0,R": [S0, R], "P,R gathers": [P, R]}),
    "embedding_bag max": (
        lambda g: [_randn(10, 5)(g)],
        lambda w: F.embedding_bag(_BAG_ROWS, w, mode="max"),
        {"columns S1": [S1], "vocab S0 gathers": [S0]}),
    "embedding_bag mean padding_idx": (
        lambda g: [_randn(10, 5)(g)],
        lambda w: F.embedding_bag(_BAG_IDX, w, _BAG_OFF, mode="mean", padding_idx=2),
        {"columns S1": [S1], "vocab S0": [S0]}),
    "embedding_bag sum include_last_offset padding_idx": (
        lambda g: [_randn(10, 5)(g)],
        lambda w: F.embedding_bag(_BAG_IDX, w, torch.tensor([0, 3, 3, 8]), include_last_offset=True, padding_idx=4),
        {"vocab S0": [S0]}),
    "index_reduce prod": (
        lambda g: [_randn(4, 5)(g), _randn(6, 5)(g)],
        lambda x, src: x.index_reduce(0, _INDEX, src, "prod"),
        {"S1,S1": [S1, S1], "S1,R": [S1, R], "S0,R gathers": [S0, R]}),
    "index_reduce amax": (
        lambda g: [_randn(5, 4)(g), _randn(5, 6)(g)],
        lambda x, src: x.index_reduce(1, _INDEX, src, "amax", include_self=False),
        {"S0,S0": [S0, S0]}),
    "segment_reduce sum": (
        lambda g: [_randn(6, 5)(g)],
        lambda x: torch.segment_reduce(x, "sum", lengths=_LENGTHS),
        {"S1": [S1], "S0 gathers": [S0]}),
    "segment_reduce max": (
        lambda g: [_randn(6, 5)(g)],
        lambda x: torch.segment_reduce(x, "max", lengths=_LENGTHS, unsafe=True, initial=0.0),
        {"S1": [S1]}),
}

# (case, layout) -> collectives of the forward, where a kept shard needs some
COMMS = {
    # the total weight of the targets, one scalar
    ("chunked linear_cross_entropy mean", "rows S0,R,R"): 1,
}

# (case, layout) -> placements of the result
PLACEMENTS = {
    ("multi_margin_loss none", "S0"): "(Shard(0),)",
    ("multi_margin_loss mean weighted p=2", "S0"): "(Partial('sum'),)",
    ("multi_margin_loss sum", "S0"): "(Partial('sum'),)",
    ("multilabel_margin_loss mean", "S0"): "(Partial('sum'),)",
    ("multilabel_margin_loss none", "S0"): "(Shard(0),)",
    ("cdist", "batch S0,S0"): "(Shard(0),)",
    ("cdist", "x1 rows S1,R"): "(Shard(1),)",
    ("cdist", "x2 rows R,S1"): "(Shard(2),)",
    ("cdist p=1", "x1 rows S0,R"): "(Shard(0),)",
    ("cdist p=1", "x2 rows R,S0"): "(Shard(1),)",
    ("cdist by matrix products", "x1 rows S0,R"): "(Shard(0),)",
    ("cdist by matrix products", "x2 rows R,S0"): "(Shard(1),)",
    ("bilinear", "batch S0,S0,R,R"): "(Shard(0),)",
    ("bilinear", "out features R,R,S0,S0"): "(Shard(1),)",
    ("bilinear", "P,R,R,R"): "(Partial('sum'),)",  # linear in each input: passes through
    ("bilinear", "in features S1,R,S1,R"): "(Partial('sum'),)",  # a pending sum, the bias added once
    ("ctc_loss none", "batch S1"): "(Shard(0),)",
    ("ctc_loss mean", "batch S1"): "(Partial('sum'),)",
    ("ctc_loss tensor lengths", "batch S1"): "(Partial('sum'),)",
    ("chunked linear_cross_entropy mean", "rows S0,R,R"): "(Partial('sum'),)",
    ("chunked linear_cross_entropy sum", "rows S0,R,R"): "(Partial('sum'),)",
    ("lstsq", "batch S0,S0"): "(Shard(0),)",
    ("lstsq", "batch S0,R"): "(Shard(0),)",
    ("lstsq vector gelsd", "batch S1,S1"): "(Shard(1),)",
    ("lstsq singular values gelss", "batch S0,S0"): "(Shard(0),)",
    ("embedding_bag sum weighted", "columns S1,R"): "(Shard(1),)",
    ("embedding_bag sum weighted", "vocab S0,R"): "(Partial('sum'),)",
    ("embedding_bag mean padding_idx", "vocab S0"): "(Partial('sum'),)",
    ("embedding_bag sum include_last_offset padding_idx", "vocab S0"): "(Partial('sum'),)",
    ("embedding_bag max", "columns S1"): "(Shard(1),)",
    ("embedding_bag mean padding_idx", "columns S1"): "(Shard(1),)",
    ("index_reduce prod", "S1,S1"): "(Shard(1),)",
    ("index_reduce prod", "S1,R"): "(Shard(1),)",
    ("index_reduce amax", "S0,S0"): "(Shard(0),)",
    ("segment_reduce sum", "S1"): "(Shard(1),)",
    ("segment_reduce max", "S1"): "(Shard(1),)",
}


def _place(t, mesh, p):
    if p.is_partial():  # an addend per rank (halves: exact in float64)
        return ShardedTensor.from_local(t / dist.get_world_size(), mesh, [p], shape=t.shape, stride=_strides(t.shape))
    return distribute(t, mesh, [p])


def eager() -> dict:
    """Every case and layout: values and input gradients equal dense; the result's placements,
    the collectives of the forward and the overloads that took the fallback (forward and
    backward)."""
    mesh = _mesh()
    out: dict = {}
    for n, (name, (make, fn, layouts)) in enumerate(CASES.items()):
        g = torch.Generator().manual_seed(30 + n)
        ins = make(g)
        dense = [t.clone().requires_grad_(True) for t in ins]
        ref = fn(*dense)
        w = torch.randn(ref.shape, generator=g, dtype=ref.dtype)
        (ref * w).sum().backward()
        for label, pls in layouts.items():
            args = [_place(t, mesh, p).requires_grad_(True) for t, p in zip(ins, pls)]
            gathered_ops().clear()
            with Comms() as comms:
                y = fn(*args)
            close(y.full_tensor(), ref.detach(), msg=f"{name} {label}")
            (y * w).sum().backward()
            for i, (a, d) in enumerate(zip(args, dense)):
                close(a.grad.full_tensor(), d.grad, msg=f"{name} {label}: gradient of input {i}")
            out[f"{name} {label}"] = {
                "placements": repr(tuple(y.placements)),
                "comms": comms.total(),
                "gathered": sorted(map(str, gathered_ops())),
            }
    return out


def scaled_mm() -> dict:
    """float8 ``_scaled_mm`` (no gradient) with row-wise and column-wise scales and a bias:
    a's rows or b's columns sharded stay, with no collective; a shard of the contraction is
    made whole by the rule. Values equal dense; the result's placements and collectives."""
    mesh = _mesh()
    g = torch.Generator().manual_seed(50)
    A = torch.randn(5, 16, generator=g).to(torch.float8_e4m3fn)
    B = torch.randn(6, 16, generator=g).to(torch.float8_e4m3fn).t()  # column-major, as required
    SA, SB = torch.rand(5, 1, generator=g) + 0.5, torch.rand(1, 6, generator=g) + 0.5
    bias = torch.randn(6, generator=g).to(torch.bfloat16)

    def fn(a, b, sa, sb, bias):
        return torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)

    want = fn(A, B, SA, SB, bias)
    out = {}
    for label, pls in {"rows": [S0, R, S0, R, R], "columns": [R, S1, R, S1, S0], "contraction": [S1, S0, R, R, R],
                       "rows, plain scales": [S0, R, R, R, R]}.items():
        args = [distribute(t, mesh, [p]) if not (p.is_replicate() and "plain" in label) else t
                for t, p in zip((A, B, SA, SB, bias), pls)]
        gathered_ops().clear()
        with Comms() as comms:
            y = fn(*args)
        close(y.full_tensor(), want, msg=f"_scaled_mm {label}")
        out[label] = (repr(tuple(y.placements)), comms.total(), sorted(map(str, gathered_ops())))
    # _scaled_mm_v2: the scales in lists, with their recipes (1: row-wise) and swizzles (0: none)
    rowwise = [1]
    want = torch.ops.aten._scaled_mm_v2(A, B, [SA], rowwise, [0], [SB], rowwise, [0], bias, torch.bfloat16)
    for label, (pa, pb) in {"v2 rows": (S0, R), "v2 columns": (R, S1)}.items():
        a, b = distribute(A, mesh, [pa]), distribute(B, mesh, [pb])
        sa, sb = distribute(SA, mesh, [pa]), distribute(SB, mesh, [pb])
        gathered_ops().clear()
        with Comms() as comms:
            y = torch.ops.aten._scaled_mm_v2(a, b, [sa], rowwise, [0], [sb], rowwise, [0], bias, torch.bfloat16)
        close(y.full_tensor(), want, msg=f"_scaled_mm_v2 {label}")
        out[label] = (repr(tuple(y.placements)), comms.total(), sorted(map(str, gathered_ops())))
    return out


def compiled(backend: str) -> dict:
    """A batch-sharded margin loss, a row-sharded cdist, a batch-sharded bilinear and an
    embedding_bag of a column-sharded table, compiled (fullgraph) into one function: one graph,
    value and gradients equal dense on two sets of values, no fallback."""
    mesh = _mesh()

    def step(x, y, wb, table):
        return (F.multi_margin_loss(x, _CLASSES) + torch.cdist(x, y).mean() + F.bilinear(x, x, wb).tanh().sum()
                + F.embedding_bag(_BAG_IDX, table, _BAG_OFF, mode="mean").pow(2).sum())

    cnt = CompileCounterWithBackend(backend)
    run = torch.compile(step, backend=cnt, fullgraph=True)
    gathered_ops().clear()
    for seed in (40, 41):
        g = torch.Generator().manual_seed(seed)
        dense = [_randn(5, 4)(g), _randn(3, 4)(g), _randn(2, 4, 4)(g), _randn(10, 5)(g)]
        ds = [t.clone().requires_grad_(True) for t in dense]
        ref = step(*ds)
        ref.backward()
        xs = [distribute(t, mesh, [p]).requires_grad_(True) for t, p in zip(dense, (S0, R, R, S1))]
        loss = run(*xs)
        close(loss.full_tensor(), ref.detach(), msg=f"compiled, seed {seed}")
        loss.backward()
        for i, (x, d) in enumerate(zip(xs, ds)):
            close(x.grad.full_tensor(), d.grad, msg=f"compiled grad of input {i}, seed {seed}")
    return {"frames": cnt.frame_count, "gathered": sorted(map(str, gathered_ops())),
            "table grad": repr(tuple(xs[3].grad.placements))}
