"""guards.build: what a GuardSet checks, how it explains, and the code it generates."""

import math

import pytest
import torch
from expecttest import assert_expected_inline
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

import guards
import symbolic
from subclass_kit import WrapperTensor, fallbacks, inner, meta
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor
from symbolic import Dim, SubclassPolicy


class Scaled(torch.Tensor):
    """Throwaway wrapper written against torch's protocol only (no kit base class)."""

    @staticmethod
    def __new__(cls, a, scale, block=32):
        return torch.Tensor._make_wrapper_subclass(cls, a.shape, strides=a.stride(), dtype=a.dtype, device=a.device)

    def __init__(self, a, scale, block=32):
        self.a, self.scale, self.block = a, scale, block

    def __tensor_flatten__(self):
        return ["a", "scale"], (self.block,)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return Scaled(inner["a"], inner["scale"], ctx[0])

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        unwrap = lambda x: x.a * x.scale.sum() if isinstance(x, Scaled) else x  # noqa: E731
        return func(*[unwrap(a) for a in args], **(kwargs or {}))


class ListCtx(Scaled):
    """A wrapper whose ctx is a list: unhashable."""

    def __tensor_flatten__(self):
        return ["a", "scale"], [self.block]


def sc(m=4, n=3, rows=None, block=32):
    return Scaled(torch.ones(m, n), torch.ones(m if rows is None else rows, 1), block)


def test_plain_tensor_static():
    gs = guards.build(torch.ones(4, 3))
    assert gs.check(torch.zeros(4, 3))
    assert not gs.check(torch.zeros(4, 3, dtype=torch.float64))
    assert gs.explain(torch.zeros(4, 3)) == []
    assert_expected_inline(
        str(gs.explain(torch.zeros(3, 4).t())),
        """["L['x'].stride()[0]: expected 3, got 1", "L['x'].stride()[1]: expected 1, got 4"]""",
    )
    assert_expected_inline(
        str(gs.explain(torch.zeros(4, 3, requires_grad=True))),
        """["L['x'].requires_grad: expected False, got True"]""",
    )


def test_wrapper_guards_listed_in_dynamo_order():
    x = TorchTwoTensor(torch.ones(4, 3), torch.ones(4, 3))
    assert_expected_inline(str(guards.build(x)), """\
type(L['x']) is torch.testing._internal.two_tensor.TwoTensor
L['x'].__tensor_flatten__()[1] == None
L['x'].__tensor_flatten__()[0] == ['a', 'b']
L['x']: TwoTensor float32 on cpu, requires_grad=False, size=[4, 3], stride=[3, 1]
L['x']: no dimension marks
L['x'].a: Tensor float32 on cpu, requires_grad=False, size=[4, 3], stride=[3, 1]
L['x'].a: no dimension marks
L['x'].b: Tensor float32 on cpu, requires_grad=False, size=[4, 3], stride=[3, 1]
L['x'].b: no dimension marks
3 distinct tensors""")


def test_generated_code_for_a_two_inner_wrapper():
    gs = guards.build(TorchTwoTensor(torch.ones(4, 3), torch.ones(4, 3)))
    assert_expected_inline(gs.code, """\
def check(R):
    try:
        if not (type(R) is _T0):
            return False
        _f0 = R.__tensor_flatten__()
        if not (_f0[1] == _C1):
            return False
        if not (_f0[0] == _N2):
            return False
        _v1 = R.a
        _v2 = R.b
        if not (_TG3(R, _v1, _v2)):  # TENSOR_MATCH for every tensor
            return False
        if not (_A4.isdisjoint(R.__dict__)):
            return False
        if not (_A5.isdisjoint(_v1.__dict__)):
            return False
        if not (_A6.isdisjoint(_v2.__dict__)):
            return False
        if not (R is not _v1):
            return False
        if not (R is not _v2):
            return False
        if not (_v1 is not _v2):
            return False
        return True
    except Exception:
        return False
""")


