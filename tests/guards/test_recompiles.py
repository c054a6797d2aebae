"""explain_recompiles: dynamo's own reasons, opaque ones translated, beside the prediction."""

import logging
import socket

import pytest
import torch
from expecttest import assert_expected_inline

import guards
import symbolic
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor


def test_static_recompiles_counted_and_explained():
    f = lambda x: x * 2  # noqa: E731
    seq = [(torch.ones(4, 3),), (torch.ones(4, 3),), (torch.ones(5, 3),), (torch.ones(4, 3, dtype=torch.float64),)]
    r = guards.explain_recompiles(f, seq, dynamic=False)
    assert r.agrees and [c.compiled for c in r.calls] == [True, False, True, True]
    assert r.frame_count == r.compiles == 3  # dynamo's own CompileCounter
    assert_expected_inline(str(r), """\
3 compiles (predicted 3); agrees (backend=eager, dynamic=False)
call 0: compiled (predicted compile)
call 1: reused (predicted reuse)
call 2: compiled (predicted compile)
    dynamo: 0/0: tensor 'x' size mismatch at index 0. expected 4, actual 5
    kit:    entry 0: L['x'].size()[0]: expected 4, got 5
call 3: compiled (predicted compile)
    dynamo: 0/1: tensor 'x' dtype mismatch. expected Float, actual Double
    dynamo: 0/0: tensor 'x' dtype mismatch. expected Float, actual Double
    kit:    entry 1: L['x'].dtype: expected torch.float32, got torch.float64
    kit:    entry 0: L['x'].dtype: expected torch.float32, got torch.float64""")


def test_automatic_dynamic_is_predicted():
    f = lambda x: x + 1  # noqa: E731
    seq = [(torch.ones(n, 3),) for n in (4, 5, 6, 7, 1, 8)]
    r = guards.explain_recompiles(f, seq)  # dynamic=None: torch.compile's default
    assert r.agrees, str(r)
    assert [c.compiled for c in r.calls] == [True, True, False, False, True, False]
    assert r.calls[4].predicted_reasons[0] == "entry 1: L['x'].size()[0]: expected >= 2, got 1"


def test_metadata_reason_names_field_old_and_new():
    x32 = BlockScaled.from_float(torch.randn(64, 8), block=32)
    x16 = BlockScaled.from_float(torch.randn(64, 4), block=16)
    x16 = BlockScaled(x16.qdata.new_zeros(64, 8), x16.scale.new_ones(4, 1), block=16, dtype=torch.float32)
    r = guards.explain_recompiles(lambda x: x * 2, [(x32,), (x16,)], dynamic=False)
    assert r.agrees
    (reason,) = r.calls[1].reasons
    assert "___check_metadata_" in r.calls[1].raw_reasons[0]
    assert reason.startswith("0/0: L['x'].__tensor_flatten__()[1].block: expected 32, got 16 [dynamo: ___check_metadata_")


def test_nested_metadata_reason_names_the_path():
    a = TwoTensor(ScaledTensor.from_float(torch.randn(4, 3)), ScaledTensor.from_float(torch.randn(4, 3)))
    s = ScaledTensor.from_float(torch.randn(4, 3))
    b = TwoTensor(ScaledTensor.from_float(torch.randn(4, 3)),
                  ScaledTensor(s.qdata, s.scale, granularity="tensor", dtype=torch.float32))
    r = guards.explain_recompiles(lambda x: x * 2, [(a,), (b,)], dynamic=False)
    assert r.agrees
    assert r.calls[1].reasons[0].startswith(
        "0/0: L['x'].b.__tensor_flatten__()[1].granularity: expected 'row', got 'tensor' [dynamo: ___check_metadata_")
    assert r.calls[1].predicted_reasons == [
        "entry 0: L['x'].b.__tensor_flatten__()[1].granularity: expected 'row', got 'tensor'"]


def test_marked_kit_class_reuses_across_rows_until_scale_changes_shape():
    def mk(rows):
        x = BlockScaled.from_float(torch.randn(rows, 8), block=32)
        symbolic.mark_dynamic(x, 0)
        return x

    r = guards.explain_recompiles(lambda x: x * 2, [(mk(64),), (mk(90),), (mk(20),), (mk(30),)], dynamic=False)
    assert r.agrees, str(r)
    assert [c.compiled for c in r.calls] == [True, False, True, False]


def test_predicted_error_when_dynamo_refuses():
    x = torch.ones(8, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=16)
    y = torch.ones(20, 3)
    torch._dynamo.mark_dynamic(y, 0, min=2, max=16)
    logging.disable(logging.ERROR)
    try:
        r = guards.explain_recompiles(lambda t: t * 2, [(x,), (y,)], dynamic=False)
    finally:
        logging.disable(logging.NOTSET)
    assert r.agrees
    assert r.calls[1].error.startswith("ConstraintViolationError")
    assert "outside its marked range [2, 16]" in r.calls[1].predicted_error


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_dtensor_spec_reason_names_the_placement(mesh):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    a = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])
    b = distribute_tensor(torch.randn(4, 3), mesh, [Replicate()])
    gs = guards.build(a)
    assert gs.check(distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]))
    assert gs.explain(b) == [
        "L['x']._spec.placements: expected (Shard(dim=0),), got (Replicate(),)",
        "L['x']._spec.shard_order: expected (ShardOrderEntry(tensor_dim=0, mesh_dims=(0,)),), got ()",
    ]
    assert guards.cache_key(a) == guards.cache_key(distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)]))
    assert guards.cache_key(a) != guards.cache_key(b)
    r = guards.explain_recompiles(lambda x: x * 2, [(a,), (b,)], dynamic=False)
    assert r.agrees, str(r)
    (reason,) = r.calls[1].reasons
    assert "__dtensor_spec_" in r.calls[1].raw_reasons[0]
    assert reason.startswith("0/0: L['x']._spec.placements: expected (Shard(dim=0),), got (Replicate(),); "
                             "L['x']._spec.shard_order: expected (ShardOrderEntry(tensor_dim=0, mesh_dims=(0,)),), got () "
                             "[dynamo: __dtensor_spec_"), reason
