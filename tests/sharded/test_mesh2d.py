"""The rule families on a 2-D (2, 2) mesh of 4 gloo ranks: each rule decides per mesh dim, so
a shard it keeps on one mesh dim must survive a Replicate, a Partial or another shard --
kept or gathered -- on the other. One representative op per family (pooling,
interpolation, fft, batched linear algebra, convolution, shared dims -- bilinear, cdist, a
margin loss, embedding_bag --, batch norm, var/std over sharded dims, median/kthvalue/mode
along a dim, decompositions, random ops) on mixed layouts, values
and gradients equal to dense (checked on every rank), the collectives each rule claims to
avoid counted, one aot_eager compile per family; and a few layouts of the other families
(embedding, layer/group norm, softmax, cross-entropy, attention). Every test shares one
spawned world.

Layouts that shard one tensor dim on both mesh dims are tested in test_layouts.py; no rule
may produce one: two rules did (a matrix product contracting over a dim sharded on both
mesh dims, a convolution backward with the batch sharded by the input on one mesh dim and
by the incoming gradient on the other) and gave wrong values; the cases below pin them."""

from __future__ import annotations

import pytest

from kit_helpers.harness import world

from sharded import _mesh2d_tasks as T

pytestmark = pytest.mark.dist

TIMEOUT = 300.0

ONE_GATHER = {"all_gather_into_tensor": 1}
ONE_REDUCE = {"all_reduce": 1}
NONE: dict = {}

