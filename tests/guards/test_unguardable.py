"""Values no guard can describe are named at build time (issue 21 item 4): a list or dict
that contains itself, and a ctx that would never pass its own guard (a NaN meta value)."""

import math

import pytest
import torch

import guards
from subclass_kit import WrapperTensor, inner, meta


class Eps(WrapperTensor):
    """A float meta field: NaN is a value a user can put there."""

    a: torch.Tensor = inner()
    eps: float = meta(default=0.0)


class NanTolerant(torch.Tensor):
    """A torch-protocol wrapper whose own ``__metadata_guard__`` treats NaN as equal."""

    @staticmethod
    def __new__(cls, a, eps):
        return torch.Tensor._make_wrapper_subclass(cls, a.shape, dtype=a.dtype, device=a.device)

    def __init__(self, a, eps):
        self.a, self.eps = a, eps

    def __tensor_flatten__(self):
        return ["a"], (self.eps,)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return NanTolerant(inner["a"], ctx[0])

    @classmethod
    def __metadata_guard__(cls, orig, other):
        return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(orig, other))

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        raise NotImplementedError


def _cyclic_list():
    a = [torch.ones(2), 3]
    a.append(a)
    return a


def _cyclic_dict():
    d = {"t": torch.ones(2)}
    d["again"] = {"inner": d}
    return d


@pytest.mark.parametrize("make, where", [(_cyclic_list, "L['x'][2] is L['x'] again"),
                                         (_cyclic_dict, "L['x']['again']['inner'] is L['x'] again")],
                         ids=["list", "dict"])
@pytest.mark.parametrize("fn", [guards.build, guards.cache_key], ids=["build", "cache_key"])
def test_a_cyclic_input_is_named_not_a_recursion_error(make, where, fn):
    with pytest.raises(guards.UnguardableValueError) as e:
        fn(make())
    msg = str(e.value)
    assert where in msg and "cyclic" in msg and "acyclic" in msg  # where, why, and the fix
    assert isinstance(e.value, ValueError) and isinstance(e.value, guards.GuardError)


def test_the_same_list_twice_is_not_a_cycle():
    shared = [torch.ones(2)]
    gs = guards.build([shared, shared])
    assert gs.check([shared, shared])


@pytest.mark.parametrize("fn", [guards.build, guards.cache_key], ids=["build", "cache_key"])
def test_a_nan_meta_value_is_named(fn):
    x = Eps(torch.ones(2), eps=float("nan"))
    with pytest.raises(guards.UnguardableValueError) as e:
        fn(x)
    msg = str(e.value)
    assert "L['x'].__tensor_flatten__()[1].eps is NaN" in msg and "Eps" in msg
    assert "new artifact" in msg and "__metadata_guard__" in msg and "None" in msg


def test_without_the_error_a_nan_ctx_would_never_pass_its_own_guard():
    """Why the error exists: two NaN-ctx inputs (distinct float objects, as a computed or
    unpickled NaN is) fail ``==``, so no guard could ever serve the second one."""
    a, b = Eps(torch.ones(2), eps=float("nan")), Eps(torch.ones(2), eps=float("nan"))
    assert a.__tensor_flatten__()[1] != b.__tensor_flatten__()[1]
    # A finite value guards and keys as usual.
    gs = guards.build(Eps(torch.ones(2), eps=0.5))
    assert gs.check(Eps(torch.ones(2), eps=0.5)) and not gs.check(Eps(torch.ones(2), eps=0.25))
    assert guards.cache_key(Eps(torch.ones(2), eps=0.5)) == guards.cache_key(Eps(torch.ones(2), eps=0.5))


def test_a_class_that_guards_nan_itself_is_trusted():
    gs = guards.build(NanTolerant(torch.ones(2), float("nan")))
    assert gs.check(NanTolerant(torch.ones(2), float("nan")))
    assert not gs.check(NanTolerant(torch.ones(2), 1.0))


def test_a_nan_plain_float_input_still_guards():
    """A NaN leaf (not in a ctx) is guarded with ``v != v``, as dynamo does: it passes."""
    gs = guards.build([torch.ones(2), float("nan")])
    assert gs.check([torch.ones(2), float("nan")]) and not gs.check([torch.ones(2), 1.0])
