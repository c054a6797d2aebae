"""Issue 23's NF4 weight: the checker's verdicts on it and on its mistakes are the truth.

Each row that can be wrong is asserted to FAIL on the mistake and PASS on the right class."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from nf4_subclasses import NF4, CeilShapes, FlatToPlain, IfShapes, ListLinear
from subclass_kit import HandlerResultError, ToPlainError
from subclass_kit.testing import check_subclass


class IntShapes(NF4):
    """Mistake: int() of a size specializes the dim."""

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        n = int(outer_size[0]) * outer_size[1]
        return {"qdata": (n // 2,), "scale_q": (n // 64,), "scale_factor": (n // (64 * 256),)}


class ValidSizes(NF4):
    """The hook that tells the dynamic sweep which sizes the class can hold."""

    @classmethod
    def __valid_sizes__(cls, like):
        rows = 64 * 256 // like.shape[1]
        for k in (2, 3, 5, 7):
            yield (rows * k, like.shape[1])


CALLS: list = []


class WithArgs(NF4):
    @classmethod
    def __op_args__(cls, op, x):
        CALLS.append(str(op))
        if op is F.linear:
            return (torch.ones(2, x.shape[1]), x)
        return None


def test_nf4_passes_every_row_it_should():
    report = check_subclass(NF4, backends=("aot_eager",), export=False, serialization=False)
    assert report.ok, report.failures
    sweep = report.row("compile.dynamic_sweep[aot_eager]")
    assert sweep.status == "pass" and "256x128" in sweep.message and "1 frame" in sweep.message
    assert "eager itself raised" in sweep.message  # the sizes it could not use are said, not blamed
    assert report.row("eager[torch.nn.functional.linear(act, x)]").status == "pass"
    assert report.row("eager[aten.view.default(x, [-1])]").status == "pass"
    assert report.row("eager[aten.as_strided.default(x, x.t().shape, x.t().stride())]").status == "pass"
    assert report.row("protocol.to_plain").status == "pass"
    assert report.row("protocol.inner_shapes_dynamic").message == "dims [0, 1] stay symbolic"


def test_valid_sizes_hook_gives_the_sweep_its_sizes():
    row = check_subclass(ValidSizes, backends=("aot_eager",), only=["compile.dynamic_sweep"]).rows[0]
    assert row.status == "pass", row.message
    assert row.message.startswith("sizes [256x128, 384x128, 640x128] (from __valid_sizes__): 1 frame")


def test_a_flat_to_plain_fails_its_row_and_no_dense_comparison_passes_on_it():
    report = check_subclass(FlatToPlain, backends=(), only=["protocol.to_plain", "eager"])
    row = report.row("protocol.to_plain")
    assert row.status == "fail" and "shape (32768,), expected (256, 128)" in row.message and "Fix:" in row.message
    for name in ("eager[aten.add.Tensor(x, x)]", "eager[aten.neg.default(x)]", "eager[aten.sum.default(x)]"):
        assert report.row(name).status == "skip" and "protocol.to_plain did not pass" in report.row(name).message


def test_fallbacks_to_plain_names_a_to_plain_of_the_wrong_shape():
    with pytest.raises(ToPlainError, match=r"FlatToPlain.to_plain\(\) returned a \(32768,\).*aten.neg.default"):
        torch.neg(FlatToPlain.__samples__()[0])
    w = NF4.__samples__()[0]
    torch.testing.assert_close(torch.neg(w), -w.to_plain())


@pytest.mark.parametrize(
    "cls, words",
    [(CeilShapes, "through a float"), (IfShapes, "branched on it: dynamo guards"), (IntShapes, "specialized it: dim 0")],
    ids=["math.ceil", "python-if", "int"],
)
def test_inner_shapes_that_specialize_a_dim_fail_naming_the_dim_and_the_fix(cls, words):
    row = check_subclass(cls, backends=(), only=["protocol.inner_shapes_dynamic"]).rows[0]
    assert row.status == "fail" and words in row.message and "dim 0" in row.message
    assert "ceil_div" in row.message and "floor_div" in row.message


def test_a_list_returning_torch_function_handler_is_named_in_eager_linear_and_compiled():
    w = ListLinear.__samples__()[0]
    act = torch.randn(4, 128)
    with pytest.raises(HandlerResultError, match=r"ListLinear's handler for torch.nn.functional.linear .* returned a list"):
        F.linear(act, w)
    lin = torch.nn.Linear(128, 256, bias=False)
    lin.weight = torch.nn.Parameter(w, requires_grad=False)
    with pytest.raises(HandlerResultError, match="returned a list"):
        lin(act)
    with pytest.raises(Exception, match="returned a list"):
        torch.compile(F.linear, backend="eager", fullgraph=True)(act, w)
    row = check_subclass(ListLinear, backends=(), only=["eager[torch"]).rows[0]
    assert row.name == "eager[torch.nn.functional.linear(act, x)]"
    assert row.status == "fail" and "HandlerResultError" in row.message and "returned a list" in row.message
    nf4 = NF4.__samples__()[0]
    torch.testing.assert_close(F.linear(act, nf4), act @ nf4.to_plain().t())


def test_op_args_hook_gives_arguments_of_registered_handlers():
    row = check_subclass(WithArgs, backends=(), only=["eager[torch"]).rows[0]
    assert row.name == "eager[torch.nn.functional.linear(*__op_args__)]" and row.status == "pass", row.message
    assert any("linear" in c for c in CALLS)
