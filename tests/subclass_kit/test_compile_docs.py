"""docs/compile.md runs, in order in one namespace, and prints what it says."""

from __future__ import annotations

import pathlib

from kit_helpers.docs import run_in_order

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "compile.md"


def test_compile_page_runs_and_prints_what_it_says():
    assert run_in_order(DOC, {"__name__": "docs_compile"}) >= 5
