"""``data_parallel`` (SimpleFSDP's design on ShardedTensor): FSDP, DDP, HSDP and FSDP+TP on 4
gloo ranks train torch's TP-test Transformer as the dense model does (eager and compiled),
with the same collectives in the compiled forward and backward as the same design on
torch's DTensor; mixed precision gathers in bf16 and reduces in fp32; docs/data_parallel.md
runs; bad input is refused."""

from __future__ import annotations

import copy
import functools
import pathlib

import pytest
import torch

from kit_helpers.docs import NEEDS_PG, check_printed, plan, run_blocks
from kit_helpers.harness import world
from subclass_kit.sharded import MeshRef, ParallelizeError, Partial, Replicate, Shard, data_parallel, distribute
from subclass_kit.sharded._dp_bucket import gather_bucket

from sharded import _dp_tasks

TIMEOUT = 900.0
DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "data_parallel.md"
AG, RS, AR = "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"


def _kinds(graphs: dict) -> set:
    return {k.split()[0] for k in graphs}


def _no_more_than_dtensor(coll: dict) -> None:
    """The kit's compiled graphs use the collectives DTensor's do (kinds and dtypes), no
    more of them and no more elements on the wire."""
    for kind in ("fw", "bw"):
        kit, dt = coll["kit"][kind], coll["dtensor"][kind]
        assert set(kit) == set(dt), (kind, coll)
        for key, (n, elems) in kit.items():
            assert n <= dt[key][0] and elems <= dt[key][1], (kind, key, coll)


def _count(graphs: dict, kind: str) -> int:
    return sum(n for k, (n, _) in graphs.items() if k.split()[0] == kind)


# ---- in process --------------------------------------------------------------------------------
def test_redistribute_dtypes_and_grad_placements_on_one_rank():
    m = MeshRef.local()
    w = distribute(torch.randn(4, 3), m, [Replicate()]).requires_grad_(True)
    y = w.redistribute(m, [Replicate()], forward_dtype=torch.bfloat16, backward_dtype=torch.float32)
    assert y.dtype == torch.bfloat16 and y.to_local().dtype == torch.bfloat16
    y.to_local(grad_placements=[Partial("avg")]).float().sum().backward()
    # The Partial gradient of a Replicate -> Replicate move is reduced by its backward, and
    # returns in the parameter's dtype.
    assert w.grad.placements == (Replicate(),) and w.grad.dtype == torch.float32
    w.grad = None
    w.full_tensor(grad_placements=[Partial()]).sum().backward()
    assert w.grad.placements == (Replicate(),)
    torch.testing.assert_close(w.grad.full_tensor(), torch.ones(4, 3))


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ParallelizeError, match=r"mode='zero3' is not one of 'fully_shard', 'replicate', 'hybrid_shard'"):
        data_parallel(torch.nn.Linear(2, 2), MeshRef.local(), mode="zero3")
    with pytest.raises(ParallelizeError, match=r"needs a 2-D mesh, got a 1-D one"):
        data_parallel(torch.nn.Linear(2, 2), MeshRef.local(), mode="hybrid_shard")
    lin = data_parallel(torch.nn.Linear(2, 2), MeshRef.local())
    with pytest.raises(ParallelizeError, match="already data parallel"):
        data_parallel(lin, MeshRef.local())


def test_tied_parameters_stay_tied():
    model = torch.nn.Sequential(torch.nn.Embedding(4, 3), torch.nn.Linear(3, 4, bias=False))
    model[1].weight = model[0].weight
    data_parallel(model, MeshRef.local(), mode="fully_shard")
    assert model[0]._parameters["weight"] is model[1]._parameters["weight"]
    assert len(list(model.parameters())) == 1


