"""Bad values named where they enter: construction and ``torch.load`` (issues 21 and 23).

Each test failed on main before this change: the value was accepted silently (a cuda
wrapper over CPU tensors, ``block=True``, a forged checkpoint, ``os.system`` in
``__safe_globals__``), or surfaced later as a raw error (``block=0``: ZeroDivisionError).
"""

from __future__ import annotations

import io
import os
import warnings

import pytest
import torch
from expecttest import assert_expected_inline

from subclass_kit import (
    CheckpointError,
    MetaTypeError,
    MetaValueError,
    OuterArgumentError,
    OuterDtypeWarning,
    UnsafeGlobalError,
    WrapperTensor,
    fallbacks,
    inner,
    serialization,
)
from subclass_kit._flatten import rebuild
from subclass_kit.examples import BlockScaled, TwoTensor
from subclass_kit.sharded import MeshError
from subclass_kit.sharded.mesh import MeshRef

from kit_helpers.nf4 import NF4, _quantize


# ---- the outer dtype of an integer primary (issue 23, item 4) --------------------------------


class NF4WithDefault(NF4):
    """NF4 that says once what its outer dtype is."""

    __default_dtype__ = torch.bfloat16


def test_a_forgotten_dtype_over_an_integer_primary_is_named():
    x = torch.randn(256, 128)
    parts = _quantize(x)
    with pytest.warns(OuterDtypeWarning) as caught:
        w = NF4(*parts, size=x.shape)
    assert w.dtype == torch.uint8  # what the author got, silently, before
    msg = str(caught[0].message)
    assert "NF4 was built without dtype=" in msg and "Pass dtype=torch.float32" in msg
    assert caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", OuterDtypeWarning)
        ok = NF4(*parts, size=x.shape, dtype=torch.float32)
        assert torch.allclose(torch.nn.functional.linear(torch.randn(2, 128), ok),
                              torch.randn(2, 128) @ ok.to_plain().t(), atol=100)  # runs, float
        d = NF4WithDefault(*parts, size=x.shape)
        assert d.dtype == torch.bfloat16 and d.to_plain().dtype == torch.bfloat16
        # An integer wrapper whose to_plain is integer is not a mistake.
        assert TwoTensor(torch.ones(2, dtype=torch.int8), torch.ones(2, dtype=torch.int8)).dtype == torch.int8


# ---- the outer device (issue 21, item 4) -----------------------------------------------------


def test_an_outer_device_other_than_the_inner_tensors_is_refused():
    with pytest.raises(OuterArgumentError) as info:
        TwoTensor(torch.ones(2), torch.ones(2), device="cuda")
    assert_expected_inline(
        str(info.value),
        """TwoTensor: device= 'cuda' differs from the device of the inner tensors (cpu); the outer tensor must be where its inner tensors are. Move them first (x.to('cuda') on each inner tensor), or leave device= out.""",
    )
    assert TwoTensor(torch.ones(2), torch.ones(2), device="cpu").device == torch.device("cpu")
    with pytest.raises(OuterArgumentError, match="device= 'meta' differs"):
        TwoTensor(torch.ones(2), torch.ones(2), device="meta")


# ---- the exemplars' meta fields --------------------------------------------------------------


@pytest.mark.parametrize(
    "block, error, words",
    [
        (0, MetaValueError, "BlockScaled.block must be a positive int (rows per scale) but the value passed is 0"),
        (-4, MetaValueError, "the value passed is -4"),
        (True, MetaTypeError, "annotated int but the value passed is True (a bool)"),
        (2.5, MetaTypeError, "annotated int but the value passed is 2.5"),
    ],
    ids=["zero", "negative", "bool", "float"],
)
def test_block_is_a_positive_int(block, error, words):
    b = BlockScaled.from_float(torch.randn(64, 8))
    with pytest.raises(error) as info:
        BlockScaled(b.qdata, b.scale, block=block, dtype=torch.float32)
    assert words in str(info.value)
    assert isinstance(info.value, (ValueError, TypeError))


def test_meta_check_on_a_default_is_a_declaration_error():
    from subclass_kit import FieldDeclarationError, meta

    with pytest.raises(FieldDeclarationError, match="Bad.k must be even but its default is 3"):

        class Bad(WrapperTensor):
            payload: torch.Tensor = inner()
            k: int = meta(default=3, check=lambda v: None if v % 2 == 0 else "even")


