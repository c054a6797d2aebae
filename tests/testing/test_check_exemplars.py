"""check_subclass passes every built-in exemplar, and works on subclasses that do not use
the kit's base class (torch's TwoTensor, DTensor on a one-rank gloo group), reporting what
they lack."""

from __future__ import annotations

import socket

import pytest
import torch

from subclass_kit.cli import builtin_targets
from subclass_kit.testing import check_subclass

EXEMPLARS = builtin_targets()


def test_exemplars_are_found():
    labels = [label for label, _ in EXEMPLARS]
    for name in ("TwoTensor", "ScaledTensor", "BlockScaled"):
        assert f"subclass_kit.examples:{name}" in labels


def _local(label: str) -> bool:
    return label.startswith("subclass_kit.examples:")


@pytest.mark.parametrize("cls", [c for label, c in EXEMPLARS if _local(label)], ids=lambda c: c.__name__)
def test_exemplar_passes(cls):
    report = check_subclass(cls, backends=("eager", "aot_eager"))
    report.raise_if_failed()
    # The kit's classes have every optional hook, so nothing is reported as lacking.
    assert report.row("protocol.optional_hooks").message == "has every optional hook the checker uses"
    assert report.row("compile[aot_eager]").status == "pass"
    assert report.row("identity.stable_hash").status == "pass"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's own
def test_exemplars_pass_with_inductor():
    classes = [c for label, c in EXEMPLARS if _local(label)]
    report = check_subclass(classes, backends=("inductor",), only=["compile[inductor]", "backward.compiled"])
    report.raise_if_failed()
    passed = [(r.subject, r.name) for r in report.rows if r.status == "pass"]
    for c in classes:
        assert (c.__name__, "compile[inductor]") in passed
        assert (c.__name__, "backward.compiled[inductor]") in passed


def test_torch_two_tensor_passes_and_lacks_are_reported():
    from torch.testing._internal.two_tensor import TwoTensor

    def samples():
        return [TwoTensor(torch.randn(4, 6), torch.randn(4, 6)), TwoTensor(torch.randn(5, 3), torch.randn(5, 3))]

    report = check_subclass(samples, backends=("eager", "aot_eager"))
    report.raise_if_failed()
    lacks = report.row("protocol.optional_hooks").message
    for hook in ("to_plain", "__inner_shapes__", "_stable_hash_for_caching"):
        assert hook in lacks
    assert "no to_plain" in report.row("eager[aten.add.Tensor(x, x)]").message
    assert report.row("compile.meta_change[aot_eager]").status == "skip"
    assert "torch's default hash" in report.row("identity.stable_hash").message


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=__import__("datetime").timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_dtensor_on_one_rank_is_checked_and_its_gaps_named(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    samples = [distribute_tensor(torch.randn(4, 6), mesh, [Shard(0)]), distribute_tensor(torch.randn(4, 6), mesh, [Replicate()])]
    report = check_subclass(samples, backends=("aot_eager",))
    status = {r.name: r.status for r in report.rows}
    for name in ("protocol.round_trip_symbolic", "ctx.hashable", "ctx.immutable", "compile.dynamic_sweep[aot_eager]",
                 "compile.meta_change[aot_eager]", "backward.compiled[aot_eager]", "serialization.save_load"):
        assert status[name] == "pass", (name, report.row(name).message)
    # What DTensor lacks: returning a view of a compiled input needs as_strided, which it refuses.
    row = report.row("compile[aot_eager]")
    assert row.status == "fail" and "as_strided" in row.message and "DTensor" in row.message
    assert "to_plain" in report.row("protocol.optional_hooks").message
    # Its mesh rides along as an opaque inner value, which cannot go to another process.
    assert report.row("identity.stable_hash").status == "skip"
