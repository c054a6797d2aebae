"""Docs pages that run: their fenced python blocks, in order in one namespace, and the
output the page says they print.

Conventions of a page (docs/collectives.md, sharded.md, tp.md, deploying.md): a block whose
preceding line starts with a *marker* (``<!-- skip: needs a process group``, ``<!-- ranks:``)
runs on every rank of a real gloo world, the others in one process; a plain block introduced
by the line "rank 0 prints" (marked) or "prints" (unmarked) must equal what the python block
just before it printed.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import io
import pathlib
import re
import sys
import types

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.M | re.S)
# The marker of blocks that run on the ranks of a gloo world (collectives, sharded, tp).
NEEDS_PG = "<!-- skip: needs a process group"


def blocks(doc: pathlib.Path, marker: str) -> list[tuple[str, str, bool, str]]:
    """(language, code, marked, the text since the previous fence) for each fenced block;
    ``marked``: the line just before the fence starts with ``marker``."""
    text = doc.read_text()
    out, last = [], 0
    for m in FENCE.finditer(text):
        before = text[last:m.start()]
        lines = before.rstrip().splitlines()
        out.append((m.group(1), m.group(2), bool(lines) and lines[-1].startswith(marker), before))
        last = m.end()
    return out


def plan(doc: pathlib.Path, marker: str, *, marked: bool) -> tuple[list, list]:
    """The python blocks to run, ``[(block index, code)]``, and the outputs to check,
    ``[(position among them, expected text)]``, for the marked or the unmarked blocks."""
    codes, checks = [], []
    for i, (lang, code, is_marked, before) in enumerate(blocks(doc, marker)):
        if lang == "python" and is_marked == marked:
            codes.append((i, code))
        elif lang == "" and codes and codes[-1][0] == i - 1:
            last = before.strip().splitlines()[-1] if before.strip() else ""
            if last == ("rank 0 prints" if marked else "prints"):
                checks.append((len(codes) - 1, code))
    return codes, checks


def run_blocks(codes, *, doc_name: str, module: str) -> list[str]:
    """Exec the blocks in order in one namespace named ``module``; what each printed.

    Module-level, so that a gloo World can run it on its ranks (tasks pickle by reference).
    """
    ns = {"__name__": module}
    printed = []
    for i, code in codes:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"{doc_name}[python block {i}]", "exec"), ns)
        printed.append(buf.getvalue())
    return printed


def check_printed(printed: list, codes: list, checks: list, *, doc_name: str, who: str) -> None:
    """Every checked block printed exactly what the page says."""
    for pos, want in checks:
        assert printed[pos] == want, (
            f"{doc_name} block {codes[pos][0]}: the page says\n{want}\nbut {who} printed\n{printed[pos]}"
        )


def run_in_order(doc: pathlib.Path, ns: dict, *, label: str = "python block", after_each=None) -> int:
    """Exec every python block of ``doc`` in order in ``ns``; a plain block introduced by a
    line ending in "prints" must equal what the python block before it printed. Returns how
    many such outputs were checked. ``after_each`` runs after every block, even one that raised."""
    text = doc.read_text()
    printed, checked, last = None, 0, 0
    for i, m in enumerate(FENCE.finditer(text)):
        lang, code, before = m.group(1), m.group(2), text[last:m.start()]
        last = m.end()
        if lang == "python":
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                try:
                    exec(compile(code, f"{doc.name}[{label} {i}]", "exec"), ns)
                finally:
                    if after_each is not None:
                        after_each()
            printed = buf.getvalue()
        elif lang == "" and before.strip().endswith("prints"):
            assert printed == code, f"block {i}: the page says\n{code}\nbut the code printed\n{printed}"
            checked += 1
    return checked


def doctests(module_names) -> list:
    """One ``pytest.param`` per docstring with examples in the named modules, id = its name."""
    import pytest

    finder = doctest.DocTestFinder(exclude_empty=True)
    out = []
    for name in module_names:
        for test in finder.find(importlib.import_module(name), name):
            if test.examples:
                out.append(pytest.param(test, id=test.name))
    return out


@contextlib.contextmanager
def registered_module(name: str):
    """A fresh module registered in ``sys.modules`` while the page runs in its namespace, so the
    page's classes pickle and are not "local", as in a user's own module."""
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    try:
        yield mod
    finally:
        del sys.modules[name]
