"""A hang is a failing row that names where it hung, and the run goes on; code under check
that calls sys.exit fails its row instead of ending the run."""

from __future__ import annotations

import sys
import time

import pytest
import torch

from subclass_kit import WrapperTensor, fallbacks, inner
from subclass_kit.testing import check_subclass

aten = torch.ops.aten


class Stuck(WrapperTensor):
    a: torch.Tensor = inner()
    __fallback__ = fallbacks.map_inner

    def to_plain(self):
        return self.a


@Stuck.implements(aten.sin.default)
def _never_returns(func, types, args, kwargs):
    while True:
        time.sleep(0.01)


@Stuck.implements(aten.cos.default)
def _exits(func, types, args, kwargs):
    sys.exit(4)


def test_a_hanging_op_fails_its_row_naming_it_and_the_run_goes_on():
    x = Stuck(torch.randn(3, 4))
    t0 = time.monotonic()
    report = check_subclass(x, ops=[aten.sin.default, aten.neg.default], backends=(), only=["eager"], timeout=1)
    assert time.monotonic() - t0 < 60
    row = report.row("eager[aten.sin.default(x)]")
    assert row.status == "fail" and "did not finish within 1s" in row.message
    assert "_never_returns" in row.message and "Fix:" in row.message
    assert report.row("eager[aten.neg.default(x)]").status == "pass"


def test_the_same_op_passes_its_row_when_it_returns():
    report = check_subclass(Stuck(torch.randn(3, 4)), ops=[aten.neg.default], backends=(), only=["eager"], timeout=5)
    assert report.ok


def test_an_op_that_exits_fails_its_row():
    report = check_subclass(Stuck(torch.randn(3, 4)), ops=[aten.cos.default, aten.neg.default], backends=(), only=["eager"])
    row = report.row("eager[aten.cos.default(x)]")
    assert row.status == "fail" and "called sys.exit(4)" in row.message and "_exits" in row.message
    assert report.row("eager[aten.neg.default(x)]").status == "pass"


@pytest.mark.parametrize("bad", [-1, "10", True])
def test_a_bad_timeout_is_named(bad):
    with pytest.raises(ValueError, match="timeout must be seconds"):
        check_subclass(Stuck(torch.randn(2)), backends=(), only=["eager"], timeout=bad)
