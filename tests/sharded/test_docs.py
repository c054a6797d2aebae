"""docs/sharded.md and the docstring examples of subclass_kit.sharded run, and print what
they say.

Page blocks preceded by ``<!-- skip: needs a process group ... -->`` run, in order and in
one namespace, on every rank of a real 2-rank gloo world; a plain block introduced by the
line "rank 0 prints" must equal what rank 0 printed. The other blocks run here (a one-rank
``MeshRef.local()`` needs no process group); a plain block after "prints" must match.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import io
import pathlib
import re

import pytest

from collectives._harness import world

_REPO = pathlib.Path(__file__).resolve().parents[2]
DOC = _REPO / "docs" / "sharded.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)
_NEEDS_PG = "<!-- skip: needs a process group"


def _blocks():
    text = DOC.read_text()
    out, last = [], 0
    for m in _FENCE.finditer(text):
        before = text[last:m.start()]
        lines = before.rstrip().splitlines()
        out.append((m.group(1), m.group(2), bool(lines) and lines[-1].startswith(_NEEDS_PG), before))
        last = m.end()
    return out


def run_blocks(codes) -> list:
    """Exec the blocks in one namespace; what each printed (module-level: runs on ranks)."""
    ns = {"__name__": "docs_sharded"}
    printed = []
    for i, code in codes:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"{DOC.name}[python block {i}]", "exec"), ns)
        printed.append(buf.getvalue())
    return printed


def _expected(needs_pg: bool):
    codes, checks = [], []
    for i, (lang, code, pg, before) in enumerate(_blocks()):
        if lang == "python" and pg == needs_pg:
            codes.append((i, code))
        elif lang == "" and codes and codes[-1][0] == i - 1:
            last = before.strip().splitlines()[-1] if before.strip() else ""
            if last == ("rank 0 prints" if needs_pg else "prints"):
                checks.append((len(codes) - 1, code))
    return codes, checks


def _check(printed, codes, checks, who):
    for pos, want in checks:
        assert printed[pos] == want, f"block {codes[pos][0]}: the page says\n{want}\nbut {who} printed\n{printed[pos]}"


def test_page_blocks_in_process():
    codes, checks = _expected(needs_pg=False)
    assert len(codes) >= 2 and len(checks) == len(codes)
    _check(run_blocks(codes), codes, checks, "this process")


@pytest.mark.dist
def test_page_blocks_on_two_ranks():
    codes, checks = _expected(needs_pg=True)
    assert len(codes) >= 2 and len(checks) == len(codes)
    printed = world(2).run(run_blocks, codes, timeout=150.0)[0]
    _check(printed, codes, checks, "rank 0")


_MODULES = [
    "subclass_kit.sharded",
    "subclass_kit.sharded.placements",
    "subclass_kit.sharded.mesh",
    "subclass_kit.sharded.layout",
    "subclass_kit.sharded.redistribute",
    "subclass_kit.sharded.tensor",
    "subclass_kit.sharded.convert",
    "subclass_kit.sharded.parallel",
    "subclass_kit.sharded.loss",
    "subclass_kit.sharded.ops.matrix",
]


def _doctests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    out = []
    for name in _MODULES:
        for test in finder.find(importlib.import_module(name), name):
            if test.examples:
                out.append(pytest.param(test, id=test.name))
    return out


@pytest.mark.parametrize("test", _doctests())
def test_docstring_examples(test):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out = io.StringIO()
    runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()