# case -> (result placements, forward collectives): each from the rule's documented layout
# per mesh dim (a kept shard or a linear op's pending sum moves nothing; a gathered mesh dim
# is one all-gather; a Partial a non-linear op needs whole is one all-reduce).
EXPECT = {
    # independent dims: N and C kept on both mesh dims; a pooled or transformed dim gathered
    "avg_pool2d S0,S1": ("(Shard(0), Shard(1))", NONE),
    "avg_pool2d R,S1": ("(Replicate(), Shard(1))", NONE),
    "avg_pool2d S1,S3": ("(Shard(1), Replicate())", ONE_GATHER),
    "avg_pool2d S1,P": ("(Shard(1), Partial('sum'))", NONE),
    "avg_pool2d P,P": ("(Partial('sum'), Partial('sum'))", NONE),
    "avg_pool2d P,S3": ("(Partial('sum'), Replicate())", ONE_GATHER),
    "avg_pool2d Pmax,S1": ("(Replicate(), Shard(1))", ONE_REDUCE),
    "avg_pool2d N=1 S0,S1": ("(Replicate(), Shard(1))", ONE_GATHER),  # 1 sample over 2 ranks
    "avg_pool2d Pavg,S1": ("(Partial('avg'), Shard(1))", NONE),
    "fft Pavg,S0": ("(Partial('avg'), Shard(0))", NONE),
    "conv2d x Pavg,S0": ("(Replicate(), Shard(0))", ONE_REDUCE),
    "var dim1 S0,Pavg": ("(Shard(0), Replicate())", ONE_REDUCE),
    "max_pool2d S0,P": ("(Shard(0), Replicate())", ONE_REDUCE),
    "max_pool2d S2,S1": ("(Replicate(), Shard(1))", ONE_GATHER),
    "fractional_max_pool2d S0,S1": ("(Shard(0), Shard(1))", NONE),
    "interpolate S0,S1": ("(Shard(0), Shard(1))", NONE),
    "interpolate P,S0": ("(Partial('sum'), Shard(0))", NONE),
    "fft S0,S1": ("(Shard(0), Shard(1))", NONE),
    "fft S3,S0": ("(Replicate(), Shard(0))", ONE_GATHER),
    "fft n=8 norm S1,S0": ("(Shard(1), Shard(0))", NONE),
    "fft2 S1,P": ("(Shard(1), Partial('sum'))", NONE),  # the cast to complex keeps the sum too
    "irfft P,S1": ("(Partial('sum'), Shard(1))", NONE),
    "pixel_shuffle S0,S1": ("(Shard(0), Replicate())", ONE_GATHER),
    "grid_sample x S0,R grid R,S0": ("(Shard(0), Replicate())", ONE_GATHER),
    # the factorizations check their info gathered over both mesh dims (small all-gathers)
    "inv S0,S1": ("(Shard(0), Shard(1))", None),
    "inv S2,S1": ("(Replicate(), Shard(1))", None),
    "inv P,S0": ("(Replicate(), Shard(0))", None),
    "lu_factor S1,S0": ("(Shard(1), Shard(0))", None),
    "solve A S0,S1 B S1,S0": ("(Shard(0), Shard(1))", None),
    # convolution: the batch on one mesh dim, the weight's out-channels on the other
    "conv2d x S0,R w R,S0": ("(Shard(0), Shard(1))", NONE),
    "conv2d x R,S0 w S0,R b S0,R": ("(Shard(1), Shard(0))", NONE),
    "conv_transpose2d x S0,R w R,S1": ("(Shard(0), Shard(1))", NONE),
    "conv2d x R,S0 w R,S0": ("(Replicate(), Shard(0))", ONE_GATHER),  # one mesh dim, one layout
    "conv2d x S0,R w S0,R": ("(Shard(0), Replicate())", ONE_GATHER),
    "conv2d x S0,S2": ("(Shard(0), Replicate())", ONE_GATHER),
    "conv2d x S0,S1": ("(Shard(0), Replicate())", ONE_GATHER),
    "conv2d x S0,P": ("(Shard(0), Replicate())", ONE_REDUCE),
    "conv2d x P,S0": ("(Replicate(), Shard(0))", ONE_REDUCE),
    "conv2d x S0,R grad R,S0": ("(Shard(0), Replicate())", NONE),
    "conv2d x S0,R w R,S0 grad S1,S0": ("(Shard(0), Shard(1))", NONE),
    # var / std over sharded dims: all-reduces only (checked below), the rows stay
    "var dim1 S0,S1": ("(Shard(0), Replicate())", None),
    "std dims01 S0,S1": ("(Replicate(), Replicate())", None),
    "var_mean dim0 S1,S0": ("(Shard(0), Replicate())", None),
    "std keepdim S2,S0": ("(Replicate(), Shard(0))", None),
    "var dims02 S2,S0": ("(Replicate(), Replicate())", None),
    "var dim1 S1,S0 grad S0,R": ("(Replicate(), Shard(0))", None),
    "var dim2 S0,S1": ("(Shard(0), Shard(1))", NONE),
    "std dim1 S0,P": ("(Shard(0), Replicate())", ONE_REDUCE),
    # along a dim: that dim's shard gathered, the other kept
    "median dim1 S0,S1": ("(Shard(0), Replicate())", ONE_GATHER),
    "median dim0 S1,S0": ("(Shard(0), Replicate())", ONE_GATHER),
    "median dim1 S0,R grad R,S0": ("(Shard(0), Replicate())", NONE),
    "kthvalue dim2 S0,S1": ("(Shard(0), Shard(1))", NONE),
    "mode dim2 S1,P": ("(Shard(1), Replicate())", ONE_REDUCE),  # round() is not linear
    "max dim1 S0,S2": ("(Shard(0), Shard(1))", NONE),
    # by positions along one dim: the other dims' shards stay
    "gather dim2 S1,S0": ("(Shard(1), Shard(0))", NONE),
    "scatter_add dim1 S0,S2": ("(Shard(0), Shard(2))", NONE),
    # decompositions, each step by its rule
    "mv S0,S1 x R,S0": ("(Shard(0), Partial('sum'))", NONE),
    "mv S0,S1 x S0,R": ("(Shard(0), Partial('sum'))", ONE_GATHER),
    "mv S1,R x R,S0": ("(Partial('sum'), Replicate())", ONE_GATHER),
    "mm a S1,R b R,S0": ("(Partial('sum'), Replicate())", ONE_GATHER),
    "smooth_l1 S0,S1": ("(Partial('sum'), Partial('sum'))", NONE),
    "hardswish S1,S0": ("(Shard(1), Shard(0))", NONE),
    "instance_norm S0,S1": ("(Shard(0), Replicate())", ONE_GATHER),
    "add S0,R + R,S0": ("(Shard(0), Replicate())", ONE_GATHER),
    "bmm a S2,R b R,S1": ("(Partial('sum'), Replicate())", ONE_GATHER),  # k picked once
    "baddbmm S0,S1": ("(Shard(0), Shard(1))", NONE),
    "bce S0,S1 vs S1,S0": ("(Partial('sum'), Partial('sum'))", None),  # the target relaid out
    "addmv S0,R": ("(Shard(0), Partial('sum'))", ONE_GATHER),
    # other families, on 2-D layouts
    "embedding S0,S1 table": ("(Partial('sum'), Shard(2))", NONE),  # vocab-parallel x columns
    "embedding R,S1 table": ("(Replicate(), Shard(2))", NONE),
    "layer_norm S0,S1": ("(Shard(0), Shard(1))", NONE),
    "softmax S0,S1": ("(Shard(0), Shard(1))", NONE),
    "group_norm S0,S1": ("(Shard(0), Replicate())", ONE_GATHER),
    "cross_entropy S0,S1": ("(Partial('sum'), Replicate())", None),
    "cross_entropy S0,R w": ("(Replicate(), Partial('sum'))", ONE_REDUCE),  # the total weight
    "sdpa heads,batch": ("(Shard(1), Shard(0))", None),
    # shared dims: one shared dim kept per mesh dim
    "bilinear a,b S0,R w R,S0": ("(Shard(0), Shard(1))", NONE),
    "cdist x1 S0,R x2 R,S0": ("(Shard(0), Shard(1))", NONE),
    "multi_margin_loss S0,P": ("(Partial('sum'), Replicate())", ONE_REDUCE),
    "embedding_bag w R,S1": ("(Replicate(), Shard(1))", NONE),
    "embedding_bag w S0,R sum": ("(Partial('sum'), Replicate())", NONE),  # vocab-parallel
    # an incoming gradient laid out otherwise
    "avg_pool2d S0,R grad R,S0": ("(Shard(0), Replicate())", NONE),
    "interpolate S1,R grad R,S1": ("(Shard(1), Replicate())", NONE),
    "max_pool2d S0,S1 grad S1,S0": ("(Shard(0), Shard(1))", NONE),
    "inv S0,R grad R,S0": ("(Shard(0), Replicate())", None),
}

