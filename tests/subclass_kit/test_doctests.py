"""Run the docstring examples (STYLE: public functions carry a short example the suite runs)
of every subclass_kit module and of symbolic's arithmetic and sources, one test per docstring."""

from __future__ import annotations

import doctest
import pathlib

import pytest

from kit_helpers.docs import doctests

_REPO = pathlib.Path(__file__).resolve().parents[2]
_SUBPACKAGES = ("subclass_kit", "subclass_kit/examples")
_EXTRA = ("symbolic.arith", "symbolic.tensor_sources", "symbolic.source_types")

def _module_names():
    names = []
    for sub in _SUBPACKAGES:
        for path in sorted((_REPO / sub).glob("*.py")):
            names.append(".".join(path.relative_to(_REPO).with_suffix("").parts))
    return names + list(_EXTRA)


DOCTESTS = doctests(_module_names())


def test_every_module_is_covered_and_has_examples():
    modules = {p.id.rsplit(".", 1)[0] for p in DOCTESTS} | {p.id for p in DOCTESTS}
    for name in ("subclass_kit.base", "subclass_kit.ctx", "subclass_kit.examples.block_scaled", "symbolic.arith"):
        assert any(m.startswith(name) for m in modules), name
    assert len(DOCTESTS) >= 25


@pytest.mark.parametrize("test", DOCTESTS)
def test_doctest(test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    globs = dict(test.globs)
    test.globs = globs
    failures = []
    runner.run(test, out=failures.append)
    assert runner.failures == 0, "".join(failures)