def test_nested_explain_names_the_exact_path():
    x = TorchTwoTensor(sc(), sc())
    gs = guards.build(x)
    y = TorchTwoTensor(sc(rows=7), sc(block=16))
    assert_expected_inline(
        "\n".join(gs.explain(y)),
        """\
L['x'].a.scale.size()[0]: expected 4, got 7
L['x'].b.__tensor_flatten__()[1][0]: expected 32, got 16""",
    )
    assert not gs.check(y)


def test_kit_ctx_field_is_named():
    x = BlockScaled.from_float(torch.randn(64, 8), block=32)
    y = BlockScaled.from_float(torch.randn(64, 8), block=16)
    assert_expected_inline(
        "\n".join(guards.build(x).explain(y)),
        """\
L['x'].__tensor_flatten__()[1].block: expected 32, got 16
L['x'].scale.size()[0]: expected 2, got 4""",
    )


def test_type_and_meta_and_dtype_changes_fail():
    x = ScaledTensor.from_float(torch.randn(5, 3))
    gs = guards.build(x)
    assert gs.check(ScaledTensor.from_float(torch.randn(5, 3)))
    assert not gs.check(ScaledTensor.from_float(torch.randn(5, 3, dtype=torch.float64)))
    assert not gs.check(TwoTensor(torch.randn(5, 3), torch.randn(5, 3)))
    assert gs.explain(torch.randn(5, 3)) == ["type(L['x']): expected ScaledTensor, got Tensor"]


def test_pytree_and_leaves():
    value = {"w": TorchTwoTensor(torch.ones(2), torch.ones(2)), "n": 3, "f": 0.5, "s": "relu", "z": None,
             "l": [torch.ones(1), True]}
    gs = guards.build(value)
    same = {"w": TorchTwoTensor(torch.ones(2), torch.ones(2)), "n": 3, "f": 0.5, "s": "relu", "z": None,
            "l": [torch.ones(1), True]}
    assert gs.check(same) and gs.explain(same) == []
    changed = dict(same, n=4, f=0.25, s="gelu", z=0, l=[torch.ones(1), 1])
    assert_expected_inline(
        "\n".join(gs.explain(changed)),
        """\
L['x']['n']: expected 3 (int), got 4 (int)
L['x']['f']: expected 0.5 (float), got 0.25 (float)
L['x']['s']: expected 'relu' (str), got 'gelu' (str)
L['x']['z']: expected None, got 0 (int)
L['x']['l'][1]: expected True (bool), got 1 (int)""",
    )
    assert not gs.check(changed)


def test_nan_leaf_is_guarded_by_isnan():
    gs = guards.build((torch.ones(1), math.nan))
    assert gs.check((torch.ones(1), float("nan")))
    assert not gs.check((torch.ones(1), 1.0))


@pytest.mark.parametrize(
    "other",
    [[torch.ones(2)], (torch.ones(2), 1, 2), {"a": 1}, torch.ones(2), None, "text"],
    ids=["list", "longer", "dict", "tensor", "none", "str"],
)
def test_different_structure_fails_with_one_line_never_raises(other):
    gs = guards.build((torch.ones(2), 1))
    assert gs.check(other) is False
    lines = gs.explain(other)
    assert len(lines) == 1 and lines[0].startswith(("type(L['x'])", "len(L['x'])")), lines


def test_missing_inner_tensor_is_reported_once():
    x = sc()
    y = sc()
    del y.scale
    assert guards.build(x).explain(y) == [
        "L['x'].scale: could not be read (AttributeError: 'Scaled' object has no attribute 'scale')"
    ]
    assert not guards.build(x).check(y)


def test_unhashable_ctx_is_compared_by_value_like_dynamo():
    # dynamo deep-copies the ctx and compares it with == (TENSOR_SUBCLASS_METADATA_MATCH);
    # it never hashes it, so a list ctx compiles and so must guard.
    x = ListCtx(torch.ones(2, 2), torch.ones(2, 1), block=32)
    gs = guards.build(x)
    assert gs.check(ListCtx(torch.ones(2, 2), torch.ones(2, 1), block=32))
    y = ListCtx(torch.ones(2, 2), torch.ones(2, 1), block=16)
    assert not gs.check(y)
    assert gs.explain(y) == ["L['x'].__tensor_flatten__()[1][0]: expected 32, got 16"]
    assert guards.cache_key(x) != guards.cache_key(y)


