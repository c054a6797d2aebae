"""docs/quantized.md: every ```python block runs, in order, in one namespace (issue 23).

The namespace is a registered module, so the page's NF4 class pickles and is not "local",
as in a user's own module. A plain ``` block introduced by "prints" must equal what the
python block before it printed.
"""

from __future__ import annotations

import pathlib

import pytest

from kit_helpers.docs import registered_module, run_in_order

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "quantized.md"


@pytest.fixture
def doc_module():
    with registered_module("docs_quantized") as mod:
        yield mod


def test_python_blocks_run_in_order(doc_module):
    ns = doc_module.__dict__
    assert run_in_order(DOC, ns) >= 4
    assert ns["NF4"].__module__ == "docs_quantized"
