"""docs/guards.md runs as written, and every example in the guards package's docstrings runs.

Every ```python block runs in order in one namespace; a plain block introduced by a line
ending in "prints" must equal what the python block before it printed.
"""

import doctest
import importlib
import logging
import pathlib
import pkgutil

import pytest

import guards
from kit_helpers.docs import run_in_order

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guards.md"


def test_doc_python_blocks_run_and_print_what_the_page_says():
    assert run_in_order(DOC, {"__name__": "docs_guards"}) >= 8


def test_doc_lists_what_is_not_modelled():
    text = DOC.read_text()
    for kind in ("GLOBAL_STATE", "BACKEND_MATCH", "ID_MATCH", "Unbacked", "Graph breaks", "Lazy guarding"):
        assert kind in text


MODULES = sorted(m.name for m in pkgutil.walk_packages(guards.__path__, "guards."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS, verbose=False)
    logging.disable(logging.ERROR)
    try:
        for t in doctest.DocTestFinder().find(mod):
            # Globals kept: dynamo installs names into a compiled lambda's globals and
            # removes them when its inputs die; a cleared dict makes that removal raise.
            runner.run(t, clear_globs=False)
    finally:
        logging.disable(logging.NOTSET)
    res = runner.summarize(verbose=False)
    assert res.failed == 0, f"{name}: {res.failed} failing examples"
