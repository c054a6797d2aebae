"""Imports point one way: symbolic -> (torch, sympy); guards -> symbolic; subclass_kit -> both.

Checked twice: dynamically (import each package in a fresh interpreter and look at
``sys.modules``, which also catches imports made by torch plugins or re-exports) and
statically (every ``import`` statement in the package sources, including the lazy ones inside
functions that an import-time check cannot see).
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
OURS = ("symbolic", "guards", "subclass_kit")

# What each package may import from our three (itself included).
ALLOWED = {
    "symbolic": {"symbolic"},
    "guards": {"guards", "symbolic"},
    "subclass_kit": {"subclass_kit", "guards", "symbolic"},
}

_PROBE = """
import json, sys
import {pkg}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {ours!r})))
"""


@pytest.fixture(scope="module")
def loaded() -> dict:
    """Modules of ours each package pulls in, each imported in its own fresh interpreter
    (run concurrently: importing torch dominates)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = {
        pkg: subprocess.Popen(
            [sys.executable, "-c", _PROBE.format(pkg=pkg, ours=OURS)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pkg in OURS
    }
    out = {}
    try:
        for pkg, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, f"import {pkg} failed:\n{stderr}"
            out[pkg] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


@pytest.mark.dist  # spawns fresh interpreters
@pytest.mark.parametrize("pkg", OURS)
def test_fresh_import_pulls_only_allowed_packages(pkg, loaded):
    top = {m.split(".")[0] for m in loaded[pkg]}
    assert pkg in top
    assert top <= ALLOWED[pkg], f"import {pkg} pulled in {sorted(top - ALLOWED[pkg])}: {loaded[pkg]}"


@pytest.mark.dist
def test_symbolic_pulls_neither_guards_nor_subclass_kit(loaded):
    assert not [m for m in loaded["symbolic"] if m.split(".")[0] in ("guards", "subclass_kit")]


@pytest.mark.dist
def test_guards_does_not_pull_subclass_kit(loaded):
    assert not [m for m in loaded["guards"] if m.split(".")[0] == "subclass_kit"]


def _imported_tops(path: pathlib.Path) -> set:
    tree = ast.parse(path.read_text(), filename=str(path))
    tops = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                tops.add(node.args[0].value.split(".")[0])
    return tops


@pytest.mark.parametrize("pkg", ["symbolic", "guards"])
def test_no_import_statement_points_up_the_layers(pkg):
    offenders = {}
    for path in sorted((REPO / pkg).rglob("*.py")):
        bad = (_imported_tops(path) & set(OURS)) - ALLOWED[pkg]
        if bad:
            offenders[str(path.relative_to(REPO))] = sorted(bad)
    assert not offenders, f"{pkg} must not import {offenders}"


def test_symbolic_imports_only_torch_sympy_and_the_standard_library():
    third_party = set()
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for path in sorted((REPO / "symbolic").rglob("*.py")):
        third_party |= {t for t in _imported_tops(path) if t not in stdlib}
    assert third_party <= {"torch", "sympy", "symbolic"}, sorted(third_party)


def test_the_static_scan_sees_lazy_imports(tmp_path):
    # Guard against the checker itself going blind: a function-level import is found.
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from subclass_kit import fallbacks\n    import guards.x\n")
    assert _imported_tops(p) == {"subclass_kit", "guards"}


# ---- inside each package: no cycles, private torch only in _compat --------------------------
def _modules() -> dict:
    """``{dotted module name: path}`` for every module of our three packages."""
    out = {}
    for pkg in OURS:
        for f in (REPO / pkg).rglob("*.py"):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _import_graph(mods: dict) -> dict:
    """Module -> the modules of ours it imports (lazy imports included; a package's import of
    its own submodules is not an edge)."""
    graph = {m: set() for m in mods}
    for m, f in mods.items():
        base = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                prefix = node.module or ""
                if node.level:
                    prefix = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                targets = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and not m.startswith(t + "."):
                    graph[m].add(t)
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_lazy_imports_included():
    assert _cycles(_import_graph(_modules())) == []


def test_the_cycle_check_sees_a_lazy_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def _private_torch(tree) -> list:
    """``(line, name)`` of every private torch name a module's code uses (not its strings)."""
    def private(name):
        parts = name.split(".")
        return parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and private(node.module):
            hits.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            hits += [(node.lineno, a.name) for a in node.names if private(a.name)]
        elif isinstance(node, ast.Attribute):
            chain, v = [node.attr], node.value
            while isinstance(v, ast.Attribute):
                chain.append(v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id == "torch" and private("torch." + ".".join(reversed(chain))):
                hits.append((node.lineno, "torch." + ".".join(reversed(chain))))
    return hits


def test_private_torch_names_only_in_each_packages_one_compat_module():
    compat = sorted(m for m in _modules() if m.endswith("._compat"))
    assert compat == ["guards._compat", "subclass_kit._compat", "symbolic._compat"]
    found = {
        m: _private_torch(ast.parse(f.read_text()))
        for m, f in _modules().items() if not m.endswith("._compat")
    }
    assert {m: h for m, h in found.items() if h} == {}


def test_the_private_torch_scan_sees_code_but_not_strings():
    tree = ast.parse('import torch._dynamo\nx = torch.ops._c10d_functional\n"torch._C in a message"\n')
    assert _private_torch(tree) == [(1, "torch._dynamo"), (2, "torch.ops._c10d_functional")]


# One privacy rule for the three packages: a module (or subpackage) is named without a
# leading ``_`` exactly when it is public -- it defines a name its package exports (re-exported
# by the package's ``__init__``) or it is a documented module (a ``:::`` page under docs/api).
# Everything else starts with ``_``; inside a ``_`` package names need no second ``_``.


def _documented_modules() -> set:
    found = set()
    for page in (REPO / "docs" / "api").glob("*.md"):
        for line in page.read_text().splitlines():
            if line.startswith("::: "):
                found.add(line[4:].strip())
    return found


def _exports_from(init: pathlib.Path) -> set:
    """Submodule names from which the package ``__init__`` re-exports a public name (or which
    it re-exports as themselves)."""
    tree = ast.parse(init.read_text())
    out = set()
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.level == 1):
            continue
        public = [a for a in node.names if not (a.asname or a.name).startswith("_")]
        if not public:
            continue
        if node.module:
            out.add(node.module.split(".")[0])
        else:
            out.update(a.name for a in public)
    return out


def _privacy_verdicts() -> list:
    documented = _documented_modules()
    rows = []
    for top in OURS:
        for init in sorted((REPO / top).rglob("__init__.py")):
            pkg_dir = init.parent
            rel = pkg_dir.relative_to(REPO).parts
            if any(p.startswith("_") for p in rel):
                continue  # a private package: everything inside is internal already
            exports = _exports_from(init)
            children = [p.stem for p in pkg_dir.glob("*.py") if p.stem != "__init__"]
            children += [p.parent.name for p in pkg_dir.glob("*/__init__.py")]
            for name in sorted(children):
                dotted = ".".join((*rel, name))
                public = (
                    name in exports
                    or dotted in documented
                    or any(d.startswith(dotted + ".") for d in documented)
                    or (name == "cli" and dotted == "subclass_kit.cli")  # the console script
                )
                rows.append((dotted, name.startswith("_"), public))
    return rows


def test_one_privacy_rule_modules_are_underscored_exactly_when_internal():
    rows = _privacy_verdicts()
    assert len(rows) > 60, rows  # the scan saw the packages
    public_but_hidden = [d for d, under, public in rows if under and public and not d.endswith("._compat")]
    internal_but_public_named = [d for d, under, public in rows if not under and not public]
    assert not internal_but_public_named, (
        f"{internal_but_public_named}: internal modules must start with '_' (or export a public "
        "name from their package's __init__, or get a docs/api page)"
    )
    assert not public_but_hidden, (
        f"{public_but_hidden}: a module that defines a public name must not start with '_'"
    )


def test_the_privacy_scan_sees_both_kinds():
    rows = {d: (under, public) for d, under, public in _privacy_verdicts()}
    assert rows["subclass_kit.base"] == (False, True)  # defines WrapperTensor
    assert rows["subclass_kit._construct"] == (True, False)
    assert rows["guards._shapes"] == (True, False)
    assert rows["symbolic.marking"] == (False, True)  # defines mark_dynamic


# ---- the exemplars live on the public authoring surface (issue 22) --------------------------
# An author of a DTensor-class subclass has what ShardedTensor has: the exemplars import no
# private core module (only the one torch-compat module), read a ctx by name (``ctx_of``,
# ``Cls.ctx_reader``, ``x.<field>``), never by position, and never touch an instance's
# ``__dict__``.
EXEMPLARS = ("subclass_kit/collectives", "subclass_kit/sharded", "subclass_kit/examples", "examples")
_CORE_PRIVATE_OK = {"subclass_kit._compat"}


def _exemplar_files() -> list:
    return sorted(p for d in EXEMPLARS for p in (REPO / d).rglob("*.py"))


def _core_private_imports(source: str, module: str) -> list:
    """``(line, module)`` of every import of a private module of the core ``subclass_kit``
    package (``subclass_kit._x``, not inside the exemplar's own package) in the source of
    ``module`` (dotted; a package's ``__init__`` named as the package plus ``.__init__``)."""
    mods = _modules()
    base = module.split(".")[:-1]
    hits = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = node.module or ""
            if node.level:
                prefix = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        seen = []
        for n in names:
            parts = n.split(".")
            top = ".".join(parts[:2])
            if len(parts) >= 2 and parts[0] == "subclass_kit" and parts[1].startswith("_") \
                    and top not in _CORE_PRIVATE_OK and top in mods and top not in seen:
                seen.append(top)
        hits += [(node.lineno, m) for m in seen]
    return hits


def _positional_ctx_reads(tree) -> list:
    """``(line, what)`` of every read of a ctx that is not by name."""
    def is_ctx_expr(v):
        return (isinstance(v, ast.Attribute) and v.attr == "_kit_ctx") or (
            isinstance(v, ast.Call) and getattr(v.func, "id", getattr(v.func, "attr", None)) == "ctx_of")

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "_kit_ctx":
            hits.append((node.lineno, "_kit_ctx (private; use ctx_of or Cls.ctx_reader)"))
        elif isinstance(node, ast.Subscript) and is_ctx_expr(node.value):
            hits.append((node.lineno, "ctx[...]"))
        elif isinstance(node, ast.Attribute) and node.attr == "values" and is_ctx_expr(node.value):
            hits.append((node.lineno, "ctx.values"))
        elif isinstance(node, ast.Attribute) and node.attr == "__dict__":
            hits.append((node.lineno, "__dict__"))
    return hits


def test_exemplars_import_no_private_core_module():
    found = {
        str(p.relative_to(REPO)): _core_private_imports(p.read_text(), ".".join(p.relative_to(REPO).with_suffix("").parts))
        for p in _exemplar_files()
    }
    assert len(found) > 20, sorted(found)  # the scan saw the exemplars
    assert {k: v for k, v in found.items() if v} == {}


def test_exemplars_read_the_ctx_by_name_only():
    found = {str(p.relative_to(REPO)): _positional_ctx_reads(ast.parse(p.read_text())) for p in _exemplar_files()}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_exemplar_scans_see_violations():
    code = ("from ..._construct import construct\nfrom ... import _compat, _dispatch\n"
            "import subclass_kit._aliasing\nfrom ..tensor import spec\nfrom .._layout import chunk_size\n")
    assert _core_private_imports(code, "subclass_kit.sharded._ops.probe") == [
        (1, "subclass_kit._construct"), (2, "subclass_kit._dispatch"), (3, "subclass_kit._aliasing")]
    tree = ast.parse("a = x._kit_ctx.mesh\nb = ctx_of(x)[1]\nc = ctx_of(x).values\nd = x.__dict__\ne = ctx_of(x).mesh\n")
    assert sorted(line for line, _ in _positional_ctx_reads(tree)) == [1, 2, 3, 4]
