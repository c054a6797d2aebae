"""guards.cache_key: stable across processes, equal exactly when one artifact may serve."""

import json
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import guards
import symbolic
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor

from kit_helpers.processes import run_pythons


def _keys_in_subprocesses(*seeds: str) -> list:
    """The keys computed in one fresh interpreter per hash seed (run concurrently)."""
    code = (
        "import json; from kit_helpers import guards_keys; import guards; "
        "print(json.dumps({k: guards.cache_key(v) for k, v in guards_keys.values().items()}))"
    )
    outs = run_pythons([(code, {"PYTHONHASHSEED": seed}) for seed in seeds], timeout=300)
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


@pytest.mark.dist
def test_keys_equal_across_processes_with_different_hash_seeds():
    from kit_helpers import guards_keys

    a, b = _keys_in_subprocesses("1", "12345")
    assert a == b
    here = {k: guards.cache_key(v) for k, v in guards_keys.values().items()}
    assert here == a
    assert len(set(a.values())) == len(a)  # and the values are told apart


def bs(rows, block=32, dtype=torch.float32):
    return BlockScaled.from_float(torch.randn(rows, 8, dtype=dtype).float(), block=block)


def test_key_differs_on_meta_dtype_and_static_size():
    k = guards.cache_key(bs(64))
    assert k == guards.cache_key(bs(64))
    assert k != guards.cache_key(bs(64, block=16))  # meta value
    assert k != guards.cache_key(bs(65))  # static size
    s = ScaledTensor.from_float(torch.randn(5, 3))
    assert guards.cache_key(s) != guards.cache_key(ScaledTensor(s.qdata, s.scale.half(), dtype=torch.float32))  # inner dtype
    assert guards.cache_key(torch.ones(3)) != guards.cache_key(torch.ones(3, dtype=torch.float64))  # dtype
    assert guards.cache_key(TwoTensor(torch.ones(2), torch.ones(2))) != guards.cache_key(
        TwoTensor(torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)))


def test_key_equal_when_only_a_dynamic_size_differs():
    a, b = bs(64), bs(96)
    symbolic.mark_dynamic(a, 0)
    symbolic.mark_dynamic(b, 0)
    assert guards.cache_key(a) == guards.cache_key(b)
    one = bs(1)  # size 1 is specialized even when marked
    symbolic.mark_dynamic(one, 0)
    assert guards.cache_key(one) != guards.cache_key(a)
    x, y = torch.ones(8, 3), torch.ones(9, 3)
    torch._dynamo.mark_dynamic(x, 0)
    assert guards.cache_key(x) != guards.cache_key(y)  # y carries no mark: static
    torch._dynamo.mark_dynamic(y, 0)
    assert guards.cache_key(x) == guards.cache_key(y)


def test_key_follows_duck_sizing():
    same = (torch.ones(4), torch.ones(4))
    assert guards.cache_key(same, dynamic=True) == guards.cache_key((torch.ones(9), torch.ones(9)), dynamic=True)
    assert guards.cache_key(same, dynamic=True) != guards.cache_key((torch.ones(4), torch.ones(5)), dynamic=True)


def test_key_of_fake_tensors_with_symbolic_sizes():
    # What AOTAutograd hands _stable_hash_for_caching while tracing.
    def fake(rows, block):
        mode = FakeTensorMode(shape_env=ShapeEnv())
        return mode.from_tensor(bs(rows, block))

    assert guards.cache_key(fake(64, 32)) == guards.cache_key(fake(96, 32))
    assert guards.cache_key(fake(64, 32)) != guards.cache_key(fake(64, 16))


class _Opaque:
    pass


class Scaled(torch.Tensor):
    """Throwaway wrapper written against torch's protocol only (no kit base class)."""

    @staticmethod
    def __new__(cls, a, block):
        return torch.Tensor._make_wrapper_subclass(cls, a.shape, strides=a.stride(), dtype=a.dtype, device=a.device)

    def __init__(self, a, block):
        self.a, self.block = a, block

    def __tensor_flatten__(self):
        return ["a"], (self.block,)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Scaled(inner["a"], ctx[0])

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        raise NotImplementedError(func)  # cache_key only flattens


def test_unstable_ctx_value_names_the_class():
    x = Scaled(torch.ones(2, 2), block=_Opaque())
    # The module is this test file's, whatever name the import mode gives it.
    where = re.escape(f"{Scaled.__module__}.Scaled")
    with pytest.raises(guards.UnstableKeyError, match=rf"the ctx of {where} holds <.*_Opaque object"):
        guards.cache_key(x)


def test_payload_is_canonical_json_with_version():
    payload = json.loads(guards.cache_key_payload(torch.ones(2, 3)))
    assert payload["version"] == 1
    assert payload["guards"][0] == ["tensor", "L['x']", "torch.Tensor", "torch.float32", "cpu", False, [2, 3], [3, 1]]
