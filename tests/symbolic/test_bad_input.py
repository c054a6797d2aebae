"""Bad input: each mistake is a ValueError/TypeError naming the tensor path and the problem."""

import pytest
import torch
from expecttest import assert_expected_inline

import symbolic
from subclass_kit import WrapperTensor, fallbacks, inner
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor
from symbolic import Dim, PolicyError, PolicyTypeError, SubclassPolicy


class MaybeBias(WrapperTensor):
    """Throwaway: an optional inner tensor."""

    weight: torch.Tensor = inner()
    bias: torch.Tensor = inner(optional=True)
    __fallback__ = fallbacks.map_inner


def bs():
    return BlockScaled.from_float(torch.randn(64, 8))


def nested():
    return TwoTensor(ScaledTensor.from_float(torch.randn(4, 3)), ScaledTensor.from_float(torch.randn(4, 3)))


def message(exc_type, fn):
    with pytest.raises(exc_type) as e:
        fn()
    return str(e.value)


def test_outer_dim_out_of_range():
    msg = message(PolicyError, lambda: symbolic.mark_dynamic(bs(), 2))
    assert_expected_inline(msg, """x: dim 2 is out of range for a 2-d tensor of shape (64, 8) (valid dims: -2..1).""")
    assert issubclass(PolicyError, ValueError)


def test_inner_dim_out_of_range_names_the_inner_path():
    msg = message(ValueError, lambda: symbolic.mark_dynamic(bs(), 0, inner={"scale": [2]}))
    assert_expected_inline(msg, """x.scale: dim 2 is out of range for a 2-d tensor of shape (2, 1) (valid dims: -2..1).""")
    msg = message(ValueError, lambda: symbolic.apply(nested(), SubclassPolicy(inner={"a": SubclassPolicy(inner={"scale": [-3]})})))
    assert_expected_inline(msg, """x.a.scale: dim -3 is out of range for a 2-d tensor of shape (4, 1) (valid dims: -2..1).""")


def test_inner_name_the_class_does_not_have():
    msg = message(PolicyError, lambda: symbolic.mark_dynamic(bs(), 0, inner={"scales": [0]}))
    assert_expected_inline(msg, """x.scales: BlockScaled has no inner tensor 'scales'; its inner tensors are ['qdata', 'scale'].""")
    # A meta field is not an inner tensor either.
    msg = message(PolicyError, lambda: symbolic.apply(bs(), SubclassPolicy(inner={"block": [0]})))
    assert_expected_inline(msg, """x.block: BlockScaled has no inner tensor 'block'; its inner tensors are ['qdata', 'scale'].""")


def test_policy_for_an_optional_inner_that_is_none():
    x = MaybeBias(torch.ones(4, 2), None)
    msg = message(PolicyError, lambda: symbolic.mark_dynamic(x, 0, inner={"bias": [0]}))
    assert_expected_inline(
        msg,
        """x.bias is None: MaybeBias.bias is an optional inner tensor that this instance does not have, so it cannot be marked. Drop 'bias' from the policy (present inner tensors: ['weight']).""",
    )
    # Derived marking simply skips the absent inner.
    assert symbolic.mark_dynamic(x, 0) == SubclassPolicy(outer=[0], inner={"weight": [0]})


def test_min_greater_than_max():
    msg = message(ValueError, lambda: symbolic.mark_dynamic(bs(), 0, min=10, max=5))
    assert_expected_inline(msg, """x: Dim.dynamic(min=10, max=5): min > max; no size satisfies it. Swap or fix the bounds.""")


def test_policy_on_a_plain_tensors_nonexistent_inner():
    msg = message(PolicyError, lambda: symbolic.mark_dynamic(torch.ones(3), 0, inner={"scale": [0]}))
    assert_expected_inline(
        msg,
        """x is a plain Tensor and has no inner tensors, so it has no inner 'scale'. Give a policy for its own dims only (a {dim: Dim} mapping).""",
    )
    # The same through apply, with the plain tensor as the root.
    msg = message(PolicyError, lambda: symbolic.apply(torch.ones(3), SubclassPolicy(inner={"scale": [0]})))
    assert msg.startswith("x is a plain Tensor and has no inner tensors")