def test_uncopyable_ctx_names_the_class():
    class Lock:
        def __deepcopy__(self, memo):
            raise TypeError("cannot copy a lock")

    class LockCtx(Scaled):
        def __tensor_flatten__(self):
            return ["a", "scale"], Lock()

    with pytest.raises(guards.UnhashableContextError, match=r"LockCtx\.__tensor_flatten__\(\) returned a ctx") as e:
        guards.build(LockCtx(torch.ones(2, 2), torch.ones(2, 1), 32))
    assert isinstance(e.value, TypeError)


def test_marked_dim_is_symbolic_but_zero_one_specialize():
    x = torch.ones(8, 3)
    torch._dynamo.mark_dynamic(x, 0)
    gs = guards.build(x)
    assert gs.check(torch.ones(2, 3)) and gs.check(torch.ones(1000, 3))
    assert_expected_inline(str(gs.explain(torch.ones(1, 3))), """["L['x'].size()[0]: expected >= 2, got 1"]""")
    y = torch.ones(1, 3)
    torch._dynamo.mark_dynamic(y, 0)
    g1 = guards.build(y)  # size 1: specialized even though marked
    assert g1.check(torch.ones(1, 3)) and not g1.check(torch.ones(2, 3))


def test_marks_are_guarded_like_dynamo():
    x = torch.ones(8, 3)
    gs = guards.build(x)
    marked = torch.ones(8, 3)
    torch._dynamo.mark_dynamic(marked, 1)
    assert_expected_inline(str(gs.explain(marked)), """["L['x']._dynamo_dynamic_indices: expected absent, got {1}"]""")
    torch._dynamo.mark_dynamic(x, 0)
    gm = guards.build(x)
    assert gm.check(torch.ones(9, 3))  # no marks at run time: accepted
    assert not gm.check(marked)  # marks must be a subset of the compiled ones


def test_mark_range_is_guarded():
    x = torch.ones(8, 3)
    torch._dynamo.mark_dynamic(x, 0, min=4, max=16)
    gs = guards.build(x)
    assert gs.check(torch.ones(16, 3)) and not gs.check(torch.ones(17, 3)) and not gs.check(torch.ones(3, 3))
    assert gs.explain(torch.ones(17, 3)) == ["L['x'].size()[0]: expected <= 16, got 17"]


def test_ranged_mark_on_size_one_is_refused():
    x = torch.ones(1, 3)
    torch._dynamo.mark_dynamic(x, 0, min=2, max=16)
    with pytest.raises(guards.PolicyViolationError, match=r"L\['x'\]\.size\(\)\[0\] = 1 is marked dynamic with a range"):
        guards.build(x)


def test_duck_sizing_with_dynamic_true():
    gs = guards.build((torch.ones(4), torch.ones(4), torch.ones(5)), dynamic=True)
    assert gs.check((torch.ones(7), torch.ones(7), torch.ones(9)))
    assert_expected_inline(
        str(gs.explain((torch.ones(7), torch.ones(8), torch.ones(9)))),
        """["L['x'][1].size()[0]: expected == L['x'][0].size()[0] (= 7), got 8"]""",
    )


def test_marked_dims_are_not_duck_sized():
    a, b = torch.ones(4), torch.ones(4)
    torch._dynamo.mark_dynamic(a, 0)
    torch._dynamo.mark_dynamic(b, 0)
    assert guards.build((a, b)).check((torch.ones(7), torch.ones(8)))


def test_strides_follow_dynamic_sizes():
    x = torch.ones(4, 5)
    torch._dynamo.mark_dynamic(x, 1)
    gs = guards.build(x)
    assert gs.check(torch.ones(4, 9))
    assert_expected_inline(
        str(gs.explain(torch.ones(4, 12)[:, :9])),
        """["L['x'].stride()[0]: expected == L['x'].size()[1] (= 9), got 12"]""",
    )


