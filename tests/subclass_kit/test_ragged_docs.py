"""docs/ragged.md: every ```python block runs, in order, in one namespace (issue 28).

The namespace is a registered module, so the page's ``Ragged`` class is importable by its
qualified name, as in a user's own module. A plain ``` block introduced by "prints" must
equal what the python block before it printed.
"""

from __future__ import annotations

import pathlib

import pytest

from kit_helpers.docs import registered_module, run_in_order

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ragged.md"


@pytest.fixture
def doc_module():
    with registered_module("docs_ragged") as mod:
        yield mod


def test_python_blocks_run_in_order(doc_module):
    ns = doc_module.__dict__
    assert run_in_order(DOC, ns) >= 6
    assert ns["Ragged"].__module__ == "docs_ragged"
