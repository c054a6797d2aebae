"""The docstring examples of subclass_kit.collectives, run on a real 2-rank gloo world.

Every rank runs every example (so the collectives match); the examples show rank 0's
output, so rank 0's run must match them exactly.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import subclass_kit.collectives

from kit_helpers.harness import world

pytestmark = pytest.mark.dist


def _modules():
    pkg = subclass_kit.collectives
    return [pkg.__name__] + [f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]


def _run_doctests(names):
    import torch

    finder = doctest.DocTestFinder(exclude_empty=True)
    report = []
    for name in names:
        for test in finder.find(importlib.import_module(name), name):
            if not test.examples:
                continue
            out = []
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            runner.run(test, out=out.append)
            torch._dynamo.reset()
            report.append((test.name, runner.failures, "".join(out)))
    return report


def test_docstring_examples_on_two_ranks():
    report = world(2).run(_run_doctests, _modules())[0]
    names = [n for n, _, _ in report]
    for must in ("AsyncCollectiveTensor", "all_reduce", "all_to_all_single", "resolve_group", "all_gather_tensor_autograd"):
        assert any(n.endswith(must) for n in names), (must, names)
    failures = [f"{n}:\n{text}" for n, f, text in report if f]
    assert not failures, "\n".join(failures)