# Cases whose backward claims no communication either: the kept shards carry through.
NO_COMM_BACKWARD = {
    "avg_pool2d S0,S1", "avg_pool2d R,S1", "interpolate S0,S1", "fft S0,S1", "fractional_max_pool2d S0,S1",
    "conv2d x S0,R w R,S0", "conv2d x R,S0 w S0,R b S0,R", "conv_transpose2d x S0,R w R,S1",
    "hardswish S1,S0", "smooth_l1 S0,S1", "mv S0,S1 x R,S0", "var dim2 S0,S1",
    # the backward of a reduction to values along a dim scatters into zeros: along that dim only
    "kthvalue dim2 S0,S1", "max dim1 S0,S2", "median dim1 S0,S1", "gather dim2 S1,S0",
    "scatter_add dim1 S0,S2", "baddbmm S0,S1", "layer_norm S0,S1", "softmax S0,S1", "embedding R,S1 table",
    # shared dims: each kept shard's gradient keeps it, or is a pending sum
    "bilinear a,b S0,R w R,S0", "cdist x1 S0,R x2 R,S0", "embedding_bag w R,S1",
    # a pooling backward reads its input's shape only: a pending sum of it is not reduced
    "avg_pool2d S1,P", "avg_pool2d P,P", "avg_pool2d Pavg,S1", "max_pool2d S0,P",
}


@pytest.fixture(scope="module")
def cases():
    assert set(EXPECT) == set(T.CASES)
    return world(4).run(T.eager, timeout=TIMEOUT)


def test_every_case_matches_dense_with_the_layout_each_rule_claims(cases):
    # (values and gradients were compared with dense on every rank)
    for name, (out, comms) in EXPECT.items():
        for rank, r in enumerate(cases):
            got = r[name]
            assert got["out"][0] == out, (name, rank, got["out"])
            assert got["gathered"] == [], (name, got)  # a rule ran, never the generic fallback
            if comms is not None:
                assert got["comms"] == comms, (name, rank, got["comms"])
            if name in NO_COMM_BACKWARD:
                assert got["backward comms"] == {}, (name, rank, got["backward comms"])


def test_var_std_over_sharded_dims_move_only_result_sized_sums(cases):
    for name in ("var dim1 S0,S1", "std dims01 S0,S1", "var_mean dim0 S1,S0", "std keepdim S2,S0", "var dims02 S2,S0"):
        for r in cases:
            got = r[name]
            assert set(got["comms"]) == {"all_gather_into_tensor"}, (name, got["comms"])
            # one all-gather of statistics per mesh dim that shards a reduced dim: four per
            # element of a local result, of at most the 2 ranks the first gather joined
            assert got["largest"]["all_gather_into_tensor"] <= 4 * 2 * got["result numel"], (name, got)


def test_factorizations_gather_only_their_info(cases):
    n_matrices = T._spd(T._g(0)).shape[:-2].numel()  # one info int per matrix
    for name in ("inv S0,S1", "lu_factor S1,S0"):
        for r in cases:
            got = r[name]
            assert set(got["comms"]) == {"all_gather_into_tensor"}, (name, got)
            assert got["largest"]["all_gather_into_tensor"] <= n_matrices, (name, got)


