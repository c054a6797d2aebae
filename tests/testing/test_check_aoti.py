"""The opt-in ``aoti.package`` row of check_subclass (``aoti=True`` / ``--aoti``).

Off by default (no row at all); skips with the reason for a class without ``to_plain``;
fails, naming the stage, for a class that cannot be exported; passes for every local
exemplar through the CLI (slow: one AOTInductor compile per class).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor as TorchTwoTensor

from subclass_kit import WrapperTensor, fallbacks, inner
from subclass_kit.examples import TwoTensor
from subclass_kit.testing import check_subclass
from subclass_kit.testing.runner import UnknownCheckError

from kit_helpers.processes import run_cli


def test_off_by_default_there_is_no_row():
    report = check_subclass(TwoTensor, backends=("eager",), only=["ctx", "identity.importable"])
    assert report.rows and not [r.name for r in report.rows if r.name.startswith("aoti")]


def test_selecting_the_row_while_it_is_off_says_how_to_turn_it_on():
    with pytest.raises(UnknownCheckError, match=r"aoti=True \(CLI: --aoti\)"):
        check_subclass(TwoTensor, backends=("eager",), only=["ctx.hashable", "aoti"])


def test_class_without_to_plain_skips_with_the_reason():
    x = TorchTwoTensor(torch.ones(2, 3), torch.ones(2, 3))
    report = check_subclass(x, backends=("eager",), only=["aoti"], aoti=True)
    row = report.row("aoti.package")
    assert row.status == "skip"
    assert "no to_plain()" in row.message and "TwoTensor" in row.message


class ValueBranch(WrapperTensor):
    """Every op branches in Python on the data: fine in eager, not exportable."""

    payload: torch.Tensor = inner()

    @staticmethod
    def __fallback__(func, types, args, kwargs):
        x = next(a for a in args if isinstance(a, ValueBranch))
        if bool(x.payload.sum() > 0):
            pass
        return fallbacks.map_inner(func, types, args, kwargs)

    def to_plain(self):
        return self.payload

    @classmethod
    def __samples__(cls):
        return [cls(torch.ones(4, 3))]


def test_unexportable_class_fails_naming_the_stage():
    report = check_subclass(ValueBranch, backends=("eager",), only=["aoti"], aoti=True)
    row = report.row("aoti.package")
    assert row.status == "fail"
    assert "torch.export.export (non-strict)" in row.message and "ValueBranch" in row.message
    assert "Fix:" in row.message


@pytest.mark.slow
def test_exemplars_pass_through_the_cli(tmp_path):
    out = tmp_path / "report.json"
    targets = [f"subclass_kit.examples:{n}" for n in ("TwoTensor", "ScaledTensor", "BlockScaled")]
    r = run_cli("check", *targets, "--aoti", "--only", "aoti", "--backend", "eager", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [row for rep in json.loads(out.read_text())["reports"] for row in rep["rows"]]
    assert [(row["subject"], row["name"], row["status"]) for row in rows] == [
        (n, "aoti.package", "pass") for n in ("TwoTensor", "ScaledTensor", "BlockScaled")
    ], rows
