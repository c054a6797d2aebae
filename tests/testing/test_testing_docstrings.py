"""Run the docstring examples of subclass_kit.testing (STYLE: public functions carry a short
example the suite runs), one test per docstring."""

from __future__ import annotations

import doctest
import pathlib

import pytest

from kit_helpers.docs import doctests

_PKG = pathlib.Path(__file__).resolve().parents[2] / "subclass_kit" / "testing"


DOCTESTS = doctests(
    "subclass_kit.testing" + ("" if path.stem == "__init__" else f".{path.stem}") for path in sorted(_PKG.glob("*.py"))
)


def test_public_functions_have_examples():
    names = {p.id for p in DOCTESTS}
    for name in (
        "subclass_kit.testing.runner.check_subclass",
        "subclass_kit.testing.report.CheckReport.raise_if_failed",
        "subclass_kit.testing.parametrize.parametrize_pytree_impls",
        "subclass_kit.testing._dynamic.sweep_sizes",
    ):
        assert name in names, name


@pytest.mark.parametrize("test", DOCTESTS)
def test_doctest(test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    test.globs = dict(test.globs)
    failures = []
    runner.run(test, out=failures.append)
    assert runner.failures == 0, "".join(failures)
