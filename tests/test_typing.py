"""Types (issue 22 item 4): the three packages ship ``py.typed``, their public API is
annotated (every public module of subclass_kit), and mypy (configured in pyproject.toml)
finds nothing.

mypy keeps its cache under build/mypy_cache: a warm run takes seconds, a cold one (CI) a
few tens of seconds of CPU, most of it reading torch's annotations once.
"""

import inspect
import pathlib
import subprocess
import sys

import pytest

import importlib

import guards
import symbolic

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("symbolic", "guards", "subclass_kit")


@pytest.mark.parametrize("package", PACKAGES)
def test_ships_py_typed(package):
    assert (REPO / package / "py.typed").is_file()


def _public_callables(pkg):
    for name in getattr(pkg, "__all__", None) or [n for n in vars(pkg) if not n.startswith("_")]:
        obj = getattr(pkg, name)
        if inspect.isfunction(obj) and obj.__module__.split(".")[0] == pkg.__name__.split(".")[0]:
            yield name, obj
        elif inspect.isclass(obj) and obj.__module__.split(".")[0] == pkg.__name__.split(".")[0]:
            for attr, v in vars(obj).items():
                if attr.startswith("_") and attr not in ("__init__", "__call__"):
                    continue
                v = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
                v = v.fget if isinstance(v, property) else v
                if inspect.isfunction(v):
                    yield f"{name}.{attr}", v


# Every public module of subclass_kit; "" is the top level (WrapperTensor and the re-exports).
KIT_MODULES = ("", "pytree", "serialization", "compiling", "deploy", "recompiles", "testing", "cli",
               "errors", "bench", "fallbacks", "fields", "ctx", "examples", "collectives", "sharded", "boundary")


def test_every_public_kit_module_is_checked():
    import pkgutil

    import subclass_kit

    public = {m.name for m in pkgutil.iter_modules(subclass_kit.__path__) if not m.name.startswith("_")}
    # base's public names (WrapperTensor) are the top level's, checked under "".
    assert public - {"base"} == set(KIT_MODULES) - {""}


@pytest.mark.parametrize("name", ["symbolic", "guards", *(f"subclass_kit.{m}".rstrip(".") for m in KIT_MODULES)])
def test_public_api_is_annotated(name):
    pkg = importlib.import_module(name)
    missing = []
    for name, fn in _public_callables(pkg):
        sig = inspect.signature(fn)
        params = [p.name for p in sig.parameters.values()
                  if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
        no_return = sig.return_annotation is inspect.Signature.empty and fn.__name__ != "__init__"
        if params or no_return:
            missing.append(f"{pkg.__name__}.{name}: {params or ''}{' no return type' if no_return else ''}")
    assert not missing, missing


def test_mypy_is_clean():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
