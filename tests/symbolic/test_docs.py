"""docs/symbolic.md: every ```python block runs, in order, in one namespace.

A plain ``` block introduced by a line "prints" must equal what the python block before it
printed, so the page cannot drift from what the code says.
"""

import pathlib

import torch

from kit_helpers.docs import FENCE, run_in_order

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "symbolic.md"


def test_doc_has_python_blocks():
    langs = [m.group(1) for m in FENCE.finditer(DOC.read_text())]
    assert langs.count("python") >= 10


def test_python_blocks_run_in_order():
    assert run_in_order(DOC, {"__name__": "docs_symbolic"}, after_each=torch._dynamo.reset) >= 3
