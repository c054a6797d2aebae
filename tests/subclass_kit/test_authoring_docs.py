"""docs/authoring.md: every ```python block runs, in order, in one namespace.

The namespace is a registered module, so classes defined on the page pickle and are not
"local" (no LocalClassWarning), exactly as in a user's own module. A plain ``` block
introduced by a line ending in "prints" must equal what the python block before it printed.
"""

from __future__ import annotations

import pathlib

import pytest

from kit_helpers.docs import FENCE, registered_module, run_in_order

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "authoring.md"


@pytest.fixture
def doc_module():
    with registered_module("docs_authoring") as mod:
        yield mod


def test_doc_has_python_blocks_and_checked_output():
    langs = [m.group(1) for m in FENCE.finditer(DOC.read_text())]
    assert langs.count("python") >= 12


def test_python_blocks_run_in_order(doc_module):
    ns = doc_module.__dict__
    assert run_in_order(DOC, ns) >= 8
    # The page's classes behave like a user's module-level classes.
    assert ns["BlockScaled"].__module__ == "docs_authoring"