def test_torch_marks_on_wrapper_reach_inner_tensors():
    x = TorchTwoTensor(torch.ones(8, 3), torch.ones(8, 3))
    torch._dynamo.mark_dynamic(x, 0)
    gs = guards.build(x)
    assert gs.check(TorchTwoTensor(torch.ones(5, 3), torch.ones(5, 3)))
    assert not gs.check(TorchTwoTensor(torch.ones(5, 4), torch.ones(5, 4)))


def test_relations_of_a_kit_class():
    x = BlockScaled.from_float(torch.randn(64, 8), block=32)
    symbolic.mark_dynamic(x, 0)
    gs = guards.build(x)
    assert gs.check(BlockScaled.from_float(torch.randn(96, 8), block=32))
    bad = BlockScaled.from_float(torch.randn(96, 8), block=32)
    object.__setattr__(bad, "scale", torch.ones(5, 1))  # breaks scale = ceil(rows / block)
    assert gs.explain(bad) == ["L['x'].scale.size()[0]: expected ceiling(L['x'].size()[0]/32) = 3, got 5"]
    assert "L['x'].scale.size()[0] == ceiling(L['x'].size()[0]/32)" in gs.describe()


def test_policy_instead_of_marks():
    x = BlockScaled.from_float(torch.randn(64, 8), block=32)
    policy = SubclassPolicy(outer={0: Dim.dynamic()}, inner={"qdata": {0: Dim.dynamic()}, "scale": {0: Dim.dynamic()}})
    gs = guards.build(x, policy=policy)
    y = BlockScaled.from_float(torch.randn(96, 8), block=32)
    symbolic.apply(y, policy)
    assert gs.check(y)
    # Compiled with marks, called without: accepted, as dynamo does (unspecified = don't care).
    assert gs.check(BlockScaled.from_float(torch.randn(64, 8), block=32))
    static = guards.build(x, policy=SubclassPolicy(outer={0: Dim.static()}))
    assert not static.check(BlockScaled.from_float(torch.randn(96, 8), block=32))


def test_aliasing_is_guarded():
    t = torch.ones(3)
    gs = guards.build((t, t))
    assert gs.check((t, t))
    assert gs.explain((torch.ones(3), torch.ones(3))) == ["L['x'][1] is L['x'][0]: expected True, got False"]
    g2 = guards.build((torch.ones(3), torch.ones(3)))
    assert not g2.check((t, t))


def test_view_base_is_tracked_when_dynamic():
    base = torch.ones(40)
    gs = guards.build(base[:20].view(4, 5), dynamic=True)
    assert gs.check(torch.ones(30)[:20].view(4, 5))
    assert gs.explain(torch.ones(4, 5))[0].startswith("L['x']._base")


def test_check_agrees_with_explain_on_samples():
    samples = [TwoTensor(torch.ones(4, 3), torch.ones(4, 3)), ScaledTensor.from_float(torch.randn(4, 3)),
               BlockScaled.from_float(torch.randn(40, 3), block=16), torch.ones(4, 3), (torch.ones(1), 2)]
    for a in samples:
        gs = guards.build(a)
        for b in samples:
            assert gs.check(b) == (gs.explain(b) == []), (a, b)


def test_foreign_wrapper_under_compile_agrees_with_guards():
    # A kit-free wrapper: the GuardSet's verdict matches dynamo's reuse decision.
    r = guards.explain_recompiles(lambda x: x * 2, [(sc(),), (sc(),), (sc(block=16),), (sc(rows=2),)], dynamic=False)
    assert [c.compiled for c in r.calls] == [True, False, True, True] and r.agrees, str(r)


class Pair(WrapperTensor):
    a: torch.Tensor = inner()
    b: torch.Tensor = inner()
    tag: str = meta(default="p")
    __fallback__ = fallbacks.map_inner


def test_throwaway_kit_class():
    gs = guards.build(Pair(torch.ones(2, 2), torch.ones(2, 2), tag="p"))
    assert gs.check(Pair(torch.ones(2, 2), torch.zeros(2, 2), tag="p"))
    assert gs.explain(Pair(torch.ones(2, 2), torch.zeros(2, 2), tag="q")) == [
        "L['x'].__tensor_flatten__()[1].tag: expected 'p', got 'q'"
    ]


