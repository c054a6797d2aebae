"""Every example in symbolic's docstrings runs and prints what it says."""

import doctest
import importlib
import inspect
import pkgutil

import pytest

import symbolic

MODULES = sorted(m.name for m in pkgutil.iter_modules(symbolic.__path__, "symbolic."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_every_public_function_has_an_example():
    functions = {n: f for n, f in vars(symbolic).items() if inspect.isfunction(f) and not n.startswith("_")}
    assert len(functions) >= 12
    missing = [n for n, f in functions.items() if ">>>" not in (f.__doc__ or "")]
    assert not missing, missing
