"""docs/sharded.md and the docstring examples of subclass_kit.sharded run, and print what
they say.

Page blocks preceded by ``<!-- skip: needs a process group ... -->`` run, in order and in
one namespace, on every rank of a real 2-rank gloo world; a plain block introduced by the
line "rank 0 prints" must equal what rank 0 printed. The other blocks run here (a one-rank
``MeshRef.local()`` needs no process group); a plain block after "prints" must match.
"""

from __future__ import annotations

import doctest
import functools
import io
import pathlib

import pytest

from kit_helpers.docs import NEEDS_PG, check_printed, doctests, plan, run_blocks
from kit_helpers.harness import world

_REPO = pathlib.Path(__file__).resolve().parents[2]
DOC = _REPO / "docs" / "sharded.md"


def _expected(needs_pg: bool):
    return plan(DOC, NEEDS_PG, marked=needs_pg)


_run = functools.partial(run_blocks, doc_name=DOC.name, module="docs_sharded")


def test_page_blocks_in_process():
    codes, checks = _expected(needs_pg=False)
    assert len(codes) >= 2 and len(checks) == len(codes)
    check_printed(_run(codes), codes, checks, doc_name=DOC.name, who="this process")


@pytest.mark.dist
def test_page_blocks_on_two_ranks():
    codes, checks = _expected(needs_pg=True)
    assert len(codes) >= 2 and len(checks) == len(codes)
    printed = world(2).run(_run, codes, timeout=150.0)[0]
    check_printed(printed, codes, checks, doc_name=DOC.name, who="rank 0")


_MODULES = [
    "subclass_kit.sharded",
    "subclass_kit.sharded.placements",
    "subclass_kit.sharded.mesh",
    "subclass_kit.sharded._layout",
    "subclass_kit.sharded._redistribute",
    "subclass_kit.sharded.tensor",
    "subclass_kit.sharded.convert",
    "subclass_kit.sharded.parallel",
    "subclass_kit.sharded.loss",
    "subclass_kit.sharded.data_parallelism",
    "subclass_kit.sharded._ops.matrix",
    "subclass_kit.sharded._ops.view",
    "subclass_kit.sharded._ops.reshape",
    "subclass_kit.sharded._ops.view_targets",
    "subclass_kit.sharded._ops.as_strided",
    "subclass_kit.sharded._ops.layouts",
]


@pytest.mark.parametrize("test", doctests(_MODULES))
def test_docstring_examples(test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out = io.StringIO()
    runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()