class DictCtx(Scaled):
    """A torchao-style dict ctx; ``__metadata_guard__`` ignores the ``note`` key."""

    @staticmethod
    def __new__(cls, a, scale, block=32, note="x"):
        return Scaled.__new__(cls, a, scale, block)

    def __init__(self, a, scale, block=32, note="x"):
        super().__init__(a, scale, block)
        self.note = note

    def __tensor_flatten__(self):
        return ["a", "scale"], {"block": [self.block], "note": self.note}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return DictCtx(inner["a"], inner["scale"], ctx["block"][0], ctx["note"])

    @classmethod
    def __metadata_guard__(cls, orig, other):
        return orig["block"] == other["block"]


def test_metadata_guard_is_honoured_and_agrees_with_dynamo():
    def d(block, note):
        return DictCtx(torch.ones(2, 2), torch.ones(2, 1), block, note)

    gs = guards.build(d(32, "x"))
    assert gs.check(d(32, "y"))  # the class's own guard ignores the note
    assert gs.explain(d(16, "x")) == [
        "L['x'].__tensor_flatten__()[1]['block']: expected [32], got [16] (DictCtx.__metadata_guard__ refused it)"
    ]
    rep = guards.explain_recompiles(lambda t: t * 2, [(d(32, "x"),), (d(32, "y"),), (d(16, "x"),)])
    assert rep.agrees and rep.compiles == 2, str(rep)


def test_cache_key_of_a_dict_ctx_ignores_key_order_only():
    class Ordered(DictCtx):
        def __tensor_flatten__(self):
            return ["a", "scale"], {"note": self.note, "block": [self.block]}

    a = DictCtx(torch.ones(2, 2), torch.ones(2, 1), 32, "x")
    b = Ordered(torch.ones(2, 2), torch.ones(2, 1), 32, "x")
    payload = lambda t: guards.cache_key_payload(t).replace(type(t).__qualname__, "C")  # noqa: E731
    assert payload(a) == payload(b)
    assert guards.cache_key(a) != guards.cache_key(DictCtx(torch.ones(2, 2), torch.ones(2, 1), 32, "z"))


class KeyedDictCtx(DictCtx):
    """DictCtx whose key hook keeps exactly what its guard compares."""

    def __tensor_flatten__(self):
        return ["a", "scale"], {"block": [self.block], "note": self.note}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return KeyedDictCtx(inner["a"], inner["scale"], ctx["block"][0], ctx["note"])

    @classmethod
    def __metadata_key__(cls, ctx):
        return ctx["block"]


def test_cache_key_with_metadata_guard_is_conservative_or_exact_with_the_key_hook():
    from torch._dynamo.testing import CompileCounter

    def make(cls, block, note):
        return cls(torch.ones(2, 2), torch.ones(2, 1), block, note)

    for cls in (DictCtx, KeyedDictCtx):
        x, y, z = make(cls, 32, "x"), make(cls, 32, "y"), make(cls, 16, "x")
        # what may serve: dynamo reuses x's artifact for y (the class's guard ignores the
        # note) and compiles again for z; guards say the same
        torch._dynamo.reset()
        cnt = CompileCounter()
        f = torch.compile(lambda t: t * 2, backend=cnt)
        f(x)
        f(y)
        assert cnt.frame_count == 1
        f(z)
        assert cnt.frame_count == 2
        assert guards.build(x).check(y) and not guards.build(x).check(z)
        # equal keys never name a wrong artifact; unequal ones never share a refused one
        assert guards.cache_key(x) != guards.cache_key(z)
        assert guards.cache_key(x) == guards.cache_key(make(cls, 32, "x"))
    # without the hook the key is conservative: y could share x's artifact but is keyed apart
    assert guards.cache_key(make(DictCtx, 32, "x")) != guards.cache_key(make(DictCtx, 32, "y"))
    # with it, exact: the two ctxs the class's guard accepts as equal get one key
    assert guards.cache_key(make(KeyedDictCtx, 32, "x")) == guards.cache_key(make(KeyedDictCtx, 32, "y"))
