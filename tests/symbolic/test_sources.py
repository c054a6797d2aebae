"""sources(): every size, stride and storage offset, named exactly as dynamo's guards name them."""

import inspect
import re

import torch
from expecttest import assert_expected_inline
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import guards
import symbolic
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor
from symbolic import InnerSource, SizeSource, StorageOffsetSource, StrideSource, ViewBaseSource

# Any size/stride/storage-offset expression dynamo writes in a guard about the local `x`.
_NAME = re.compile(r"L\['x'\](?:\.\w+)*\.(?:size\(\)\[\d+\]|stride\(\)\[\d+\]|storage_offset\(\))")


def test_plain_and_wrapped_names_and_fetch():
    x = BlockScaled.from_float(torch.randn(70, 8))
    got = symbolic.sources(x)
    assert_expected_inline(
        "\n".join(got),
        """\
L['x'].size()[0]
L['x'].size()[1]
L['x'].stride()[0]
L['x'].stride()[1]
L['x'].storage_offset()
L['x'].qdata.size()[0]
L['x'].qdata.size()[1]
L['x'].qdata.stride()[0]
L['x'].qdata.stride()[1]
L['x'].qdata.storage_offset()
L['x'].scale.size()[0]
L['x'].scale.size()[1]
L['x'].scale.stride()[0]
L['x'].scale.stride()[1]
L['x'].scale.storage_offset()""",
    )
    # Each source fetches what its name says.
    assert got["L['x'].scale.size()[0]"] == SizeSource(InnerSource("scale"), 0)
    assert got["L['x'].scale.size()[0]"](x) == 3
    assert got["L['x'].qdata.stride()[0]"](x) == 8
    assert got["L['x'].scale.storage_offset()"](x) == 0
    assert list(symbolic.sources(x, name="w"))[0] == "L['w'].size()[0]"


def test_no_module_shares_a_name_with_a_function():
    """symbolic.sources and symbolic.relations are plain functions; importing every
    submodule of the package does not shadow them (issue 22 item 4)."""
    import importlib
    import pkgutil

    for pkg in (symbolic, guards):
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{pkg.__name__}.{info.name}")
    assert inspect.isfunction(symbolic.sources) and inspect.isfunction(symbolic.relations)
    assert inspect.isfunction(guards.cache_key)
    x = torch.ones(2, 3)
    assert list(symbolic.sources(x)) == [s.name for s in symbolic.sources(x).values()]


def test_name_is_the_name_string_as_torchs():
    # torch 2.13's Source.name is a property; a user coming from torch compares it with ==.
    s = SizeSource(InnerSource("scale"), 0)
    assert type(s.name) is str and isinstance(inspect.getattr_static(type(s), "name"), property)
    assert s.name == s.to_torch().name
    assert s.name == "L['x'].scale.size()[0]" and s.name_for("w") == "L['w'].scale.size()[0]"
    assert StrideSource(symbolic.Root("w"), 1).name == "L['w'].stride()[1]"


def test_views_include_their_base():
    base = torch.randn(10, 8)
    x = ScaledTensor(base[2:].to(torch.int8), torch.ones(8, 1), dtype=torch.float32)
    view = ScaledTensor(torch.randint(0, 5, (10, 8), dtype=torch.int8)[2:], torch.ones(8, 1), dtype=torch.float32)
    got = symbolic.sources(view)
    assert "L['x'].qdata._base.size()[0]" in got and "L['x'].qdata.storage_offset()" in got
    assert got["L['x'].qdata._base.size()[0]"] == SizeSource(ViewBaseSource(InnerSource("qdata")), 0)
    assert got["L['x'].qdata._base.size()[0]"](view) == 10
    assert got["L['x'].qdata.storage_offset()"](view) == 16
    assert not any("_base" in k for k in symbolic.sources(x))  # .to() copied: not a view


def _offset_scaled(rows, g):
    s = ScaledTensor.from_float(torch.randn(rows + 2, 8, generator=g))
    return ScaledTensor(s.qdata[2:], s.scale[2:], dtype=s.dtype)  # views with a storage offset


def test_names_match_dynamo_guard_text_for_a_nested_subclass():
    """Compile a TwoTensor of ScaledTensors (inner views) with dynamic=True so that dynamo
    allocates symbols for sizes, strides and storage offsets, then compare its guard text and
    its shape environment's sources with ours."""
    g = torch.Generator().manual_seed(0)
    x = TwoTensor(_offset_scaled(16, g), _offset_scaled(16, g))
    envs = []

    def backend(gm, example_inputs):
        envs.extend(e.node.shape_env for e in example_inputs if isinstance(e, torch.SymInt))
        return gm

    @torch.compile(backend=backend, fullgraph=True, dynamic=True)
    def f(x):
        y = x * 2
        return y.a + y.b  # ops on ScaledTensors return dense tensors

    f(x)
    (entry,) = _debug_get_cache_entry_list(f._torchdynamo_orig_callable.__code__)
    guard_text = str(entry.guard_manager)
    in_guards = set(_NAME.findall(guard_text))
    in_shape_env = {s.name for srcs in envs[0].var_to_sources.values() for s in srcs}
    ours = symbolic.sources(x)

    assert in_guards <= set(ours), sorted(in_guards - set(ours))
    assert in_shape_env <= set(ours), sorted(in_shape_env - set(ours))
    # The comparison covers every kind of name, at every level of nesting.
    for must in ["L['x'].size()[0]", "L['x'].a.size()[0]", "L['x'].a.qdata.size()[0]", "L['x'].b.scale.size()[0]",
                 "L['x'].a.qdata.stride()[0]", "L['x'].b.qdata.storage_offset()", "L['x'].a.qdata._base.size()[0]"]:
        assert must in in_guards | in_shape_env, must
    # And each name, fetched by our source, is the value dynamo saw.
    for name in in_shape_env:
        assert isinstance(ours[name](x), int)


def test_torch_two_tensor_names():
    x = TorchTwoTensor(torch.ones(2), torch.ones(2))
    assert [k for k in symbolic.sources(x) if "size" in k] == ["L['x'].size()[0]", "L['x'].a.size()[0]", "L['x'].b.size()[0]"]
    assert symbolic.sources(x)["L['x'].b.storage_offset()"] == StorageOffsetSource(InnerSource("b"))


def test_sources_convert_to_torch_sources():
    """to_torch() gives torch's own Source types for the same place: torch's ShapeEnv takes it."""
    import pickle

    from torch._dynamo.source import AttrSource, LocalSource, TensorPropertySource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    x = BlockScaled.from_float(torch.randn(70, 8))
    s = symbolic.sources(x)["L['x'].scale.size()[0]"]
    t = s.to_torch()
    assert isinstance(t, TensorPropertySource) and isinstance(t.base, AttrSource)
    assert isinstance(t.base.base, LocalSource) and t.base.base.local_name == "x"
    assert t.name == s.name == "L['x'].scale.size()[0]" and s.name_for("w") == "L['w'].scale.size()[0]"
    w = symbolic.sources(x, name="w")["L['w'].scale.size()[0]"]
    assert w.name == w.to_torch().name == "L['w'].scale.size()[0]"
    assert pickle.loads(pickle.dumps(s)) == s and hash(pickle.loads(pickle.dumps(s))) == hash(s)
    env = ShapeEnv()
    sym = env.create_symbol(3, t, dynamic_dim=DimDynamic.DYNAMIC)
    assert env.var_to_sources[sym] == [t]
    assert env.var_to_sources[sym][0].name == "L['x'].scale.size()[0]"