def test_mesh_ref_local_takes_a_device_type():
    assert MeshRef.local("cpu").device_type == "cpu"
    for bad in ("bogus", "cuda:0", 3):
        with pytest.raises(MeshError, match="device_type must be a torch device type"):
            MeshRef.local(bad)


# ---- validated loads (issue 21, item 3) ------------------------------------------------------


class _Forged:
    """Pickles as the kit's rebuild call with arguments of our choosing: a forged file."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (rebuild, self.args)


def _load(obj):
    buf = io.BytesIO()
    torch.save({"w": obj}, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)["w"]


@pytest.fixture(scope="module")
def blocks():
    serialization.allow(BlockScaled, TwoTensor)
    return BlockScaled.from_float(torch.randn(64, 8, generator=torch.Generator().manual_seed(0)))


def _parts(b, **change):
    parts = {"cls": BlockScaled, "inners": {"qdata": b.qdata, "scale": b.scale},
             "ctx": b.__tensor_flatten__()[1], "size": (64, 8), "stride": (8, 1)}
    parts.update(change)
    return (parts["cls"], parts["inners"], parts["ctx"], parts["size"], parts["stride"], False, False)


def test_an_honest_checkpoint_loads(blocks):
    got = _load(_Forged(*_parts(blocks)))
    assert type(got) is BlockScaled and torch.equal(got.to_plain(), blocks.to_plain())
    assert torch.equal(_load(blocks).to_plain(), blocks.to_plain())


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda b: {"inners": {"qdata": b.qdata, "scale": torch.ones(7, 1)}},
         "BlockScaled.scale has shape (7, 1) but BlockScaled.__inner_shapes__ expects (2, 1)"),
        (lambda b: {"ctx": TwoTensor(torch.ones(2), torch.ones(2)).__tensor_flatten__()[1]},
         "the saved ctx belongs to 'TwoTensor', not to BlockScaled"),
        (lambda b: {"ctx": b.__tensor_flatten__()[1].replace(block=0)},
         "BlockScaled.block must be a positive int (rows per scale) but the saved value is 0"),
        (lambda b: {"inners": {"qdata": b.qdata.float(), "scale": b.scale}},
         "BlockScaled.qdata must have dtype torch.int8 but got torch.float32"),
        (lambda b: {"size": (2**40, 8)}, "expects (1099511627776, 8)"),
        (lambda b: {"inners": {"qdata": b.qdata}}, "the saved inner tensors are ['qdata']"),
        (lambda b: {"ctx": ("BlockScaled", ("block",), (32,), torch.float32, ("qdata", "scale"))},
         "the saved ctx is a tuple, not a SubclassCtx"),
    ],
    ids=["scale-shape", "other-ctx", "block-0", "float-qdata", "huge-size", "missing-inner", "plain-tuple-ctx"],
)
def test_a_forged_checkpoint_is_refused_at_load(blocks, change, words):
    with pytest.raises(CheckpointError) as info:
        _load(_Forged(*_parts(blocks, **change(blocks))))
    assert "a saved BlockScaled fails the checks its construction applies" in str(info.value)
    assert words in str(info.value)


def test_two_elements_under_a_huge_outer_size_are_refused(blocks):
    t = TwoTensor(torch.ones(2), torch.ones(2))
    forged = _Forged(TwoTensor, {"a": t.a, "b": t.b}, t.__tensor_flatten__()[1], (2**40,), (1,), False, False)
    with pytest.raises(CheckpointError, match=r"TwoTensor defines no __inner_shapes__, so every inner tensor must have the outer shape \(1099511627776,\)"):
        _load(forged)


class ListsSystem(WrapperTensor):
    payload: torch.Tensor = inner()
    __safe_globals__ = (os.system,)
    __fallback__ = fallbacks.map_inner


class ListsPopen(WrapperTensor):
    payload: torch.Tensor = inner()
    __safe_globals__ = (__import__("subprocess").Popen,)


def test_allow_vouches_only_for_data_types():
    with pytest.raises(UnsafeGlobalError) as info:
        serialization.allow(ListsSystem)
    assert "ListsSystem.__safe_globals__ lists the builtin_function_or_method" in str(info.value)
    assert "system" in str(info.value) and isinstance(info.value, TypeError)
    with pytest.raises(UnsafeGlobalError, match="subprocess.Popen"):
        serialization.allow(ListsPopen)
    assert os.system not in torch.serialization.get_safe_globals()
    from subclass_kit.sharded import ShardedTensor

    serialization.allow(ShardedTensor)  # placements and MeshRef: dataclasses, vouched for