def test_the_kept_shards_gradients(cases):
    r = cases[0]
    # The incoming gradient laid out otherwise than the input and the indices: it moves (one
    # all-gather per mesh dim), not the two operands that agree.
    got = r["max_pool2d S0,S1 grad S1,S0"]
    assert got["backward comms"] == {"all_gather_into_tensor": 2} and got["grads"] == ["(Shard(0), Shard(1))"], got
    # batch on mesh dim 0, out-channels on mesh dim 1: the input's gradient is a pending sum
    # over the out-channels, the weight's over the samples, each keeping its own shard
    assert r["conv2d x S0,R w R,S0"]["grads"] == [
        "(Shard(0), Partial('sum'))", "(Partial('sum'), Shard(0))", "(Partial('sum'), Shard(0))"]
    assert r["conv2d x R,S0 w S0,R b S0,R"]["grads"] == [
        "(Partial('sum'), Shard(0))", "(Shard(0), Partial('sum'))", "(Shard(0), Partial('sum'))"]
    # bilinear, batch on mesh dim 0 and out-features on 1: the inputs' gradients sum over the
    # features, the weight's over the batch; cdist's likewise over the other point set
    assert r["bilinear a,b S0,R w R,S0"]["grads"] == ["(Shard(0), Partial('sum'))"] * 2 + ["(Partial('sum'), Shard(0))"]
    assert r["cdist x1 S0,R x2 R,S0"]["grads"] == ["(Shard(0), Partial('sum'))", "(Partial('sum'), Shard(0))"]
    for name in ("avg_pool2d S0,S1", "interpolate S0,S1", "fft S0,S1", "fractional_max_pool2d S0,S1"):
        assert r[name]["grads"] == ["(Shard(0), Shard(1))"], name


def test_batch_norm_training_moves_only_per_channel_sums():
    results = world(4).run(T.batch_norm, timeout=TIMEOUT)
    for r in results:
        for lname in ("S0,S2", "S2,S3", "R,S0"):
            got = r[lname]
            assert got["out"] == repr(T.BN_LAYOUTS[lname]), (lname, got)
            assert set(got["comms"]) <= {"all_reduce", "all_gather_into_tensor"}, (lname, got)
            assert max(got["largest"].values()) <= 4 * 2 * 5, (lname, got)  # statistics per channel
            assert got["gathered"] == [], lname
        # the rows are sharded on both mesh dims: the parameters' gradients are sums pending on both
        assert r["S0,S2"]["grads"][1:] == ["(Partial('sum'), Partial('sum'))"] * 2
        # channels on one mesh dim (no communication for them), the batch on the other
        got = r["S1,S0"]
        assert got["out"] == "(Shard(1), Shard(0))" and max(got["largest"].values()) <= 4 * 3, got
        assert got["grads"][1:] == ["(Shard(0), Partial('sum'))"] * 2
        # a Partial input is not linear in batch norm: reduced first (values equal dense)
        assert r["S0,P"]["gathered"] == []


def test_random_ops_give_the_dense_draw_on_2d_layouts():
    results = world(4).run(T.random_ops, timeout=TIMEOUT)
    for r in results:
        for name, got in r.items():
            assert got["comms"] == 0, (name, got)  # each rank draws and keeps its part
        assert r["dropout S0,S1"]["out"] == "(Shard(0), Shard(1))"
        assert r["normal_ S1,S0"]["out"] == "(Shard(1), Shard(0))"
        assert r["rand_like S1,S0"]["out"] == "(Shard(1), Shard(0))"
        assert r["randn_like S0,P"]["out"] == "(Shard(0), Replicate())"
        assert r["rand_like R,R"]["same on every rank"] is True


def test_every_2d_layout_redistributes_to_every_other_with_its_gradient():
    # Two mesh dims change at once (gathers last mesh dim first, then local chunks; a Partial
    # bound for a shard reduce-scatters), uneven chunks on both: the foundation of the rules.
    for r in world(4).run(T.redistribute_all, timeout=TIMEOUT):
        assert r == {"pairs": 14 * 14, "bad": []}, r


def test_a_failing_matrix_on_one_rank_of_four_raises_on_every_rank():
    results = world(4).run(T.errors_on_every_rank, timeout=TIMEOUT)
    for r in results:
        assert set(r.values()) == {"raised"}, r


def test_one_aot_eager_compile_per_family():
    results = world(4).run(T.compiled, "aot_eager", timeout=TIMEOUT)
    for r in results:
        assert set(r) == set(T.COMPILED)
        for name, got in r.items():
            assert got["frames"] == 1 and got["gathered"] == [], (name, got)
        assert r["independent"]["out"] == "(Shard(0), Shard(1))"
        assert r["conv"]["out"] == "(Shard(0), Shard(1))"
        assert r["batch_norm"]["out"] == "(Shard(0), Shard(2))"
        assert r["random"]["out"] == "(Shard(0), Shard(1))"
        assert r["shared_dims"]["out"] == "(Shard(0), Replicate())"


@pytest.mark.slow
def test_inductor_on_2d_layouts_matches_dense():
    # Pooling/interpolation/fft, a batch x out-channel convolution and batch norm on a batch
    # and a spatial shard, through inductor's kernels: values and gradients equal dense.
    names = ("independent", "conv", "batch_norm")
    for r in world(4).run(T.compiled, "inductor", names, timeout=TIMEOUT * 2):
        assert {n: got["frames"] for n, got in r.items()} == dict.fromkeys(names, 1), r
        assert all(got["gathered"] == [] for got in r.values()), r