def test_subclass_policy_for_a_plain_inner():
    msg = message(PolicyTypeError, lambda: symbolic.apply(bs(), SubclassPolicy(inner={"scale": SubclassPolicy(outer=[0])})))
    assert_expected_inline(
        msg,
        """x.scale is a plain Tensor; a SubclassPolicy only fits a wrapped tensor. Give its dims instead: {0: Dim.dynamic()}.""",
    )
    assert issubclass(PolicyTypeError, TypeError)


@pytest.mark.parametrize(
    "call, exc, fragment",
    [
        (lambda: symbolic.mark_dynamic(bs(), "0"), PolicyTypeError, "x: dims must be an int"),
        (lambda: symbolic.mark_dynamic(bs(), [0.5]), PolicyTypeError, "x: a dim must be an int, got 0.5"),
        (lambda: symbolic.mark_dynamic(bs(), 0, inner="derive"), PolicyError, "inner='derive' is not a mode"),
        (lambda: symbolic.mark_dynamic(bs(), 0, inner=["scale"]), PolicyTypeError, "inner must be one of"),
        (lambda: symbolic.mark_dynamic(bs(), {0: Dim.auto()}, max=3), PolicyTypeError, "min=/max= apply to bare dims"),
        (lambda: symbolic.mark_dynamic([1, 2], 0), PolicyTypeError, "expect a tensor, got list"),
        (lambda: symbolic.apply(bs(), {0: Dim.dynamic()}), PolicyTypeError, "expects a SubclassPolicy"),
        (lambda: symbolic.mark_dynamic(bs(), 0, inner={0: [0]}), PolicyTypeError, "named by strings"),
        (lambda: symbolic.mark_dynamic(bs(), 0, min=-1), PolicyError, "x: Dim.dynamic(min=-1, max=None): min=-1 is negative"),
        (lambda: symbolic.mark_dynamic(bs(), {0: Dim.auto(), -2: Dim.static()}), PolicyError, "x: dim -2 is given twice"),
    ],
    ids=["str-dims", "float-dim", "unknown-mode", "mode-not-mapping", "range-with-mapping", "not-a-tensor",
         "apply-dict", "inner-name-int", "negative-min", "dim-twice"],
)
def test_malformed_arguments(call, exc, fragment):
    assert fragment in message(exc, call)


def test_errors_leave_no_marks_behind():
    x = bs()
    with pytest.raises(PolicyError):
        symbolic.mark_dynamic(x, 0, inner={"qdata": [0], "scale": [9]})
    assert symbolic.marks(x) == SubclassPolicy()


def test_outer_range_whose_derived_size_reaches_one_is_refused_with_advice():
    # rows in [2, 64] with block 32 gives a scale of 1 row (specialized by dynamo) for
    # rows <= 32 and 2 rows above: no single graph can serve it. torch itself only fails
    # later, deep in guard generation, with a ConstraintViolationError on qdata.
    from subclass_kit.examples import BlockScaled

    x = BlockScaled.from_float(torch.randn(40, 4))
    with pytest.raises(PolicyError) as e:
        symbolic.mark_dynamic(x, 0, min=2, max=64)
    msg = str(e.value)
    assert "x.scale.size(0) = ceiling(s0/32)" in msg and "[1, 2]" in msg
    assert "Dim.auto()" in msg
    # Nothing was marked: the tensor compiles as if untouched.
    assert not getattr(x, "_dynamo_dynamic_indices", set())
    # The advice works: raising min past the boundary is accepted.
    symbolic.mark_dynamic(x, 0, min=33, max=64)
    assert 0 in x._dynamo_dynamic_indices