class _Shared(torch.nn.Module):
    """A module held by the root and by a block (the block's unit gathers it: its first place)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(5, 4)
        head = torch.nn.Linear(4, 4)
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 4)),
                                           torch.nn.Sequential(head)])
        self.head = head

    def forward(self, ids):
        h = self.emb(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def test_shared_module_compiled_matches_dense():
    torch.manual_seed(0)
    dense = _Shared()
    model = data_parallel(copy.deepcopy(dense), MeshRef.local(), mode="replicate")
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    ids = torch.tensor([[0, 3, 1], [4, 2, 2]])
    for net in (dense, compiled):
        net(ids).square().sum().backward()
    torch.testing.assert_close(compiled(ids), dense(ids))
    for (name, d), k in zip(dense.named_parameters(), model.parameters()):
        torch.testing.assert_close(k.grad.full_tensor(), d.grad, msg=name)


def test_a_unit_of_mixed_dtypes_computes_each_in_its_own():
    # One bucket moves a float32 and a float64 Linear: each is gathered back in its own dtype,
    # so the model (eager and compiled) computes as the dense one, gradients in each dtype.
    torch.manual_seed(0)
    dense = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2).double())
    model = data_parallel(copy.deepcopy(dense), MeshRef.local(), mode="fully_shard")
    x = torch.randn(5, 3)

    def run(net):
        return net[1](net[0](x).double())

    want = run(dense)
    want.sum().backward()
    for fn in (run, torch.compile(run, backend="aot_eager", fullgraph=True)):
        for p in model.parameters():
            p.grad = None
        got = run(model) if fn is run else fn(model)
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want)
        got.sum().backward()
        for (name, p), q in zip(model.named_parameters(), dense.parameters()):
            assert p.grad.dtype == q.dtype, name
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, msg=name)
    with pytest.raises(TypeError, match="every parameter must be a ShardedTensor"):
        gather_bucket(model._kit_unit.bucket, [torch.ones(4, 3)] * 4)


# ---- on 4 ranks --------------------------------------------------------------------------------
_EXPECTED = {  # the collective kinds each mode needs, forward and backward
    "fully_shard": ({AG}, {RS}),
    "replicate": (set(), {AR}),
    "hybrid_shard": ({AG}, {RS, AR}),
    "fsdp+tp": ({AG, AR}, {RS, AR}),  # TP's own all-reduces beside FSDP's gather / reduce-scatter
}


@pytest.mark.dist
@pytest.mark.parametrize("mode", list(_EXPECTED))
def test_mode_matches_dense_and_dtensor_collectives(mode):
    r = world(4).run(_dp_tasks.train_modes, mode, timeout=TIMEOUT)[0]
    coll = r["collectives"]
    # The compiled graphs communicate as the same design on DTensor does (the same kinds of
    # collective, in the same dtypes, the gradient reduction in the backward), but one
    # collective per unit (the root and each block) where DTensor has one per parameter.
    _no_more_than_dtensor(coll)
    # One forward and one backward graph over the steps (no recompile), as DTensor's.
    assert r["graphs"]["kit"] == r["graphs"]["dtensor"] == [1, 1], r["graphs"]
    fw, bw = _EXPECTED[mode]
    assert _kinds(coll["kit"]["fw"]) == fw and _kinds(coll["kit"]["bw"]) == bw, coll
    units = 1 + _dp_tasks._args().n_layers
    dp_kinds = {"fully_shard": ((AG,), (RS,)), "replicate": ((), (AR,)), "hybrid_shard": ((AG,), (RS, AR))}
    for kind, dp in zip(("fw", "bw"), dp_kinds.get(mode, ((), ()))):
        for name in dp:
            assert _count(coll["kit"][kind], name) == units < _count(coll["dtensor"][kind], name), (kind, name, coll)
    if mode == "fsdp+tp":
        assert _count(coll["kit"]["fw"], AG) < _count(coll["dtensor"]["fw"], AG), coll
        assert _count(coll["kit"]["bw"], RS) < _count(coll["dtensor"]["bw"], RS), coll
    # The copy-in and the copy-out are the kit's ops, one per unit, so inductor calls them
    # rather than generating a kernel per parameter (aten's forms never reach the graph).
    copies = r["copy ops"]
    sharded = mode != "replicate"
    assert copies["fw"] == {"subclass_kit.dp_copy_in.default": units * sharded, "subclass_kit.dp_copy_out.default": units * sharded,
                            "aten._chunk_cat.default": 0, "aten.split_with_sizes_copy.default": 0}, copies
    assert copies["bw"] == {"subclass_kit.dp_copy_in.default": units, "subclass_kit.dp_copy_out.default": 0,
                            "aten._chunk_cat.default": 0, "aten.split_with_sizes_copy.default": 0}, copies
    # Eager: every gradient is reduced into the parameter's own layout (never left Partial).
    assert r["grad placements"] == r["stored placements"], r
    if mode == "replicate":
        assert r["stored placements"] == [repr((Replicate(),))]
    if mode == "fsdp+tp":
        # A TP parameter is stored on the (dp, tp) mesh: a Colwise weight's dim 0 split by
        # dp on top of TP's split (the strided layout), a Rowwise weight (Shard(0), Shard(1)).
        assert {"(_StridedShard(dim=0, sf=2), Shard(0))", "(Shard(0), Shard(1))"} <= set(r["stored placements"]), r


@pytest.mark.dist
def test_mixed_precision_gathers_bf16_reduces_fp32():
    r = world(4).run(_dp_tasks.train_modes, "fully_shard", True, timeout=TIMEOUT)[0]
    coll = r["collectives"]
    _no_more_than_dtensor(coll)
    assert set(coll["kit"]["fw"]) == {f"{AG} bfloat16"}, coll
    assert set(coll["kit"]["bw"]) == {f"{RS} float32"}, coll


@pytest.mark.dist
@pytest.mark.slow
def test_fully_shard_inductor_matches_dense():
    # On 2 ranks: each rank compiles with inductor, and the machine has 2 cores (the modes'
    # layouts and collectives are checked on 4 ranks above, through aot_eager).
    world(2).run(_dp_tasks.train_modes, "fully_shard", False, "inductor", timeout=TIMEOUT)


# ---- the page ----------------------------------------------------------------------------------
_run = functools.partial(run_blocks, doc_name=DOC.name, module="docs_data_parallel")


def test_page_blocks_in_process():
    codes, checks = plan(DOC, NEEDS_PG, marked=False)
    assert len(codes) >= 1 and len(checks) == len(codes)
    check_printed(_run(codes), codes, checks, doc_name=DOC.name, who="this process")


@pytest.mark.dist
def test_page_blocks_on_two_ranks():
    codes, checks = plan(DOC, NEEDS_PG, marked=True)
    assert len(codes) >= 3 and len(checks) == len(codes)
    printed = world(2).run(_run, codes, timeout=300.0)[0]
    check_printed(printed, codes, checks, doc_name=DOC.name, who="rank 0")


@pytest.mark.dist
def test_uneven_shards_in_units_match_dense():
    for mode in ("fully_shard", "hybrid_shard"):
        world(4).run(_dp_tasks.uneven_shards, mode, timeout=TIMEOUT)
