"""docs/foreign.md runs as written: every ```python block in order in one namespace; a plain
block introduced by a line ending in "prints" must equal what the block before printed."""

import pathlib
import sys
import types

import pytest

from kit_helpers.docs import run_in_order

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "foreign.md"


@pytest.mark.dist  # the DTensor block makes a one-rank gloo group on 127.0.0.1
def test_doc_python_blocks_run_and_print_what_the_page_says():
    # a real module, so that torch.compile can find the page's functions' globals
    mod = types.ModuleType("docs_foreign")
    sys.modules["docs_foreign"] = mod
    try:
        checked = run_in_order(DOC, mod.__dict__, label="block")
    finally:
        del sys.modules["docs_foreign"]
    assert checked == 6
